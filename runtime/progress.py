"""Progress output shared by the in-process job, the flows and the benchmarks: one human line per GRPO step, and no
library chatter around it."""

from __future__ import annotations

import os
import re

PASS_KEY = re.compile(r"eval/pass_at_(\d+)")


def line_for_step(step: int, total: int, m: dict) -> str:
    """One human line for GRPO step `step` (0-based; shown 1-based, as `step + 1` is the version it produced)."""
    acc = f" acc {m['eval/accuracy']:.3f}" if "eval/accuracy" in m else ""
    distill = f" rkl {m['distill/reverse_kl']:.4f}" if "distill/reverse_kl" in m else ""  # on-policy distillation
    return (f"step {step + 1:>4}/{total} reward {m.get('reward/mean', 0):.3f}{acc} loss {m.get('loss/loss', 0):+.4f} "
            f"kl {m.get('loss/kl_mean', 0):.4f}{distill} len {m.get('rollout/response_len_mean', 0):.1f} "
            f"{m.get('timing/step', 0):.2f}s")


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


def held_out_summary(before: dict, after: dict) -> dict:
    """A run summary's held-out figures from the first and last evaluation: greedy accuracy (pass@1) and, when the
    evaluations sampled (eval.samples = k), the sampled accuracy and pass@k: acc_*, sampled_*, pass{k}_*."""
    out = {"acc_before": before["eval/accuracy"], "acc_after": after["eval/accuracy"],
           "sampled_before": before.get("eval/sampled_accuracy"), "sampled_after": after.get("eval/sampled_accuracy")}
    for key in after:
        if match := PASS_KEY.fullmatch(key):
            out[f"pass{match[1]}_before"], out[f"pass{match[1]}_after"] = before.get(key), after[key]
    return out


def result_line(summary: dict) -> str:
    """The machine-readable last line of a run command: greedy accuracy before and after, pass@k when sampled."""
    passes = "".join(f" {key}={value:.3f}" for key, value in summary.items()
                     if re.fullmatch(r"pass\d+_(before|after)", key) and value is not None)
    return (f"RESULT acc_before={summary['acc_before']:.3f} acc_after={summary['acc_after']:.3f}{passes} "
            f"minutes={summary['minutes']:.2f} run_id={summary['run_id']}")
