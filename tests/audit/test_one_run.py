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
