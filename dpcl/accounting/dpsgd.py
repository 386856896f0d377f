"""DP-SGD accounting: epsilon of a run, and the smallest noise multiplier for a target epsilon.

A DP-SGD run with noise multiplier z (noise std / clipping norm), Poisson
sampling rate q and T steps is T adaptive compositions of the Poisson-subsampled
Gaussian mechanism (Abadi et al. 2016, Alg. 1). Its epsilon comes from the
accountants of :mod:`dpcl.accounting.accountants` (dp-accounting PLD/RDP,
prv-accountant); the tests cross-check them with opacus' own accountants.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable

from dpcl.accounting.accountants import AccountingResult, _auto_epsilon, _check_accountant, compute_epsilon
from dpcl.accounting.events import (
    MAX_SAMPLED_STEPS,
    STEPS_HINT,
    Adjacency,
    PoissonSampledGaussianEvent,
    RepeatedEvent,
)
from dpcl.accounting.validation import check_count, check_delta_scalar, check_positive_scalar, check_sample_rate
from dpcl.errors import InvalidParameterError

__all__ = ["NoiseCalibration", "dpsgd_epsilon", "dpsgd_events", "dpsgd_noise_multiplier"]

#: Noise multipliers searched by :func:`dpsgd_noise_multiplier`.
MIN_NOISE_MULTIPLIER = 1e-3
MAX_NOISE_MULTIPLIER = 1e4


def dpsgd_events(
    noise_multiplier: float,
    sample_rate: float,
    steps: int,
    adjacency: Adjacency | str = "add_remove",
    unit: str = "example",
) -> RepeatedEvent:
    """The events of a DP-SGD run: ``steps`` repetitions of one Poisson-subsampled Gaussian step."""
    step = PoissonSampledGaussianEvent(
        noise_multiplier=noise_multiplier, sample_rate=sample_rate, adjacency=adjacency, unit=unit
    )
    return RepeatedEvent(step, _check_steps(steps))


def _check_steps(steps: Any) -> int:
    return check_count("steps", steps, maximum=MAX_SAMPLED_STEPS, hint=STEPS_HINT)


def dpsgd_epsilon(
    noise_multiplier: float,
    sample_rate: float,
    steps: int,
    delta: float,
    accountant: str = "auto",
    adjacency: Adjacency | str = "add_remove",
    unit: str = "example",
) -> AccountingResult:
    """Upper bound on epsilon of a DP-SGD run at ``delta`` (see :func:`compute_epsilon`)."""
    return compute_epsilon(dpsgd_events(noise_multiplier, sample_rate, steps, adjacency, unit), delta, accountant)


@dataclass(frozen=True)
class NoiseCalibration:
    """Result of :func:`dpsgd_noise_multiplier`: the noise multiplier, the epsilon it achieves, the accountant."""

    noise_multiplier: float
    epsilon: float
    accountant: str
    delta: float = 0.0
    sample_rate: float = 1.0
    steps: int = 1

    def to_dict(self) -> dict[str, Any]:
        return {
            "noise_multiplier": self.noise_multiplier,
            "epsilon": self.epsilon,
            "accountant": self.accountant,
            "delta": self.delta,
            "sample_rate": self.sample_rate,
            "steps": self.steps,
        }


def dpsgd_noise_multiplier(
    target_epsilon: float,
    delta: float,
    sample_rate: float,
    steps: int,
    accountant: str = "auto",
    adjacency: Adjacency | str = "add_remove",
    rtol: float = 1e-3,
) -> NoiseCalibration:
    """Smallest noise multiplier (to ``rtol`` relative) whose DP-SGD run is (target_epsilon, delta)-DP.

    Brackets the root of log epsilon(z) - log target by secant steps in log z, then
    shrinks the bracket by the Illinois variant of regula falsi (a bisection-type
    method that keeps the root bracketed and converges superlinearly) until its
    width is below ``rtol * z``. The returned z is the upper end of the bracket,
    whose epsilon was computed and is <= ``target_epsilon``; that epsilon is returned.
    The search covers [MIN_NOISE_MULTIPLIER, MAX_NOISE_MULTIPLIER]: a target that
    needs more noise is refused; one met with less stops the search at the last
    multiplier tried (within x8 of the minimum), which meets it but is not the smallest.

    With ``accountant="auto"`` (the default) every evaluation is ``auto``'s tightest sound bound;
    its PLD interval is refined once (at z = 1, to a 0.2 % change) and then held fixed during the
    search (a fixed pessimistic interval is still an upper bound); at the multiplier found the
    refinement is repeated, and the search is redone at the finer interval if it asks for one.
    """
    target = check_positive_scalar("target_epsilon", target_epsilon)
    delta = check_delta_scalar("delta", delta)
    q = check_sample_rate("sample_rate", sample_rate)
    steps = _check_steps(steps)
    PoissonSampledGaussianEvent(noise_multiplier=1.0, sample_rate=q)  # the same limits as the events searched
    name = _check_accountant(accountant)
    rtol = check_positive_scalar("rtol", rtol)
    if rtol >= 0.5:
        raise InvalidParameterError(f"rtol must be < 0.5, got {rtol!r}.")

    pld_interval: float | None = None

    def evaluate(z: float) -> AccountingResult:
        if name != "auto":
            return dpsgd_epsilon(z, q, steps, delta, name, adjacency)
        events = dpsgd_events(z, q, steps, adjacency)
        if pld_interval is None:
            return _auto_epsilon(events, delta, tolerance=CALIBRATION_PLD_TOLERANCE)[0]
        return _auto_epsilon(events, delta, pld_interval=pld_interval)[0]

    if name == "auto":
        _, pld_interval = _auto_epsilon(dpsgd_events(1.0, q, steps, adjacency), delta, tolerance=CALIBRATION_PLD_TOLERANCE)
    z, result = _search(evaluate, target, delta, q, steps, rtol)
    if name == "auto" and pld_interval is not None:
        refined, finer = _auto_epsilon(dpsgd_events(z, q, steps, adjacency), delta, tolerance=CALIBRATION_PLD_TOLERANCE)
        if finer is not None and finer < pld_interval / 1.9:
            pld_interval = finer
            z, result = _search(evaluate, target, delta, q, steps, rtol)
        elif refined.epsilon < result.epsilon:
            result = refined
    if name == "auto":
        # what every consumer computes is plain auto at z: it must meet the target too
        for _ in range(50):
            plain = dpsgd_epsilon(z, q, steps, delta, "auto", adjacency)
            if plain.epsilon <= target:
                result = plain
                break
            z *= 1.0 + rtol
    return _calibration(z, result, q, steps)


#: ``auto`` calibration refines its PLD until one refinement changes epsilon by at most this.
CALIBRATION_PLD_TOLERANCE = 0.002


def _search(
    evaluate: Callable[[float], AccountingResult], target: float, delta: float, q: float, steps: int, rtol: float,
) -> tuple[float, AccountingResult]:
    """The root search of :func:`dpsgd_noise_multiplier`: (z, its accounting result)."""
    cache: dict[float, AccountingResult] = {}

    def eps_of(z: float) -> float:
        if z not in cache:
            cache[z] = evaluate(z)
        return cache[z].epsilon

    def f(z: float) -> float:
        e = eps_of(z)
        return math.log(e / target) if e > 0 else -math.inf

    # Bracket the root. log epsilon is close to linear in log z, so each new
    # point extrapolates the secant (slope -1 to start), moving at most x8.
    x_prev, f_prev = 0.0, f(1.0)
    slope = -1.0
    while True:
        if math.isfinite(f_prev):
            step = max(min(-f_prev / slope, math.log(8.0)), -math.log(8.0))
        else:  # f = -inf: epsilon 0 (delta covers the whole curve), far too much noise, so go down
            step = math.log(8.0) if f_prev > 0 else -math.log(8.0)
        if step == 0.0:
            step = math.log1p(rtol) * (1.0 if f_prev > 0 else -1.0)
        x_new = x_prev + step
        z_new = math.exp(x_new)
        if z_new < MIN_NOISE_MULTIPLIER:
            # epsilon <= target even with (almost) no noise: the smallest searched value is returned
            return math.exp(x_prev), cache[math.exp(x_prev)]
        if z_new > MAX_NOISE_MULTIPLIER:
            raise InvalidParameterError(
                f"target_epsilon={target!r} is not reachable with noise multipliers up to {MAX_NOISE_MULTIPLIER:g} "
                f"(sample_rate={q!r}, steps={steps}, delta={delta!r}); raise the target or lower the steps."
            )
        f_new = f(z_new)
        if (f_new > 0) != (f_prev > 0):
            break
        if math.isfinite(f_new) and math.isfinite(f_prev) and f_new != f_prev:
            slope = min((f_new - f_prev) / (x_new - x_prev), -1e-3)
        x_prev, f_prev = x_new, f_new
    lo, hi = (math.exp(x_prev), z_new) if f_prev > 0 else (z_new, math.exp(x_prev))
    # Illinois regula falsi on (log z, f): f(lo) > 0 >= f(hi)
    x_lo, x_hi = math.log(lo), math.log(hi)
    f_lo, f_hi = f(lo), f(hi)
    side = 0
    for _ in range(100):
        if x_hi - x_lo <= math.log1p(rtol):
            break
        if math.isfinite(f_lo) and math.isfinite(f_hi) and f_lo != f_hi:
            x = x_hi - f_hi * (x_hi - x_lo) / (f_hi - f_lo)
        else:
            x = 0.5 * (x_lo + x_hi)
        # keep strictly inside, at least 1/32 of the width away from the ends
        width = x_hi - x_lo
        x = min(max(x, x_lo + width / 32.0), x_hi - width / 32.0)
        fx = f(math.exp(x))
        if fx > 0:
            x_lo, f_lo = x, fx
            if side == -1:
                f_hi /= 2.0
            side = -1
        else:
            x_hi, f_hi = x, fx
            if side == 1:
                f_lo /= 2.0
            side = 1
    z = math.exp(x_hi)
    if z not in cache:  # exp(log z) round trip
        eps_of(z)
    return z, cache[z]


def _calibration(z: float, result: AccountingResult, q: float, steps: int) -> NoiseCalibration:
    return NoiseCalibration(
        noise_multiplier=z, epsilon=result.epsilon, accountant=result.accountant,
        delta=result.delta, sample_rate=q, steps=steps,
    )
