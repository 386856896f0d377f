"""What a run is made of between its stages: the loaded run, its prepared stream, the run in progress
(directory, Certifier, method, releases so far), the stage clock, the result and the hooks a caller adds."""

from __future__ import annotations

import hashlib
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator, Mapping

from dpcl.runner.run_state import ReleaseSummary, RunIdentity, write_run_state
from dpcl.runner.tasks import PreparedTask, release_data, task_plan, trains_plan

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


class RunHooks:
    """What a caller adds to :func:`~dpcl.runner.run.run_training` instead of a pipeline of its own (the in-stream
    canary audit of ``dpcl audit-run``, :mod:`dpcl.runner.canary_run`). The defaults change nothing."""

    def loaded(self, loaded: LoadedRun) -> None:
        """After stage ``load``: refuse (a typed error) a run this caller cannot use, before the stream is built."""

    def stream(self, loaded: LoadedRun, prepared: PreparedStream) -> PreparedStream:
        """Stage ``stream``: the stream as trained; it is audited, planned, charged and certified as returned."""
        return prepared

    def after_task(self, run: RunInProgress, t: int) -> None:
        """After release ``t`` is certified and evaluated (before a ``stop_after_task`` stop)."""
