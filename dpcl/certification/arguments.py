"""Validation of what a Certifier is opened and called with: run options, the run directory, label space,
composition across tasks, task indices and sizes, and its privacy settings."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np

from dpcl.errors import ConfigError, ExistingRunError, InvalidParameterError, PrivacyViolationError
from dpcl.guarantees.label_space import LabelSpacePolicy, output_label_sets
from dpcl.guarantees.ledger import Charge, TaskLedger, compress_events
from dpcl.guarantees.settings import ACROSS_TASKS_CHOICES, PrivacySettings

_METADATA_KEY = "certifier"
_SCOPE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*")
_FILENAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")


def _task_index(task: Any, n_tasks: int | None) -> int:
    if isinstance(task, bool) or not isinstance(task, (int, np.integer)) or int(task) < 0:
        raise InvalidParameterError(f"task must be a task index >= 0 (0-based), got {task!r}.")
    if n_tasks is not None and int(task) >= n_tasks:
        raise InvalidParameterError(
            f"task {int(task)} is outside the stream: prior_labels gives {n_tasks} per-task label sets "
            f"(label_space = 'prior'), so tasks are 0..{n_tasks - 1}."
        )
    return int(task)


def _uncommitted_charge(ledger: TaskLedger, tasks: Sequence[int], events: Sequence[Any]) -> Charge | None:
    """The ledger's last charge if it is ``events`` on ``tasks`` with no release after it, else None."""
    if not ledger.charges or (ledger.releases and ledger.releases[-1].n_charges == len(ledger.charges)):
        return None
    last = ledger.charges[-1]  # the ledger stores a run of equal events once with its count: compare in that form
    return last if last.tasks == tuple(int(t) for t in tasks) and last.events == compress_events(events) else None


def _charge_or_reuse(
    ledger: TaskLedger, tasks: Sequence[int], events: Sequence[Any], *, unit_ids: Any, label: str,
    reuse_uncommitted: bool,
) -> Charge:
    """Charge ``events`` on ``tasks`` to ``ledger``. With ``reuse_uncommitted`` (resuming after a crash), the
    ledger's last charge is returned instead when it is these events on these tasks with no release after it."""
    if reuse_uncommitted:
        uncommitted = _uncommitted_charge(ledger, tasks, events)
        if uncommitted is not None:
            return uncommitted
    return ledger.charge(tasks, events, unit_ids=unit_ids, label=label)


def check_reproducible_seed(seed: Any) -> None:
    """Refuse a ``reproducible_seed`` that is neither None (noise from OS entropy) nor an integer in [0, 2**64)."""
    if seed is not None and (
        isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or not 0 <= int(seed) < 2**64
    ):
        raise InvalidParameterError(
            f"reproducible_seed must be an integer in [0, 2**64) or None (noise from OS entropy), got {seed!r}."
        )


def _check_run_options(*, private: Any, resume: Any, driver: Any, config: Any, metadata: Any) -> None:
    if not isinstance(private, bool):
        raise InvalidParameterError(f"private must be True or False, got {private!r}.")
    if not isinstance(resume, bool):
        raise InvalidParameterError(f"resume must be True or False, got {resume!r}.")
    if driver is not None and (not isinstance(driver, str) or not driver.strip()):
        raise InvalidParameterError(f"driver must be the name of the program that drives run_dir, got {driver!r}.")
    if config is not None and not isinstance(config, Mapping):
        raise InvalidParameterError(f"config must be a mapping of sections, got {type(config).__name__}.")
    if metadata is not None and not isinstance(metadata, Mapping):
        raise InvalidParameterError(f"metadata must be a mapping, got {type(metadata).__name__}.")


def existing_run_files(run_dir: Path, *, run_state: bool = False) -> list[str]:
    """What in ``run_dir`` belongs to a run already (ledgers, certificates, checkpoints; with ``run_state`` also a
    driver's ``run.json``), as short names."""
    if not run_dir.is_dir():
        return []
    found = [name for name in (("run.json",) if run_state else ()) + ("ledger.json",) if (run_dir / name).is_file()]
    for sub, pattern in (("scoped", "*.ledger.json"), ("certificates", "*.cert.json"), ("checkpoints", "*")):
        files = sorted(p.name for p in (run_dir / sub).glob(pattern)) if (run_dir / sub).is_dir() else []
        if files:
            shown = ", ".join(files[:3]) + (f" and {len(files) - 3} more" if len(files) > 3 else "")
            found.append(f"{sub}/ ({len(files)} file{'s' if len(files) != 1 else ''}: {shown})")
    return found


def _refuse_existing_run(run_dir: Path) -> None:
    found = existing_run_files(run_dir)
    if found:
        raise ExistingRunError(
            f"{str(run_dir)!r} already holds a run: {'; '.join(found)}. Running again into it would charge its "
            "tasks again; continue that run with resume=True, or give a new directory."
        )


def _label_space(label_space: Any, prior_labels: Any, *, dry_run: bool = False
                 ) -> tuple[LabelSpacePolicy, list[Any], int | None]:
    """The policy, its public label sets and the number of tasks (None: open-ended, ``prior_const``). A dry run
    accepts ``data`` (it releases nothing; ``dpcl audit`` reports the violation and still states the charges)."""
    try:
        policy = LabelSpacePolicy.parse(label_space)
        if dry_run and policy is LabelSpacePolicy.DATA:
            return policy, [], None
        if policy is LabelSpacePolicy.PRIOR:
            n_tasks = len(prior_labels) if isinstance(prior_labels, (list, tuple)) else 0
            return policy, output_label_sets(policy, _plain(prior_labels), max(n_tasks, 1)), n_tasks
        # prior_const (data is refused by output_label_sets)
        return policy, output_label_sets(policy, _plain(prior_labels), 1), None
    except ConfigError as exc:  # the label-space checks speak config ("[stream] prior_labels ..."); say arguments
        raise InvalidParameterError(str(exc).replace("[stream] ", "")) from None


def _composition(across_tasks: Any, disjoint_units: Any) -> tuple[str, bool]:
    """The composition across tasks (Tobaben et al., Thm 4.4 / 4.5) and the disjointness it relies on."""
    if across_tasks not in ACROSS_TASKS_CHOICES:
        raise InvalidParameterError(
            f"across_tasks must be one of {', '.join(ACROSS_TASKS_CHOICES)}, got {across_tasks!r}."
        )
    if disjoint_units is not None and not isinstance(disjoint_units, bool):
        raise InvalidParameterError(f"disjoint_units must be true, false or None, got {disjoint_units!r}.")
    if across_tasks == "auto":
        if disjoint_units is None:
            raise InvalidParameterError(
                "across_tasks = 'auto' needs disjoint_units: say whether tasks hold disjoint privacy units "
                "(True: parallel composition, Thm 4.4) or not (False: sequential, Thm 4.5)."
            )
        return ("parallel" if disjoint_units else "sequential"), disjoint_units
    if across_tasks == "parallel":
        if disjoint_units is False:
            raise PrivacyViolationError(
                "across_tasks = 'parallel' but disjoint_units = False: parallel composition (Tobaben et al., "
                "Thm 4.4) needs tasks with disjoint privacy units. Use across_tasks = 'sequential' (or 'auto')."
            )
        return "parallel", True
    return "sequential", bool(disjoint_units)


def _task_sizes(task_sizes: Any, n_tasks: int | None) -> list[int] | None:
    if task_sizes is None:
        return None
    sizes = list(task_sizes)
    if any(isinstance(s, bool) or not isinstance(s, (int, np.integer)) or int(s) < 0 for s in sizes):
        raise InvalidParameterError(f"task_sizes must be integers >= 0, got {list(task_sizes)!r}.")
    if n_tasks is not None and len(sizes) != n_tasks:
        raise InvalidParameterError(f"task_sizes gives {len(sizes)} sizes for the {n_tasks} tasks of prior_labels.")
    return [int(s) for s in sizes]


def _plain(value: Any) -> Any:
    """JSON-comparable form of a setting (tuples -> lists, numpy ints -> int)."""
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, np.integer):
        return int(value)
    return value


_UNSET: Any = object()
#: The ``run_dir`` of a dry run (:meth:`Certifier.dry_run`).
_DRY_RUN: Any = object()


def _certifier_settings(settings: Any, given: Mapping[str, Any], config: Any) -> PrivacySettings:
    """The Certifier's :class:`PrivacySettings`: ``settings``, or one built from the keyword arguments (not both);
    ``config`` (the certificate's config section) is recorded with them."""
    if settings is not None:
        if not isinstance(settings, PrivacySettings):
            raise InvalidParameterError(f"settings must be PrivacySettings, got {type(settings).__name__}.")
        if given:
            raise InvalidParameterError(
                f"give the privacy settings either as settings=PrivacySettings(...) or as keyword arguments, not "
                f"both (got settings and {', '.join(sorted(given))})."
            )
    else:
        for name in ("delta", "label_space", "prior_labels"):
            if name not in given:
                raise InvalidParameterError(f"{name} is required (or give settings=PrivacySettings(...)).")
        settings = PrivacySettings(**given)
    return settings if config is None else settings.replace(recorded=dict(config))

