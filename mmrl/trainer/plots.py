"""Reward and accuracy curves as a PNG (logged as an MLflow artifact)."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402


def plot_curves(history: dict[str, list[tuple[int, float]]], panels: dict[str, list[str]]) -> Figure:
    """One panel per title, each with the listed metric series; missing series are skipped."""
    fig, axes = plt.subplots(1, len(panels), figsize=(5 * len(panels), 3.5), squeeze=False)
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
    fig.tight_layout()
    return fig
