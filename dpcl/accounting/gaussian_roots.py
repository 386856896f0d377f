"""Safeguarded root finding on arrays for the Gaussian calibration (:mod:`dpcl.accounting.gaussian`): every root
is returned on the *safe* side, verified."""

from __future__ import annotations


from typing import Callable

import numpy as np



#: Relative tolerance at which the Newton iterations stop (a few ulps of a float64).
_RTOL = 1e-13


# ---------------------------------------------------------------------------
# safeguarded root finding on arrays
# ---------------------------------------------------------------------------
# Long by design: one safeguarded Halley iteration whose bracket, step and verification state is shared across
# the loop; its arithmetic is pinned bit for bit by the calibration tests (and mirrored by dpcl.methods.gaussian_torch).
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

