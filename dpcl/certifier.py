"""Certify the checkpoints of any training loop: :class:`Certifier`, the public certification API.

``dpcl run`` trains the methods dpcl ships; a :class:`Certifier` gives the same
guarantees to a training loop you wrote yourself (plain PyTorch, opacus, numpy,
JAX...). It holds, for one run directory:

* the crash-safe task ledger (:class:`~dpcl.guarantees.ledger.TaskLedger`):
  privacy events are *charged* to a task's data before training on it, and the
  ledger is written atomically after every change, so a crash never loses budget
  already spent;
* the composition across tasks (Tobaben et al., Thm 4.4 parallel for disjoint
  privacy units, Thm 4.5 sequential otherwise; ``auto`` picks from the declared
  disjointness), with unit ids checked for disjointness when given;
* an optional privacy filter (``total_epsilon``): a charge that would overspend
  is refused with :class:`~dpcl.errors.BudgetExceededError` before anything is
  recorded, so the task is never trained;
* the label-space policy with its public label sets
  (:mod:`dpcl.guarantees.label_space`; ``data`` is refused, Prop. 4.6);
* certificates: :meth:`Certifier.release` hashes a checkpoint (a file, or bytes
  it writes atomically under ``checkpoints/``), writes its certificate under
  ``certificates/`` and verifies it with the code of ``dpcl verify``. The
  headline is the checkpoint's own guarantee: you state whether the checkpoint
  is covered by the charged events (a
  :class:`~dpcl.guarantees.method_schema.ReleaseCoverage`); one that is not gets
  a certificate that says ``private: false`` with your reasons.

Run directory (the same split as ``dpcl run``)::

    DIR/checkpoints/   released checkpoints           (release: may be published)
    DIR/certificates/  one certificate per release    (release: may be published)
    DIR/ledger.json    the task ledger                (curator: never publish)
    DIR/ledger.json.*.journal  its journal (later saves)  (curator: never publish)
    DIR/scoped/        one ledger per scoped statement (curator: never publish)
    DIR/curator/       your private state, if any     (curator: never publish)

A directory that already holds a run (a ledger, scoped ledgers or certificates) is refused with
:class:`~dpcl.errors.ExistingRunError`, naming what is there, unless resuming is asked for
(``resume=True``): a second run into the same directory would charge every task again and
write new certificates next to the old ones. Resumed, every charge and release recorded there stays
(nothing is lost or counted twice); settings that differ from the recorded ones are refused with
:class:`~dpcl.errors.ConfigError`.

Drivers (``dpcl run`` is one) release in two phases so that a crash loses nothing:
charge before training (:meth:`Certifier.charge` with ``reuse_uncommitted`` after a
crash), write the checkpoint under a temporary name, :meth:`Certifier.commit` its
SHA-256 (the commit point), rename it, then :meth:`Certifier.certify`. Scoped
statements (:meth:`Certifier.charge_scoped`) and runs without a headline guarantee
(``private=False``) are stated the same way.

DP-SGD schedules (:mod:`dpcl.certification.dpsgd_plans`): a planned schedule is charged before the first step
and every step taken is checked against it before its update. Noise (:mod:`dpcl.certification.noise`): a task's
DP noise is drawn from generators dpcl seeds from OS entropy and records, and the certificates say so.

No torch at import time: checkpoints are files or bytes, so any framework can be certified (torch is imported
only by :meth:`Certifier.noise_generator`).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np

from dpcl.accounting.events import Adjacency, PrivacyEvent
from dpcl.errors import ConfigError, InvalidParameterError
from dpcl.guarantees.label_space import FilterReport, LabelSpacePolicy, filter_task
from dpcl.guarantees.ledger import Charge, StreamGuarantee, TaskLedger
from dpcl.guarantees.signing import load_private_key
from dpcl.guarantees.settings import ACROSS_TASKS_CHOICES, PrivacySettings
# the Certifier's parts (dpcl.certification); the names users import from here are re-exported
from dpcl.certification.arguments import (
    _DRY_RUN, _METADATA_KEY, _UNSET, _certifier_settings, _charge_or_reuse, _check_run_options, _composition,
    _label_space, _plain, _refuse_existing_run, _task_index, _task_sizes, check_reproducible_seed,
    existing_run_files,
)
from dpcl.certification.assumptions import (
    COUNTS_ASSUMPTION, CURATOR_ASSUMPTION, DISJOINT_ASSUMPTION, FIXED_PARAMETERS_ASSUMPTION, NOISE_OS_ENTROPY,
    NOISE_REPRODUCIBLE, SHARED_ASSUMPTION, adaptive_filter_assumption,
)
from dpcl.certification.dpsgd_plans import DpsgdPlans
from dpcl.certification.noise import NoiseSources
from dpcl.certification.records import CertifiedRelease, CommittedRelease, PlannedSteps, UnchargedStepError
from dpcl.certification.releases import Releases
from dpcl.certification.scoped import ScopedStatements

__all__ = [
    "ACROSS_TASKS_CHOICES",
    "Certifier",
    "CertifierTask",
    "CertifiedRelease",
    "CommittedRelease",
    "PlannedSteps",
    "UnchargedStepError",
]



class Certifier(ScopedStatements, DpsgdPlans, NoiseSources, Releases):
    """Charges, releases and certificates for a training loop you wrote (see the module docstring).

    Parameters
    ----------
    run_dir:
        Directory of the run; created if missing, resumed if it holds a ledger (:meth:`dry_run`: none).
    settings:
        The privacy settings (:class:`~dpcl.guarantees.settings.PrivacySettings`: delta, adjacency, unit,
        accountant, composition, filter, label space), e.g. ``load_config(path).settings``. Or give them as the
        keyword arguments below (not both).
    delta:
        Delta of every guarantee.
    label_space:
        ``"prior"`` (one public label set per task) or ``"prior_const"`` (one public set for all
        tasks); ``"data"`` is refused (Tobaben et al., Prop. 4.6).
    prior_labels:
        The public label sets: a list of per-task lists (``prior``; its length is the number of
        tasks) or one list of labels (``prior_const``; the stream may be open-ended).
    adjacency, unit:
        Neighbouring relation (``"add_remove"`` or ``"replace_one"``) and privacy unit of every event.
    across_tasks:
        ``"parallel"`` (Thm 4.4), ``"sequential"`` (Thm 4.5) or ``"auto"`` (parallel iff
        ``disjoint_units``).
    disjoint_units:
        Whether tasks hold disjoint privacy units. Required by ``auto``; ``parallel`` implies it
        (``False`` is refused). Unit ids passed to :meth:`charge` are checked against it.
    total_epsilon, total_delta:
        Optional privacy filter over the stream (per task's data under ``parallel``): a charge that
        would overspend raises :class:`~dpcl.errors.BudgetExceededError` and is not recorded.
    accountant:
        Accountant of every guarantee (default ``"auto"``, the tightest sound one, named).
    task_sizes:
        Optional public training-set size of each task, stated in certificates.
    sign_key:
        Optional Ed25519 private key (a key file from ``dpcl keygen``, or a loaded key): every
        certificate is signed after it is written and verified (:mod:`dpcl.guarantees.signing`), so
        that ``dpcl verify --public-key KEY.pub`` can check who issued it. Loaded here, before anything
        is charged.
    method:
        Name of your training method, stated in certificates (e.g. ``"opacus DP-SGD, MLP"``).
    private:
        ``False`` for a run whose checkpoints have no DP guarantee (a non-private reference run, or a
        method whose checkpoint no charged release covers): no headline ledger is kept (``ledger.json`` is
        never written, :meth:`charge` is refused) and every release gets a ``private: false`` certificate
        with its reasons; scoped statements (:meth:`charge_scoped`) are still charged and stated.
    config:
        The settings recorded in every certificate (``dpcl verify`` checks the guarantee against its
        ``[privacy]`` and ``[stream]`` sections); default: these privacy settings in ``dpcl run``'s layout.
    metadata:
        Extra JSON fields recorded in the ledgers (the headline's and the scoped ones), e.g. the run's seed.
    resume:
        ``True`` to continue the run recorded in ``run_dir`` (after a crash, or to add tasks). Without it a
        directory that holds a ledger, scoped ledgers or certificates is refused with
        :class:`~dpcl.errors.ExistingRunError`. ``True`` on a directory without a run starts one.
    expect_ledger:
        ``True`` when the caller knows the directory already released something (e.g. from its own run
        state): a missing ledger then raises :class:`~dpcl.errors.LedgerCorruptError` instead of starting an
        empty one that would forget spent budget. Implies ``resume``.
    driver:
        Name of a program that keeps its own run state (``run.json``) in ``run_dir`` and drives the
        Certifier, e.g. ``"dpcl run"``. Without it a directory holding ``run.json`` is refused.
    """

    def __init__(
        self,
        run_dir: "str | os.PathLike[str]",
        *,
        settings: PrivacySettings | None = None,
        delta: Any = _UNSET,
        label_space: Any = _UNSET,
        prior_labels: Any = _UNSET,
        adjacency: Any = _UNSET,
        unit: Any = _UNSET,
        across_tasks: Any = _UNSET,
        disjoint_units: Any = _UNSET,
        total_epsilon: Any = _UNSET,
        total_delta: Any = _UNSET,
        accountant: Any = _UNSET,
        task_sizes: Any = _UNSET,
        method: str = "custom",
        sign_key: Any = None,
        private: bool = True,
        config: Mapping[str, Any] | None = None,
        metadata: Mapping[str, Any] | None = None,
        resume: bool = False,
        expect_ledger: bool = False,
        driver: str | None = None,
    ) -> None:
        _check_run_options(private=private, resume=resume, driver=driver, config=config, metadata=metadata)
        if not isinstance(expect_ledger, bool):
            raise InvalidParameterError(f"expect_ledger must be True or False, got {expect_ledger!r}.")
        given = {k: v for k, v in dict(
            delta=delta, label_space=label_space, prior_labels=prior_labels, adjacency=adjacency, unit=unit,
            across_tasks=across_tasks, disjoint_units=disjoint_units, total_epsilon=total_epsilon,
            total_delta=total_delta, accountant=accountant, task_sizes=task_sizes,
        ).items() if v is not _UNSET}
        settings = _certifier_settings(settings, given, config)
        if run_dir is None:
            raise InvalidParameterError("run_dir is required: the run's directory (Certifier.dry_run writes nothing).")
        dry_run = run_dir is _DRY_RUN
        resume = resume or expect_ledger
        self.private = private
        self.driver = driver
        self._metadata = dict(metadata or {})
        self.label_space, self._label_sets, self.n_tasks = _label_space(
            settings.label_space, settings.prior_labels, dry_run=dry_run)
        self.prior_labels = _plain(settings.prior_labels)
        resolved, self.disjoint_units = _composition(settings.across_tasks, settings.disjoint_units)
        self.across_tasks = resolved
        self.requested_across_tasks = settings.across_tasks
        self.task_sizes = _task_sizes(settings.task_sizes, self.n_tasks)
        #: The privacy settings this Certifier certifies under (label space and composition as validated here).
        self.settings = settings.replace(
            label_space=self.label_space.value, prior_labels=self.prior_labels, disjoint_units=self.disjoint_units,
            task_sizes=self.task_sizes,
        )
        if not isinstance(method, str) or not method.strip():
            raise InvalidParameterError(f"method must be a non-empty name of your training method, got {method!r}.")
        self.method = method.strip()
        self._sign_key = None
        if sign_key is not None:
            self._sign_key = load_private_key(sign_key, option="sign_key")

        ledger_settings = dict(delta=settings.delta, across_tasks=resolved, accountant=settings.accountant,
                               adjacency=settings.adjacency, unit=settings.unit)
        self._scoped_settings = ledger_settings
        self._scoped: dict[str, TaskLedger] = {}
        self._scopes: dict[str, str] = {}
        self._plans: dict[int, list[PlannedSteps]] = {}
        filter_settings = dict(total_epsilon=settings.total_epsilon, total_delta=settings.total_delta)
        #: None for a dry run (:meth:`dry_run`): the ledgers live in memory and nothing is written.
        self.run_dir = None if dry_run else Path(run_dir)
        if self.run_dir is None:
            self.ledger = TaskLedger(metadata=dict(self._metadata), **ledger_settings,
                                     **(filter_settings if private else {}))
            self._check_or_record_settings()
        else:
            self._open_run_dir(resume=resume, expect_ledger=expect_ledger, ledger_settings=ledger_settings,
                               filter_settings=filter_settings)

    def _open_run_dir(self, *, resume: bool, expect_ledger: bool, ledger_settings: dict[str, Any],
                      filter_settings: dict[str, Any]) -> None:
        """Create or resume the run directory and its headline ledger (refusing another run's directory)."""
        driver, private = self.driver, self.private
        if self.run_dir.exists() and not self.run_dir.is_dir():
            raise InvalidParameterError(f"run_dir {str(self.run_dir)!r} is a file, not a directory.")
        if (self.run_dir / "run.json").exists() and driver is None:
            raise ConfigError(
                f"{str(self.run_dir)!r} is a `dpcl run` directory (it has run.json); resume it with `dpcl run`, "
                "or give the Certifier a directory of its own."
            )
        if not resume:
            _refuse_existing_run(self.run_dir)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        certificates = self.certificates_dir
        already_released = certificates.is_dir() and any(certificates.glob("*.cert.json"))
        if private:
            self.ledger = TaskLedger.open(
                self.ledger_path,
                must_exist=already_released or expect_ledger,
                metadata=self._metadata or None,
                **filter_settings,
                **ledger_settings,
            )
        else:  # no headline ledger: an in-memory one holds the settings and refuses nothing it is not asked
            self.ledger = TaskLedger(metadata=dict(self._metadata), **ledger_settings)
        self._check_or_record_settings()
        self.checkpoints_dir.mkdir(exist_ok=True)
        self.certificates_dir.mkdir(exist_ok=True)

    @classmethod
    def dry_run(cls, settings: PrivacySettings, *, method: str = "custom", private: bool = True,
                metadata: Mapping[str, Any] | None = None) -> "Certifier":
        """A Certifier whose ledgers live in memory: it charges, commits and composes exactly as one on a run
        directory does (same validation, same privacy filter, same guarantees) but writes nothing and releases
        no checkpoint. ``dpcl audit`` charges a config's plans to one (:func:`dpcl.audit_config.audit_config`)."""
        return cls(_DRY_RUN, settings=settings, method=method, private=private, metadata=metadata)

    @property
    def is_dry_run(self) -> bool:
        return self.run_dir is None

    def _refuse_dry_run(self, what: str) -> None:
        if self.run_dir is None:
            raise InvalidParameterError(
                f"this Certifier is a dry run (no run directory): it cannot {what}; open one on a run directory."
            )

    # -- paths -----------------------------------------------------------------------------------
    @property
    def ledger_path(self) -> Path:
        return self.run_dir / "ledger.json"

    @property
    def checkpoints_dir(self) -> Path:
        return self.run_dir / "checkpoints"

    @property
    def certificates_dir(self) -> Path:
        return self.run_dir / "certificates"

    @property
    def scoped_dir(self) -> Path:
        """Where the ledgers of scoped statements live (``NAME.ledger.json``; curator-side, never published)."""
        return self.run_dir / "scoped"

    @property
    def curator_dir(self) -> Path:
        """Where to keep private state your loop needs to continue (never published, never certified)."""
        return self.run_dir / "curator"

    # -- settings and resume ------------------------------------------------------------------------
    def _settings(self) -> dict[str, Any]:
        return {
            "label_space": self.label_space.value,
            "prior_labels": self.prior_labels,
            "across_tasks": self.requested_across_tasks,
            "disjoint_units": self.disjoint_units,
            "task_sizes": self.task_sizes,
            "method": self.method,
        }

    def _state(self) -> dict[str, Any]:
        return self.ledger.metadata.setdefault(_METADATA_KEY, {})

    def _check_or_record_settings(self) -> None:
        mine = self._settings()
        state = self.ledger.metadata.get(_METADATA_KEY)
        if state is None:
            if (self.ledger.charges or self.ledger.releases) and self.driver is None:
                raise ConfigError(
                    f"ledger {str(self.ledger_path)!r} was not written by a Certifier (it has charges but no "
                    "Certifier settings); give the Certifier a directory of its own."
                )
            self.ledger.metadata[_METADATA_KEY] = {"settings": mine, "label_filtering": {}, "certificates": []}
            self.ledger.save()
            return
        recorded = state.get("settings", {})
        mismatched = {k: (recorded.get(k), v) for k, v in mine.items() if recorded.get(k) != v}
        if mismatched:
            desc = "; ".join(f"{k}: recorded {a!r}, asked {b!r}" for k, (a, b) in mismatched.items())
            raise ConfigError(
                f"{str(self.run_dir)!r} was certified with other settings ({desc}). Resume with the original "
                "settings, or start a new run directory."
            )

    # -- label space ---------------------------------------------------------------------------------
    def labels(self, task: int) -> tuple[int, ...]:
        """The public output label set O_t of ``task`` (sorted)."""
        t = _task_index(task, self.n_tasks)
        sets = self._label_sets
        return tuple(sorted(sets[t] if self.label_space is LabelSpacePolicy.PRIOR else sets[0]))

    def filter_labels(self, task: int, labels: Any) -> np.ndarray:
        """Boolean mask of the examples of ``task`` whose label is in its public set (Tobaben et al., Eq. 6).

        Train only on the kept examples. The kept / dropped counts are recorded and stated in the
        certificates (as public counts).
        """
        t = _task_index(task, self.n_tasks)
        mask, report = filter_task(labels, self.labels(t), t)
        self._state().setdefault("label_filtering", {})[str(t)] = {"kept": report.kept, "filtered": report.filtered}
        self.ledger.save()
        return mask

    def _filter_reports(self) -> list[FilterReport]:
        recorded = self._state().get("label_filtering", {})
        return [
            FilterReport(task_index=int(t), kept=int(v["kept"]), filtered=int(v["filtered"]))
            for t, v in sorted(recorded.items(), key=lambda kv: int(kv[0]))
        ]

    # -- charging ----------------------------------------------------------------------------------------
    def task(self, index: int) -> "CertifierTask":
        """A handle on one task: charge, plan DP-SGD, record steps, filter labels, release."""
        return CertifierTask(self, _task_index(index, self.n_tasks))

    def charge(
        self,
        task: "int | Sequence[int]",
        events: "PrivacyEvent | Sequence[PrivacyEvent]",
        *,
        unit_ids: Any = None,
        label: str = "",
        reuse_uncommitted: bool = False,
    ) -> Charge:
        """Charge ``events`` (any :mod:`dpcl.accounting.events`) to the data of ``task`` *before* using it.

        ``task`` may list several tasks for a release that reads them all. ``unit_ids`` (the privacy-unit
        ids of the data) are checked for disjointness under parallel composition
        (:class:`~dpcl.errors.DisjointnessViolationError`). The privacy filter refuses an overspend with
        :class:`~dpcl.errors.BudgetExceededError`. On any refusal nothing is recorded.

        ``reuse_uncommitted`` (resuming after a crash): when the ledger's last charge is these events on
        these tasks with no release after it, it is returned instead of charging again. That charge belongs
        to an attempt that crashed before its release was committed, so it released nothing; the retried
        attempt is covered by it (the same events on the same data), and the budget is never charged twice.
        A non-private Certifier (``private=False``) refuses every headline charge.
        """
        if not self.private:
            raise InvalidParameterError(
                "this Certifier was opened with private=False: its checkpoints state no guarantee, so nothing is "
                "charged to a headline ledger. Charge statements about narrower releases with charge_scoped."
            )
        indices, event_list = self._charge_arguments(task, events, self.ledger)
        name = label or (f"{self.method} task {indices[0]}" if len(indices) == 1 else f"{self.method} tasks {indices}")
        return _charge_or_reuse(self.ledger, indices, event_list, unit_ids=unit_ids, label=name,
                                reuse_uncommitted=reuse_uncommitted)

    def _charge_arguments(self, task: Any, events: Any, ledger: TaskLedger) -> tuple[list[int], list[Any]]:
        tasks = [task] if isinstance(task, (int, np.integer)) and not isinstance(task, bool) else list(task)
        indices = [_task_index(t, self.n_tasks) for t in tasks]
        event_list = [events] if isinstance(events, PrivacyEvent) else list(events)
        for e in event_list:
            if isinstance(e, PrivacyEvent) and (e.adjacency is not ledger.adjacency or e.unit != ledger.unit):
                raise InvalidParameterError(
                    f"an event states adjacency {e.adjacency.value!r} and unit {e.unit!r}, but this ledger "
                    f"accounts {ledger.adjacency.value!r} / {ledger.unit!r}: build the event with "
                    f"adjacency={ledger.adjacency.value!r}, unit={ledger.unit!r}."
                )
        return indices, event_list

    # -- guarantees -----------------------------------------------------------------------------------
    def guarantee(self) -> StreamGuarantee:
        """Cumulative guarantee of everything charged so far (what the next release will state)."""
        return self.ledger.guarantee()

    def task_epsilon(self, task: int) -> float:
        """Epsilon of the events charged to ``task``'s data alone."""
        return self.ledger.task_guarantee(_task_index(task, self.n_tasks))

    def __repr__(self) -> str:
        return (
            f"Certifier({str(self.run_dir)!r}, delta={self.ledger.delta!r}, across_tasks={self.across_tasks!r}, "
            f"charges={len(self.ledger.charges)}, releases={len(self.ledger.releases)})"
        )


class CertifierTask:
    """One task of a :class:`Certifier`: the same methods, with the task index filled in."""

    def __init__(self, certifier: Certifier, index: int) -> None:
        self.certifier = certifier
        self.index = index

    @property
    def adjacency(self) -> Adjacency:
        return self.certifier.ledger.adjacency

    @property
    def unit(self) -> str:
        return self.certifier.ledger.unit

    @property
    def labels(self) -> tuple[int, ...]:
        return self.certifier.labels(self.index)

    def filter_labels(self, labels: Any) -> np.ndarray:
        return self.certifier.filter_labels(self.index, labels)

    def charge(self, events: "PrivacyEvent | Sequence[PrivacyEvent]", *, unit_ids: Any = None, label: str = "") -> Charge:
        return self.certifier.charge(self.index, events, unit_ids=unit_ids, label=label)

    def plan_dpsgd(self, *, noise_multiplier: float, sample_rate: float, steps: int, unit_ids: Any = None) -> Charge:
        return self.certifier.plan_dpsgd(
            self.index, noise_multiplier=noise_multiplier, sample_rate=sample_rate, steps=steps, unit_ids=unit_ids
        )

    def record_dpsgd_steps(self, *, noise_multiplier: float, sample_rate: float, count: int = 1) -> None:
        self.certifier.record_dpsgd_steps(
            self.index, noise_multiplier=noise_multiplier, sample_rate=sample_rate, count=count
        )

    @property
    def planned_steps(self) -> tuple[PlannedSteps, ...]:
        return self.certifier.planned_steps(self.index)

    def epsilon(self) -> float:
        return self.certifier.task_epsilon(self.index)

    def noise_generator(self, *, device: Any = "cpu", reproducible_seed: int | None = None) -> Any:
        return self.certifier.noise_generator(self.index, device=device, reproducible_seed=reproducible_seed)

    def numpy_noise_generator(self, *, reproducible_seed: int | None = None) -> np.random.Generator:
        return self.certifier.numpy_noise_generator(self.index, reproducible_seed=reproducible_seed)

    def release(self, checkpoint: "str | os.PathLike[str] | bytes", **kwargs: Any) -> CertifiedRelease:
        return self.certifier.release(self.index, checkpoint, **kwargs)

    def __repr__(self) -> str:
        return f"CertifierTask({self.index}, run_dir={str(self.certifier.run_dir)!r})"
