"""Lifelong DP of L2DP-ML: sensitivities checked on random neighbouring datasets, the bound, preconditions, plan."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from dpcl.accounting.accountants import compute_epsilon
from dpcl.accounting.events import ComposedEvent, LaplaceEvent, event_from_dict
from dpcl.errors import ConfigError, InvalidParameterError
from dpcl.methods.l2dpml.spec import L2DPML_SPEC
from dpcl.guarantees.lifelong import (
    batch_partition,
    check_batch_partition,
    check_input_range,
    check_memory_fixed_disjoint,
    check_units,
    coefficient_digest,
    dpsgd_agem_epsilons,
    dpsgd_agem_unit_events,
    laplace_noise_scale,
    lifelong_bound,
    noisy_input_epsilon,
    output_sensitivity,
    paper_output_sensitivity,
    paper_reconstruction_sensitivity,
    reconstruction_sensitivity,
)
from dpcl.guarantees.method_schema import get_method_spec


# -- independent coefficient computations (written from eq. 11 / the Taylor expansion, not from dpcl) --
def reconstruction_upper(x: np.ndarray) -> np.ndarray:
    """Upper triangle of sym(A), A_sj = sum_r x_rj (1/2 - x_rs): the released coefficients of eq. 11."""
    a = np.einsum("rj,rs->sj", x, 0.5 - x)
    sym = (a + a.T) / 2.0
    return sym[np.triu_indices(x.shape[1])]


def output_released(h: np.ndarray, y: np.ndarray) -> np.ndarray:
    """b_k = sum_r (1/2 - y_rk) h_r for all k, and the upper triangle of Q = sum_r h_r h_r^T."""
    b = np.einsum("rp,rk->pk", h, 0.5 - y)
    q = h.T @ h
    return np.concatenate([b.ravel(), q[np.triu_indices(h.shape[1])]])


BOXES = {"unit": (0.0, 1.0), "symmetric": (-1.0, 1.0)}


@st.composite
def neighbouring_inputs(draw, box: str):
    lo, hi = BOXES[box]
    n = draw(st.integers(1, 6))
    d = draw(st.integers(1, 6))
    special = st.sampled_from([lo, hi, 0.25, (lo + hi) / 2])
    value = st.one_of(special, st.floats(lo, hi, allow_nan=False))
    x = np.array(draw(st.lists(value, min_size=n * d, max_size=n * d))).reshape(n, d)
    row = np.array(draw(st.lists(value, min_size=d, max_size=d)))
    i = draw(st.integers(0, n - 1))
    x2 = x.copy()
    x2[i] = row
    return x, x2


@pytest.mark.parametrize("box", ["unit", "symmetric"])
@given(data=st.data())
def test_reconstruction_coefficients_l1_change_never_exceeds_delta_r(box, data):
    x, x2 = data.draw(neighbouring_inputs(box))
    diff = np.abs(reconstruction_upper(x) - reconstruction_upper(x2)).sum()
    assert diff <= reconstruction_sensitivity(x.shape[1], box) * (1 + 1e-12) + 1e-12


def test_reconstruction_sensitivity_closed_forms():
    for d in (1, 2, 8, 64):
        assert reconstruction_sensitivity(d, "unit") == pytest.approx(9 * d / 16 + 3 * d * (d - 1) / 8)
        assert reconstruction_sensitivity(d, "symmetric") == pytest.approx(25 * d / 16 + 5 * d * (d - 1) / 4)


def test_reconstruction_sensitivity_is_attained_in_one_dimension_and_close_in_two():
    # d = 1: u/2 - u^2 over [0, 1] ranges from -1/2 (u = 1) to 1/16 (u = 1/4): width 9/16, attained.
    gap = abs(reconstruction_upper(np.array([[1.0]])) - reconstruction_upper(np.array([[0.25]]))).sum()
    assert gap == pytest.approx(reconstruction_sensitivity(1, "unit"))
    # d = 2: x = (1, 1) vs (1, 0) changes the off-diagonal term from -1/2 to 1/4 (width 3/4 attained there).
    gap2 = np.abs(reconstruction_upper(np.array([[1.0, 1.0]])) - reconstruction_upper(np.array([[1.0, 0.0]]))).sum()
    assert gap2 <= reconstruction_sensitivity(2, "unit")
    assert gap2 >= 0.75


@st.composite
def neighbouring_features(draw):
    n = draw(st.integers(1, 5))
    p = draw(st.integers(1, 5))
    k = draw(st.integers(2, 5))
    value = st.one_of(st.sampled_from([-1.0, 1.0, 0.0]), st.floats(-1, 1, allow_nan=False))
    h = np.array(draw(st.lists(value, min_size=n * p, max_size=n * p))).reshape(n, p)
    labels = np.array(draw(st.lists(st.integers(0, k - 1), min_size=n, max_size=n)))
    i = draw(st.integers(0, n - 1))
    h2, labels2 = h.copy(), labels.copy()
    h2[i] = np.array(draw(st.lists(value, min_size=p, max_size=p)))
    labels2[i] = draw(st.integers(0, k - 1))
    return h, np.eye(k)[labels], h2, np.eye(k)[labels2]


@given(neighbouring_features())
def test_output_coefficients_l1_change_never_exceeds_delta_l(sample):
    h, y, h2, y2 = sample
    diff = np.abs(output_released(h, y) - output_released(h2, y2)).sum()
    assert diff <= output_sensitivity(h.shape[1], y.shape[1]) + 1e-12


def test_output_sensitivity_is_attained_and_paper_value_is_exceeded():
    p, k = 3, 4
    y = np.eye(k)[[0]]
    # all-ones vs all-minus-ones, same label: b moves by K p, diagonal Q by 0, off-diagonal by 0
    diff_b = np.abs(output_released(np.ones((1, p)), y) - output_released(-np.ones((1, p)), y)).sum()
    assert diff_b == pytest.approx(k * p)
    assert diff_b > paper_output_sensitivity(p)  # the paper's 2|h_pi| is not an upper bound
    assert output_sensitivity(p, k) == k * p + p * p


def test_paper_values_are_reported_as_stated():
    assert paper_reconstruction_sensitivity(64, 16) == 64 * 18
    assert paper_output_sensitivity(8) == 16


def test_shared_noise_across_batches_leaks_the_exact_difference():
    """Alg. 2 draws one noise vector for all batches: the difference of two releases is noise-free."""
    rng = np.random.default_rng(0)
    x = rng.random((8, 3))
    noise = rng.laplace(0, 100.0, size=6)
    rel1 = reconstruction_upper(x[:4]) + noise
    rel2 = reconstruction_upper(x[4:]) + noise
    exact = reconstruction_upper(x[:4]) - reconstruction_upper(x[4:])
    np.testing.assert_allclose(rel1 - rel2, exact)


def test_laplace_noise_scale_gives_the_event_epsilon():
    scale = laplace_noise_scale(2.5, 1548.0)
    assert LaplaceEvent(scale=scale, sensitivity=1548.0).epsilon == pytest.approx(2.5)
    with pytest.raises(InvalidParameterError, match="epsilon"):
        laplace_noise_scale(0.0, 1.0)


def test_lifelong_bound_terms():
    d, h1, lam, norm = 64, 16, 288, 3.0
    bound = lifelong_bound(2.0, 3.0, n_features=d, hidden_size=h1, batch_size=lam, theta1_norm=norm)
    delta_r = d * (h1 + 2)
    assert bound.gamma_x == pytest.approx(delta_r / lam)
    assert bound.gamma == pytest.approx(2 * delta_r / (lam * norm))
    assert bound.paper_terms["epsilon1_over_gamma_x"] == pytest.approx(2.0 * lam / delta_r)
    assert bound.paper_terms["epsilon1_over_gamma"] == pytest.approx(2.0 * lam * norm / (2 * delta_r))
    assert bound.paper_epsilon == pytest.approx(2.0 + 2.0 * lam / delta_r + 2.0 * lam * norm / (2 * delta_r) + 3.0)
    assert bound.epsilon == pytest.approx(5.0)
    assert sum(bound.certified_terms.values()) == pytest.approx(bound.epsilon)
    assert bound.epsilon <= bound.paper_epsilon
    out = bound.to_dict()
    assert out["delta"] == 0.0 and out["adjacency"] == "replace_one"
    assert lifelong_bound(1.0, 1.0, n_features=4, hidden_size=2, batch_size=8).paper_epsilon is None
    with pytest.raises(InvalidParameterError, match="epsilon2"):
        lifelong_bound(1.0, -1.0, n_features=4, hidden_size=2, batch_size=8)


def test_noisy_input_epsilon_is_d_times_width_times_the_paper_term():
    d, lam, e1, delta_r = 64, 100, 1.0, 64 * 18.0
    paper_term = e1 / (delta_r / lam)
    assert noisy_input_epsilon(d, "unit", lam, e1, delta_r) == pytest.approx(d * 1.0 * paper_term)
    assert noisy_input_epsilon(d, "symmetric", lam, e1, delta_r) == pytest.approx(d * 2.0 * paper_term)


@given(n=st.integers(0, 300), lam=st.integers(1, 64), seed=st.integers(0, 2**31))
def test_batch_partition_is_a_fixed_partition(n, lam, seed):
    batches = batch_partition(n, lam, seed)
    assert check_batch_partition(batches, n, lam).met
    again = batch_partition(n, lam, seed)
    assert all(np.array_equal(a, b) for a, b in zip(batches, again))
    assert len(batches) == math.ceil(n / lam)


def test_met_input_range_does_not_report_the_private_extremes():
    """A met check is released in checkpoints and certificates: no min / max of the private inputs in it."""
    met = check_input_range(np.array([[0.123456, 0.987654]]), "unit")
    assert met.met and "0.123456" not in met.detail and "0.987654" not in met.detail
    failed = check_input_range(np.array([[0.25, 1.5]]), "unit")  # stops the run: the curator sees the range
    assert not failed.met and "[0.25, 1.5]" in failed.detail


def test_preconditions_detect_violations():
    assert not check_batch_partition([np.array([0, 1]), np.array([1, 2])], 3, 2).met
    assert not check_batch_partition([np.array([0, 1, 2])], 3, 2).met  # batch larger than lambda
    assert not check_input_range(np.array([[0.0, 1.5]]), "unit").met
    assert not check_input_range(np.array([[0.0, np.nan]]), "unit").met
    assert check_input_range(np.array([[-1.0, 1.0]]), "symmetric").met
    assert not check_units(np.array([1, 2, 2]), np.array([], dtype=int)).met
    assert not check_units(np.array([1, 2]), np.array([2, 5])).met
    assert check_units(np.array([1, 2]), np.array([3])).met
    # sequential composition across tasks: a unit may return in a later task, never twice within one
    assert check_units(np.array([1, 2]), np.array([2, 5]), across_tasks="sequential").met
    assert not check_units(np.array([1, 2, 2]), np.array([], dtype=int), across_tasks="sequential").met
    with pytest.raises(InvalidParameterError, match="across_tasks"):
        check_units(np.array([1]), np.array([2]), across_tasks="auto")
    coeff = np.arange(4.0)
    entries = [{"task": 0, "units": np.array([1, 2]), "digest": coefficient_digest(coeff)},
               {"task": 1, "units": np.array([3]), "digest": coefficient_digest(coeff + 1)}]
    assert check_memory_fixed_disjoint(entries, [coefficient_digest(coeff), coefficient_digest(coeff + 1)]).met
    assert not check_memory_fixed_disjoint(entries, [coefficient_digest(coeff), coefficient_digest(coeff)]).met
    entries[1]["units"] = np.array([2])
    assert not check_memory_fixed_disjoint(entries, [coefficient_digest(coeff), coefficient_digest(coeff + 1)]).met


PRIVACY = {"epsilon": 4.0, "delta": 1e-5, "adjacency": "replace_one", "unit": "example"}


def test_spec_is_registered_and_plans_two_laplace_releases():
    spec = get_method_spec("l2dpml")
    assert spec is L2DPML_SPEC and not spec.reuses_past_tasks
    plan = spec.plan_task({"epsilon1_fraction": 0.25}, PRIVACY, 300, 0)
    assert plan.noise["epsilon1"] == pytest.approx(1.0) and plan.noise["epsilon2"] == pytest.approx(3.0)
    assert plan.noise["n_batches"] == 1
    eps = sum(e.sensitivity / e.scale for e in plan.events)
    assert eps == pytest.approx(4.0)
    assert all(e.adjacency.value == "replace_one" for e in plan.events)
    # an accountant recomputes it from the serialised events (basic composition of pure-DP releases)
    events = [event_from_dict(e.to_dict()) for e in plan.events]
    assert compute_epsilon(ComposedEvent(events), 1e-5, "basic").epsilon == pytest.approx(4.0, rel=1e-9)


def test_plan_is_the_same_for_every_task_and_size_only_sets_batches():
    a = L2DPML_SPEC.plan_task({}, PRIVACY, 1000, 3)
    b = L2DPML_SPEC.plan_task({}, PRIVACY, 10, 7)
    assert a.events == b.events
    assert a.noise["n_batches"] == 2 and b.noise["n_batches"] == 1


def test_first_task_autoencoder_charges_epsilon1_once():
    method = {"autoencoder_training": "first_task"}
    first = L2DPML_SPEC.plan_task(method, PRIVACY, 100, 0)
    later = L2DPML_SPEC.plan_task(method, PRIVACY, 100, 1)
    assert len(first.events) == 2 and len(later.events) == 1
    assert later.noise["task_epsilon"] == pytest.approx(2.0) and not later.noise["release_autoencoder"]


def test_empty_task_charges_nothing():
    plan = L2DPML_SPEC.plan_task({}, PRIVACY, 0, 2)
    assert plan.events == () and plan.noise["n_batches"] == 0


@pytest.mark.parametrize(
    "method, privacy, match",
    [
        ({}, {"delta": 1e-5}, "epsilon is required"),
        ({}, {**PRIVACY, "epsilon": -1.0}, "epsilon"),
        ({}, {**PRIVACY, "adjacency": "add_remove"}, "replace_one"),
        ({"epsilon1_fraction": 1.0}, PRIVACY, "epsilon1_fraction"),
        ({"hidden_sizes": []}, PRIVACY, "hidden_sizes"),
        ({"hidden_sizes": [4, 0]}, PRIVACY, "hidden_sizes"),
        ({"input_range": "[0, 255]"}, PRIVACY, "input_range"),
        ({"reference_gradient": "all"}, PRIVACY, "reference_gradient"),
        ({"batch_size": 0}, PRIVACY, "batch_size"),
    ],
)
def test_bad_config_raises_config_error(method, privacy, match):
    with pytest.raises(ConfigError, match=match):
        L2DPML_SPEC.plan_task(method, privacy, 10, 0)


def test_dpsgd_agem_events_and_growth():
    rates = [0.1, 0.1, 0.1, 0.1]
    steps = [50, 50, 50, 50]
    mem = [1.0, 0.5, 0.25, 0.2]
    ev = dpsgd_agem_unit_events(1.0, rates, steps, mem, 0, 2)
    leaves = list(ev.leaves())
    assert [n for _, n in leaves] == [50, 50, 50]
    assert [leaf.sample_rate for leaf, _ in leaves] == [0.1, 0.5, 0.25]
    eps = dpsgd_agem_epsilons(1.0, rates, steps, mem, 1e-5, "rdp")
    assert np.all(np.diff(eps) > 0)  # the naive baseline's epsilon grows with every task
    first = compute_epsilon(dpsgd_agem_unit_events(1.0, rates, steps, mem, 0, 0), 1e-5, "rdp").epsilon
    assert eps[0] == pytest.approx(first)
    with pytest.raises(InvalidParameterError):
        dpsgd_agem_unit_events(1.0, rates, steps, mem, 2, 1)


def test_lifelong_module_does_not_import_torch():
    import subprocess
    import sys

    code = "import sys, dpcl.guarantees.lifelong\nassert 'torch' not in sys.modules, 'torch imported'\n"
    subprocess.run([sys.executable, "-c", code], check=True)


def _audit_output_release(assumed_sensitivity: float, epsilon: float, trials: int):
    """Black-box audit of the output-layer coefficient release on the worst pair found by hand.

    D = {h = (1, ..., 1), label 0}, D' = {h = (-1, ..., -1), label 0}: the linear
    coefficients move by K p in l1 (the quadratic ones not at all). Noise is
    calibrated to ``assumed_sensitivity``; the score is the exact Laplace
    log-likelihood ratio between the two outputs' centres.
    """
    from dpcl.audit.blackbox import audit_sampler

    p, k = 2, 6
    y = np.eye(k)[[0]]
    centre_d = output_released(np.ones((1, p)), y)
    centre_dp = output_released(-np.ones((1, p)), y)
    scale = laplace_noise_scale(epsilon, assumed_sensitivity)

    def sampler(centre):
        return lambda n, rng: centre + rng.laplace(0.0, scale, size=(n, centre.size))

    def llr(out):
        return (np.abs(out - centre_dp).sum(axis=1) - np.abs(out - centre_d).sum(axis=1)) / scale

    return audit_sampler(sampler(centre_d), sampler(centre_dp), trials, 1e-6, score=llr, seed=0), p, k


def test_audit_passes_the_derived_sensitivity_and_catches_the_papers():
    epsilon = 1.0
    sound, p, k = _audit_output_release(output_sensitivity(2, 6), epsilon, 200_000)
    assert sound.epsilon_lower_bound <= epsilon
    paper, _, _ = _audit_output_release(paper_output_sensitivity(2), epsilon, 200_000)
    # true epsilon of that pair is K p / (2 p) * epsilon = 3; the audit proves more than the claimed 1
    assert paper.epsilon_lower_bound > epsilon


def _l2dpml_config(task_sizes: list[int], disjoint_units: bool) -> dict:
    """A raw l2dpml config (epsilon 4 per release, replace-one) over a stream of the given task sizes."""
    return {
        "privacy": {"epsilon": 4.0, "delta": 1e-5, "adjacency": "replace_one"},
        "stream": {"dataset": "mine", "task_sizes": task_sizes, "label_space": "prior_const",
                   "prior_labels": [0, 1], "disjoint_units": disjoint_units},
        "method": {"name": "l2dpml"},
    }


def test_sequential_audit_composes_tasks_and_the_plan_note_does_not_claim_the_stream():
    """With disjoint_units = false the ledger composes the tasks (basic composition of pure-DP Laplace releases
    bounds it by 3 x 4 = 12); the plan's note must not state epsilon1 + epsilon2 for the whole stream then."""
    from dpcl.audit_config import audit_config
    from dpcl.guarantees.config import parse_config

    raw = _l2dpml_config([100, 100, 100], disjoint_units=False)
    report = audit_config(parse_config(raw), [100, 100, 100])
    assert report.across_tasks == "sequential"
    assert 8.0 < report.epsilon <= 12.0 * (1 + 1e-9)  # more than two tasks' worth, at most the sum of three
    note = next(n for n in report.notes if n.startswith("Lifelong DP"))
    assert "Under parallel composition" in note and "under sequential composition the ledger composes" in note
    # every task repeats the note: the report states it once; no assumption claims disjoint tasks
    assert sum(n.startswith("Lifelong DP") for n in report.notes) == 1
    assert not any("tasks hold disjoint units" in a for a in report.assumptions)
    assert any("compose sequentially" in a for a in report.assumptions)
    raw["stream"]["disjoint_units"] = True
    assert audit_config(parse_config(raw), [100, 100, 100]).epsilon <= 4.0 * (1 + 1e-9)


def test_empty_task_is_not_refused_by_the_audit():
    """An empty l2dpml task reads no data and releases the previous model (Prop. F.1 is met); the audit used to
    refuse it as 'releases nothing' because the plan did not say what it releases."""
    from dpcl.audit_config import audit_config
    from dpcl.guarantees.config import parse_config
    from dpcl.guarantees.label_space import EMPTY_TASK_RELEASE_KEY

    assert "previous release" in L2DPML_SPEC.plan_task({}, PRIVACY, 0, 1).noise[EMPTY_TASK_RELEASE_KEY]
    raw = _l2dpml_config([100, 0, 100], disjoint_units=True)
    report = audit_config(parse_config(raw), [100, 0, 100])
    assert report.sound and report.violations == ()
    assert report.per_task[1]["epsilon"] == 0.0 and report.per_task[1]["status"].startswith("empty task: previous")
    assert report.epsilon <= 4.0 * (1 + 1e-9)
