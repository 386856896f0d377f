"""Independent reference values for the CLI tests (nothing here imports dpcl).

The Gaussian privacy profile of Balle & Wang (2018, Thm 8) is written out with
scipy and solved for epsilon by bracketing root finding; the subsampled
Gaussian is accounted by dp-accounting, prv-accountant and opacus.
"""

from __future__ import annotations

import math

import numpy as np
from scipy.optimize import brentq
from scipy.stats import norm


def profile_delta(epsilon: float, sigma: float, sensitivity: float = 1.0) -> float:
    """Balle & Wang (2018), Thm 8: delta(eps) = Phi(D/2s - eps s/D) - e^eps Phi(-D/2s - eps s/D)."""
    a = sensitivity / (2 * sigma)
    b = epsilon * sigma / sensitivity
    return float(norm.cdf(a - b) - math.exp(epsilon + norm.logcdf(-a - b)))


def profile_epsilon(sigma: float, delta: float, sensitivity: float = 1.0) -> float:
    """Smallest epsilon >= 0 with profile_delta(epsilon) <= delta, by bracketing root finding."""
    if profile_delta(0.0, sigma, sensitivity) <= delta:
        return 0.0
    hi = 1.0
    while profile_delta(hi, sigma, sensitivity) > delta:
        hi *= 2
    return brentq(lambda e: profile_delta(e, sigma, sensitivity) - delta, 0.0, hi, xtol=1e-14, rtol=1e-13)


def gdp_reference_epsilon(sigmas: np.ndarray, delta: float, sensitivity: float = 1.0) -> float:
    """Composition of Gaussians = one Gaussian with mu = sqrt(sum (D/s_i)^2) (Dong, Roth & Su, Cor. 3.3)."""
    mu = math.sqrt(float(np.sum((sensitivity / sigmas) ** 2)))
    return profile_epsilon(1.0 / mu, delta, 1.0)


def dpa_pld_epsilon(events, delta: float) -> float:
    from dp_accounting.pld import pld_privacy_accountant

    accountant = pld_privacy_accountant.PLDAccountant(value_discretization_interval=1e-4)
    for event in events:
        accountant.compose(event)
    return float(accountant.get_epsilon(delta))


def dpsgd_reference(kind: str, z: float, q: float, steps: int, delta: float) -> float:
    import dp_accounting
    from dp_accounting.rdp import rdp_privacy_accountant

    event = dp_accounting.SelfComposedDpEvent(dp_accounting.PoissonSampledDpEvent(q, dp_accounting.GaussianDpEvent(z)), steps)
    if kind == "pld":
        return dpa_pld_epsilon([event], delta)
    if kind == "rdp":
        return float(rdp_privacy_accountant.RdpAccountant().compose(event).get_epsilon(delta))
    if kind == "prv":
        from prv_accountant import PRVAccountant
        from prv_accountant.privacy_random_variables import PoissonSubsampledGaussianMechanism

        accountant = PRVAccountant(
            prvs=PoissonSubsampledGaussianMechanism(noise_multiplier=z, sampling_probability=q),
            max_self_compositions=steps,
            eps_error=0.01,
            delta_error=delta / 1000,
        )
        return float(accountant.compute_epsilon(delta, [steps])[2])
    if kind == "opacus_rdp":
        from opacus.accountants import RDPAccountant

        accountant = RDPAccountant()
        accountant.history = [(z, q, steps)]
        return float(accountant.get_epsilon(delta))
    raise AssertionError(kind)


