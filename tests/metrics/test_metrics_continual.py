"""CL metrics against hand-computed small matrices (Tobaben et al. A38-A40; Lopez-Paz & Ranzato BWT;
PeCL Last/Avg), plus properties that tie the definitions together."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from dpcl.errors import InvalidParameterError
from dpcl.metrics import (
    accuracy_rows,
    aggregate_seeds,
    average_accuracy,
    average_accuracy_curve,
    average_forgetting,
    average_forgetting_curve,
    avg_accuracy,
    backward_transfer,
    empty_accuracy_matrix,
    forgetting,
    last_accuracy,
    summarize,
    task_accuracy,
)

NAN = float("nan")
# R[t, j]: accuracy on task j after learning task t (0-based); NaN = task not yet seen, not evaluated
R = np.array(
    [
        [0.90, NAN, NAN],
        [0.70, 0.80, NAN],
        [0.60, 0.50, 0.95],
    ]
)


def test_average_accuracy_a38_by_hand() -> None:
    # AA_1 = 0.9; AA_2 = (0.7 + 0.8) / 2 = 0.75; AA_3 = (0.6 + 0.5 + 0.95) / 3 = 2.05 / 3
    assert average_accuracy_curve(R) == pytest.approx([0.9, 0.75, 2.05 / 3])
    assert average_accuracy(R) == pytest.approx(2.05 / 3)
    assert average_accuracy(R, after_task=1) == pytest.approx(0.75)


def test_forgetting_a39_a40_by_hand() -> None:
    # after task 3: f_1 = max(0.9, 0.7) - 0.6 = 0.3 ; f_2 = 0.8 - 0.5 = 0.3 ; AF_3 = 0.3
    assert forgetting(R) == pytest.approx([0.3, 0.3])
    assert average_forgetting(R) == pytest.approx(0.3)
    # after task 2: f_1 = 0.9 - 0.7 = 0.2 ; AF_2 = 0.2
    assert average_forgetting(R, after_task=1) == pytest.approx(0.2)
    assert average_forgetting_curve(R) == pytest.approx([0.2, 0.3])
    assert forgetting(R, after_task=0).size == 0
    with pytest.raises(InvalidParameterError, match="at least two learned tasks"):
        average_forgetting(R, after_task=0)


def test_forgetting_over_all_k_versus_since_learned() -> None:
    # task 1 (column 1) was evaluated before it was learned (row 0) at 0.6, learned at 0.4, now 0.3:
    # A39 as written (max over all k < t) gives 0.6 - 0.3; the since-learned variant 0.4 - 0.3.
    matrix = np.array([[0.9, 0.6, 0.1], [0.9, 0.4, 0.1], [0.9, 0.3, 0.8]])
    assert forgetting(matrix) == pytest.approx([0.0, 0.3])
    assert forgetting(matrix, since_learned=True) == pytest.approx([0.0, 0.1])
    assert average_forgetting_curve(matrix) == pytest.approx([0.0, 0.15])
    assert average_forgetting_curve(matrix, since_learned=True) == pytest.approx([0.0, 0.05])


def test_negative_forgetting_when_accuracy_rises() -> None:
    matrix = np.array([[0.5, NAN], [0.8, 0.9]])
    assert average_forgetting(matrix) == pytest.approx(-0.3)
    assert backward_transfer(matrix) == pytest.approx(0.3)


def test_bwt_last_avg_by_hand() -> None:
    # BWT = ((0.6 - 0.9) + (0.5 - 0.8)) / 2 = -0.3
    assert backward_transfer(R) == pytest.approx(-0.3)
    # Last = AA_N = 2.05 / 3 ; Avg = (0.9 + 0.75 + 2.05/3) / 3
    assert last_accuracy(R) == pytest.approx(2.05 / 3)
    assert avg_accuracy(R) == pytest.approx((0.9 + 0.75 + 2.05 / 3) / 3)
    with pytest.raises(InvalidParameterError, match="at least two learned tasks"):
        backward_transfer(R[:1])


def test_pecl_table_row_reproduces_its_last_column() -> None:
    # a 2-task example: R = [[a, .], [b, c]] -> BWT = b - a, Last = (b + c)/2, Avg = (a + (b + c)/2) / 2
    a, b, c = 0.7, 0.55, 0.65
    matrix = np.array([[a, NAN], [b, c]])
    assert backward_transfer(matrix) == pytest.approx(b - a)
    assert last_accuracy(matrix) == pytest.approx((b + c) / 2)
    assert avg_accuracy(matrix) == pytest.approx((a + (b + c) / 2) / 2)


def test_partial_runs_use_the_rows_given() -> None:
    partial = R[:2]
    assert average_accuracy(partial) == pytest.approx(0.75)
    assert backward_transfer(partial) == pytest.approx(-0.2)
    summary = summarize(R[:1])
    assert summary["average_forgetting"] is None and summary["backward_transfer"] is None
    assert summary["average_accuracy"] == pytest.approx(0.9)


def test_summary_is_strict_json() -> None:
    import json

    summary = summarize(R)
    text = json.dumps(summary, allow_nan=False)
    back = json.loads(text)
    assert back["accuracy_matrix"][0] == [0.9, None, None]
    assert back["average_accuracy"] == pytest.approx(2.05 / 3)
    assert back["tasks_learned"] == 3


def test_task_accuracy_and_builders() -> None:
    assert task_accuracy([1, 2, 3, 4], np.array([1, 0, 3, 0])) == 0.5
    with pytest.raises(InvalidParameterError, match="empty test set"):
        task_accuracy([], [])
    with pytest.raises(InvalidParameterError, match="same length"):
        task_accuracy([1], [1, 2])
    matrix = accuracy_rows([[0.9], [0.7, 0.8]], 3)
    assert matrix.shape == (2, 3) and math.isnan(matrix[1, 2]) and matrix[1, 0] == 0.7
    assert np.isnan(empty_accuracy_matrix(2)).all()


@pytest.mark.parametrize(
    "matrix, fragment",
    [
        ([[NAN]], "R\\[0, 0\\]"),
        ([[0.5, NAN], [NAN, 0.5]], "R\\[1, 0\\]"),
        ([[1.2]], "in \\[0, 1\\]"),
        ([[0.5], [0.5]], "rows <= columns"),
        ([0.5, 0.5], "2-D"),
        ([["a"]], "numeric"),
    ],
)
def test_invalid_matrices(matrix, fragment: str) -> None:
    with pytest.raises(InvalidParameterError, match=fragment):
        average_accuracy(matrix)


def _lower_triangular(n: int):
    return arrays(np.float64, (n, n), elements=st.floats(0.0, 1.0)).map(
        lambda m: np.where(np.tril(np.ones_like(m, dtype=bool)), m, np.nan)
    )


@given(st.integers(2, 7).flatmap(_lower_triangular))
def test_metric_relations(matrix: np.ndarray) -> None:
    n = matrix.shape[0]
    # Last is AA_N and Avg is the mean of the AA curve
    assert last_accuracy(matrix) == pytest.approx(average_accuracy(matrix))
    assert avg_accuracy(matrix) == pytest.approx(np.mean(average_accuracy_curve(matrix)))
    # forgetting compares with the best earlier accuracy, BWT with the one right after learning
    assert average_forgetting(matrix) >= -backward_transfer(matrix) - 1e-12
    # the vectorised curve agrees with the direct definition at every t
    curve = average_forgetting_curve(matrix)
    direct = [np.mean([np.nanmax(matrix[:t, i]) - matrix[t, i] for i in range(t)]) for t in range(1, n)]
    assert curve == pytest.approx(direct)
    # lower-triangular input: both forgetting definitions coincide
    assert average_forgetting(matrix, since_learned=True) == pytest.approx(average_forgetting(matrix))
    # bounds of eq. A38-A40
    assert 0.0 <= average_accuracy(matrix) <= 1.0
    assert -1.0 <= average_forgetting(matrix) <= 1.0


@given(st.integers(2, 6), st.floats(0.0, 1.0))
def test_no_forgetting_when_accuracies_never_change(n: int, value: float) -> None:
    matrix = np.where(np.tril(np.ones((n, n), dtype=bool)), value, np.nan)
    assert average_forgetting(matrix) == pytest.approx(0.0)
    assert backward_transfer(matrix) == pytest.approx(0.0)
    assert average_accuracy(matrix) == pytest.approx(value)


def test_aggregate_seeds_by_hand() -> None:
    runs = [summarize(R), summarize(np.array([[1.0, NAN, NAN], [0.9, 0.8, NAN], [0.8, 0.7, 0.6]]))]
    table = aggregate_seeds(runs)
    aa = [2.05 / 3, 2.1 / 3]
    assert table["average_accuracy"]["mean"] == pytest.approx(np.mean(aa))
    # sample std of two values a, b is |a - b| / sqrt(2)
    assert table["average_accuracy"]["std"] == pytest.approx(abs(aa[0] - aa[1]) / math.sqrt(2))
    assert table["average_accuracy"]["n"] == 2
    assert aggregate_seeds(runs[:1])["last"]["std"] is None
    assert aggregate_seeds([summarize(R[:1])])["average_forgetting"] == {"mean": None, "std": None, "n": 1}
    with pytest.raises(InvalidParameterError, match="at least one run"):
        aggregate_seeds([])
