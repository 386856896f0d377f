"""``pld``: dp-accounting's privacy loss distributions, ``pessimistic_estimate=True`` (an upper bound whatever
the discretisation), value discretisation interval ``PLD_VALUE_DISCRETIZATION_INTERVAL`` (1e-4, dp-accounting's
default).

Sized before anything is allocated by dp-accounting's own Chernoff bound on the composed grid; more than
``PLD_MAX_GRID_POINTS`` (~1.3 GB; ``PLD_MAX_SELF_COMPOSED_POINTS`` for one self-composed piece, which dpcl
composes in less memory) is refused, pointing to ``auto``. The only accountant with a sound analysis of
Poisson-subsampled Gaussians under replace-one (dp-accounting's REPLACE_ONE mixture pair); (epsilon, delta)
events are refused.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import numpy as np

from dpcl.accounting import work as _work
from dpcl.accounting.accountants import settings
from dpcl.accounting.accountants._pld_grid import (
    PLD_LIBRARY_FAILURES,
    _composed_pieces,
    _composed_points,
    _epsilon_for_delta,
    _grid_spans,
    _pld_library_error,
    _pld_points,
    _pld_too_large,
    _single_gaussian_pld,
    _single_step_points,
)
from dpcl.accounting.accountants.base import (
    AccountantBase,
    Mechanisms,
    _raise_refusal,
    collect,
    eps_delta_refusal,
)
from dpcl.accounting.events import Adjacency, PrivacyEvent
from dpcl.errors import UnsupportedEventError

__all__ = ["ACCOUNTANT", "PldAccountant", "check_pld_fits"]


def _pld(mech: Mechanisms, delta: float, interval: float, work: list[float] | None = None) -> tuple[float, tuple[str, ...]]:
    """dp-accounting pessimistic PLD at ``interval``; refuses (before allocating) a grid that would not fit.

    ``work``, where given, receives the grid points of the composed PLD (its PMFs' sizes: what its
    composition cost, as a number that depends on the events and the interval alone).

    Each piece (a group of identical mechanisms) is sized by dp-accounting's Chernoff bound on its
    composed grid. Where the single step alone would have many points, that bound is first taken
    on a proxy grid with at most ~5e4 points and scaled by proxy interval / interval (the loss
    range it spans does not depend on the interval), so that a PLD which will be refused is never built.
    """
    _raise_refusal(eps_delta_refusal(mech, "pld"))
    pieces, piece_keys, notes = _pld_pieces(mech)
    notes.insert(0, f"pld: dp-accounting PLD, pessimistic estimate, value discretisation interval {interval:g}.")
    singles = _sized_single_steps_or_refuse(pieces, interval)
    try:
        with np.errstate(all="ignore"):
            total = _composed_pieces(singles, piece_keys, interval)
            eps = _epsilon_for_delta(total, delta)
            if work is not None:
                work.append(_pld_points(total))
    except UnsupportedEventError:
        raise
    except PLD_LIBRARY_FAILURES as exc:
        raise _pld_library_error(exc) from exc
    if not math.isfinite(eps):
        raise UnsupportedEventError(
            f"dp-accounting's PLD gives no finite epsilon at delta={delta!r}: the tail mass it truncates "
            "(counted as infinite loss) exceeds delta. Use a larger delta or accountant 'rdp' or 'exact'."
        )
    return eps, tuple(notes)


def check_pld_fits(events: "PrivacyEvent | Sequence[PrivacyEvent]", interval: float, max_points: float) -> None:
    """Refuse (:class:`~dpcl.errors.UnsupportedEventError`) events whose PLD at ``interval`` would need more than
    ``max_points`` grid points, before anything large is allocated: the sizing the ``pld`` accountant does
    (the same pieces and dp-accounting's own Chernoff bound on each composed grid). For callers that compose
    the events with dp-accounting themselves, such as ``dpcl verify --cross-check``
    (:mod:`dpcl.guarantees.cross_check`), whose memory it bounds."""
    pieces, _, _ = _pld_pieces(collect(events))
    _sized_single_steps_or_refuse(pieces, interval, max_points)


def _sized_single_steps_or_refuse(
    pieces: list[tuple[Callable[[float], Any], int, float, str]], interval: float, limit: float | None = None,
) -> list[tuple[Any, int]]:
    """:func:`_sized_single_steps`, a floating-point failure of dp-accounting's constructors refused as
    :func:`_pld_library_error` says."""
    try:
        with np.errstate(all="ignore"):
            return _sized_single_steps(pieces, interval, limit)
    except UnsupportedEventError:
        raise
    except PLD_LIBRARY_FAILURES as exc:
        raise _pld_library_error(exc) from exc


def _pld_pieces(
    mech: Mechanisms,
) -> tuple[list[tuple[Callable[[float], Any], int, float, str]], list[tuple[Any, ...]], list[str]]:
    """The pieces of ``mech``'s PLD: (builder(interval) -> single-step PLD, repetitions, single-step size
    estimate at interval 1, description), what each piece is by value (for the memo of partial
    compositions), and notes."""
    from dp_accounting.pld import privacy_loss_distribution as pld_lib

    pieces: list[tuple[Callable[[float], Any], int, float, str]] = []
    piece_keys: list[tuple[Any, ...]] = []
    notes: list[str] = []
    if mech.gauss_mus:
        mu = mech.gaussian_mu_total()
        if not mu > 0:
            raise UnsupportedEventError(
                "the Gaussian mechanisms' composed mu (sensitivity / sigma) underflows to 0 in float64 (sigma beyond "
                "~1e154 per unit of sensitivity): dp-accounting's PLD cannot discretise it; use accountant 'exact' "
                "or 'rdp'."
            )
        pieces.append((
            lambda h, mu=mu: _single_gaussian_pld(1.0 / mu, h, 1.0, False),
            1, _single_step_points(1.0 / mu, 1.0), f"one Gaussian with mu = {mu:.3g}",
        ))
        piece_keys.append(("gaussian", float(mu), 1))
        notes.append(f"pld: Gaussian mechanisms merged exactly into one with mu = {mu:.6g} (Dong, Roth & Su 2022, Cor. 3.3).")
    for eps0, count in mech.laplace_groups():
        pieces.append((
            lambda h, eps0=eps0: pld_lib.from_laplace_mechanism(
                parameter=1.0, sensitivity=eps0, pessimistic_estimate=True, value_discretization_interval=h,
            ),
            count, 2.0 * eps0, f"Laplace mechanisms with epsilon0 = {eps0:.3g}",
        ))
        piece_keys.append(("laplace", float(eps0), int(count)))
    for (z, q), count in mech.sampled_groups():
        # replace-one moves a clipped gradient by up to 2C: size it as noise z / 2
        z_size = z / 2.0 if mech.adjacency is Adjacency.REPLACE_ONE else z
        pieces.append((
            lambda h, z=z, q=q: _single_gaussian_pld(z, h, q, mech.adjacency is Adjacency.REPLACE_ONE),
            count, _single_step_points(z_size, 1.0), f"subsampled-Gaussian steps with noise multiplier {z:.3g}",
        ))
        piece_keys.append(("sampled", float(z), float(q), mech.adjacency.value, int(count)))
    return pieces, piece_keys, notes


def _sized_single_steps(
    pieces: list[tuple[Callable[[float], Any], int, float, str]], interval: float,
    limit: float | None = None,
) -> list[tuple[Any, int]]:
    """Build each piece's single-step PLD at ``interval`` after checking that its composition fits in ``limit``
    grid points (see :func:`_pld`). The default is :data:`PLD_MAX_GRID_POINTS`, or :data:`PLD_MAX_SELF_COMPOSED_POINTS`
    for one piece of more than :data:`_SPARSE_SELF_COMPOSE_BLOCK` steps, which :func:`_dense_self_compose` composes
    (fewer steps of a sparse PMF go to dp-accounting's own FFT, ~100 bytes a point); a single step, which
    dp-accounting builds, never has more than :data:`PLD_MAX_GRID_POINTS`."""
    if limit is None:  # read at call time (tests scale the module's limits)
        limit = settings.PLD_MAX_GRID_POINTS
        if len(pieces) == 1 and pieces[0][1] > settings._SPARSE_SELF_COMPOSE_BLOCK:
            limit = max(limit, settings.PLD_MAX_SELF_COMPOSED_POINTS)
    points = 0.0
    singles: list[tuple[Any, int]] = []
    for build, count, width, what in pieces:
        _work.checkpoint()  # the caller's processor-time budget (dpcl.accounting.work)
        with np.errstate(over="ignore"):
            single = width / interval + 1.0
        if not single <= min(limit, settings.PLD_MAX_GRID_POINTS):  # a single step is built by dp-accounting
            raise _pld_too_large(single, interval, what, min(limit, settings.PLD_MAX_GRID_POINTS))
        estimate = math.inf
        if single > settings._PLD_PROXY_POINTS:
            proxy = interval * single / settings._PLD_PROXY_POINTS
            estimate = _composed_points(build(proxy), count) * proxy / interval
            if not points + estimate <= limit:
                raise _pld_too_large(points + estimate, interval, what, limit)
        pld = build(interval)
        # the whole convolution's support, count (n - 1) + 1 points, bounds the composed grid from above:
        # where it is small, dp-accounting's (costlier) Chernoff bound is not needed to see that it fits;
        # nor where twice the proxy's estimate fits (the bound's orders scale with the grid, so in loss units
        # the proxy's truncated range is the fine grid's up to rounding; its cost grows with the grid: ~1 s at 2e5 points)
        full = max(count * (span - 1) + 1.0 for span in _grid_spans(pld))
        if points + full <= limit / 4:
            points += full
        elif points + 2.0 * estimate <= limit:
            points += 2.0 * estimate
        else:
            points += _composed_points(pld, count)
        if not points <= limit:
            raise _pld_too_large(points, interval, what, limit)
        singles.append((pld, count))
    return singles


@dataclass(frozen=True)
class PldAccountant(AccountantBase):
    """The ``pld`` accountant (see the module docstring). ``interval``: the value discretisation interval
    (None: ``settings.PLD_VALUE_DISCRETIZATION_INTERVAL``, read at each call)."""

    name: str = "pld"
    tolerance: float = 1e-6  # recomputed deterministically, but FFT numerics may differ across numpy/scipy builds
    for_training: bool = True
    interval: float | None = None

    def _interval(self) -> float:
        return settings.PLD_VALUE_DISCRETIZATION_INTERVAL if self.interval is None else self.interval

    def refusal(self, mech: Mechanisms) -> str | None:
        return eps_delta_refusal(mech, "pld")

    def epsilon_of(self, mech: Mechanisms, delta: float) -> tuple[float, tuple[str, ...]]:
        return _pld(mech, delta, self._interval())

    def delta_of(self, mech: Mechanisms, epsilon: float) -> float:
        interval = self._interval()
        pieces, piece_keys, _ = _pld_pieces(mech)
        singles = _sized_single_steps_or_refuse(pieces, interval)
        try:
            with np.errstate(all="ignore"):
                return float(_composed_pieces(singles, piece_keys, interval).get_delta_for_epsilon(epsilon))
        except PLD_LIBRARY_FAILURES as exc:
            raise _pld_library_error(exc) from exc

    def cost(self, events: Any) -> float:
        pieces, _, _ = _pld_pieces(collect(events))
        interval = self._interval()
        return float(sum(count * (width / interval + 1.0) for _, count, width, _ in pieces))  # convolution supports


#: The instance dpcl registers (:mod:`~dpcl.accounting.accountants.registry`).
ACCOUNTANT = PldAccountant()
