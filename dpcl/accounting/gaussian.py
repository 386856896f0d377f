"""The Gaussian mechanism: exact privacy profile, epsilon for a delta, analytic calibration.

For a query of l2 sensitivity ``Delta`` released with noise N(0, sigma^2 I), write
``mu = Delta / sigma``. Balle & Wang (2018), "Improving the Gaussian Mechanism for
Differential Privacy: Analytical Calibration and Optimal Denoising", Theorem 8,
give the *exact* privacy profile (the smallest delta for which the mechanism is
(epsilon, delta)-DP)::

    delta(epsilon) = Phi(mu/2 - epsilon/mu) - exp(epsilon) * Phi(-mu/2 - epsilon/mu)

The profile depends on ``mu`` only and is the same for add/remove and
replace-one neighbours, provided ``Delta`` is the sensitivity under the relation
in use. It is also the profile of mu-Gaussian DP (Dong, Roth & Su 2022, Cor. 2.13),
so :func:`gdp_epsilon` shares the code.

Everything here is vectorised over numpy arrays (scalars in give a float out).
The roots (epsilon for a delta, mu for an (epsilon, delta)) are found by a
safeguarded Newton iteration written here because scipy's vectorised
``optimize.newton`` neither keeps a bracket nor returns the root on a chosen
side; here every returned value is verified on the *safe* side: the delta it
implies is <= the requested delta (see :func:`_solve_safe_root`).

Why not dp-accounting? Its ``GaussianPrivacyLoss`` computes the same profile for
one scalar at a time; a million per-token budgets need an array implementation.
The tests cross-check this module against dp-accounting's PLD accountant.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import numpy as np
from scipy.special import erfinv, log_ndtr, ndtri

from dpcl.accounting.validation import broadcast_together, check_delta, check_nonnegative, check_positive
from dpcl.errors import InvalidParameterError

__all__ = [
    "ClassicGaussian",
    "classic_gaussian_sigma",
    "gaussian_delta",
    "gaussian_epsilon",
    "gaussian_sigma",
    "gdp_delta",
    "gdp_epsilon",
    "gdp_mu",
]

_LOG_SQRT_2PI = 0.5 * np.log(2.0 * np.pi)
_LOG_2 = float(np.log(2.0))
_UNIT_ROUNDOFF = 2.0**-53
#: Relative tolerance at which the Newton iterations stop (a few ulps of a float64).
_RTOL = 1e-13
#: :func:`gaussian_sigma` solves for a slightly smaller epsilon (see
#: :func:`_calibration_target`), so the returned sigma gives an epsilon strictly
#: below the target even after both root finders' rounding.
_CALIBRATION_MARGIN = 1e-10


def _calibration_target(epsilon: np.ndarray, delta: np.ndarray) -> np.ndarray:
    """epsilon lowered by 1e-10 relative plus the absolute float error of the profile.

    Evaluating Thm 8 in float64 costs ~1e-16 * |log delta| in log delta, which for
    tiny epsilon (1e-4) and tiny delta (1e-12) moves the epsilon root by ~1e-14
    absolute; the margin covers that, so ``gaussian_epsilon(gaussian_sigma(e)) <= e``.
    The loss is ~1e-9 relative at epsilon = 1e-4, far inside the 1e-6 round trip.
    """
    absolute = 4e-15 * (1.0 + np.abs(np.log(delta)))
    return np.maximum(epsilon * (1.0 - _CALIBRATION_MARGIN) - absolute, 0.5 * epsilon)


def _calibrated_mu(
    epsilon: np.ndarray,
    delta: np.ndarray,
    verify: Callable[[np.ndarray, np.ndarray], np.ndarray] | None = None,
    returned_mu: Callable[[np.ndarray, np.ndarray], np.ndarray] | None = None,
) -> np.ndarray:
    """mu for a calibration at (epsilon, delta), flat arrays; ``gdp_epsilon(mu', delta) <= epsilon``.

    Solved for epsilon lowered by 1e-10 relative. Only where the absolute term of
    :func:`_calibration_target` is not negligible (tiny epsilon) could that fall short,
    so there the round trip is checked (``returned_mu(mu, idx)`` is the mu the caller
    will report, e.g. Delta / (Delta / mu)) and failures are solved again at the fully
    lowered target. This keeps tiny-epsilon calibrations tight when the profile is
    accurate there (tiny mu), instead of always paying the absolute margin (~19 % of
    epsilon at epsilon = 1e-12, delta = 1e-20).
    """
    mu = _mu_from_epsilon(epsilon * (1.0 - _CALIBRATION_MARGIN), delta, verify=verify)
    absolute = 4e-15 * (1.0 + np.abs(np.log(delta)))
    check = np.flatnonzero(absolute > 1e-3 * _CALIBRATION_MARGIN * epsilon)
    if check.size == 0:
        return mu
    reported = mu[check] if returned_mu is None else returned_mu(mu[check], check)
    with np.errstate(invalid="ignore"):
        fails = ~(_epsilon_from_mu(reported, delta[check]) <= epsilon[check])
    redo = check[fails]
    if redo.size:
        sub_verify = None if verify is None else (lambda m, j: verify(m, redo[j]))
        mu[redo] = _mu_from_epsilon(_calibration_target(epsilon[redo], delta[redo]), delta[redo], verify=sub_verify)
    return mu


# ---------------------------------------------------------------------------
# privacy profile in log space
# ---------------------------------------------------------------------------
def _log_delta(epsilon: np.ndarray, mu: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(log of an upper bound on delta(epsilon; mu), log(exp(epsilon) * Phi(-mu/2 - epsilon/mu)))``.

    Balle & Wang (2018), Thm 8. Both terms are computed in log space with
    ``log_ndtr`` and combined as ``log(e^a - e^b) = a + log(1 - e^(b - a))`` (log1mexp), which
    stays accurate when delta is tiny (epsilon large) and never forms ``exp(epsilon)``.

    When mu is tiny the two terms nearly cancel (b - a -> 0) and float rounding
    dominates. ``b - a`` is therefore replaced by a *lower* bound, the larger of two:

    1. the float value lowered by a bound on its error (a few ulps of |a|, |b|,
       epsilon and of the arguments' rounding propagated through
       d log Phi(x)/dx ~ |x|). Tight unless mu is tiny; its error grows like
       |a| / (b - a) ~ t^3 / mu (t = epsilon/mu), e.g. a factor ~2 on sigma at
       epsilon = 1e-12, delta = 1e-20.
    2. ``b - a = epsilon - int_{x2}^{x1} lambda(s) ds`` with x1 = mu/2 - t,
       x2 = x1 - mu and lambda = phi/Phi, since d log Phi / dx = lambda. lambda is
       convex (Baricz 2008, "Mills' ratio: monotonicity patterns and functional
       inequalities", J. Math. Anal. Appl. 340), so the trapezoid rule over-estimates
       the integral (Hermite-Hadamard) and ``epsilon - mu (lambda(x1) + lambda(x2))/2``
       is a lower bound; its float error is bounded and subtracted too. It needs only
       ``exp`` of values already computed, and is accurate to ~mu^2 relative,
       i.e. exactly where (1) is not.

    So the value returned is never below the exact delta: about 1e-13 relative
    above it in ordinary regimes and ~1e-11 or better for tiny mu.
    """
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        ratio = epsilon / mu
        x1 = mu / 2.0 - ratio
        x2 = -mu / 2.0 - ratio
        a = log_ndtr(x1)
        log_phi2 = log_ndtr(x2)
        b = epsilon + log_phi2
        t = mu / 2.0 + ratio
        float_error = 8.0 * _UNIT_ROUNDOFF * (np.abs(a) + np.abs(b) + epsilon + 2.0 * t * (t + 1.0))
        diff = (b - a) - float_error
        # (2): trapezoid bound with lambda(x) = exp(-x^2/2 - log sqrt(2 pi) - log Phi(x)).
        # Float error: each exponent to 8 u (x^2 + |log Phi| + 1), lambda at a rounded x moves by
        # at most 2 u (|x| + 1) since 0 < -lambda' < 1 (Sampford 1953), then the sums.
        lam1 = np.exp(-0.5 * x1 * x1 - _LOG_SQRT_2PI - a)
        lam2 = np.exp(-0.5 * x2 * x2 - _LOG_SQRT_2PI - log_phi2)
        trap = 0.5 * mu * (lam1 + lam2)
        exp_error = 8.0 * _UNIT_ROUNDOFF * (np.maximum(x1 * x1, x2 * x2) + np.abs(log_phi2) + 1.0)
        trap_error = (
            trap * (exp_error + 12.0 * _UNIT_ROUNDOFF)
            + 4.0 * _UNIT_ROUNDOFF * (epsilon + mu * (np.abs(x1) + np.abs(x2) + 2.0))
        )
        diff = np.fmax(diff, epsilon - trap - trap_error)
        # exact b < a (delta > 0). Should the lowered difference still be >= 0 (an error bound
        # failed), fall back to a itself: delta <= Phi(mu/2 - epsilon/mu) always, so that stays an
        # upper bound (reporting delta = 0 would not be).
        # log(1 - e^d) as log(-expm1(d)) near 0 and log1p(-e^d) below -log 2 (Maechler 2012, "log1mexp")
        d = np.minimum(diff, 0.0)
        log1mexp = np.where(d > -_LOG_2, np.log(-np.expm1(d)), np.log1p(-np.exp(d)))
        log_delta = np.where(diff < 0, a + log1mexp, a)
    return log_delta, b


def _scalar_or_array(value: np.ndarray, scalar: bool) -> float | np.ndarray:
    return float(value) if scalar else value



# ---------------------------------------------------------------------------
# safeguarded root finding on arrays
# ---------------------------------------------------------------------------
def _solve_safe_root(
    fun: Callable[[np.ndarray, np.ndarray], tuple[np.ndarray, np.ndarray, np.ndarray]],
    x0: np.ndarray,
    unsafe0: np.ndarray,
    *,
    increasing: bool,
    start: np.ndarray | None = None,
    verify: Callable[[np.ndarray, np.ndarray], np.ndarray] | None = None,
    max_iter: int = 100,
) -> np.ndarray:
    """Vectorised root of a monotone ``g``; returns, per element, an ``x`` with ``g(x) <= 0``.

    ``fun(x, idx)`` returns ``(g, g', g'')`` for the elements ``idx``. ``x0`` must be
    safe (``g(x0) <= 0``, known from a bound); ``unsafe0`` is a point with ``g > 0``,
    or ``inf`` when unknown; ``start`` (default ``x0``) is the first iterate.
    ``verify(x, idx)`` (default: ``fun``'s ``g``) is the final safety check.

    The iteration keeps a bracket [safe, unsafe] and takes Halley steps
    (cubic convergence) that stay inside it, bisecting (or doubling, while the
    bracket is open) otherwise. Once a step is below 1e-6 relative, the next
    iterate is within ~1e-15 relative of the root; it is moved 1e-13 toward the
    safe side and then *verified* (one more evaluation; any element that fails is
    nudged further, and falls back to its bracket's verified safe end). So the
    answer always errs on the side of more privacy loss / more noise, never less.
    """
    safe = np.array(x0, dtype=np.float64, copy=True)
    unsafe = np.array(unsafe0, dtype=np.float64, copy=True)
    x = safe.copy() if start is None else np.array(start, dtype=np.float64, copy=True)
    result = safe.copy()
    toward_safe = -1.0 if increasing else 1.0
    tiny = np.finfo(float).tiny
    active = np.arange(x.size)
    for _ in range(max_iter):
        if active.size == 0:
            break
        xa = x[active]
        g, g1, g2 = fun(xa, active)
        is_safe = g <= 0
        safe[active[is_safe]] = xa[is_safe]
        unsafe[active[~is_safe]] = xa[~is_safe]
        with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
            newton = g / g1
            correction = 0.5 * newton * g2 / g1
            # Halley's correction is trusted only near the root (|correction| < 1/2);
            # farther out it can even reverse the step, so plain Newton is used.
            use_halley = np.abs(correction) < 0.5
            step = np.where(use_halley, newton / (1.0 - np.where(use_halley, correction, 0.0)), newton)
            candidate = xa - step
        s_a, u_a = safe[active], unsafe[active]
        lo, hi = np.minimum(s_a, u_a), np.maximum(s_a, u_a)
        scale = np.maximum(np.abs(xa), tiny)
        bad = ~np.isfinite(candidate) | (candidate <= lo) | (candidate >= hi)
        close = ~bad & (np.abs(step) <= 1e-6 * scale)
        narrow = np.isfinite(u_a) & (hi - lo <= _RTOL * np.maximum(np.abs(s_a), tiny))
        # bisect geometrically across decades (all roots here are of positive
        # quantities), arithmetically otherwise; double while the bracket is open.
        with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
            geometric = np.sqrt(lo) * np.sqrt(hi)  # not sqrt(lo * hi): that overflows for roots ~1e300
        wide = (lo > 0) & (hi > 4.0 * lo)
        bisect = np.where(wide, geometric, 0.5 * (s_a + u_a))
        fallback = np.where(np.isfinite(u_a), bisect, 2.0 * np.abs(s_a) + tiny)
        candidate = np.where(bad, fallback, candidate)
        finished = close | narrow
        result[active] = np.where(close, candidate + toward_safe * _RTOL * scale, s_a)
        x[active] = candidate
        active = active[~finished]
    # Elements still active after max_iter keep their verified safe end (result = safe).
    if active.size:
        result[active] = safe[active]
    # Verify every answer; nudge the (rare) failures toward the safe side.
    if verify is None:
        def verify(x: np.ndarray, idx: np.ndarray) -> np.ndarray:
            return fun(x, idx)[0]
    check = np.arange(result.size)
    for k in range(12):
        g = verify(result[check], check)
        failed = ~(g <= 0)
        if not np.any(failed):
            return result
        check = check[failed]
        nudge = _RTOL * 4.0**k * np.maximum(np.abs(result[check]), tiny)
        result[check] = result[check] + toward_safe * nudge
    result[check] = safe[check]
    return result


# ---------------------------------------------------------------------------
# epsilon for a delta, mu for an (epsilon, delta)
# ---------------------------------------------------------------------------
def _asymptotic_epsilon(mu: np.ndarray, log_target: np.ndarray, eps0: np.ndarray) -> np.ndarray:
    """Cheap start for the epsilon root: the Mills-ratio form of Thm 8 (see :func:`_asymptotic_mu`).

    Three Newton steps in epsilon on log(phi(t1) mu / (t1 t2)) = log delta; kept
    only where t1 > 2 and the value lies in (0, eps0), else ``eps0``.
    """
    eps = eps0.copy()
    with np.errstate(all="ignore"):
        for _ in range(3):
            t1 = eps / mu - mu / 2.0
            t2 = eps / mu + mu / 2.0
            f = -0.5 * t1 * t1 - _LOG_SQRT_2PI + np.log(mu) - np.log(t1 * t2) - log_target
            df = -t1 / mu - 1.0 / (mu * t1) - 1.0 / (mu * t2)
            eps = eps - f / df
        t1 = eps / mu - mu / 2.0
        ok = np.isfinite(eps) & (eps > 0) & (eps < eps0) & (t1 > 2.0)
    return np.where(ok, eps, eps0)


def _epsilon_from_mu(mu: np.ndarray, delta: np.ndarray) -> np.ndarray:
    """Smallest epsilon >= 0 with delta(epsilon; mu) <= delta (arrays, already validated)."""
    mu = np.asarray(mu, dtype=np.float64)
    delta = np.asarray(delta, dtype=np.float64)
    out = np.zeros(mu.shape, dtype=np.float64)
    log_target = np.log(delta)
    at_zero, _ = _log_delta(np.zeros_like(mu), mu)
    need = at_zero > log_target  # otherwise epsilon = 0 already suffices
    # mu = inf (sensitivity / sigma overflowed): delta(eps) = 1 for every eps, so no finite epsilon holds
    infinite = need & np.isinf(mu)
    out[infinite] = np.inf
    need &= ~infinite
    if not np.any(need):
        return out
    m, lt = mu[need], log_target[need]
    # Tail bound: delta(eps) <= P[L > eps] with L ~ N(mu^2/2, mu^2), which equals
    # `delta` at eps0 = mu z + mu^2/2, z = Phi^{-1}(1 - delta). So eps0 is safe.
    z = -ndtri(delta[need])
    with np.errstate(over="ignore"):  # mu > ~1e154: eps0 = inf, the answer is inf (no finite epsilon)
        eps0 = np.maximum(m * z + 0.5 * m * m, 0.0)

    def fun(eps: np.ndarray, idx: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        mu_i = m[idx]
        log_d, log_b = _log_delta(eps, mu_i)
        x1 = mu_i / 2.0 - eps / mu_i
        # delta'(eps) = -exp(eps) Phi(-mu/2 - eps/mu); delta'' = delta' + phi(x1)/mu
        # (using exp(eps) phi(-mu/2 - eps/mu) = phi(x1)). Derivatives of log delta:
        with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
            d1 = -np.exp(log_b - log_d)
            d2 = d1 + np.exp(-0.5 * x1 * x1 - _LOG_SQRT_2PI - log_d) / mu_i - d1 * d1
        return log_d - lt[idx], d1, d2

    target = delta[need]

    def verify(eps: np.ndarray, idx: np.ndarray) -> np.ndarray:
        # compare delta itself, as gaussian_delta reports it (exp(log t) may differ from t by an ulp)
        log_d, _ = _log_delta(eps, m[idx])
        return np.exp(log_d) - target[idx]

    start = _asymptotic_epsilon(m, lt, eps0)
    out[need] = _solve_safe_root(fun, eps0, np.zeros_like(eps0), increasing=False, start=start, verify=verify)
    return out


def _asymptotic_mu(epsilon: np.ndarray, log_target: np.ndarray, mu0: np.ndarray) -> np.ndarray:
    """Cheap starting point for the mu root: Mills-ratio form of Thm 8.

    For t1 = eps/mu - mu/2 large, Phi(-t) ~ phi(t)/t gives
    delta ~ phi(t1) mu / (t1 t2) with t2 = eps/mu + mu/2. Three Newton steps on its
    log (elementary functions only, no ``log_ndtr``) land within ~1e-3 of the root
    in that regime; elsewhere the tail-bound point ``mu0`` is kept. Only a start:
    the bracket and the verification do not rely on it.
    """
    mu = mu0.copy()
    with np.errstate(all="ignore"):
        for _ in range(3):
            t1 = epsilon / mu - mu / 2.0
            t2 = epsilon / mu + mu / 2.0
            f = -0.5 * t1 * t1 - _LOG_SQRT_2PI + np.log(mu) - np.log(t1 * t2) - log_target
            dt1 = -epsilon / (mu * mu) - 0.5
            dt2 = -epsilon / (mu * mu) + 0.5
            df = -t1 * dt1 + 1.0 / mu - dt1 / t1 - dt2 / t2
            mu = mu - f / df
        t1 = epsilon / mu - mu / 2.0
        ok = np.isfinite(mu) & (mu > mu0) & (t1 > 2.0)
    return np.where(ok, mu, mu0)


def _mu_from_epsilon(
    epsilon: np.ndarray,
    delta: np.ndarray,
    verify: Callable[[np.ndarray, np.ndarray], np.ndarray] | None = None,
) -> np.ndarray:
    """Largest mu (to within rounding, on the safe side) with delta(epsilon; mu) <= delta."""
    epsilon = np.asarray(epsilon, dtype=np.float64)
    delta = np.asarray(delta, dtype=np.float64)
    log_target = np.log(delta)
    z = -ndtri(delta)
    # Same tail bound: at mu0 = -z + sqrt(z^2 + 2 eps), P[L > eps] = delta, so mu0 is safe.
    # For z > 0 that difference cancels (to 0 once 2 eps < ulp(z^2), e.g. eps = 1e-20), so
    # it is evaluated there as 2 eps / (z + sqrt(z^2 + 2 eps)), which has no cancellation.
    root = np.sqrt(z * z + 2.0 * epsilon)
    with np.errstate(divide="ignore", invalid="ignore"):
        mu_tail = np.where(z > 0, 2.0 * epsilon / (z + root), root - z)
    # Second safe point, from delta(epsilon) <= delta(0) = 2 Phi(mu/2) - 1 = erf(mu / (2 sqrt 2)):
    # mu_tv = 2 sqrt(2) erfinv(delta), lowered by 1e-12 relative for erfinv's rounding. It is the
    # root itself as epsilon -> 0, where mu_tail -> 0 (the bracket could not grow from 0 in time).
    mu_tv = 2.0 * np.sqrt(2.0) * erfinv(delta) * (1.0 - 1e-12)
    mu0 = np.maximum(mu_tail, mu_tv)

    def fun(mu: np.ndarray, idx: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        e = epsilon.ravel()[idx]
        log_d, _ = _log_delta(e, mu)
        # d delta / d mu = phi(mu/2 - eps/mu) (the two phi terms of the derivative merge
        # because exp(eps) phi(-mu/2 - eps/mu) = phi(mu/2 - eps/mu)).
        # delta''(mu) = -x1 (1/2 + eps/mu^2) phi(x1). Derivatives of log delta:
        with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
            x1 = mu / 2.0 - e / mu
            d1 = np.exp(-0.5 * x1 * x1 - _LOG_SQRT_2PI - log_d)
            d2 = -x1 * (0.5 + e / (mu * mu)) * d1 - d1 * d1
        return log_d - log_target.ravel()[idx], d1, d2

    start = _asymptotic_mu(epsilon.ravel(), log_target.ravel(), mu0.ravel())
    flat = _solve_safe_root(
        fun, mu0.ravel(), np.full(mu0.size, np.inf), increasing=True, start=start, verify=verify
    )
    return flat.reshape(mu0.shape)


# ---------------------------------------------------------------------------
# public API
# ---------------------------------------------------------------------------
def gaussian_delta(epsilon: Any, sigma: Any, sensitivity: Any = 1.0) -> float | np.ndarray:
    """Exact delta(epsilon) of the Gaussian mechanism (Balle & Wang 2018, Thm 8).

    ``epsilon >= 0`` (epsilon = 0 gives the total-variation distance), ``sigma > 0``,
    ``sensitivity > 0`` (l2, under the neighbouring relation in use). Broadcasts.
    """
    eps = check_nonnegative("epsilon", epsilon)
    sig = check_positive("sigma", sigma)
    sens = check_positive("sensitivity", sensitivity)
    (eps, sig, sens), scalar = broadcast_together(("epsilon", "sigma", "sensitivity"), eps, sig, sens)
    with np.errstate(over="ignore"):  # sensitivity / sigma may overflow: mu = inf is handled (delta = 1)
        mu = sens / sig
    log_d, _ = _log_delta(eps, mu)
    return _scalar_or_array(np.exp(log_d), scalar)


def gdp_delta(epsilon: Any, mu: Any) -> float | np.ndarray:
    """delta(epsilon) of mu-Gaussian DP (Dong, Roth & Su 2022, Cor. 2.13; same curve as Thm 8 above)."""
    eps = check_nonnegative("epsilon", epsilon)
    m = check_positive("mu", mu)
    (eps, m), scalar = broadcast_together(("epsilon", "mu"), eps, m)
    log_d, _ = _log_delta(eps, m)
    return _scalar_or_array(np.exp(log_d), scalar)


def gaussian_epsilon(sigma: Any, delta: Any, sensitivity: Any = 1.0) -> float | np.ndarray:
    """Smallest epsilon >= 0 with ``gaussian_delta(epsilon, sigma, sensitivity) <= delta``.

    Root of the Balle & Wang (2018) Thm 8 profile; the value returned is verified
    to satisfy the inequality (it is an upper bound). It is exact to ~1e-13 relative
    when mu = sensitivity / sigma is not tiny; for tiny mu with tiny delta the
    two Thm 8 terms cancel and the float error bound makes it conservative
    (measured: ~1e-7 relative at mu = 1e-6, delta = 1e-200; see docs/accounting.md).
    ``delta`` in (0, 1).
    """
    sig = check_positive("sigma", sigma)
    dlt = check_delta("delta", delta)
    sens = check_positive("sensitivity", sensitivity)
    (sig, dlt, sens), scalar = broadcast_together(("sigma", "delta", "sensitivity"), sig, dlt, sens)
    with np.errstate(over="ignore"):  # sensitivity / sigma may overflow: mu = inf gives epsilon = inf
        mu = sens / sig
    return _scalar_or_array(_epsilon_from_mu(mu, dlt), scalar)


def gdp_epsilon(mu: Any, delta: Any) -> float | np.ndarray:
    """Smallest epsilon with mu-GDP implying (epsilon, delta)-DP (Dong, Roth & Su 2022, Cor. 2.13)."""
    m = check_positive("mu", mu)
    dlt = check_delta("delta", delta)
    (m, dlt), scalar = broadcast_together(("mu", "delta"), m, dlt)
    return _scalar_or_array(_epsilon_from_mu(m, dlt), scalar)


def gdp_mu(epsilon: Any, delta: Any) -> float | np.ndarray:
    """Largest mu (rounded down) such that mu-GDP implies (epsilon, delta)-DP.

    Inverse of :func:`gdp_epsilon` in mu; used to turn an (epsilon, delta) budget
    into a GDP budget (e.g. by the privacy filter). Like :func:`gaussian_sigma` it
    solves for a target lowered by ~1e-10 relative so ``gdp_epsilon(gdp_mu(e, d), d) <= e``.

    An epsilon above :data:`GDP_MU_MAX_EPSILON` (1e307, where the solver's 2 epsilon would overflow) is answered
    with the mu of that epsilon (~4.5e153): a smaller mu than the exact one, so still sound (mu-GDP implies
    (1e307, delta)-DP, hence (epsilon, delta)-DP).
    """
    eps = check_positive("epsilon", epsilon)
    dlt = check_delta("delta", delta)
    (eps, dlt), scalar = broadcast_together(("epsilon", "delta"), eps, dlt)
    eps = np.minimum(eps, GDP_MU_MAX_EPSILON)
    mu = _calibrated_mu(np.ravel(eps), np.ravel(dlt)).reshape(np.shape(eps))
    return _scalar_or_array(mu, scalar)


#: Largest epsilon :func:`gdp_mu` solves for; a larger one gets this epsilon's mu (smaller than its own: sound).
GDP_MU_MAX_EPSILON = 1e307


def gaussian_sigma(epsilon: Any, delta: Any, sensitivity: Any = 1.0) -> float | np.ndarray:
    """Analytic Gaussian calibration: the smallest sigma (up to ~1e-10 relative) that is (epsilon, delta)-DP.

    Balle & Wang (2018), Alg. 1 / Thm 8, solved here for mu = Delta / sigma by the
    safeguarded Newton iteration (vectorised: one call calibrates a million
    per-token budgets). The returned sigma always satisfies
    ``gaussian_delta(epsilon, sigma, sensitivity) <= delta``; it is computed for
    ``epsilon`` lowered by ~1e-10 relative (:func:`_calibration_target`) so that ``gaussian_epsilon(sigma, delta)`` never
    exceeds ``epsilon`` after rounding. Valid for every epsilon > 0, unlike
    :func:`classic_gaussian_sigma`.
    """
    eps = check_positive("epsilon", epsilon)
    dlt = check_delta("delta", delta)
    sens = check_positive("sensitivity", sensitivity)
    (eps, dlt, sens), scalar = broadcast_together(("epsilon", "delta", "sensitivity"), eps, dlt, sens)
    eps_flat, sens_flat, dlt_flat = (np.ravel(a) for a in (eps, sens, dlt))

    def verify(mu: np.ndarray, idx: np.ndarray) -> np.ndarray:
        # check the sigma we will return, at the requested epsilon (not the margin one)
        sens_i = sens_flat[idx] if sens_flat.size > 1 else sens_flat
        log_d, _ = _log_delta(eps_flat[idx], sens_i / (sens_i / mu))
        return np.exp(log_d) - dlt_flat[idx]

    def returned_mu(mu: np.ndarray, idx: np.ndarray) -> np.ndarray:
        sens_i = sens_flat[idx] if sens_flat.size > 1 else sens_flat
        return sens_i / (sens_i / mu)

    with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
        mu = _calibrated_mu(eps_flat, dlt_flat, verify=verify, returned_mu=returned_mu).reshape(np.shape(eps))
        sigma = sens / mu
    bad = ~(np.isfinite(sigma) & (sigma > 0))
    if np.any(bad):
        i = int(np.flatnonzero(np.ravel(bad))[0])
        raise InvalidParameterError(
            "no finite positive sigma reaches "
            f"epsilon={float(np.ravel(eps)[i])!r}, delta={float(np.ravel(dlt)[i])!r} "
            f"(sensitivity={float(np.ravel(sens)[i] if np.size(sens) > 1 else np.ravel(sens)[0])!r}) in floating point; "
            "use a smaller epsilon or a smaller sensitivity."
        )
    return _scalar_or_array(sigma, scalar)


@dataclass(frozen=True)
class ClassicGaussian:
    """Classic calibration ``sigma = Delta sqrt(2 ln(1.25/delta)) / epsilon`` and whether it is a theorem there.

    ``valid`` is True only where epsilon < 1 (Dwork & Roth 2014, Thm A.1). Outside
    that range the formula is *not* a proof of (epsilon, delta)-DP; use
    :func:`gaussian_sigma`.
    """

    sigma: float | np.ndarray
    valid: bool | np.ndarray


def classic_gaussian_sigma(epsilon: Any, delta: Any, sensitivity: Any = 1.0) -> ClassicGaussian:
    """Dwork & Roth (2014), Thm A.1: sigma = Delta sqrt(2 ln(1.25/delta)) / epsilon, valid for epsilon < 1.

    The value is returned for every epsilon > 0 so that it can be compared, with
    ``valid`` saying where the theorem holds; callers must not use an invalid one.
    """
    eps = check_positive("epsilon", epsilon)
    dlt = check_delta("delta", delta)
    sens = check_positive("sensitivity", sensitivity)
    (eps, dlt, sens), scalar = broadcast_together(("epsilon", "delta", "sensitivity"), eps, dlt, sens)
    # ln(1.25) - ln(delta): 1.25 / delta overflows for delta below ~7e-309; a sigma beyond float range is inf (more
    # noise than any float: still (epsilon, delta)-DP), without a RuntimeWarning
    with np.errstate(over="ignore"):
        sigma = sens * np.sqrt(2.0 * (np.log(1.25) - np.log(dlt))) / eps
    valid = eps < 1.0
    if scalar:
        return ClassicGaussian(sigma=float(sigma), valid=bool(valid))
    return ClassicGaussian(sigma=sigma, valid=valid)
