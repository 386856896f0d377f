"""The Gaussian privacy profile in log space, and the solvers built on it: epsilon for a delta, mu for an
(epsilon, delta) (:mod:`dpcl.accounting.gaussian` states the formulas and their sources)."""

from __future__ import annotations


from typing import Callable

import numpy as np
from scipy.special import erfinv, log_ndtr, ndtri

from dpcl.accounting.gaussian_roots import _solve_safe_root


_LOG_SQRT_2PI = 0.5 * np.log(2.0 * np.pi)
_LOG_2 = float(np.log(2.0))
_UNIT_ROUNDOFF = 2.0**-53
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


# Long by design: one pass of in-place array steps whose float operations and their order are pinned bit for bit
# by the calibration tests (and mirrored by dpcl.methods.gaussian_torch); splitting it would add temporaries.
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

