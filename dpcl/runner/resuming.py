"""Stage ``resume`` of a run: the run directory locked, ``run.json`` read, the Certifier opened (resuming its
ledgers), the method built and restored, and a release committed before a crash finished."""

from __future__ import annotations

import os
import sys
from typing import Any

from dpcl._io.atomic_io import sha256_file
from dpcl._io.run_lock import acquire_run_lock  # one live run per --out directory
from dpcl._io.safe_paths import contained_path
from dpcl.certifier import Certifier
from dpcl.errors import ConfigError, LedgerCorruptError
from dpcl.audit_config import resolve_across_tasks
from dpcl.runner.run_state import ReleaseSummary, read_run_state
from dpcl.runner.tasks import method_setup
from dpcl.runner.threads import use_usable_cores
from dpcl.runner.loading import _make_run_directory
from dpcl.runner.releasing import _pending, _recorded_checkpoint_hash, finish_release
from dpcl.runner.run_types import LoadedRun, PreparedStream, RunInProgress, StageClock


def open_certifier(loaded: LoadedRun, report: Any, *, resume: bool) -> Any:
    """The :class:`~dpcl.Certifier` of the run directory: the config's privacy settings and the audit's adjacency
    and unit, ``private = false`` without a headline ledger; ``resume`` when ``run.json`` lists releases (its
    ledger must then exist). ``--resume`` (``loaded.resume``) lets it continue a run recorded there."""
    config = loaded.config
    return Certifier(
        loaded.out,
        settings=config.settings.replace(adjacency=report.adjacency, unit=report.unit),
        method=loaded.method_name,
        sign_key=loaded.sign_key,
        private=loaded.private,
        metadata={"config": config.to_dict(), "method": loaded.method_name, "seed": loaded.seed,
                  "reproducible_noise": loaded.reproducible},
        resume=loaded.resume,
        expect_ledger=resume and loaded.private,
        driver="dpcl run",
    )


def _check_ledgers_record(run: RunInProgress) -> None:
    """Every release ``run.json`` lists must be recorded by the ledger, and by every scoped ledger it charged."""
    listed_by = repr(str(run.state_path))
    if run.loaded.private:
        run.certifier.require_released([r.task_index for r in run.releases], listed_by=listed_by)
    if not run.trains_plan:
        return
    for entry in run.report.scoped_guarantees:
        name = entry["name"]
        needed = [r.task_index for r in run.releases if name in run.report.per_task[r.task_index].get("scoped", {})]
        run.certifier.require_released(needed, scoped=name, adjacency=entry["adjacency"], unit=entry["unit"],
                                       listed_by=listed_by)


def _restore_last_release(run: RunInProgress) -> None:
    """The method's state after the last release ``run.json`` lists: its certified checkpoint and curator state."""
    # lazy import: imports torch; keeps it out of CLI start-up and a run's config checks
    from dpcl.runner.checkpoints import load_checkpoint, load_curator_state

    last, out = run.releases[-1], run.out  # run.json may have been edited: contained_path stays inside --out
    where = f"{str(run.state_path)!r} release of task {last.task_index + 1}:"
    last = ReleaseSummary(**{**last.__dict__, **{
        name: contained_path(out, getattr(last, name), what=f"{where} {name} path").relative_to(out.resolve())
        .as_posix() for name in ("certificate", "checkpoint", "curator_state")}})
    expected = _recorded_checkpoint_hash(out / last.certificate)
    payload = load_checkpoint(out / last.checkpoint, expected_sha256=expected)
    if payload["method"] != run.loaded.method_name or payload["task_index"] != last.task_index:
        raise ConfigError(f"checkpoint {last.checkpoint} does not belong to this run.")
    run.method.load_state_dict(payload["state"])
    curator = load_curator_state(out / last.curator_state, expected_sha256=last.curator_sha256,
                                 method=run.loaded.method_name, task_index=last.task_index)
    run.method.load_curator_state_dict(curator["state"])


def open_run(loaded: LoadedRun, prepared: PreparedStream, report: Any, clock: StageClock) -> RunInProgress:
    """Stage ``resume``: create and lock the run directory, read ``run.json``, open the Certifier (resuming its
    ledgers), build the method and restore the last listed release; finish a release the ledger committed after
    the last listed one, and remove the files of attempts that committed nothing."""
    out = loaded.out
    use_usable_cores()  # training starts here: torch's threads at most the cores this process may use
    _make_run_directory(out)
    lock = acquire_run_lock(out)  # refuses (exit 2) while another live run holds --out; released on return
    if lock.took_over and not loaded.quiet:
        print(f"dpcl run: {str(out)!r} was left locked by a run that ended without releasing it "
              f"(pid {lock.took_over.get('pid')!r}); taking it over and resuming.", file=sys.stderr)
    identity = loaded.identity(len(prepared.tasks))
    releases = read_run_state(out / "run.json", identity, out)
    across = _resolved_across(loaded.config)
    method = loaded.method_class(method_setup(
        loaded.config, prepared.label_sets, prepared.tasks, across=across, seed=loaded.seed,
        device=loaded.device, reproducible_noise=loaded.reproducible,
    ))
    run = RunInProgress(
        loaded=loaded, prepared=prepared, report=report, identity=identity,
        certifier=open_certifier(loaded, report, resume=bool(releases)), method=method,
        device=method.compute_device,  # what metrics and certificates record
        releases=releases, clock=clock, resumed_after=releases[-1].task_index if releases else None,
    )
    _check_ledgers_record(run)
    if releases:
        _restore_last_release(run)
    finish_committed_releases(run)
    remove_uncommitted_files(run)
    return run


def _resolved_across(config: Any) -> str:
    across, _ = resolve_across_tasks(config.settings.across_tasks, config.settings.disjoint_units)
    return across


def finish_committed_releases(run: RunInProgress) -> None:
    """Resume a private run whose ledger committed a release that ``run.json`` does not list yet (a crash after the
    commit point): finish it from its committed files (their SHA-256 must be the recorded ones), never retrain it."""
    # lazy import: imports torch; keeps it out of CLI start-up and a run's config checks
    from dpcl.runner.checkpoints import load_checkpoint, load_curator_state

    listed = [r.task_index for r in run.releases]
    for t in [t for t in run.certifier.committed_tasks() if t not in listed]:
        expected_next = listed[-1] + 1 if listed else 0
        if t != expected_next:
            raise LedgerCorruptError(
                f"{str(run.out / 'ledger.json')!r} records a release of task {t + 1} but {str(run.state_path)!r} "
                f"continues with task {expected_next + 1}: they belong to different runs; restore the run's own "
                "files or start the run over in a new directory."
            )
        checkpoint, curator_file, _ = run.paths(t)
        record = run.certifier.committed(t)
        curator_sha = record.curator_sha256 or ""
        for final, recorded in ((checkpoint, record.checkpoint_sha256), (curator_file, curator_sha)):
            pending = _pending(final)
            if pending.is_file() and sha256_file(pending) == recorded:
                os.replace(pending, final)
            if not final.is_file() or sha256_file(final) != recorded:
                raise LedgerCorruptError(
                    f"the ledger committed the release of task {t + 1} but {str(final)!r} is missing or does not "
                    f"hash to the recorded {recorded}; restore the run's files or start over in a new directory."
                )
        payload = load_checkpoint(checkpoint, expected_sha256=record.checkpoint_sha256)
        run.method.load_state_dict(payload["state"])
        curator = load_curator_state(curator_file, expected_sha256=curator_sha, method=run.loaded.method_name,
                                     task_index=t)
        run.method.load_curator_state_dict(curator["state"])
        data, _, _ = run.release_data(t)
        finish_release(run, t, run.plan(t, len(data)), len(data), curator_file, curator_sha)
        listed.append(t)


def remove_uncommitted_files(run: RunInProgress) -> None:
    """Files of an attempt that never committed released nothing: remove them (pending or final names)."""
    for t in range(_next_task(run), run.n_tasks):
        checkpoint, curator_file, certificate = run.paths(t)
        for final in (checkpoint, curator_file):
            for leftover in (_pending(final), final):
                leftover.unlink(missing_ok=True)
        certificate.unlink(missing_ok=True)


def _next_task(run: RunInProgress) -> int:
    return 0 if not run.releases else run.releases[-1].task_index + 1

