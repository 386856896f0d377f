"""The task ledger: which release used which task's data, and what each release guarantees.

Task-wise DP (Tobaben et al., Def. 4.1) charges every privacy event to the task
datasets D_t it reads. After each release (the checkpoint after task t) the
ledger reports the cumulative guarantee of everything released so far:

* ``parallel`` (Thm 4.4, proof App. C.2): tasks hold disjoint privacy units. A
  unit lives in one D_k, so only the events that read D_k can depend on it; all
  others are post-processing of earlier releases. The stream is (max_k eps_k,
  delta) where eps_k composes the events charged to D_k. For methods that charge
  one task per release this is exactly "the worst task". The proof in App. C.2
  is written for independent mechanisms; the same argument holds for adaptively
  chosen ones (naive fine-tuning from the previous release) because a mechanism
  that does not read D_k is 0-DP with respect to a unit of D_k.
* ``sequential`` (Thm 4.5, App. C.3): units may be shared between tasks. All
  events charged so far are composed with the tightest sound accountant of
  :func:`dpcl.accounting.accountants.compute_epsilon`.
* a privacy filter (:class:`dpcl.accounting.filter.PrivacyFilter`, fully adaptive
  composition) when ``total_epsilon`` caps an open-ended stream: a charge that
  would overspend is refused with :class:`~dpcl.errors.BudgetExceededError`
  *before* it is recorded, so the task is never trained.

Disjointness is an assumption the user states; when unit ids are given, the
ledger checks it and refuses (:class:`~dpcl.errors.DisjointnessViolationError`)
a task that shares a unit with another, naming one shared unit.

Persistence: the ledger is one JSON file written atomically after every change
(:func:`dpcl.guarantees.atomic_io.write_json_atomic`). It carries a SHA-256 of
its own content; a truncated, corrupt or edited file raises
:class:`~dpcl.errors.LedgerCorruptError` and is never replaced silently. The hash
is not a signature, so :meth:`TaskLedger.from_dict` also refuses content that is
inconsistent whatever its hash (events under other settings, releases covering
charges that are not recorded, charges that overspend the ledger's filter).
Charges are written *before* training, so a run killed between (or during) tasks
resumes with every unit of budget already spent; charging a task again after a
crash adds a second charge (conservative: the killed attempt may have leaked).
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

import numpy as np

from dpcl.accounting.events import Adjacency, PrivacyEvent, event_from_dict
from dpcl.accounting.validation import check_delta, check_positive
from dpcl.errors import (
    ConfigError,
    DisjointnessViolationError,
    InvalidParameterError,
    LedgerCorruptError,
    PrivacyViolationError,
)
from dpcl.guarantees.atomic_io import read_json, write_json_atomic

__all__ = [
    "ACROSS_TASKS",
    "Charge",
    "GroupGuarantee",
    "StreamGuarantee",
    "ReleaseRecord",
    "TaskLedger",
    "compose_stream",
    "event_is_gaussian_type",
]

#: Composition modes across tasks, after ``auto`` has been resolved.
ACROSS_TASKS = ("parallel", "sequential")

LEDGER_FORMAT = "dpcl-task-ledger"
LEDGER_VERSION = 1


@dataclass(frozen=True)
class Charge:
    """Events that read the data of ``tasks`` (0-based task indices), charged before training."""

    tasks: tuple[int, ...]
    events: tuple[PrivacyEvent, ...]
    label: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {"tasks": list(self.tasks), "label": self.label, "events": [e.to_dict() for e in self.events]}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "Charge":
        return cls(
            tasks=tuple(int(t) for t in data["tasks"]),
            events=tuple(event_from_dict(e) for e in data["events"]),
            label=str(data.get("label", "")),
        )


@dataclass(frozen=True)
class GroupGuarantee:
    """Guarantee of one composition group: the charges that can depend on one privacy unit."""

    tasks: tuple[int, ...]
    charges: tuple[int, ...]
    epsilon: float
    accountant: str
    #: accountant that was asked for (``auto`` names its winner in ``accountant``); recomputation uses it.
    requested_accountant: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {
            "tasks": list(self.tasks),
            "charges": list(self.charges),
            "epsilon": self.epsilon,
            "accountant": self.accountant,
            "requested_accountant": self.requested_accountant or self.accountant,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "GroupGuarantee":
        return cls(
            tasks=tuple(int(t) for t in data["tasks"]),
            charges=tuple(int(i) for i in data["charges"]),
            epsilon=float(data["epsilon"]),
            accountant=str(data["accountant"]),
            requested_accountant=str(data.get("requested_accountant", data["accountant"])),
        )


@dataclass(frozen=True)
class StreamGuarantee:
    """Cumulative (epsilon, delta) of every release so far, with how it was composed."""

    epsilon: float
    delta: float
    across_tasks: str
    accountant: str
    adjacency: str
    unit: str
    groups: tuple[GroupGuarantee, ...]
    notes: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        return {
            "epsilon": self.epsilon,
            "delta": self.delta,
            "across_tasks": self.across_tasks,
            "accountant": self.accountant,
            "adjacency": self.adjacency,
            "unit": self.unit,
            "groups": [g.to_dict() for g in self.groups],
            "notes": list(self.notes),
        }


@dataclass(frozen=True)
class ReleaseRecord:
    """The checkpoint released after task ``task_index`` and its cumulative guarantee."""

    task_index: int
    n_charges: int
    guarantee: StreamGuarantee
    checkpoint_sha256: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "task_index": self.task_index,
            "n_charges": self.n_charges,
            "checkpoint_sha256": self.checkpoint_sha256,
            "guarantee": self.guarantee.to_dict(),
        }


def event_is_gaussian_type(event: PrivacyEvent) -> bool:
    """True when every elementary event is an unsampled Gaussian mechanism (incl. full-batch DP-SGD, q = 1),
    so Gaussian DP composes it exactly and the GDP filter applies."""
    return all(
        leaf.kind in ("gaussian", "heterogeneous_gaussian")
        or (leaf.kind == "poisson_sampled_gaussian" and leaf.sample_rate == 1.0)
        for leaf, _ in event.leaves()
    )


def _compute(events: Sequence[PrivacyEvent], delta: float, accountant: str):
    from dpcl.accounting.accountants import compute_epsilon

    return compute_epsilon(list(events), delta, accountant)


def _composition_groups(charges: Sequence[Charge], across_tasks: str) -> list[tuple[tuple[int, ...], tuple[int, ...]]]:
    """(tasks, charge indices) of every group that must be accounted.

    Under ``parallel`` a unit of D_k is touched by the charges that read D_k. A
    group whose charges are a subset of another group's is dropped: its true
    epsilon is at most the larger group's (the smaller composition is a
    post-processing of the larger one), so the larger group's bound covers it.
    """
    if across_tasks == "sequential":
        multi = [i for i, c in enumerate(charges) if len(c.tasks) > 1]
        if multi:
            c = charges[multi[0]]
            raise PrivacyViolationError(
                f"{c.label or 'a charge'} reads the data of several tasks {list(c.tasks)} "
                "while tasks may share privacy units (sequential composition): a shared unit can then occur "
                "several times in one training set, which a per-example accountant does not bound (it needs "
                "group privacy). Declare disjoint units (parallel composition) or train on one task at a time."
            )
        tasks = tuple(sorted({t for c in charges for t in c.tasks}))
        return [(tasks, tuple(range(len(charges))))]
    by_task: dict[int, list[int]] = {}
    for i, c in enumerate(charges):
        for t in c.tasks:
            by_task.setdefault(t, []).append(i)
    groups: dict[frozenset[int], list[int]] = {}
    for t, idx in by_task.items():
        groups.setdefault(frozenset(idx), []).append(t)
    keys = list(groups)
    maximal = [k for k in keys if not any(k < other for other in keys)]
    out = []
    for k in maximal:
        covered = [t for other in keys if other <= k for t in groups[other]]
        out.append((tuple(sorted(covered)), tuple(sorted(k))))
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
    adjacencies = {e.adjacency for c in charges for e in c.events}
    units = {e.unit for c in charges for e in c.events}
    if len(adjacencies) > 1 or len(units) > 1:
        raise InvalidParameterError(
            f"all charges must share one adjacency and privacy unit; got {sorted(a.value for a in adjacencies)} "
            f"and {sorted(units)}."
        )
    groups = _composition_groups(charges, across_tasks)
    if group_accountants is not None and len(group_accountants) != len(groups):
        raise InvalidParameterError(
            f"group_accountants gives {len(group_accountants)} accountants for {len(groups)} composition groups."
        )
    results: list[GroupGuarantee] = []
    notes: list[str] = []
    for g, (tasks, idx) in enumerate(groups):
        acct = accountant if group_accountants is None else group_accountants[g]
        key = (idx, acct, delta)
        if cache is not None and key in cache:
            eps, used, res_notes = cache[key]
        else:
            res = _compute([e for i in idx for e in charges[i].events], delta, acct)
            eps, used, res_notes = float(res.epsilon), res.accountant, tuple(res.notes)
            if cache is not None:
                cache[key] = (eps, used, res_notes)
        results.append(
            GroupGuarantee(tasks=tasks, charges=idx, epsilon=eps, accountant=used, requested_accountant=acct)
        )
        notes.extend(n for n in res_notes if n not in notes)
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


def _canonical(payload: Mapping[str, Any]) -> str:
    return json.dumps(payload, sort_keys=True, separators=(",", ":"), allow_nan=False)


def _unit_keys(unit_ids: Any) -> np.ndarray:
    array = np.asarray(unit_ids)
    if array.ndim != 1:
        raise InvalidParameterError(f"unit_ids must be a 1-D sequence of unit ids, got shape {array.shape}.")
    return array.astype(str)


class TaskLedger:
    """Records charges and releases of a continual-learning run; persists itself atomically.

    Parameters
    ----------
    delta:
        Target delta of every reported guarantee.
    across_tasks:
        ``"parallel"`` (disjoint units, Thm 4.4) or ``"sequential"`` (Thm 4.5).
    accountant:
        Accountant name passed to :func:`compute_epsilon` (``"auto"`` = tightest sound).
    total_epsilon, total_delta:
        Optional budget of a privacy filter over the stream (fully adaptive
        composition). Under ``sequential`` one filter guards the whole stream;
        under ``parallel`` one filter guards each task's data.
    path:
        JSON file the ledger is saved to after every change (optional).
    metadata:
        Free JSON-able information (config, label-space policy...) kept with the ledger.
    """

    def __init__(
        self,
        *,
        delta: float,
        across_tasks: str,
        accountant: str = "auto",
        adjacency: "Adjacency | str" = Adjacency.ADD_REMOVE,
        unit: str = "example",
        total_epsilon: float | None = None,
        total_delta: float | None = None,
        path: "str | os.PathLike[str] | None" = None,
        metadata: Mapping[str, Any] | None = None,
    ) -> None:
        if across_tasks not in ACROSS_TASKS:
            raise InvalidParameterError(
                f"across_tasks must be one of {', '.join(ACROSS_TASKS)} (resolve 'auto' first), got {across_tasks!r}."
            )
        self.delta = float(check_delta("delta", delta))
        self.across_tasks = across_tasks
        self.accountant = str(accountant)
        self.adjacency = Adjacency.parse(adjacency)
        self.unit = str(unit)
        if total_epsilon is None and total_delta is not None:
            raise InvalidParameterError("total_delta is only meaningful together with total_epsilon.")
        self.total_epsilon = None if total_epsilon is None else float(check_positive("total_epsilon", total_epsilon))
        self.total_delta = (
            None
            if total_epsilon is None
            else float(check_delta("total_delta", self.delta if total_delta is None else total_delta))
        )
        self.path = None if path is None else Path(path)
        self.metadata: dict[str, Any] = dict(metadata or {})
        self.charges: list[Charge] = []
        self.releases: list[ReleaseRecord] = []
        self._units: dict[int, list[Any]] = {}
        self._filters: dict[str, Any] = {}
        self._cache: dict[int, StreamGuarantee] = {}
        self._group_cache: dict[Any, tuple[float, str, tuple[str, ...]]] = {}

    # -- settings ----------------------------------------------------------
    def settings(self) -> dict[str, Any]:
        return {
            "delta": self.delta,
            "across_tasks": self.across_tasks,
            "accountant": self.accountant,
            "adjacency": self.adjacency.value,
            "unit": self.unit,
            "total_epsilon": self.total_epsilon,
            "total_delta": self.total_delta,
        }

    @property
    def uses_filter(self) -> bool:
        return self.total_epsilon is not None

    # -- privacy filter ------------------------------------------------------
    def _filter_keys(self, tasks: Iterable[int]) -> list[str]:
        return ["stream"] if self.across_tasks == "sequential" else [f"task{t}" for t in tasks]

    def _filter_for(self, key: str, events: Sequence[PrivacyEvent]):
        """A copy of the filter guarding ``key`` (a new one, its rule set by ``events``, if none exists yet)."""
        import copy

        from dpcl.accounting.filter import PrivacyFilter

        if key in self._filters:
            return copy.deepcopy(self._filters[key])
        rule = "gdp" if all(event_is_gaussian_type(e) for e in events) else "basic"
        return PrivacyFilter(self.total_epsilon, self.total_delta, rule=rule)

    def _admit(self, charge: Charge) -> None:
        """Admit ``charge`` to every filter guarding its tasks, all or none.

        ``gdp`` rule (Gaussian events only): the charge costs its mu. ``basic``
        rule: the k-th admission (k = 0, 1, ...) to a filter gets the delta share
        total_delta / 2^(k+1), so the shares sum to less than total_delta however
        long the stream is, and costs its epsilon at that share. Admission is
        tried on copies first so that a refusal by any filter changes none (and creates none).
        """
        from dpcl.accounting.events import ComposedEvent

        event = charge.events[0] if len(charge.events) == 1 else ComposedEvent(list(charge.events))
        keys = self._filter_keys(charge.tasks)
        trial = {}
        for key in keys:
            flt = self._filter_for(key, charge.events)
            if flt.rule == "gdp":
                flt.admit(event)
            else:
                flt.admit(event, delta=self.total_delta / 2.0 ** (len(flt.charges) + 1))
            trial[key] = flt
        self._filters.update(trial)

    def filter_state(self) -> dict[str, dict[str, Any]]:
        """Rule, budget, spent and remaining budget of each filter (empty without ``total_epsilon``)."""
        return {key: flt.to_dict() for key, flt in self._filters.items()}

    # -- units -------------------------------------------------------------
    def _check_units(self, tasks: Sequence[int], unit_ids: Any) -> np.ndarray | None:
        if unit_ids is None:
            return None
        keys = _unit_keys(unit_ids)
        if self.across_tasks != "parallel":
            return keys
        for other, ids in self._units.items():
            if other in tasks:
                continue
            shared = np.intersect1d(keys, _unit_keys(ids), assume_unique=False)
            if shared.size:
                reading = f"task {tasks[0]}" if len(tasks) == 1 else "tasks " + ", ".join(str(t) for t in tasks)
                raise DisjointnessViolationError(
                    f"{reading} and task {other} are declared to hold disjoint privacy units but share "
                    f"unit {str(shared[0])!r} ({shared.size} shared in all); parallel composition (Thm 4.4) does not "
                    "apply. Remove the shared units or use across_tasks = 'sequential'."
                )
        return keys

    def register_units(self, task_index: int, unit_ids: Any) -> None:
        """Record the privacy-unit ids of one task's data; under parallel composition a unit already held
        by another task raises :class:`DisjointnessViolationError` naming it (nothing is recorded then)."""
        t = int(task_index)
        keys = self._check_units((t,), unit_ids)
        previous = self._units.get(t, [])
        merged = np.union1d(_unit_keys(previous), keys) if previous else np.unique(keys)
        self._units[t] = merged.tolist()
        self.save()

    # -- charging and releasing -----------------------------------------------
    def charge(
        self,
        tasks: "int | Sequence[int]",
        events: "PrivacyEvent | Sequence[PrivacyEvent]",
        *,
        unit_ids: Any = None,
        label: str = "",
    ) -> Charge:
        """Charge ``events`` to the data of ``tasks`` *before* training on it; saves the ledger.

        Raises :class:`DisjointnessViolationError` when unit ids show a shared unit
        under parallel composition and :class:`BudgetExceededError` when a filter
        refuses; in both cases nothing is recorded.
        """
        task_tuple = (int(tasks),) if isinstance(tasks, (int, np.integer)) else tuple(int(t) for t in tasks)
        if not task_tuple or any(t < 0 for t in task_tuple):
            raise InvalidParameterError(f"tasks must be non-negative task indices, got {tasks!r}.")
        event_tuple = (events,) if isinstance(events, PrivacyEvent) else tuple(events)
        if not event_tuple or not all(isinstance(e, PrivacyEvent) for e in event_tuple):
            raise InvalidParameterError("events must be one or more PrivacyEvent objects.")
        for e in event_tuple:
            if e.adjacency is not self.adjacency or e.unit != self.unit:
                raise InvalidParameterError(
                    f"event states adjacency {e.adjacency.value!r} and unit {e.unit!r} but the ledger accounts "
                    f"{self.adjacency.value!r} / {self.unit!r}."
                )
        if self.across_tasks == "sequential" and len(task_tuple) > 1:
            _composition_groups([Charge(task_tuple, event_tuple, label)], "sequential")
        keys = self._check_units(task_tuple, unit_ids)
        charge = Charge(task_tuple, event_tuple, label)
        if self.uses_filter:
            self._admit(charge)
        self.charges.append(charge)
        if keys is not None:
            for t in task_tuple:
                previous = self._units.get(t, [])
                merged = np.union1d(_unit_keys(previous), keys) if previous else np.unique(keys)
                self._units[t] = merged.tolist()
        self.save()
        return charge

    def guarantee(self) -> StreamGuarantee:
        """Cumulative guarantee of everything charged so far."""
        n = len(self.charges)
        if n not in self._cache:
            self._cache[n] = compose_stream(
                self.charges, self.across_tasks, self.delta, self.accountant, cache=self._group_cache
            )
        return self._cache[n]

    def task_guarantee(self, task_index: int) -> float:
        """Epsilon (at the ledger's delta) of the events charged to one task's data alone."""
        idx = tuple(i for i, c in enumerate(self.charges) if task_index in c.tasks)
        if not idx:
            raise InvalidParameterError(f"no charge recorded for task {task_index}.")
        key = (idx, self.accountant, self.delta)
        if key not in self._group_cache:
            res = _compute([e for i in idx for e in self.charges[i].events], self.delta, self.accountant)
            self._group_cache[key] = (float(res.epsilon), res.accountant, tuple(res.notes))
        return self._group_cache[key][0]

    def events_epsilon(self, events: Sequence[PrivacyEvent]) -> float:
        """Epsilon (at the ledger's delta and accountant) of ``events`` alone."""
        return float(_compute(list(events), self.delta, self.accountant).epsilon)

    def release(self, task_index: int, *, checkpoint_sha256: str | None = None) -> ReleaseRecord:
        """Record the checkpoint released after ``task_index`` with its cumulative guarantee; saves."""
        if not self.charges:
            raise InvalidParameterError("cannot release before any task has been charged.")
        record = ReleaseRecord(
            task_index=int(task_index),
            n_charges=len(self.charges),
            guarantee=self.guarantee(),
            checkpoint_sha256=checkpoint_sha256,
        )
        self.releases.append(record)
        self.save()
        return record

    def charged_tasks(self) -> list[int]:
        return sorted({t for c in self.charges for t in c.tasks})

    def released_tasks(self) -> list[int]:
        return [r.task_index for r in self.releases]

    def unit_ids(self, task_index: int) -> list[Any]:
        return list(self._units.get(task_index, []))

    # -- persistence ------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        body = {
            "format": LEDGER_FORMAT,
            "version": LEDGER_VERSION,
            "settings": self.settings(),
            "metadata": self.metadata,
            "charges": [c.to_dict() for c in self.charges],
            "releases": [r.to_dict() for r in self.releases],
            "units": {str(k): v for k, v in sorted(self._units.items())},
        }
        body["sha256"] = hashlib.sha256(_canonical(body).encode()).hexdigest()
        return body

    def save(self) -> None:
        if self.path is not None:
            write_json_atomic(self.path, self.to_dict())

    @classmethod
    def from_dict(cls, data: Any, *, path: "str | os.PathLike[str] | None" = None) -> "TaskLedger":
        where = f"ledger {str(path)!r}" if path is not None else "ledger"
        if not isinstance(data, dict) or data.get("format") != LEDGER_FORMAT:
            raise LedgerCorruptError(f"{where} is not a dpcl task ledger (missing format {LEDGER_FORMAT!r}).")
        stated = data.get("sha256")
        body = {k: v for k, v in data.items() if k != "sha256"}
        try:
            actual = hashlib.sha256(_canonical(body).encode()).hexdigest()
        except (TypeError, ValueError) as exc:
            raise LedgerCorruptError(f"{where} holds values that are not plain JSON: {exc}.") from exc
        if stated != actual:
            raise LedgerCorruptError(
                f"{where} failed its integrity check (stored sha256 {str(stated)[:12]}..., content {actual[:12]}...): "
                "it was edited or damaged. Restore it from a backup; it is never replaced automatically."
            )
        if data.get("version") != LEDGER_VERSION:
            raise LedgerCorruptError(f"{where} has version {data.get('version')!r}; this dpcl reads {LEDGER_VERSION}.")
        try:
            s = data["settings"]
            ledger = cls(
                delta=s["delta"],
                across_tasks=s["across_tasks"],
                accountant=s["accountant"],
                adjacency=s["adjacency"],
                unit=s["unit"],
                total_epsilon=s["total_epsilon"],
                total_delta=s["total_delta"],
                path=None,
                metadata=data.get("metadata", {}),
            )
            charges = [Charge.from_dict(c) for c in data["charges"]]
            ledger._units = {int(k): list(v) for k, v in data.get("units", {}).items()}
            for i, c in enumerate(charges):
                if not c.tasks or any(t < 0 for t in c.tasks) or not c.events:
                    raise LedgerCorruptError(
                        f"{where}: charge {i} must read at least one task index >= 0 and hold at least one event."
                    )
                for e in c.events:
                    if e.adjacency is not ledger.adjacency or e.unit != ledger.unit:
                        raise LedgerCorruptError(
                            f"{where}: charge {i} holds an event under {e.adjacency.value!r} / {e.unit!r} but the "
                            f"ledger accounts {ledger.adjacency.value!r} / {ledger.unit!r}."
                        )
                if ledger.across_tasks == "sequential" and len(c.tasks) > 1:
                    _composition_groups([c], "sequential")
                if ledger.uses_filter:
                    ledger._admit(c)
                ledger.charges.append(c)
            for r in data["releases"]:
                g = r["guarantee"]
                guarantee = StreamGuarantee(
                    epsilon=float(g["epsilon"]),
                    delta=float(g["delta"]),
                    across_tasks=g["across_tasks"],
                    accountant=g["accountant"],
                    adjacency=g["adjacency"],
                    unit=g["unit"],
                    groups=tuple(GroupGuarantee.from_dict(x) for x in g["groups"]),
                    notes=tuple(g.get("notes", ())),
                )
                record = ReleaseRecord(int(r["task_index"]), int(r["n_charges"]), guarantee, r.get("checkpoint_sha256"))
                previous = ledger.releases[-1].n_charges if ledger.releases else 1
                if not previous <= record.n_charges <= len(ledger.charges):
                    raise LedgerCorruptError(
                        f"{where}: release {len(ledger.releases)} covers {record.n_charges} charges; releases must "
                        f"cover a non-decreasing number of charges between 1 and the {len(ledger.charges)} recorded."
                    )
                stated = (guarantee.delta, guarantee.across_tasks, guarantee.adjacency, guarantee.unit)
                expected = (ledger.delta, ledger.across_tasks, ledger.adjacency.value, ledger.unit)
                if stated != expected:
                    raise LedgerCorruptError(
                        f"{where}: release {len(ledger.releases)} states (delta, across_tasks, adjacency, unit) = "
                        f"{stated} but the ledger's settings are {expected}."
                    )
                ledger.releases.append(record)
        except LedgerCorruptError:
            raise
        except (KeyError, TypeError, ValueError, InvalidParameterError, PrivacyViolationError) as exc:
            raise LedgerCorruptError(f"{where} is inconsistent: {exc}") from exc
        ledger.path = None if path is None else Path(path)
        return ledger

    @classmethod
    def load(cls, path: "str | os.PathLike[str]") -> "TaskLedger":
        """Load a saved ledger; a missing file raises FileNotFoundError, a damaged one LedgerCorruptError."""
        p = Path(path)
        try:
            data = read_json(p)
        except FileNotFoundError:
            raise
        except (ValueError, UnicodeDecodeError) as exc:
            raise LedgerCorruptError(
                f"ledger {str(p)!r} is truncated or not valid JSON ({exc}); it is never replaced automatically: "
                "restore it from a backup or move it away deliberately."
            ) from exc
        return cls.from_dict(data, path=p)

    @classmethod
    def open(cls, path: "str | os.PathLike[str]", *, must_exist: bool = False, **settings: Any) -> "TaskLedger":
        """Resume the ledger at ``path`` if it exists (its settings must match), else create it there.

        A resumed ledger keeps every charge and release already recorded. A caller resuming a run that
        has already released something passes ``must_exist=True``: a missing ledger then raises
        :class:`~dpcl.errors.LedgerCorruptError` instead of starting an empty one, which would drop the
        budget already spent and understate every later guarantee.
        """
        p = Path(path)
        if must_exist and not p.exists():
            raise LedgerCorruptError(
                f"ledger {str(p)!r} is missing but the run being resumed has already released checkpoints: "
                "starting a new ledger would forget the budget they spent. Restore the ledger from a backup, "
                "or start the run over in a new directory."
            )
        if p.exists():
            ledger = cls.load(p)
            fresh = cls(**settings)
            mismatched = {
                k: (ledger.settings()[k], v) for k, v in fresh.settings().items() if ledger.settings()[k] != v
            }
            if mismatched:
                desc = "; ".join(f"{k}: ledger has {a!r}, run asks {b!r}" for k, (a, b) in mismatched.items())
                raise ConfigError(
                    f"ledger {str(p)!r} was written with different privacy settings ({desc}). "
                    "Resume with the original settings or start a new ledger file."
                )
            if settings.get("metadata"):
                ledger.metadata.update(settings["metadata"])
            return ledger
        ledger = cls(path=p, **settings)
        ledger.save()
        return ledger
