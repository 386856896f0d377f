"""A certified continual-learning run: config -> audit -> stream -> method -> checkpoints, certificates, metrics.

:func:`run_training` is what ``dpcl run CONFIG.toml --out DIR`` does:

1. load and validate the config (:func:`dpcl.guarantees.config.load_config`),
   build the task stream (:func:`dpcl.data.build_stream`), apply the public
   label-space filter to every task (Tobaben et al., eq. 6) and **audit** the
   config on the filtered task sizes with the same engine as ``dpcl audit``
   (:func:`dpcl.guarantees.audit_config.audit_config`). A config the audit
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
    DIR/checkpoints/task001.pt           one checkpoint per release, atomic
    DIR/certificates/task001.cert.json   one certificate per release, verified after writing
    DIR/curator/task001.state.pt         curator state per release (private), atomic
    DIR/scoped/NAME.ledger.json          one ledger per scoped statement (private), atomic
    DIR/metrics.json, DIR/accuracy.png
    DIR/run.lock                         held while a run works on DIR (dpcl.guarantees.run_lock)

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
import math
import os
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np

from dpcl import __version__
from dpcl.errors import (
    ConfigError,
    InvalidParameterError,
    LedgerCorruptError,
    MissingDependencyError,
    PrivacyViolationError,
)
from dpcl.guarantees.atomic_io import read_json, sha256_file, write_json_atomic
from dpcl.guarantees.config import RUN_KEYS  # the [run] keys, validated with the rest of the config
from dpcl.guarantees.run_lock import acquire_run_lock, releases_run_locks  # one live run per --out directory

RUN_STATE_FORMAT = "dpcl-run"
RUN_STATE_VERSION = 2  # 2: releases record their curator state (checkpoints of version 1 held it)

NON_PRIVATE_STATEMENT = (
    "This checkpoint was trained WITHOUT differential privacy ([run] private = false): no noise was added and "
    "no gradient was clipped. It offers no privacy guarantee for its training data (epsilon is infinite)."
)
#: First reason of a ``[run] private = false`` run of a plan that does not cover its checkpoint.
NOT_COVERED_RUN_STATEMENT = (
    "This checkpoint was trained by a run with [run] private = false of a method whose released checkpoint is not "
    "covered by any charged release: it offers no differential-privacy guarantee for its training data (epsilon is "
    "infinite), for the reasons below. The noise of the method's plan was applied; what it protects is stated in "
    "scoped_guarantees, each for its scope only."
)
_SCOPE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*")

#: Stated in every certificate of a ``dpcl run``: what the certificate does not cover.
CURATOR_STATE_ASSUMPTION = (
    "The certificate covers the released checkpoint only. The run directory's curator/ files (method state "
    "computed from the private data without noise, e.g. privacy-unit ids and raw statistics, kept to continue "
    "the stream), ledger.json and run.json are curator-side and not covered: they must not be published."
)


@dataclass(frozen=True)
class ReleaseSummary:
    """One certified release of a run."""

    task_index: int
    accuracies: tuple[float, ...]
    cumulative_epsilon: float | None
    checkpoint: str
    certificate: str
    examples: int
    filtered_out: int
    curator_state: str
    curator_sha256: str

    def to_dict(self) -> dict[str, Any]:
        return {
            "task_index": self.task_index,
            "accuracies": list(self.accuracies),
            "cumulative_epsilon": self.cumulative_epsilon,
            "checkpoint": self.checkpoint,
            "certificate": self.certificate,
            "examples": self.examples,
            "filtered_out": self.filtered_out,
            "curator_state": self.curator_state,
            "curator_sha256": self.curator_sha256,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "ReleaseSummary":
        return cls(
            task_index=int(data["task_index"]),
            accuracies=tuple(float(a) for a in data["accuracies"]),
            cumulative_epsilon=None if data["cumulative_epsilon"] is None else float(data["cumulative_epsilon"]),
            checkpoint=str(data["checkpoint"]),
            certificate=str(data["certificate"]),
            examples=int(data["examples"]),
            filtered_out=int(data["filtered_out"]),
            curator_state=str(data["curator_state"]),
            curator_sha256=str(data["curator_sha256"]),
        )


@dataclass(frozen=True)
class RunResult:
    """What :func:`run_training` did: the releases (resumed ones included) and the final metrics."""

    out_dir: Path
    method: str
    private: bool
    releases: tuple[ReleaseSummary, ...]
    metrics: Mapping[str, Any]
    resumed_after: int | None
    complete: bool
    delta: float
    audit: Mapping[str, Any] = field(default_factory=dict)

    @property
    def last_certificate(self) -> Path | None:
        return self.out_dir / self.releases[-1].certificate if self.releases else None


def _run_section(config: Any) -> dict[str, Any]:
    """The validated ``[run]`` options (:data:`RUN_KEYS`, checked by :func:`dpcl.guarantees.config.load_config`)."""
    return {key: config.run.get(key, default) for key, (_kind, default, _help) in RUN_KEYS.items()}


def resolve_device(requested: str | None, method_section: Mapping[str, Any]) -> str:
    """``--device`` if given, else ``[method] device`` (default cpu): ``cpu``, ``cuda`` or ``cuda:N``.

    The string form is checked like the config key (:func:`dpcl.guarantees.method_schema.torch_device`); a CUDA
    device must exist: CUDA available and ``N < torch.cuda.device_count()``.
    """
    from dpcl.guarantees.method_schema import TORCH_DEVICE_FORMS, torch_device

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


def _label_sets(config: Any, n_tasks: int) -> list[tuple[int, ...]]:
    from dpcl.guarantees.label_space import output_label_sets

    sets = output_label_sets(config.stream["label_space"], config.stream["prior_labels"], n_tasks)
    return [tuple(sorted(s)) for s in sets]


@dataclass(frozen=True)
class _PreparedTask:
    index: int
    features: np.ndarray
    labels: np.ndarray
    unit_ids: np.ndarray
    output_labels: tuple[int, ...]
    filtered_out: int
    texts: np.ndarray | None
    test_features: np.ndarray  # features, or texts (object array) for raw-text streams
    test_labels: np.ndarray


def _prepare_tasks(
    stream: Any, label_sets: Sequence[tuple[int, ...]], needs_texts: bool = False
) -> tuple[list[_PreparedTask], list[Any]]:
    """Label-filtered tasks. Raw-text streams, and methods that declare ``needs_texts`` (PeCL), get the texts
    and are evaluated on the test texts (an object array) instead of encoder features."""
    from dpcl.guarantees.label_space import filter_task

    prepared, reports = [], []
    for task, output in zip(stream, label_sets):
        text_only = task.train.features is None
        if (text_only or needs_texts) and (task.train.texts is None or task.test.texts is None):
            raise ConfigError(
                f"[stream] dataset {stream.dataset_name!r} gives no raw texts"
                + (", and this method trains on text (use dataset = 'fortunes_texts')." if needs_texts
                   else " and no features.")
            )
        mask, report = filter_task(task.train.labels, output, task.index)
        reports.append(report)
        if len(task.test) == 0:
            raise ConfigError(f"task {task.index} has an empty test set; lower test_fraction or change the tasks.")
        prepared.append(
            _PreparedTask(
                index=task.index,
                features=(
                    np.zeros((int(mask.sum()), 0), dtype=np.float32)
                    if text_only
                    else np.asarray(task.train.features[mask], dtype=np.float32)
                ),
                labels=np.asarray(task.train.labels[mask], dtype=np.int64),
                unit_ids=np.asarray(task.train.unit_ids[mask]),
                output_labels=tuple(int(o) for o in output),
                filtered_out=report.filtered,
                texts=None if task.train.texts is None else np.asarray(task.train.texts[mask], dtype=object),
                test_features=(
                    np.asarray(task.test.texts, dtype=object)
                    if text_only or needs_texts
                    else np.asarray(task.test.features, dtype=np.float32)
                ),
                test_labels=np.asarray(task.test.labels, dtype=np.int64),
            )
        )
    return prepared, reports


def _release_data(prepared: Sequence[_PreparedTask], t: int, reuses_past_tasks: bool):
    """The data, output labels and task indices release ``t`` reads (the union 0..t for Non-CL)."""
    from dpcl.methods.base import TrainingData

    parts = prepared[: t + 1] if reuses_past_tasks else [prepared[t]]
    data = TrainingData(
        features=np.concatenate([p.features for p in parts]),
        labels=np.concatenate([p.labels for p in parts]),
        unit_ids=np.concatenate([p.unit_ids for p in parts]),
        texts=None if any(p.texts is None for p in parts) else np.concatenate([p.texts for p in parts]),
    )
    outputs = tuple(sorted({o for p in parts for o in p.output_labels}))
    return data, outputs, [p.index for p in parts]


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


def _config_digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


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
) -> RunResult:
    """Train, certify and evaluate the run ``config_path`` describes, into ``out_dir`` (resuming if possible).

    ``stop_after_task`` (0-based) stops once that task is certified, as an
    interruption would; rerunning with the same ``out_dir`` resumes.

    ``seed`` drives initialisation, shuffles and the stream's own randomness
    (``[stream] seed`` unless the config sets it; ``split_seed`` stays as
    configured). The privacy noise and Poisson sampling come from OS entropy
    (:mod:`dpcl.methods.noise_source`) unless ``reproducible_noise`` (or
    ``[run] reproducible_noise = true``) draws them from ``seed``; each
    certificate states which, as an assumption.

    ``sign_key`` (a private key file or an Ed25519 key, :mod:`dpcl.guarantees.signing`) signs every
    certificate after it is written and verified; it is loaded before any work, so a bad key fails first.
    """
    from dpcl.data import STREAM_KEYS, build_stream
    from dpcl.guarantees.audit_config import audit_config, resolve_across_tasks
    from dpcl.guarantees.config import load_config
    from dpcl.guarantees.label_space import describe_filtering
    from dpcl.metrics import accuracy_rows, summarize
    from dpcl.methods.noise_source import noise_assumptions

    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        raise InvalidParameterError(f"--seed must be an integer >= 0, got {seed!r}.")
    if not isinstance(reproducible_noise, bool):
        raise InvalidParameterError(f"--reproducible-noise is a switch (true/false), got {reproducible_noise!r}.")
    if sign_key is not None:
        from dpcl.guarantees.signing import load_private_key, sign_certificate

        sign_key = load_private_key(sign_key, option="--sign")
    config_file = Path(config_path)
    config = load_config(config_file, data_stream_keys=STREAM_KEYS)
    out = check_run_directory(out_dir)
    run_options = _run_section(config)
    private = bool(run_options["private"])
    reproducible = bool(reproducible_noise or run_options["reproducible_noise"])
    method_name = config.method["name"]
    device = resolve_device(device, config.method)
    from dpcl.runner.distributed import refuse_on_other_ranks

    refuse_on_other_ranks()  # only rank 0 writes the ledger, checkpoints and certificates
    try:
        from dpcl.methods.base import MethodSetup, method_class
        from dpcl.runner.checkpoints import load_checkpoint, load_curator_state, save_checkpoint, save_curator_state
    except ModuleNotFoundError as exc:  # torch missing
        raise MissingDependencyError(
            f"dpcl run needs {exc.name}; install the training extra: pip install torch==2.13.0 && pip install 'dpcl[train]'"
        ) from exc
    cls = method_class(method_name)

    # -- stream, label filter, audit (before any training) -----------------------------------------
    stream_options = dict(config.raw["stream"])
    stream_options.setdefault("seed", seed)  # --seed drives the stream unless [stream] seed is set explicitly
    # [stream] encoder: features computed on the run's device; a method that trains inside the encoder (PEFT
    # Ensemble's film variant) gets the images as pixel rows instead of the encoder's features
    trains_encoder = bool(getattr(cls, "trains_encoder", lambda _method: False)(config.method))
    stream = build_stream(stream_options, encode=not trains_encoder, device=device, progress=not quiet)
    n_tasks = len(stream)
    label_sets = _label_sets(config, n_tasks)
    prepared, filter_reports = _prepare_tasks(stream, label_sets, bool(getattr(cls, "needs_texts", False)))
    sizes = [len(p.labels) for p in prepared]
    declared = config.stream.get("task_sizes")
    if declared is not None and list(declared) != sizes:
        raise ConfigError(
            f"[stream] task_sizes = {list(declared)} but the stream has {sizes} examples per task after label "
            "filtering; remove task_sizes or correct it (the audit would plan other task sizes than the run trains)."
        )
    if config.stream["disjoint_units"]:
        stream.check_disjoint_units()
    report = audit_config(config, sizes, filter_reports=filter_reports)
    if not report.sound:
        raise PrivacyViolationError(
            "dpcl audit refuses this config, so it is not trained: " + " | ".join(report.violations)
        )
    across, _ = resolve_across_tasks(config.privacy["across_tasks"], config.stream["disjoint_units"])
    spec = config.spec

    # -- run directory and resume ------------------------------------------------------------------
    _make_run_directory(out)
    lock = acquire_run_lock(out)  # refuses (exit 2) while another live run holds --out; released on return
    if lock.took_over and not quiet:
        print(f"dpcl run: {str(out)!r} was left locked by a run that ended without releasing it "
              f"(pid {lock.took_over.get('pid')!r}); taking it over and resuming.", file=sys.stderr)
    state_path = out / "run.json"
    digest = _config_digest(config_file)
    releases: list[ReleaseSummary] = []
    if state_path.exists():
        try:
            state = read_json(state_path)
        except ValueError as exc:
            raise ConfigError(f"{state_path} is damaged ({exc}); move the run directory away to start over.") from exc
        if not isinstance(state, dict) or state.get("format") != RUN_STATE_FORMAT:
            raise ConfigError(f"{state_path} is not a dpcl run state; use another --out directory.")
        if state.get("version") != RUN_STATE_VERSION:
            raise ConfigError(
                f"{state_path} has run-state version {state.get('version')!r}, this dpcl writes version "
                f"{RUN_STATE_VERSION}: runs of version 1 kept curator state (privacy-unit ids, raw statistics) inside "
                "the released checkpoints and cannot be resumed; start the run over in a new --out directory "
                "(and do not publish that run's checkpoints)."
            )
        mismatch = [
            name
            for name, mine, recorded in (
                ("config", digest, state.get("config_sha256")),
                ("seed", seed, state.get("seed")),
                ("private", private, state.get("private")),
                ("method", method_name, state.get("method")),
                ("noise source (reproducible_noise)", reproducible, state.get("reproducible_noise", False)),
            )
            if recorded != mine
        ]
        if mismatch:
            raise ConfigError(
                f"--out {str(out)!r} holds a run with a different {', '.join(mismatch)}; resume it with the same "
                "config file, --seed and --reproducible-noise setting, or use a new --out directory."
            )
        try:
            releases = [ReleaseSummary.from_dict(r) for r in state["releases"]]
        except (KeyError, TypeError, ValueError) as exc:
            raise ConfigError(f"{state_path} is damaged ({exc!r}); move the run directory away to start over.") from None
    resumed_after = releases[-1].task_index if releases else None

    label_space = tuple(sorted({o for s in label_sets for o in s}))
    setup = MethodSetup(
        method=config.method,
        privacy={**config.privacy, "across_tasks": across},  # resolved: the composition the ledger applies
        label_space=label_space,
        input_dim=int(prepared[0].features.shape[1]),
        seed=seed,
        device=device,
        reproducible_noise=reproducible,
    )
    method = cls(setup)
    device = method.compute_device  # what metrics and certificates record

    from dpcl.guarantees.ledger import TaskLedger

    # a private run is refused by the audit unless its plan covers the checkpoint; a non-private run of a plan
    # that does not cover it trains the plan as it is (with its noise), one of a plan that does is noise-free.
    trains_plan = private or not report.covered
    ledger = None
    if private:
        ledger = TaskLedger.open(
            out / "ledger.json",
            must_exist=bool(releases),  # a resumed run never starts an empty ledger: that would forget spent budget
            delta=config.privacy["delta"],
            across_tasks=across,
            accountant=config.privacy["accountant"],
            adjacency=report.adjacency,
            unit=report.unit,
            total_epsilon=config.privacy.get("total_epsilon"),
            total_delta=config.privacy.get("total_delta"),
            metadata={"config": config.to_dict(), "method": method_name, "seed": seed,
                      "reproducible_noise": reproducible},
        )

    if ledger is not None and releases:
        unrecorded = sorted({r.task_index for r in releases} - set(ledger.released_tasks()))
        if unrecorded:
            raise LedgerCorruptError(
                f"{str(out / 'ledger.json')!r} has no record of the release(s) of task(s) "
                f"{', '.join(str(t + 1) for t in unrecorded)} that {str(state_path)!r} lists: it is older than the run "
                "(or from another run), so resuming would forget budget already spent. Restore the run's own ledger, "
                "or start the run over in a new directory."
            )
    scoped_ledgers: dict[str, TaskLedger] = {}

    def scoped_ledger(name: str, adjacency: Any, unit: str) -> TaskLedger:
        """The ledger of scope ``name`` (DIR/scoped/NAME.ledger.json), opened once, resumed when it exists."""
        if name not in scoped_ledgers:
            if not _SCOPE_NAME.fullmatch(name):
                raise InvalidParameterError(
                    f"scoped statement name {name!r} must be letters, digits, '_', '.' or '-' (it names a ledger file)."
                )
            scoped_ledgers[name] = TaskLedger.open(
                out / "scoped" / f"{name}.ledger.json",
                must_exist=any(name in report.per_task[r.task_index].get("scoped", {}) for r in releases),
                delta=config.privacy["delta"],
                across_tasks=across,
                accountant=config.privacy["accountant"],
                adjacency=adjacency,
                unit=unit,
                metadata={"config": config.to_dict(), "method": method_name, "seed": seed, "scope_name": name,
                          "reproducible_noise": reproducible},
            )
        return scoped_ledgers[name]

    if trains_plan and releases:  # every scoped ledger a released task charged must exist and record that release
        for entry in report.scoped_guarantees:
            name = entry["name"]
            needed = sorted(r.task_index for r in releases if name in report.per_task[r.task_index].get("scoped", {}))
            if not needed:
                continue
            opened = scoped_ledger(name, entry["adjacency"], entry["unit"])
            missing = sorted(set(needed) - set(opened.released_tasks()))
            if missing:
                raise LedgerCorruptError(
                    f"{str(out / 'scoped' / (name + '.ledger.json'))!r} has no record of the release(s) of task(s) "
                    f"{', '.join(str(t + 1) for t in missing)} that {str(state_path)!r} lists: resuming would forget "
                    "budget already spent. Restore the run's own scoped ledger, or start the run over in a new directory."
                )

    if releases:
        last = releases[-1]
        from dpcl.guarantees.safe_paths import contained_path  # run.json may have been edited: stay inside --out

        where = f"{str(state_path)!r} release of task {last.task_index + 1}:"
        last = ReleaseSummary(**{**last.__dict__, **{
            name: contained_path(out, getattr(last, name), what=f"{where} {name} path").relative_to(out.resolve())
            .as_posix() for name in ("certificate", "checkpoint", "curator_state")}})
        expected = _recorded_checkpoint_hash(out / last.certificate)
        payload = load_checkpoint(out / last.checkpoint, expected_sha256=expected)
        if payload["method"] != method_name or payload["task_index"] != last.task_index:
            raise ConfigError(f"checkpoint {last.checkpoint} does not belong to this run.")
        method.load_state_dict(payload["state"])
        curator = load_curator_state(out / last.curator_state, expected_sha256=last.curator_sha256,
                                     method=method_name, task_index=last.task_index)
        method.load_curator_state_dict(curator["state"])

    def save_state() -> None:
        write_json_atomic(
            state_path,
            {
                "format": RUN_STATE_FORMAT,
                "version": RUN_STATE_VERSION,
                "config_sha256": digest,
                "config_path": str(config_file),
                "seed": seed,
                "reproducible_noise": reproducible,
                "private": private,
                "method": method_name,
                "n_tasks": n_tasks,
                "releases": [r.to_dict() for r in releases],
            },
        )

    # -- the stream ---------------------------------------------------------------------------------
    from tqdm.auto import tqdm

    from dpcl.guarantees.certificates import (
        ScopedLedger,
        certificate_from_ledger,
        non_private_certificate,
        verify_certificate,
        write_certificate,
    )

    def plan_of(t: int, n_examples: int) -> Any:
        if trains_plan:
            return spec.plan_task(config.method, config.privacy, n_examples, t)
        from dpcl.guarantees.method_schema import ReleaseCoverage, TaskPlan

        return TaskPlan(events=(), noise={}, assumptions=(), release=ReleaseCoverage.not_covered(NON_PRIVATE_STATEMENT))

    def finish_release(t: int, plan: Any, n_examples: int, checkpoint: Path, checkpoint_sha: str,
                       curator_file: Path, curator_sha: str) -> None:
        """After the commit point: scoped releases, certificate, evaluation and run state of release ``t``.

        Idempotent, so that a resumed run can finish a release the ledger committed before a crash.
        """
        scoped: dict[str, ScopedLedger] = {}
        for scoped_plan in plan.scoped:
            first = scoped_plan.events[0]
            sledger = scoped_ledger(scoped_plan.name, first.adjacency, first.unit)
            done = sledger.releases and sledger.releases[-1].task_index == t and (
                sledger.releases[-1].n_charges == len(sledger.charges))
            if not done:
                sledger.release(t, checkpoint_sha256=checkpoint_sha)
                _crash_point("scoped_ledger", t)
            scoped[scoped_plan.name] = ScopedLedger(scoped_plan.scope, sledger)
        certificate = out / "certificates" / f"task{t + 1:03d}.cert.json"
        assumptions = list(report.assumptions)
        assumptions += [a for a in plan.assumptions if a not in assumptions]
        if trains_plan:
            assumptions += [a for a in noise_assumptions(reproducible) if a not in assumptions]
        assumptions.append(CURATOR_STATE_ASSUMPTION)
        extra: dict[str, Any] = {
            "seed": seed,
            "reproducible_noise": reproducible,
            "plan_notes": list(plan.notes),
            "device": device,
        }
        if hasattr(method, "certificate_extra"):  # e.g. L2DP-ML: Thm 2 terms and checked preconditions
            extra.update(method.certificate_extra(t))
        common: dict[str, Any] = dict(
            method=method_name,
            label_space=config.stream["label_space"],
            assumptions=assumptions,
            scoped=scoped,
            checkpoint=checkpoint,
            config=config.to_dict(),
            label_filtering=describe_filtering(filter_reports[: t + 1]),
            extra=extra,
        )
        cumulative: float | None = None
        if private:
            cert = certificate_from_ledger(ledger, release=plan.release, **common)
            cumulative = ledger.releases[-1].guarantee.epsilon
        else:
            reasons = (
                (NON_PRIVATE_STATEMENT,) if not trains_plan
                else (NOT_COVERED_RUN_STATEMENT,) + tuple(plan.release.reasons if plan.release is not None else ())
            )
            cert = non_private_certificate(release_task=t, reasons=reasons, **common)
        write_certificate(certificate, cert)
        _crash_point("certificate", t)
        verify_certificate(certificate).raise_if_invalid()
        if sign_key is not None:
            sign_certificate(certificate, sign_key, verify=False)

        accuracies = tuple(
            method.accuracy(prepared[j].test_features, prepared[j].test_labels) for j in range(t + 1)
        )
        releases.append(
            ReleaseSummary(
                task_index=t,
                accuracies=accuracies,
                cumulative_epsilon=cumulative,
                checkpoint=checkpoint.relative_to(out).as_posix(),
                certificate=certificate.relative_to(out).as_posix(),
                examples=n_examples,
                filtered_out=prepared[t].filtered_out,
                curator_state=curator_file.relative_to(out).as_posix(),
                curator_sha256=curator_sha,
            )
        )
        save_state()
        _crash_point("run_state", t)

    def paths_of(t: int) -> tuple[Path, Path]:
        return out / "checkpoints" / f"task{t + 1:03d}.pt", out / "curator" / f"task{t + 1:03d}.state.pt"

    # -- resume: finish a release the ledger committed, remove what no commit covers ------------------
    if private:
        listed = [r.task_index for r in releases]
        for t in [t for t in dict.fromkeys(ledger.released_tasks()) if t not in listed]:
            expected_next = listed[-1] + 1 if listed else 0
            if t != expected_next:
                raise LedgerCorruptError(
                    f"{str(out / 'ledger.json')!r} records a release of task {t + 1} but {str(state_path)!r} "
                    f"continues with task {expected_next + 1}: they belong to different runs; restore the run's own "
                    "files or start the run over in a new directory."
                )
            checkpoint, curator_file = paths_of(t)
            record = ledger.releases[-1]
            curator_sha = str(ledger.metadata.get("curator_sha256", {}).get(str(t), ""))
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
            method.load_state_dict(payload["state"])
            curator = load_curator_state(curator_file, expected_sha256=curator_sha, method=method_name,
                                         task_index=t)
            method.load_curator_state_dict(curator["state"])
            data, _, _ = _release_data(prepared, t, spec.reuses_past_tasks)
            finish_release(t, plan_of(t, len(data)), len(data), checkpoint, record.checkpoint_sha256,
                           curator_file, curator_sha)
            listed.append(t)
    start = 0 if not releases else releases[-1].task_index + 1
    for t in range(start, n_tasks):  # files of an attempt that never committed released nothing: remove them
        for final in paths_of(t):
            for leftover in (_pending(final), final):
                leftover.unlink(missing_ok=True)
        (out / "certificates" / f"task{t + 1:03d}.cert.json").unlink(missing_ok=True)

    for t in range(start, n_tasks):
        data, outputs, tasks_read = _release_data(prepared, t, spec.reuses_past_tasks)
        plan = plan_of(t, len(data))
        if private and plan.events and not _pending_charge(ledger, tasks_read, plan.events):
            ledger.charge(tasks_read, plan.events, unit_ids=data.unit_ids, label=f"{method_name} task {t}")
        for scoped_plan in plan.scoped:  # charged before training too
            first = scoped_plan.events[0]
            sledger = scoped_ledger(scoped_plan.name, first.adjacency, first.unit)
            if not _pending_charge(sledger, tasks_read, scoped_plan.events):
                sledger.charge(tasks_read, scoped_plan.events, unit_ids=data.unit_ids,
                               label=f"{method_name} task {t} ({scoped_plan.name})")
        if private and not ledger.charges:
            raise PrivacyViolationError(
                f"release {t} reads no private data and nothing was charged yet; dpcl cannot certify a release "
                "without a charged mechanism. Check the stream: its first task is empty after label filtering."
            )
        with tqdm(
            total=method.planned_work(plan),
            desc=f"task {t + 1}/{n_tasks}",
            unit="step",
            disable=quiet,
            file=sys.stderr,
            leave=False,
        ) as bar:
            method.fit_task(t, data, outputs, plan, progress=bar.update)

        # the release, committed atomically: checkpoint and curator state under pending names, then the ledger's
        # release record (the commit point, which also records the curator state's SHA-256), then the renames.
        checkpoint, curator_file = paths_of(t)
        checkpoint_sha = save_checkpoint(
            _pending(checkpoint), method=method_name, task_index=t, state=method.state_dict(),
            meta={"seed": seed, "config_sha256": digest, "dpcl_version": __version__},
        )
        _crash_point("checkpoint", t)
        curator_sha = save_curator_state(_pending(curator_file), method=method_name, task_index=t,
                                         state=method.curator_state_dict())
        _crash_point("curator_state", t)
        if private:
            ledger.metadata.setdefault("curator_sha256", {})[str(t)] = curator_sha
            ledger.release(t, checkpoint_sha256=checkpoint_sha)
            _crash_point("ledger", t)
        os.replace(_pending(checkpoint), checkpoint)
        os.replace(_pending(curator_file), curator_file)
        _crash_point("rename", t)
        finish_release(t, plan, len(data), checkpoint, checkpoint_sha, curator_file, curator_sha)
        if stop_after_task is not None and t >= stop_after_task and t < n_tasks - 1:
            break

    complete = bool(releases) and releases[-1].task_index == n_tasks - 1
    matrix = accuracy_rows([r.accuracies for r in releases], n_tasks)
    metrics: dict[str, Any] = {
        "method": method_name,
        "private": private,
        "complete": complete,
        "seed": seed,
        "reproducible_noise": reproducible,
        "stream_seed": int(stream.seed),
        "device": device,
        "config": str(config_file),
        "epsilon_per_task": config.privacy["epsilon"] if private else math.inf,
        "delta": config.privacy["delta"],
        "across_tasks": across,
        "cumulative_epsilon": [r.cumulative_epsilon for r in releases],
        "final_epsilon": releases[-1].cumulative_epsilon if releases else None,
        **summarize(matrix),
        "certificates": [r.certificate for r in releases],
        "checkpoints": [r.checkpoint for r in releases],
        "label_filtering": describe_filtering(filter_reports),
    }
    metrics_json = dict(metrics)
    metrics_json["epsilon_per_task"] = metrics["epsilon_per_task"] if private else "inf"
    write_json_atomic(out / "metrics.json", metrics_json)
    from dpcl.runner.plots import plot_accuracy

    plot_accuracy(
        out / "accuracy.png",
        matrix,
        title=f"{method_name} on {stream.dataset_name}"
        + (f" (ε={config.privacy['epsilon']:g} per task, δ={config.privacy['delta']:g})" if private else " (not private)"),
        cumulative_epsilon=[r.cumulative_epsilon for r in releases],
    )
    return RunResult(
        out_dir=out,
        method=method_name,
        private=private,
        releases=tuple(releases),
        metrics=metrics_json,
        resumed_after=resumed_after,
        complete=complete,
        delta=float(config.privacy["delta"]),
        audit=report.to_dict(),
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


def _pending_charge(ledger: Any, tasks: Sequence[int], events: Sequence[Any]) -> bool:
    """Whether ``ledger``'s last charge is these events on these tasks with no release after it: the charge of an
    attempt that crashed before its release was committed. That attempt released nothing (its files are removed),
    so the retrained task reuses the charge instead of charging again."""
    if not ledger.charges or (ledger.releases and ledger.releases[-1].n_charges == len(ledger.charges)):
        return False
    last = ledger.charges[-1]
    return last.tasks == tuple(int(t) for t in tasks) and last.events == tuple(events)


def _recorded_checkpoint_hash(certificate: Path) -> str:
    """The checkpoint SHA-256 a certificate (or non-private statement) records."""
    try:
        data = read_json(certificate)
        return str(data["checkpoint"]["sha256"])
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise ConfigError(
            f"cannot resume: certificate {str(certificate)!r} of the last recorded release is missing or damaged ({exc})."
        ) from exc
