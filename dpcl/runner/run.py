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

import sys
from pathlib import Path
from typing import Any, Sequence

from dpcl._io.atomic_io import write_json_atomic
from dpcl._io.run_lock import releases_run_locks  # one live run per --out directory
from dpcl.errors import PrivacyViolationError
from dpcl.guarantees.config import RUN_KEYS  # the [run] keys, validated with the rest of the config
from dpcl.guarantees.label_space import describe_filtering
from dpcl.metrics import accuracy_rows, summarize
from dpcl.runner.plots import plot_accuracy
from dpcl.runner.cost import check_run_cost
from dpcl.runner.run_state import RUN_STATE_FORMAT, RUN_STATE_VERSION, ReleaseSummary
from dpcl.runner.tasks import NON_PRIVATE_STATEMENT

# the stages' modules; their names are re-exported here, where they have always been imported
from dpcl.runner.loading import audit_run, check_run_directory, load_run, prepare_stream, resolve_device
from dpcl.runner.releasing import (
    CRASH_HOOK_ENV,
    CURATOR_STATE_ASSUMPTION,
    NOT_COVERED_RUN_STATEMENT,
    commit_release,
    finish_release,
)
from dpcl.runner.resuming import _next_task, open_certifier, open_run
from dpcl.runner.run_types import STAGES, LoadedRun, PreparedStream, RunHooks, RunInProgress, RunResult, StageClock

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
    "RunHooks",
    "RunResult",
    "check_run_directory",
    "resolve_device",
    "run_training",
]


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
    hooks: RunHooks | None = None,
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
    ``hooks`` (:class:`~dpcl.runner.run_types.RunHooks`) let a caller check the loaded run, change the stream
    that is trained and act after each release, within this one pipeline.
    """
    hooks = hooks if hooks is not None else RunHooks()
    clock = StageClock()
    with clock.stage("load"):
        loaded = load_run(config_path, out_dir, seed=seed, device=device, quiet=quiet,
                          stop_after_task=stop_after_task, reproducible_noise=reproducible_noise, sign_key=sign_key,
                          resume=resume)
        hooks.loaded(loaded)
    with clock.stage("stream"):
        prepared = hooks.stream(loaded, prepare_stream(loaded))
    with clock.stage("audit"):
        report = audit_run(loaded, prepared)
        check_run_cost(loaded.config, prepared.sizes, int(prepared.tasks[0].features.shape[1]), loaded.device)
    with clock.stage("resume"):
        run = open_run(loaded, prepared, report, clock)
    for t in range(_next_task(run), run.n_tasks):
        run_task(run, t)
        hooks.after_task(run, t)
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


