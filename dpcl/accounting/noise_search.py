"""The noise-multiplier search of the DP-SGD calibrations (:mod:`dpcl.accounting.dpsgd`): a bracketing root search
in log z whose upper end is an evaluated multiplier that meets the target."""

from __future__ import annotations

import math
from typing import Any, Callable

from dpcl.accounting import work as _work
from dpcl.errors import InvalidParameterError

__all__ = ["search_noise_multiplier"]


def search_noise_multiplier(
    evaluate: Callable[[float], Any], target: float, delta: float, q: float, steps: int, rtol: float,
    start: float = 1.0, slope: float = -1.0, seed: dict[float, Any] | None = None,
    z_range: tuple[float, float] = (1e-3, 1e4),
) -> tuple[float, Any, float]:
    """The root search of :func:`~dpcl.accounting.dpsgd.dpsgd_noise_multiplier`: (z, its evaluation, the last slope
    estimate), z searched in ``z_range``.

    ``f(x) = log(epsilon(e^x) / target)`` is decreasing and close to linear in x = log z. The search
    keeps the largest x evaluated with f > 0 (``lo``: too little noise) and the smallest with f <= 0
    (``hi``: meets the target) and stops when both exist and hi - lo <= log(1 + rtol); z = e^hi is
    returned. Each step predicts the root by a secant through the last two points (or the
    current slope, or regula falsi on the bracket when the secant leaves it) and evaluates a
    quarter of the tolerance beyond it, on the side the bracket still needs; unbracketed steps
    move at most x8, a bracket that does not halve in three steps is bisected. ``seed`` holds
    evaluations already made. Hand-written because the root is wanted as a *bracket* in log z
    whose upper end is an evaluated multiplier, with few evaluations of a costly, slightly noisy
    function; scipy's brentq returns a point without that guarantee.
    """
    cache: dict[float, Any] = dict(seed or {})
    tol = math.log1p(rtol)
    x_min, x_max = math.log(z_range[0]), math.log(z_range[1])
    jump = math.log(8.0)

    def f(z: float) -> float:
        if z not in cache:
            _work.checkpoint()  # the calibration's processor-time budget (dpcl.accounting.work)
            cache[z] = evaluate(z)
        e = cache[z].epsilon
        return math.log(e / target) if e > 0 else -math.inf

    lo: tuple[float, float, float] | None = None  # (x, f, z) with f > 0
    hi: tuple[float, float, float] | None = None  # (x, f, z) with f <= 0
    last: tuple[float, float] | None = None
    widths: list[float] = []
    z = start
    for _ in range(200):
        x = math.log(z)
        fx = f(z)
        if fx > 0:
            if lo is None or x > lo[0]:
                lo = (x, fx, z)
        elif hi is None or x < hi[0]:
            hi = (x, fx, z)
        if last is not None and math.isfinite(fx) and math.isfinite(last[1]) and x != last[0] and fx != last[1]:
            slope = min((fx - last[1]) / (x - last[0]), -1e-3)
        last = (x, fx)
        if lo is not None and hi is not None:
            if hi[0] - lo[0] <= tol:
                break
            x_new = _bracketed_step(x, fx, lo, hi, slope, tol, widths)
        else:
            x_new = _unbracketed_step(x, fx, slope, tol, jump)
            if x_new < x_min:
                if hi is not None and lo is None:
                    # epsilon <= target even with (almost) no noise: the smallest searched value is returned
                    return hi[2], cache[hi[2]], slope
                x_new = x_min
            if x_new > x_max:
                if x >= x_max or (lo is not None and lo[0] >= x_max):
                    raise InvalidParameterError(
                        f"target_epsilon={target!r} is not reachable with noise multipliers up to "
                        f"{z_range[1]:g} (sample_rate={q!r}, steps={steps}, delta={delta!r}); raise the "
                        "target or lower the steps."
                    )
                x_new = x_max
        z = math.exp(x_new)
    if hi is None:  # pragma: no cover - 200 steps of at least a bisection always bracket within the range
        raise InvalidParameterError(f"the noise-multiplier search for target_epsilon={target!r} did not converge.")
    return hi[2], cache[hi[2]], slope


def _bracketed_step(x: float, fx: float, lo: tuple[float, ...], hi: tuple[float, ...], slope: float, tol: float,
                    widths: list[float]) -> float:
    """:func:`search_noise_multiplier`'s next x inside the bracket ``(lo, hi)`` (``widths``: the bracket's widths so far)."""
    width = hi[0] - lo[0]
    widths.append(width)
    if math.isfinite(fx):
        predicted = x - fx / slope
    else:
        predicted = math.nan
    if not lo[0] < predicted < hi[0]:
        if math.isfinite(lo[1]) and math.isfinite(hi[1]) and lo[1] != hi[1]:
            predicted = hi[0] - hi[1] * width / (hi[1] - lo[1])
        else:
            predicted = 0.5 * (lo[0] + hi[0])
    # aim past the predicted root, toward the end of the bracket that is farther from it
    aim = predicted + tol / 4.0 if predicted - lo[0] <= hi[0] - predicted else predicted - tol / 4.0
    if len(widths) >= 4 and widths[-1] > widths[-4] / 2.0:
        aim = 0.5 * (lo[0] + hi[0])  # the secant is not closing the bracket: bisect
        widths.clear()
    return min(max(aim, lo[0] + width / 32.0), hi[0] - width / 32.0)


def _unbracketed_step(x: float, fx: float, slope: float, tol: float, jump: float) -> float:
    """:func:`search_noise_multiplier`'s next x before a bracket exists: along the slope, at most ``jump`` either way."""
    if math.isfinite(fx):
        step = -fx / slope + (tol / 4.0 if fx > 0 else -tol / 4.0)
        step = max(min(step, jump), -jump)
    else:  # epsilon 0 (delta covers the whole curve): far too much noise, go down
        step = -jump
    return x + step
