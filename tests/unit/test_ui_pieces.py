"""The pieces behind what the UIs show: samples rows, artifact tables and keys, links, the terminal filter, the
compare plot's panels, and `forgeflow ui` deciding to reuse, start or refuse a server."""

import logging
import socket
import threading
from http.server import BaseHTTPRequestHandler, HTTPServer

import pytest

from cli.ui import server_state
from forge_core.recipes.samples import sample_rows, samples_markdown
from forge_core.types import Completion, Episode, Group
from infra.ui_links import flow_run_link_tags, mlflow_run_url, mlflow_runs_url, prefect_flow_run_url
from runtime.plots import panels_with_data, plot_curves
from runtime.prefect_artifacts import artifact_key, metrics_table
from runtime.prefect_env import REPO_ROOT, ConsoleFilter


def group(prompt: str, rewards: list[float], target: str = "4\n4") -> Group:
    episodes = [Episode(prompt, target, [1], Completion(f"answer {i}|x\ny", [2], [-0.5], policy_version=3,
                                                        stop_reason="eos"), reward=r)
                for i, r in enumerate(rewards)]
    return Group(prompt, target, episodes)


def test_sample_rows_take_the_first_prompts_with_every_completion_and_group_advantages():
    groups = [group("2+2=", [1.0, 0.0, 0.0, 1.0]), group("3+3=", [0.0, 0.0, 1.0, 0.0]), group("1+1=", [1, 1, 1, 1])]
    rows = sample_rows(groups, step=7, prompts=2)
    assert [r["prompt"] for r in rows] == ["2+2="] * 4 + ["3+3="] * 4
    assert all(r["step"] == 7 and r["policy_version"] == 3 and r["stop_reason"] == "eos" for r in rows)
    first = [r["advantage"] for r in rows[:4]]
    assert first[0] > 0 > first[1] and abs(sum(first)) < 1e-9
    mean_only = sample_rows(groups, 7, 1, {"name": "dr_grpo"})
    assert [r["advantage"] for r in mean_only] == pytest.approx([0.5, -0.5, -0.5, 0.5])
    assert sample_rows(groups, 7, 0) == [] and sample_rows([], 7, 4) == []


def test_samples_markdown_keeps_each_row_on_one_line():
    md = samples_markdown(sample_rows([group("2+2=", [1.0, 0.0])], 1, 4))
    table_rows = [line for line in md.splitlines() if line.startswith("| ") and "reward" not in line]
    assert len(table_rows) == 2 and "\\|" in table_rows[0] and "⏎" in table_rows[0]  # pipes escaped, newlines shown
    assert "target `4 ⏎ 4`" in md
    assert samples_markdown([]) == "_no samples_"


def test_samples_of_chat_prompts_show_the_users_question_before_the_system_turn():
    chat = "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\n2+2=<|im_end|>\n"
    g = group(chat, [1.0, 0.0])
    g.question = "2+2="
    rows = sample_rows([g], 1, 4)
    assert [r["question"] for r in rows] == ["2+2=", "2+2="] and rows[0]["prompt"] == chat
    md = samples_markdown(rows)
    assert md.index("**Question**: 2+2=") < md.index("<|im_start|>system")
    plain = samples_markdown(sample_rows([group("3+3=", [1.0, 0.0])], 1, 4))
    assert "**Question**: 3+3=" in plain and "as prompted" not in plain  # a plain prompt is shown once


def test_metrics_table_has_the_named_columns_and_blanks_for_missing_metrics():
    (row,) = metrics_table([{"step": 3, "reward/mean": 0.123456, "loss/loss": -0.5, "timing/step": 1.0}])
    assert row["step"] == 3 and row["reward"] == 0.1235 and row["loss"] == -0.5 and row["accuracy"] == ""
    assert list(row) == ["step", "reward", "accuracy", "loss", "kl", "clip high", "clip low", "staleness", "seconds"]
    (distilled,) = metrics_table([{"step": 1, "distill/reverse_kl": 0.58093}])  # a run with a teacher
    assert list(distilled)[:6] == ["step", "reward", "accuracy", "loss", "kl", "reverse kl"]
    assert distilled["reverse kl"] == 0.5809
    assert artifact_key("20261205-0123_AB", "metrics") == "forgeflow-20261205-0123-ab-metrics"


def test_links_between_the_uis(monkeypatch):
    assert mlflow_runs_url(None, "3") == "http://127.0.0.1:5000/#/experiments/3/runs?workflowType=machine_learning"
    assert mlflow_run_url("http://mlflow:5000/", "3", "abc").startswith("http://mlflow:5000/#/experiments/3/runs/abc")
    monkeypatch.delenv("PREFECT_UI_URL", raising=False)
    monkeypatch.delenv("PREFECT_API_URL", raising=False)
    assert prefect_flow_run_url("f1") is None and flow_run_link_tags("f1") == {}  # embedded server: no UI
    monkeypatch.setenv("PREFECT_API_URL", "http://127.0.0.1:4200/api")
    assert prefect_flow_run_url("f1") == "http://127.0.0.1:4200/runs/flow-run/f1"
    assert "http://127.0.0.1:4200/runs/flow-run/f1" in flow_run_link_tags("f1")["mlflow.note.content"]
    monkeypatch.setenv("PREFECT_UI_URL", "https://prefect.lab/")
    assert prefect_flow_run_url("f1") == "https://prefect.lab/runs/flow-run/f1"


def test_the_terminal_drops_prefects_info_lines_but_keeps_forgeflows_and_every_warning():
    def record(name, level, path):
        return logging.LogRecord(name, level, path, 1, "msg", None, None)

    keep = ConsoleFilter().filter
    engine = "/x/.venv/lib/python3.11/site-packages/prefect/task_engine.py"
    assert not keep(record("prefect.task_runs", logging.INFO, engine))
    assert not keep(record("prefect.task_runs", logging.INFO, f"{REPO_ROOT}/.venv/lib/site-packages/prefect/a.py"))
    assert keep(record("prefect.task_runs", logging.WARNING, engine))
    assert keep(record("prefect.flow_runs", logging.INFO, f"{REPO_ROOT}/flows/grpo.py"))
    assert keep(record("tasks.recovery", logging.INFO, f"{REPO_ROOT}/tasks/recovery.py"))


def test_compare_plots_only_panels_with_data(tmp_path):
    histories = {"a": [{"step": 1, "reward/mean": 0.1}], "b": [{"step": 1, "reward/mean": 0.2}]}
    assert panels_with_data(histories, ("eval/accuracy", "reward/mean")) == ["reward/mean"]
    assert plot_curves(histories, tmp_path / "c.png", keys=("eval/accuracy", "reward/mean")).stat().st_size > 0
    assert panels_with_data({"a": []}, ("eval/accuracy",)) == []
    assert plot_curves({"a": []}, tmp_path / "empty.png", keys=("eval/accuracy",)).stat().st_size > 0


class Health(BaseHTTPRequestHandler):
    def do_GET(self):  # noqa: N802 (http.server's name)
        self.send_response(200 if self.path == "/api/health" else 404)
        self.end_headers()

    def log_message(self, *args):
        pass


def test_forgeflow_ui_reuses_a_server_starts_on_a_free_port_and_refuses_a_taken_one():
    server = HTTPServer(("127.0.0.1", 0), Health)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        port = server.server_address[1]
        assert server_state("Prefect", port, "/api/health") == "reuse"
        with pytest.raises(ValueError, match=f"port {port} is taken .* --mlflow-port N"):
            server_state("MLflow", port, "/health")  # answers, but not as an MLflow server
    finally:
        server.shutdown()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        free = s.getsockname()[1]
    assert server_state("Prefect", free, "/api/health") == "start"


def test_sampled_evaluations_add_pass_at_k_to_the_table_the_summary_and_the_result_line():
    from runtime.progress import held_out_summary, result_line

    rows = [{"step": 0, "eval/accuracy": 0.25, "eval/sampled_accuracy": 0.3, "eval/pass_at_8": 0.5},
            {"step": 1, "reward/mean": 0.5}]
    table = metrics_table(rows)
    assert list(table[0])[:5] == ["step", "reward", "accuracy", "pass@8", "sampled accuracy"]
    assert (table[0]["pass@8"], table[1]["pass@8"]) == (0.5, "")
    before = {"eval/accuracy": 0.25, "eval/sampled_accuracy": 0.3, "eval/pass_at_8": 0.5}
    after = {"eval/accuracy": 0.75, "eval/sampled_accuracy": 0.7, "eval/pass_at_8": 0.875}
    summary = {"run_id": "r1", "minutes": 1.5, **held_out_summary(before, after)}
    assert (summary["pass8_before"], summary["pass8_after"], summary["sampled_after"]) == (0.5, 0.875, 0.7)
    assert result_line(summary) == ("RESULT acc_before=0.250 acc_after=0.750 pass8_before=0.500 pass8_after=0.875 "
                                    "minutes=1.50 run_id=r1")
    greedy_only = {"run_id": "r2", "minutes": 2.0, **held_out_summary({"eval/accuracy": 0.1}, {"eval/accuracy": 0.2})}
    assert result_line(greedy_only) == "RESULT acc_before=0.100 acc_after=0.200 minutes=2.00 run_id=r2"


def test_the_printed_summary_leaves_out_what_does_not_apply():
    from cli.main import summary_text

    summary = {"run_id": "r1", "acc_before": 0.06, "acc_after": 0.7, "sampled_before": None, "sampled_after": None,
               "init_model": None, "recoveries": [], "checkpoint": "/c/step-40"}
    text = summary_text(summary)
    assert text.splitlines() == ["run_id: r1", "acc_before: 0.06", "acc_after: 0.7", "checkpoint: /c/step-40"]
    assert "init_model: /runs/sft" in summary_text({**summary, "init_model": "/runs/sft"})
