"""Privacy filters: basic (Rogers et al. 2016) and GDP (Smith & Thakurta 2022) rules."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from scipy.optimize import brentq
from scipy.stats import norm

from dpcl.accounting.events import (
    EpsilonDeltaEvent,
    GaussianEvent,
    HeterogeneousGaussianEvent,
    LaplaceEvent,
    PoissonSampledGaussianEvent,
    RepeatedEvent,
)
from dpcl.accounting.filter import PrivacyFilter
from dpcl.errors import BudgetExceededError, InvalidParameterError, UnsupportedEventError


def gdp_delta_reference(eps: float, mu: float) -> float:
    return float(norm.cdf(-eps / mu + mu / 2) - math.exp(eps) * norm.cdf(-eps / mu - mu / 2))


def test_basic_filter_admits_until_budget_and_refuses_with_amount() -> None:
    f = PrivacyFilter(1.0, 1e-5, rule="basic")
    for _ in range(4):
        f.admit(EpsilonDeltaEvent(epsilon=0.25, delta=1e-6))
    assert f.spent.epsilon == 1.0 and f.spent.delta == pytest.approx(4e-6)
    assert f.remaining.epsilon == 0.0
    before = f.to_dict()
    with pytest.raises(BudgetExceededError, match=r"epsilon by 0\.01"):
        f.admit(EpsilonDeltaEvent(epsilon=0.01))
    assert f.to_dict() == before  # refusal leaves the state unchanged
    with pytest.raises(BudgetExceededError, match="delta by"):
        PrivacyFilter(10.0, 1e-5).admit(EpsilonDeltaEvent(epsilon=0.1, delta=2e-5))


def test_basic_filter_laplace_and_gaussian_with_delta_share() -> None:
    f = PrivacyFilter(3.0, 1e-5)
    c = f.admit(LaplaceEvent(scale=2.0))
    assert (c.epsilon, c.delta) == (0.5, 0.0)
    with pytest.raises(InvalidParameterError, match="delta"):
        f.admit(GaussianEvent(sigma=5.0))
    c = f.admit(GaussianEvent(sigma=5.0), delta=5e-6)
    mu = 0.2
    # charged epsilon is an upper bound: the Thm 8 delta at it is within the share
    assert gdp_delta_reference(c.epsilon, mu) <= 5e-6 * (1 + 1e-9)
    assert f.spent.epsilon == pytest.approx(0.5 + c.epsilon)


def test_gdp_filter_budget_is_largest_safe_mu() -> None:
    f = PrivacyFilter(2.0, 1e-6, rule="gdp")
    mu_b = f.mu_budget
    assert mu_b is not None
    assert gdp_delta_reference(2.0, mu_b) <= 1e-6 * (1 + 1e-9)
    root = brentq(lambda m: gdp_delta_reference(2.0, m) - 1e-6, 0.01, 10.0, xtol=1e-15)
    assert mu_b == pytest.approx(root, rel=1e-8)


def test_gdp_filter_admits_while_sum_of_squares_fits() -> None:
    f = PrivacyFilter(1.0, 1e-5, rule="gdp")
    mu_b = f.mu_budget
    assert mu_b is not None
    n_fit = math.floor((mu_b / 0.1) ** 2)  # events of mu = 0.1
    for _ in range(n_fit):
        f.admit(GaussianEvent(sigma=10.0))
    assert f.spent.mu == pytest.approx(0.1 * math.sqrt(n_fit))
    assert f.spent.epsilon <= 1.0
    before = f.to_dict()
    with pytest.raises(BudgetExceededError, match="exceeds by"):
        f.admit(GaussianEvent(sigma=10.0))
    assert f.to_dict() == before
    # a smaller event that still fits is admitted after the refusal
    small = math.sqrt(max(mu_b**2 - 0.01 * n_fit, 0.0)) * 0.5
    if small > 0:
        f.admit(GaussianEvent(sigma=1.0 / small))


def test_gdp_filter_beats_basic_on_many_gaussians() -> None:
    gdp = PrivacyFilter(1.0, 1e-5, rule="gdp")
    basic = PrivacyFilter(1.0, 1e-5, rule="basic")
    n_gdp = n_basic = 0
    ev = GaussianEvent(sigma=20.0)
    try:
        while True:
            gdp.admit(ev)
            n_gdp += 1
    except BudgetExceededError:
        pass
    try:
        while True:
            basic.admit(ev, delta=1e-7)
            n_basic += 1
    except BudgetExceededError:
        pass
    assert n_gdp > n_basic > 0


def test_gdp_filter_accepts_gaussian_composites_and_refuses_others() -> None:
    f = PrivacyFilter(5.0, 1e-5, rule="gdp")
    c = f.admit(HeterogeneousGaussianEvent(sigmas=np.array([10.0, 20.0])))
    assert c.mu == pytest.approx(math.sqrt(0.01 + 0.0025))
    c = f.admit(RepeatedEvent(PoissonSampledGaussianEvent(noise_multiplier=10.0, sample_rate=1.0), 4))
    assert c.mu == pytest.approx(0.2)
    for ev in (LaplaceEvent(scale=1.0), EpsilonDeltaEvent(epsilon=0.1), PoissonSampledGaussianEvent(noise_multiplier=1.0, sample_rate=0.1)):
        with pytest.raises(UnsupportedEventError, match="gdp"):
            f.admit(ev)
    with pytest.raises(InvalidParameterError, match="delta"):
        f.admit(GaussianEvent(sigma=10.0), delta=1e-6)


def test_filter_refuses_mixed_units_and_bad_parameters() -> None:
    f = PrivacyFilter(1.0, 1e-5)
    f.admit(EpsilonDeltaEvent(epsilon=0.1))
    with pytest.raises(InvalidParameterError, match="token"):
        f.admit(EpsilonDeltaEvent(epsilon=0.1, unit="token"))
    for bad in (0.0, -1.0, float("nan"), float("inf")):
        with pytest.raises(InvalidParameterError, match="epsilon_budget"):
            PrivacyFilter(bad, 1e-5)
    with pytest.raises(InvalidParameterError, match="delta_budget"):
        PrivacyFilter(1.0, 1.0)
    with pytest.raises(InvalidParameterError, match="delta_budget"):
        PrivacyFilter(1.0, 0.0, rule="gdp")
    with pytest.raises(InvalidParameterError, match="rule"):
        PrivacyFilter(1.0, 1e-5, rule="rdp")
    with pytest.raises(InvalidParameterError, match="PrivacyEvent"):
        f.admit("event")  # type: ignore[arg-type]


@given(costs=st.lists(st.floats(1e-3, 0.5), min_size=1, max_size=60), budget=st.floats(0.1, 5.0))
def test_property_basic_filter_never_exceeds_budget(costs: list[float], budget: float) -> None:
    f = PrivacyFilter(budget, 1e-5)
    for c in costs:
        try:
            f.admit_epsilon_delta(c, 1e-8)
        except BudgetExceededError:
            pass
        assert f.spent.epsilon <= budget and f.spent.delta <= 1e-5


@given(sigmas=st.lists(st.floats(0.5, 50.0), min_size=1, max_size=40), eps=st.floats(0.1, 5.0))
def test_property_gdp_filter_guarantee_holds(sigmas: list[float], eps: float) -> None:
    f = PrivacyFilter(eps, 1e-5, rule="gdp")
    for s in sigmas:
        try:
            f.admit(GaussianEvent(sigma=s))
        except BudgetExceededError:
            pass
    mu = f.spent.mu
    assert mu is not None and f.mu_budget is not None and mu <= f.mu_budget
    if mu > 0:
        assert gdp_delta_reference(eps, mu) <= 1e-5 * (1 + 1e-9)


def test_filter_parameters_must_be_single_numbers() -> None:
    with pytest.raises(InvalidParameterError, match="epsilon_budget must be a single number"):
        PrivacyFilter(np.array([1.0, 2.0]), 1e-5)
    with pytest.raises(InvalidParameterError, match="delta_budget must be a single number"):
        PrivacyFilter(1.0, np.array([1e-5, 1e-6]))
    f = PrivacyFilter(1.0, 1e-5)
    with pytest.raises(InvalidParameterError, match="delta must be a single number"):
        f.charge_of(GaussianEvent(sigma=10.0), delta=np.array([1e-6, 1e-7]))
    assert f.charges == ()
