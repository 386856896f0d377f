"""What ``dpcl audit`` reports of a config (:class:`AuditReport`), and the rules it reports by: the composition
across tasks a config resolves to, the coverage of a stream's releases, and notes merged across tasks."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Sequence

from dpcl.errors import PrivacyViolationError
from dpcl.guarantees.ledger import compact_indices
from dpcl.guarantees.method_schema import ReleaseCoverage, TaskPlan

#: Start of the violation stated for each reason why a private run's checkpoint is not covered.
NOT_COVERED_PREFIX = (
    "the config asks for a private run ([run] private = true) but the released checkpoint is NOT private: "
)
NOT_COVERED_HINT = (
    "The method's checkpoint is not a post-processing of any charged release, so no epsilon bounds it. Use a "
    "method (or [method] setting) whose checkpoint is covered, or set [run] private = false to run it as a "
    "non-private run whose certificates say so (its scoped statements are still stated)."
)
UNDECLARED_VIOLATION = (
    "method {name!r} does not declare whether its released checkpoint is covered by its charged events "
    "(TaskPlan.release is None), so its releases can never be certified; the method's plan must state a "
    "ReleaseCoverage."
)

COUNTS_ASSUMPTION = (
    "Per-task example counts (training examples after label filtering, and how many the public label sets "
    "dropped) are treated as public: audit reports and certificates state them exactly and epsilon does not "
    "cover them (one example added, removed or replaced can change them by 1). Do not publish those fields "
    "when the counts themselves are sensitive."
)


@dataclass(frozen=True)
class AuditReport:
    """Result of :func:`audit_config`; :meth:`to_dict` is the ``dpcl audit --json`` payload."""

    epsilon: float | None
    delta: float
    across_tasks: str
    accountant: str
    adjacency: str
    unit: str
    method: str
    per_task: tuple[dict[str, Any], ...]
    assumptions: tuple[str, ...]
    violations: tuple[str, ...]
    notes: tuple[str, ...] = ()
    total_epsilon: float | None = None
    filter: dict[str, Any] = field(default_factory=dict)
    #: False when the released checkpoint has no DP guarantee: a ``[run] private = false`` config, or a plan whose
    #: checkpoint is not covered by its charged events (``epsilon`` is None; ``release`` says why).
    private: bool = True
    #: The stream's :class:`ReleaseCoverage` as a dict (``covered``, ``basis``, ``reasons``); None when undeclared.
    release: dict[str, Any] | None = None
    #: Statements about narrower releases: name, scope, epsilon, delta, adjacency, unit, accountant, across_tasks.
    scoped_guarantees: tuple[dict[str, Any], ...] = ()
    #: The dry run of the :class:`~dpcl.Certifier` the plans were charged to (its ledgers hold every charge, as
    #: ``dpcl run`` records them); not part of :meth:`to_dict`.
    dry_run: Any = field(default=None, compare=False, repr=False)

    @property
    def covered(self) -> bool:
        """Whether the plan declares the released checkpoint covered by its charged events."""
        return bool(self.release and self.release["covered"])

    @property
    def sound(self) -> bool:
        return not self.violations

    @property
    def exit_code(self) -> int:
        return 0 if self.sound else PrivacyViolationError.exit_code

    def to_dict(self) -> dict[str, Any]:
        return {
            "sound": self.sound,
            "private": self.private,
            "covered": self.covered,
            "release": None if self.release is None else dict(self.release),
            "scoped_guarantees": [dict(x) for x in self.scoped_guarantees],
            "epsilon": self.epsilon,
            "delta": self.delta,
            "across_tasks": self.across_tasks,
            "accountant": self.accountant,
            "adjacency": self.adjacency,
            "unit": self.unit,
            "method": self.method,
            "total_epsilon": self.total_epsilon,
            "per_task": [dict(p) for p in self.per_task],
            "assumptions": list(self.assumptions),
            "violations": list(self.violations),
            "notes": list(self.notes),
            "filter": dict(self.filter),
        }


def resolve_across_tasks(requested: str, disjoint_units: bool) -> tuple[str, list[str]]:
    """``auto`` -> parallel iff units are disjoint. Returns (mode, violations)."""
    if requested == "auto":
        return ("parallel" if disjoint_units else "sequential"), []
    if requested == "parallel" and not disjoint_units:
        return "sequential", [
            "across_tasks = 'parallel' but disjoint_units = false: parallel composition (Tobaben et al., Thm 4.4) "
            "needs tasks with disjoint privacy units. The stream is accounted sequentially instead; set "
            "across_tasks = 'sequential' or make the tasks' units disjoint."
        ]
    return requested, []


def combined_release(plans: Sequence[TaskPlan]) -> ReleaseCoverage | None:
    """The coverage of a stream's releases: covered when every task's plan is covered (bases joined),
    otherwise not covered with every distinct reason; None when a plan leaves it undeclared."""
    coverages = [p.release for p in plans]
    if not coverages or any(c is None for c in coverages):
        return None
    reasons = list(dict.fromkeys(r for c in coverages if not c.covered for r in c.reasons))
    if reasons:
        return ReleaseCoverage.not_covered(*reasons)
    return ReleaseCoverage.post_processing(" ".join(dict.fromkeys(c.basis for c in coverages)))


_TASK_NOTE = re.compile(r"task (\d+): (.*)", re.S)


def merge_task_notes(notes: Sequence[str]) -> list[str]:
    """Notes that differ only in their ``task N:`` prefix stated once for all those tasks ("tasks 0-9999: ...").

    Equal-size tasks get the same plan, so a stream of 10^4 of them would otherwise repeat one sentence 10^4
    times. Other notes are kept as they are, in order; a merged note takes the place of its first task's note.
    """
    order: list[Any] = []
    tasks_of: dict[str, list[int]] = {}
    for note in notes:
        match = _TASK_NOTE.fullmatch(note)
        if match is None:
            order.append(note)
            continue
        rest = match.group(2)
        if rest not in tasks_of:
            tasks_of[rest] = []
            order.append((rest,))
        tasks_of[rest].append(int(match.group(1)))
    out = []
    for item in order:
        if isinstance(item, str):
            out.append(item)
            continue
        (rest,) = item
        tasks = sorted(set(tasks_of[rest]))
        if len(tasks) == 1:
            out.append(f"task {tasks[0]}: {rest}")
        else:
            spans = ", ".join(f"{r[0]}-{r[1]}" if isinstance(r, list) else str(r) for r in compact_indices(tasks))
            out.append(f"tasks {spans}: {rest}")
    return out
