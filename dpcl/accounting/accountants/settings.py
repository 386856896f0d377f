"""Every number an accountant's computation reads, in one place: read at call time as ``settings.NAME``.

Each value here is part of every key of the epsilon memo (:func:`snapshot`), so changing one (as the tests
do, through ``dpcl.accounting.accountants.NAME = value``, which lands here) never returns a stale epsilon.
"""

from __future__ import annotations

from typing import Any

#: dp-accounting's default discretisation of the privacy loss, used by ``pld``.
PLD_VALUE_DISCRETIZATION_INTERVAL = 1e-4
#: Inside ``auto`` the PLD refinement starts at the RDP epsilon of the same events divided by
#: this (clipped to [1e-5, 1e-3]; coarser where the grid would not fit in memory), or finer where
#: the discretisation error predicted from the events asks for it (``_auto_pld_start``).
AUTO_PLD_RESOLUTION = 500.0
AUTO_PLD_INTERVAL_RANGE = (1e-5, 1e-3)
#: PRV ``eps_error`` as a fraction of the RDP epsilon of the same events.
PRV_RELATIVE_EPS_ERROR = 0.01
PRV_MIN_EPS_ERROR = 1e-3
#: Largest PRV grid dpcl allocates: prv-accountant peaks at ~340 bytes per point (measured: 3.0e6 points 1.0 GB,
#: 9.7e6 points 3.3 GB and 52 s), so this keeps one PRV computation under ~1.1 GB and a process under 2 GB.
PRV_MAX_GRID_POINTS = 3e6
#: PRV ``delta_error`` as a fraction of delta.
PRV_RELATIVE_DELTA_ERROR = 1e-3
# prv-accountant evaluates exp(t) over its privacy-loss domain [-L, L]; past log(float64 max) ~ 709.78 that
# overflows and its discretised PRVs come out with a wrong (even negative) mean: at q = 0.1, T = 1e6, z = 2 it
# returned epsilon upper bound -844, which dpcl used to clamp to 0 although the true epsilon is about 1600.
PRV_MAX_DOMAIN = 700.0

#: Largest number of grid points of a (composed) PLD that dpcl allocates. dp-accounting's FFT
#: self-composition peaks at about 100 bytes per output point (measured: 7e6 points, 0.7 GB), so
#: this keeps one PLD computation under ~1.3 GB.
PLD_MAX_GRID_POINTS = 1.2e7
#: Largest grid of one PMF of a PLD that is one piece self-composed (e.g. a DP-SGD run at one noise multiplier and
#: sampling rate), which dpcl composes itself above :data:`_LEAN_SELF_COMPOSE_POINTS` in ~32 bytes a point
#: (:func:`_lean_self_convolve`): a process computing a 2.6e7-point PLD this way peaks at 1.35 GB (q = 0.1, T = 1e6,
#: z = 1 at 1e-4, measured 2026-11-28 with the round-off bound; 1.13 GB before), ~1.6 GB at this size; tests/accounting/test_bounded_work.py runs it under
#: the 2 GiB address-space limit of every public function (issue 18).
PLD_MAX_SELF_COMPOSED_POINTS = 3e7
#: dp-accounting's default tail mass truncated per self-composition (``DensePLDPmf.self_compose``).
_PLD_TAIL_MASS_TRUNCATION = 1e-15
#: Standard deviations of the Gaussian noise that dp-accounting's single-step discretisation spans
#: (its log_mass_truncation_bound of -50 is ~10 standard deviations per tail; 12 leaves a margin).
_PLD_GAUSSIAN_TAIL_SIGMAS = 12.0

#: Single-step grids larger than this are sized first on a coarser proxy grid (cheap to build).
_PLD_PROXY_POINTS = 5e4

#: Losses scanned per numpy chunk by :func:`_dense_epsilon_for_delta` (bounds its temporary arrays).
_EPSILON_SCAN_CHUNK = 1 << 18

#: Self-compositions of a sparse PLD are split into blocks of this many copies (see :func:`_self_compose`).
_SPARSE_SELF_COMPOSE_BLOCK = 1024

#: Self-compositions with more output points than this take :func:`_lean_self_convolve`; smaller ones are
#: dp-accounting's arrays bit for bit. dp-accounting's complex FFT peaked a calibration at 1.57 GB of resident memory
#: on an 8.5e6-point grid (q = 1e-6, T = 1e4, target 1e-3; the probe of tests/accounting/test_bounded_work.py then
#: ran out of its 2 GiB address space), so every large grid is composed the lean way.
_LEAN_SELF_COMPOSE_POINTS = 1e6

#: ``auto`` refines its PLD until one refinement changes epsilon by at most this (relative) ...
AUTO_PLD_TOLERANCE = 0.005
#: ... or until the next interval would take its PLDs past this many grid points in all (the composed grids of
#: every interval tried, the next one predicted from the last; the note then says so). Work, not seconds, so
#: that the epsilon returned is a function of the events, delta and these settings alone, the same on a fast
#: machine, a slow one or a loaded one (a time limit only refuses: :mod:`dpcl.accounting.work`). Composing
#: costs ~0.25-0.6 us a grid point on the 2-core benchmark machine (Laplace steps at 1e-4: 1.0e7 points in
#: 2.5 s; DP-SGD at q = 0.1, T = 1e5: 2.5e6 in 0.8 s), so this is ~8-18 s of composition there, the time
#: budget it replaced (8 s) on that machine; no point of benchmarks/GRID.md comes near it (at most 3.8e6).
AUTO_PLD_WORK_BUDGET_POINTS = 3e7
#: A PLD that does not fit is coarsened to about this fraction of :data:`PLD_MAX_GRID_POINTS`.
_AUTO_PLD_COARSEN_TARGET = 0.25
#: Coarsest interval auto starts from; a PLD that does not fit in memory is coarsened beyond it.
AUTO_PLD_MAX_INTERVAL = 1.0

#: Relative epsilon error of a pessimistic PLD at interval h predicted as ``kappa * N h^2 / V`` (see
#: :func:`_auto_pld_start`); kappa measured on the DP-SGD grid of ``benchmarks/GRID.md``: 0.1 at q = 0.001,
#: up to 0.4 at q = 0.1. Only the starting interval depends on it, never the stopping rule.
_AUTO_PLD_ERROR_CONSTANT = 0.1
#: The largest kappa measured on that grid (q = 0.1), used where auto starts coarse (:func:`_auto_pld_fast_start`).
_AUTO_PLD_ERROR_CONSTANT_MAX = 0.4
#: A PLD start interval whose grid would exceed this many points (~0.25 s to compose) is replaced by a coarser
#: one where the events predict it converges (:func:`_auto_pld_fast_start`).
AUTO_PLD_FAST_POINTS = 1e6

#: Most results the in-process memo keeps (least recently used dropped first).
MEMO_MAX_ENTRIES = 4096
#: Arrays of Gaussian mus up to this many bytes enter the memo key as their bytes; larger ones as their
#: length and SHA-256 digest (a collision would need a SHA-256 collision).
_MEMO_INLINE_BYTES = 4096


def names() -> tuple[str, ...]:
    """The settings' names, in the order they are defined."""
    return tuple(name for name in globals() if name.lstrip("_")[:1].isupper() and name.lstrip("_").isupper())


def snapshot() -> tuple[Any, ...]:
    """The current value of every setting (part of each memo key)."""
    module = globals()
    return tuple(module[name] for name in names())
