"""Progress output shared by the in-process job and the flows: one human line per GRPO step."""

from __future__ import annotations


def line_for_step(step: int, total: int, m: dict) -> str:
    """One human line for GRPO step `step` (0-based; shown 1-based, as `step + 1` is the version it produced)."""
    acc = f" acc {m['eval/accuracy']:.3f}" if "eval/accuracy" in m else ""
    return (f"step {step + 1:>4}/{total} reward {m.get('reward/mean', 0):.3f}{acc} loss {m.get('loss/loss', 0):+.4f} "
            f"kl {m.get('loss/kl_mean', 0):.4f} len {m.get('rollout/response_len_mean', 0):.1f} "
            f"{m.get('timing/step', 0):.2f}s")
