"""``auto``: the tightest sound bound of the accountants dpcl runs.

Exact when it applies (it is the true epsilon: no sound accountant reports less). Otherwise the smallest of
rdp, pld, advanced and basic, whichever apply (each is asked :meth:`~AccountantBase.supports` first; one that
supports the events may still refuse them for their size), and prv where the PLD is refused or did not
converge; the winner is named and all candidates listed.

Inside auto the PLD starts at interval RDP epsilon / ``AUTO_PLD_RESOLUTION`` clipped to
``AUTO_PLD_INTERVAL_RANGE`` (coarser if it would not fit in memory or would be a grid of more than
``AUTO_PLD_FAST_POINTS``, :func:`_auto_pld_fast_start`; finer where the discretisation error predicted from
the events, :func:`_auto_pld_start`, says one halving would not converge) and is refined (halved, or more
where the change says the error is still large) until one refinement changes epsilon by at most
``AUTO_PLD_TOLERANCE`` (0.5 %) or its work budget is spent; each step is pessimistic, so each is an upper
bound, and the smallest is reported; a note gives the intervals, epsilons and why it stopped.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Callable

from dpcl.accounting.accountants import settings
from dpcl.accounting.accountants._pld_grid import _PldTooLarge
from dpcl.accounting.accountants.advanced import ACCOUNTANT as _ADVANCED
from dpcl.accounting.accountants.advanced import _advanced
from dpcl.accounting.accountants.base import (
    AccountantBase,
    AccountingResult,
    Mechanisms,
    _check_result,
    _RELATION_NOTE,
    collect,
)
from dpcl.accounting.accountants.basic import ACCOUNTANT as _BASIC
from dpcl.accounting.accountants.basic import _basic
from dpcl.accounting.accountants.exact import ACCOUNTANT as _EXACT
from dpcl.accounting.accountants.exact import _exact
from dpcl.accounting.accountants.pld import ACCOUNTANT as _PLD
from dpcl.accounting.accountants.pld import _pld, _pld_pieces, _sized_single_steps_or_refuse
from dpcl.accounting.accountants.prv import ACCOUNTANT as _PRV
from dpcl.accounting.accountants.prv import _prv
from dpcl.accounting.accountants.rdp import ACCOUNTANT as _RDP
from dpcl.accounting.accountants.rdp import _rdp
from dpcl.accounting.events import Adjacency
from dpcl.errors import UnsupportedEventError

__all__ = ["ACCOUNTANT", "AutoAccountant"]


def _loss_variance(mech: Mechanisms) -> tuple[float, int]:
    """V, the summed variance of the steps' privacy losses, and N, the number of steps (see :func:`_auto_pld_start`).

    V of a Poisson-subsampled Gaussian step is its chi^2 divergence q^2 (e^(1/z^2) - 1) (the mu^2 / T of the
    CLT's Gaussian DP, Bu, Dong, Long & Su 2020), of the merged Gaussians mu^2 (one step), of a Laplace about
    eps0^2; ``inf`` where q^2 (e^(1/z^2) - 1) overflows."""
    variance, steps = 0.0, 0
    if mech.gauss_mus:
        variance += mech.gaussian_mu_total() ** 2
        steps += 1
    for eps0, count in mech.laplace:
        variance += count * eps0 * eps0
        steps += count
    for z, q, count in mech.sampled:
        z_size = z / 2.0 if mech.adjacency is Adjacency.REPLACE_ONE else z
        try:
            variance += count * q * q * math.expm1(1.0 / (z_size * z_size))
        except OverflowError:
            variance = math.inf
        steps += count
    return variance, steps


def _predicted_interval(mech: Mechanisms, tolerance: float, kappa: float) -> float | None:
    """The interval h whose first refinement (2 h -> h) is predicted to change epsilon by half ``tolerance`` when
    the relative error at h is ``kappa N h^2 / V`` (see :func:`_auto_pld_start`); None where V or N says nothing."""
    variance, steps = _loss_variance(mech)
    if steps > 0 and 0.0 < variance < math.inf:
        return math.sqrt(tolerance / 6.0 * variance / (kappa * steps))
    return None


def _auto_pld_start(
    mech: Mechanisms, epsilon_scale: float | None, tolerance: float = settings.AUTO_PLD_TOLERANCE, interval: float | None = None,
) -> float:
    """The interval auto's PLD refinement starts from: ``epsilon_scale`` (the RDP epsilon) / :data:`AUTO_PLD_RESOLUTION`
    clipped to :data:`AUTO_PLD_INTERVAL_RANGE`, or finer where the events predict a larger discretisation error.

    Connect-the-dots splits the mass at each privacy loss between the two grid points around it, which adds
    about t (1 - t) h^2 (t the position inside the cell; h^2 / 6 on average) to the variance of each step's
    loss, so the composed loss of N steps gains ~N h^2 / 6 of variance against its own V = sum of the steps'
    variances (:func:`_loss_variance`). The relative epsilon error at h is then about kappa N h^2 / V
    (:data:`_AUTO_PLD_ERROR_CONSTANT`).
    The start is 2 h with h chosen so that the predicted change of the first refinement (2 h -> h,
    3 kappa N h^2 / V) is half the tolerance: where the prediction holds, the refinement converges in two
    steps (at q = 0.001 the RDP rule starts at 1e-3, whose error is 6-30 %, and needed four). The start is
    never coarser than the RDP rule (but for a large grid, below), and the prediction only saves steps: the
    stopping rule is unchanged.
    ``interval`` replaces the RDP rule (calibration's coarse search passes its own). Where that start would
    be a large grid and ``epsilon_scale`` is given, :func:`_auto_pld_fast_start` makes it coarser.
    """
    lo, hi = settings.AUTO_PLD_INTERVAL_RANGE
    if interval is not None:
        start = interval
    elif epsilon_scale is not None:
        start = min(max(epsilon_scale / settings.AUTO_PLD_RESOLUTION, lo), hi)
    else:
        start = settings.PLD_VALUE_DISCRETIZATION_INTERVAL
    h = _predicted_interval(mech, tolerance, settings._AUTO_PLD_ERROR_CONSTANT)
    if h is not None:
        start = min(start, max(2.0 * h, lo))
    return _auto_pld_fast_start(mech, start, epsilon_scale, tolerance)


def _auto_pld_fast_start(
    mech: Mechanisms, start: float, epsilon_scale: float | None, tolerance: float = settings.AUTO_PLD_TOLERANCE,
) -> float:
    """``start``, or a coarser interval where the PLD at ``start`` would need more than :data:`AUTO_PLD_FAST_POINTS`
    grid points and the events predict that a coarser one converges.

    The RDP rule of :func:`_auto_pld_start` never starts coarser than 1e-3, so that auto is no looser than its
    earlier versions where that is cheap. Where epsilon is large (q = 0.1, T = 1e6, z = 0.6: epsilon ~3.4e4, a grid
    of ~7e6 points at 1e-3, 2.2 s, too large to refine) the error at a far coarser interval is already a
    small fraction of epsilon (2.5e-4 at 1e-2, 0.17 s). There the start is 2 h with h from
    :func:`_predicted_interval` at the largest error constant measured (:data:`_AUTO_PLD_ERROR_CONSTANT_MAX`),
    so that the first halving is predicted to converge even where the error is 4x the typical one; never
    coarser than ``epsilon_scale`` / :data:`AUTO_PLD_RESOLUTION` or :data:`AUTO_PLD_MAX_INTERVAL`, never finer
    than ``start``. Only the start moves: every step is still a pessimistic PLD and the stopping rule
    (:func:`_pld_refined`) is unchanged, so the result is an upper bound that converged to the same tolerance.
    """
    h = _predicted_interval(mech, tolerance, settings._AUTO_PLD_ERROR_CONSTANT_MAX)
    if h is None or epsilon_scale is None or 2.0 * h <= start:
        return start
    pieces, _, _ = _pld_pieces(mech)
    try:
        _sized_single_steps_or_refuse(pieces, start, settings.AUTO_PLD_FAST_POINTS)
    except _PldTooLarge:
        return max(start, min(2.0 * h, epsilon_scale / settings.AUTO_PLD_RESOLUTION, settings.AUTO_PLD_MAX_INTERVAL))
    except UnsupportedEventError:
        return start  # the PLD itself will say why
    return start


@dataclass
class _PldRefinement:
    """What auto's PLD refinement did: (interval, epsilon, grid points) per step and how it stopped."""

    steps: list[tuple[float, float, float]] = field(default_factory=list)
    stopped: str = ""
    interval: float = math.nan  # interval of the reported (smallest) epsilon

    def note(self) -> str:
        path = " -> ".join(f"{h:.3g} (eps {e:.6g})" for h, e, _ in self.steps)
        return f"auto: PLD intervals {path}; {self.stopped}"


def _pld_refined(
    mech: Mechanisms, delta: float, start_interval: float, budget_points: float | None = None,
    tolerance: float = settings.AUTO_PLD_TOLERANCE,
) -> tuple[float, tuple[str, ...], _PldRefinement]:
    """Pessimistic PLD, refined from ``start_interval`` until it has converged (see :data:`AUTO_PLD_TOLERANCE`).

    Every step is a pessimistic dp-accounting PLD, so each is an upper bound and the smallest is
    reported. Convergence: the connect-the-dots discretisation error of dp-accounting's PLD falls
    like interval^2 (measured for DP-SGD: 1e-3 -> 3e-4 -> 1e-4 changes epsilon by 0.33, then 0.027
    at q = 0.001, T = 1e6), so once halving the interval changes epsilon by at most 0.5 %, the finer
    value is within ~0.5/3 % of the limit interval -> 0 (within 0.5 % if it converged only
    linearly). A PLD too large for memory is coarsened first (x size / limit); refinement stops
    when the next interval would not fit or would take the work past ``budget_points`` grid points
    (:data:`AUTO_PLD_WORK_BUDGET_POINTS`), and the note says which happened and the last relative change.
    Nothing here reads a clock: the intervals tried, and so the epsilon, depend on the inputs alone.
    """
    budget = settings.AUTO_PLD_WORK_BUDGET_POINTS if budget_points is None else budget_points
    info = _PldRefinement()
    h = start_interval
    last_change = math.inf
    spent = 0.0
    while True:
        work: list[float] = []
        try:
            eps, notes = _pld(mech, delta, h, work)
        except _PldTooLarge as exc:
            if info.steps:
                info.stopped = (
                    f"not refined further: interval {h:.3g} would need ~{exc.points:.2g} grid points "
                    f"(past dpcl's limit); last refinement changed epsilon by {last_change:.2%}."
                )
                break
            # aim at a quarter of the limit: a grid at the limit takes ~10 s; refinement may go finer
            coarser = h * max(2.0, exc.points / (settings._AUTO_PLD_COARSEN_TARGET * settings.PLD_MAX_GRID_POINTS))
            if coarser > settings.AUTO_PLD_MAX_INTERVAL:
                raise
            h = coarser
            continue
        except UnsupportedEventError as exc:  # dp-accounting failed at this interval: keep what the coarser ones gave
            if not info.steps:
                raise
            info.stopped = f"not refined further: at interval {h:.3g} {exc}"
            break
        points = work[0] if work else 0.0
        spent += points
        info.steps.append((h, eps, points))
        if len(info.steps) >= 2:
            prev = info.steps[-2][1]
            last_change = (prev - eps) / eps if eps > 0 else (0.0 if prev == eps else math.inf)
            if last_change <= tolerance:
                info.stopped = (
                    f"converged: the last refinement changed epsilon by {max(last_change, 0.0):.2%} "
                    f"(<= {tolerance:.1%}; the discretisation error of the finer PLD is at most about that)."
                )
                break
        # next interval: halve, or less if the change so far says the error is still large
        # (error ~ c h^2; aim at an error of ~0.35 % at the next interval, never more than /8)
        factor = 0.5
        if len(info.steps) >= 2 and math.isfinite(last_change) and last_change > 0:
            factor = min(0.5, max(0.125, math.sqrt(0.7 * tolerance / (last_change / 3.0))))
        if spent + points / factor > budget:  # a composed grid grows like 1 / interval
            change = f"last refinement changed epsilon by {last_change:.2%}" if len(info.steps) >= 2 else "not refined"
            info.stopped = (
                f"refinement stopped at its work budget ({budget:.3g} grid points; the next interval {h * factor:.3g} "
                f"would take the PLDs to ~{spent + points / factor:.3g}); {change}."
            )
            break
        h *= factor
    best = min(info.steps, key=lambda s: s[1])
    info.interval = best[0]
    eps, notes = best[1], (f"pld: dp-accounting PLD, pessimistic estimate, value discretisation interval {best[0]:.3g}.",) + notes[1:]
    return eps, notes, info


def _auto(
    mech: Mechanisms, delta: float, base: dict[str, Any], pld_interval: float | None = None,
    tolerance: float = settings.AUTO_PLD_TOLERANCE, used: dict[str, float] | None = None,
) -> AccountingResult:
    """The tightest sound bound of the accountants dpcl runs (see the module docstring).

    ``pld_interval`` (used by calibration, which evaluates many nearby noise levels) fixes the PLD
    interval instead of refining it; the result is still a pessimistic PLD, so still an upper bound.
    ``tolerance`` is the refinement's stopping change; ``used["pld_interval"]`` receives the PLD
    interval of the reported PLD epsilon.
    """
    if _EXACT.supports(mech):
        eps, notes = _exact(mech, delta)
        _check_result(eps, "exact")
        return AccountingResult(
            epsilon=eps, accountant="exact", candidates={"exact": eps},
            notes=(*notes, "auto: exact accounting applies; every other sound accountant reports at least this.", _RELATION_NOTE),
            **base,
        )
    candidates: dict[str, float] = {}
    all_notes: dict[str, tuple[str, ...]] = {}
    refusals: list[str] = []
    auto_notes: list[str] = []

    def attempt(accountant: AccountantBase, fn: Callable[[], tuple[float, tuple[str, ...]]]) -> None:
        name = accountant.name
        why = accountant.refusal(mech)
        if why is not None:  # no sound analysis of these events
            refusals.append(f"{name}: {why}")
            return
        try:
            eps, notes = fn()
            _check_result(eps, name)
        except UnsupportedEventError as exc:  # supported, but refused here (size, floating point, no finite bound)
            refusals.append(f"{name}: {exc}")
            return
        candidates[name] = eps
        all_notes[name] = notes

    attempt(_RDP, lambda: _rdp(mech, delta))
    pld_converged = False

    def pld_auto() -> tuple[float, tuple[str, ...]]:
        nonlocal pld_converged
        if pld_interval is not None:
            eps, notes = _pld(mech, delta, pld_interval)
            pld_converged = True
            if used is not None:
                used["pld_interval"] = pld_interval
            return eps, notes
        start = _auto_pld_start(mech, candidates.get("rdp"), tolerance)
        eps, notes, info = _pld_refined(mech, delta, start, tolerance=tolerance)
        pld_converged = info.stopped.startswith("converged")
        if used is not None:
            used["pld_interval"] = info.interval
        auto_notes.append(info.note())
        return eps, notes

    attempt(_PLD, pld_auto)
    attempt(_ADVANCED, lambda: _advanced(mech, delta))
    attempt(_BASIC, lambda: _basic(mech, delta))
    if not pld_converged:
        # PLD refused or not refined to 0.5 %: prv-accountant's upper bound may be tighter
        attempt(_PRV, lambda: _prv(mech, delta))
    if not candidates:
        raise UnsupportedEventError("no accountant can bound these events: " + " | ".join(refusals))
    winner = min(candidates, key=lambda k: candidates[k])
    listing = ", ".join(f"{k}={v:.6g}" for k, v in candidates.items())
    skipped = [r.split(":", 1)[0] for r in refusals]
    refused = f" Not applicable or refused: {', '.join(skipped)}." if skipped else ""
    return AccountingResult(
        epsilon=candidates[winner], accountant=winner, candidates=candidates,
        notes=(*all_notes[winner], *auto_notes, f"auto: tightest of {listing}.{refused}", _RELATION_NOTE),
        **base,
    )


@dataclass(frozen=True)
class AutoAccountant(AccountantBase):
    """The ``auto`` accountant (see the module docstring). Its result names the accountant that produced it,
    whose tolerance verification uses."""

    name: str = "auto"
    tolerance: float = 1e-9  # a result of auto names its winner; this applies only where a stated name is "auto"
    for_training: bool = True

    def refusal(self, mech: Mechanisms) -> str | None:
        whys = [a.refusal(mech) for a in (_EXACT, _RDP, _PLD, _ADVANCED, _BASIC, _PRV)]
        if all(whys):
            return "no accountant can bound these events: " + " | ".join(str(w) for w in whys)
        return None

    def result(self, mech: Mechanisms, delta: float, base: dict[str, Any]) -> AccountingResult:
        return _auto(mech, delta, base)

    def epsilon_of(self, mech: Mechanisms, delta: float) -> tuple[float, tuple[str, ...]]:
        result = _auto(mech, delta, dict(delta=delta, adjacency=mech.adjacency.value, unit=mech.unit))
        return result.epsilon, result.notes

    def cost(self, events: Any) -> float:
        mech = collect(events)
        return math.fsum(a.cost(mech) for a in (_EXACT, _RDP, _PLD, _ADVANCED, _BASIC, _PRV) if a.supports(mech))


#: The instance dpcl registers (:mod:`~dpcl.accounting.accountants.registry`).
ACCOUNTANT = AutoAccountant()
