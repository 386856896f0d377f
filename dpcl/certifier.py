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

DP-SGD schedules (crash safety for step-wise training). :meth:`CertifierTask.plan_dpsgd`
charges a whole planned schedule (noise multiplier, sample rate, steps) before the
first step; :meth:`CertifierTask.record_dpsgd_steps` then checks every step taken
against that charge *before* the step's update is applied (the opacus accountant of
:mod:`dpcl.integrations.opacus` calls it from opacus' step hook). A step with less
noise or a higher sample rate than planned, or beyond the planned count, raises
:class:`UnchargedStepError` (nothing recorded). A release reports the recorded and
charged steps; the certificate accounts the full charge (conservative when training
stopped early). Steps are recorded in memory only: after a crash, rerun the task and
plan it again, which charges it again (conservative: the interrupted attempt may
have leaked).

Noise (who owns it). The DP noise must be unpredictable to anyone who sees the release, yet almost every
loop calls ``torch.manual_seed`` for its initialisation, and a generator it seeds also fixes the noise drawn
from it. :meth:`Certifier.noise_generator` (torch) and :meth:`Certifier.numpy_noise_generator` give a task a
generator seeded from OS entropy (:mod:`secrets`), independent of every seed in the process, and record it in
the ledger; the opacus integration installs them in the DP optimizer and its Poisson sampler. Certificates then
state the noise source because dpcl set it. ``reproducible_seed`` is the explicit exception (research runs): the
source is recorded as a seed known to the caller, and the certificate says that the guarantee holds only
against someone who does not know it.

No torch at import time: checkpoints are files or bytes, so any framework can be certified (torch is imported
only by :meth:`Certifier.noise_generator`).
"""

from __future__ import annotations

import json
import os
import re
import secrets
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

import numpy as np

from dpcl.accounting.events import Adjacency, PoissonSampledGaussianEvent, PrivacyEvent, RepeatedEvent
from dpcl.accounting.validation import check_count, check_positive_scalar, check_sample_rate
from dpcl.errors import ConfigError, ExistingRunError, InvalidParameterError, LedgerCorruptError, PrivacyViolationError
from dpcl._io.atomic_io import sha256_file, write_bytes_atomic
from dpcl.guarantees.certificates import (
    ScopedLedger,
    certificate_from_ledger,
    non_private_certificate,
    verify_certificate,
    write_certificate,
)
from dpcl.guarantees.label_space import (
    FilterReport,
    LabelSpacePolicy,
    describe_filtering,
    filter_task,
    label_space_assumption,
    output_label_sets,
)
from dpcl.guarantees.ledger import Charge, ReleaseRecord, StreamGuarantee, TaskLedger, compress_events
from dpcl.guarantees.method_schema import ReleaseCoverage
from dpcl.guarantees.signing import load_private_key, sign_certificate
from dpcl.guarantees.settings import ACROSS_TASKS_CHOICES, PrivacySettings

__all__ = [
    "ACROSS_TASKS_CHOICES",
    "Certifier",
    "CertifierTask",
    "CertifiedRelease",
    "CommittedRelease",
    "PlannedSteps",
    "UnchargedStepError",
]


#: Stated in every certificate a Certifier writes: what it does not cover.
CURATOR_ASSUMPTION = (
    "The certificate covers the released checkpoint only. The run directory's ledger.json and curator/ "
    "(anything computed from the private data without noise) are curator-side, not covered, and must not "
    "be published."
)
DISJOINT_ASSUMPTION = (
    "Tasks hold disjoint privacy units: no person/unit contributes data to two tasks (Tobaben et al., Thm 4.4)."
)
SHARED_ASSUMPTION = "Privacy units may occur in several tasks; releases compose sequentially (Tobaben et al., Thm 4.5)."
COUNTS_ASSUMPTION = (
    "Per-task example counts stated in this certificate (task sizes, examples kept and dropped by the public "
    "label sets) are treated as public: epsilon does not cover them."
)

#: Noise sources a Certifier records per task (ledger metadata ``certifier.noise_sources``).
NOISE_OS_ENTROPY = "os_entropy"
NOISE_REPRODUCIBLE = "reproducible_seed"

#: Stated by a Certifier without a privacy filter: composition needs the charges' parameters fixed in advance.
FIXED_PARAMETERS_ASSUMPTION = (
    "No privacy filter: the privacy parameters of every charge (noise scale, sample rate, number of steps, "
    "sensitivity, and which tasks' data it reads) were fixed before any earlier release was seen. Composition then "
    "holds although what each mechanism computes may depend on earlier releases; parameters chosen after seeing "
    "earlier releases are not covered (a privacy filter, total_epsilon, covers them)."
)


def adaptive_filter_assumption(total_epsilon: float, total_delta: float, across_tasks: str) -> str:
    """Stated by a Certifier with a privacy filter: adaptively chosen parameters are covered by its budget."""
    scope = "the whole stream" if across_tasks == "sequential" else "each task's data"
    return (
        f"Privacy filter over {scope} (total_epsilon = {total_epsilon:g}, total_delta = {total_delta:g}): the "
        "parameters of each charge may have been chosen after seeing earlier releases (fully adaptive composition: "
        "Rogers et al. 2016, Whitehouse et al. 2023; Gaussian rule: Smith & Thakurta 2022). The filter refused every "
        f"charge that would overspend, so the guarded data stay ({total_epsilon:g}, {total_delta:g})-DP whatever "
        "the choices; the headline epsilon composes the charged events as if their parameters had been fixed in "
        f"advance, and under adaptive choice ({total_epsilon:g}, {total_delta:g}) is the bound."
    )


_METADATA_KEY = "certifier"
_SCOPE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*")
_FILENAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
#: Relative slack when a recorded DP-SGD step is compared with the planned one (float round trips).
_STEP_RTOL = 1e-9


class UnchargedStepError(PrivacyViolationError):
    """A training step is not covered by the charged plan (more steps, less noise or a higher sample rate)."""


@dataclass
class PlannedSteps:
    """One charged DP-SGD schedule of a task: ``charged`` steps at (``noise_multiplier``, ``sample_rate``)."""

    noise_multiplier: float
    sample_rate: float
    charged: int
    recorded: int = 0

    def covers(self, noise_multiplier: float, sample_rate: float) -> bool:
        """True when a step at these settings is at most as revealing as a planned one.

        The step's dominating pair is (N(0, 1), (1 - q) N(0, 1) + q N(1/z, 1)). Its likelihood ratio
        is increasing in x for every q, so optimal tests are thresholds t and the trade-off curve is
        beta(t) = Phi(t) - q (Phi(t) - Phi(t - 1/z)) at alpha = 1 - Phi(t): pointwise non-increasing in q
        and non-decreasing in z. A step with more noise or a lower sample rate is therefore at least as
        private (in f-DP order, Dong, Roth & Su 2022), and composition preserves that order, so charging
        the planned step covers it.
        """
        return (
            noise_multiplier >= self.noise_multiplier * (1.0 - _STEP_RTOL)
            and sample_rate <= self.sample_rate * (1.0 + _STEP_RTOL)
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "noise_multiplier": self.noise_multiplier,
            "sample_rate": self.sample_rate,
            "charged_steps": self.charged,
            "recorded_steps": self.recorded,
        }


@dataclass(frozen=True)
class CertifiedRelease:
    """What :meth:`Certifier.release` wrote: the checkpoint, its certificate and the checkpoint's guarantee.

    ``private`` is False for a checkpoint that is not covered by the charged events: then ``guarantee``,
    ``epsilon`` and ``delta`` are None and ``reasons`` says why (as its certificate does).
    """

    task_index: int
    checkpoint: Path
    certificate: Path
    checkpoint_sha256: str
    private: bool
    guarantee: StreamGuarantee | None
    reasons: tuple[str, ...] = ()
    #: Public-key fingerprint of the Ed25519 key that signed the certificate (``sign_key``), else None.
    signed_by: str | None = None

    @property
    def epsilon(self) -> float | None:
        return None if self.guarantee is None else self.guarantee.epsilon

    @property
    def delta(self) -> float | None:
        return None if self.guarantee is None else self.guarantee.delta


@dataclass(frozen=True)
class CommittedRelease:
    """The hashes a ledger committed for one release (:meth:`Certifier.committed`), to finish it after a crash."""

    task_index: int
    checkpoint_sha256: str | None
    curator_sha256: str | None


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


class Certifier:
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
        if reuse_uncommitted and _uncommitted_charge(self.ledger, indices, event_list) is not None:
            return self.ledger.charges[-1]
        name = label or (f"{self.method} task {indices[0]}" if len(indices) == 1 else f"{self.method} tasks {indices}")
        return self.ledger.charge(indices, event_list, unit_ids=unit_ids, label=name)

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

    # -- scoped statements ---------------------------------------------------------------------------------
    def open_scoped(self, name: str, *, adjacency: "Adjacency | str", unit: str, must_exist: bool = False) -> TaskLedger:
        """The ledger of scoped statement ``name`` (``scoped/NAME.ledger.json``), opened once, resumed if present.

        A scoped statement covers something narrower than the checkpoint (e.g. PeCL's per-token release of
        its perturbed input embeddings); its events are composed across tasks like the headline's, with the
        Certifier's delta, accountant and composition, and its own ``adjacency`` and ``unit``. ``must_exist``:
        a release already stated it, so a missing file raises :class:`~dpcl.errors.LedgerCorruptError`.
        """
        if not isinstance(name, str) or not _SCOPE_NAME.fullmatch(name):
            raise InvalidParameterError(
                f"scoped statement name {name!r} must be letters, digits, '_', '.' or '-' (it names a ledger file)."
            )
        if name not in self._scoped:
            settings = {**self._scoped_settings, "adjacency": adjacency, "unit": unit,
                        "metadata": {**self._metadata, "scope_name": name}}
            self._scoped[name] = (
                TaskLedger(**settings) if self.run_dir is None
                else TaskLedger.open(self.scoped_dir / f"{name}.ledger.json", must_exist=must_exist, **settings)
            )
        return self._scoped[name]

    def charge_scoped(
        self,
        name: str,
        scope: str,
        task: "int | Sequence[int]",
        events: "PrivacyEvent | Sequence[PrivacyEvent]",
        *,
        unit_ids: Any = None,
        label: str = "",
        reuse_uncommitted: bool = False,
    ) -> Charge:
        """Charge the events of scoped statement ``name`` (what it covers: the sentence ``scope``) before training.

        The events state the statement's adjacency and unit (the first event's); otherwise as :meth:`charge`,
        ``reuse_uncommitted`` included. Every later certificate that names ``name`` (:meth:`certify`) states it
        in ``scoped_guarantees``, never in the headline.
        """
        if not isinstance(scope, str) or not scope.strip():
            raise InvalidParameterError("a scoped statement needs a scope sentence saying what it covers.")
        event_list = [events] if isinstance(events, PrivacyEvent) else list(events)
        if not event_list or not isinstance(event_list[0], PrivacyEvent):
            raise InvalidParameterError("events must be one or more PrivacyEvent objects.")
        ledger = self.open_scoped(name, adjacency=event_list[0].adjacency, unit=event_list[0].unit)
        indices, event_list = self._charge_arguments(task, event_list, ledger)
        self._scopes[name] = scope.strip()
        if reuse_uncommitted and _uncommitted_charge(ledger, indices, event_list) is not None:
            return ledger.charges[-1]
        name_label = label or f"{self.method} task {indices[0]} ({name})"
        return ledger.charge(indices, event_list, unit_ids=unit_ids, label=name_label)

    def scoped_statements(self) -> dict[str, tuple[str, TaskLedger]]:
        """Every scoped statement charged in this process: name -> (scope sentence, its ledger), in charge order."""
        return {name: (scope, self._scoped[name]) for name, scope in self._scopes.items()}

    def release_scoped(self, name: str, task: int, *, checkpoint_sha256: str | None = None) -> bool:
        """Record the release of ``task`` in scoped statement ``name``'s ledger; False if it is recorded already.

        Idempotent (a driver finishing a release after a crash calls it again): the release is recorded
        unless the ledger's last release is of ``task`` and covers every charge.
        """
        t = _task_index(task, self.n_tasks)
        if name not in self._scoped:
            raise InvalidParameterError(f"scoped statement {name!r} was never charged or opened; charge it first.")
        ledger = self._scoped[name]
        last = ledger.releases[-1] if ledger.releases else None
        if last is not None and last.task_index == t and last.n_charges == len(ledger.charges):
            return False
        ledger.release(t, checkpoint_sha256=checkpoint_sha256)
        return True

    def require_released(self, tasks: Iterable[int], *, scoped: str | None = None, adjacency: Any = None,
                         unit: str | None = None, listed_by: str = "the run state") -> None:
        """Raise :class:`~dpcl.errors.LedgerCorruptError` unless the ledger records a release of every task in ``tasks``.

        A driver resuming from its own run state calls it for the releases that state lists: a ledger older
        than the run (or from another run) would forget budget already spent. ``scoped`` checks that
        statement's ledger instead (opened with ``adjacency`` and ``unit``; it must exist).
        """
        needed = sorted({int(t) for t in tasks})
        if not needed:
            return
        if scoped is None:
            ledger, path = self.ledger, self.ledger_path
        else:
            ledger = self.open_scoped(scoped, adjacency=adjacency, unit=str(unit), must_exist=True)
            path = self.scoped_dir / f"{scoped}.ledger.json"
        missing = sorted(set(needed) - set(ledger.released_tasks()))
        if missing:
            raise LedgerCorruptError(
                f"{str(path)!r} has no record of the release(s) of task(s) {', '.join(str(t + 1) for t in missing)} "
                f"that {listed_by} lists: it is older than the run (or from another run), so resuming would forget "
                "budget already spent. Restore the run's own ledger, or start the run over in a new directory."
            )

    def plan_dpsgd(
        self,
        task: int,
        *,
        noise_multiplier: float,
        sample_rate: float,
        steps: int,
        unit_ids: Any = None,
    ) -> Charge:
        """Charge a DP-SGD schedule (``steps`` Poisson-subsampled Gaussian steps) to ``task`` before training.

        The steps then taken are checked against it by :meth:`record_dpsgd_steps`.
        """
        t = _task_index(task, self.n_tasks)
        z = check_positive_scalar("noise_multiplier", noise_multiplier)
        q = check_sample_rate("sample_rate", sample_rate)
        n = check_count("steps", steps)
        step = PoissonSampledGaussianEvent(
            noise_multiplier=z, sample_rate=q, adjacency=self.ledger.adjacency, unit=self.ledger.unit
        )
        charge = self.charge(t, RepeatedEvent(step, n), unit_ids=unit_ids,
                             label=f"{self.method} task {t}: DP-SGD plan, {n} steps")
        self._plans.setdefault(t, []).append(PlannedSteps(noise_multiplier=z, sample_rate=q, charged=n))
        return charge

    def record_dpsgd_steps(self, task: int, *, noise_multiplier: float, sample_rate: float, count: int = 1) -> None:
        """Record ``count`` DP-SGD steps of ``task`` taken at (``noise_multiplier``, ``sample_rate``).

        Call it before the steps' updates are applied. Every step must take a free slot of a plan charged
        with :meth:`plan_dpsgd` whose step it is dominated by (at least as much noise, at most the planned
        sample rate); otherwise :class:`UnchargedStepError` is raised and nothing is recorded. Matching each
        step to a distinct charged step that dominates it is sound: adaptive composition of dominated
        mechanisms is dominated by the composition of the dominating ones, whatever their order.
        """
        t = _task_index(task, self.n_tasks)
        z = check_positive_scalar("noise_multiplier", noise_multiplier)
        q = check_sample_rate("sample_rate", sample_rate)
        n = check_count("count", count)
        plans = self._plans.get(t, [])
        if not plans:
            raise UnchargedStepError(
                f"task {t} takes a DP-SGD step (noise multiplier {z:g}, sample rate {q:g}) but no schedule was "
                "charged for it in this process: call plan_dpsgd (or attach the opacus accountant with its "
                "epochs or steps) before training, so that the ledger holds the budget before it is spent."
            )
        remaining, take = n, []
        for i, plan in enumerate(plans):
            free = plan.charged - plan.recorded
            if free <= 0 or not plan.covers(z, q):
                continue
            used = min(free, remaining)
            take.append((i, used))
            remaining -= used
            if remaining == 0:
                break
        if remaining:
            charged = sum(p.charged for p in plans)
            recorded = sum(p.recorded for p in plans)
            raise UnchargedStepError(
                f"task {t}: {n} DP-SGD step(s) at noise multiplier {z:g} and sample rate {q:g} exceed the charged "
                f"schedule ({recorded} of {charged} charged steps recorded; plans: "
                + ", ".join(f"{p.charged} steps at z={p.noise_multiplier:g}, q={p.sample_rate:g}" for p in plans)
                + "). The step is refused before its update; charge more steps with plan_dpsgd first."
            )
        for i, used in take:
            plans[i].recorded += used

    def planned_steps(self, task: int) -> tuple[PlannedSteps, ...]:
        """The DP-SGD plans charged for ``task`` in this process, with the steps recorded against them."""
        return tuple(self._plans.get(_task_index(task, self.n_tasks), ()))

    # -- noise ------------------------------------------------------------------------------------------
    def _noise_seed(self, t: int, reproducible_seed: Any) -> int:
        """A fresh 64-bit seed from OS entropy (or ``reproducible_seed``), recorded as task ``t``'s noise source."""
        check_reproducible_seed(reproducible_seed)
        if reproducible_seed is None:
            seed, source = secrets.randbits(64), NOISE_OS_ENTROPY
        else:
            seed, source = int(reproducible_seed), NOISE_REPRODUCIBLE
        sources = self._state().setdefault("noise_sources", {})
        if sources.get(str(t)) not in (None, source):  # one task, two sources: the weaker one is stated
            source = NOISE_REPRODUCIBLE
        sources[str(t)] = source
        if self.private:
            self.ledger.save()
        return seed

    def noise_generator(self, task: int, *, device: Any = "cpu", reproducible_seed: int | None = None) -> Any:
        """A ``torch.Generator`` on ``device`` for the DP noise (and sampling) of ``task``, seeded from OS entropy.

        Independent of ``torch.manual_seed``: draw the noise with it (``torch.normal(..., generator=g)``; opacus:
        :func:`dpcl.integrations.opacus.attach` installs one) and the certificates of ``task`` and later
        releases state that dpcl seeded its noise from OS entropy. ``reproducible_seed`` (research only) seeds it
        with that seed instead, and the certificates say that the guarantee holds only against someone who does
        not know the seed. Imports torch.
        """
        t = _task_index(task, self.n_tasks)
        import torch

        try:
            generator = torch.Generator(device=device)
        except (RuntimeError, TypeError) as exc:
            raise InvalidParameterError(f"device {device!r} cannot hold a torch.Generator ({exc}).") from None
        generator.manual_seed(self._noise_seed(t, reproducible_seed))
        return generator

    def numpy_noise_generator(self, task: int, *, reproducible_seed: int | None = None) -> np.random.Generator:
        """A numpy ``Generator`` for the DP noise of ``task``, seeded from OS entropy (see :meth:`noise_generator`)."""
        t = _task_index(task, self.n_tasks)
        return np.random.default_rng(self._noise_seed(t, reproducible_seed))

    def noise_sources(self) -> dict[int, str]:
        """The noise source dpcl recorded for each task (``"os_entropy"`` or ``"reproducible_seed"``)."""
        return {int(t): str(v) for t, v in self._state().get("noise_sources", {}).items()}

    def _noise_assumptions(self, charged_tasks: Iterable[int]) -> list[str]:
        """What the certificate states of the noise of ``charged_tasks``: from dpcl's record, not from the caller."""
        sources = self.noise_sources()
        groups: dict[str | None, list[int]] = {}
        for t in sorted(set(charged_tasks)):
            groups.setdefault(sources.get(t), []).append(t)

        def names(tasks: list[int]) -> str:
            return ("task " if len(tasks) == 1 else "tasks ") + ", ".join(str(t + 1) for t in tasks)

        out = []
        if NOISE_OS_ENTROPY in groups:
            out.append(
                f"The DP noise (and, with opacus, the Poisson sampling) of {names(groups[NOISE_OS_ENTROPY])} was drawn "
                "from generators dpcl seeded from OS entropy for that task, independent of torch.manual_seed and of "
                "every other seed of the training process."
            )
        if NOISE_REPRODUCIBLE in groups:
            out.append(
                f"The DP noise of {names(groups[NOISE_REPRODUCIBLE])} was drawn from generators seeded with a seed the "
                "caller chose (reproducible_seed): the guarantee holds only against someone who does not know that "
                "seed."
            )
        if None in groups and len(groups) > 1:
            out.append(
                f"dpcl did not draw the noise of {names(groups[None])}: where it came from is stated by the caller's "
                "assumptions."
            )
        return out

    # -- guarantees -----------------------------------------------------------------------------------
    def guarantee(self) -> StreamGuarantee:
        """Cumulative guarantee of everything charged so far (what the next release will state)."""
        return self.ledger.guarantee()

    def task_epsilon(self, task: int) -> float:
        """Epsilon of the events charged to ``task``'s data alone."""
        return self.ledger.task_guarantee(_task_index(task, self.n_tasks))

    # -- release -------------------------------------------------------------------------------------
    def _checkpoint_file(self, t: int, checkpoint: Any, filename: str | None) -> Path:
        if isinstance(checkpoint, (bytes, bytearray, memoryview)):
            name = filename or f"task{t + 1:03d}.ckpt"
            if not _FILENAME.match(name):
                raise InvalidParameterError(
                    f"filename must be a plain file name (letters, digits, '.', '_', '-'), got {name!r}."
                )
            target = self.checkpoints_dir / name
            if target.exists():
                raise InvalidParameterError(
                    f"checkpoint {str(target)!r} already exists; a released checkpoint is never overwritten "
                    "(its certificate names its SHA-256). Give another filename."
                )
            return write_bytes_atomic(target, bytes(checkpoint))
        if filename is not None:
            raise InvalidParameterError("filename is only used when the checkpoint is given as bytes.")
        if not isinstance(checkpoint, (str, os.PathLike)):
            raise InvalidParameterError(
                f"checkpoint must be a file path or bytes, got {type(checkpoint).__name__}."
            )
        path = Path(checkpoint)
        if not path.is_file():
            raise InvalidParameterError(f"checkpoint {str(path)!r} does not exist or is not a file.")
        run_dir = self.run_dir.resolve()
        if path.is_symlink() or run_dir not in path.resolve().parents:
            # a certificate names its checkpoint inside its run directory, never through a symlink
            # (dpcl._io.safe_paths): a file from elsewhere is released as a copy under checkpoints/
            name = path.name if _FILENAME.match(path.name) else f"task{t + 1:03d}.ckpt"
            return self._checkpoint_file(t, path.read_bytes(), name)
        resolved = path.resolve()
        private = [self.curator_dir.resolve(), self.ledger_path.resolve()]
        if any(resolved == p or p in resolved.parents for p in private):
            raise InvalidParameterError(
                f"checkpoint {str(path)!r} lies in the curator part of the run directory (ledger.json, curator/), "
                "which must not be published; save the released checkpoint elsewhere (e.g. under checkpoints/)."
            )
        return path

    def _certificate_path(self, t: int, replace: bool = False) -> Path:
        base = f"task{t + 1:03d}"
        path = self.certificates_dir / f"{base}.cert.json"
        k = 2
        while path.exists() and not replace:
            path = self.certificates_dir / f"{base}.r{k}.cert.json"
            k += 1
        return path

    def _config(self) -> dict[str, Any]:
        """The certificate's config section (:meth:`PrivacySettings.to_dict`), so ``dpcl verify`` checks it too."""
        return self.settings.to_dict(method=self.method)

    def _check_release(self, t: int, coverage: Any, assumptions: Iterable[str], *, charged: bool = True) -> list[str]:
        """The assumption sentences of a release of ``t``; refuses what :meth:`release` documents."""
        self._refuse_dry_run("release a checkpoint or write a certificate")
        if not isinstance(coverage, ReleaseCoverage):
            raise InvalidParameterError(
                "coverage must be a ReleaseCoverage saying whether the checkpoint is covered by the charged events, "
                "e.g. ReleaseCoverage.post_processing('weights updated only by the charged DP-SGD steps')."
            )
        if coverage.covered and not self.private:
            raise InvalidParameterError(
                "this Certifier was opened with private=False: its checkpoints are not covered by any charged "
                "release; give ReleaseCoverage.not_covered(reasons...)."
            )
        if isinstance(assumptions, str):
            raise InvalidParameterError("assumptions must be a list of sentences, not one string.")
        sentences = [str(a).strip() for a in assumptions if str(a).strip()]
        if not sentences:
            raise InvalidParameterError(
                "state at least one assumption sentence (e.g. how the noise was drawn, what data is public)."
            )
        if charged and self.private and not any(t in c.tasks for c in self.ledger.charges):
            raise PrivacyViolationError(
                f"task {t} has no charged event: charge what your loop did with its data (charge, plan_dpsgd) "
                "before releasing it."
            )
        for plan in self._plans.get(t, ()):
            if plan.recorded > plan.charged:  # record_dpsgd_steps refuses this; a guard against edited state
                raise UnchargedStepError(
                    f"task {t}: {plan.recorded} DP-SGD steps recorded but {plan.charged} charged; not released."
                )
        return sentences

    def _extra_fields(self, t: int, extra: Mapping[str, Any] | None) -> dict[str, Any]:
        extra_fields: dict[str, Any] = {"certifier": {}}
        plans = self._plans.get(t, ())
        if plans:
            extra_fields["certifier"]["dpsgd_plans"] = [p.to_dict() for p in plans]
            recorded = sum(p.recorded for p in plans)
            charged = sum(p.charged for p in plans)
            extra_fields["certifier"]["dpsgd_steps"] = {"recorded": recorded, "charged": charged}
        if self.task_sizes is not None:
            extra_fields["certifier"]["task_sizes"] = self.task_sizes
        sources = self._state().get("noise_sources")
        if sources:
            extra_fields["certifier"]["noise_sources"] = {str(int(k) + 1): v for k, v in sorted(
                sources.items(), key=lambda kv: int(kv[0]))}
        extra_fields.update(dict(extra or {}))
        try:  # checked before the release is recorded, so a bad extra never leaves a release without certificate
            json.dumps(extra_fields, allow_nan=False)
        except (TypeError, ValueError) as exc:
            raise InvalidParameterError(f"extra must hold plain JSON values (finite numbers, strings...): {exc}.") from None
        return extra_fields

    def release(
        self,
        task: int,
        checkpoint: "str | os.PathLike[str] | bytes",
        *,
        coverage: ReleaseCoverage,
        assumptions: Iterable[str],
        filename: str | None = None,
        extra: Mapping[str, Any] | None = None,
    ) -> CertifiedRelease:
        """Release the checkpoint trained up to ``task`` and write its verified certificate.

        ``checkpoint`` is a file, or bytes written atomically to ``checkpoints/<filename>`` (default
        ``taskNNN.ckpt``). A file outside the run directory (or reached through a symlink) is released as
        a copy under ``checkpoints/`` with its own name: a certificate only names files inside its run
        directory. ``coverage`` states whether the checkpoint is a post-processing of the charged
        events (:meth:`ReleaseCoverage.post_processing` with its basis); ``assumptions`` are your plain
        sentences (at least one: how the noise was drawn, what is public...). A covered checkpoint gets a
        certificate whose headline (``guarantee.private: true``) is the cumulative guarantee of every
        charge so far; one that is not covered (:meth:`ReleaseCoverage.not_covered` with every reason) gets
        a certificate that says ``private: false`` with those reasons and states no epsilon. Refused before
        anything is recorded: a task never charged, DP-SGD steps recorded beyond their charge.

        It is :meth:`commit` (the ledger's release record) followed by :meth:`certify`, with every scoped
        statement charged in this process released and stated for ``task``.
        """
        t = _task_index(task, self.n_tasks)
        sentences = self._check_release(t, coverage, assumptions)
        self._extra_fields(t, extra)
        ckpt = self._checkpoint_file(t, checkpoint, filename)
        digest = sha256_file(ckpt)
        self.commit(t, checkpoint_sha256=digest)
        for name in self._scopes:
            self.release_scoped(name, t, checkpoint_sha256=digest)
        return self.certify(t, ckpt, coverage=coverage, assumptions=sentences, extra=extra, scoped=dict(self._scopes))

    def commit(self, task: int, *, checkpoint_sha256: str | None, curator_sha256: str | None = None,
               empty_task: bool = False) -> ReleaseRecord | None:
        """Record the release of ``task``'s checkpoint (by its SHA-256) in the ledger: the release's commit point.

        For crash-safe drivers that write the checkpoint under a temporary name first: once this returns,
        the release happened (the ledger states it with its cumulative guarantee), whatever crashes before
        its certificate is written; :meth:`committed` gives the recorded hashes back to finish it.
        ``curator_sha256`` is the hash of private state kept with the release (recorded in the ledger, never
        in a certificate). Returns the ledger's record; None for a non-private Certifier, which keeps no
        headline ledger (its driver's own run state is then the commit point).

        A task with no charged event is refused (:class:`~dpcl.errors.PrivacyViolationError`) unless
        ``empty_task``: its data is empty after the label filter and the released checkpoint does not depend
        on it (the previous release, or a data-independent one: Tobaben et al., Prop. F.1), so the charges
        so far cover it. Nothing may have been charged at all only if nothing was released.

        A dry run (:meth:`dry_run`) commits without a checkpoint (``checkpoint_sha256=None``).
        """
        t = _task_index(task, self.n_tasks)
        if checkpoint_sha256 is None and self.is_dry_run:
            pass
        elif not isinstance(checkpoint_sha256, str) or not re.fullmatch(r"[0-9a-f]{64}", checkpoint_sha256):
            raise InvalidParameterError(f"checkpoint_sha256 must be 64 lowercase hex digits, got {checkpoint_sha256!r}.")
        if not self.private:
            return None
        if not isinstance(empty_task, bool):
            raise InvalidParameterError(f"empty_task must be True or False, got {empty_task!r}.")
        if not (empty_task and self.ledger.charges) and not any(t in c.tasks for c in reversed(self.ledger.charges)):
            raise PrivacyViolationError(f"task {t} has no charged event: charge it before committing its release.")
        if curator_sha256 is not None:
            self.ledger.metadata.setdefault("curator_sha256", {})[str(t)] = str(curator_sha256)
        return self.ledger.release(t, checkpoint_sha256=checkpoint_sha256)

    def compact_ledgers(self) -> None:
        """Fold the journals of the headline and scoped ledgers into their files (one atomic rewrite each,
        :meth:`~dpcl.guarantees.ledger.TaskLedger.compact`), so that each ledger file holds everything on its own;
        ``dpcl run`` calls it when it stops. Loading a ledger reads its journal anyway."""
        for ledger in (self.ledger, *self._scoped.values()):
            ledger.compact()

    def committed_tasks(self) -> list[int]:
        """Tasks whose release the ledger committed, in order (each once); empty for a non-private Certifier."""
        return list(dict.fromkeys(self.ledger.released_tasks())) if self.private else []

    def committed(self, task: int) -> CommittedRelease:
        """The hashes the ledger committed for the (latest) release of ``task``."""
        t = _task_index(task, self.n_tasks)
        records = [r for r in self.ledger.releases if r.task_index == t] if self.private else []
        if not records:
            raise InvalidParameterError(f"the ledger records no release of task {t}.")
        curator = self.ledger.metadata.get("curator_sha256", {}).get(str(t))
        return CommittedRelease(task_index=t, checkpoint_sha256=records[-1].checkpoint_sha256,
                                curator_sha256=None if curator is None else str(curator))

    def certify(
        self,
        task: int,
        checkpoint: "str | os.PathLike[str]",
        *,
        coverage: ReleaseCoverage,
        assumptions: Iterable[str],
        scoped: Mapping[str, str] | None = None,
        label_filtering: Sequence[FilterReport] | None = None,
        extra: Mapping[str, Any] | None = None,
        standard_assumptions: bool = True,
        replace: bool = False,
    ) -> CertifiedRelease:
        """Write, verify (and sign) the certificate of ``task``'s committed release of ``checkpoint``.

        Private: the release :meth:`commit` recorded (its headline is that record's guarantee, its checkpoint
        hash the committed one). Non-private (``private=False``): ``coverage`` must be not covered and the
        certificate says ``private: false`` with its reasons. ``scoped`` maps the name of each scoped
        statement to state to its scope sentence (each ledger must record a release of ``task``:
        :meth:`release_scoped`). ``label_filtering``: the public filter counts to state (default: those
        :meth:`filter_labels` recorded). ``standard_assumptions=False`` states ``assumptions`` (plus the noise source and
        adaptivity the Certifier knows), for a driver whose sentences already say what the Certifier would add
        (label space, composition, counts, curator-side files). ``replace`` writes ``certificates/taskNNN.cert.json`` even if it exists (a
        driver finishing a release after a crash); otherwise a new name is chosen.
        """
        t = _task_index(task, self.n_tasks)
        sentences = self._check_release(t, coverage, assumptions, charged=False)  # commit checked the charge
        extra_fields = self._extra_fields(t, extra)
        path = Path(checkpoint)
        if not path.is_file():
            raise InvalidParameterError(f"checkpoint {str(path)!r} does not exist or is not a file.")
        reports = self._filter_reports() if label_filtering is None else list(label_filtering)
        index = None
        if self.private:
            index = max((i for i, r in enumerate(self.ledger.releases) if r.task_index == t), default=None)
            if index is None:
                raise InvalidParameterError(f"the release of task {t} was not committed; call commit first.")
        charged = [] if index is None else [
            task for c in self.ledger.charges[: self.ledger.releases[index].n_charges] for task in c.tasks
        ]
        noise = [s for s in self._noise_assumptions(charged) if s not in sentences]
        if standard_assumptions:
            all_assumptions = self._assumptions([*noise, *sentences], reports)
        else:  # the driver's sentences; what dpcl itself knows (noise source, adaptivity) is added
            all_assumptions = [*sentences, *noise, *(a for a in self._adaptivity_assumption() if a not in sentences)]
        statements = {}
        for name, scope in (scoped or {}).items():
            if name not in self._scoped:
                raise InvalidParameterError(f"scoped statement {name!r} was never charged; charge_scoped it first.")
            statements[name] = ScopedLedger(scope, self._scoped[name])
        common: dict[str, Any] = dict(
            method=self.method, label_space=self.label_space.value, assumptions=all_assumptions, scoped=statements,
            checkpoint=path, config=self._config(), label_filtering=describe_filtering(reports), extra=extra_fields,
        )
        record = None
        if index is not None:
            record = self.ledger.releases[index]
            if record.checkpoint_sha256 is not None and sha256_file(path) != record.checkpoint_sha256:
                raise InvalidParameterError(
                    f"checkpoint {str(path)!r} does not hash to the SHA-256 committed for task {t}'s release."
                )
            certificate = certificate_from_ledger(self.ledger, release=coverage, release_index=index, **common)
        else:
            certificate = non_private_certificate(release_task=t, reasons=coverage.reasons, **common)
        written = write_certificate(self._certificate_path(t, replace), certificate)
        verify_certificate(written).raise_if_invalid()
        signed_by = None
        if self._sign_key is not None:
            signed_by = sign_certificate(written, self._sign_key, verify=False)  # verified just above
        listed = self._state().setdefault("certificates", [])
        relative = written.relative_to(self.run_dir).as_posix()
        if relative not in listed:
            listed.append(relative)
        if self.private:
            self.ledger.save()
        return CertifiedRelease(
            task_index=t, checkpoint=path, certificate=written, checkpoint_sha256=sha256_file(path),
            private=coverage.covered, guarantee=record.guarantee if coverage.covered and record else None,
            reasons=coverage.reasons, signed_by=signed_by,
        )

    def _assumptions(self, sentences: Sequence[str], reports: Sequence[FilterReport]) -> list[str]:
        all_assumptions = [label_space_assumption(self.label_space)]
        all_assumptions.append(DISJOINT_ASSUMPTION if self.across_tasks == "parallel" else SHARED_ASSUMPTION)
        all_assumptions += self._adaptivity_assumption()
        if self.task_sizes is not None or reports:
            all_assumptions.append(COUNTS_ASSUMPTION)
        all_assumptions += [s for s in sentences if s not in all_assumptions]
        all_assumptions.append(CURATOR_ASSUMPTION)
        return all_assumptions

    def _adaptivity_assumption(self) -> list[str]:
        """Whether the charges' parameters had to be fixed in advance (no filter) or may be adaptive (a filter)."""
        if not self.private:
            return []
        ledger = self.ledger
        return [FIXED_PARAMETERS_ASSUMPTION if ledger.total_epsilon is None
                else adaptive_filter_assumption(ledger.total_epsilon, ledger.total_delta, self.across_tasks)]

    @property
    def certificates(self) -> list[Path]:
        """Every certificate written in this run directory, oldest first."""
        return [self.run_dir / p for p in self._state().get("certificates", [])]

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
