"""A certified continual-learning run: config -> audit -> stream -> method -> checkpoints, certificates, metrics.

:func:`run_training` is what ``dpcl run CONFIG.toml --out DIR`` does. It is a thin
composition of named stages (each timed: :attr:`RunResult.stage_seconds`, also in
``run.json``), and every charge, commit and certificate goes through the public
certification API that users' own training loops get (:class:`dpcl.Certifier`):

* ``load`` (:func:`load_run`): the config, the ``[run]`` options, the device, the method class;
* ``stream`` (:func:`prepare_stream`): the task stream, label-filtered (:mod:`dpcl.runner.tasks`);
* ``audit`` (:func:`audit_run`): ``dpcl audit`` on the filtered task sizes;
* ``resume`` (:func:`open_run`): the run directory, its lock, ``run.json``, the
  :class:`~dpcl.Certifier` on the directory, the method and the resume point;
* per task: ``charge`` (:func:`charge_task`), ``train`` (:func:`train_task`),
  ``release`` and ``commit`` (:func:`commit_release`), ``certify`` and ``evaluate``
  (:func:`finish_release`);
* ``summary`` (:func:`write_summary`): ``metrics.json`` and ``accuracy.png``.

In detail:

1. load and validate the config (:func:`dpcl.guarantees.config.load_config`),
   build the task stream (:func:`dpcl.data.build_stream`), apply the public
   label-space filter to every task (Tobaben et al., eq. 6) and **audit** the
   config on the filtered task sizes with the same engine as ``dpcl audit``
   (:func:`dpcl.audit_config.audit_config`). A config the audit
   refuses raises :class:`~dpcl.errors.PrivacyViolationError` (exit code 3)
   before any data is trained on.
2. for every task ``t``: plan it with the method's spec (the plan the audit
   checked), **charge** the plan's events to the task ledger (before training,
   so a crash never loses spent budget), train the method
   (:meth:`~dpcl.methods.base.ContinualMethod.fit_task`) with a progress bar,
   then release it as **one atomic commit**: the checkpoint and the method's
   curator state are written atomically under pending names
   (``taskNNN.pt.pending``), the ledger records the release (with both files'
   SHA-256: this write is the commit point), the files are renamed to their final
   names, and the scoped ledgers' releases, the certificate (verified after
   writing) and the run state follow; evaluation on the test sets of tasks
   ``0..t`` goes into the run state.
3. write ``metrics.json`` (accuracy matrix and every metric of
   :func:`dpcl.metrics.summarize`; final AA under ``average_accuracy``) and
   ``accuracy.png``.

Run directory::

    DIR/run.json                         run state (resume point), atomic
    DIR/ledger.json                      the task ledger (TaskLedger), atomic
    DIR/ledger.json.*.journal            its journal while the run goes (folded in when it stops)
    DIR/checkpoints/task001.pt           one checkpoint per release, atomic
    DIR/certificates/task001.cert.json   one certificate per release, verified after writing
    DIR/curator/task001.state.pt         curator state per release (private), atomic
    DIR/scoped/NAME.ledger.json          one ledger per scoped statement (private), atomic
    DIR/metrics.json, DIR/accuracy.png
    DIR/run.lock                         held while a run works on DIR (dpcl._io.run_lock)

What may be published: ``checkpoints/`` and ``certificates/`` (each
certificate covers its checkpoint and nothing else). ``curator/``,
``ledger.json``, ``scoped/`` and ``run.json`` are the curator's: ``curator/`` holds what a
method computed from the private data without noise and needs only to continue
the stream (:meth:`~dpcl.methods.base.ContinualMethod.curator_state_dict`, e.g.
privacy-unit ids, raw statistics), which no certificate covers.

Resume: rerunning with the same ``DIR`` (same config file content and seed)
restarts after the last task recorded in ``run.json``, from that task's
checkpoint (its SHA-256 must match its certificate) and curator state (its
SHA-256 must match the one ``run.json`` records; a missing or altered file is
refused with :class:`~dpcl.errors.LedgerCorruptError`). The ledger is reopened, not
reset, and it decides what was released (private runs): a release the ledger
committed but ``run.json`` does not list yet (a crash after the commit point)
is finished from its committed files (their SHA-256 must be the recorded ones),
never retrained or charged again. Files of an attempt that did not commit
(pending or later files) released nothing: they are removed, and the retrained
task reuses the attempt's charge, which is the ledger's last charge with no
release after it (the retrained task plans the same events). A crash therefore
never loses spent budget and never charges a task twice. Non-private runs have
no headline ledger: there ``run.json`` is the commit point, and a scoped
statement of a task retrained after a crash between its scoped release and the
run state is charged again (conservative).

Scoped statements (:class:`~dpcl.guarantees.method_schema.ScopedPlan`, e.g. PeCL's per-token
guarantee of its perturbed input embeddings) are charged before training, like the headline's events,
to one :class:`~dpcl.guarantees.ledger.TaskLedger` per scope name, ``DIR/scoped/NAME.ledger.json``
(curator-side like ``ledger.json``, written atomically, composed across tasks like the headline and
reopened on resume), and stated in every certificate's ``scoped_guarantees``.

Non-private runs are written as ``[run] private = false``. For a method whose
checkpoint its plan covers, that is a reference run (the paper's "non-DP"
column): no noise, no clipping, no charges. For a plan that does not cover
the checkpoint (PeCL as in the paper; a private run of it is refused), the
plan is trained as it is (with its noise) and its scoped events are charged to
the scoped ledgers. Either way every release gets a version-2 certificate
``taskNNN.cert.json`` with ``private: false`` and its reasons (and the scoped
statements, if any), which ``dpcl verify`` accepts (exit 0, ``NOT PRIVATE``).
"""

from __future__ import annotations

import hashlib
import os
import sys
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator, Mapping, Sequence

from dpcl._io.atomic_io import read_json, sha256_file, write_json_atomic
from dpcl._io.run_lock import acquire_run_lock, releases_run_locks  # one live run per --out directory
from dpcl._io.safe_paths import contained_path
from dpcl._version import __version__
from dpcl.certifier import Certifier, existing_run_files
from dpcl.data import STREAM_KEYS
from dpcl.errors import (
    ConfigError,
    ExistingRunError,
    InvalidParameterError,
    LedgerCorruptError,
    PrivacyViolationError,
)
from dpcl.audit_config import audit_config, resolve_across_tasks
from dpcl.guarantees.config import RUN_KEYS  # the [run] keys, validated with the rest of the config
from dpcl.guarantees.config import load_config
from dpcl.guarantees.label_space import describe_filtering
from dpcl.guarantees.method_schema import TORCH_DEVICE_FORMS, ReleaseCoverage, torch_device
from dpcl.guarantees.signing import load_private_key
from dpcl.methods.base import method_class  # without torch it raises MissingDependencyError naming the extra
from dpcl.methods.noise_source import noise_assumptions, poisson_subsampled
from dpcl.metrics import accuracy_rows, summarize
from dpcl.runner.plots import plot_accuracy
from dpcl.runner.cost import check_run_cost
from dpcl.runner.ranks import refuse_on_other_ranks
from dpcl.runner.run_state import (
    RUN_STATE_FORMAT,
    RUN_STATE_VERSION,
    ReleaseSummary,
    RunIdentity,
    read_run_state,
    write_run_state,
)
from dpcl.runner.tasks import (
    NON_PRIVATE_STATEMENT,
    PreparedTask,
    build_run_stream,
    label_sets,
    method_setup,
    prepare_tasks,
    release_data,
    run_options,
    task_plan,
    trains_plan,
)
from dpcl.runner.threads import prefer_sleeping_threads, use_usable_cores

__all__ = [
    "CRASH_HOOK_ENV",
    "CURATOR_STATE_ASSUMPTION",
    "NON_PRIVATE_STATEMENT",
    "NOT_COVERED_RUN_STATEMENT",
    "RUN_KEYS",
    "RUN_STATE_FORMAT",
    "RUN_STATE_VERSION",
    "STAGES",
    "ReleaseSummary",
    "RunResult",
    "check_run_directory",
    "resolve_device",
    "run_training",
]

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

#: The stages of a run, in order, as keys of :attr:`RunResult.stage_seconds` (and ``run.json``'s
#: ``stage_seconds``). Privacy accounting happens in ``audit`` (the config's guarantees), ``charge`` (the
#: privacy filter, when ``total_epsilon`` is set), ``commit`` (the ledger's cumulative guarantee of a release)
#: and ``certify`` (the certificate, and its verification, which recomputes every epsilon). ``release`` writes
#: the checkpoint and curator state and ``run.json``; ``evaluate`` tests the released model on tasks ``0..t``.
STAGES = ("load", "stream", "audit", "resume", "charge", "train", "release", "commit", "certify", "evaluate",
          "summary")


@dataclass(frozen=True)
class RunResult:
    """What :func:`run_training` did: the releases (resumed ones included), the final metrics and the seconds
    this process spent in each stage (:data:`STAGES`; wall-clock, ``time.perf_counter``)."""

    out_dir: Path
    method: str
    private: bool
    releases: tuple[ReleaseSummary, ...]
    metrics: Mapping[str, Any]
    resumed_after: int | None
    complete: bool
    delta: float
    audit: Mapping[str, Any] = field(default_factory=dict)
    stage_seconds: Mapping[str, float] = field(default_factory=dict)

    @property
    def last_certificate(self) -> Path | None:
        return self.out_dir / self.releases[-1].certificate if self.releases else None


class StageClock:
    """Wall-clock seconds per named stage (a stage entered several times, e.g. once per task, adds up)."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {name: 0.0 for name in STAGES}

    @contextmanager
    def stage(self, name: str) -> Iterator[None]:
        start = time.perf_counter()
        try:
            yield
        finally:
            self.seconds[name] = self.seconds.get(name, 0.0) + time.perf_counter() - start


# -- checks of the command line --------------------------------------------------------------------------------
def resolve_device(requested: str | None, method_section: Mapping[str, Any]) -> str:
    """``--device`` if given, else ``[method] device`` (default cpu): ``cpu``, ``cuda`` or ``cuda:N``.

    The string form is checked like the config key (:func:`dpcl.guarantees.method_schema.torch_device`); a CUDA
    device must exist: CUDA available and ``N < torch.cuda.device_count()``.
    """
    device = requested or str(method_section.get("device", "cpu") or "cpu")
    source = "--device" if requested else "[method] device"
    if torch_device(device) is not None:
        raise InvalidParameterError(f"{source} must be {TORCH_DEVICE_FORMS}, got {device!r}.")
    if device.startswith("cuda"):
        import torch

        fix = "--device cpu" if requested else "device = \"cpu\" in [method] (or --device cpu)"
        if not torch.cuda.is_available():
            raise InvalidParameterError(
                f"{source} {device} was asked for but torch.cuda.is_available() is False (no GPU, or a CPU-only torch "
                f"build: torch {torch.__version__}). Use {fix}, or install a CUDA build of torch."
            )
        count = torch.cuda.device_count()
        if ":" in device and int(device.split(":", 1)[1]) >= count:
            raise InvalidParameterError(
                f"{source} {device} names a CUDA device that does not exist: this machine has {count} "
                f"(cuda:0 to cuda:{count - 1}). Use one of those, or {fix}."
            )
    return device


def check_run_directory(out_dir: "str | Path") -> Path:
    """``--out`` as a path that is, or can become, a run directory; checked before any work, created later.

    A file in its place, or a nearest existing ancestor that is not a writable directory, raises
    :class:`~dpcl.errors.InvalidParameterError` naming ``--out``.
    """
    out = Path(out_dir)
    if out.exists():
        if not out.is_dir():
            raise InvalidParameterError(f"--out {str(out)!r} is a file, not a directory; give a run directory.")
        if not os.access(out, os.W_OK | os.X_OK):
            raise InvalidParameterError(f"--out {str(out)!r} is not writable; give a directory you can write to.")
        return out
    ancestor = out.absolute().parent
    while not ancestor.exists() and ancestor != ancestor.parent:
        ancestor = ancestor.parent
    if not ancestor.is_dir():
        raise InvalidParameterError(
            f"--out {str(out)!r} cannot be created: {str(ancestor)!r} is a file, not a directory."
        )
    if not os.access(ancestor, os.W_OK | os.X_OK):
        raise InvalidParameterError(
            f"--out {str(out)!r} cannot be created: {str(ancestor)!r} is not writable."
        )
    return out


def _make_run_directory(out: Path) -> None:
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise InvalidParameterError(f"--out {str(out)!r} cannot be created: {exc.strerror or exc}.") from None


def _check_arguments(seed: Any, reproducible_noise: Any, sign_key: Any) -> Any:
    """Refuse a bad ``--seed`` or ``--reproducible-noise``; the ``--sign`` key loaded (before any work)."""
    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        raise InvalidParameterError(f"--seed must be an integer >= 0, got {seed!r}.")
    if not isinstance(reproducible_noise, bool):
        raise InvalidParameterError(f"--reproducible-noise is a switch (true/false), got {reproducible_noise!r}.")
    if sign_key is None:
        return None
    return load_private_key(sign_key, option="--sign")


# -- stage "load" ----------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class LoadedRun:
    """The run the command line and the config ask for (stage ``load``); nothing read from the data yet."""

    config: Any
    config_file: Path
    out: Path
    seed: int
    private: bool
    reproducible: bool
    device: str
    method_name: str
    method_class: Any
    sign_key: Any
    quiet: bool
    stop_after_task: int | None
    resume: bool = False

    def identity(self, n_tasks: int) -> RunIdentity:
        """What ``run.json`` records of this run, and a resumed run must share (the config file's SHA-256...)."""
        return RunIdentity(
            config_sha256=hashlib.sha256(self.config_file.read_bytes()).hexdigest(),
            config_path=str(self.config_file), seed=self.seed, reproducible_noise=self.reproducible,
            private=self.private, method=self.method_name, n_tasks=n_tasks,
        )


def load_run(config_path: "str | Path", out_dir: "str | Path", *, seed: int = 0, device: str | None = None,
             quiet: bool = False, stop_after_task: int | None = None, reproducible_noise: bool = False,
             sign_key: Any = None, resume: bool = False) -> LoadedRun:
    """Stage ``load``: the arguments checked, the config loaded and validated, the device and method class found.

    Refused on a rank > 0 of a process group (only rank 0 writes a run directory), and, unless ``resume``, on
    an ``--out`` that already holds a run (:class:`~dpcl.errors.ExistingRunError`, before anything is written).
    """
    prefer_sleeping_threads()  # before torch is imported: idle OpenMP threads sleep (dpcl.runner.threads)
    key = _check_arguments(seed, reproducible_noise, sign_key)
    config_file = Path(config_path)
    config = load_config(config_file, data_stream_keys=STREAM_KEYS)
    out = check_run_directory(out_dir)
    if not isinstance(resume, bool):
        raise InvalidParameterError(f"--resume is a switch (true/false), got {resume!r}.")
    if not resume:
        _refuse_existing_run(out)
    options = run_options(config)
    resolved = resolve_device(device, config.method)
    refuse_on_other_ranks()  # only rank 0 writes the ledger, checkpoints and certificates
    return LoadedRun(
        config=config, config_file=config_file, out=out, seed=seed, private=bool(options["private"]),
        reproducible=bool(reproducible_noise or options["reproducible_noise"]), device=resolved,
        method_name=config.method["name"], method_class=method_class(config.method["name"]), sign_key=key,
        quiet=quiet, stop_after_task=stop_after_task, resume=resume,
    )


def _refuse_existing_run(out: Path) -> None:
    """``--out`` must not hold a run unless ``--resume`` asks to continue it (a rerun would charge it again)."""
    found = existing_run_files(out, run_state=True)
    if found:
        raise ExistingRunError(
            f"--out {str(out)!r} already holds a run: {'; '.join(found)}. Nothing was changed. Continue that run "
            "with `dpcl run CONFIG --out DIR --resume` (after a crash, or to finish it), or give a new --out."
        )


# -- stages "stream" and "audit" -------------------------------------------------------------------------------
@dataclass(frozen=True)
class PreparedStream:
    """The stream of a run (stage ``stream``): its tasks after the public label filter, with the filter counts."""

    stream: Any
    label_sets: list[tuple[int, ...]]
    tasks: list[PreparedTask]
    filter_reports: list[Any]

    @property
    def sizes(self) -> list[int]:
        return [len(p.labels) for p in self.tasks]


def prepare_stream(run: LoadedRun) -> PreparedStream:
    """Stage ``stream``: build the stream, filter every task by its public label set, check declared sizes
    (``[stream] task_sizes``) and declared disjointness."""
    if run.config.stream.get("encoder") is not None:  # the encoder runs now, on torch
        use_usable_cores()
    stream = build_run_stream(run.config, run.method_class, seed=run.seed, device=run.device, quiet=run.quiet)
    sets = label_sets(run.config, len(stream))
    tasks, reports = prepare_tasks(stream, sets, bool(getattr(run.method_class, "needs_texts", False)))
    prepared = PreparedStream(stream=stream, label_sets=sets, tasks=tasks, filter_reports=reports)
    declared = run.config.stream.get("task_sizes")
    if declared is not None and list(declared) != prepared.sizes:
        raise ConfigError(
            f"[stream] task_sizes = {list(declared)} but the stream has {prepared.sizes} examples per task after "
            "label filtering; remove task_sizes or correct it (the audit would plan other task sizes than the run "
            "trains)."
        )
    if run.config.settings.disjoint_units:
        stream.check_disjoint_units()
    return prepared


def audit_run(run: LoadedRun, prepared: PreparedStream) -> Any:
    """Stage ``audit``: ``dpcl audit`` on the filtered task sizes; a refused config raises
    :class:`~dpcl.errors.PrivacyViolationError` (exit 3) before anything is written or trained."""
    report = audit_config(run.config, prepared.sizes, filter_reports=prepared.filter_reports)
    if not report.sound:
        raise PrivacyViolationError(
            "dpcl audit refuses this config, so it is not trained: " + " | ".join(report.violations)
        )
    return report


# -- stage "resume": the run directory, its Certifier, the method and the resume point ----------------------------
@dataclass
class RunInProgress:
    """A run after its audit: the directory's :class:`~dpcl.Certifier`, the method and the releases so far."""

    loaded: LoadedRun
    prepared: PreparedStream
    report: Any
    identity: RunIdentity
    certifier: Any
    method: Any
    device: str
    releases: list[ReleaseSummary]
    clock: StageClock
    resumed_after: int | None = None

    @property
    def out(self) -> Path:
        return self.loaded.out

    @property
    def n_tasks(self) -> int:
        return len(self.prepared.tasks)

    @property
    def trains_plan(self) -> bool:
        return trains_plan(self.loaded.private, self.report.covered)

    @property
    def state_path(self) -> Path:
        return self.out / "run.json"

    def plan(self, t: int, n_examples: int) -> Any:
        return task_plan(self.loaded.config, t, n_examples, trains_plan=self.trains_plan)

    def release_data(self, t: int) -> tuple[Any, tuple[int, ...], list[int]]:
        return release_data(self.prepared.tasks, t, self.loaded.config.spec.reuses_past_tasks)

    def paths(self, t: int) -> tuple[Path, Path, Path]:
        """Checkpoint, curator state and certificate of release ``t``."""
        name = f"task{t + 1:03d}"
        return (self.out / "checkpoints" / f"{name}.pt", self.out / "curator" / f"{name}.state.pt",
                self.out / "certificates" / f"{name}.cert.json")

    def save_state(self) -> None:
        write_run_state(self.state_path, self.identity, self.releases, self.clock.seconds)


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


# -- per task: stages "charge", "train", "release", "commit", "certify", "evaluate" ---------------------------------
def charge_task(run: RunInProgress, t: int, plan: Any, data: Any, tasks_read: Sequence[int]) -> None:
    """Stage ``charge``: the plan's events (headline and scoped) charged to the data release ``t`` reads, before
    training, through the Certifier (its privacy filter refuses an overspend here). After a crash the charge of the
    attempt that committed nothing is reused, never charged twice."""
    name = run.loaded.method_name
    if run.loaded.private and plan.events:
        run.certifier.charge(tasks_read, plan.events, unit_ids=data.unit_ids, label=f"{name} task {t}",
                             reuse_uncommitted=True)
    for scoped in plan.scoped:
        run.certifier.charge_scoped(scoped.name, scoped.scope, tasks_read, scoped.events, unit_ids=data.unit_ids,
                                    label=f"{name} task {t} ({scoped.name})", reuse_uncommitted=True)
    if run.loaded.private and not run.certifier.ledger.charges:
        raise PrivacyViolationError(
            f"release {t} reads no private data and nothing was charged yet; dpcl cannot certify a release "
            "without a charged mechanism. Check the stream: its first task is empty after label filtering."
        )


def train_task(run: RunInProgress, t: int, plan: Any, data: Any, outputs: Sequence[int]) -> None:
    """Stage ``train``: the method's ``fit_task`` on the release's data, with a progress bar."""
    from tqdm.auto import tqdm

    with tqdm(total=run.method.planned_work(plan), desc=f"task {t + 1}/{run.n_tasks}", unit="step",
              disable=run.loaded.quiet, file=sys.stderr, leave=False) as bar:
        run.method.fit_task(t, data, outputs, plan, progress=bar.update)


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


def run_task(run: RunInProgress, t: int) -> None:
    """One task: charge, train, release and commit, certify, evaluate."""
    data, outputs, tasks_read = run.release_data(t)
    plan = run.plan(t, len(data))
    with run.clock.stage("charge"):
        charge_task(run, t, plan, data, tasks_read)
    with run.clock.stage("train"):
        train_task(run, t, plan, data, outputs)
    curator_file, curator_sha = commit_release(run, t, plan)
    finish_release(run, t, plan, len(data), curator_file, curator_sha)


# -- stage "summary" ----------------------------------------------------------------------------------------------
def write_summary(run: RunInProgress) -> dict[str, Any]:
    """Stage ``summary``: ``metrics.json`` (accuracy matrix and every metric of :func:`dpcl.metrics.summarize`;
    final AA under ``average_accuracy``) and ``accuracy.png``. Returns the metrics as written."""
    loaded, releases, config = run.loaded, run.releases, run.loaded.config
    complete = bool(releases) and releases[-1].task_index == run.n_tasks - 1
    matrix = accuracy_rows([r.accuracies for r in releases], run.n_tasks)
    metrics: dict[str, Any] = {
        "method": loaded.method_name,
        "private": loaded.private,
        "complete": complete,
        "seed": loaded.seed,
        "reproducible_noise": loaded.reproducible,
        "stream_seed": int(run.prepared.stream.seed),
        "device": run.device,
        "config": str(loaded.config_file),
        "epsilon_per_task": config.settings.epsilon if loaded.private else "inf",
        "delta": config.settings.delta,
        "across_tasks": run.certifier.across_tasks,
        "cumulative_epsilon": [r.cumulative_epsilon for r in releases],
        "final_epsilon": releases[-1].cumulative_epsilon if releases else None,
        **summarize(matrix),
        "certificates": [r.certificate for r in releases],
        "checkpoints": [r.checkpoint for r in releases],
        "label_filtering": describe_filtering(run.prepared.filter_reports),
    }
    write_json_atomic(run.out / "metrics.json", metrics)
    epsilon = f" (ε={config.settings.epsilon:g} per task, δ={config.settings.delta:g})"
    plot_accuracy(
        run.out / "accuracy.png",
        matrix,
        title=f"{loaded.method_name} on {run.prepared.stream.dataset_name}"
        + (epsilon if loaded.private else " (not private)"),
        cumulative_epsilon=[r.cumulative_epsilon for r in releases],
        chance=chance_levels(run.prepared.label_sets, len(releases)),
    )
    return metrics


def chance_levels(label_sets: Sequence[Sequence[int]], n_releases: int) -> list[float]:
    """Accuracy of a uniform guess among the public labels the model may output after each release: one over the
    size of the union of the public label sets O_1..O_t (constant under ``prior_const``)."""
    seen: set[int] = set()
    levels = []
    for labels in list(label_sets)[:n_releases]:
        seen |= {int(y) for y in labels}
        levels.append(1.0 / max(len(seen), 1))
    return levels


# -- the run ------------------------------------------------------------------------------------------------------
@releases_run_locks
def run_training(
    config_path: "str | Path",
    out_dir: "str | Path",
    *,
    seed: int = 0,
    device: str | None = None,
    quiet: bool = False,
    stop_after_task: int | None = None,
    reproducible_noise: bool = False,
    sign_key: Any = None,
    resume: bool = False,
) -> RunResult:
    """Train, certify and evaluate the run ``config_path`` describes, into ``out_dir``.

    An ``out_dir`` that already holds a run is refused (:class:`~dpcl.errors.ExistingRunError`, nothing
    written) unless ``resume``: then the run continues after its last certified task (and finishes a release a
    crash interrupted). ``stop_after_task`` (0-based) stops once that task is certified, as an interruption
    would; rerunning with the same ``out_dir`` and ``resume=True`` continues.

    ``seed`` drives initialisation, shuffles and the stream's own randomness
    (``[stream] seed`` unless the config sets it; ``split_seed`` stays as
    configured). The privacy noise and Poisson sampling come from OS entropy
    (:mod:`dpcl.methods.noise_source`) unless ``reproducible_noise`` (or
    ``[run] reproducible_noise = true``) draws them from ``seed``; each
    certificate states which, as an assumption.

    ``sign_key`` (a private key file or an Ed25519 key, :mod:`dpcl.guarantees.signing`) signs every
    certificate after it is written and verified; it is loaded before any work, so a bad key fails first.
    """
    clock = StageClock()
    with clock.stage("load"):
        loaded = load_run(config_path, out_dir, seed=seed, device=device, quiet=quiet,
                          stop_after_task=stop_after_task, reproducible_noise=reproducible_noise, sign_key=sign_key,
                          resume=resume)
    with clock.stage("stream"):
        prepared = prepare_stream(loaded)
    with clock.stage("audit"):
        report = audit_run(loaded, prepared)
    
        check_run_cost(loaded.config, prepared.sizes, int(prepared.tasks[0].features.shape[1]), loaded.device)
    with clock.stage("resume"):
        run = open_run(loaded, prepared, report, clock)
    for t in range(_next_task(run), run.n_tasks):
        run_task(run, t)
        if stop_after_task is not None and stop_after_task <= t < run.n_tasks - 1:
            break
    with clock.stage("summary"):
        run.certifier.compact_ledgers()
        metrics = write_summary(run)
    return RunResult(
        out_dir=run.out,
        method=loaded.method_name,
        private=loaded.private,
        releases=tuple(run.releases),
        metrics=metrics,
        resumed_after=run.resumed_after,
        complete=metrics["complete"],
        delta=float(loaded.config.settings.delta),
        audit=report.to_dict(),
        stage_seconds=dict(clock.seconds),
    )


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
