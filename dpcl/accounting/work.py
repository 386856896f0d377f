"""Bounded work for the public accounting entry points (issue 18): an answer within 60 s and 2 GB, or a refusal.

Most inputs that would take longer or more memory are refused up front, before anything large is allocated, by
the limits of the events (:data:`~dpcl.accounting.events.NOISE_MULTIPLIER_RANGE`,
:data:`~dpcl.accounting.events.MIN_SAMPLE_RATE`, :data:`~dpcl.accounting.events.MAX_SAMPLED_STEPS`) and by the
accountants' own sizing of their grids (``PLD_MAX_GRID_POINTS``, ``PRV_MAX_GRID_POINTS`` in
:mod:`~dpcl.accounting.accountants`, and :data:`PRV_MAX_POINT_MECHANISMS` here, since prv-accountant works on its
whole grid once per distinct mechanism): one epsilon costs at most one PLD and one PRV grid of bounded size plus
``auto``'s refinement budget.

A calibration is a search: how many epsilons it evaluates, and at which noise, depends on where the root lies,
which is what it computes. A tiny target at a tiny sampling rate (target_epsilon = 1e-3, sample_rate = 1e-6,
steps = 1e4) evaluates ``auto`` where each PLD would exceed its grid and prv-accountant answers instead, ~8 s
an evaluation, 94 s in all. So the searches also run under a processor-time budget (:func:`time_budget`,
:data:`CALIBRATION_TIME_BUDGET_S`): before each evaluation the search asks :func:`checkpoint`, which refuses with a
:class:`~dpcl.errors.WorkLimitError` once the budget is spent. A refusal names the input, the budget and what to
do instead (accountant ``rdp``, whose calibration takes well under a second, or a larger target); the last
evaluation started before the budget ran out is bounded like any single epsilon, so the whole call stays under 60 s.

Processor time of the calling thread (:func:`time.thread_time`), not wall-clock time: on a shared machine a
question must not be refused because others are computing, and another thread's work is not this question's.
"""

from __future__ import annotations

import contextlib
import contextvars
import time
from typing import Iterator

from dpcl.errors import WorkLimitError

__all__ = [
    "CALIBRATION_TIME_BUDGET_S", "EPSILON_TIME_BUDGET_S", "PRV_MAX_POINT_MECHANISMS", "checkpoint", "epsilon_budget",
    "time_budget",
]

#: Processor seconds a calibration's search may spend before it refuses. One epsilon evaluation after it costs at
#: most ~30 s (a PLD at its grid limit, auto's refinement budget, a PRV grid at its limit), which keeps a call under
#: the 60 s that issue 18 promises.
CALIBRATION_TIME_BUDGET_S = 20.0

#: Processor seconds one epsilon may spend in its per-mechanism loops (a PLD or an RDP series per distinct mechanism:
#: 16 distinct DP-SGD tasks took 6 s under ``auto``, 24 took 46 s, 32 took 58 s); the rest of ``auto`` after it (a
#: PRV grid at its limit, the closed forms) keeps a call under 60 s.
EPSILON_TIME_BUDGET_S = 30.0

#: Most grid points x distinct mechanisms a PRV computation handles (prv-accountant discretises and self-composes
#: each distinct mechanism on the whole grid, then convolves them: 32 distinct DP-SGD tasks on 8.3e5 points took
#: 61 s, ~2.3 us a point and mechanism); one mechanism is bounded by ``PRV_MAX_GRID_POINTS`` (3e6, ~10 s) alone.
PRV_MAX_POINT_MECHANISMS = 6e6

_BUDGET: contextvars.ContextVar[tuple[float, float, str] | None] = contextvars.ContextVar("dpcl_work_budget", default=None)


@contextlib.contextmanager
def time_budget(seconds: float, question: str, hint: str) -> Iterator[None]:
    """Run the enclosed search under ``seconds`` of processor time; :func:`checkpoint` refuses once they are spent,
    with ``question`` (what was asked, naming its inputs) and ``hint`` (what to do instead) in the message.
    Nested budgets keep the outer, earlier deadline."""
    deadline = time.thread_time() + seconds
    outer = _BUDGET.get()
    if outer is not None and outer[0] <= deadline:
        yield
        return
    token = _BUDGET.set((deadline, seconds, f"{question} needs more than {seconds:g} s of processor time (the limit); {hint}."))
    try:
        yield
    finally:
        _BUDGET.reset(token)


def checkpoint() -> None:
    """Refuse (:class:`~dpcl.errors.WorkLimitError`) if the enclosing :func:`time_budget` is spent; else nothing."""
    budget = _BUDGET.get()
    if budget is not None and time.thread_time() > budget[0]:
        raise WorkLimitError(budget[2])


def epsilon_budget(described: str, accountant: str, delta: float) -> contextlib.AbstractContextManager[None]:
    """:func:`time_budget` of :func:`~dpcl.accounting.accountants.compute_epsilon` (``described``: the events, as
    ``Mechanisms.describe`` says them)."""
    hint = (
        "use accountant 'advanced' or 'basic', or give equal mechanisms equal parameters so that they compose as one"
        if accountant == "rdp" else
        "use accountant='rdp' (seconds for a thousand distinct mechanisms), 'advanced' or 'basic', or give equal "
        "mechanisms equal parameters so that they compose as one"
    )
    return time_budget(EPSILON_TIME_BUDGET_S, f"events ({described}) under accountant {accountant!r} at delta={delta!r}", hint)
