"""Audit a training config without training: the total guarantee of the run it describes.

:func:`audit_config` plans every task with the method's
:class:`~dpcl.guarantees.method_schema.MethodSpec` (the same plan ``dpcl run``
trains with), charges the planned events to a dry run of the
:class:`~dpcl.Certifier` (:meth:`~dpcl.Certifier.dry_run`: the charges, privacy
filter, commits and composition of ``dpcl run``, in memory; one certification
path, not two), and reports the cumulative guarantee after every release
together with every privacy violation it finds:

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

from dataclasses import dataclass
from typing import Any, Mapping, Sequence

from dpcl.certifier import DISJOINT_ASSUMPTION, SHARED_ASSUMPTION, Certifier
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
from dpcl.guarantees.method_schema import TaskPlan

# what the audit reports, and its rules; re-exported here, where they have always been imported
from dpcl.certification.audit_report import (
    COUNTS_ASSUMPTION,
    NOT_COVERED_HINT,
    NOT_COVERED_PREFIX,
    UNDECLARED_VIOLATION,
    AuditReport,
    combined_release,
    merge_task_notes,
    resolve_across_tasks,
)

__all__ = ["AuditReport", "audit_config", "combined_release", "resolve_across_tasks", "NOT_COVERED_PREFIX"]


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


@dataclass
class _Stream:
    """What charging the plans so far says: the headline epsilon, its accountant, and whether the stream stopped."""

    epsilon: float | None = None
    accountant: str = "auto"
    stopped: bool = False
    no_sound_bound: bool = False


def _declared_disjointness(certifier: Certifier, unit_ids: Sequence[Any] | None, n_tasks: int,
                           violations: list[str]) -> bool:
    """Whether the unit ids (when given) hold the declared disjointness; the violation is stated when they do not.
    The ids are registered with the dry run's ledger, as ``dpcl run`` charges them with its data."""
    if unit_ids is None:
        return True
    if len(unit_ids) != n_tasks:
        raise ConfigError(f"unit ids were given for {len(unit_ids)} tasks, the stream has {n_tasks}.")
    if certifier.across_tasks != "parallel":
        return True
    try:
        for t, ids in enumerate(unit_ids):
            certifier.ledger.register_units(t, ids)
    except DisjointnessViolationError as exc:
        violations.append(f"{exc} The stream is accounted sequentially instead.")
        return False
    return True


def _plan_stream(config: TrainingConfig, sizes: Sequence[int], violations: list[str]
                 ) -> tuple[list[tuple[int, int, TaskPlan | None]], int | None]:
    """Every task's plan (None: an empty task the method cannot plan, Prop. F.1), as ``dpcl run`` plans it, and the
    first task whose release is not DP for any epsilon (None: none)."""
    spec, not_dp_from = config.spec, None
    plans: list[tuple[int, int, TaskPlan | None]] = []
    trained_so_far = 0
    for t, n in enumerate(sizes):
        trained_so_far += n
        n_plan = trained_so_far if spec.reuses_past_tasks else n
        try:
            plan = spec.plan_task(config.method, config.settings, n_plan, t)
        except (ConfigError, PrivacyViolationError):
            raise
        except InvalidParameterError as exc:
            if n_plan != 0:
                raise ConfigError(f"[method] cannot plan task {t}: {exc}") from None
            violations.append(
                f"method {spec.name!r} cannot plan task {t}, which is empty after label filtering ({exc}), "
                f"so it would release nothing: {PROP_F_1_COUNTEREXAMPLE}"
            )
            plans.append((t, 0, None))
            not_dp_from = t if not_dp_from is None else not_dp_from
            continue
        if n_plan == 0:
            try:
                require_proper_release(plan.noise, spec.name, t)
            except LabelSpaceViolationError as exc:
                violations.append(str(exc))
                not_dp_from = t if not_dp_from is None else not_dp_from
        plans.append((t, n_plan, plan))
    return plans, not_dp_from


def _charge_task(certifier: Certifier, spec: Any, t: int, plan: TaskPlan, entry: dict[str, Any],
                 stream: _Stream, violations: list[str]) -> None:
    """Charge task ``t``'s plan to the dry run as ``dpcl run`` charges it (headline, then scoped statements) and
    commit its release; ``entry`` gets the task's numbers."""
    tasks_read = list(range(t + 1)) if spec.reuses_past_tasks else [t]
    if plan.events:
        try:
            certifier.charge(tasks_read, plan.events, label=f"{spec.name} task {t}")
        except BudgetExceededError as exc:
            violations.append(f"task {t} refused by the privacy filter (total_epsilon): {exc}")
            entry["status"] = "refused by the privacy filter"
            stream.stopped = True
            return
        except PrivacyViolationError as exc:
            violations.append(str(exc))
            entry["status"] = "refused"
            stream.stopped = stream.no_sound_bound = True
            return
        if spec.reuses_past_tasks:
            # this release reads tasks 0..t; its own cost is accounted on its events alone
            entry["release_epsilon"] = certifier.ledger.events_epsilon(plan.events)
        else:
            entry["epsilon"] = certifier.task_epsilon(t)
    else:
        entry["epsilon"] = 0.0
    if certifier.ledger.charges:
        record = certifier.commit(t, checkpoint_sha256=None, empty_task=not plan.events)
        stream.epsilon = entry["cumulative_epsilon"] = record.guarantee.epsilon
        stream.accountant = record.guarantee.accountant
    else:
        stream.epsilon = entry["cumulative_epsilon"] = 0.0
    for scoped in plan.scoped:  # statements about narrower releases, composed in ledgers of their own
        certifier.charge_scoped(scoped.name, scoped.scope, tasks_read, scoped.events,
                                label=f"{spec.name} task {t} ({scoped.name})")
        certifier.release_scoped(scoped.name, t)
        ledger = certifier.scoped_statements()[scoped.name][1]
        entry.setdefault("scoped", {})[scoped.name] = ledger.releases[-1].guarantee.epsilon


def _drop_epsilons(per_task: Sequence[dict[str, Any]], status: str, from_task: int = 0) -> None:
    for entry in per_task:
        if entry["task"] >= from_task:
            for key in ("epsilon", "release_epsilon", "cumulative_epsilon"):
                entry.pop(key, None)
            entry.setdefault("status", status)


def _label_space_findings(settings: Any, n_tasks: int, violations: list[str], assumptions: list[str]) -> bool:
    """False for ``label_space = "data"`` (not DP at all, Prop. 4.6); otherwise the public label sets ``dpcl run``
    filters with are checked (refused here exactly as the run would refuse them) and their assumption stated."""
    if settings.label_space == "data":
        violations.append(PROP_4_6_COUNTEREXAMPLE)
        return False
    output_label_sets(settings.label_space, settings.prior_labels, n_tasks)
    assumptions.append(label_space_assumption(settings.label_space))
    return True


def _plan_notes(plans: Sequence[Any], spec: Any, adjacency: str, settings: Any) -> list[str]:
    """The plans' notes, each once (methods repeat a note per task), and a note when the method's adjacency is
    not the config's."""
    notes = merge_task_notes(list(dict.fromkeys(n for _, _, p in plans if p is not None for n in p.notes)))
    if adjacency != settings.adjacency:
        notes.append(
            f"method {spec.name!r} accounts its events under {adjacency!r} adjacency (config says "
            f"{settings.adjacency!r}); the guarantee is stated under {adjacency!r}."
        )
    return notes


def _charge_plans(certifier: Certifier, spec: Any, plans: Sequence[Any], sizes: Sequence[int],
                  filter_reports: Sequence[FilterReport] | None, accountant: str,
                  violations: list[str]) -> tuple[list[dict[str, Any]], "_Stream"]:
    """Charge every task's plan to the dry run, in order, as ``dpcl run`` would; one report entry per task."""
    reports = {r.task_index: r for r in (filter_reports or ())}
    per_task: list[dict[str, Any]] = []
    stream = _Stream(accountant=accountant)
    for t, n_plan, plan in plans:
        entry: dict[str, Any] = {"task": t, "examples": sizes[t]}
        per_task.append(entry)
        if spec.reuses_past_tasks:
            entry["trained_on_examples"] = n_plan
        if t in reports:
            entry["filtered_out"] = reports[t].filtered
        if plan is None:
            entry["status"] = "refused: releases nothing on an empty task (Prop. F.1)"
            continue
        entry["noise"] = {k: v for k, v in plan.noise.items() if isinstance(v, (int, float, str, bool))}
        if stream.stopped:
            entry["status"] = "not trained: stream stopped earlier"
            continue
        if n_plan == 0:
            entry["status"] = "empty task: " + str(plan.noise.get("empty_task_release", "nothing released"))
        _charge_task(certifier, spec, t, plan, entry, stream, violations)
    return per_task, stream


def _charged_epsilon(stream: "_Stream", not_dp_from: int | None, per_task: Sequence[dict[str, Any]],
                     notes: list[str]) -> float | None:
    """The stream's epsilon as charged; None where no epsilon bounds the releases."""
    epsilon = stream.epsilon
    if epsilon is None and stream.stopped and not stream.no_sound_bound:
        epsilon = 0.0  # the privacy filter refused the first task: nothing is released, nothing is spent
    if stream.no_sound_bound:
        epsilon = None
    if not_dp_from is not None:
        # The ledger's numbers bound the noisy releases, but what the config releases alongside them (output
        # labels read from the data, or nothing on an empty task) is not DP for any epsilon: state no number.
        epsilon = None
        _drop_epsilons(per_task, "not DP: no epsilon bounds this release (see violations)", not_dp_from)
        notes.append(
            f"no epsilon is reported from task {not_dp_from} on: the releases are not differentially private for any "
            "epsilon and delta < 1 (see violations); the per-task noise shown is what the method would add."
        )
    return epsilon


def _release_coverage(config: TrainingConfig, plans: Sequence[Any], violations: list[str]) -> Any:
    """Whether the released checkpoint is covered by the charged events (None: a plan does not say)."""
    coverage = combined_release([p for _, _, p in plans if p is not None])
    if coverage is None:
        violations.append(UNDECLARED_VIOLATION.format(name=config.spec.name))
    elif not coverage.covered and getattr(config, "private", True):
        violations.extend(NOT_COVERED_PREFIX + reason for reason in coverage.reasons)
    return coverage


def _scoped_guarantees(certifier: Certifier) -> list[dict[str, Any]]:
    out = []
    for name, (scope, scoped_ledger) in certifier.scoped_statements().items():
        g = scoped_ledger.guarantee()
        out.append(
            {"name": name, "scope": scope, "epsilon": g.epsilon, "delta": g.delta, "adjacency": g.adjacency,
             "unit": g.unit, "accountant": g.accountant, "across_tasks": g.across_tasks}
        )
    return out


def _budget_findings(settings: Any, epsilon: float | None, stream: "_Stream", certifier: Certifier,
                     per_task: Sequence[dict[str, Any]], across: str, violations: list[str],
                     notes: list[str]) -> dict[str, Any]:
    """A stream epsilon above ``total_epsilon``, the privacy filter's state, and a per-task bound above the budget
    the noise was calibrated to; returns the filter's state."""
    total = settings.total_epsilon
    if total is not None and epsilon is not None and epsilon > total and not stream.stopped:
        violations.append(
            f"the stream's epsilon {epsilon:.6g} exceeds total_epsilon = {total:g} by {epsilon - total:.6g}."
        )
    filter_state = certifier.ledger.filter_state() if certifier.ledger.uses_filter else {}
    if filter_state:
        notes.append(_filter_note(filter_state, across))
    over = [p for p in per_task if p.get("epsilon") is not None and p["epsilon"] > settings.epsilon * (1 + 1e-9)]
    if over:
        notes.append(
            f"accountant {settings.accountant!r} bounds task {over[0]['task']} at epsilon={over[0]['epsilon']:.6g}, "
            f"above the per-task budget {settings.epsilon:g} the noise was calibrated to: its upper bound is looser "
            "than the calibration's (both are sound). accountant = 'auto' reports the tightest sound bound."
        )
    return filter_state


def audit_config(
    config: TrainingConfig,
    task_sizes: Sequence[int],
    *,
    filter_reports: Sequence[FilterReport] | None = None,
    unit_ids: Sequence[Any] | None = None,
) -> AuditReport:
    """Plan every task of ``config``, charge the plans to a dry run of the :class:`~dpcl.Certifier` (in memory,
    as ``dpcl run`` charges them) and report the stream's guarantee and its violations.

    ``task_sizes`` are the training examples of each task *after* label
    filtering; ``filter_reports`` (optional) are the per-task filter counts shown
    in the report; ``unit_ids`` (optional, one array per task) lets the audit
    check that tasks declared disjoint really hold disjoint privacy units.
    """
    settings, spec = config.settings, config.spec
    sizes = _check_sizes(task_sizes, config.n_tasks)
    violations: list[str] = []
    assumptions: list[str] = []
    # first task from which the releases are not (epsilon, delta < 1)-DP at all (Prop. 4.6 / F.1): no bound exists
    not_dp_label_space = not _label_space_findings(settings, len(sizes), violations, assumptions)
    across, problems = resolve_across_tasks(settings.across_tasks, settings.disjoint_units)
    violations.extend(problems)

    plans, not_dp_from = _plan_stream(config, sizes, violations)
    not_dp_from = 0 if not_dp_label_space else not_dp_from
    events_all = [e for _, _, p in plans if p is not None for e in p.events]
    adjacency = events_all[0].adjacency.value if events_all else settings.adjacency
    unit = events_all[0].unit if events_all else "example"

    def dry_run(mode: str) -> Certifier:
        return Certifier.dry_run(settings.replace(across_tasks=mode, adjacency=adjacency, unit=unit),
                                 method=spec.name)

    certifier = dry_run(across)
    if not _declared_disjointness(certifier, unit_ids, len(sizes), violations):
        across = "sequential"
        certifier = dry_run(across)
    assumptions.append(DISJOINT_ASSUMPTION if across == "parallel" else SHARED_ASSUMPTION)
    assumptions.append(COUNTS_ASSUMPTION)
    for _, _, plan in plans:
        assumptions.extend(a for a in (plan.assumptions if plan else ()) if a not in assumptions)
    notes = _plan_notes(plans, spec, adjacency, settings)

    per_task, stream = _charge_plans(certifier, spec, plans, sizes, filter_reports, settings.accountant, violations)
    epsilon, accountant_used = _charged_epsilon(stream, not_dp_from, per_task, notes), stream.accountant
    coverage = _release_coverage(config, plans, violations)
    covered = coverage is not None and coverage.covered
    if not covered:
        # the headline is the checkpoint: whatever the charged events bound, nothing bounds the checkpoint
        epsilon = None
        accountant_used = "none (not private)"
        _drop_epsilons(per_task, "checkpoint not private: no epsilon bounds it (see release)")
        if coverage is not None:
            notes.append(NOT_COVERED_HINT)
    scoped_guarantees = _scoped_guarantees(certifier)
    filter_state = _budget_findings(settings, epsilon, stream, certifier, per_task, across, violations, notes)
    return AuditReport(
        epsilon=epsilon,
        delta=settings.delta,
        across_tasks=across,
        accountant=accountant_used,
        adjacency=adjacency,
        unit=unit,
        method=spec.name,
        per_task=tuple(per_task),
        assumptions=tuple(assumptions),
        violations=tuple(violations),
        notes=tuple(notes),
        total_epsilon=settings.total_epsilon,
        filter=filter_state,
        private=covered,
        release=None if coverage is None else coverage.to_dict(),
        scoped_guarantees=tuple(scoped_guarantees),
        dry_run=certifier,
    )


def _filter_note(filter_state: Mapping[str, Any], across: str) -> str:
    states = list(filter_state.values())
    worst = max(states, key=lambda st: st["spent"]["epsilon"])
    scope = "the whole stream" if across == "sequential" else f"each task's data ({len(states)} filters)"
    return (
        f"privacy filter over {scope}, {'/'.join(sorted({st['rule'] for st in states}))} rule: whatever the "
        f"tasks' parameters, even chosen adaptively, the guarded data stay ({worst['epsilon_budget']:g}, "
        f"{worst['delta_budget']:g})-DP; largest spent epsilon={worst['spent']['epsilon']:.6g}, "
        f"delta={worst['spent']['delta']:.3g} (basic filter: Rogers et al. 2016; GDP filter: Smith & Thakurta 2022)."
    )
