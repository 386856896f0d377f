"""Continual-learning metrics from the accuracy matrix R.

``R[t, j]`` is the test accuracy on task j after training on tasks 0..t (0-based
here; the papers index from 1). ``R`` may have fewer rows than columns (a run
that has finished only the first rows' tasks); entries above the diagonal
(task j not yet learned) may be NaN. Entries on and below the diagonal of the
rows given must be finite and in [0, 1].

Definitions, with the papers' 1-based indices (t tasks learned, T in all):

* Average accuracy (Tobaben et al., App. H, eq. A38; Chaudhry et al. 2018):
  ``AA_t = 1/t * sum_{i=1..t} R[t, i]``.
* Forgetting of task i after task t (eq. A39): ``f_{t,i} = max_{k in 1..t-1} (R[k, i] - R[t, i])``,
  and average forgetting (eq. A40): ``AF_t = 1/(t-1) * sum_{i=1..t-1} f_{t,i}`` (undefined for t = 1).
  The max in A39 runs over *all* k < t, including k < i (before task i was
  learned); entries that were not evaluated (NaN) are skipped. With
  ``since_learned=True`` the max runs over k in i..t-1 only (a common variant:
  the task's best accuracy since it was learned). The two agree whenever the
  matrix holds no evaluation of a task before it was learned (``dpcl run``
  records none: those entries are NaN) or such an evaluation is not above the
  task's later best.
* Backward transfer (Lopez-Paz & Ranzato 2017, GEM, the BWT metric; restated in Zhan et al. PeCL, Sec.
  "Evaluation Metrics"): ``BWT = 1/(N-1) * sum_{i=1..N-1} (R[N, i] - R[i, i])``.
  It compares with the accuracy *right after* learning i, while AF compares
  with the *best* earlier accuracy and has the opposite sign, so
  ``AF_N >= -BWT`` always, with equality when every task's best accuracy before the
  last row is the one right after it was learned.
* Last (PeCL): ``Last = 1/N * sum_{i=1..N} R[N, i]`` -- the same number as ``AA_N``
  (Tobaben's "average accuracy" after the final task).
* Avg (PeCL): ``Avg = 1/N * sum_{k=1..N} (1/k * sum_{i=1..k} R[k, i])`` -- the mean of the
  AA curve over the stream. Beware the name clash: PeCL's "Avg" is *not* Tobaben's
  "average accuracy" (that is PeCL's "Last").

Everything is vectorised over the matrix; no loops over tasks.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

import numpy as np

from dpcl.errors import InvalidParameterError

__all__ = [
    "task_accuracy",
    "empty_accuracy_matrix",
    "check_accuracy_matrix",
    "average_accuracy",
    "average_accuracy_curve",
    "forgetting",
    "average_forgetting",
    "average_forgetting_curve",
    "backward_transfer",
    "last_accuracy",
    "avg_accuracy",
    "summarize",
    "accuracy_rows",
    "aggregate_seeds",
    "SCALAR_METRICS",
]


def task_accuracy(predictions: Any, labels: Any) -> float:
    """Fraction of ``predictions`` equal to ``labels`` (1-D integer arrays of equal length).

    An empty test set has no accuracy: raises InvalidParameterError.
    """
    predictions = np.asarray(predictions).reshape(-1)
    labels = np.asarray(labels).reshape(-1)
    if predictions.shape != labels.shape:
        raise InvalidParameterError(
            f"predictions and labels must have the same length, got {predictions.shape[0]} and {labels.shape[0]}."
        )
    if labels.size == 0:
        raise InvalidParameterError("accuracy of an empty test set is undefined; give at least one example.")
    return float(np.mean(predictions == labels))


def empty_accuracy_matrix(n_tasks: int) -> np.ndarray:
    """A ``[n_tasks, n_tasks]`` float64 matrix of NaN, to be filled row by row as tasks finish."""
    if isinstance(n_tasks, bool) or not isinstance(n_tasks, (int, np.integer)) or n_tasks < 1:
        raise InvalidParameterError(f"n_tasks must be an integer >= 1, got {n_tasks!r}.")
    return np.full((int(n_tasks), int(n_tasks)), np.nan)


def check_accuracy_matrix(accuracy: Any) -> np.ndarray:
    """``accuracy`` as a float64 ``[rows, T]`` matrix (rows <= T), validated.

    Entries ``R[t, j]`` with ``j <= t`` must be finite and in [0, 1]; entries above the
    diagonal may be NaN (not evaluated) or in [0, 1].
    """
    try:
        matrix = np.array(accuracy, dtype=np.float64)
    except (TypeError, ValueError) as exc:
        raise InvalidParameterError(f"accuracy matrix must be numeric, got {accuracy!r}.") from exc
    if matrix.ndim != 2 or matrix.shape[0] < 1 or matrix.shape[0] > matrix.shape[1]:
        raise InvalidParameterError(
            "accuracy matrix must be 2-D with 1 <= rows <= columns (row t = after task t, column j = task j), "
            f"got shape {matrix.shape}."
        )
    rows, cols = matrix.shape
    lower = np.tril(np.ones((rows, cols), dtype=bool))
    if not np.all(np.isfinite(matrix[lower])):
        t, j = np.argwhere(lower & ~np.isfinite(matrix))[0]
        raise InvalidParameterError(
            f"accuracy matrix entry R[{t}, {j}] (task {j} after task {t}) must be a finite accuracy, got {matrix[t, j]!r}."
        )
    finite = matrix[np.isfinite(matrix)]
    if finite.size and (finite.min() < 0 or finite.max() > 1):
        raise InvalidParameterError(
            f"accuracies must lie in [0, 1], got values in [{finite.min()!r}, {finite.max()!r}]."
        )
    return matrix


def _after(matrix: np.ndarray, after_task: int | None) -> int:
    rows = matrix.shape[0]
    if after_task is None:
        return rows - 1
    if isinstance(after_task, bool) or not isinstance(after_task, (int, np.integer)) or not 0 <= after_task < rows:
        raise InvalidParameterError(f"after_task must be an integer in [0, {rows}) (0-based), got {after_task!r}.")
    return int(after_task)


def average_accuracy_curve(accuracy: Any) -> np.ndarray:
    """``AA_t`` for every row t (Tobaben et al. eq. A38): mean of ``R[t, 0..t]``; float64 ``[rows]``."""
    matrix = check_accuracy_matrix(accuracy)
    rows = matrix.shape[0]
    lower = np.tril(np.ones((rows, matrix.shape[1]), dtype=bool))
    return np.where(lower, matrix, 0.0).sum(axis=1) / np.arange(1, rows + 1)


def average_accuracy(accuracy: Any, after_task: int | None = None) -> float:
    """``AA_t`` (Tobaben et al. eq. A38) after task ``after_task`` (0-based; default: the last row)."""
    matrix = check_accuracy_matrix(accuracy)
    return float(average_accuracy_curve(matrix)[_after(matrix, after_task)])


def forgetting(accuracy: Any, after_task: int | None = None, *, since_learned: bool = False) -> np.ndarray:
    """``f_{t,i}`` for i < t (Tobaben et al. eq. A39), float64 ``[t]``; empty for t = 0.

    ``max_k (R[k, i] - R[t, i])`` over k < t with R[k, i] evaluated (k >= i when
    ``since_learned``); NaN entries are skipped, and k = i is always available.
    """
    matrix = check_accuracy_matrix(accuracy)
    t = _after(matrix, after_task)
    if t == 0:
        return np.zeros(0)
    earlier = matrix[:t, :t].copy()  # rows k < t, columns i < t
    if since_learned:
        earlier[np.triu(np.ones((t, t), dtype=bool), k=1)] = np.nan  # drop k < i
    best = np.nanmax(earlier, axis=0)  # the diagonal k = i is finite, so no all-NaN column
    return best - matrix[t, :t]


def average_forgetting(accuracy: Any, after_task: int | None = None, *, since_learned: bool = False) -> float:
    """``AF_t`` (Tobaben et al. eq. A40): mean forgetting of tasks 0..t-1 after task t.

    Undefined after the first task (no earlier task): raises InvalidParameterError for t = 0.
    """
    matrix = check_accuracy_matrix(accuracy)
    t = _after(matrix, after_task)
    if t == 0:
        raise InvalidParameterError("average forgetting needs at least two learned tasks (eq. A40 divides by t - 1).")
    return float(np.mean(forgetting(matrix, t, since_learned=since_learned)))


def average_forgetting_curve(accuracy: Any, *, since_learned: bool = False) -> np.ndarray:
    """``AF_t`` for t = 1..rows-1 (0-based; AF of the first task is undefined), float64 ``[rows - 1]``.

    Vectorised: the running maximum over earlier rows (``np.fmax.accumulate``) gives
    ``max_{k<t} R[k, i]`` for every t at once.
    """
    matrix = check_accuracy_matrix(accuracy)
    rows, cols = matrix.shape
    if rows == 1:
        return np.zeros(0)
    masked = matrix.copy()
    if since_learned:
        masked[np.triu(np.ones((rows, cols), dtype=bool), k=1)] = np.nan
    running_best = np.fmax.accumulate(masked, axis=0)  # running_best[k, i] = max_{k' <= k} R[k', i]
    best_before = running_best[:-1]  # for row t = 1..rows-1: max over k <= t-1
    current = matrix[1:]
    diff = best_before - current  # [rows-1, cols]; column i counts for row t iff i < t
    t_index = np.arange(1, rows)[:, None]
    valid = np.arange(cols)[None, :] < t_index
    return np.where(valid, diff, 0.0).sum(axis=1) / np.arange(1, rows)


def backward_transfer(accuracy: Any) -> float:
    """BWT (Lopez-Paz & Ranzato 2017, GEM; restated in PeCL): ``mean_{i<N-1} (R[N-1, i] - R[i, i])`` (0-based).

    Uses the last row given as "after all N tasks"; needs at least two rows.
    """
    matrix = check_accuracy_matrix(accuracy)
    n = matrix.shape[0]
    if n < 2:
        raise InvalidParameterError("backward transfer needs at least two learned tasks (it divides by N - 1).")
    return float(np.mean(matrix[n - 1, : n - 1] - np.diag(matrix)[: n - 1]))


def last_accuracy(accuracy: Any) -> float:
    """Last (PeCL): mean accuracy over the learned tasks after the last one; equals ``AA_N`` (eq. A38)."""
    return average_accuracy(accuracy)


def avg_accuracy(accuracy: Any) -> float:
    """Avg (PeCL): mean over k of ``AA_k`` -- the average of the AA curve (not Tobaben's AA)."""
    return float(np.mean(average_accuracy_curve(accuracy)))


def summarize(accuracy: Any, *, since_learned: bool = False) -> dict[str, Any]:
    """Every metric of the rows given, as a JSON-able dict (no NaN: undefined values are None).

    Keys: ``accuracy_matrix`` (NaN -> None), ``tasks_learned``, ``average_accuracy`` (AA after
    the last row, eq. A38), ``average_accuracy_curve``, ``average_forgetting`` (eq. A40; None
    after one task), ``average_forgetting_curve``, ``backward_transfer`` (None after one task),
    ``last``, ``avg``, ``forgetting_definition``.
    """
    matrix = check_accuracy_matrix(accuracy)
    rows = matrix.shape[0]
    several = rows >= 2
    return {
        "accuracy_matrix": [[None if not np.isfinite(v) else float(v) for v in row] for row in matrix],
        "tasks_learned": int(rows),
        "average_accuracy": average_accuracy(matrix),
        "average_accuracy_curve": average_accuracy_curve(matrix).tolist(),
        "average_forgetting": average_forgetting(matrix, since_learned=since_learned) if several else None,
        "average_forgetting_curve": average_forgetting_curve(matrix, since_learned=since_learned).tolist(),
        "backward_transfer": backward_transfer(matrix) if several else None,
        "last": last_accuracy(matrix),
        "avg": avg_accuracy(matrix),
        "forgetting_definition": "A39 max over k >= i" if since_learned else "A39 max over all k < t",
    }


def accuracy_rows(rows: Sequence[Sequence[float]], n_tasks: int) -> np.ndarray:
    """Stack per-task evaluation rows (row t: accuracies on tasks 0..len-1) into a NaN-padded matrix."""
    matrix = np.full((len(rows), n_tasks), np.nan)
    for t, row in enumerate(rows):  # rows are few (one per task); each is copied as a whole
        values = np.asarray(row, dtype=np.float64)
        if values.size > n_tasks:
            raise InvalidParameterError(f"row {t} has {values.size} accuracies but the stream has {n_tasks} tasks.")
        matrix[t, : values.size] = values
    return check_accuracy_matrix(matrix)


#: Scalar keys of :func:`summarize` that :func:`aggregate_seeds` averages.
SCALAR_METRICS = ("average_accuracy", "average_forgetting", "backward_transfer", "last", "avg")


def aggregate_seeds(summaries: Sequence[Mapping[str, Any]]) -> dict[str, dict[str, Any]]:
    """Mean and sample standard deviation (``ddof=1``) of each scalar metric over repeated runs.

    ``summaries`` are :func:`summarize` dicts (or ``metrics.json`` contents), one per seed.
    Returns ``{metric: {"mean", "std", "n"}}``; ``std`` is None for a single run and a metric
    that is None in any run (e.g. AF of a one-task stream) is reported as None.
    """
    if not summaries:
        raise InvalidParameterError("aggregate_seeds needs at least one run summary.")
    out: dict[str, dict[str, Any]] = {}
    for key in SCALAR_METRICS:  # five keys, not a loop over data
        values = [s.get(key) for s in summaries]
        if any(v is None for v in values):
            out[key] = {"mean": None, "std": None, "n": len(values)}
            continue
        array = np.asarray(values, dtype=np.float64)
        if not np.all(np.isfinite(array)):
            raise InvalidParameterError(f"{key} must be finite in every run summary, got {values}.")
        std = float(np.std(array, ddof=1)) if array.size > 1 else None
        out[key] = {"mean": float(np.mean(array)), "std": std, "n": int(array.size)}
    return out
