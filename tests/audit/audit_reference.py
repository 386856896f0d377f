"""Independent closed-form references for the audit tests (written here, not imported from dpcl)."""

from __future__ import annotations

import numpy as np
from scipy.optimize import brentq
from scipy.stats import norm


def gaussian_delta_closed_form(epsilon: float, mu: float) -> float:
    """Balle & Wang 2018, Thm 8: delta(eps) = Phi(mu/2 - eps/mu) - e^eps Phi(-mu/2 - eps/mu), mu = Delta/sigma."""
    return float(norm.cdf(mu / 2 - epsilon / mu) - np.exp(epsilon + norm.logcdf(-mu / 2 - epsilon / mu)))


def gaussian_epsilon_closed_form(sigma: float, delta: float, sensitivity: float = 1.0) -> float:
    mu = sensitivity / sigma
    if gaussian_delta_closed_form(0.0, mu) <= delta:
        return 0.0
    return float(brentq(lambda e: gaussian_delta_closed_form(e, mu) - delta, 0.0, 500.0, xtol=1e-12))


def gaussian_sigma_closed_form(epsilon: float, delta: float, sensitivity: float = 1.0) -> float:
    """Smallest sigma with delta(eps) <= delta, by root finding on the Balle-Wang profile."""
    return float(
        brentq(lambda s: gaussian_delta_closed_form(epsilon, sensitivity / s) - delta, 1e-6, 1e6, xtol=1e-14)
    ) * (1 + 1e-9)


def classic_gaussian_sigma_closed_form(epsilon: float, delta: float, sensitivity: float = 1.0) -> float:
    """Dwork & Roth 2014, Thm A.1: sigma = Delta sqrt(2 ln(1.25/delta)) / eps (proved for eps < 1 only)."""
    return sensitivity * np.sqrt(2 * np.log(1.25 / delta)) / epsilon
