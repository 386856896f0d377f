"""What a release guarantees: the (epsilon, delta) of each composition group and of the whole stream so far."""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Any, Iterator, Mapping, Sequence

from dpcl.guarantees.charges import compact_indices, expand_indices

@dataclass(frozen=True)
class GroupGuarantee:
    """Guarantee of one composition group: the charges that can depend on one privacy unit."""

    tasks: tuple[int, ...]
    charges: tuple[int, ...]
    epsilon: float
    accountant: str
    #: accountant that was asked for (``auto`` names its winner in ``accountant``); recomputation uses it.
    requested_accountant: str = ""

    def to_dict(self, compact: bool = False) -> dict[str, Any]:
        """JSON form; ``compact`` writes every run of consecutive task and charge indices as ``[first, last]``
        (:func:`compact_indices`; ledger format 2 and certificate version 3)."""
        form = compact_indices if compact else list
        return {
            "tasks": form(self.tasks),
            "charges": form(self.charges),
            "epsilon": self.epsilon,
            "accountant": self.accountant,
            "requested_accountant": self.requested_accountant or self.accountant,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "GroupGuarantee":
        return cls(
            tasks=expand_indices(data["tasks"], "group tasks"),
            charges=expand_indices(data["charges"], "group charges"),
            epsilon=float(data["epsilon"]),
            accountant=str(data["accountant"]),
            requested_accountant=str(data.get("requested_accountant", data["accountant"])),
        )


class GroupsPrefix(Sequence):
    """The first ``length`` groups of a list that is only appended to while this view exists: the groups of one
    release of a long parallel stream, shared with every later release instead of copied (10^4 releases of
    up to 10^4 groups would otherwise hold 5 x 10^7 references). Reads like a tuple and compares equal to the
    tuple of the same groups; :meth:`TaskLedger._parallel_guarantee` copies the list before it changes a
    group that a view covers."""

    __slots__ = ("_backing", "_length")

    def __init__(self, backing: list[Any], length: int) -> None:
        self._backing = backing
        self._length = length

    def __len__(self) -> int:
        return self._length

    def __getitem__(self, index: Any) -> Any:
        if isinstance(index, slice):
            return tuple(self._backing[: self._length][index])
        if not -self._length <= index < self._length:
            raise IndexError("group index out of range")
        return self._backing[index % self._length]

    def __iter__(self) -> Iterator[Any]:
        return itertools.islice(self._backing, self._length)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, GroupsPrefix) and other._backing is self._backing:
            return other._length == self._length
        if isinstance(other, (tuple, GroupsPrefix)):
            return len(other) == self._length and tuple(self) == tuple(other)
        return NotImplemented

    def __hash__(self) -> int:
        return hash(tuple(self))

    def __add__(self, other: Any) -> tuple[Any, ...]:
        return tuple(self) + tuple(other)

    def __repr__(self) -> str:
        return repr(tuple(self))


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

    def to_dict(self, groups_kept: int | None = None) -> dict[str, Any]:
        out = {
            "epsilon": self.epsilon,
            "delta": self.delta,
            "across_tasks": self.across_tasks,
            "accountant": self.accountant,
            "adjacency": self.adjacency,
            "unit": self.unit,
            "groups": [g.to_dict(compact=groups_kept is not None) for g in self.groups[groups_kept or 0:]],
            "notes": list(self.notes),
        }
        if groups_kept is not None:
            out["groups_kept"] = groups_kept
        return out


@dataclass(frozen=True)
class ReleaseRecord:
    """The checkpoint released after task ``task_index`` and its cumulative guarantee."""

    task_index: int
    n_charges: int
    guarantee: StreamGuarantee
    checkpoint_sha256: str | None = None

    def to_dict(self, groups_kept: int | None = None) -> dict[str, Any]:
        """JSON form; with ``groups_kept`` (ledger format 2) only the groups after the first ``groups_kept``
        (those shared with the previous release) are listed."""
        return {
            "task_index": self.task_index,
            "n_charges": self.n_charges,
            "checkpoint_sha256": self.checkpoint_sha256,
            "guarantee": self.guarantee.to_dict(groups_kept),
        }



def _extended(previous: Sequence[Any], kept: int, new: list[Any]) -> Sequence[Any]:
    """``previous[:kept] + new`` for a loaded release: when it keeps all of ``previous`` it shares its list (a
    :class:`GroupsPrefix`), so loading 10^4 releases does not copy 10^4 groups each."""
    if kept == len(previous):
        if isinstance(previous, GroupsPrefix) and len(previous._backing) == len(previous):
            backing = previous._backing
        else:
            backing = list(previous)
        backing.extend(new)
        return GroupsPrefix(backing, len(backing))
    return tuple(previous[:kept]) + tuple(new)


def _shared_prefix(a: Sequence[Any], b: Sequence[Any]) -> int:
    """Length of the longest common prefix of ``a`` and ``b`` (compared in C first: usually all of ``a``)."""
    n = min(len(a), len(b))
    if isinstance(a, GroupsPrefix) and isinstance(b, GroupsPrefix) and a._backing is b._backing:
        return n
    if tuple(a[:n]) == tuple(b[:n]):
        return n
    return next(i for i in range(n) if a[i] != b[i])

