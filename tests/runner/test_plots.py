"""accuracy.png: the legend never covers the curves, and a chance line shows what guessing gives."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("matplotlib")

from dpcl.runner.plots import accuracy_figure  # noqa: E402
from dpcl.runner.run import chance_levels  # noqa: E402


def test_legend_is_outside_the_axes_and_chance_is_drawn():
    import matplotlib.pyplot as plt

    forgetting = np.tril(np.full((5, 5), np.nan))
    np.fill_diagonal(forgetting, 0.97)
    forgetting[np.tril_indices(5, k=-1)] = 0.0  # every earlier task drops to 0: curves along the bottom
    chance = chance_levels([[0, 1], [2, 3], [4, 5], [6, 7], [8, 9]], 5)
    assert chance == pytest.approx([1 / 2, 1 / 4, 1 / 6, 1 / 8, 1 / 10])
    assert chance_levels([list(range(10))] * 3, 3) == pytest.approx([0.1] * 3)  # prior_const: one level
    fig = accuracy_figure(np.nan_to_num(forgetting), title="naive on digits", chance=chance)
    try:
        fig.canvas.draw()
        (ax,) = fig.axes
        legend = ax.get_legend().get_window_extent()
        frame = ax.get_window_extent()
        assert legend.x0 >= frame.x1  # entirely to the right of the data area
        assert legend.x1 <= fig.bbox.x1  # and inside the image
        labels = [t.get_text() for t in ax.get_legend().get_texts()]
        assert any(label.startswith("chance") for label in labels)
        (line,) = [ln for ln in ax.get_lines() if ln.get_label().startswith("chance")]
        assert np.allclose(line.get_ydata(), chance)
        title = ax.title.get_window_extent()
        assert title.x0 >= 0 and title.x1 <= fig.bbox.x1
    finally:
        plt.close(fig)
