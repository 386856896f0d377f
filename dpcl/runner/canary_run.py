"""A certified run with canaries mixed into its stream, audited in one run from the released models (black box).

``dpcl audit-run CONFIG.toml --out DIR --in-stream`` (Steinke, Nasr &
Jagielski 2023, "Privacy Auditing with One (1) Training Run", Alg. 1 with
input-space canaries and the black-box score of their Sec. 6):

* for every task, ``m`` canaries: inputs drawn uniformly from the box the
  task's own features span (per coordinate, between their minimum and
  maximum) with a label drawn uniformly from the task's public label set, so
  the label filter keeps them; each is included in the task's training data
  independently with probability 1/2. Features, labels and inclusion bits come
  from the operating system's entropy (:mod:`secrets`), never from the run's
  seed, so the guesses cannot be made from public randomness;
* the included canaries are examples like any other: new unit ids, counted in
  the task's size, so the run's plans (noise calibrated to the sizes it
  trains on), charges, ledgers and certificates are those of the stream that
  was actually trained, and every certificate stays true. The run is
  ``dpcl run`` itself (:func:`~dpcl.runner.run.run_training` with hooks);
* after each release, every canary of that task (included or not) is scored by
  the released model: the margin of its label's score over the best other
  released label (:meth:`~dpcl.methods.base.ContinualMethod.scores`), which is
  all a black-box auditor with the checkpoint can compute. The guessing game
  and Steinke et al.'s analysis (:func:`dpcl.audit.one_run.audit_one_run`)
  give a lower bound on epsilon per task, beside release ``t``'s certified
  epsilon (which covers each of its units, canaries included); the confidence
  is split over the tasks (Bonferroni). A bound above the certified epsilon
  means the implementation is not what was certified.

Steinke et al.'s theorem is about adding or removing one canary, so only
add/remove configs are audited; a replace-one certificate says nothing about
adding an example, and is refused. Methods that train on raw text (PeCL) are
refused too: their canaries would be texts, which this module does not make.
The checkpoints of a canary run hold canaries: the run is an audit, not a
model to deploy, and the report says so.
"""

from __future__ import annotations

import dataclasses
import secrets
from pathlib import Path
from typing import Any

import numpy as np

from dpcl.audit.one_run import audit_one_run
from dpcl.errors import ConfigError, InvalidParameterError
from dpcl.runner.run import RunHooks, run_training

__all__ = ["CanarySet", "add_canaries", "run_with_canaries"]

#: What a canary run's report says about its release.
CANARY_RUN_RELEASE = (
    "an audit run: its certificates are true for the stream it trained (canaries included, each a unit), but its "
    "checkpoints hold canaries and are not a model to deploy"
)


@dataclasses.dataclass(frozen=True)
class CanarySet:
    """One task's canaries: every one, included or not, with its inclusion bit."""

    task: int
    features: np.ndarray
    labels: np.ndarray
    included: np.ndarray
    unit_ids: np.ndarray


def _os_rng() -> np.random.Generator:
    """A generator seeded from the operating system's entropy (independent of the run's seed)."""
    return np.random.default_rng(secrets.randbits(128))


def _unit_id_base(tasks: list[Any]) -> int:
    ids = np.concatenate([np.asarray(t.unit_ids) for t in tasks])
    if ids.size and not np.issubdtype(ids.dtype, np.integer):
        raise ConfigError("the stream's unit ids are not integers; canaries need integer ids beside them.")
    return int(ids.max()) + 1 if ids.size else 0


def add_canaries(tasks: list[Any], canaries: int, rng: np.random.Generator | None = None) -> tuple[list[Any], list[CanarySet]]:
    """``tasks`` (:class:`~dpcl.runner.tasks.PreparedTask`) with each task's included canaries appended, and the canaries.

    ``rng`` defaults to one seeded from the operating system's entropy; tests pass their own.
    """
    gen = rng if rng is not None else _os_rng()
    next_id = _unit_id_base(tasks)
    out_tasks, sets = [], []
    for task in tasks:
        x = np.asarray(task.features, dtype=np.float32)
        if x.ndim != 2 or x.shape[1] == 0:
            raise ConfigError(
                f"task {task.index} has no feature vectors (a raw-text method); --in-stream makes input canaries "
                "in feature space only."
            )
        if x.shape[0] == 0:
            raise ConfigError(f"task {task.index} has no training examples after label filtering; nothing to audit.")
        low, high = x.min(axis=0), x.max(axis=0)
        features = (low + (high - low) * gen.random((canaries, x.shape[1]))).astype(np.float32)
        labels = gen.choice(np.asarray(task.output_labels, dtype=np.int64), size=canaries)
        included = gen.random(canaries) < 0.5
        ids = np.arange(next_id, next_id + canaries, dtype=np.asarray(task.unit_ids).dtype)
        next_id += canaries
        sets.append(CanarySet(task.index, features, labels, included, ids))
        out_tasks.append(dataclasses.replace(
            task,
            features=np.concatenate([x, features[included]]),
            labels=np.concatenate([np.asarray(task.labels, dtype=np.int64), labels[included]]),
            unit_ids=np.concatenate([np.asarray(task.unit_ids), ids[included]]),
            texts=None if task.texts is None else np.concatenate([task.texts, np.full(int(included.sum()), "", dtype=object)]),
        ))
    return out_tasks, sets


def canary_margins(method: Any, canaries: CanarySet) -> np.ndarray:
    """Black-box score of each canary: its label's score minus the best other released label's score.

    A released model that scores a canary's own label or a released label with NaN or an infinity is refused
    (:class:`~dpcl.errors.InvalidParameterError`): such a score cannot be ranked, and replacing it by a number
    would make the audit's guesses up."""
    scores = np.asarray(method.scores(canaries.features), dtype=np.float64)
    seen = np.asarray(method.seen_labels, dtype=bool)
    columns = method.label_positions(canaries.labels)
    rows = np.arange(scores.shape[0])
    own = scores[rows, columns]
    finite = np.isfinite(own) & np.isfinite(np.where(seen[None, :], scores, 0.0)).all(axis=1)
    if not finite.all():
        first = int(np.argmin(finite))
        raise InvalidParameterError(
            f"the released model of task {canaries.task + 1} gives canary {first} a non-finite score (NaN or "
            f"infinite) on {int((~finite).sum())} of {finite.size} canaries: training diverged, so no black-box "
            "margin exists. Lower the learning rate in [method] (or train fewer steps), then audit again."
        )
    others = np.where(seen[None, :], scores, -np.inf)
    others[rows, columns] = -np.inf
    best_other = others.max(axis=1)
    return own - np.where(np.isfinite(best_other), best_other, 0.0)


class _CanaryHooks(RunHooks):
    """The canary run as hooks of :func:`~dpcl.runner.run.run_training`: checks, canaries added to the stream,
    every release scored black box and audited."""

    def __init__(self, canaries: int, confidence: float, progress: Any, before: Any) -> None:
        self.canaries, self.confidence, self.progress, self.before = canaries, confidence, progress, before
        self.sets: list[CanarySet] = []
        self.tasks: list[Any] = []
        self.results: list[dict[str, Any]] = []
        self.delta = 0.0

    def loaded(self, loaded: Any) -> None:
        if not loaded.private:
            raise ConfigError(
                "the config trains without privacy ([privacy] private = false): there is no certified epsilon to audit."
            )
        adjacency = loaded.config.settings.adjacency
        if adjacency != "add_remove":
            raise ConfigError(
                f"--in-stream audits add/remove guarantees (a canary is added or not), but [privacy] adjacency = "
                f"{adjacency!r}; a replace-one certificate says nothing about adding an example. Audit an add_remove "
                "config."
            )
        if getattr(loaded.method_class, "needs_texts", False):
            raise ConfigError(
                f"method {loaded.method_name!r} trains on raw text; --in-stream makes feature-space canaries only."
            )
        self.delta = float(loaded.config.settings.delta)

    def stream(self, loaded: Any, prepared: Any) -> Any:
        if self.before is not None:
            self.before(loaded, prepared)
        self.tasks, self.sets = add_canaries(prepared.tasks, self.canaries)
        return dataclasses.replace(prepared, tasks=self.tasks)

    def after_task(self, run: Any, t: int) -> None:
        margins = canary_margins(run.method, self.sets[t])
        per_task_confidence = 1.0 - (1.0 - self.confidence) / len(self.sets)
        bound = audit_one_run(margins, self.sets[t].included, self.delta, confidence=per_task_confidence)
        certified = float(run.releases[-1].cumulative_epsilon)
        self.results.append({
            "task": t, "certified_epsilon": certified, "canaries": self.canaries,
            "black_box": bound.to_dict(), "empirical_epsilon_lower": bound.epsilon_lower,
            "flagged": bound.epsilon_lower > certified, "examples": int(len(self.tasks[t].labels)),
        })
        if self.progress is not None:
            self.progress(t)


def run_with_canaries(config_path: "str | Path", out_dir: "str | Path", *, canaries: int, confidence: float,
                      seed: int = 0, device: str | None = None, quiet: bool = True, progress: Any = None,
                      before: Any = None) -> dict[str, Any]:
    """Train and certify ``config_path`` into ``out_dir`` with canaries in every task; audit each release.

    The run is :func:`~dpcl.runner.run.run_training` with hooks (:class:`~dpcl.runner.run_types.RunHooks`).
    Returns the audit's payload (what ``audit.json`` holds). ``progress(t)`` is called after each task;
    ``before(loaded, prepared)`` on the run's stream before its canaries are added (``dpcl audit-run --mode both``
    audits the DP-SGD harness there, so the stream is built once).
    """
    hooks = _CanaryHooks(canaries, confidence, progress, before)
    result = run_training(config_path, out_dir, seed=seed, device=device, quiet=quiet, hooks=hooks)
    results = hooks.results
    flagged = [r["task"] for r in results if r["flagged"]]
    return {
        "config": str(config_path),
        "method": result.method,
        "mode": "in-stream",
        "certified_epsilon": float(result.releases[-1].cumulative_epsilon),
        "empirical_epsilon_lower": max(r["empirical_epsilon_lower"] for r in results),
        "delta": hooks.delta,
        "adjacency": "add_remove",
        "unit": str(result.audit["unit"]),
        "confidence": confidence,
        "canaries_per_task": canaries,
        "canary_kind": "input (uniform in the box of the task's features, a label from its public label set)",
        "verdict": "violated" if flagged else "consistent",
        "flagged_tasks": flagged,
        "run_directory": str(result.out_dir),
        "release": CANARY_RUN_RELEASE,
        "what_is_trained": (
            f"the config's own method ({result.method}) through dpcl run's pipeline, with the included canaries "
            "as extra units of each task; scored black box from each task's released model"
        ),
        "tasks": results,
    }
