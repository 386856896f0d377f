"""The accuracy plot of a run: accuracy on each task's test set over the stream (matplotlib, Agg)."""

from __future__ import annotations

import io
import os
from typing import Sequence

import numpy as np

from dpcl._io.atomic_io import write_bytes_atomic


def plot_accuracy(
    path: "str | os.PathLike[str]",
    accuracy: np.ndarray,
    *,
    title: str,
    cumulative_epsilon: Sequence[float | None] | None = None,
    chance: Sequence[float] | None = None,
) -> None:
    """Write ``accuracy.png``: one line per task j (R[t, j] for t >= j) and the average accuracy AA_t.

    ``accuracy`` is the accuracy matrix R (rows: after task t, columns: task j).
    With ``cumulative_epsilon`` the x tick labels show the stream's epsilon after each release. ``chance`` (one
    value per row) is drawn as a grey step line: the accuracy of guessing uniformly among the labels the model may
    output after task t. The legend sits to the right of the axes, never over the curves.
    """
    import matplotlib.pyplot as plt

    fig = accuracy_figure(accuracy, title=title, cumulative_epsilon=cumulative_epsilon, chance=chance)
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png")
    plt.close(fig)
    write_bytes_atomic(path, buffer.getvalue())


def accuracy_figure(
    accuracy: np.ndarray,
    *,
    title: str,
    cumulative_epsilon: Sequence[float | None] | None = None,
    chance: Sequence[float] | None = None,
):
    """The matplotlib figure :func:`plot_accuracy` writes (the caller closes it)."""
    import matplotlib

    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt

    matrix = np.asarray(accuracy, dtype=np.float64)
    rows, n_tasks = matrix.shape
    steps = np.arange(1, rows + 1)
    fig, ax = plt.subplots(figsize=(7.6, 4.0), dpi=120)
    for j in range(min(rows, n_tasks)):
        ax.plot(steps[j:], matrix[j:, j], marker="o", linewidth=1.2, label=f"task {j + 1}")
    lower = np.tril(np.ones_like(matrix, dtype=bool))[:, :n_tasks]
    average = np.where(lower, matrix, 0.0).sum(axis=1) / np.arange(1, rows + 1)
    ax.plot(steps, average, color="black", linestyle="--", linewidth=2, label="average accuracy")
    if chance is not None:
        levels = np.asarray(chance, dtype=np.float64)
        label = "chance (uniform guess)" if len(set(levels.tolist())) == 1 else "chance (uniform guess\namong labels so far)"
        ax.step(steps, levels, where="mid", color="grey", linestyle=":", linewidth=1.5, label=label)
    ax.set_ylim(0, 1.02)
    ax.set_xticks(steps)
    if cumulative_epsilon is not None:
        labels = [
            f"{t}\nε={eps:.3g}" if eps is not None and np.isfinite(eps) else f"{t}\nnot private"
            for t, eps in zip(steps, cumulative_epsilon)
        ]
        ax.set_xticklabels(labels, fontsize=8)
    ax.set_xlabel("after task")
    ax.set_ylabel("test accuracy")
    ax.set_title(title, fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.02, 1.0), borderaxespad=0.0, frameon=False)
    fig.tight_layout()
    return fig
