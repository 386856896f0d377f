"""dpcl's vectorised Gaussian PLD construction against dp-accounting's own ``from_gaussian_mechanism``."""

from __future__ import annotations

import numpy as np
import pytest
from dp_accounting.pld import privacy_loss_distribution as pld_lib
from dp_accounting.privacy_accountant import NeighboringRelation

from dpcl.accounting.accountants import _gaussian_pld


def _pmfs(pld):
    return [p for p in (pld._pmf_remove, pld._pmf_add)]  # noqa: SLF001


@pytest.mark.parametrize(
    "z,q,interval",
    [(1.0, 32 / 288, 1e-3), (2.2, 0.11, 1e-3), (0.74, 0.001, 1e-3), (1.0, 1e-6, 1e-3), (0.5, 0.5, 1e-3),
     (3.0, 1.0, 1e-3), (0.3, 0.9, 1e-2)],
)
def test_same_pmf_and_epsilon_as_dp_accounting(z: float, q: float, interval: float) -> None:
    reference = pld_lib.from_gaussian_mechanism(
        z, sensitivity=1.0, pessimistic_estimate=True, value_discretization_interval=interval, sampling_prob=q
    )
    ours = _gaussian_pld(z, interval, q)
    for a, b in zip(_pmfs(reference), _pmfs(ours)):
        assert type(a) is type(b)
        if hasattr(a, "_probs"):
            assert a._lower_loss == b._lower_loss and a._infinity_mass == b._infinity_mass
            np.testing.assert_allclose(b._probs, a._probs, rtol=1e-12, atol=0)
        else:
            assert a._loss_probs.keys() == b._loss_probs.keys()
            np.testing.assert_allclose(list(b._loss_probs.values()), list(a._loss_probs.values()), rtol=1e-12, atol=0)
    for delta in (1e-5, 1e-3):
        expected = reference.self_compose(50).get_epsilon_for_delta(delta)
        assert ours.self_compose(50).get_epsilon_for_delta(delta) == pytest.approx(expected, rel=1e-12, abs=1e-15)


def test_replace_one_is_dp_accountings_own() -> None:
    reference = pld_lib.from_gaussian_mechanism(
        1.0, sensitivity=1.0, pessimistic_estimate=True, value_discretization_interval=1e-3, sampling_prob=0.1,
        neighboring_relation=NeighboringRelation.REPLACE_ONE,
    )
    ours = _gaussian_pld(1.0, 1e-3, 0.1, replace_one=True)
    assert ours.get_epsilon_for_delta(1e-5) == reference.get_epsilon_for_delta(1e-5)


# -- the self-composition, its truncation bounds and the epsilon scan: dp-accounting's results, computed faster ----


@pytest.mark.parametrize(
    "z,q,count,interval",
    [(2.0, 0.001, 10_000, 1e-4), (1.0, 0.01, 1_000, 1e-4), (0.6, 0.1, 1_000, 1e-3), (1.0, 0.001, 100, 1e-3),
     (0.6, 0.001, 100, 2e-4), (0.3, 0.9, 40, 1e-2)],
)
def test_self_composition_and_epsilon_are_dp_accountings_own(z: float, q: float, count: int, interval: float) -> None:
    from dp_accounting.pld import common

    from dpcl.accounting.accountants import _epsilon_for_delta, _self_compose_uncached, _self_convolve_bounds

    single = pld_lib.from_gaussian_mechanism(
        z, sensitivity=1.0, pessimistic_estimate=True, value_discretization_interval=interval, sampling_prob=q
    )
    for pmf in _pmfs(single):
        probs = pmf.to_dense_pmf()._probs
        assert _self_convolve_bounds(probs, count, 1e-15) == common.compute_self_convolve_bounds(probs, count, 1e-15)
    reference = single.self_compose(count)  # dp-accounting (a sparse PMF goes dense: size ** count > 1000)
    ours = _self_compose_uncached(single, count)
    for a, b in zip(_pmfs(reference), _pmfs(ours)):
        assert type(a) is type(b) and a._lower_loss == b._lower_loss and a._infinity_mass == b._infinity_mass
        np.testing.assert_array_equal(b._probs, a._probs)
    for delta in (1e-12, 1e-5, 1e-3, 0.3):  # numpy's exp/log against math's: equal to a few ulps
        assert _epsilon_for_delta(ours, delta) == pytest.approx(reference.get_epsilon_for_delta(delta), rel=1e-13, abs=1e-15)


def test_epsilon_scan_spans_several_chunks(monkeypatch) -> None:
    from dpcl.accounting import accountants

    pld = _gaussian_pld(1.0, 1e-4, 0.01).self_compose(1_000)
    expected = [pld.get_epsilon_for_delta(d) for d in (1e-9, 1e-5, 0.5)]
    monkeypatch.setattr(accountants, "_EPSILON_SCAN_CHUNK", 997)  # the stopping point falls inside a later chunk
    assert [accountants._epsilon_for_delta(pld, d) for d in (1e-9, 1e-5, 0.5)] == pytest.approx(expected, rel=1e-13, abs=1e-15)


def test_auto_starts_where_its_refinement_converges_in_two_steps() -> None:
    # q = 0.001: the RDP rule starts at 1e-3, 6-30 % above the limit (four PLDs to converge); the start predicted
    # from the events converges after one refinement and is not above dp-accounting's PLD at interval 1e-4
    from dp_accounting import dp_event
    from dp_accounting.pld import pld_privacy_accountant

    from dpcl.accounting.dpsgd import dpsgd_epsilon

    for z, steps in ((1.0, 10_000), (2.0, 100_000)):
        r = dpsgd_epsilon(z, 0.001, steps, 1e-5)
        note = next(n for n in r.notes if n.startswith("auto: PLD intervals"))
        assert "converged" in note and note.count("->") == 1
        acc = pld_privacy_accountant.PLDAccountant(value_discretization_interval=1e-4)
        acc.compose(dp_event.PoissonSampledDpEvent(0.001, dp_event.GaussianDpEvent(z)), steps)
        assert r.epsilon <= acc.get_epsilon(1e-5) * 1.005


@pytest.mark.parametrize("z, q, count", [(1.0, 0.01, 1_000), (0.8, 0.1, 3_000), (2.0, 0.001, 50_000)])
def test_lean_self_convolution_agrees_with_dp_accounting_to_rounding(monkeypatch, z, q, count) -> None:
    # the real-FFT, in-place path that dpcl takes above 1e6 points, forced here on small grids
    from dpcl.accounting import accountants

    single = pld_lib.from_gaussian_mechanism(
        z, sensitivity=1.0, pessimistic_estimate=True, value_discretization_interval=1e-3, sampling_prob=q
    )
    reference = single.self_compose(count)
    monkeypatch.setattr(accountants, "_LEAN_SELF_COMPOSE_POINTS", 0)
    lean = accountants._self_compose_uncached(single, count)
    for a, b in zip(_pmfs(reference), _pmfs(lean)):
        assert a._lower_loss == b._lower_loss and a._infinity_mass == b._infinity_mass
        assert a._probs.shape == b._probs.shape
        np.testing.assert_allclose(b._probs, a._probs, rtol=0, atol=1e-15)
    # at delta >= 1e-6 the two agree to 1e-8; below, epsilon is read where the composed masses are of the
    # order of both FFTs' rounding noise (~1e-17 a point; e.g. 3.9079 vs 3.9110 at delta = 1e-12), as with any FFT
    for delta in (1e-6, 1e-5, 1e-3, 0.3):
        assert accountants._epsilon_for_delta(lean, delta) == pytest.approx(reference.get_epsilon_for_delta(delta), rel=1e-8, abs=1e-12)


def test_lean_self_convolution_window_wraps_like_a_roll() -> None:
    from dpcl.accounting.accountants import _lean_self_convolve
    from scipy import fft

    rng = np.random.default_rng(0)
    probs = rng.random(37)
    probs /= probs.sum()
    full = probs
    for _ in range(4):
        full = np.convolve(full, probs)
    for lower, length in ((0, 100), (20, 120), (30, 115), (40, 100)):
        n = fft.next_fast_len(max(length, probs.size), real=True)
        cyclic = np.zeros(n)
        np.add.at(cyclic, np.arange(full.size) % n, full)  # the cyclic convolution of length n
        expected = np.roll(cyclic, -lower)[:length]
        np.testing.assert_allclose(_lean_self_convolve(probs, 5, lower, length), expected, rtol=0, atol=1e-14)
