"""PNG plots of run histories (matplotlib, headless)."""

from __future__ import annotations

from pathlib import Path


def plot_curves(histories: dict[str, list[dict]], out: str | Path, keys=("reward/mean", "eval/accuracy"),
                title: str = "") -> Path:
    """One panel per metric key, one line per run; history rows are metric dicts with a 'step' key."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(keys), figsize=(5 * len(keys), 3.6), squeeze=False)
    for ax, key in zip(axes[0], keys):
        for name, rows in histories.items():
            pts = [(r["step"], r[key]) for r in rows if key in r]
            if not pts:
                continue
            xs, ys = zip(*pts)
            if key.startswith("reward/") and len(ys) > 10:
                k = max(1, len(ys) // 25)  # moving average: per-step training reward is noisy
                ys = [sum(ys[max(0, i - k + 1): i + 1]) / len(ys[max(0, i - k + 1): i + 1]) for i in range(len(ys))]
            ax.plot(xs, ys, label=name, marker="o" if key.startswith("eval/") else None, markersize=3)
        ax.set_title(key)
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
    axes[0][0].legend(fontsize=8)
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out
