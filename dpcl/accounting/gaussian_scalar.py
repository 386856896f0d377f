"""One scalar Gaussian calibration without numpy's per-array overhead (the fast path of
:func:`dpcl.accounting.gaussian.gaussian_sigma`), checked against the vectorised one."""

from __future__ import annotations


import math
from typing import Any, Callable

import numpy as np
from scipy.special import erfinv, log_ndtr, ndtri

from dpcl.accounting.gaussian_profile import _CALIBRATION_MARGIN, _LOG_2, _LOG_SQRT_2PI, _UNIT_ROUNDOFF
from dpcl.accounting.gaussian_roots import _RTOL


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
