"""Composition theorems: basic, heterogeneous advanced, and exact composition of Gaussians.

* :func:`basic_composition` - epsilons and deltas add (Dwork, Kenthapadi, McSherry,
  Mironov & Naor 2006; Dwork & Roth 2014, Thm 3.16), also under adaptive choice.
* :func:`advanced_composition` - Kairouz, Oh & Viswanath (2015/2017), "The
  Composition Theorem for Differential Privacy", Thm 3.5 (heterogeneous
  (epsilon_i, delta_i), k-fold adaptive composition), which improves the
  heterogeneous bound of Dwork, Rothblum & Vadhan (2010, Thm III.3).
  :func:`advanced_composition_for_delta` chooses the slack delta for a total delta.
* :func:`gaussian_composition_mu` / :func:`compose_gaussians_epsilon` - adaptive
  composition of Gaussian mechanisms is *exactly* a Gaussian mechanism with
  mu = sqrt(sum (Delta_i / sigma_i)^2) (Dong, Roth & Su 2022, "Gaussian
  Differential Privacy", Cor. 3.3), whose epsilon for a delta is the Thm 8 root
  of :mod:`dpcl.accounting.gaussian`. Vectorised: a million sigmas in a few ms.

These closed forms are short and have no array implementation in dp-accounting
(whose accountants compose one event object at a time), hence written here.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from dpcl.accounting.gaussian import gdp_epsilon
from dpcl.accounting.validation import check_delta, check_delta_scalar, check_nonnegative, check_positive
from dpcl.errors import InvalidParameterError

__all__ = [
    "advanced_composition",
    "advanced_composition_for_delta",
    "basic_composition",
    "compose_gaussians_epsilon",
    "gaussian_composition_mu",
]

_UNIT_ROUNDOFF = 2.0**-53


def _pairs(epsilons: Any, deltas: Any) -> tuple[np.ndarray, np.ndarray]:
    eps = np.atleast_1d(np.asarray(check_nonnegative("epsilons", np.atleast_1d(epsilons)), dtype=np.float64)).ravel()
    dlt = np.atleast_1d(np.asarray(check_delta("deltas", np.atleast_1d(deltas), allow_zero=True), dtype=np.float64)).ravel()
    if dlt.size == 1 and eps.size > 1:
        dlt = np.full(eps.size, dlt[0])
    if dlt.size != eps.size:
        raise InvalidParameterError(
            f"deltas must be one value or one per epsilon ({eps.size}), got {dlt.size}."
        )
    return eps, dlt


def _checked_total_delta(total: float, what: str) -> float:
    if not total < 1.0:
        raise InvalidParameterError(
            f"the composed delta of {what} is {total!r} >= 1, which guarantees nothing; "
            "use smaller per-mechanism deltas or fewer mechanisms."
        )
    return total


def basic_composition(epsilons: Any, deltas: Any) -> tuple[float, float]:
    """(sum epsilon_i, sum delta_i): basic composition (Dwork & Roth 2014, Thm 3.16).

    ``deltas`` is one value per epsilon or a single value used for each. Sums are
    correctly rounded (``math.fsum``).
    """
    eps, dlt = _pairs(epsilons, deltas)
    return _finite_epsilon(_fsum(eps), "basic composition"), _checked_total_delta(math.fsum(dlt), "basic composition")


def _fsum(values: np.ndarray) -> float:
    """``math.fsum``, with a sum beyond float range as ``inf`` (fsum raises OverflowError for it)."""
    try:
        return math.fsum(values)
    except OverflowError:
        return math.inf


def _finite_epsilon(value: float, what: str) -> float:
    """``value``, or a refusal naming ``epsilons`` where the composed epsilon is beyond float range."""
    if not math.isfinite(value):
        raise InvalidParameterError(
            f"the composed epsilon of {what} is beyond float range (~1.8e308); epsilons are too large for a "
            "meaningful bound."
        )
    return value


def _kov_epsilon(eps: np.ndarray, log_slack: np.ndarray | float) -> np.ndarray:
    """KOV Thm 3.5 epsilon for slack delta~ = exp(log_slack) (array over slacks)."""
    with np.errstate(over="ignore", invalid="ignore"):
        total = _fsum(eps)
        sum_sq = _fsum(eps * eps)
        # (e^eps - 1) eps / (e^eps + 1) = eps tanh(eps/2), stable for all eps >= 0
        drift = _fsum(eps * np.tanh(eps / 2.0))
        log_slack = np.asarray(log_slack, dtype=np.float64)
        if not math.isfinite(sum_sq):  # the sum of squares overflows: only the sum itself can bound epsilon
            return np.full(log_slack.shape, total)
        # log(e + sqrt(sum eps^2)/delta~) computed in log space
        log_term2 = np.logaddexp(1.0, 0.5 * math.log(sum_sq) - log_slack) if sum_sq > 0 else np.ones_like(log_slack)
        second = drift + np.sqrt(2.0 * sum_sq * log_term2)
        third = drift + np.sqrt(2.0 * sum_sq * -log_slack)
        return np.minimum(np.minimum(total, second), third)


def advanced_composition(epsilons: Any, deltas: Any, delta_slack: float) -> tuple[float, float]:
    """Heterogeneous advanced composition (Kairouz, Oh & Viswanath 2017, Thm 3.5).

    k adaptively composed mechanisms, the i-th (epsilon_i, delta_i)-DP, are
    (epsilon~, 1 - (1 - delta~) prod(1 - delta_i))-DP for every slack
    delta~ in (0, 1], with::

        epsilon~ = min{ sum eps_i,
                        sum eps_i (e^eps_i - 1)/(e^eps_i + 1) + sqrt(2 sum eps_i^2 log(e + sqrt(sum eps_i^2)/delta~)),
                        sum eps_i (e^eps_i - 1)/(e^eps_i + 1) + sqrt(2 sum eps_i^2 log(1/delta~)) }

    (the last term is the heterogeneous Dwork-Rothblum-Vadhan form with the
    tighter drift term). Returns ``(epsilon~, total delta)``.
    """
    eps, dlt = _pairs(epsilons, deltas)
    slack = check_delta_scalar("delta_slack", delta_slack)
    value = _finite_epsilon(float(_kov_epsilon(eps, math.log(slack))), "advanced composition")
    log_keep = math.log1p(-slack) + math.fsum(np.log1p(-dlt))
    return value, _checked_total_delta(-math.expm1(log_keep), "advanced composition")


def advanced_composition_for_delta(epsilons: Any, deltas: Any, delta: float) -> tuple[float, float]:
    """Advanced composition reaching a total ``delta``: the slack is what the deltas leave.

    Solves 1 - (1 - delta~) prod(1 - delta_i) = delta for delta~ (Thm 3.5 above).
    Raises when the mechanisms' own deltas already use up ``delta``.
    """
    eps, dlt = _pairs(epsilons, deltas)
    target = check_delta_scalar("delta", delta)
    log_slack_keep = math.log1p(-target) - math.fsum(np.log1p(-dlt))
    if not log_slack_keep < 0:
        raise InvalidParameterError(
            f"delta must exceed the composed deltas of the mechanisms ({-math.expm1(-log_slack_keep + math.log1p(-target)):.3g}"
            f" leave nothing for the slack); got delta={target!r}."
        )
    slack = -math.expm1(log_slack_keep) * (1.0 - 1e-12)  # so rounding cannot push the total above delta
    value = _finite_epsilon(float(_kov_epsilon(eps, math.log(slack))), "advanced composition")
    return value, target


def gaussian_composition_mu(sigmas: Any, sensitivities: Any = 1.0) -> float:
    """mu = sqrt(sum (Delta_i / sigma_i)^2): exact composition of Gaussian mechanisms (Dong, Roth & Su 2022, Cor. 3.3).

    The float result is rounded up by a bound on its relative error, so the
    returned mu is never below the exact one: each term Delta_i / sigma_i and its
    square carry 3 roundings, the sum of n positive terms (n - 1) u (Higham 2002,
    eq. 3.5), the scaling and the square root 3 more; 2 (n + 4) u covers them all.
    """
    sig = np.atleast_1d(np.asarray(check_positive("sigmas", np.atleast_1d(sigmas)), dtype=np.float64)).ravel()
    sens = np.atleast_1d(np.asarray(check_positive("sensitivities", np.atleast_1d(sensitivities)), dtype=np.float64)).ravel()
    if sens.size not in (1, sig.size):
        raise InvalidParameterError(
            f"sensitivities must be one value or one per sigma ({sig.size}), got {sens.size}."
        )
    with np.errstate(over="ignore", under="ignore"):
        ratio = sens / sig if sens.size > 1 else sens[0] / sig
        largest = float(np.max(ratio))
        if not math.isfinite(largest):
            raise InvalidParameterError(
                "sensitivity/sigma overflows float range; sigmas are too small (or sensitivities too large) for a "
                "meaningful bound."
            )
        if largest == 0.0:  # every ratio underflowed: each is below the smallest subnormal, 5e-324
            return 5e-324 * math.ceil(math.sqrt(ratio.size))
        # scaled by the largest ratio, so that no square overflows or underflows to 0 (two more roundings)
        scaled = ratio / largest
        # an elementwise sum, not np.dot: BLAS threading costs more than it saves at this size on few cores
        sum_sq = float(np.sum(scaled * scaled))
        mu = largest * math.sqrt(sum_sq * (1.0 + 2.0 * (ratio.size + 6) * _UNIT_ROUNDOFF))
    if not math.isfinite(mu):
        raise InvalidParameterError(
            "sum of (sensitivity/sigma)^2 overflows float range; sigmas are too small for a meaningful bound."
        )
    return mu


def compose_gaussians_epsilon(sigmas: Any, delta: float, sensitivities: Any = 1.0) -> float:
    """epsilon for ``delta`` of the adaptive composition of Gaussian mechanisms (exact, via mu-GDP).

    Dong, Roth & Su (2022), Cor. 3.3, then Balle & Wang (2018), Thm 8.
    """
    mu = gaussian_composition_mu(sigmas, sensitivities)
    return float(gdp_epsilon(mu, check_delta_scalar("delta", delta)))
