"""``DIR/run.json``: the resume point of a ``dpcl run`` (which releases it finished, with which config and seed).

Curator-side like the ledger: written atomically after every finished release. For a private run the
ledger's release record is the commit point of a release and ``run.json`` follows it; for a non-private
run (no headline ledger) ``run.json`` is the commit point. :func:`read_run_state` refuses a state that is
damaged, of another format or version, or of another run (config file content, seed, private,
method, noise source).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Mapping

from dpcl.errors import ConfigError
from dpcl._io.atomic_io import read_json, write_json_atomic

RUN_STATE_FORMAT = "dpcl-run"
RUN_STATE_VERSION = 2  # 2: releases record their curator state (checkpoints of version 1 held it)


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
        return {**asdict(self), "accuracies": list(self.accuracies)}

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
class RunIdentity:
    """What a resumed run must share with the run that wrote ``run.json``."""

    config_sha256: str
    config_path: str
    seed: int
    reproducible_noise: bool
    private: bool
    method: str
    n_tasks: int

    def mismatches(self, state: Mapping[str, Any]) -> list[str]:
        return [
            name
            for name, mine, recorded in (
                ("config", self.config_sha256, state.get("config_sha256")),
                ("seed", self.seed, state.get("seed")),
                ("private", self.private, state.get("private")),
                ("method", self.method, state.get("method")),
                ("noise source (reproducible_noise)", self.reproducible_noise, state.get("reproducible_noise", False)),
            )
            if recorded != mine
        ]


def read_run_state(state_path: Path, identity: RunIdentity, out: Path) -> list[ReleaseSummary]:
    """The releases ``run.json`` lists (none when it does not exist), after checking it belongs to this run."""
    if not state_path.exists():
        return []
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
    mismatch = identity.mismatches(state)
    if mismatch:
        raise ConfigError(
            f"--out {str(out)!r} holds a run with a different {', '.join(mismatch)}; resume it with the same "
            "config file, --seed and --reproducible-noise setting, or use a new --out directory."
        )
    try:
        return [ReleaseSummary.from_dict(r) for r in state["releases"]]
    except (KeyError, TypeError, ValueError) as exc:
        raise ConfigError(f"{state_path} is damaged ({exc!r}); move the run directory away to start over.") from None


def write_run_state(state_path: Path, identity: RunIdentity, releases: "list[ReleaseSummary]",
                    stage_seconds: Mapping[str, float]) -> None:
    """Write ``run.json`` atomically (the releases finished so far and this process's seconds per stage)."""
    write_json_atomic(
        state_path,
        {
            "format": RUN_STATE_FORMAT,
            "version": RUN_STATE_VERSION,
            "config_sha256": identity.config_sha256,
            "config_path": identity.config_path,
            "seed": identity.seed,
            "reproducible_noise": identity.reproducible_noise,
            "private": identity.private,
            "method": identity.method,
            "n_tasks": identity.n_tasks,
            "releases": [r.to_dict() for r in releases],
            "stage_seconds": {k: round(float(v), 6) for k, v in stage_seconds.items()},
        },
    )
