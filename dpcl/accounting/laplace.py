"""The Laplace mechanism: scale for a pure epsilon and its exact (epsilon, delta) profile.

A query of l1 sensitivity ``Delta`` released with Lap(b) noise is
``epsilon0 = Delta / b`` pure DP (Dwork & Roth 2014, Thm 3.6). Its exact privacy
profile (the smallest delta at each epsilon) follows from the privacy loss of
Lap(0, b) against Lap(Delta, b), which is ``epsilon0`` for x <= 0,
``(Delta - 2x)/b`` in between and ``-epsilon0`` for x >= Delta. For
0 <= epsilon <= epsilon0 the set where the loss exceeds epsilon is
x < c = (Delta - epsilon b)/2, so::

    delta(epsilon) = P[X < c] - e^epsilon Q[X < c]
                   = (1 - e^{-c/b}/2) - e^epsilon e^{(c - Delta)/b}/2
                   = 1 - exp((epsilon - epsilon0)/2)

and delta(epsilon) = 0 for epsilon >= epsilon0 (the same curve dp-accounting's
``LaplacePrivacyLoss`` discretises). The derivation is for a scalar query, the
dominating pair dp-accounting and prv-accountant also use for the Laplace
mechanism; tests check it against a numerical integral.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from dpcl.accounting.validation import broadcast_together, check_delta, check_nonnegative, check_positive
from dpcl.errors import InvalidParameterError

__all__ = ["laplace_delta", "laplace_epsilon", "laplace_epsilon_for_delta", "laplace_scale"]



def _out(value: np.ndarray, scalar: bool) -> float | np.ndarray:
    return float(value) if scalar else value


def laplace_scale(epsilon: Any, sensitivity: Any = 1.0) -> float | np.ndarray:
    """Scale b = Delta / epsilon giving epsilon-DP (Dwork & Roth 2014, Thm 3.6). Vectorised."""
    eps = check_positive("epsilon", epsilon)
    sens = check_positive("sensitivity", sensitivity)
    (eps, sens), scalar = broadcast_together(("epsilon", "sensitivity"), eps, sens)
    with np.errstate(over="ignore"):
        scale = sens / eps
    if not np.all(np.isfinite(scale)):
        raise InvalidParameterError(
            "sensitivity / epsilon overflows float range (no finite Laplace scale); use a larger epsilon or a "
            "smaller sensitivity."
        )
    return _out(scale, scalar)


def _epsilon0(sensitivity: np.ndarray, scale: np.ndarray) -> np.ndarray:
    """``Delta / b``; a quotient that overflows is ``inf`` (no finite epsilon), without a RuntimeWarning."""
    with np.errstate(over="ignore"):
        return sensitivity / scale


def laplace_epsilon(scale: Any, sensitivity: Any = 1.0) -> float | np.ndarray:
    """Pure epsilon = Delta / b of Lap(b) noise on an l1-sensitivity-Delta query. Vectorised."""
    b = check_positive("scale", scale)
    sens = check_positive("sensitivity", sensitivity)
    (b, sens), scalar = broadcast_together(("scale", "sensitivity"), b, sens)
    return _out(_epsilon0(sens, b), scalar)


def laplace_delta(epsilon: Any, scale: Any, sensitivity: Any = 1.0) -> float | np.ndarray:
    """Exact profile delta(epsilon) = max(0, 1 - exp((epsilon - epsilon0)/2)), epsilon0 = Delta/b.

    ``epsilon >= 0`` (epsilon = 0 gives the total-variation distance). Derived in
    the module docstring; vectorised.
    """
    eps = check_nonnegative("epsilon", epsilon)
    b = check_positive("scale", scale)
    sens = check_positive("sensitivity", sensitivity)
    (eps, b, sens), scalar = broadcast_together(("epsilon", "scale", "sensitivity"), eps, b, sens)
    eps0 = _epsilon0(sens, b)
    delta = np.where(eps < eps0, -np.expm1(np.minimum(eps - eps0, 0.0) / 2.0), 0.0)
    return _out(delta, scalar)


def laplace_epsilon_for_delta(scale: Any, delta: Any, sensitivity: Any = 1.0) -> float | np.ndarray:
    """Smallest epsilon with ``laplace_delta(epsilon) <= delta``: max(0, epsilon0 + 2 ln(1 - delta)).

    Inverse of the exact profile; the value is checked against the profile and
    moved up by an ulp where rounding would otherwise put it below the root.
    """
    b = check_positive("scale", scale)
    dlt = check_delta("delta", delta)
    sens = check_positive("sensitivity", sensitivity)
    (b, dlt, sens), scalar = broadcast_together(("scale", "delta", "sensitivity"), b, dlt, sens)
    eps0 = _epsilon0(sens, b)
    eps = np.maximum(eps0 + 2.0 * np.log1p(-dlt), 0.0)
    for _ in range(8):
        below = eps < eps0
        gap = np.subtract(eps, eps0, out=np.zeros_like(eps), where=below)  # eps - eps0 < 0 where below (never inf - inf)
        too_small = below & (-np.expm1(gap / 2.0) > dlt)
        if not np.any(too_small):
            break
        eps = np.where(too_small, np.nextafter(eps, np.inf) * (1 + 1e-15), eps)
    return _out(eps, scalar)
