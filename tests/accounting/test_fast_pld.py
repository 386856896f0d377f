"""dpcl's vectorised Gaussian PLD construction against dp-accounting's own ``from_gaussian_mechanism``."""

from __future__ import annotations

import numpy as np
import pytest
from dp_accounting.pld import privacy_loss_distribution as pld_lib
from dp_accounting.privacy_accountant import NeighboringRelation

from dpcl.accounting.accountants._pld_grid import _gaussian_pld


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

    from dpcl.accounting.accountants._pld_grid import _epsilon_for_delta, _self_compose_uncached, _self_convolve_bounds

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
    from dpcl.accounting.accountants import _pld_grid

    pld = _gaussian_pld(1.0, 1e-4, 0.01).self_compose(1_000)
    expected = [pld.get_epsilon_for_delta(d) for d in (1e-9, 1e-5, 0.5)]
    monkeypatch.setattr(accountants, "_EPSILON_SCAN_CHUNK", 997)  # the stopping point falls inside a later chunk
    assert [_pld_grid._epsilon_for_delta(pld, d) for d in (1e-9, 1e-5, 0.5)] == pytest.approx(expected, rel=1e-13, abs=1e-15)


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
    # the real-FFT path that dpcl takes above 1e6 points, forced here on small grids: dp-accounting's window, its
    # infinity mass plus the aliasing allowance, each point a bound at most ~1e-13 above dp-accounting's
    from dpcl.accounting import accountants
    from dpcl.accounting.accountants import _pld_grid

    single = pld_lib.from_gaussian_mechanism(
        z, sensitivity=1.0, pessimistic_estimate=True, value_discretization_interval=1e-3, sampling_prob=q
    )
    reference = single.self_compose(count)
    monkeypatch.setattr(accountants, "_LEAN_SELF_COMPOSE_POINTS", 0)
    lean = _pld_grid._self_compose_uncached(single, count)
    for a, b in zip(_pmfs(reference), _pmfs(lean)):
        assert a._lower_loss == b._lower_loss and b._infinity_mass == pytest.approx(a._infinity_mass + 1e-15, rel=1e-12)
        assert a._probs.shape == b._probs.shape
        assert np.all(b._probs >= 0) and np.all(b._probs >= a._probs - 1e-14)  # dp-accounting's noise is ~1e-15
        # where no tilt is accurate (here the lower tail, into which a tilted FFT of so short a period aliases) a
        # point is bounded by the untilted FFT's error bound, ~6e-12 at 50000 steps
        assert np.max(b._probs - a._probs) < 1e-11 and np.sum(b._probs - a._probs) < 1e-7
    # at delta >= 1e-6 the two agree to 1e-6 (the bound's excess: each point at most ~1e-6 above the exact value
    # where a tilt is accurate); below, dp-accounting's epsilon is read where its composed masses are of the order
    # of its FFT's rounding noise (~1e-17 a point), see the tests below
    for delta in (1e-6, 1e-5, 1e-3, 0.3):
        assert _pld_grid._epsilon_for_delta(lean, delta) == pytest.approx(reference.get_epsilon_for_delta(delta), rel=1e-6, abs=1e-12)


def _exact_self_convolution(probs: np.ndarray, count: int) -> np.ndarray:
    """The linear self-convolution by direct sums (binary powering with np.convolve): every point of a sum of
    nonnegative products is correct to a relative ~count * size * 2^-53 (<1e-9 here), down to underflow."""
    out, base = np.array([1.0]), probs.copy()
    while count:
        if count & 1:
            out = np.convolve(out, base)
        count >>= 1
        if count:
            base = np.convolve(base, base)
    return out


def test_bounded_self_convolution_is_never_below_the_exact_one_where_a_plain_fft_is() -> None:
    # a PMF whose 64-fold composition spans 300 orders of magnitude: a plain FFT's noise (~1e-17) is below the exact
    # value at half its points; the bound is above it at every point, and within 1e-6 of it above the mean
    from scipy import fft

    from dpcl.accounting.fft_bound import bounded_self_convolve

    single = pld_lib.from_gaussian_mechanism(
        0.8, sensitivity=1.0, pessimistic_estimate=True, value_discretization_interval=5e-2, sampling_prob=0.05
    )
    probs = np.asarray(single._pmf_remove.to_dense_pmf()._probs)
    exact = _exact_self_convolution(probs, 64)
    length = fft.next_fast_len(exact.size, real=True)
    plain = fft.irfft(fft.rfft(probs, length) ** 64, length)[: exact.size]
    ours = bounded_self_convolve(probs, 64, 0, exact.size, length)
    seen = exact > 1e-300
    assert np.sum(plain[seen] < exact[seen] * (1 - 1e-9)) > seen.sum() / 4
    assert np.all(ours >= exact * (1 - 1e-9))
    # tight where epsilon can be read: above the mean down to 1e-25; past the last tilt (its bounds above sum to
    # less than 1e-30) looser
    above_mean = np.arange(exact.size) >= np.dot(np.arange(exact.size), exact)
    assert np.all(ours[above_mean & (exact > 1e-25)] <= exact[above_mean & (exact > 1e-25)] * (1 + 1e-5))
    assert np.sum(ours[above_mean & (exact <= 1e-25)]) < 1e-24
    assert ours.sum() - exact.sum() < 1e-10  # the bound's own excess, nearly all of it where the masses are large
    # a window [lower, lower + length) of the same, wrapping around a shorter cyclic period
    for lower, size in ((100, 3000), (1000, 4000), (2500, 10000)):
        period = fft.next_fast_len(size, real=True)
        window = bounded_self_convolve(probs, 64, lower, size, period)
        assert np.all(window >= exact[lower : lower + size] * (1 - 1e-9))


def _tilted_dp_accounting_reference(single, count: int):
    """dp-accounting's pessimistic PLD composed ``count`` times, its upper tails computed accurately: the exponential
    tilt p_i e^(theta i) commutes with convolution, so dp-accounting's own ``self_compose`` of the tilted PMF,
    untilted, gives each point of the upper tail to ~1e-9 of its largest tilted point instead of 1e-17 absolute
    (its plain FFT's rounding noise). Independent of dpcl's FFT code; an estimate of the exact values, not a bound.
    dp-accounting's infinity mass is raised by its aliasing allowance (1e-15), as dpcl's is."""
    from dp_accounting.pld import pld_pmf

    out = []
    for pmf in _pmfs(single):
        dense = pmf.to_dense_pmf()
        probs = np.asarray(dense._probs)
        plain = dense.self_compose(count)
        values = np.array(plain._probs)
        first = plain._lower_loss - count * dense._lower_loss  # index of values[0] in the linear convolution
        keep = probs > 0
        index, log_p = np.arange(probs.size, dtype=float)[keep], np.log(probs[keep])

        def mean(theta: float) -> float:
            e = theta * index + log_p
            w = np.exp(e - e.max())
            return count * float(np.dot(w, index) / w.sum())

        target = first + 0.8 * (values.size - 1)  # the tilted composition centred at 80 % of the window
        lo, hi = 0.0, 1.0 / probs.size
        while mean(hi) < target:
            lo, hi = hi, 2 * hi
        for _ in range(60):
            lo, hi = ((lo + hi) / 2, hi) if mean((lo + hi) / 2) < target else (lo, (lo + hi) / 2)
        theta = (lo + hi) / 2
        e = theta * index + log_p
        log_mass = e.max() + np.log(np.sum(np.exp(e - e.max())))
        tilted_probs = np.zeros_like(probs)
        tilted_probs[keep] = np.exp(e - log_mass)
        tilted = pld_pmf.DensePLDPmf(dense._discretization, dense._lower_loss, tilted_probs, 0.0, True).self_compose(count)
        t_values = np.asarray(tilted._probs)
        j = tilted._lower_loss - count * dense._lower_loss + np.arange(t_values.size)
        position = j - first
        use = (t_values >= 1e-9 * t_values.max()) & (position >= 0) & (position < values.size)
        values[position[use]] = t_values[use] * np.exp(count * log_mass - theta * j[use])
        out.append(pld_pmf.DensePLDPmf(dense._discretization, plain._lower_loss, values, plain._infinity_mass + 1e-15, True))
    return pld_lib.PrivacyLossDistribution(*out), single.self_compose(count)


def _lean_pld_against_the_exact_one(z: float, q: float, count: int, interval: float = 1e-4):
    """dpcl's composition of a DP-SGD step ``count`` times on grids above 1e6 points (the lean path), checked at
    deltas 1e-12, 1e-8 and 1e-5 to be at or above the exact epsilon of dp-accounting's pessimistic discretisation
    (:func:`_tilted_dp_accounting_reference`) and within 1e-7 of it (~1e-9 measured); returns dpcl's epsilon
    function and dp-accounting's plain PLD."""
    from dpcl.accounting import accountants
    from dpcl.accounting.accountants import _pld_grid

    single = _gaussian_pld(z, interval, q)
    for pmf in _pmfs(single):
        lower, upper = _pld_grid._self_convolve_bounds(pmf.to_dense_pmf()._probs, count, 1e-15)
        assert upper - lower + 1 > accountants._LEAN_SELF_COMPOSE_POINTS
    ours = _pld_grid._self_compose_uncached(single, count)
    reference, plain = _tilted_dp_accounting_reference(single, count)
    for delta in (1e-12, 1e-8, 1e-5):
        eps, exact = _pld_grid._epsilon_for_delta(ours, delta), reference.get_epsilon_for_delta(delta)
        assert exact <= eps <= exact * (1 + 1e-7)
    return (lambda delta: _pld_grid._epsilon_for_delta(ours, delta)), plain


def test_lean_pld_at_delta_1e_12_is_not_below_dp_accountings_on_a_1e6_point_grid() -> None:
    # 1.2e6 and 1.06e6 points. dp-accounting's own FFT reads 75.013 at delta = 1e-12, 0.062 below the exact value
    # of its discretisation (75.0749, its tails tilted); dpcl's bound is above both, within 1e-9 of the exact value
    epsilon, plain = _lean_pld_against_the_exact_one(1.0, 0.05, 12_000)
    assert epsilon(1e-12) >= plain.get_epsilon_for_delta(1e-12)


@pytest.mark.thorough
def test_lean_pld_at_the_issues_point_is_not_below_the_exact_pessimistic_pld() -> None:
    # z = 0.8, q = 0.05, T = 2e4, interval 1e-4, delta = 1e-8 (2.25e6 and 1.78e6 points): the exact value of the
    # pessimistic discretisation, from dp-accounting's tilted composition, is 152.9976229; dpcl's unbounded real FFT
    # read 152.997470 and dp-accounting's plain complex FFT reads 152.997755, each off by its rounding noise. dpcl's
    # bound is at or above the exact value and within 1e-9 of it; the optimistic PLD (152.798) is below all.
    epsilon, _ = _lean_pld_against_the_exact_one(0.8, 0.05, 20_000)
    assert epsilon(1e-8) > 152.997470
