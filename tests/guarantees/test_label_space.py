"""Label-space policy: each proposition's argument reproduced (Tobaben et al., Prop. 4.6, 4.7, F.1)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from dpcl.errors import ConfigError, InvalidParameterError, LabelSpaceViolationError
from dpcl.guarantees.label_space import (
    EMPTY_TASK_RELEASE_KEY,
    LabelSpacePolicy,
    filter_task,
    label_space_assumption,
    output_label_sets,
    refuse_data_label_space,
    require_proper_release,
)

from .reference import gaussian_profile_delta


def _s_data_release(labels: np.ndarray, rng: np.random.Generator):
    """S_data mechanism: DP-noised weights, but output labels read from the private data."""
    weights = rng.normal(size=3)  # any DP weights; the label set alone breaks DP
    return weights, frozenset(np.unique(labels).tolist())


def test_prop_4_6_counterexample_disjoint_supports():
    """D' = D + {(x*, y*)} with y* absent from D: outputs' label sets have disjoint supports."""
    rng = np.random.default_rng(0)
    d = np.array([0, 0, 1, 1, 1])
    d_prime = np.append(d, 2)  # neighbour under add/remove, y* = 2 not in D
    event = frozenset({0, 1, 2})  # S = {O'_t}
    hits = np.array([_s_data_release(d, rng)[1] == event for _ in range(200)])
    hits_prime = np.array([_s_data_release(d_prime, rng)[1] == event for _ in range(200)])
    p, p_prime = hits.mean(), hits_prime.mean()
    assert (p, p_prime) == (0.0, 1.0)
    # (eps, delta)-DP would need p' <= e^eps p + delta, i.e. 1 <= delta, for every eps.
    for eps in (0.1, 1.0, 10.0, 100.0):
        assert p_prime > np.exp(eps) * p + 0.999999


def test_data_policy_refused_with_counterexample():
    with pytest.raises(LabelSpaceViolationError) as info:
        refuse_data_label_space("data")
    msg = str(info.value)
    assert "Prop. 4.6" in msg and "D' = D + {(x*, y*)}" in msg and "'prior'" in msg
    with pytest.raises(LabelSpaceViolationError):
        output_label_sets("data", [[0, 1]], 1)
    assert refuse_data_label_space("prior") is LabelSpacePolicy.PRIOR
    with pytest.raises(ConfigError, match="label_space must be one of"):
        LabelSpacePolicy.parse("labels")


def test_prop_4_7_filtering_keeps_gaussian_guarantee():
    """Filtering to the public set: neighbours stay neighbours (or become equal) after filtering,
    so the Gaussian per-class sum keeps its sensitivity 1 and its (eps, delta)."""
    rng = np.random.default_rng(1)
    prior = {0, 1}
    feats = rng.normal(size=(6, 4))
    feats /= np.linalg.norm(feats, axis=1, keepdims=True)
    labels = np.array([0, 1, 1, 0, 5, 1])

    def class_sums(x, y):
        mask, _ = filter_task(y, prior)
        out = np.zeros((2, x.shape[1]))
        np.add.at(out, y[mask], x[mask])
        return out

    base = class_sums(feats, labels)
    x_star = rng.normal(size=(1, 4))
    x_star /= np.linalg.norm(x_star)
    sigma, eps = 3.0, 1.0
    budget_delta = gaussian_profile_delta(eps, 1.0 / sigma)  # the unfiltered mechanism's guarantee
    for y_star in (0, 1, 7):  # inside and outside the public label set
        neighbour = class_sums(np.vstack([feats, x_star]), np.append(labels, y_star))
        change = np.linalg.norm(neighbour - base)
        assert change == pytest.approx(1.0 if y_star in prior else 0.0)
        # Two Gaussians N(base, s^2 I), N(neighbour, s^2 I) have delta(eps) = profile at mu = change / s
        # (Balle & Wang Thm 8); identical outputs (change 0) have delta 0.
        pair_delta = gaussian_profile_delta(eps, change / sigma) if change > 0 else 0.0
        assert pair_delta <= budget_delta * (1 + 1e-12)


def test_filter_counts_not_labels():
    labels = np.array([0, 3, 1, 3, 9, 1, 0])
    mask, report = filter_task(labels, [0, 1], task_index=2)
    assert mask.tolist() == [True, False, True, False, False, True, True]
    assert (report.task_index, report.kept, report.filtered) == (2, 4, 3)
    mask, report = filter_task(np.array([], dtype=np.int64), [0])
    assert mask.size == 0 and report.kept == 0 and report.filtered == 0
    with pytest.raises(InvalidParameterError, match="1-D"):
        filter_task(np.zeros((2, 2), dtype=int), [0])
    with pytest.raises(InvalidParameterError, match="integers"):
        filter_task(np.array([0.5]), [0])


@given(st.lists(st.integers(0, 20), max_size=200), st.sets(st.integers(0, 20)))
def test_filter_matches_definition(labels, allowed):
    mask, report = filter_task(np.array(labels, dtype=np.int64), allowed)
    assert mask.tolist() == [y in allowed for y in labels]
    assert report.kept + report.filtered == len(labels)


def test_output_label_sets():
    assert output_label_sets("prior", [[0, 1], [1, 2]], 2) == [frozenset({0, 1}), frozenset({1, 2})]
    const = output_label_sets("prior_const", [[0, 1], [2, 3]], 3)
    assert const == [frozenset({0, 1, 2, 3})] * 3
    assert output_label_sets("prior_const", [4, 5], 2) == [frozenset({4, 5})] * 2
    with pytest.raises(ConfigError, match="one label list per task"):
        output_label_sets("prior", [[0, 1]], 2)
    with pytest.raises(ConfigError, match="per-task label lists"):
        output_label_sets("prior", [0, 1], 2)
    with pytest.raises(ConfigError, match="integer labels"):
        output_label_sets("prior_const", [0, "cat"], 2)
    with pytest.raises(ConfigError, match="non-empty"):
        output_label_sets("prior_const", [], 2)


def _release(data: list, releases_on_empty: bool):
    """A release mechanism; when not releasing on empty data it outputs ⊥ (None)."""
    if not data and not releases_on_empty:
        return None
    return ("classifier", len(data) + np.random.default_rng().normal())


def test_prop_f_1_empty_task_counterexample_and_refusal():
    d, d_prime = [], [("x*", 0)]
    proper = lambda out: out is not None  # noqa: E731  - S = H_t, the proper classifiers
    p = np.mean([proper(_release(d, False)) for _ in range(50)])
    p_prime = np.mean([proper(_release(d_prime, False)) for _ in range(50)])
    assert (p, p_prime) == (0.0, 1.0)  # 1 <= e^eps * 0 + delta: no delta < 1 works
    assert np.mean([proper(_release(d, True)) for _ in range(50)]) == 1.0
    with pytest.raises(LabelSpaceViolationError, match="Prop. F.1"):
        require_proper_release({}, "silent", 3)
    with pytest.raises(LabelSpaceViolationError, match="task 3"):
        require_proper_release({EMPTY_TASK_RELEASE_KEY: "nothing"}, "silent", 3)
    assert require_proper_release({EMPTY_TASK_RELEASE_KEY: "initialisation"}, "naive", 0) == "initialisation"


def test_assumption_sentences():
    assert "Prop. 4.7" in label_space_assumption("prior")
    assert "S_prior^const" in label_space_assumption("prior_const")
    with pytest.raises(LabelSpaceViolationError):
        label_space_assumption("data")
