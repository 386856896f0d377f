"""Composition of a stream's charges across tasks (Tobaben et al., Thm 4.4 parallel / Thm 4.5 sequential).

Under ``parallel`` each group is the set of charges that read one task's data (a group contained in another is
covered by it); under ``sequential`` all charges form one group. Each group is composed by an accountant of
:func:`dpcl.accounting.accountants.compute_epsilon`; the stream's epsilon is the worst group's.
"""

from __future__ import annotations

from typing import Any, Sequence

from dpcl.accounting.accountants import compute_epsilon
from dpcl.accounting.events import ComposedEvent, PrivacyEvent, RepeatedEvent
from dpcl.accounting.validation import check_delta
from dpcl.errors import InvalidParameterError, PrivacyViolationError
from dpcl.guarantees.charges import Charge, charge_runs, distinct_charges
from dpcl.guarantees.stream_guarantee import GroupGuarantee, StreamGuarantee

#: Composition modes across tasks, after ``auto`` has been resolved.
ACROSS_TASKS = ("parallel", "sequential")


def _segments(charges: Sequence["Charge"], idx: Sequence[int]) -> list[list[Any]]:
    """``[charge, count]`` for every run of one charge object among the charges ``idx``, in order."""
    out: list[list[Any]] = []
    for i in idx:
        charge = charges[i]
        if out and out[-1][0] is charge:
            out[-1][1] += 1
        else:
            out.append([charge, 1])
    return out


def _group_events(
    charges: Sequence["Charge"], idx: Sequence[int], segments: Sequence[Sequence[Any]] | None = None
) -> tuple[PrivacyEvent, ...]:
    """The events of charges ``idx``, a run of one charge object repeated n times as one RepeatedEvent.

    ``segments`` are those runs as ``(charge, count)`` when the caller knows them already (:func:`_groups_with_runs`),
    so that the charges need not be walked one by one."""
    out: list[PrivacyEvent] = []
    for charge, count in _segments(charges, idx) if segments is None else segments:
        if count == 1:
            out.extend(charge.events)
        else:
            inner = charge.events[0] if len(charge.events) == 1 else ComposedEvent(charge.events)
            out.append(RepeatedEvent(inner, count))
    return tuple(out)



def event_is_gaussian_type(event: PrivacyEvent) -> bool:
    """True when every elementary event is an unsampled Gaussian mechanism (incl. full-batch DP-SGD, q = 1),
    so Gaussian DP composes it exactly and the GDP filter applies."""
    return all(
        leaf.kind in ("gaussian", "heterogeneous_gaussian")
        or (leaf.kind == "poisson_sampled_gaussian" and leaf.sample_rate == 1.0)
        for leaf, _ in event.leaves()
    )


def _compute(events: Sequence[PrivacyEvent], delta: float, accountant: str):
    return compute_epsilon(list(events), delta, accountant)


def _composition_groups(charges: Sequence[Charge], across_tasks: str) -> list[tuple[tuple[int, ...], tuple[int, ...]]]:
    """(tasks, charge indices) of every group that must be accounted.

    Under ``parallel`` a unit of D_k is touched by the charges that read D_k. A
    group whose charges are a subset of another group's is dropped: its true
    epsilon is at most the larger group's (the smaller composition is a
    post-processing of the larger one), so the larger group's bound covers it.
    """
    return [(tasks, idx) for tasks, idx, _ in _groups_with_runs(charges, across_tasks)]


def _groups_with_runs(
    charges: Sequence[Charge], across_tasks: str
) -> list[tuple[tuple[int, ...], tuple[int, ...], tuple[tuple[Charge, int], ...] | None]]:
    """:func:`_composition_groups` with each group's runs of one charge object as ``(charge, count)`` (as
    :func:`_segments` finds them; None for a group of charges that read several tasks). The charges are walked
    run by run (:func:`charge_runs`), so 10^6 references to 10^4 charges cost 10^4 steps."""
    if across_tasks == "sequential":
        multi = [c for c in distinct_charges(charges) if len(c.tasks) > 1]
        if multi:
            c = multi[0]
            raise PrivacyViolationError(
                f"{c.label or 'a charge'} reads the data of several tasks {list(c.tasks)} "
                "while tasks may share privacy units (sequential composition): a shared unit can then occur "
                "several times in one training set, which a per-example accountant does not bound (it needs "
                "group privacy). Declare disjoint units (parallel composition) or train on one task at a time."
            )
        runs = charge_runs(charges)
        tasks = tuple(sorted({t for start, _ in runs for t in charges[start].tasks}))
        return [(tasks, tuple(range(len(charges))), tuple((charges[i], j - i) for i, j in runs))]
    by_task: dict[int, list[int]] = {}
    segments: dict[int, list[Any]] = {}
    single_task = True
    for i, j in charge_runs(charges):  # a run of one charge object (equal charges stored once) is handled at once
        c = charges[i]
        for t in c.tasks:
            by_task.setdefault(t, []).extend(range(i, j))
            own = segments.setdefault(t, [])
            if own and own[-1][0] is c:
                own[-1] = (c, own[-1][1] + j - i)
            else:
                own.append((c, j - i))
        single_task = single_task and len(c.tasks) == 1
    if single_task:  # every charge reads one task: the groups are the tasks, whose charges are disjoint
        return [((t,), tuple(idx), tuple(segments[t])) for t, idx in sorted(by_task.items())]
    groups: dict[frozenset[int], list[int]] = {}
    for t, idx in by_task.items():
        groups.setdefault(frozenset(idx), []).append(t)
    # a set strictly contains k only if it contains k's smallest charge: compare k with those sets alone
    # (one set each when every charge reads one task, so this is linear in the number of groups)
    keys_with: dict[int, list[frozenset[int]]] = {}
    for k in groups:
        for i in k:
            keys_with.setdefault(i, []).append(k)
    out: list[tuple[tuple[int, ...], tuple[int, ...], None]] = []
    for k in groups:
        containing = [other for other in keys_with[min(k)] if k < other]
        if containing:
            continue
        subsets = {other for i in k for other in keys_with[i] if other <= k}
        covered = [t for other in subsets for t in groups[other]]
        out.append((tuple(sorted(covered)), tuple(sorted(k)), None))
    out.sort(key=lambda g: g[0][0])
    return out


def compose_stream(
    charges: Sequence[Charge],
    across_tasks: str,
    delta: float,
    accountant: str = "auto",
    group_accountants: Sequence[str] | None = None,
    cache: dict[Any, Any] | None = None,
) -> StreamGuarantee:
    """Cumulative guarantee of ``charges`` (Tobaben et al., Thm 4.4 / 4.5).

    ``group_accountants`` fixes the accountant of each group (used by
    certificate verification to recompute exactly what was stated); otherwise
    ``accountant`` is used for every group (``auto`` picks the tightest sound one).
    ``cache`` (a dict owned by the caller) memoises group results by charge
    indices: charges are immutable and only appended, so a group seen before
    has the same epsilon.
    """
    if across_tasks not in ACROSS_TASKS:
        raise InvalidParameterError(f"across_tasks must be one of {', '.join(ACROSS_TASKS)}, got {across_tasks!r}.")
    delta = float(check_delta("delta", delta))
    if not charges:
        raise InvalidParameterError("no charge recorded yet: nothing to compose.")
    distinct = distinct_charges(charges)  # a run of equal charges is one object
    adjacencies = {e.adjacency for c in distinct for e in c.events}
    units = {e.unit for c in distinct for e in c.events}
    if len(adjacencies) > 1 or len(units) > 1:
        raise InvalidParameterError(
            f"all charges must share one adjacency and privacy unit; got {sorted(a.value for a in adjacencies)} "
            f"and {sorted(units)}."
        )
    groups = _groups_with_runs(charges, across_tasks)
    if group_accountants is not None and len(group_accountants) != len(groups):
        raise InvalidParameterError(
            f"group_accountants gives {len(group_accountants)} accountants for {len(groups)} composition groups."
        )
    results: list[GroupGuarantee] = []
    notes: dict[str, None] = {}
    cache = {} if cache is None else cache
    # groups whose runs hold the same events objects with the same counts (the equal-size tasks of a certificate,
    # whose charges share one parsed tuple of events) are one composition: accounted once in this call. The ids
    # are those of events held by ``charges`` for the whole call, so no id is reused while this dict lives.
    same_runs: dict[tuple[Any, ...], tuple[float, str, tuple[str, ...]]] = {}
    for g, (tasks, idx, segments) in enumerate(groups):
        acct = accountant if group_accountants is None else group_accountants[g]
        shape = None if segments is None else (acct, *((id(c.events), n) for c, n in segments))
        if shape is not None and shape in same_runs:
            eps, used, res_notes = same_runs[shape]
        else:
            eps, used, res_notes = _group_epsilon(charges, idx, delta, acct, cache, segments)
            if shape is not None:
                same_runs[shape] = (eps, used, res_notes)
        results.append(
            GroupGuarantee(tasks=tasks, charges=idx, epsilon=eps, accountant=used, requested_accountant=acct)
        )
        notes.update(dict.fromkeys(res_notes))
    worst = max(results, key=lambda r: r.epsilon)
    names = sorted({r.accountant for r in results})
    return StreamGuarantee(
        epsilon=worst.epsilon,
        delta=delta,
        across_tasks=across_tasks,
        accountant=names[0] if len(names) == 1 else "+".join(names),
        adjacency=next(iter(adjacencies)).value,
        unit=next(iter(units)),
        groups=tuple(results),
        notes=tuple(notes),
    )


def _group_epsilon(
    charges: Sequence[Charge],
    idx: tuple[int, ...],
    delta: float,
    accountant: str,
    cache: dict[Any, Any],
    segments: Sequence[Sequence[Any]] | None = None,
) -> tuple[float, str, tuple[str, ...]]:
    """(epsilon, accountant used, notes) of the composition of charges ``idx``, memoised in ``cache``.

    Keyed by charge indices (charges are immutable and only appended) and by the events themselves: groups
    that hold equal events (equal-size tasks under parallel composition) have the same epsilon, so a stream
    of 10^4 such tasks runs the accountant once.
    """
    key = (idx, accountant, delta)
    if key not in cache:
        events = _group_events(charges, idx, segments)
        content = ("events", events, accountant, delta)
        if content not in cache:
            res = _compute(events, delta, accountant)
            cache[content] = (float(res.epsilon), res.accountant, tuple(res.notes))
        cache[key] = cache[content]
    return cache[key]

