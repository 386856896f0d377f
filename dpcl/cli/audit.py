"""``dpcl audit CONFIG.toml [--json]``: the total privacy guarantee of a training config, without training.

Exit codes: 0 when the config is sound, 3 when it has a privacy violation
(label space from the data, budget over ``total_epsilon``, overlapping units
declared disjoint, a private run of a method whose checkpoint is not covered by
its charged events -- PeCL as in the paper -- ...) or when it asks for a
non-private run (``[run] private = false``), 2 when the config is invalid (missing or unknown key,
wrong type, out-of-range value).

Task sizes come from ``[stream] task_sizes`` when given (sizes after label
filtering, for datasets dpcl does not bundle), otherwise from the data layer
(:func:`dpcl.data.task_sizes`), which reads labels only.
"""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING, Any

from dpcl.cli.output import add_json_flag, emit
from dpcl.errors import ConfigError, InvalidParameterError

if TYPE_CHECKING:  # imported where used: every command's module is imported to build the parser (start-up time)
    from dpcl.audit_config import AuditReport
    from dpcl.guarantees.config import TrainingConfig
    from dpcl.guarantees.label_space import FilterReport


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "audit",
        help="total privacy guarantee of a training config, without training",
        description=(
            "Plan every task of a training config with the method's privacy plan (the one `dpcl run` trains "
            "with) and report the stream's (epsilon, delta), per-task costs, assumptions and privacy violations, "
            "and what training costs (parameters, peak memory, optimiser steps, examples). "
            "Exit 0: sound; 3: privacy violation; 2: invalid config, or one whose training does not fit in memory."
        ),
    )
    parser.add_argument("config", metavar="CONFIG.toml", help="training config (see docs/guarantees.md)")
    add_json_flag(parser)
    parser.set_defaults(handler=run_audit, time_hint=(
        "the config's accounting is too expensive here; try [privacy] accountant = \"rdp\" (fastest, a looser "
        "bound), fewer tasks, or fewer epochs"))


def _data_stream_keys() -> tuple[str, ...] | None:
    try:
        # lazy import: keeps CLI start-up fast (only this command needs it)
        from dpcl.data import STREAM_KEYS
    except ImportError:  # pragma: no cover - data layer not installed in this build
        return None
    return tuple(STREAM_KEYS)


def stream_task_sizes(config: TrainingConfig) -> tuple[list[int], list[FilterReport], list[str]]:
    """Training examples per task after label filtering, the filter counts, and notes.

    ``[stream] task_sizes`` wins when given. Otherwise the data layer's labels of
    each task are filtered to the task's public label set (Eq. 6). Under
    ``label_space = "data"`` (refused by the audit anyway) nothing is filtered.
    """
    # lazy import: keeps CLI start-up fast (only this command needs it)
    from dpcl.guarantees.label_space import FilterReport, filter_task, output_label_sets

    stream = config.stream
    if stream.get("task_sizes") is not None:
        return list(stream["task_sizes"]), [], ["task sizes taken from [stream] task_sizes (after label filtering)."]
    try:
        # lazy import: keeps CLI start-up fast (only this command needs it)
        import dpcl.data as data
    except ImportError as exc:  # pragma: no cover - data layer not installed in this build
        raise ConfigError(f"cannot load dataset {stream['dataset']!r} ({exc}); give [stream] task_sizes.") from None
    section = {k: v for k, v in config.raw["stream"].items()}
    task_labels = getattr(data, "task_train_labels", None)
    try:
        if task_labels is not None:
            labels_per_task = task_labels(section)
            sizes_raw = [int(len(y)) for y in labels_per_task]
        else:
            labels_per_task = None
            sizes_raw = data.task_sizes(section)
    except InvalidParameterError as exc:
        message = str(exc) if isinstance(exc, ConfigError) else f"[stream] {exc}"
        if not _loadable_dataset(stream["dataset"]):
            message += (
                " To audit a dataset dpcl does not load, give [stream] task_sizes = [n_1, ..., n_T] "
                "(training examples per task after label filtering)."
            )
        elif isinstance(exc, ConfigError):
            raise
        raise ConfigError(message) from None
    if config.settings.label_space == "data":
        return sizes_raw, [], []
    label_sets = output_label_sets(config.settings.label_space, config.settings.prior_labels, len(sizes_raw))
    if labels_per_task is not None:
        reports = [filter_task(y, label_sets[t], t)[1] for t, y in enumerate(labels_per_task)]
        return [r.kept for r in reports], reports, []
    # Without per-example labels the filtered size is known only when no example can be filtered out:
    # a class-incremental task holds exactly the labels of its group.
    kind = section.get("kind", "class_incremental")
    groups = stream.get("tasks")
    if kind == "class_incremental" and groups is not None and all(
        set(g) <= label_sets[t] for t, g in enumerate(groups)
    ):
        reports = [FilterReport(t, n, 0) for t, n in enumerate(sizes_raw)]
        return sizes_raw, reports, []
    raise ConfigError(
        f"cannot tell how many examples the public label sets keep for a {kind!r} stream whose tasks hold labels "
        "outside their prior_labels; give [stream] task_sizes (training examples per task after label filtering)."
    )


def _loadable_dataset(name: Any) -> bool:
    """Whether the data layer knows the dataset name (it may still fail to read its files)."""
    # lazy import: keeps CLI start-up fast (only this command needs it)
    from dpcl.data.registry import _resolve

    try:
        _resolve(name)
    except InvalidParameterError:
        return False
    return True


def stream_unit_ids(config: TrainingConfig) -> list[Any] | None:
    """Privacy-unit ids of each task's training examples, when the data layer can list them
    (``dpcl.data.task_train_unit_ids``) and the sizes do not come from ``[stream] task_sizes``."""
    if config.stream.get("task_sizes") is not None:
        return None
    try:
        # lazy import: keeps CLI start-up fast (only this command needs it)
        import dpcl.data as data
    except ImportError:  # pragma: no cover
        return None
    lister = getattr(data, "task_train_unit_ids", None)
    if lister is None:
        return None
    return list(lister(dict(config.raw["stream"])))


NOT_PRIVATE_VIOLATION = (
    "the run is NOT private: [run] private = false trains without clipping or noise, so its releases have no "
    "differential-privacy guarantee at all (epsilon is infinite). Remove `private = false` from [run] (or set it "
    "to true) to train with the privacy plan audited here and get a guarantee."
)


NOT_PRIVATE_NOT_COVERED_VIOLATION = (
    "the run is NOT private: [run] private = false runs the method's plan as it is, and its released checkpoint "
    "is not covered by any charged release, so it has no differential-privacy guarantee (epsilon is infinite). "
    "Why: {reasons} The statements in scoped_guarantees hold only for what their scope names, never for the "
    "checkpoint."
)


def non_private_report(report: AuditReport) -> AuditReport:
    """The audit of a ``[run] private = false`` config: no epsilon for the checkpoint, one violation saying why.

    For a method whose checkpoint is covered by its plan, the run adds no noise (a non-private reference
    run): the plan is still checked (so a broken config is still refused), but no planned epsilon holds.
    For a plan that is not covered (PeCL as in the paper), the run trains the plan as it is: the per-task
    noise and the scoped statements stay in the report, the checkpoint has no guarantee.
    """
    # lazy import: keeps CLI start-up fast (only this command needs it)
    from dpcl.audit_config import AuditReport

    if report.release is not None and not report.release["covered"]:
        reasons = " ".join(report.release["reasons"])
        return AuditReport(
            **{
                **report.__dict__,
                "epsilon": None,
                "violations": (NOT_PRIVATE_NOT_COVERED_VIOLATION.format(reasons=reasons),) + report.violations,
                "private": False,
            }
        )
    per_task = tuple(
        {
            **{k: v for k, v in entry.items() if k not in ("epsilon", "release_epsilon", "cumulative_epsilon", "noise")},
            "status": "not private: trained without noise",
        }
        for entry in report.per_task
    )
    return AuditReport(
        **{
            **report.__dict__,
            "epsilon": None,
            "accountant": "none (not private)",
            "per_task": per_task,
            "violations": (NOT_PRIVATE_VIOLATION,) + report.violations,
            "notes": ("The method's privacy plan was checked (a broken config is still refused) but the run does not "
                      "apply it: no noise is added, so no planned epsilon holds.",),
            "filter": {},
            "private": False,
            "scoped_guarantees": (),
        }
    )


def _no_unit(report: AuditReport) -> str:
    """A checkpoint that is not private protects no unit: say so, with the units the scoped statements protect."""
    scoped = "; ".join(f"scoped {s['name']}: {s['adjacency']} / {s['unit']}" for s in report.scoped_guarantees)
    return "none: the checkpoint is not private" + (f" ({scoped})" if scoped else "")


def _table_payload(report: AuditReport) -> dict[str, Any]:
    # lazy import: keeps CLI start-up fast (only this command needs it)
    from dpcl.audit_config import NOT_COVERED_PREFIX

    if not report.private and report.sound:
        verdict, no_epsilon = "NOT PRIVATE", "none: not private (epsilon is infinite)"
    elif not report.private:
        verdict = "NOT PRIVATE" if not report.violations[0].startswith(NOT_COVERED_PREFIX) else (
            "PRIVACY VIOLATION: NOT PRIVATE"
        )
        no_epsilon = "none: the checkpoint is not private (epsilon is infinite)"
    else:
        verdict, no_epsilon = ("sound" if report.sound else "PRIVACY VIOLATION"), "no sound bound"
    payload: dict[str, Any] = {
        "verdict": verdict,
        "epsilon": report.epsilon if report.epsilon is not None else no_epsilon,
        "delta": report.delta,
        "across_tasks": report.across_tasks,
        "accountant": report.accountant,
        "adjacency / unit": f"{report.adjacency} / {report.unit}" if report.private else _no_unit(report),
        "method": report.method,
    }
    if report.total_epsilon is not None:
        payload["total_epsilon"] = report.total_epsilon
        for key, state in report.filter.items():
            payload[f"filter {key}"] = (
                f"{state['rule']} rule: spent epsilon={state['spent']['epsilon']:.6g}, "
                f"delta={state['spent']['delta']:.3g} of ({state['epsilon_budget']:g}, {state['delta_budget']:g})"
            )
    for entry in report.per_task:
        parts = [f"n={entry['examples']}"]
        if "filtered_out" in entry:
            parts.append(f"filtered={entry['filtered_out']}")
        for key in ("epsilon", "release_epsilon", "cumulative_epsilon"):
            if entry.get(key) is not None:
                parts.append(f"{key}={entry[key]:.6g}")
        for name, value in entry.get("scoped", {}).items():
            parts.append(f"scoped {name}: cumulative_epsilon={value:.6g}")
        if "status" in entry:
            parts.append(entry["status"])
        payload[f"task {entry['task']}"] = ", ".join(parts)
    if report.release is not None and not report.release["covered"]:
        payload["checkpoint"] = "NOT PRIVATE: no epsilon bounds the released checkpoint\n" + "\n".join(
            f"- {r}" for r in report.release["reasons"]
        )
    elif report.release is not None and report.private:
        payload["checkpoint"] = "private: " + report.release["basis"]
    for scoped in report.scoped_guarantees:
        payload[f"scoped {scoped['name']}"] = (
            f"epsilon={scoped['epsilon']:.6g}, delta={scoped['delta']:g}, {scoped['adjacency']} / {scoped['unit']}, "
            f"accountant {scoped['accountant']}, {scoped['across_tasks']}: {scoped['scope']}"
        )
    payload["assumptions"] = "\n".join(f"- {a}" for a in report.assumptions)
    if report.violations:
        payload["violations"] = "\n".join(f"- {v}" for v in report.violations)
    if report.notes:
        payload["notes"] = "\n".join(report.notes)
    # the table is rendered by rich: "[run]", "[stream]"... are text, not markup
    from rich.markup import escape

    return {key: escape(value) if isinstance(value, str) else value for key, value in payload.items()}


def run_audit(args: argparse.Namespace) -> int:
    # lazy import: keeps CLI start-up fast (only this command needs it)
    from dpcl.audit_config import NOT_COVERED_PREFIX, AuditReport, audit_config
    from dpcl.guarantees.config import load_config

    config = load_config(args.config, data_stream_keys=_data_stream_keys())
    sizes, reports, size_notes = stream_task_sizes(config)
    report = audit_config(config, sizes, filter_reports=reports, unit_ids=stream_unit_ids(config))
    if size_notes:
        report = AuditReport(**{**report.__dict__, "notes": tuple(size_notes) + report.notes})
    if not config.private:
        report = non_private_report(report)
    # lazy import: keeps CLI start-up fast (the cost estimate reads the method layer)
    from dpcl.runner.cost import audit_cost, cost_rows  # training cost; refuses (exit 2) what cannot fit

    cost = audit_cost(config, sizes)
    if getattr(args, "json", False):
        emit(args, "dpcl audit", {**report.to_dict(), "cost": cost})
    else:
        emit(args, f"dpcl audit {args.config}", {**_table_payload(report), **cost_rows(cost)})
    if not report.sound:
        more = f" (and {len(report.violations) - 1} more, listed in the output)" if len(report.violations) > 1 else ""
        first = " ".join(report.violations[0].split())
        kind = "privacy violation: " if report.private or report.violations[0].startswith(NOT_COVERED_PREFIX) else ""
        sys.stderr.write(f"dpcl audit: {kind}{first}{more}\n")
    return report.exit_code
