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

import math
import os
import threading
from dataclasses import dataclass
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable, Iterable, Iterator

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
    "gaussian_sigma_stream",
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
    terms = _delta_terms(delta)
    mu = _mu_from_epsilon(epsilon * (1.0 - _CALIBRATION_MARGIN), delta, verify=verify, terms=terms)
    absolute = 4e-15 * (1.0 + np.abs(terms[0]))
    check = np.flatnonzero(absolute > 1e-3 * _CALIBRATION_MARGIN * epsilon)
    if check.size == 0:
        return mu
    reported = mu[check] if returned_mu is None else returned_mu(mu[check], check)
    with np.errstate(invalid="ignore"):
        fails = ~(_epsilon_from_mu(reported, delta[check]) <= epsilon[check])
    redo = check[fails]
    if redo.size:
        sub_verify = None if verify is None else (lambda m, j: verify(m, redo[j]))
        mu[redo] = _mu_from_epsilon(
            _calibration_target(epsilon[redo], delta[redo]),
            delta[redo],
            verify=sub_verify,
            terms=tuple(term[redo] for term in terms),  # type: ignore[arg-type]
        )
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
    log_delta, b, _ = _log_delta_x1(epsilon, mu)
    return log_delta, b


def _log_delta_x1(epsilon: np.ndarray, mu: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """:func:`_log_delta` and ``x1 = mu/2 - epsilon/mu``, computed with as few temporaries as the formula allows.

    Every value is formed by the same float operations, in the same order, as the
    expressions in :func:`_log_delta`'s docstring (only temporaries are reused and
    each branch of log1mexp is evaluated where it is selected), so the results are
    bit-identical to evaluating them literally.
    """
    epsilon, mu = np.broadcast_arrays(np.asarray(epsilon, dtype=np.float64), np.asarray(mu, dtype=np.float64))
    shape = epsilon.shape
    if not shape:  # ufuncs return scalars for 0-d operands; the in-place steps need arrays
        epsilon, mu = epsilon.reshape(1), mu.reshape(1)
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        ratio = epsilon / mu
        half = mu / 2.0
        x1 = half - ratio
        x2 = -half
        x2 -= ratio  # -mu/2 - epsilon/mu
        a = log_ndtr(x1)
        log_phi2 = log_ndtr(x2)
        b = epsilon + log_phi2
        t = np.add(half, ratio, out=ratio)  # mu/2 + epsilon/mu
        # float_error = 8 u (|a| + |b| + epsilon + 2 t (t + 1))
        err = np.abs(a)
        err += np.abs(b)
        err += epsilon
        t1 = t + 1.0
        t *= 2.0
        t *= t1
        err += t
        err *= 8.0 * _UNIT_ROUNDOFF
        diff = b - a
        diff -= err
        # (2): trapezoid bound with lambda(x) = exp(-x^2/2 - log sqrt(2 pi) - log Phi(x)).
        # Float error: each exponent to 8 u (x^2 + |log Phi| + 1), lambda at a rounded x moves by
        # at most 2 u (|x| + 1) since 0 < -lambda' < 1 (Sampford 1953), then the sums.
        lam1 = np.multiply(-0.5, x1, out=t1)
        lam1 *= x1
        lam1 -= _LOG_SQRT_2PI
        lam1 -= a
        np.exp(lam1, out=lam1)
        lam2 = np.multiply(-0.5, x2, out=err)
        lam2 *= x2
        lam2 -= _LOG_SQRT_2PI
        lam2 -= log_phi2
        np.exp(lam2, out=lam2)
        lam1 += lam2
        trap = np.multiply(0.5, mu, out=t)
        trap *= lam1  # 0.5 mu (lambda1 + lambda2)
        sq1 = np.multiply(x1, x1, out=lam1)
        sq2 = np.multiply(x2, x2, out=lam2)
        exp_error = np.maximum(sq1, sq2, out=sq1)
        exp_error += np.abs(log_phi2)
        exp_error += 1.0
        exp_error *= 8.0 * _UNIT_ROUNDOFF
        # trap_error = trap (exp_error + 12 u) + 4 u (epsilon + mu (|x1| + |x2| + 2))
        exp_error += 12.0 * _UNIT_ROUNDOFF
        exp_error *= trap
        spread = np.abs(x1, out=sq2)
        spread += np.abs(x2, out=x2)
        spread += 2.0
        spread *= mu
        spread += epsilon
        spread *= 4.0 * _UNIT_ROUNDOFF
        exp_error += spread
        bound = np.subtract(epsilon, trap, out=trap)
        bound -= exp_error  # epsilon - trap - trap_error
        np.fmax(diff, bound, out=diff)
        # exact b < a (delta > 0). Should the lowered difference still be >= 0 (an error bound
        # failed), fall back to a itself: delta <= Phi(mu/2 - epsilon/mu) always, so that stays an
        # upper bound (reporting delta = 0 would not be).
        # log(1 - e^d) as log(-expm1(d)) near 0 and log1p(-exp(d)) below -log 2 (Maechler 2012, "log1mexp")
        negative = diff < 0
        near = negative & (diff > -_LOG_2)
        far = negative & ~near
        log1mexp = np.zeros_like(diff)
        np.expm1(diff, out=log1mexp, where=near)
        np.negative(log1mexp, out=log1mexp, where=near)
        np.log(log1mexp, out=log1mexp, where=near)
        np.exp(diff, out=log1mexp, where=far)
        np.negative(log1mexp, out=log1mexp, where=far)
        np.log1p(log1mexp, out=log1mexp, where=far)
        log_delta = a
        np.add(a, log1mexp, out=log_delta, where=negative)
    return log_delta.reshape(shape), b.reshape(shape), x1.reshape(shape)


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
    everything = np.arange(x.size)
    active = everything
    for _ in range(max_iter):
        if active.size == 0:
            break
        # while every element is active (the first step), slices replace the index gathers
        sel: slice | np.ndarray = slice(None) if active.size == x.size else active
        xa = x[sel]
        g, g1, g2 = fun(xa, sel)
        is_safe = g <= 0
        if active.size == x.size:
            np.copyto(safe, xa, where=is_safe)
            np.copyto(unsafe, xa, where=~is_safe)
        else:
            safe[active[is_safe]] = xa[is_safe]
            unsafe[active[~is_safe]] = xa[~is_safe]
        with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
            newton = g / g1
            correction = 0.5 * newton
            correction *= g2
            correction /= g1  # 0.5 newton g2 / g1
            # Halley's correction is trusted only near the root (|correction| < 1/2);
            # farther out it can even reverse the step, so plain Newton is used.
            newton_only = ~(np.abs(correction) < 0.5)
            step = np.subtract(1.0, correction, out=correction)
            np.divide(newton, step, out=step)
            np.copyto(step, newton, where=newton_only)
            candidate = xa - step
        s_a, u_a = safe[sel], unsafe[sel]
        lo, hi = np.minimum(s_a, u_a), np.maximum(s_a, u_a)
        scale = np.abs(xa)
        np.maximum(scale, tiny, out=scale)
        bad = ~np.isfinite(candidate)
        bad |= candidate <= lo
        bad |= candidate >= hi
        close = np.abs(step) <= 1e-6 * scale
        close &= ~bad
        narrow = hi - lo <= _RTOL * np.maximum(np.abs(s_a), tiny)
        narrow &= np.isfinite(u_a)
        if bad.any():
            # bisect geometrically across decades (all roots here are of positive
            # quantities), arithmetically otherwise; double while the bracket is open.
            b = np.flatnonzero(bad)
            lo_b, hi_b, s_b, u_b = lo[b], hi[b], s_a[b], u_a[b]
            with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
                geometric = np.sqrt(lo_b) * np.sqrt(hi_b)  # not sqrt(lo * hi): that overflows for roots ~1e300
            wide = (lo_b > 0) & (hi_b > 4.0 * lo_b)
            bisect = np.where(wide, geometric, 0.5 * (s_b + u_b))
            candidate[b] = np.where(np.isfinite(u_b), bisect, 2.0 * np.abs(s_b) + tiny)
        finished = close | narrow
        # an element that goes on is written again when it finishes, or gets its safe end after the loop
        if finished.any():
            answer = np.where(close, candidate + toward_safe * _RTOL * scale, s_a)
            if active.size == x.size:
                np.copyto(result, answer, where=finished)
            else:
                result[active[finished]] = answer[finished]
        x[sel] = candidate
        active = active[~finished]
    # Elements still active after max_iter keep their verified safe end (result = safe).
    if active.size:
        result[active] = safe[active]
    # Verify every answer; nudge the (rare) failures toward the safe side.
    if verify is None:
        def verify(x: np.ndarray, idx: np.ndarray) -> np.ndarray:
            return fun(x, idx)[0]
    check = everything
    for k in range(12):
        g = verify(result if k == 0 else result[check], slice(None) if k == 0 else check)
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
    # Each step is, literally:
    #   t1 = epsilon/mu - mu/2;  t2 = epsilon/mu + mu/2
    #   f = -0.5 t1 t1 - log sqrt(2 pi) + log(mu) - log(t1 t2) - log_target
    #   dt1 = -epsilon/mu^2 - 1/2;  dt2 = -epsilon/mu^2 + 1/2
    #   df = -t1 dt1 + 1/mu - dt1/t1 - dt2/t2;  mu = mu - f/df
    # evaluated below in that order with reused buffers.
    t1, t2, f, df, dt2, tmp = (np.empty_like(mu) for _ in range(6))
    with np.errstate(all="ignore"):
        for _ in range(3):
            ratio = np.divide(epsilon, mu, out=df)
            half = np.divide(mu, 2.0, out=tmp)
            np.subtract(ratio, half, out=t1)
            np.add(ratio, half, out=t2)
            np.multiply(-0.5, t1, out=f)
            f *= t1
            f -= _LOG_SQRT_2PI
            f += np.log(mu, out=tmp)
            np.multiply(t1, t2, out=tmp)
            f -= np.log(tmp, out=tmp)
            f -= log_target
            dt1 = np.multiply(mu, mu, out=tmp)
            np.divide(epsilon, dt1, out=dt1)
            np.negative(dt1, out=dt1)  # -epsilon / mu^2
            np.add(dt1, 0.5, out=dt2)
            dt1 -= 0.5
            np.negative(t1, out=df)
            df *= dt1
            np.divide(dt1, t1, out=dt1)  # dt1 / t1 (dt1 is not needed after this)
            np.divide(1.0, mu, out=t1)  # t1 is not needed after this
            df += t1
            df -= dt1
            np.divide(dt2, t2, out=dt2)
            df -= dt2
            np.divide(f, df, out=f)
            mu -= f
        t1 = epsilon / mu - mu / 2.0
        ok = np.isfinite(mu) & (mu > mu0) & (t1 > 2.0)
    return np.where(ok, mu, mu0)


def _delta_terms(delta: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(log delta, z = -Phi^{-1}(delta), mu_tv)`` of :func:`_mu_from_epsilon`, elementwise.

    ``mu_tv = 2 sqrt(2) erfinv(delta)``, lowered by 1e-12 relative (see there). Per-token
    budgets share one delta: a flat array of equal deltas gets each term computed once
    (the same value, bit for bit, that every element would get).
    """
    delta = np.asarray(delta, dtype=np.float64)
    if delta.ndim == 1 and delta.size > 1 and np.all(delta == delta[0]):
        return tuple(np.full(delta.shape, term[0]) for term in _delta_terms(delta[:1]))  # type: ignore[return-value]
    return np.log(delta), -ndtri(delta), 2.0 * np.sqrt(2.0) * erfinv(delta) * (1.0 - 1e-12)


def _mu_from_epsilon(
    epsilon: np.ndarray,
    delta: np.ndarray,
    verify: Callable[[np.ndarray, np.ndarray], np.ndarray] | None = None,
    terms: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None,
) -> np.ndarray:
    """Largest mu (to within rounding, on the safe side) with delta(epsilon; mu) <= delta.

    ``terms`` is :func:`_delta_terms` of ``delta`` when the caller has it already.
    """
    epsilon = np.asarray(epsilon, dtype=np.float64)
    delta = np.asarray(delta, dtype=np.float64)
    log_target, z, mu_tv = _delta_terms(delta) if terms is None else terms
    # Same tail bound: at mu0 = -z + sqrt(z^2 + 2 eps), P[L > eps] = delta, so mu0 is safe.
    # For z > 0 that difference cancels (to 0 once 2 eps < ulp(z^2), e.g. eps = 1e-20), so
    # it is evaluated there as 2 eps / (z + sqrt(z^2 + 2 eps)), which has no cancellation.
    root = np.sqrt(z * z + 2.0 * epsilon)
    with np.errstate(divide="ignore", invalid="ignore"):
        mu_tail = np.where(z > 0, 2.0 * epsilon / (z + root), root - z)
    # Second safe point, from delta(epsilon) <= delta(0) = 2 Phi(mu/2) - 1 = erf(mu / (2 sqrt 2)):
    # mu_tv = 2 sqrt(2) erfinv(delta), lowered by 1e-12 relative for erfinv's rounding. It is the
    # root itself as epsilon -> 0, where mu_tail -> 0 (the bracket could not grow from 0 in time).
    mu0 = np.maximum(mu_tail, mu_tv)

    def fun(mu: np.ndarray, idx: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        e = epsilon.ravel()[idx]
        log_d, _, x1 = _log_delta_x1(e, mu)  # x1 = mu/2 - eps/mu
        # d delta / d mu = phi(mu/2 - eps/mu) (the two phi terms of the derivative merge
        # because exp(eps) phi(-mu/2 - eps/mu) = phi(mu/2 - eps/mu)).
        # delta''(mu) = -x1 (1/2 + eps/mu^2) phi(x1). Derivatives of log delta:
        with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
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


def _sigma_block(eps: np.ndarray, dlt: np.ndarray, sens: np.ndarray) -> np.ndarray:
    """sigma for one block of flat, equally long float64 arrays (the vectorised calibration kernel).

    Every operation is elementwise, so an element's sigma does not depend on the
    block it is computed in: blocks of any size give bit-identical results.
    """

    def verify(mu: np.ndarray, idx: np.ndarray) -> np.ndarray:
        # check the sigma we will return, at the requested epsilon (not the margin one)
        sens_i = sens[idx]
        log_d, _ = _log_delta(eps[idx], sens_i / (sens_i / mu))
        return np.exp(log_d) - dlt[idx]

    def returned_mu(mu: np.ndarray, idx: np.ndarray) -> np.ndarray:
        sens_i = sens[idx]
        return sens_i / (sens_i / mu)

    with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
        mu = _calibrated_mu(eps, dlt, verify=verify, returned_mu=returned_mu)
        return sens / mu


#: Most budgets calibrated per block: large inputs are processed in blocks of at
#: most this many elements, so the working memory (~0.35 KB per element of a block,
#: ~12 MB per thread) does not grow with the input, and a block's arrays stay in cache.
_BLOCK = 1 << 15
#: Fewest budgets per block (a block costs ~0.3 ms of interpreter overhead).
_MIN_BLOCK = 1 << 11
#: Threads that calibrate blocks concurrently (numpy and scipy ufuncs release the
#: GIL). Results do not depend on it: every element is computed by the same
#: elementwise operations whichever block and thread computes it.
_WORKERS = min(2, os.cpu_count() or 1)


#: The block threads, kept for the process's later calls: ``(pid, {workers: executor})``.
_POOLS: tuple[int, dict[int, ThreadPoolExecutor]] = (os.getpid(), {})
_POOLS_LOCK = threading.Lock()


def _pool(workers: int) -> ThreadPoolExecutor:
    """A pool of ``workers`` threads, created on first use and reused by later calls.

    New threads for every call pay their stacks' and C heaps' first page faults again (a call on 10^5
    budgets spent ~70 % more CPU time on two new threads than on one thread). A pool inherited through
    ``fork`` has no threads in the child, so each process makes its own (the pid is checked).
    """
    global _POOLS
    with _POOLS_LOCK:
        if _POOLS[0] != os.getpid():
            _POOLS = (os.getpid(), {})
        pools = _POOLS[1]
        if workers not in pools:
            pools[workers] = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="dpcl-calibration")
        return pools[workers]


#: Whether :func:`_raise_malloc_thresholds` has run in this process.
_MALLOC_THRESHOLDS_RAISED = False


def _raise_malloc_thresholds() -> None:
    """Once per process (glibc only): let the C heap keep the blocks' freed temporaries instead of unmapping them.

    A block's kernel allocates and frees ~100 arrays of 8 bytes per budget (256 KiB for blocks of 2^15).
    With glibc's starting thresholds (arrays from 128 KiB get their own mapping; free memory at the heap's
    top beyond 128 KiB goes back to the kernel) most of them come back as fresh pages, and the page faults
    cost about a third of the calibration's CPU time (measured on 2^20 budgets: ~70,000 minor page faults,
    ~490 ns of CPU per budget against ~340 ns without them; ``benchmarks/CALIBRATION_THROUGHPUT.md``). glibc raises
    both thresholds itself when a program frees a mapped chunk, up to 32 MiB and 64 MiB (``mallopt(3)``,
    "dynamic mmap threshold"); freeing one chunk of just under 32 MiB here does exactly that, as any numpy
    program freeing a 32 MiB array would. Nothing else changes: no float operation, so no result; the
    process keeps up to 64 MiB of freed heap per arena instead of returning it at once. The chunk is
    allocated and freed with libc's ``malloc`` directly (not numpy, so it is not traced or touched: no
    page of it is ever resident). Elsewhere (other C libraries) it does nothing.
    """
    global _MALLOC_THRESHOLDS_RAISED
    if _MALLOC_THRESHOLDS_RAISED:
        return
    _MALLOC_THRESHOLDS_RAISED = True
    import platform

    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        return
    import ctypes

    try:
        libc = ctypes.CDLL(None)
        malloc, free = libc.malloc, libc.free
    except (OSError, AttributeError):  # no symbols to look up: the thresholds stay as they are (results unchanged)
        return
    malloc.restype, malloc.argtypes = ctypes.c_void_p, [ctypes.c_size_t]
    free.restype, free.argtypes = None, [ctypes.c_void_p]
    chunk = malloc((32 << 20) - (64 << 10))  # below glibc's 32 MiB cap on the dynamic threshold
    if chunk:
        free(chunk)


def _flat_operand(value: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    """``value`` as a flat float64 array: a view when it already has ``shape``, length 1 when it is one number.

    Only an operand that truly broadcasts (neither full-size nor a single number) is copied.
    """
    value = np.asarray(value, dtype=np.float64)
    if value.size == 1:
        return value.reshape(1)
    if value.shape == shape:
        return value.reshape(-1)  # a view for C-contiguous input (memmaps included)
    return np.broadcast_to(value, shape).reshape(-1)


def _block_of(flat: np.ndarray, start: int, stop: int) -> np.ndarray:
    if flat.size == 1:
        return np.full(stop - start, flat[0])
    return np.ascontiguousarray(flat[start:stop])


def _calibrate_blocks(
    eps: np.ndarray, dlt: np.ndarray, sens: np.ndarray, out: np.ndarray, workers: int
) -> int:
    """Fill the flat ``out`` with sigmas block by block; return the first index without a finite sigma, or -1."""
    n = out.size
    # at least ~16 blocks, so the working memory stays a small fraction of the output's
    block = min(_BLOCK, max(_MIN_BLOCK, -(-n // 16)))

    def run(start: int) -> int:
        stop = min(start + block, n)
        sig = _sigma_block(_block_of(eps, start, stop), _block_of(dlt, start, stop), _block_of(sens, start, stop))
        out[start:stop] = sig
        with np.errstate(invalid="ignore"):
            bad = ~(np.isfinite(sig) & (sig > 0))
        return start + int(np.argmax(bad)) if bad.any() else -1

    starts = range(0, n, block)
    if len(starts) > 1:
        _raise_malloc_thresholds()
    if workers <= 1 or len(starts) <= 1:
        firsts = [run(s) for s in starts]
    else:
        firsts = list(_pool(workers).map(run, starts))
    bad = [i for i in firsts if i >= 0]
    return bad[0] if bad else -1


def gaussian_sigma(
    epsilon: Any, delta: Any, sensitivity: Any = 1.0, *, out: np.ndarray | None = None
) -> float | np.ndarray:
    """Analytic Gaussian calibration: the smallest sigma (up to ~1e-10 relative) that is (epsilon, delta)-DP.

    Balle & Wang (2018), Alg. 1 / Thm 8, solved here for mu = Delta / sigma by the
    safeguarded Newton iteration (vectorised: one call calibrates a million
    per-token budgets). The returned sigma always satisfies
    ``gaussian_delta(epsilon, sigma, sensitivity) <= delta``; it is computed for
    ``epsilon`` lowered by ~1e-10 relative (:func:`_calibration_target`) so that ``gaussian_epsilon(sigma, delta)`` never
    exceeds ``epsilon`` after rounding. Valid for every epsilon > 0, unlike
    :func:`classic_gaussian_sigma`.

    Arrays are calibrated in fixed-size blocks, so the working memory beyond the
    inputs and the output is bounded (~12 MB per thread) whatever their size; the
    result is the same, bit for bit, for every block size and thread count.
    ``out`` (a writable C-contiguous float64 array of the broadcast shape, e.g. a
    ``numpy.memmap``) receives the sigmas instead of a new array and is returned,
    so 10^8 budgets can be calibrated from one memory-mapped file into another.
    """
    if (
        out is None
        and _plain_number(epsilon)
        and _plain_number(delta)
        and _plain_number(sensitivity)
        and epsilon > 0
        and 0 < delta < 1
        and sensitivity > 0
    ):
        try:
            return _s_sigma(float(epsilon), float(delta), float(sensitivity))
        except (_LeaveFastPath, ZeroDivisionError, OverflowError, ValueError, FloatingPointError):
            pass  # the vectorised code below answers (and raises the typed errors)
    eps = check_positive("epsilon", epsilon)
    dlt = check_delta("delta", delta)
    sens = check_positive("sensitivity", sensitivity)
    names = ("epsilon", "delta", "sensitivity")
    try:
        shape = np.broadcast_shapes(*(np.shape(a) for a in (eps, dlt, sens)))
    except ValueError:
        broadcast_together(names, eps, dlt, sens)  # raises the typed error naming the shapes
        raise
    scalar = all(np.ndim(a) == 0 for a in (eps, dlt, sens)) and out is None
    if out is None:
        result = np.empty(shape, dtype=np.float64)
    else:
        result = _check_out(out, shape)
    flats = [_flat_operand(a, shape) for a in (eps, dlt, sens)]
    first_bad = _calibrate_blocks(*flats, result.reshape(-1), _WORKERS)
    if first_bad >= 0:
        e, d, s = (float(f[first_bad] if f.size > 1 else f[0]) for f in flats)
        raise InvalidParameterError(
            f"no finite positive sigma reaches epsilon={e!r}, delta={d!r} (sensitivity={s!r}) in floating point; "
            "use a smaller epsilon or a smaller sensitivity."
        )
    return float(result.reshape(-1)[0]) if scalar else result


def _check_out(out: Any, shape: tuple[int, ...]) -> np.ndarray:
    if not isinstance(out, np.ndarray) or out.dtype != np.float64 or not out.flags.c_contiguous:
        raise InvalidParameterError(
            "out must be a C-contiguous float64 numpy array (or numpy.memmap); "
            f"got {type(out).__name__}{'' if not isinstance(out, np.ndarray) else ' of dtype ' + str(out.dtype)}."
        )
    if out.shape != shape:
        raise InvalidParameterError(f"out must have the broadcast shape {shape} of epsilon, delta and sensitivity; got {out.shape}.")
    if not out.flags.writeable:
        raise InvalidParameterError("out must be writable (open a memmap with mode 'w+' or 'r+').")
    return out


def gaussian_sigma_stream(epsilons: Iterable[Any], delta: Any, sensitivity: Any = 1.0) -> Iterator[np.ndarray]:
    """Calibrate a stream of budget chunks: yields :func:`gaussian_sigma` of each chunk, in order.

    For token streams that never exist as one array; each yielded sigma is the one
    :func:`gaussian_sigma` gives that budget in any other call (bit for bit).
    """
    for chunk in epsilons:
        yield np.asarray(gaussian_sigma(chunk, delta, sensitivity), dtype=np.float64)


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


# ---------------------------------------------------------------------------
# one scalar calibration without array overhead
# ---------------------------------------------------------------------------
# A call with three numbers spends ~0.4 ms on numpy's per-array overhead (hundreds of
# ufunc calls on 1-element arrays, index gathers, error-state contexts). The functions
# below repeat the vectorised calibration for one budget with Python floats: every
# elementary step is the same IEEE operation in the same order (+, -, *, / and sqrt are
# correctly rounded in both), and every transcendental function is the *same* numpy or
# scipy ufunc (numpy's exp and log are its own SIMD code, not the C library's, so
# ``math.exp`` could differ in the last bit). Whenever a step leaves the ordinary path
# (a division by zero, a non-finite value, a rare branch such as the tiny-epsilon
# re-solve or a failed verification), the scalar code gives up and the vectorised code
# answers. So a scalar call returns exactly the bits of the vectorised calibration;
# the tests compare the two on thousands of random budgets.
class _LeaveFastPath(Exception):
    """The budget needs a branch that only the vectorised calibration implements."""


_TINY = float(np.finfo(float).tiny)
_C = float(_LOG_SQRT_2PI)
_8U = 8.0 * _UNIT_ROUNDOFF
_12U = 12.0 * _UNIT_ROUNDOFF
_4U = 4.0 * _UNIT_ROUNDOFF
_SQRT2_2 = float(2.0 * np.sqrt(2.0))
_np_exp, _np_log, _np_expm1, _np_log1p = np.exp, np.log, np.expm1, np.log1p


def _exp(x: float) -> float:
    """numpy's exp of one float; an argument that would overflow (and warn) leaves the fast path."""
    if x > 709.0:
        raise _LeaveFastPath
    return float(_np_exp(x))


def _finite(x: float) -> float:
    if not math.isfinite(x):
        raise _LeaveFastPath
    return x


def _s_log_delta(eps: float, mu: float) -> tuple[float, float, float]:
    """:func:`_log_delta_x1` for one (epsilon, mu): ``(log delta, b, x1)``."""
    ratio = eps / mu
    half = mu / 2.0
    x1 = half - ratio
    x2 = -half - ratio
    a = float(log_ndtr(x1))
    log_phi2 = float(log_ndtr(x2))
    b = eps + log_phi2
    t = half + ratio
    err = (abs(a) + abs(b) + eps + (2.0 * t) * (t + 1.0)) * _8U
    diff = (b - a) - err
    lam1 = _exp(-0.5 * x1 * x1 - _C - a)
    lam2 = _exp(-0.5 * x2 * x2 - _C - log_phi2)
    trap = (0.5 * mu) * (lam1 + lam2)
    exp_error = (max(x1 * x1, x2 * x2) + abs(log_phi2) + 1.0) * _8U
    exp_error = (exp_error + _12U) * trap + ((abs(x1) + abs(x2) + 2.0) * mu + eps) * _4U
    bound = (eps - trap) - exp_error
    _finite(diff)
    _finite(bound)
    diff = max(diff, bound)
    if diff < 0:
        if diff > -_LOG_2:
            return a + float(_np_log(-float(_np_expm1(diff)))), b, x1
        return a + float(_np_log1p(-_exp(diff))), b, x1
    return a, b, x1


def _s_mills_log(t1: float, t2: float, mu: float) -> tuple[float, float]:
    """``log(mu) - log(t1 t2)`` of the Mills-ratio starts; where numpy's value would be NaN the start is not used."""
    if not t1 * t2 > 0 or not mu > 0:
        raise _NoStart if (t1 * t2 < 0 or mu < 0) else _LeaveFastPath
    return float(_np_log(mu)), float(_np_log(t1 * t2))


class _NoStart(Exception):
    """A NaN in the Mills-ratio start: the vectorised code keeps the safe point (NaN persists to its end)."""


def _s_asymptotic_mu(eps: float, log_target: float, mu0: float) -> float:
    """:func:`_asymptotic_mu` for one budget."""
    mu = mu0
    try:
        for _ in range(3):
            ratio = eps / mu
            half = mu / 2.0
            t1 = ratio - half
            t2 = ratio + half
            log_mu, log_t = _s_mills_log(t1, t2, mu)
            f = -0.5 * t1 * t1 - _C + log_mu - log_t - log_target
            q = -(eps / (mu * mu))
            dt1 = q - 0.5
            dt2 = q + 0.5
            df = -t1 * dt1 + 1.0 / mu - dt1 / t1 - dt2 / t2
            mu = _finite(mu - f / df)
    except _NoStart:
        return mu0
    t1 = eps / mu - mu / 2.0
    return mu if (mu > mu0 and t1 > 2.0) else mu0


def _s_asymptotic_epsilon(mu: float, log_target: float, eps0: float) -> float:
    """:func:`_asymptotic_epsilon` for one budget."""
    eps = eps0
    try:
        for _ in range(3):
            t1 = eps / mu - mu / 2.0
            t2 = eps / mu + mu / 2.0
            log_mu, log_t = _s_mills_log(t1, t2, mu)
            f = -0.5 * t1 * t1 - _C + log_mu - log_t - log_target
            df = -t1 / mu - 1.0 / (mu * t1) - 1.0 / (mu * t2)
            eps = _finite(eps - f / df)
    except _NoStart:
        return eps0
    t1 = eps / mu - mu / 2.0
    return eps if (eps > 0 and eps < eps0 and t1 > 2.0) else eps0


def _s_solve(
    fun: Callable[[float], tuple[float, float, float]], x0: float, unsafe0: float, start: float, toward_safe: float
) -> float:
    """:func:`_solve_safe_root` for one element: ``(result before its verification, verified safe end)``."""
    safe, unsafe, x = x0, unsafe0, start
    for _ in range(100):
        g, g1, g2 = fun(x)
        if g <= 0:
            safe = x
        else:
            unsafe = x
        newton = g / g1
        correction = 0.5 * newton * g2 / g1
        step = newton / (1.0 - correction) if abs(correction) < 0.5 else newton
        candidate = x - step
        lo, hi = min(safe, unsafe), max(safe, unsafe)
        scale = max(abs(x), _TINY)
        bad = not math.isfinite(candidate) or candidate <= lo or candidate >= hi
        close = not bad and abs(step) <= 1e-6 * scale
        bounded = math.isfinite(unsafe)
        if bad:
            if not bounded:
                candidate = 2.0 * abs(safe) + _TINY
            elif lo > 0 and hi > 4.0 * lo:
                candidate = math.sqrt(lo) * math.sqrt(hi)
            else:
                candidate = 0.5 * (safe + unsafe)
        if close:
            return candidate + toward_safe * _RTOL * scale, safe
        if bounded and hi - lo <= _RTOL * max(abs(safe), _TINY):
            return safe, safe
        x = _finite(candidate)
    return safe, safe


def _s_verified(found: tuple[float, float], excess: Callable[[float], float], toward_safe: float) -> float:
    """The verification of :func:`_solve_safe_root`: nudge toward the safe side until ``excess <= 0``."""
    result, safe = found
    for k in range(12):
        if excess(result) <= 0:
            return result
        result = result + toward_safe * (_RTOL * 4.0**k * max(abs(result), _TINY))
    return safe


def _s_epsilon_within(mu: float, delta: float, log_target: float, z: float, eps: float) -> bool:
    """``_epsilon_from_mu(mu, delta) <= eps`` for one element (the check of :func:`_calibrated_mu`)."""
    at_zero, _, _ = _s_log_delta(0.0, mu)
    if not at_zero > log_target:
        return 0.0 <= eps
    eps0 = _finite(max(mu * z + 0.5 * mu * mu, 0.0))

    def fun(e: float) -> tuple[float, float, float]:
        log_d, log_b, x1 = _s_log_delta(e, mu)
        d1 = -_exp(log_b - log_d)
        d2 = d1 + _exp(-0.5 * x1 * x1 - _C - log_d) / mu - d1 * d1
        return log_d - log_target, d1, d2

    def excess(e: float) -> float:
        return _exp(_s_log_delta(e, mu)[0]) - delta

    found = _s_solve(fun, eps0, 0.0, _s_asymptotic_epsilon(mu, log_target, eps0), 1.0)
    return _s_verified(found, excess, 1.0) <= eps


def _s_sigma(eps: float, delta: float, sens: float) -> float:
    """:func:`gaussian_sigma` of one budget (Python floats in range), or :class:`_LeaveFastPath`."""
    log_target = float(_np_log(delta))
    z = -float(ndtri(delta))
    mu_tv = _SQRT2_2 * float(erfinv(delta)) * (1.0 - 1e-12)
    e = eps * (1.0 - _CALIBRATION_MARGIN)
    root = math.sqrt(z * z + 2.0 * e)
    mu_tail = 2.0 * e / (z + root) if z > 0 else root - z
    mu0 = _finite(max(mu_tail, mu_tv))

    def fun(x: float) -> tuple[float, float, float]:
        log_d, _, x1 = _s_log_delta(e, x)
        d1 = _exp(-0.5 * x1 * x1 - _C - log_d)
        d2 = -x1 * (0.5 + e / (x * x)) * d1 - d1 * d1
        return log_d - log_target, d1, d2

    def excess(m: float) -> float:
        # verification at the requested epsilon, of the sigma that is returned
        return _exp(_s_log_delta(eps, sens / (sens / m))[0]) - delta

    mu = _s_verified(_s_solve(fun, mu0, math.inf, _s_asymptotic_mu(e, log_target, mu0), -1.0), excess, -1.0)
    sigma = sens / mu
    if not (math.isfinite(sigma) and sigma > 0):
        raise _LeaveFastPath  # the vectorised code raises the typed error
    reported = sens / sigma
    if 4e-15 * (1.0 + abs(log_target)) > 1e-3 * _CALIBRATION_MARGIN * eps:
        # tiny epsilon: _calibrated_mu checks the round trip and re-solves if it fails
        if not _s_epsilon_within(reported, delta, log_target, z, eps):
            raise _LeaveFastPath
    return sigma


def _plain_number(x: Any) -> bool:
    """A Python or numpy float, or a Python int, that is finite as a float64 (anything else: the general path)."""
    if not (type(x) is float or type(x) is int or isinstance(x, (np.float64, np.float32, np.float16))):
        return False
    try:
        return math.isfinite(float(x))
    except OverflowError:  # an int beyond float64
        return False
