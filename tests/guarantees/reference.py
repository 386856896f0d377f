"""Independent reference accountant for ledger tests (closed forms written here, not dpcl's).

Exact composition of Gaussian mechanisms: k Gaussian mechanisms with
mu_i = sensitivity_i / sigma_i compose to one Gaussian with
mu = sqrt(sum mu_i^2) (Dong, Roth & Su 2022, Cor. 3.3), whose privacy profile is
delta(eps) = Phi(-eps/mu + mu/2) - e^eps Phi(-eps/mu - mu/2) (Balle & Wang 2018, Thm 8).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
from scipy.optimize import brentq
from scipy.stats import norm


def gaussian_profile_delta(eps: float, mu: float) -> float:
    # e^eps Phi(b) as exp(eps + log Phi(b)): the same value, without overflowing e^eps at large eps (mu ~ 30)
    return float(norm.cdf(-eps / mu + mu / 2) - math.exp(eps + norm.logcdf(-eps / mu - mu / 2)))


def gaussian_profile_epsilon(mu: float, delta: float) -> float:
    if gaussian_profile_delta(0.0, mu) <= delta:
        return 0.0
    hi = 1.0
    while gaussian_profile_delta(hi, mu) > delta:
        hi *= 2
    return float(brentq(lambda e: gaussian_profile_delta(e, mu) - delta, 0.0, hi, xtol=1e-14, rtol=1e-14))


def composed_mu(events) -> float:
    total = 0.0
    for event in events:
        for leaf, count in event.leaves():
            if leaf.kind == "gaussian":
                total += count * (leaf.sensitivity / leaf.sigma) ** 2
            elif leaf.kind == "heterogeneous_gaussian":
                total += count * float(np.sum(leaf.mus**2))
            else:
                raise ValueError(f"reference accountant handles Gaussian events only, got {leaf.kind}")
    return math.sqrt(total)


@dataclass(frozen=True)
class ReferenceResult:
    epsilon: float
    delta: float
    accountant: str = "exact"
    notes: tuple[str, ...] = field(default_factory=tuple)


def reference_compute(events, delta, accountant="auto"):
    return ReferenceResult(gaussian_profile_epsilon(composed_mu(events), delta), delta)
