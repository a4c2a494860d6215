"""PNG plots of run histories (matplotlib, headless)."""

from __future__ import annotations

from pathlib import Path


def panels_with_data(histories: dict[str, list[dict]], keys) -> list[str]:
    """The metric keys at least one history has a point for (the panels plot_curves draws)."""
    return [key for key in keys if any(key in r for rows in histories.values() for r in rows)]


def plot_curves(histories: dict[str, list[dict]], out: str | Path, keys=("reward/mean", "eval/accuracy"),
                title: str = "") -> Path:
    """One panel per metric key that some run has points for (one line per run), the legend on the first; history
    rows are metric dicts with a 'step' key. With no points at all, one panel says so."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    points = {key: {name: [(r["step"], r[key]) for r in rows if key in r] for name, rows in histories.items()}
              for key in keys}
    drawn = panels_with_data(histories, keys) or list(keys[:1])
    colour = {name: f"C{i % 10}" for i, name in enumerate(histories)}  # a run keeps its colour in every panel
    fig, axes = plt.subplots(1, len(drawn), figsize=(5 * len(drawn), 3.6), squeeze=False)
    for ax, key in zip(axes[0], drawn):
        for name, pts in points[key].items():
            if not pts:
                continue
            xs, ys = zip(*pts)
            if key.startswith("reward/") and len(ys) > 10:
                k = max(1, len(ys) // 25)  # moving average: per-step training reward is noisy
                ys = [sum(ys[max(0, i - k + 1): i + 1]) / len(ys[max(0, i - k + 1): i + 1]) for i in range(len(ys))]
            ax.plot(xs, ys, label=name, color=colour[name], marker="o" if key.startswith("eval/") else None,
                    markersize=3)
        if not any(points[key].values()):
            ax.text(0.5, 0.5, f"no {key} points", ha="center", va="center", transform=ax.transAxes)
        ax.set_title(key)
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
    if axes[0][0].get_legend_handles_labels()[0]:
        axes[0][0].legend(fontsize=8)
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out
