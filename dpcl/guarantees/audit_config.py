"""Audit a training config without training: the total guarantee of the run it describes.

:func:`audit_config` plans every task with the method's
:class:`~dpcl.guarantees.method_schema.MethodSpec` (the same plan ``dpcl run``
trains with), charges the planned events to a :class:`TaskLedger` exactly as a
run would, and reports the cumulative guarantee after every release together
with every privacy violation it finds:

* ``label_space = "data"`` (Tobaben et al., Prop. 4.6);
* a method that releases nothing for an empty task (Prop. F.1);
* ``across_tasks = "parallel"`` while ``disjoint_units = false`` (Thm 4.4 needs disjoint units);
* training on the union of tasks whose units may be shared (needs group privacy);
* a stream that exceeds ``total_epsilon`` (the privacy filter refuses a task);
* a private run (``[run] private = true``, the default) of a method whose released checkpoint is not
  covered by its charged events (:class:`~dpcl.guarantees.method_schema.ReleaseCoverage`, e.g. PeCL as in
  the paper: one violation per reason), or whose plan does not declare its coverage at all.

The report's headline (``epsilon``, ``private``) is about the released checkpoint: a plan that is not
covered gets ``private: false`` and no epsilon. Statements about narrower releases
(:class:`~dpcl.guarantees.method_schema.ScopedPlan`) are composed across tasks in ledgers of their own and
reported in ``scoped_guarantees``.

Whatever the violations, the reported epsilon is a sound bound for what the
config would do, or ``None`` when no sound bound exists; the verdict is
:attr:`AuditReport.sound`. Task sizes are an argument: the guarantees layer does
not load data (``dpcl audit`` obtains them from the data layer or from
``[stream] task_sizes``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Sequence

from dpcl.errors import (
    BudgetExceededError,
    ConfigError,
    DisjointnessViolationError,
    InvalidParameterError,
    LabelSpaceViolationError,
    PrivacyViolationError,
)
from dpcl.guarantees.config import TrainingConfig
from dpcl.guarantees.label_space import (
    PROP_4_6_COUNTEREXAMPLE,
    PROP_F_1_COUNTEREXAMPLE,
    FilterReport,
    label_space_assumption,
    output_label_sets,
    require_proper_release,
)
from dpcl.guarantees.ledger import TaskLedger, compact_indices
from dpcl.guarantees.method_schema import ReleaseCoverage, TaskPlan

__all__ = ["AuditReport", "audit_config", "combined_release", "resolve_across_tasks", "NOT_COVERED_PREFIX"]

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

DISJOINT_ASSUMPTION = (
    "Tasks hold disjoint privacy units: no person/unit contributes data to two tasks (Tobaben et al., Thm 4.4)."
)
SHARED_ASSUMPTION = "Privacy units may occur in several tasks; releases compose sequentially (Tobaben et al., Thm 4.5)."
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


def _check_sizes(task_sizes: Sequence[int], n_tasks: int) -> list[int]:
    sizes = list(task_sizes)
    if n_tasks and len(sizes) != n_tasks:
        raise ConfigError(f"{len(sizes)} task sizes were given for {n_tasks} tasks; give one size per task.")
    if not sizes:
        raise ConfigError("the stream has no task; give at least one task.")
    for s in sizes:
        if isinstance(s, bool) or not isinstance(s, int) or s < 0:
            raise ConfigError(f"task sizes must be integers >= 0, got {s!r}.")
    return sizes


def audit_config(
    config: TrainingConfig,
    task_sizes: Sequence[int],
    *,
    filter_reports: Sequence[FilterReport] | None = None,
    unit_ids: Sequence[Any] | None = None,
) -> AuditReport:
    """Plan every task of ``config`` and report the stream's guarantee and its violations.

    ``task_sizes`` are the training examples of each task *after* label
    filtering; ``filter_reports`` (optional) are the per-task filter counts shown
    in the report; ``unit_ids`` (optional, one array per task) lets the audit
    check that tasks declared disjoint really hold disjoint privacy units.
    """
    privacy, stream, method, spec = config.privacy, config.stream, config.method, config.spec
    sizes = _check_sizes(task_sizes, config.n_tasks)
    violations: list[str] = []
    notes: list[str] = []
    assumptions: list[str] = []

    # first task from which the releases are not (epsilon, delta < 1)-DP at all (Prop. 4.6 / F.1): no bound exists
    not_dp_from: int | None = None
    if stream["label_space"] == "data":
        violations.append(PROP_4_6_COUNTEREXAMPLE)
        not_dp_from = 0
    else:
        # the public label sets dpcl run filters with (refused here exactly as the run would refuse them)
        output_label_sets(stream["label_space"], stream.get("prior_labels"), len(sizes))
        assumptions.append(label_space_assumption(stream["label_space"]))

    across, problems = resolve_across_tasks(privacy["across_tasks"], stream["disjoint_units"])
    violations.extend(problems)
    if unit_ids is not None:
        if len(unit_ids) != len(sizes):
            raise ConfigError(f"unit ids were given for {len(unit_ids)} tasks, the stream has {len(sizes)}.")
        if across == "parallel":
            probe = TaskLedger(delta=privacy["delta"], across_tasks="parallel")
            try:
                for t, ids in enumerate(unit_ids):
                    probe.register_units(t, ids)
            except DisjointnessViolationError as exc:
                violations.append(f"{exc} The stream is accounted sequentially instead.")
                across = "sequential"
    assumptions.append(DISJOINT_ASSUMPTION if across == "parallel" else SHARED_ASSUMPTION)
    assumptions.append(COUNTS_ASSUMPTION)

    plans = []
    seen_assumptions = dict.fromkeys(assumptions)
    seen_notes: dict[str, None] = {}
    trained_so_far = 0
    for t, n in enumerate(sizes):
        trained_so_far += n
        n_plan = trained_so_far if spec.reuses_past_tasks else n
        try:
            plan = spec.plan_task(method, privacy, n_plan, t)
        except (ConfigError, PrivacyViolationError):
            raise
        except InvalidParameterError as exc:
            if n_plan == 0:
                violations.append(
                    f"method {spec.name!r} cannot plan task {t}, which is empty after label filtering ({exc}), "
                    f"so it would release nothing: {PROP_F_1_COUNTEREXAMPLE}"
                )
                plans.append((t, 0, None))
                not_dp_from = t if not_dp_from is None else not_dp_from
                continue
            raise ConfigError(f"[method] cannot plan task {t}: {exc}") from None
        if n_plan == 0:
            try:
                require_proper_release(plan.noise, spec.name, t)
            except LabelSpaceViolationError as exc:
                violations.append(str(exc))
                not_dp_from = t if not_dp_from is None else not_dp_from
        plans.append((t, n_plan, plan))
        seen_assumptions.update(dict.fromkeys(plan.assumptions))
        seen_notes.update(dict.fromkeys(plan.notes))  # methods repeat a note per task; state it once
    assumptions = list(seen_assumptions)
    notes.extend(merge_task_notes(seen_notes))

    events_all = [e for _, _, p in plans if p is not None for e in p.events]
    adjacency = events_all[0].adjacency.value if events_all else privacy["adjacency"]
    unit = events_all[0].unit if events_all else "example"
    if adjacency != privacy["adjacency"]:
        notes.append(
            f"method {spec.name!r} accounts its events under {adjacency!r} adjacency (config says "
            f"{privacy['adjacency']!r}); the guarantee is stated under {adjacency!r}."
        )

    ledger = TaskLedger(
        delta=privacy["delta"],
        across_tasks=across,
        accountant=privacy["accountant"],
        adjacency=adjacency,
        unit=unit,
        total_epsilon=privacy.get("total_epsilon"),
        total_delta=privacy.get("total_delta"),
    )
    reports = {r.task_index: r for r in (filter_reports or ())}
    per_task: list[dict[str, Any]] = []
    scoped_ledgers: dict[str, tuple[str, TaskLedger]] = {}
    epsilon: float | None = None
    accountant_used = privacy["accountant"]
    stopped = False
    no_sound_bound = False
    for t, n_plan, plan in plans:
        entry: dict[str, Any] = {"task": t, "examples": sizes[t]}
        if spec.reuses_past_tasks:
            entry["trained_on_examples"] = n_plan
        if t in reports:
            entry["filtered_out"] = reports[t].filtered
        if plan is None:
            entry["status"] = "refused: releases nothing on an empty task (Prop. F.1)"
            per_task.append(entry)
            continue
        entry["noise"] = {k: v for k, v in plan.noise.items() if isinstance(v, (int, float, str, bool))}
        if stopped:
            entry["status"] = "not trained: stream stopped earlier"
            per_task.append(entry)
            continue
        if n_plan == 0:
            entry["status"] = "empty task: " + str(plan.noise.get("empty_task_release", "nothing released"))
        tasks_read = list(range(t + 1)) if spec.reuses_past_tasks else [t]
        if plan.events:
            try:
                ledger.charge(tasks_read, plan.events, label=f"{spec.name} task {t}")
            except BudgetExceededError as exc:
                violations.append(f"task {t} refused by the privacy filter (total_epsilon): {exc}")
                entry["status"] = "refused by the privacy filter"
                stopped = True
                per_task.append(entry)
                continue
            except PrivacyViolationError as exc:
                violations.append(str(exc))
                entry["status"] = "refused"
                stopped = no_sound_bound = True
                per_task.append(entry)
                continue
            if spec.reuses_past_tasks:
                # this release reads tasks 0..t; its own cost is accounted on its events alone
                entry["release_epsilon"] = ledger.events_epsilon(plan.events)
            else:
                entry["epsilon"] = ledger.task_guarantee(t)
        else:
            entry["epsilon"] = 0.0
        if ledger.charges:
            record = ledger.release(t)
            entry["cumulative_epsilon"] = record.guarantee.epsilon
            epsilon = record.guarantee.epsilon
            accountant_used = record.guarantee.accountant
        else:
            entry["cumulative_epsilon"] = 0.0
            epsilon = 0.0
        for scoped_plan in plan.scoped:  # statements about narrower releases, composed in ledgers of their own
            if scoped_plan.name not in scoped_ledgers:
                first = scoped_plan.events[0]
                scoped_ledgers[scoped_plan.name] = (
                    scoped_plan.scope,
                    TaskLedger(delta=privacy["delta"], across_tasks=across, accountant=privacy["accountant"],
                               adjacency=first.adjacency, unit=first.unit),
                )
            scoped_ledger = scoped_ledgers[scoped_plan.name][1]
            scoped_ledger.charge(tasks_read, scoped_plan.events, label=f"{spec.name} task {t} ({scoped_plan.name})")
            entry.setdefault("scoped", {})[scoped_plan.name] = scoped_ledger.release(t).guarantee.epsilon
        per_task.append(entry)
    if epsilon is None and stopped and not no_sound_bound:
        epsilon = 0.0  # the privacy filter refused the first task: nothing is released, nothing is spent
    if no_sound_bound:
        epsilon = None
    if not_dp_from is not None:
        # The ledger's numbers bound the noisy releases, but what the config releases alongside them (output
        # labels read from the data, or nothing on an empty task) is not DP for any epsilon: state no number.
        epsilon = None
        for entry in per_task:
            if entry["task"] >= not_dp_from:
                for key in ("epsilon", "release_epsilon", "cumulative_epsilon"):
                    entry.pop(key, None)
                entry.setdefault("status", "not DP: no epsilon bounds this release (see violations)")
        notes.append(
            f"no epsilon is reported from task {not_dp_from} on: the releases are not differentially private for any "
            "epsilon and delta < 1 (see violations); the per-task noise shown is what the method would add."
        )

    coverage = combined_release([p for _, _, p in plans if p is not None])
    if coverage is None:
        violations.append(UNDECLARED_VIOLATION.format(name=spec.name))
    elif not coverage.covered and getattr(config, "private", True):
        violations.extend(NOT_COVERED_PREFIX + reason for reason in coverage.reasons)
    covered = coverage is not None and coverage.covered
    if not covered:
        # the headline is the checkpoint: whatever the charged events bound, nothing bounds the checkpoint
        epsilon = None
        accountant_used = "none (not private)"
        for entry in per_task:
            for key in ("epsilon", "release_epsilon", "cumulative_epsilon"):
                entry.pop(key, None)
            entry.setdefault("status", "checkpoint not private: no epsilon bounds it (see release)")
        if coverage is not None:
            notes.append(NOT_COVERED_HINT)
    scoped_guarantees = []
    for name, (scope, scoped_ledger) in scoped_ledgers.items():
        g = scoped_ledger.guarantee()
        scoped_guarantees.append(
            {"name": name, "scope": scope, "epsilon": g.epsilon, "delta": g.delta, "adjacency": g.adjacency,
             "unit": g.unit, "accountant": g.accountant, "across_tasks": g.across_tasks}
        )

    total = privacy.get("total_epsilon")
    if total is not None and epsilon is not None and epsilon > total and not stopped:
        violations.append(
            f"the stream's epsilon {epsilon:.6g} exceeds total_epsilon = {total:g} by {epsilon - total:.6g}."
        )
    filter_state = ledger.filter_state() if ledger.uses_filter else {}
    if filter_state:
        states = list(filter_state.values())
        worst = max(states, key=lambda st: st["spent"]["epsilon"])
        scope = "the whole stream" if across == "sequential" else f"each task's data ({len(states)} filters)"
        notes.append(
            f"privacy filter over {scope}, {'/'.join(sorted({st['rule'] for st in states}))} rule: whatever the "
            f"tasks' parameters, even chosen adaptively, the guarded data stay ({worst['epsilon_budget']:g}, "
            f"{worst['delta_budget']:g})-DP; largest spent epsilon={worst['spent']['epsilon']:.6g}, "
            f"delta={worst['spent']['delta']:.3g} (basic filter: Rogers et al. 2016; GDP filter: Smith & Thakurta 2022)."
        )
    over = [p for p in per_task if p.get("epsilon") is not None and p["epsilon"] > privacy["epsilon"] * (1 + 1e-9)]
    if over:
        notes.append(
            f"accountant {privacy['accountant']!r} bounds task {over[0]['task']} at epsilon={over[0]['epsilon']:.6g}, "
            f"above the per-task budget {privacy['epsilon']:g} the noise was calibrated to: its upper bound is looser "
            "than the calibration's (both are sound). accountant = 'auto' reports the tightest sound bound."
        )
    return AuditReport(
        epsilon=epsilon,
        delta=privacy["delta"],
        across_tasks=across,
        accountant=accountant_used,
        adjacency=adjacency,
        unit=unit,
        method=spec.name,
        per_task=tuple(per_task),
        assumptions=tuple(assumptions),
        violations=tuple(violations),
        notes=tuple(notes),
        total_epsilon=total,
        filter=filter_state,
        private=covered,
        release=None if coverage is None else coverage.to_dict(),
        scoped_guarantees=tuple(scoped_guarantees),
    )
