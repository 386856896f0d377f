"""Analytic Gaussian calibration of per-token budgets on torch tensors (CUDA when present).

:func:`gaussian_sigma_torch` is a port of :func:`dpcl.accounting.gaussian.gaussian_sigma`
(Balle & Wang 2018, Thm 8; the accounting layer never imports torch, so the port lives
here) for budgets that are already tensors, or too many for the CPU: the *same*
vectorised algorithm, step for step, with ``torch.special.log_ndtr`` in float64:

* the privacy profile in log space with the same float-error lower bound on
  ``b - a`` and the same trapezoid bound (:func:`dpcl.accounting.gaussian._log_delta`);
* the same safe starting points (tail bound, total-variation point), the same
  Mills-ratio start, the same safeguarded Halley iteration that keeps a bracket,
  stops at 1e-6 relative steps and moves 1e-13 toward the safe side;
* the same final verification: each returned sigma is checked, at the requested
  epsilon, to give ``delta(sigma) <= delta`` (nudged toward more noise otherwise), and
  the same round-trip check and re-solve for tiny epsilon.

So every sigma carries the guarantee the numpy version gives, with torch's
``log_ndtr``/``exp``/``log`` in place of scipy's and numpy's. Those functions may
differ from numpy's in the last bits, so the sigmas agree with
``gaussian_sigma`` to rounding (the tests bound the relative difference by 1e-9 and
check soundness in mpmath), not bit for bit; use ``gaussian_sigma`` where bit
identity with the CPU reference matters.

Large inputs are processed in blocks of ``block`` budgets: a CPU tensor or numpy
array (a ``numpy.memmap`` too) is streamed to the device block by block and the
sigmas come back into ``out``, so 10^8 budgets need no more device memory than one
block's working set (~0.5 KB per budget of a block).
"""

from __future__ import annotations

import math
from typing import Any, Callable

import numpy as np
import torch

from dpcl.accounting.gaussian import (
    _CALIBRATION_MARGIN,
    _LOG_SQRT_2PI,
    _RTOL,
    _UNIT_ROUNDOFF,
    _delta_terms,
)
from dpcl.errors import InvalidParameterError

__all__ = ["gaussian_sigma_torch"]

_LOG_2 = math.log(2.0)
_TINY = float(np.finfo(float).tiny)
_SQRT8 = 2.0 * math.sqrt(2.0)
_F64 = torch.float64
#: Budgets per device block (~0.5 KB of working memory per budget: ~2 GB at this size).
BLOCK = 1 << 22

Fun = Callable[[torch.Tensor, Any], tuple[torch.Tensor, torch.Tensor, torch.Tensor]]
Verify = Callable[[torch.Tensor, Any], torch.Tensor]


# ---------------------------------------------------------------------------
# privacy profile (Balle & Wang 2018, Thm 8) in log space: _log_delta_x1
# ---------------------------------------------------------------------------
def _log_delta_x1(eps: torch.Tensor, mu: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(log of an upper bound on delta(eps; mu), log(exp(eps) Phi(-mu/2 - eps/mu)), mu/2 - eps/mu)``.

    The same expressions, in the same order, as :func:`dpcl.accounting.gaussian._log_delta_x1`
    (whose docstring derives both lower bounds on ``b - a``).
    """
    u8, u12, u4 = 8.0 * _UNIT_ROUNDOFF, 12.0 * _UNIT_ROUNDOFF, 4.0 * _UNIT_ROUNDOFF
    ratio = eps / mu
    half = mu / 2.0
    x1 = half - ratio
    x2 = -half - ratio
    a = torch.special.log_ndtr(x1)
    log_phi2 = torch.special.log_ndtr(x2)
    b = eps + log_phi2
    t = half + ratio
    err = (((a.abs() + b.abs()) + eps) + (t * 2.0) * (t + 1.0)) * u8
    diff = (b - a) - err
    lam1 = torch.exp(((-0.5 * x1) * x1 - _LOG_SQRT_2PI) - a)
    lam2 = torch.exp(((-0.5 * x2) * x2 - _LOG_SQRT_2PI) - log_phi2)
    trap = (0.5 * mu) * (lam1 + lam2)
    exp_error = ((torch.maximum(x1 * x1, x2 * x2) + log_phi2.abs()) + 1.0) * u8
    exp_error = (exp_error + u12) * trap + (((x1.abs() + x2.abs()) + 2.0) * mu + eps) * u4
    bound = (eps - trap) - exp_error
    diff = torch.fmax(diff, bound)
    negative = diff < 0
    near = negative & (diff > -_LOG_2)
    far = negative & ~near
    log1mexp = torch.where(near, torch.log(-torch.expm1(diff)), torch.zeros_like(diff))
    log1mexp = torch.where(far, torch.log1p(-torch.exp(diff)), log1mexp)
    log_delta = torch.where(negative, a + log1mexp, a)
    return log_delta, b, x1


# ---------------------------------------------------------------------------
# safeguarded root finding: _solve_safe_root
# ---------------------------------------------------------------------------
def _solve_safe_root(
    fun: Fun,
    x0: torch.Tensor,
    unsafe0: torch.Tensor,
    *,
    increasing: bool,
    start: torch.Tensor,
    verify: Verify,
    max_iter: int = 100,
) -> torch.Tensor:
    """Per element an ``x`` with ``g(x) <= 0`` (verified): :func:`dpcl.accounting.gaussian._solve_safe_root`."""
    safe = x0.clone()
    unsafe = unsafe0.clone()
    x = start.clone()
    result = safe.clone()
    toward_safe = -1.0 if increasing else 1.0
    n = x.numel()
    active = torch.arange(n, device=x.device)
    for _ in range(max_iter):
        if active.numel() == 0:
            break
        full = active.numel() == n
        sel: Any = slice(None) if full else active
        xa = x[sel]
        g, g1, g2 = fun(xa, sel)
        is_safe = g <= 0
        s_a = torch.where(is_safe, xa, safe[sel])
        u_a = torch.where(is_safe, unsafe[sel], xa)
        safe[sel] = s_a
        unsafe[sel] = u_a
        newton = g / g1
        correction = ((0.5 * newton) * g2) / g1
        newton_only = ~(correction.abs() < 0.5)
        step = torch.where(newton_only, newton, newton / (1.0 - correction))
        candidate = xa - step
        lo, hi = torch.minimum(s_a, u_a), torch.maximum(s_a, u_a)
        scale = torch.clamp_min(xa.abs(), _TINY)
        bad = ~torch.isfinite(candidate) | (candidate <= lo) | (candidate >= hi)
        close = (step.abs() <= 1e-6 * scale) & ~bad
        narrow = (hi - lo <= _RTOL * torch.clamp_min(s_a.abs(), _TINY)) & torch.isfinite(u_a)
        geometric = torch.sqrt(lo) * torch.sqrt(hi)
        wide = (lo > 0) & (hi > 4.0 * lo)
        bisect = torch.where(wide, geometric, 0.5 * (s_a + u_a))
        fallback = torch.where(torch.isfinite(u_a), bisect, 2.0 * s_a.abs() + _TINY)
        candidate = torch.where(bad, fallback, candidate)
        finished = close | narrow
        answer = torch.where(close, candidate + toward_safe * _RTOL * scale, s_a)
        result[sel] = torch.where(finished, answer, result[sel])
        x[sel] = candidate
        active = active[~finished]
    if active.numel():
        result[active] = safe[active]
    # verify every answer; nudge the (rare) failures toward the safe side
    check = torch.arange(n, device=x.device)
    for k in range(12):
        g = verify(result, slice(None)) if k == 0 else verify(result[check], check)
        failed = ~(g <= 0)
        if not bool(failed.any()):
            return result
        check = check[failed]
        nudge = _RTOL * 4.0**k * torch.clamp_min(result[check].abs(), _TINY)
        result[check] = result[check] + toward_safe * nudge
    result[check] = safe[check]
    return result


# ---------------------------------------------------------------------------
# epsilon for a mu (the tiny-epsilon round-trip check) and mu for an epsilon
# ---------------------------------------------------------------------------
def _mills_log_f(t1: torch.Tensor, t2: torch.Tensor, mu: torch.Tensor, log_target: torch.Tensor) -> torch.Tensor:
    return (((-0.5 * t1) * t1 - _LOG_SQRT_2PI) + torch.log(mu)) - torch.log(t1 * t2) - log_target


def _asymptotic_epsilon(mu: torch.Tensor, log_target: torch.Tensor, eps0: torch.Tensor) -> torch.Tensor:
    """:func:`dpcl.accounting.gaussian._asymptotic_epsilon`."""
    eps = eps0.clone()
    for _ in range(3):
        t1 = eps / mu - mu / 2.0
        t2 = eps / mu + mu / 2.0
        f = _mills_log_f(t1, t2, mu, log_target)
        df = ((-t1 / mu) - 1.0 / (mu * t1)) - 1.0 / (mu * t2)
        eps = eps - f / df
    t1 = eps / mu - mu / 2.0
    ok = torch.isfinite(eps) & (eps > 0) & (eps < eps0) & (t1 > 2.0)
    return torch.where(ok, eps, eps0)


def _epsilon_from_mu(mu: torch.Tensor, delta: torch.Tensor) -> torch.Tensor:
    """Smallest epsilon >= 0 with delta(epsilon; mu) <= delta: :func:`dpcl.accounting.gaussian._epsilon_from_mu`."""
    out = torch.zeros_like(mu)
    log_target = torch.log(delta)
    at_zero, _, _ = _log_delta_x1(torch.zeros_like(mu), mu)
    need = at_zero > log_target
    infinite = need & torch.isinf(mu)
    out[infinite] = math.inf
    need &= ~infinite
    if not bool(need.any()):
        return out
    m, lt, target = mu[need], log_target[need], delta[need]
    z = -torch.special.ndtri(target)
    eps0 = torch.clamp_min(m * z + (0.5 * m) * m, 0.0)

    def fun(eps: torch.Tensor, idx: Any) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        mu_i = m[idx]
        log_d, log_b, _ = _log_delta_x1(eps, mu_i)
        x1 = mu_i / 2.0 - eps / mu_i
        d1 = -torch.exp(log_b - log_d)
        d2 = (d1 + torch.exp(((-0.5 * x1) * x1 - _LOG_SQRT_2PI) - log_d) / mu_i) - d1 * d1
        return log_d - lt[idx], d1, d2

    def verify(eps: torch.Tensor, idx: Any) -> torch.Tensor:
        return torch.exp(_log_delta_x1(eps, m[idx])[0]) - target[idx]

    start = _asymptotic_epsilon(m, lt, eps0)
    out[need] = _solve_safe_root(fun, eps0, torch.zeros_like(eps0), increasing=False, start=start, verify=verify)
    return out


def _asymptotic_mu(eps: torch.Tensor, log_target: torch.Tensor, mu0: torch.Tensor) -> torch.Tensor:
    """:func:`dpcl.accounting.gaussian._asymptotic_mu` (the same steps, literally)."""
    mu = mu0.clone()
    for _ in range(3):
        ratio = eps / mu
        half = mu / 2.0
        t1 = ratio - half
        t2 = ratio + half
        f = _mills_log_f(t1, t2, mu, log_target)
        dt1 = -(eps / (mu * mu))
        dt2 = dt1 + 0.5
        dt1 = dt1 - 0.5
        df = (((-t1) * dt1 + 1.0 / mu) - dt1 / t1) - dt2 / t2
        mu = mu - f / df
    t1 = eps / mu - mu / 2.0
    ok = torch.isfinite(mu) & (mu > mu0) & (t1 > 2.0)
    return torch.where(ok, mu, mu0)


def _mu_from_epsilon(
    eps: torch.Tensor, terms: tuple[torch.Tensor, torch.Tensor, torch.Tensor], verify: Verify
) -> torch.Tensor:
    """Largest mu (safe side) with delta(eps; mu) <= delta: :func:`dpcl.accounting.gaussian._mu_from_epsilon`."""
    log_target, z, mu_tv = terms
    root = torch.sqrt(z * z + 2.0 * eps)
    mu_tail = torch.where(z > 0, (2.0 * eps) / (z + root), root - z)
    mu0 = torch.maximum(mu_tail, mu_tv)

    def fun(mu: torch.Tensor, idx: Any) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        e = eps[idx]
        log_d, _, x1 = _log_delta_x1(e, mu)
        d1 = torch.exp(((-0.5 * x1) * x1 - _LOG_SQRT_2PI) - log_d)
        d2 = ((-x1) * (0.5 + e / (mu * mu))) * d1 - d1 * d1
        return log_d - log_target[idx], d1, d2

    start = _asymptotic_mu(eps, log_target, mu0)
    return _solve_safe_root(fun, mu0, torch.full_like(mu0, math.inf), increasing=True, start=start, verify=verify)


def _sigma_block(eps: torch.Tensor, delta: torch.Tensor, sens: torch.Tensor, terms: tuple[torch.Tensor, ...]) -> torch.Tensor:
    """sigma for one block of flat float64 tensors on one device: :func:`dpcl.accounting.gaussian._sigma_block`."""

    def returned_mu(mu: torch.Tensor, idx: Any) -> torch.Tensor:
        s = sens[idx]
        return s / (s / mu)

    def verify(mu: torch.Tensor, idx: Any) -> torch.Tensor:
        # the sigma that will be returned, at the requested epsilon (not the margin one)
        return torch.exp(_log_delta_x1(eps[idx], returned_mu(mu, idx))[0]) - delta[idx]

    mu = _mu_from_epsilon(eps * (1.0 - _CALIBRATION_MARGIN), terms, verify)  # type: ignore[arg-type]
    # tiny epsilon: check the round trip, re-solve the failures at the fully lowered target
    absolute = 4e-15 * (1.0 + terms[0].abs())
    check = torch.nonzero(absolute > 1e-3 * _CALIBRATION_MARGIN * eps).flatten()
    if check.numel():
        fails = ~(_epsilon_from_mu(returned_mu(mu[check], check), delta[check]) <= eps[check])
        redo = check[fails]
        if redo.numel():
            e, d = eps[redo], delta[redo]
            target = torch.maximum(e * (1.0 - _CALIBRATION_MARGIN) - 4e-15 * (1.0 + torch.log(d).abs()), 0.5 * e)
            sub_terms = tuple(t[redo] for t in terms)
            mu[redo] = _mu_from_epsilon(target, sub_terms, lambda m, j: verify(m, redo[j]))  # type: ignore[arg-type]
    return sens / mu


# ---------------------------------------------------------------------------
# public API
# ---------------------------------------------------------------------------
def _as_tensor(name: str, value: Any) -> torch.Tensor:
    if isinstance(value, torch.Tensor):
        if value.is_complex() or value.dtype == torch.bool:
            raise InvalidParameterError(f"{name} must be real numbers; got a tensor of dtype {value.dtype}.")
        return value
    try:
        array = np.asarray(value, dtype=np.float64)
    except (TypeError, ValueError) as exc:
        raise InvalidParameterError(f"{name} must be a number or an array of numbers; got {type(value).__name__}.") from exc
    return torch.from_numpy(array)


def _check(name: str, value: torch.Tensor, ok: torch.Tensor, what: str) -> None:
    if not bool(ok.all()):
        first = value.reshape(-1)[int(torch.nonzero(~ok.reshape(-1))[0])]
        raise InvalidParameterError(f"{name} must be {what}; got {float(first)!r}.")


def _delta_terms_on(delta: torch.Tensor, device: torch.device) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(log delta, -Phi^{-1}(delta), 2 sqrt(2) erfinv(delta) (1 - 1e-12))`` on ``device``.

    One delta for every budget (the usual case) is computed with numpy and scipy, the
    numbers the CPU calibration uses; a tensor of deltas with torch's functions.
    """
    if delta.numel() == 1:
        terms = _delta_terms(np.array([float(delta.reshape(-1)[0])]))
        return tuple(torch.tensor(float(t[0]), dtype=_F64, device=device) for t in terms)  # type: ignore[return-value]
    d = delta.to(device=device, dtype=_F64)
    return torch.log(d), -torch.special.ndtri(d), (_SQRT8 * torch.erfinv(d)) * (1.0 - 1e-12)


def gaussian_sigma_torch(
    epsilon: Any,
    delta: Any,
    sensitivity: Any = 1.0,
    *,
    device: str | torch.device | None = None,
    out: torch.Tensor | None = None,
    block: int = BLOCK,
) -> torch.Tensor:
    """Analytic Gaussian calibration on torch: the sigma of each (epsilon, delta, sensitivity), float64.

    ``epsilon > 0`` (a tensor, a numpy array or memmap, or a number), ``delta`` in (0, 1)
    and ``sensitivity > 0`` (l2, under the neighbouring relation in use) broadcast
    together. The work runs on ``device`` (default: ``epsilon``'s device if it is a
    tensor, else CUDA when available, else the CPU), ``block`` budgets at a time; the
    result is a float64 tensor of the broadcast shape on ``epsilon``'s device (the CPU
    for numpy input), or is written into ``out`` (a contiguous float64 tensor of that
    shape, on any device) and returned. Every sigma satisfies
    ``delta(epsilon; sensitivity / sigma) <= delta`` as verified in float64 (see the
    module docstring) and agrees with :func:`dpcl.accounting.gaussian.gaussian_sigma`
    to rounding.
    """
    eps = _as_tensor("epsilon", epsilon)
    dlt = _as_tensor("delta", delta)
    sens = _as_tensor("sensitivity", sensitivity)
    home = eps.device
    if device is None:
        device = home if isinstance(epsilon, torch.Tensor) else ("cuda" if torch.cuda.is_available() else "cpu")
    device = torch.device(device)
    try:
        shape = torch.broadcast_shapes(eps.shape, dlt.shape, sens.shape)
    except RuntimeError as exc:
        raise InvalidParameterError(
            f"epsilon, delta and sensitivity must broadcast together; got shapes {tuple(eps.shape)}, "
            f"{tuple(dlt.shape)}, {tuple(sens.shape)}."
        ) from exc
    if block < 1:
        raise InvalidParameterError(f"block must be a positive number of budgets; got {block}.")
    eps, dlt, sens = (v if v.dtype == _F64 else v.to(_F64) for v in (eps, dlt, sens))
    if out is None:
        result = torch.empty(shape, dtype=_F64, device=home)
    else:
        if not isinstance(out, torch.Tensor) or out.dtype != _F64 or not out.is_contiguous() or tuple(out.shape) != tuple(shape):
            raise InvalidParameterError(
                f"out must be a contiguous float64 tensor of the broadcast shape {tuple(shape)}; "
                f"got {type(out).__name__}"
                + (f" of dtype {out.dtype} and shape {tuple(out.shape)}." if isinstance(out, torch.Tensor) else ".")
            )
        result = out
    n = result.numel()
    flat_out = result.view(-1)
    flats = [v.reshape(-1) if v.numel() == 1 else v.broadcast_to(shape).reshape(-1) for v in (eps, dlt, sens)]
    if dlt.numel() == 1:
        _check("delta", dlt, (dlt > 0) & (dlt < 1), "in (0, 1)")
    terms = _delta_terms_on(dlt, device) if dlt.numel() == 1 else None

    def piece(v: torch.Tensor, start: int, stop: int) -> torch.Tensor:
        if v.numel() == 1:
            return v.to(device).expand(stop - start)
        return v[start:stop].to(device, non_blocking=True)

    for start in range(0, n, block):
        stop = min(start + block, n)
        e, d, s = (piece(v, start, stop) for v in flats)
        # the same refusals as gaussian_sigma, checked block by block on the device
        _check("epsilon", e, torch.isfinite(e) & (e > 0), "finite and > 0")
        _check("delta", d, (d > 0) & (d < 1), "in (0, 1)")
        _check("sensitivity", s, torch.isfinite(s) & (s > 0), "finite and > 0")
        t = terms if terms is not None else _delta_terms_on(d, device)
        t = tuple(x.expand(stop - start) if x.dim() == 0 else x for x in t)
        sigma = _sigma_block(e, d, s, t)  # type: ignore[arg-type]
        bad = ~(torch.isfinite(sigma) & (sigma > 0))
        if bool(bad.any()):
            i = int(torch.nonzero(bad)[0])
            raise InvalidParameterError(
                f"no finite positive sigma reaches epsilon={float(e[i])!r}, delta={float(d[i])!r} "
                f"(sensitivity={float(s[i])!r}) in floating point; use a smaller epsilon or a smaller sensitivity."
            )
        flat_out[start:stop].copy_(sigma)
    return result
