"""One-run auditing analysis (Steinke, Nasr & Jagielski 2023; Mahloujifar et al. 2024) against independent computations."""

from __future__ import annotations

import math

import mpmath
import numpy as np
import pytest

from dpcl.accounting.gaussian import gdp_epsilon
from dpcl.audit.one_run import (
    audit_one_run,
    gaussian_fdp_epsilon_lower,
    gaussian_view_assumption_holds,
    gaussian_view_epsilon_lower,
    gaussian_view_mu_lower,
    guess_and_count,
    one_run_epsilon_lower,
    one_run_p_value,
)
from dpcl.errors import InvalidParameterError
from tests.conftest import THOROUGH


def _reference_p_value(m: int, r: int, v: int, eps: float, delta: float) -> float:
    """Theorem 5.2 of Steinke et al. summed term by term in 60-digit arithmetic (independent of scipy)."""
    mpmath.mp.dps = 60
    q = 1 / (1 + mpmath.exp(-eps))

    def pmf(k: int) -> mpmath.mpf:
        return mpmath.binomial(r, k) * q**k * (1 - q) ** (r - k)

    beta = mpmath.fsum(pmf(k) for k in range(v, r + 1))
    alpha, partial = mpmath.mpf(0), mpmath.mpf(0)
    for i in range(1, v + 1):
        partial += pmf(v - i)
        alpha = max(alpha, partial / i)
    return float(min(beta + alpha * delta * 2 * m, 1))


@pytest.mark.parametrize(
    "m, r, v, eps, delta",
    [(1000, 100, 90, 1.0, 1e-5), (1000, 100, 100, 3.0, 1e-5), (10, 10, 10, 0.5, 0.01), (5000, 200, 150, 2.0, 1e-6),
     (50, 20, 0, 1.0, 1e-3), (100, 0, 0, 1.0, 1e-5), (300, 60, 45, 0.0, 0.0)],
)
def test_p_value_matches_the_theorem_summed_in_high_precision(m, r, v, eps, delta):
    assert one_run_p_value(m, r, v, eps, delta) == pytest.approx(_reference_p_value(m, r, v, eps, delta), rel=1e-9, abs=1e-15)


def test_p_value_grows_with_epsilon_and_delta():
    eps = np.linspace(0, 5, 30)
    p = [one_run_p_value(1000, 200, 170, e, 1e-5) for e in eps]
    assert all(b >= a for a, b in zip(p, p[1:]))
    assert one_run_p_value(1000, 200, 170, 1.0, 1e-3) >= one_run_p_value(1000, 200, 170, 1.0, 1e-6)


def test_all_guesses_right_gives_the_closed_form_limit_of_the_attack():
    # delta = 0, every one of r guesses right: p-value q^r; rejected below eps* = logit(alpha^(1/r))
    for r, conf in [(10, 0.95), (100, 0.95), (1000, 0.99)]:
        alpha = 1 - conf
        q_star = alpha ** (1 / r)
        expected = math.log(q_star / (1 - q_star))
        assert one_run_epsilon_lower(r, r, r, 0.0, conf) == pytest.approx(expected, rel=1e-5)


def test_no_signal_gives_no_bound_beyond_the_confidence_slack():
    rng = np.random.default_rng(12)
    bounds = []
    for _ in range(40):
        included = rng.random(500) < 0.5
        scores = rng.normal(size=500)  # independent of the bits: a perfectly private mechanism
        bounds.append(audit_one_run(scores, included, 1e-5, gaussian_claim=True).epsilon_lower)
    assert sum(b > 0 for b in bounds) <= 6  # 5 % expected: 2 of 40; 6 is beyond 99.9 % of Binomial(40, 0.05)


def test_perfect_attack_reaches_the_limit_of_the_number_of_canaries():
    rng = np.random.default_rng(3)
    included = rng.random(1000) < 0.5
    k = 2 * min(int(included.sum()), int((~included).sum()))  # as many "in" as "out" guesses, all right
    res = audit_one_run(included.astype(float), included, 0.0, guess_counts=[k])
    alpha = 0.05
    r = k
    q_star = alpha ** (1 / r)
    assert res.correct == res.guesses
    assert res.epsilon_lower == pytest.approx(math.log(q_star / (1 - q_star)), rel=1e-5)


@pytest.mark.parametrize("mu", [0.5, 1.0, 2.0])
def test_bounds_are_below_the_true_epsilon_of_a_gaussian_mechanism(mu):
    """Each canary's score is N(mu * included, 1): a mu-GDP mechanism per canary, whose exact epsilon is known.

    Both analyses must stay below it in at least 95 % of runs (here: every run of a few; thorough: 200 runs)."""
    delta = 1e-5
    truth = float(gdp_epsilon(mu, delta))
    rng = np.random.default_rng(int(mu * 100))
    runs = 200 if THOROUGH else 4
    above = 0
    fdp_tighter = 0
    for _ in range(runs):
        included = rng.random(2000) < 0.5
        scores = rng.normal(mu * included, 1.0)
        steinke = audit_one_run(scores, included, delta)
        fdp = audit_one_run(scores, included, delta, gaussian_claim=True)
        above += fdp.epsilon_lower > truth or steinke.epsilon_lower > truth
        fdp_tighter += fdp.epsilon_lower >= steinke.epsilon_lower
        assert steinke.epsilon_lower > 0  # the signal is found
    assert above <= max(1, int(0.05 * runs))
    assert fdp_tighter == runs  # the f-DP analysis (with its Gaussian claim) is at least as tight here


def test_gaussian_fdp_bound_is_at_least_steinke_on_the_same_counts():
    for m, r, v in [(2000, 256, 230), (10000, 1024, 1000), (500, 64, 50)]:
        assert gaussian_fdp_epsilon_lower(m, r, v, 1e-5) >= one_run_epsilon_lower(m, r, v, 1e-5) - 1e-6


def test_guess_and_count_guesses_the_extremes_and_counts_right_guesses():
    scores = np.array([5.0, -3.0, 0.1, 4.0, -2.0, 0.0])
    included = np.array([True, False, True, False, False, True])
    # 4 guesses: "in" for 5.0 and 4.0 (right, wrong), "out" for -3.0 and -2.0 (both right)
    assert guess_and_count(scores, included, 4) == (4, 3)
    assert guess_and_count(scores, included, 1) == (1, 1)
    assert guess_and_count(scores, included, 0) == (0, 0)


@pytest.mark.parametrize(
    "call",
    [
        lambda: one_run_p_value(10, 11, 3, 1.0, 1e-5),
        lambda: one_run_p_value(10, 5, 6, 1.0, 1e-5),
        lambda: one_run_p_value(10, 5, 3, -1.0, 1e-5),
        lambda: one_run_p_value(10, 5, 3, 1.0, 1.0),
        lambda: one_run_p_value(10, 5, 3, float("nan"), 1e-5),
        lambda: one_run_epsilon_lower(10, 5, 3, 1e-5, confidence=1.5),
        lambda: guess_and_count([1.0, float("nan")], [True, False], 1),
        lambda: guess_and_count([1.0, 2.0], [True], 1),
        lambda: guess_and_count([1.0, 2.0], [True, False], 3),
        lambda: guess_and_count([1.0, 2.0], [2, 0], 1),
        lambda: audit_one_run([], [], 1e-5),
        lambda: audit_one_run([1.0, 2.0], [True, False], 0.0, gaussian_claim=True),
        lambda: audit_one_run([1.0, 2.0], [True, False], 1e-5, guess_counts=[3]),
    ],
)
def test_bad_input_is_refused_with_a_dpcl_error(call):
    with pytest.raises(InvalidParameterError):
        call()


def _shifted_scores(rng: np.random.Generator, m: int, mu: float) -> tuple[np.ndarray, np.ndarray]:
    """Scores of m canaries of a Gaussian mechanism with shift mu: N(mu, 1) when included, N(0, 1) when not."""
    included = rng.random(m) < 0.5
    return rng.standard_normal(m) + mu * included, included


def test_gaussian_view_mu_bound_covers_the_true_mu_at_its_confidence():
    rng = np.random.default_rng(1)
    trials = 400 if THOROUGH else 150
    mu = 1.2
    above = sum(gaussian_view_mu_lower(*_shifted_scores(rng, 400, mu), confidence=0.95) > mu for _ in range(trials))
    # P[bound > mu] = 5 % per trial; 3 binomial standard deviations of slack
    assert above <= 0.05 * trials + 3 * math.sqrt(0.05 * 0.95 * trials)


def test_gaussian_view_mu_bound_matches_the_normal_approximation_for_large_samples():
    # independent computation: the large-sample interval of the standardised mean difference (Hedges & Olkin)
    rng = np.random.default_rng(2)
    scores, included = _shifted_scores(rng, 40_000, 1.5)
    s_in, s_out = scores[included], scores[~included]
    n1, n2 = s_in.size, s_out.size
    pooled = math.sqrt(((n1 - 1) * s_in.var(ddof=1) + (n2 - 1) * s_out.var(ddof=1)) / (n1 + n2 - 2))
    d = (s_in.mean() - s_out.mean()) / pooled
    approx = d - 1.6448536269514722 * math.sqrt(1 / n1 + 1 / n2 + d * d / (2 * (n1 + n2 - 2)))
    assert gaussian_view_mu_lower(scores, included, 0.95) == pytest.approx(approx, abs=2e-4)


def test_gaussian_view_epsilon_is_the_gaussian_profile_at_the_mu_bound():
    rng = np.random.default_rng(3)
    scores, included = _shifted_scores(rng, 5000, 1.665)
    eps, mu, check = gaussian_view_epsilon_lower(scores, included, 1e-5)
    assert check == "not rejected" and 0 < mu < 1.665 + 0.2
    # the closed form delta(eps) of mu-GDP (Dong, Roth & Su 2019, Cor. 2.13) in 50-digit arithmetic
    mpmath.mp.dps = 50
    e, m_ = mpmath.mpf(eps), mpmath.mpf(mu)
    delta = mpmath.ncdf(-e / m_ + m_ / 2) - mpmath.exp(e) * mpmath.ncdf(-e / m_ - m_ / 2)
    assert float(delta) == pytest.approx(1e-5, rel=1e-6)
    assert eps == pytest.approx(float(gdp_epsilon(mu, 1e-5)), rel=1e-12)


def test_gaussian_view_gives_no_bound_without_signal():
    rng = np.random.default_rng(4)
    bounds = [gaussian_view_epsilon_lower(*_shifted_scores(rng, 2000, 0.0), 1e-5)[0] for _ in range(40)]
    assert sum(b > 0 for b in bounds) <= 6  # 5 % expected, with slack
    assert max(bounds) < 0.5


def test_gaussian_view_nears_the_true_epsilon_with_many_canaries():
    rng = np.random.default_rng(5)
    true_eps = float(gdp_epsilon(1.665, 1e-5))
    eps, _, _ = gaussian_view_epsilon_lower(*_shifted_scores(rng, 50_000, 1.665), 1e-5)
    assert 0.9 * true_eps < eps <= true_eps


@pytest.mark.parametrize(
    "make",
    [
        lambda rng, b: rng.laplace(size=b.size) * 3 + 2 * b,  # heavy tails
        lambda rng, b: rng.standard_normal(b.size) * np.where(b, 3.0, 1.0) + b,  # unequal variances
        lambda rng, b: rng.standard_normal(b.size) + 6 * b * (rng.random(b.size) < 0.3),  # a mixture when included
        lambda rng, b: np.where(b, 1.0, 0.0),  # no spread at all
    ],
    ids=["laplace", "unequal-variance", "mixture", "constant"],
)
def test_gaussian_view_refuses_scores_that_break_its_assumption(make):
    rng = np.random.default_rng(6)
    included = rng.random(5000) < 0.5
    scores = make(rng, included)
    holds, why = gaussian_view_assumption_holds(scores, included)
    assert not holds and why != "not rejected"
    assert gaussian_view_epsilon_lower(scores, included, 1e-5) == (0.0, 0.0, why)


def test_audit_one_run_adds_the_gaussian_view_only_when_asked():
    rng = np.random.default_rng(7)
    scores, included = _shifted_scores(rng, 4000, 1.665)
    plain = audit_one_run(scores, included, 1e-5, gaussian_claim=True)
    viewed = audit_one_run(scores, included, 1e-5, gaussian_claim=True, gaussian_view=True)
    assert all(t["analysis"] != "gaussian_view" for t in plain.tests)
    view = [t for t in viewed.tests if t["analysis"] == "gaussian_view"]
    assert len(view) == 1 and view[0]["assumption_check"] == "not rejected" and "Gaussian" in view[0]["assumption"]
    assert viewed.analysis == "gaussian_view" and viewed.epsilon_lower > plain.epsilon_lower
    assert viewed.epsilon_lower < float(gdp_epsilon(1.665, 1e-5))


@pytest.mark.parametrize(
    "call",
    [
        lambda: gaussian_view_mu_lower(np.zeros(10), np.arange(10) % 2 == 0),  # too few canaries per group
        lambda: gaussian_view_mu_lower([1.0, float("nan")] * 20, [True, False] * 20),
        lambda: gaussian_view_epsilon_lower(np.arange(100.0), np.arange(100) % 2 == 0, 0.0),
        lambda: audit_one_run(np.arange(100.0), np.arange(100) % 2 == 0, 0.0, gaussian_view=True),
    ],
)
def test_gaussian_view_bad_input_is_refused_with_a_dpcl_error(call):
    with pytest.raises(InvalidParameterError):
        call()
