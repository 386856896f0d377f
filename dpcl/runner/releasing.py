"""Stages ``release``, ``commit`` and ``certify`` of one task: checkpoint and curator state written under pending
names, the release committed to the ledger (the commit point), the files renamed, the certificate written."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from dpcl._io.atomic_io import read_json, sha256_file
from dpcl._version import __version__
from dpcl.errors import ConfigError
from dpcl.guarantees.method_schema import ReleaseCoverage
from dpcl.methods.noise_source import noise_assumptions, poisson_subsampled
from dpcl.runner.run_state import ReleaseSummary
from dpcl.runner.tasks import NON_PRIVATE_STATEMENT
from dpcl.runner.run_types import RunInProgress


#: First reason of a ``[run] private = false`` run of a plan that does not cover its checkpoint.
NOT_COVERED_RUN_STATEMENT = (
    "This checkpoint was trained by a run with [run] private = false of a method whose released checkpoint is not "
    "covered by any charged release: it offers no differential-privacy guarantee for its training data (epsilon is "
    "infinite), for the reasons below. The noise of the method's plan was applied; what it protects is stated in "
    "scoped_guarantees, each for its scope only."
)

#: Stated in every certificate of a ``dpcl run``: what the certificate does not cover.
CURATOR_STATE_ASSUMPTION = (
    "The certificate covers the released checkpoint only. The run directory's curator/ files (method state "
    "computed from the private data without noise, e.g. privacy-unit ids and raw statistics, kept to continue "
    "the stream), ledger.json and run.json are curator-side and not covered: they must not be published."
)


def commit_release(run: RunInProgress, t: int, plan: Any) -> tuple[Path, str]:
    """Stages ``release`` and ``commit``: release ``t`` as one atomic commit. The checkpoint and the curator state
    are written under pending names, the Certifier's ledger records the release (the commit point, with both
    files' SHA-256), then the files get their final names. Returns the curator state's path and SHA-256."""
    # lazy import: imports torch; keeps it out of CLI start-up and a run's config checks
    from dpcl.runner.checkpoints import save_checkpoint, save_curator_state

    checkpoint, curator_file, _ = run.paths(t)
    name, loaded = run.loaded.method_name, run.loaded
    with run.clock.stage("release"):
        checkpoint_sha = save_checkpoint(
            _pending(checkpoint), method=name, task_index=t, state=run.method.state_dict(),
            meta={"seed": loaded.seed, "config_sha256": run.identity.config_sha256, "dpcl_version": __version__},
        )
        _crash_point("checkpoint", t)
        curator_sha = save_curator_state(_pending(curator_file), method=name, task_index=t,
                                         state=run.method.curator_state_dict())
        _crash_point("curator_state", t)
    with run.clock.stage("commit"):
        if loaded.private:
            # a plan without events is an empty task's (Prop. F.1): the charges so far cover its release
            run.certifier.commit(t, checkpoint_sha256=checkpoint_sha, curator_sha256=curator_sha,
                                 empty_task=not plan.events)
            _crash_point("ledger", t)
    with run.clock.stage("release"):
        os.replace(_pending(checkpoint), checkpoint)
        os.replace(_pending(curator_file), curator_file)
        _crash_point("rename", t)
    return curator_file, curator_sha


def _certificate_assumptions(run: RunInProgress, plan: Any) -> list[str]:
    assumptions = list(run.report.assumptions)
    assumptions += [a for a in plan.assumptions if a not in assumptions]
    if run.trains_plan:
        sampled = poisson_subsampled([*plan.events, *(e for s in plan.scoped for e in s.events)])
        assumptions += [a for a in noise_assumptions(run.loaded.reproducible, subsampled=sampled)
                        if a not in assumptions]
    assumptions.append(CURATOR_STATE_ASSUMPTION)
    return assumptions


def _coverage(run: RunInProgress, plan: Any) -> Any:
    """The headline of release ``t``: the plan's coverage (private), else not covered with the run's reasons."""
    if run.loaded.private:
        return plan.release
    if not run.trains_plan:
        return ReleaseCoverage.not_covered(NON_PRIVATE_STATEMENT)
    reasons = tuple(plan.release.reasons if plan.release is not None else ())
    return ReleaseCoverage.not_covered(NOT_COVERED_RUN_STATEMENT, *reasons)


def certify_release(run: RunInProgress, t: int, plan: Any) -> Any:
    """Stage ``certify``: the scoped ledgers record release ``t`` (idempotent), then the Certifier writes its
    certificate (verified after writing, signed with ``--sign``), replacing one a crashed attempt wrote."""
    checkpoint, _, _ = run.paths(t)
    loaded = run.loaded
    scopes = {}
    for scoped in plan.scoped:
        first = scoped.events[0]
        run.certifier.open_scoped(scoped.name, adjacency=first.adjacency, unit=first.unit)
        if run.certifier.release_scoped(scoped.name, t, checkpoint_sha256=sha256_file(checkpoint)):
            _crash_point("scoped_ledger", t)
        scopes[scoped.name] = scoped.scope
    extra: dict[str, Any] = {"seed": loaded.seed, "reproducible_noise": loaded.reproducible,
                             "plan_notes": list(plan.notes), "device": run.device}
    if hasattr(run.method, "certificate_extra"):  # e.g. L2DP-ML: Thm 2 terms and checked preconditions
        extra.update(run.method.certificate_extra(t))
    certified = run.certifier.certify(
        t, checkpoint, coverage=_coverage(run, plan), assumptions=_certificate_assumptions(run, plan),
        scoped=scopes, label_filtering=run.prepared.filter_reports[: t + 1], extra=extra,
        standard_assumptions=False, replace=True,
    )
    _crash_point("certificate", t)
    return certified


def finish_release(run: RunInProgress, t: int, plan: Any, n_examples: int, curator_file: Path,
                   curator_sha: str) -> None:
    """After the commit point: certificate (stage ``certify``), evaluation on the test sets of tasks ``0..t``
    (stage ``evaluate``) and the run state. Idempotent, so that a resumed run can finish a release the ledger
    committed before a crash."""
    with run.clock.stage("certify"):
        certified = certify_release(run, t, plan)
    with run.clock.stage("evaluate"):
        accuracies = tuple(
            run.method.accuracy(task.test_features, task.test_labels) for task in run.prepared.tasks[: t + 1]
        )
    checkpoint, _, _ = run.paths(t)
    run.releases.append(ReleaseSummary(
        task_index=t,
        accuracies=accuracies,
        cumulative_epsilon=certified.epsilon if run.loaded.private else None,
        checkpoint=checkpoint.relative_to(run.out).as_posix(),
        certificate=certified.certificate.relative_to(run.out).as_posix(),
        examples=n_examples,
        filtered_out=run.prepared.tasks[t].filtered_out,
        curator_state=curator_file.relative_to(run.out).as_posix(),
        curator_sha256=curator_sha,
    ))
    with run.clock.stage("release"):
        run.save_state()
        _crash_point("run_state", t)


#: Test-only: ``STEP:TASK`` (e.g. ``ledger:1``) kills the run with SIGKILL right after that write of the release
#: of task TASK (0-based); steps: checkpoint, curator_state, ledger, rename, scoped_ledger, certificate, run_state.
CRASH_HOOK_ENV = "DPCL_TEST_KILL_AFTER"


def _crash_point(step: str, task: int) -> None:
    """Crash-consistency tests: die without any cleanup after ``step`` of release ``task`` when asked to."""
    if os.environ.get(CRASH_HOOK_ENV) == f"{step}:{task}":
        import signal

        os.kill(os.getpid(), signal.SIGKILL)


def _pending(final: Path) -> Path:
    """Name a release file has until the ledger commits the release (never published, removed on resume)."""
    return final.with_name(final.name + ".pending")


def _recorded_checkpoint_hash(certificate: Path) -> str:
    """The checkpoint SHA-256 a certificate (or non-private statement) records."""
    try:
        data = read_json(certificate)
        return str(data["checkpoint"]["sha256"])
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise ConfigError(
            f"cannot resume: certificate {str(certificate)!r} of the last recorded release is missing or damaged ({exc})."
        ) from exc
