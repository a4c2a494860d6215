"""What a researcher sees, in a real browser: a 3-step deployment run (with its SFT warm-up) and a 2-run DAPO/GSPO
sweep against a real Prefect server + process worker and a real MLflow server, then both UIs opened in headless
Chromium (Debian's `chromium`, installed by `make services`; Playwright drives it, no browser download).
Screenshots go to the test's tmp dir (their paths are printed)."""

import contextlib
import json
import os
import re
import shutil
import subprocess
import time

import pytest

from tests.integration.prefect_helpers import (
    BIN,
    ROOT,
    api,
    flow_run_logs,
    free_port,
    serving_stack,
    stop_group,
    wait_healthy,
)

pytestmark = [pytest.mark.integration, pytest.mark.browser]
TINY = {"model.path": "tiny:qwen3-micro", "sft.steps": 0, "generator.max_new_tokens": 4, "prompts_per_step": 4,
        "group_size": 4, "eval.num_prompts": 16, "eval.every": 2, "checkpoint.every": 2, "trainer.lr": 1e-3,
        "workers.threads": 1, "filter_groups": False, "loss.beta": 0.0, "loss.name": "grpo",
        "trainer.mini_batches": 1, "tracking.sample_prompts": 2}
WAIT_MS = 60_000  # for a page element to appear (a loaded 2-core machine renders slowly)


@contextlib.contextmanager
def mlflow_server(home):
    """A real `mlflow server` on a free port with its own SQLite store; yields its URI."""
    port = free_port()
    uri = f"http://127.0.0.1:{port}"
    proc = subprocess.Popen([str(BIN / "mlflow"), "server", "--host", "127.0.0.1", "--port", str(port),
                             "--backend-store-uri", f"sqlite:///{home / 'mlflow.db'}",
                             "--default-artifact-root", (home / "mlartifacts").as_uri()],
                            env={**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"},
                            stdout=open(home / "mlflow.log", "w"), stderr=subprocess.STDOUT, start_new_session=True)
    try:
        wait_healthy(uri, proc, timeout=180)
        yield uri
    finally:
        stop_group(proc)


@pytest.fixture(scope="module")
def ui_stack(tmp_path_factory):
    home = tmp_path_factory.mktemp("ui")
    (home / "prefect").mkdir()
    with mlflow_server(home) as uri, serving_stack(home / "prefect", {"MLFLOW_TRACKING_URI": uri}) as stack:
        yield {**stack, "mlflow": uri}


@pytest.fixture(scope="module")
def browser():
    chromium = shutil.which("chromium")
    if chromium is None:
        pytest.fail("no chromium on PATH: run `make services` as root (infra/setup_browser.sh installs it)")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=chromium, args=["--no-sandbox", "--disable-dev-shm-usage"])
        yield b
        b.close()


def start_deployment_run(stack, name: str, params: dict) -> subprocess.Popen:
    cmd = [str(BIN / "prefect"), "deployment", "run", name, "--watch"]
    for k, v in params.items():
        cmd += ["-p", f"{k}={json.dumps(v)}"]
    return subprocess.Popen(cmd, cwd=ROOT, env=stack["env"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True)


def flow_run_named(stack, prefix: str) -> dict:
    runs = api(stack, "/flow_runs/filter", {"flow_runs": {"name": {"like_": prefix}}})
    (run,) = [r for r in runs if r["name"].startswith(prefix)]
    return run


def test_a_run_and_a_sweep_read_well_in_prefect_and_mlflow(ui_stack, browser, tmp_path):
    from mlflow.tracking import MlflowClient
    from playwright.sync_api import expect

    t0 = time.monotonic()
    # both at once: the process worker runs them side by side
    single = start_deployment_run(ui_stack, "grpo/grpo-math", {"overrides": {**TINY, "steps": 3, "sft.steps": 3}})
    sweep = start_deployment_run(ui_stack, "grpo-sweep/sweep-losses",
                                 {"grid": {"loss.name": ["dapo", "gspo"]}, "overrides": {**TINY, "steps": 2},
                                  "use_deployments": False})
    for proc in (single, sweep):
        out, _ = proc.communicate(timeout=900)
        if proc.returncode != 0:
            flow_run_id = re.search(r"UUID: ([0-9a-f-]{36})", out)
            logs = flow_run_logs(ui_stack, flow_run_id.group(1)) if flow_run_id else "(no flow run id printed)"
            pytest.fail(f"{out[-2000:]}\n--- the flow run's logs:\n{logs}")
    runs_s = time.monotonic() - t0

    grpo = flow_run_named(ui_stack, "grpo · grpo · ")
    run_id = grpo["name"].rsplit(" · ", 1)[1]
    sweep_run = flow_run_named(ui_stack, "grpo-sweep · loss: dapo|gspo · ")
    page = browser.new_page(viewport={"width": 1600, "height": 1000})
    page.set_default_timeout(WAIT_MS)
    shots = []

    def open_tab(name: str) -> None:
        page.get_by_text(name, exact=True).first.click()

    def shot(name: str) -> None:
        path = tmp_path / f"{name}.png"
        page.screenshot(path=str(path), full_page=True)
        shots.append(path)

    # ---- Prefect: the flow run is named after the run; its tasks carry the step numbers; artifacts
    ui = ui_stack["url"].removesuffix("/api")
    page.goto(f"{ui}/runs/flow-run/{grpo['id']}")
    expect(page.get_by_text(f"grpo · grpo · {run_id}").first).to_be_visible()
    expect(page.get_by_text("step    3/3").first).to_be_visible()  # the per-step log lines reach the UI
    open_tab("Task Runs")
    for version in (1, 2, 3):
        for phase in ("rollout", "score_rewards", "train", "sync_weights"):
            expect(page.get_by_text(f"{phase}-{version}", exact=True)).to_be_visible()
    shot("prefect-task-runs")
    open_tab("Artifacts")
    for kind in ("progress", "metrics", "samples", "links"):
        expect(page.get_by_text(f"forgeflow-{run_id}-{kind}", exact=True).first).to_be_visible()
    expect(page.get_by_text("per-step metrics through step 3").first).to_be_visible()
    shot("prefect-artifacts")
    page.get_by_text("per-step metrics through step 3").first.click()
    for header in ("reward", "accuracy", "loss", "kl", "staleness", "seconds"):
        expect(page.get_by_role("columnheader", name=header, exact=True)).to_be_visible()
    shot("prefect-metrics-table")
    page.goto(f"{ui}/runs/flow-run/{grpo['id']}")
    open_tab("Artifacts")
    page.get_by_text("sampled completions at step 3").first.click()
    expect(page.get_by_text("Rollout samples, step 3")).to_be_visible()
    expect(page.get_by_role("columnheader", name="advantage")).to_have_count(2)  # one table per sampled prompt
    shot("prefect-samples")
    page.goto(f"{ui}/runs/flow-run/{sweep_run['id']}")
    open_tab("Subflow Runs")
    expect(page.get_by_text("grpo · dapo · ").first).to_be_visible()
    expect(page.get_by_text("grpo · gspo · ").first).to_be_visible()
    shot("prefect-sweep-children")

    # ---- MLflow: the runs table (not the GenAI overview), distinct names, nesting, curves, samples
    client = MlflowClient(ui_stack["mlflow"])
    experiment = client.get_experiment_by_name("forgeflow").experiment_id
    mlruns = {r.info.run_name: r for r in client.search_runs([experiment])}
    sweep_name = next(n for n in mlruns if n.startswith("loss: dapo|gspo · "))
    children = {n: r for n, r in mlruns.items() if r.data.tags.get("mlflow.parentRunId") ==
                mlruns[sweep_name].info.run_id}
    assert sorted(n.split(" · ")[0] for n in children) == ["loss=dapo", "loss=gspo"]
    page.goto(f"{ui_stack['mlflow']}/#/experiments/{experiment}/runs?workflowType=machine_learning")
    grpo_name = f"grpo · {run_id.split('-', 1)[1]}"  # the date is in the Created column
    for parent in (sweep_name, grpo_name):
        row = page.get_by_role("row").filter(has_text=parent)
        row.locator('button[data-component-id*="runnamecellrenderer"]').click()  # expand its nested runs
    for nested in (*children, f"sft · {grpo_name}"):
        expect(page.get_by_text(nested, exact=True)).to_be_visible()
    shot("mlflow-runs-nested")

    grpo_ml = mlruns[grpo_name]
    assert grpo_ml.data.tags["prefect.flow_run_url"].endswith(f"/runs/flow-run/{grpo['id']}")
    page.goto(f"{ui_stack['mlflow']}/#/experiments/{experiment}/runs/{grpo_ml.info.run_id}/model-metrics"
              "?workflowType=machine_learning")
    chart = page.locator("div").filter(has_text="(eval/accuracy)").filter(has=page.locator("path.js-line")).last
    line = chart.locator("path.js-line").first.get_attribute("d")
    # steps 0, 2 and 3 (plotly drops the middle one of three collinear points: a flat line is M…L…)
    assert line.count("L") >= 1, line
    assert sorted(m.step for m in client.get_metric_history(grpo_ml.info.run_id, "eval/accuracy")) == [0, 2, 3]
    shot("mlflow-accuracy-chart")
    page.goto(f"{ui_stack['mlflow']}/#/experiments/{experiment}/runs/{grpo_ml.info.run_id}/artifacts/"
              "rollout_samples.json?workflowType=machine_learning")
    for column in ("prompt", "completion", "reward", "advantage", "policy_version"):
        expect(page.get_by_text(column, exact=True).first).to_be_visible()
    shot("mlflow-samples-table")
    ids = [r.info.run_id for r in children.values()]
    page.goto(f"{ui_stack['mlflow']}/#/compare-runs?runs={json.dumps(ids)}&experiments={json.dumps([experiment])}"
              "&workflowType=machine_learning")
    for name in children:
        expect(page.get_by_text(name).first).to_be_visible()
    shot("mlflow-compare-dapo-gspo")
    print(f"runs {runs_s:.0f} s, browser checks {time.monotonic() - t0 - runs_s:.0f} s; screenshots:",
          *map(str, shots), sep="\n  ")
