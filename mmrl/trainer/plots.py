"""Reward and accuracy curves as a PNG (logged as an MLflow artifact)."""

from __future__ import annotations

from matplotlib.figure import Figure


def plot_curves(history: dict[str, list[tuple[int, float]]], panels: dict[str, list[str]]) -> Figure:
    """One panel per title, each with the listed metric series; missing series are skipped.

    A bare Figure (Agg canvas), not pyplot's: nothing keeps it once it is logged, and fixed margins spare the
    tight-layout pass (a third of the drawing time)."""
    fig = Figure(figsize=(5 * len(panels), 3.5))
    axes = fig.subplots(1, len(panels), squeeze=False)
    fig.subplots_adjust(left=0.25 / len(panels), right=1 - 0.1 / len(panels), bottom=0.15, top=0.9, wspace=0.25)
    for ax, (title, keys) in zip(axes[0], panels.items()):
        for key in keys:
            if key in history:
                steps, values = zip(*history[key])
                ax.plot(steps, values, marker="." if len(steps) < 30 else None, label=key)
        ax.set_title(title)
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
        if ax.lines:
            ax.legend(fontsize=7)
    return fig
