"""ContinualMethod.fit_task: the label-space contract is checked once, for every method, around learn_task."""

from __future__ import annotations

from typing import Any, Mapping

import numpy as np
import pytest

from dpcl.errors import InvalidParameterError, MethodPluginError
from dpcl.guarantees import TaskPlan
from dpcl.methods import ContinualMethod, MethodSetup, ProgressCallback, TrainingData, TrainingTask


class RecordingMethod(ContinualMethod):
    """Records the tasks learn_task receives; releases nothing else."""

    name = "recording"

    def __init__(self, setup: MethodSetup) -> None:
        super().__init__(setup)
        self.learned: list[TrainingTask] = []

    def learn_task(self, task: TrainingTask, progress: ProgressCallback | None = None) -> None:
        assert not self.seen_labels[self.label_positions(task.output_labels)].any()  # released only afterwards
        self.learned.append(task)

    def scores(self, features: np.ndarray) -> np.ndarray:
        return np.zeros((len(features), len(self.label_space)))

    def state_dict(self) -> dict[str, Any]:
        return self._base_state()

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self._load_base_state(state)


def method() -> RecordingMethod:
    return RecordingMethod(MethodSetup({"name": "recording"}, {"delta": 1e-6}, (0, 1, 2, 3), input_dim=2, seed=0))


def data(labels: list[int]) -> TrainingData:
    n = len(labels)
    return TrainingData(np.zeros((n, 2), dtype=np.float32), np.asarray(labels, dtype=np.int64), np.arange(n))


PLAN = TaskPlan(events=(), noise={})


def test_fit_task_hands_learn_task_one_checked_task_then_records_the_release():
    m = method()
    m.fit_task(3, data([2, 3, 3]), [3, 2], PLAN)
    (task,) = m.learned
    assert (task.index, task.output_labels, task.plan) == (3, (3, 2), PLAN)
    assert task.data.labels.tolist() == [2, 3, 3]
    assert m.seen_labels.tolist() == [False, False, True, True]
    assert m.tasks_fitted == 1
    m.fit_task(4, data([]), (0,), PLAN)  # an empty task still releases (Tobaben et al., Prop. F.1)
    assert m.tasks_fitted == 2 and m.seen_labels.tolist() == [True, False, True, True]


@pytest.mark.parametrize(
    "labels, output_labels, message",
    [
        ([1], (1, 9), "not in the public label space"),
        ([1], (1, 1), "must be distinct public labels"),
        ([], (), "must be distinct public labels"),
        ([0, 2], (0, 1), "outside its public labels [0, 1]; apply the label-space filter first"),
    ],
)
def test_fit_task_refuses_a_task_whose_labels_break_the_contract_before_learning(labels, output_labels, message):
    m = method()
    with pytest.raises(InvalidParameterError, match=message.replace("[", r"\[").replace("]", r"\]")):
        m.fit_task(0, data(labels), output_labels, PLAN)
    assert m.learned == [] and m.tasks_fitted == 0 and not m.seen_labels.any()


def test_a_method_that_overrides_fit_task_is_refused_when_defined():
    with pytest.raises(MethodPluginError, match="implement learn_task"):

        class Legacy(RecordingMethod):
            def fit_task(self, task_index, data, output_labels, plan, progress=None) -> None:  # noqa: D102
                pass
