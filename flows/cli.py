"""The `forgeflow` command line: `forgeflow data make-arith`, `forgeflow grpo|sft --config … --a.b value`."""

from __future__ import annotations

import argparse
import logging
import os
import sys


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


def run_make_arith(args) -> int:
    from forge_core.data.arith import ArithSpec, make_arith_problems, write_gsm8k_jsonl

    spec = ArithSpec(args.min_value, args.max_value, args.num_terms, tuple(args.ops), args.style)
    problems = make_arith_problems(args.n, seed=args.seed, split=args.split, spec=spec)
    out = write_gsm8k_jsonl(problems, args.out)
    print(f"wrote {len(problems)} {args.split} problems to {out}")
    return 0


def add_run_commands(sub) -> None:
    for name, help_text in (("grpo", "SFT warm-up (if configured) then GRPO, in this process"),
                            ("sft", "supervised fine-tuning only")):
        p = sub.add_parser(name, help=help_text,
                           epilog="any config key can be overridden: --trainer.lr 3e-5 --loss.name dapo")
        p.add_argument("--config", default=DEFAULT_CONFIG[name], help="YAML recipe (default: %(default)s)")
        p.add_argument("--run-name", default=None)
        p.add_argument("--json", action="store_true", help="print the summary as JSON")
        p.add_argument("--no-progress", action="store_true", help="no progress bars (logs only)")


DEFAULT_CONFIG = {"grpo": "configs/grpo_math_tiny.yaml", "sft": "configs/sft_math_tiny.yaml"}


def run_recipe(args, extra: list[str]) -> int:
    import json

    from flows.inprocess import result_line, run_main_job
    from infra.config import load_config

    overrides = parse_overrides(extra)
    if args.command == "sft":
        overrides.setdefault("steps", 0)
    cfg = load_config(args.config, overrides)
    summary = run_main_job(cfg, args.run_name, show=not args.no_progress)
    print(json.dumps(summary, indent=2) if args.json else f"run {summary['run_id']}: {summary}")
    print(result_line(summary))
    return 0


def parse_overrides(extra: list[str]) -> dict:
    from infra.config import parse_overrides as parse

    return parse(extra)


def quiet_libraries() -> None:
    """Keep library progress bars and chatter out of the run's own progress output."""
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    try:
        import transformers

        transformers.logging.set_verbosity_error()
        transformers.logging.disable_progress_bar()
    except ImportError:
        pass


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="forgeflow", description=__doc__)
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    sub = parser.add_subparsers(dest="command", required=True)
    add_data_commands(sub)
    add_run_commands(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Entry point of the `forgeflow` console script; returns the exit status."""
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.INFO,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    quiet_libraries()
    try:
        if args.command == "data" and args.data_cmd == "make-arith":
            if extra:
                parser.error(f"unrecognised arguments: {' '.join(extra)}")
            return run_make_arith(args)
        if args.command in ("grpo", "sft"):
            return run_recipe(args, extra)
    except ValueError as exc:
        print(f"forgeflow: error: {exc}", file=sys.stderr)
        return 2
    parser.error(f"unknown command {args.command!r}")
    return 2


if __name__ == "__main__":
    sys.exit(main())
