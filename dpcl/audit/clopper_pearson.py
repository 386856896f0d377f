"""Clopper–Pearson (exact binomial) confidence bounds for error rates.

For ``k`` successes in ``n`` independent Bernoulli(p) trials, the one-sided
Clopper–Pearson bounds at level ``1 - alpha`` are (Clopper & Pearson 1934)

* upper: ``p_ub = Beta.ppf(1 - alpha; k + 1, n - k)`` (``1`` when ``k = n``),
* lower: ``p_lb = Beta.ppf(alpha; k, n - k + 1)`` (``0`` when ``k = 0``),

so that ``P(p <= p_ub) >= 1 - alpha`` for every ``p`` (the interval is
conservative, never anti-conservative). The quantiles come from
:func:`scipy.stats.beta.ppf`; the functions here only validate input, handle the
two boundary cases and broadcast over arrays.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from dpcl.errors import InvalidParameterError


def _counts(successes: Any, trials: Any) -> tuple[np.ndarray, np.ndarray, bool]:
    k = np.asarray(successes)
    n = np.asarray(trials)
    for name, arr in (("successes", k), ("trials", n)):
        if arr.dtype == bool or not (np.issubdtype(arr.dtype, np.integer) or np.issubdtype(arr.dtype, np.floating)):
            raise InvalidParameterError(f"{name} must be integer counts, got {arr.dtype} values.")
        if not np.all(np.isfinite(arr)) or np.any(arr != np.round(arr)):
            raise InvalidParameterError(f"{name} must be finite integer counts.")
    k = k.astype(np.float64)
    n = n.astype(np.float64)
    if np.any(n < 1):
        raise InvalidParameterError("trials must be >= 1 for every count.")
    if np.any(k < 0) or np.any(k > n):
        raise InvalidParameterError("successes must lie in [0, trials].")
    k, n = np.broadcast_arrays(k, n)
    return k, n, k.ndim == 0


def _check_alpha(alpha: float) -> float:
    a = float(alpha)
    if not 0.0 < a < 1.0:
        raise InvalidParameterError(f"alpha (one minus the confidence) must lie in (0, 1), got {alpha!r}.")
    return a


def clopper_pearson_upper(successes: Any, trials: Any, alpha: float) -> float | np.ndarray:
    """One-sided upper bound on a binomial rate holding with probability >= 1 - alpha."""
    k, n, scalar = _counts(successes, trials)
    a = _check_alpha(alpha)
    with np.errstate(invalid="ignore"):
        from scipy.stats import beta  # imported here: scipy.stats costs ~0.7 s, not paid by `dpcl --help`

        ub = beta.ppf(1.0 - a, k + 1.0, np.maximum(n - k, 1e-300))
    ub = np.where(k >= n, 1.0, ub)
    return float(ub) if scalar else ub


def clopper_pearson_lower(successes: Any, trials: Any, alpha: float) -> float | np.ndarray:
    """One-sided lower bound on a binomial rate holding with probability >= 1 - alpha."""
    k, n, scalar = _counts(successes, trials)
    a = _check_alpha(alpha)
    with np.errstate(invalid="ignore"):
        from scipy.stats import beta  # imported here: scipy.stats costs ~0.7 s, not paid by `dpcl --help`

        lb = beta.ppf(a, np.maximum(k, 1e-300), n - k + 1.0)
    lb = np.where(k <= 0, 0.0, lb)
    return float(lb) if scalar else lb
