"""Continual-learning metrics (numpy only; never imports torch).

From the accuracy matrix ``R[t, j]`` (accuracy on task j's test set after
training task t, 0-based): average accuracy AA (Tobaben et al. eq. A38),
forgetting and average forgetting AF (eq. A39/A40), backward transfer BWT
(Lopez-Paz & Ranzato 2017), Last and Avg (Zhan et al., PeCL). See
:mod:`dpcl.metrics.continual` for the exact definitions and where the papers differ.
"""

from dpcl.metrics.continual import (
    SCALAR_METRICS,
    accuracy_rows,
    aggregate_seeds,
    average_accuracy,
    average_accuracy_curve,
    average_forgetting,
    average_forgetting_curve,
    avg_accuracy,
    backward_transfer,
    check_accuracy_matrix,
    empty_accuracy_matrix,
    forgetting,
    last_accuracy,
    summarize,
    task_accuracy,
)

__all__ = [
    "SCALAR_METRICS",
    "accuracy_rows",
    "aggregate_seeds",
    "average_accuracy",
    "average_accuracy_curve",
    "average_forgetting",
    "average_forgetting_curve",
    "avg_accuracy",
    "backward_transfer",
    "check_accuracy_matrix",
    "empty_accuracy_matrix",
    "forgetting",
    "last_accuracy",
    "summarize",
    "task_accuracy",
]
