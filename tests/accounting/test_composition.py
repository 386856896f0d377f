"""Composition: basic, heterogeneous advanced (KOV Thm 3.5), exact Gaussian composition vs PLD."""

from __future__ import annotations

import math

import numpy as np
import pytest
from dp_accounting import dp_event
from dp_accounting.pld import pld_privacy_accountant
from hypothesis import given
from hypothesis import strategies as st
from scipy.optimize import brentq
from scipy.stats import norm

from dpcl.accounting.composition import (
    advanced_composition,
    advanced_composition_for_delta,
    basic_composition,
    compose_gaussians_epsilon,
    gaussian_composition_mu,
)
from dpcl.errors import InvalidParameterError


def gdp_eps_reference(mu: float, delta: float) -> float:
    d = lambda e: norm.cdf(-e / mu + mu / 2) - math.exp(e) * norm.cdf(-e / mu - mu / 2)  # noqa: E731
    if d(0.0) <= delta:
        return 0.0
    hi = 1.0
    while d(hi) > delta:
        hi *= 2
    return brentq(lambda e: d(e) - delta, 0.0, hi, xtol=1e-14, rtol=1e-14)


def test_basic_composition_sums() -> None:
    assert basic_composition([0.1, 0.2, 0.3], [1e-6, 0.0, 2e-6]) == (pytest.approx(0.6), pytest.approx(3e-6))
    eps, dlt = basic_composition(np.full(1000, 0.01), 1e-8)
    assert eps == pytest.approx(10.0, rel=1e-14) and dlt == pytest.approx(1e-5, rel=1e-12)


def test_basic_composition_refuses_vacuous_delta() -> None:
    with pytest.raises(InvalidParameterError, match="delta"):
        basic_composition([1.0, 1.0], [0.6, 0.6])


def kov_homogeneous(eps: float, k: int, slack: float) -> float:
    """KOV (2017) Thm 3.5 specialised to k identical mechanisms, written out by hand."""
    drift = k * (math.exp(eps) - 1) * eps / (math.exp(eps) + 1)
    return min(
        k * eps,
        drift + math.sqrt(2 * k * eps**2 * math.log(math.e + math.sqrt(k * eps**2) / slack)),
        drift + math.sqrt(2 * k * eps**2 * math.log(1 / slack)),
    )


@pytest.mark.parametrize("eps,k", [(0.01, 10_000), (0.1, 100), (1.0, 10), (0.5, 3)])
def test_advanced_matches_hand_written_kov(eps: float, k: int) -> None:
    got, dlt = advanced_composition(np.full(k, eps), 1e-7, 1e-6)
    assert got == pytest.approx(kov_homogeneous(eps, k, 1e-6), rel=1e-12)
    assert dlt == pytest.approx(1 - (1 - 1e-6) * (1 - 1e-7) ** k, rel=1e-10)


def test_advanced_is_tighter_than_drv_and_never_above_basic() -> None:
    eps = np.full(400, 0.05)
    adv, _ = advanced_composition(eps, 0.0, 1e-6)
    drv = math.sqrt(2 * 400 * math.log(1e6)) * 0.05 + 400 * 0.05 * (math.exp(0.05) - 1)  # DRV 2010
    assert adv <= drv
    assert adv <= 400 * 0.05


def test_advanced_heterogeneous_and_for_delta() -> None:
    eps = np.array([0.1] * 50 + [0.5] * 5)
    dlt = np.array([1e-8] * 55)
    value, total = advanced_composition_for_delta(eps, dlt, 1e-5)
    assert total == 1e-5
    slack = 1 - (1 - 1e-5) / (1 - 1e-8) ** 55
    assert value == pytest.approx(advanced_composition(eps, dlt, slack)[0], rel=1e-9)
    with pytest.raises(InvalidParameterError, match="delta"):
        advanced_composition_for_delta(eps, dlt, 1e-7)  # mechanisms already use 5.5e-7


def test_gaussian_mu_closed_form() -> None:
    sig = np.array([1.0, 2.0, 4.0])
    assert gaussian_composition_mu(sig, np.array([1.0, 2.0, 2.0])) == pytest.approx(math.sqrt(1 + 1 + 0.25), rel=1e-12)
    assert gaussian_composition_mu(sig, np.array([1.0, 2.0, 2.0])) >= math.sqrt(2.25)  # rounded up, never down


@pytest.mark.parametrize("sigmas", [[1.0, 2.0, 3.0], [2.0] * 6, [5.0, 10.0, 20.0, 40.0, 80.0]])
def test_composed_gaussians_agree_with_pld_on_same_events(sigmas: list[float]) -> None:
    delta = 1e-5
    acc = pld_privacy_accountant.PLDAccountant(value_discretization_interval=1e-4)
    acc.compose(dp_event.ComposedDpEvent([dp_event.GaussianDpEvent(s) for s in sigmas]))
    pld = acc.get_epsilon(delta)
    ours = compose_gaussians_epsilon(np.array(sigmas), delta)
    assert ours == pytest.approx(pld, rel=1e-3)
    assert ours <= pld * (1 + 1e-9)


def test_million_heterogeneous_gaussians() -> None:
    rng = np.random.default_rng(3)
    sig = rng.uniform(100.0, 1000.0, 1_000_000)
    sens = rng.uniform(0.5, 1.0, 1_000_000)
    mu = math.sqrt(math.fsum((sens / sig) ** 2))
    got = compose_gaussians_epsilon(sig, 1e-6, sens)
    assert got == pytest.approx(gdp_eps_reference(mu, 1e-6), rel=1e-8)
    assert got >= gdp_eps_reference(mu, 1e-6) * (1 - 1e-12)


@given(
    sigmas=st.lists(st.floats(0.2, 50.0), min_size=1, max_size=20),
    extra=st.floats(0.2, 50.0),
    delta=st.floats(1e-10, 0.1),
)
def test_property_more_mechanisms_never_lower_epsilon(sigmas: list[float], extra: float, delta: float) -> None:
    before = compose_gaussians_epsilon(np.array(sigmas), delta)
    after = compose_gaussians_epsilon(np.array(sigmas + [extra]), delta)
    assert after >= before * (1 - 1e-12)
    assert math.isfinite(after)


@given(eps=st.lists(st.floats(1e-4, 2.0), min_size=1, max_size=30), slack=st.floats(1e-10, 0.5))
def test_property_advanced_never_exceeds_basic(eps: list[float], slack: float) -> None:
    adv, _ = advanced_composition(np.array(eps), 0.0, slack)
    assert adv <= math.fsum(eps) * (1 + 1e-12)
    assert adv >= 0


@pytest.mark.parametrize(
    "call",
    [
        lambda: basic_composition([-0.1], [0.0]),
        lambda: basic_composition([0.1], [1.0]),
        lambda: basic_composition([float("nan")], [0.0]),
        lambda: basic_composition([0.1, 0.2], [0.0, 0.0, 0.0]),
        lambda: advanced_composition([0.1], [0.0], 0.0),
        lambda: advanced_composition([0.1], [0.0], 1.5),
        lambda: gaussian_composition_mu([1.0, 0.0]),
        lambda: gaussian_composition_mu([1.0, float("inf")]),
        lambda: gaussian_composition_mu([1.0, 2.0], [1.0, 1.0, 1.0]),
        lambda: compose_gaussians_epsilon([1.0], 0.0),
        lambda: compose_gaussians_epsilon([], 1e-5),
    ],
)
def test_invalid_inputs_raise_typed_error(call) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(InvalidParameterError):
        call()


def kov_heterogeneous(eps: list[float], slack: float) -> float:
    """KOV (2017) Thm 3.5 for heterogeneous epsilons, written out term by term."""
    total = sum(eps)
    sum_sq = sum(e * e for e in eps)
    drift = sum((math.exp(e) - 1) * e / (math.exp(e) + 1) for e in eps)
    return min(
        total,
        drift + math.sqrt(2 * sum_sq * math.log(math.e + math.sqrt(sum_sq) / slack)),
        drift + math.sqrt(2 * sum_sq * math.log(1 / slack)),
    )


@pytest.mark.parametrize(
    "eps,deltas,slack",
    [
        ([0.1] * 50 + [0.5] * 5, [1e-8] * 55, 1e-6),
        ([2.0, 0.01, 0.3, 1.0], [0.0, 1e-7, 0.0, 1e-9], 1e-3),
        ([0.02 * (i + 1) for i in range(40)], [1e-9] * 40, 1e-8),
    ],
)
def test_advanced_heterogeneous_matches_hand_written_kov(eps: list[float], deltas: list[float], slack: float) -> None:
    got, total = advanced_composition(np.array(eps), np.array(deltas), slack)
    assert got == pytest.approx(kov_heterogeneous(eps, slack), rel=1e-12)
    keep = (1 - slack) * math.prod(1 - d for d in deltas)
    assert total == pytest.approx(1 - keep, rel=1e-9)


def test_advanced_for_delta_never_exceeds_the_requested_delta() -> None:
    # the slack is what the mechanisms leave; rounding must not push 1 - (1 - slack) prod(1 - delta_i) above delta
    mpmath = pytest.importorskip("mpmath")
    mpmath.mp.dps = 50
    rng = np.random.default_rng(5)
    for _ in range(200):
        k = int(rng.integers(1, 30))
        dlt = 10.0 ** rng.uniform(-12, -7, k)
        delta = float(10.0 ** rng.uniform(-6, -2))
        value, total = advanced_composition_for_delta(np.full(k, 0.1), dlt, delta)
        assert total == delta
        # recover the slack used from the epsilon: KOV is decreasing in the slack, so compare via a slack at delta exactly
        exact_slack = 1 - (1 - mpmath.mpf(delta)) / mpmath.fprod(1 - mpmath.mpf(float(d)) for d in dlt)
        assert value >= advanced_composition(np.full(k, 0.1), dlt, float(exact_slack))[0]


def test_gaussian_mu_is_never_below_the_exact_value() -> None:
    # ulp-level check against 50-digit arithmetic: the n u margin alone was too small for n = 1
    # (sqrt((Delta/sigma)^2) rounded below Delta/sigma in ~13% of random draws)
    mpmath = pytest.importorskip("mpmath")
    mpmath.mp.dps = 50
    rng = np.random.default_rng(11)
    for n in (1, 2, 3, 17):
        for _ in range(500):
            sig = rng.uniform(0.1, 10.0, n)
            sens = rng.uniform(0.1, 10.0, n)
            exact = mpmath.sqrt(mpmath.fsum((mpmath.mpf(float(d)) / mpmath.mpf(float(s))) ** 2 for d, s in zip(sens, sig)))
            got = gaussian_composition_mu(sig, sens)
            assert got >= exact
            assert got <= exact * (1 + 1e-14)


@pytest.mark.parametrize(
    "call,name",
    [
        (lambda: advanced_composition([0.1], [0.0], np.array([1e-5, 1e-6])), "delta_slack"),
        (lambda: advanced_composition_for_delta([0.1], [0.0], [1e-5, 1e-6]), "delta"),
        (lambda: compose_gaussians_epsilon([1.0], np.array([1e-5, 1e-6])), "delta"),
        (lambda: compose_gaussians_epsilon([1.0], float("nan")), "delta"),
        (lambda: advanced_composition([0.1, float("inf")], [0.0], 1e-5), "epsilons"),
        (lambda: basic_composition([0.1], [0.0, 0.0]), "deltas"),
        (lambda: gaussian_composition_mu([1.0, -2.0]), "sigmas"),
    ],
)
def test_invalid_inputs_name_the_parameter(call, name: str) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(InvalidParameterError, match=name):
        call()
