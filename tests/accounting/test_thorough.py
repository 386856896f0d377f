"""Long cross-checks, run with DPCL_THOROUGH=1 (skipped otherwise by tests/conftest.py)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy.optimize import brentq
from scipy.stats import norm

from dpcl.accounting.composition import compose_gaussians_epsilon
from dpcl.accounting.dpsgd import dpsgd_epsilon
from dpcl.accounting.gaussian import gaussian_delta, gaussian_epsilon, gaussian_sigma

pytestmark = pytest.mark.thorough


def thm8(eps: float, mu: float) -> float:
    return float(norm.cdf(mu / 2 - eps / mu) - math.exp(eps) * norm.cdf(-mu / 2 - eps / mu))


def test_million_calibrations_against_brentq_sample() -> None:
    rng = np.random.default_rng(11)
    eps = 10 ** rng.uniform(-3, 1.5, 1_000_000)
    delta = 10 ** rng.uniform(-12, -1, 1_000_000)
    sigma = gaussian_sigma(eps, delta)
    assert np.all(gaussian_delta(eps, sigma) <= delta)
    back = gaussian_epsilon(sigma, delta)
    assert np.all(back <= eps)
    np.testing.assert_allclose(back, eps, rtol=1e-6)
    for i in rng.choice(eps.size, 300, replace=False):
        mu_ref = brentq(lambda m: thm8(eps[i], m) - delta[i], 1e-9, 1e3, xtol=1e-15, rtol=1e-13)
        assert 1.0 / sigma[i] == pytest.approx(mu_ref, rel=1e-6)
        assert 1.0 / sigma[i] <= mu_ref * (1 + 1e-9)


def test_issue_benchmark_point_against_opacus() -> None:
    accountants = pytest.importorskip("opacus.accountants")
    z, q, steps, delta = 1.0, 0.01, 10_000, 1e-5
    pld = dpsgd_epsilon(z, q, steps, delta, "pld").epsilon
    auto = dpsgd_epsilon(z, q, steps, delta, "auto").epsilon
    prv = dpsgd_epsilon(z, q, steps, delta, "prv").epsilon
    rdp = dpsgd_epsilon(z, q, steps, delta, "rdp").epsilon
    acc = accountants.PRVAccountant()
    acc.history = [(z, q, steps)]
    op_prv = acc.get_epsilon(delta, eps_error=0.001)
    acc = accountants.RDPAccountant()
    acc.history = [(z, q, steps)]
    op_rdp = acc.get_epsilon(delta)
    assert auto <= pld * 1.005
    assert pld == pytest.approx(op_prv, rel=2e-3)
    assert prv >= pld * 0.999 and prv <= pld * 1.02
    assert rdp == pytest.approx(op_rdp, rel=0.02) and rdp >= pld


def test_composition_of_many_gaussians_against_closed_form() -> None:
    rng = np.random.default_rng(5)
    sig = rng.uniform(200.0, 2000.0, 1_000_000)
    mu = math.sqrt(math.fsum((1.0 / sig) ** 2))
    ref = brentq(lambda e: thm8(e, mu) - 1e-5, 0.0, 100.0, xtol=1e-14, rtol=1e-14)
    assert compose_gaussians_epsilon(sig, 1e-5) == pytest.approx(ref, rel=1e-9)
