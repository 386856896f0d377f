"""DP Cosine Classifier (Tobaben et al., Alg. 1): sums, noise, sensitivity, label space, empty tasks."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import example, given
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

torch = pytest.importorskip("torch")

from dpcl.errors import InvalidParameterError  # noqa: E402
from dpcl.methods.base import TrainingData, method_class  # noqa: E402
from dpcl.methods.cosine.method import CosineClassifier, normalise_rows  # noqa: E402
from tobaben_helpers import TASK_LABELS, digits_split, gaussian_plan, setup_for, task_data  # noqa: E402


def _fit_stream(sigma, seed=0, label_space="prior_const"):
    x_train, y_train, x_test, y_test = digits_split()
    model = CosineClassifier(setup_for({}, seed=seed))
    rows = []
    for t, labels in enumerate(TASK_LABELS):
        output = tuple(range(10)) if label_space == "prior_const" else labels
        model.fit_task(t, task_data(x_train, y_train, labels), output, gaussian_plan(sigma))
        rows.append(
            [model.accuracy(x_test[np.isin(y_test, TASK_LABELS[j])], y_test[np.isin(y_test, TASK_LABELS[j])]) for j in range(t + 1)]
        )
    return model, rows


def test_registry_finds_the_cosine_classifier():
    assert method_class("cosine") is CosineClassifier


def test_non_private_sums_equal_the_per_class_sums_of_unit_vectors():
    x_train, y_train, _, _ = digits_split()
    model = CosineClassifier(setup_for({}))
    model.fit_task(0, task_data(x_train, y_train, (0, 1)), (0, 1), gaussian_plan(None))
    sums = model.state_dict()["class_sums"].numpy()
    unit = x_train / np.linalg.norm(x_train, axis=1, keepdims=True)
    for label in (0, 1):
        np.testing.assert_allclose(sums[label], unit[y_train == label].sum(axis=0), rtol=1e-6)
    assert np.all(sums[2:] == 0)
    assert model.seen_labels.tolist() == [True, True] + [False] * 8


def test_noise_has_the_planned_scale_on_every_released_row():
    """An empty task releases pure N(0, sigma^2) sums on all of O_t: sample std within 3% of sigma."""
    sigma = 2.5
    model = CosineClassifier(setup_for({}, seed=3, input_dim=2000))
    empty = TrainingData(np.zeros((0, 2000), np.float32), np.zeros(0, np.int64), np.zeros(0, np.int64))
    model.fit_task(0, empty, tuple(range(10)), gaussian_plan(sigma))
    sums = model.state_dict()["class_sums"].numpy()
    # 20000 draws: the sample std has relative standard error 1/sqrt(2*20000) = 0.5 %
    assert abs(sums.std() / sigma - 1) < 0.03
    assert abs(sums.mean()) < 4 * sigma / np.sqrt(sums.size)


def test_prior_label_space_only_touches_the_task_labels():
    x_train, y_train, _, _ = digits_split()
    model = CosineClassifier(setup_for({}))
    model.fit_task(0, task_data(x_train, y_train, (2, 3)), (2, 3), gaussian_plan(1.0))
    sums = model.state_dict()["class_sums"].numpy()
    assert np.all(sums[[0, 1, 4, 5, 6, 7, 8, 9]] == 0)
    assert np.all(sums[[2, 3]] != 0)


def test_empty_task_still_releases_a_proper_classifier():
    """Prop. F.1: with no data the release is noise-only sums that classify into O_t."""
    _, _, x_test, _ = digits_split()
    model = CosineClassifier(setup_for({}))
    empty = TrainingData(np.zeros((0, 64), np.float32), np.zeros(0, np.int64), np.zeros(0, np.int64))
    model.fit_task(0, empty, (4, 5, 6), gaussian_plan(1.0))
    predictions = model.predict(x_test)
    assert set(np.unique(predictions)) <= {4, 5, 6}


@given(
    arrays(np.float64, (7, 5), elements=st.floats(-1e6, 1e6, allow_nan=False, allow_infinity=False)),
    st.integers(0, 6),
)
def test_one_example_moves_the_release_by_at_most_one(features, removed):
    """l2 sensitivity of the whole |O_t| x K release under add/remove is 1 (the plan's GaussianEvent)."""
    labels = np.array([0, 1, 2, 0, 1, 2, 0])
    full = CosineClassifier(setup_for({}, label_space=(0, 1, 2), input_dim=5))
    full.fit_task(0, TrainingData(features.astype(np.float32), labels, np.arange(7)), (0, 1, 2), gaussian_plan(None))
    keep = np.delete(np.arange(7), removed)
    less = CosineClassifier(setup_for({}, label_space=(0, 1, 2), input_dim=5))
    less.fit_task(0, TrainingData(features[keep].astype(np.float32), labels[keep], keep), (0, 1, 2), gaussian_plan(None))
    difference = full.state_dict()["class_sums"] - less.state_dict()["class_sums"]
    assert float(torch.linalg.vector_norm(difference)) <= 1.0 + 1e-9


@given(arrays(np.float64, (4, 3), elements=st.floats(-1e300, 1e300, allow_nan=False, allow_infinity=False)))
@example(np.full((4, 3), 8.7e-162))  # squares underflow: the unscaled norm was too small and the row's norm above 1
@example(np.full((4, 3), 5e-324))  # subnormal rows still come out with unit norm
def test_normalised_rows_have_norm_at_most_one(rows):
    norms = torch.linalg.vector_norm(normalise_rows(torch.as_tensor(rows)), dim=1)
    assert torch.all(norms <= 1 + 1e-12)
    assert torch.all(torch.isfinite(norms))


def test_labels_outside_the_public_set_are_refused():
    x_train, y_train, _, _ = digits_split()
    model = CosineClassifier(setup_for({}))
    with pytest.raises(InvalidParameterError, match="label-space filter"):
        model.fit_task(0, task_data(x_train, y_train, (0, 1, 2)), (0, 1), gaussian_plan(1.0))


@pytest.mark.parametrize(
    "plan_noise, events",
    [({}, True), ({"sigma": 1.0}, False), ({"sigma": -1.0}, True), ({"sigma": float("nan")}, True)],
)
def test_inconsistent_plans_are_refused(plan_noise, events):
    from dpcl.accounting.events import GaussianEvent
    from dpcl.guarantees.method_schema import TaskPlan

    plan = TaskPlan(events=(GaussianEvent(sigma=1.0),) if events else (), noise=plan_noise)
    x_train, y_train, _, _ = digits_split()
    model = CosineClassifier(setup_for({}))
    with pytest.raises(InvalidParameterError, match="sigma"):
        model.fit_task(0, task_data(x_train, y_train, (0, 1)), (0, 1), plan)


def test_predict_before_any_task_is_refused():
    with pytest.raises(InvalidParameterError, match="before any task"):
        CosineClassifier(setup_for({})).predict(np.zeros((1, 64), np.float32))


def test_state_round_trip_predicts_identically():
    _, _, x_test, _ = digits_split()
    model, _ = _fit_stream(sigma=3.0, seed=1)
    restored = CosineClassifier(setup_for({}, seed=99))
    restored.load_state_dict(model.state_dict())
    np.testing.assert_array_equal(restored.predict(x_test), model.predict(x_test))
    assert restored.tasks_fitted == 5


def test_split_digits_beats_chance_by_a_wide_margin():
    """Non-private and sigma = 3.7 (about epsilon 1 at delta 1e-5): final AA far above 0.1 chance."""
    _, clean = _fit_stream(sigma=None)
    _, noisy = _fit_stream(sigma=3.7, seed=4)
    assert np.mean(clean[-1]) > 0.8
    assert np.mean(noisy[-1]) > 0.5
    assert len(clean[-1]) == 5


@given(
    arrays(np.float64, (6, 5), elements=st.floats(-1e6, 1e6, allow_nan=False, allow_infinity=False)),
    arrays(np.float64, (5,), elements=st.floats(-1e6, 1e6, allow_nan=False, allow_infinity=False)),
    st.integers(0, 5),
    st.integers(0, 2),
)
def test_replacing_one_example_moves_the_release_by_at_most_two(features, replacement, position, new_label):
    """l2 sensitivity under replace-one is 2 (the plan's value): ||u - v|| <= 2 in one row, sqrt(2) across rows."""
    labels = np.array([0, 1, 2, 0, 1, 2])

    def sums(x, y):
        model = CosineClassifier(setup_for({}, label_space=(0, 1, 2), input_dim=5))
        model.fit_task(0, TrainingData(x.astype(np.float32), y, np.arange(6)), (0, 1, 2), gaussian_plan(None))
        return model.state_dict()["class_sums"]

    x2, y2 = features.copy(), labels.copy()
    x2[position], y2[position] = replacement, new_label
    assert float(torch.linalg.vector_norm(sums(features, labels) - sums(x2, y2))) <= 2.0 + 1e-9


def test_the_replace_one_bound_of_two_is_attained():
    """v replaced by -v in the same class moves that class sum by exactly 2: sensitivity 2 is tight."""
    v = np.array([[3.0, 4.0]], np.float32)
    before = CosineClassifier(setup_for({}, label_space=(0, 1), input_dim=2))
    before.fit_task(0, TrainingData(v, np.array([0]), np.array([0])), (0, 1), gaussian_plan(None))
    after = CosineClassifier(setup_for({}, label_space=(0, 1), input_dim=2))
    after.fit_task(0, TrainingData(-v, np.array([0]), np.array([0])), (0, 1), gaussian_plan(None))
    diff = before.state_dict()["class_sums"] - after.state_dict()["class_sums"]
    assert float(torch.linalg.vector_norm(diff)) == pytest.approx(2.0)


def test_unknown_method_name_is_a_config_error_naming_the_choices():
    from dpcl.errors import ConfigError

    with pytest.raises(ConfigError, match=r"\[method\] name must be one of agem, cosine, .*; got 'cosin'"):
        method_class("cosin")
