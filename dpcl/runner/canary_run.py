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
  was actually trained, and every certificate stays true. The run is the
  same pipeline as ``dpcl run`` (:mod:`dpcl.runner.run`'s stages);
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
from dpcl.errors import ConfigError
from dpcl.runner.run import StageClock, audit_run, load_run, open_run, prepare_stream, run_task, write_summary

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
    """Black-box score of each canary: its label's score minus the best other released label's score."""
    scores = np.asarray(method.scores(canaries.features), dtype=np.float64)
    seen = np.asarray(method.seen_labels, dtype=bool)
    columns = method.label_positions(canaries.labels)
    own = scores[np.arange(scores.shape[0]), columns]
    others = np.where(seen[None, :], scores, -np.inf)
    others[np.arange(scores.shape[0]), columns] = -np.inf
    best_other = others.max(axis=1)
    margin = own - np.where(np.isfinite(best_other), best_other, 0.0)
    return np.nan_to_num(margin, nan=0.0, posinf=1e300, neginf=-1e300)


def run_with_canaries(config_path: "str | Path", out_dir: "str | Path", *, canaries: int, confidence: float,
                      seed: int = 0, device: str | None = None, quiet: bool = True, progress: Any = None) -> dict[str, Any]:
    """Train and certify ``config_path`` into ``out_dir`` with canaries in every task; audit each release.

    Returns the audit's payload (what ``audit.json`` holds). ``progress(t)`` is called after each task.
    """
    loaded = load_run(config_path, out_dir, seed=seed, device=device, quiet=quiet)
    if not loaded.private:
        raise ConfigError("the config trains without privacy ([privacy] private = false): there is no certified epsilon to audit.")
    adjacency = loaded.config.settings.adjacency
    if adjacency != "add_remove":
        raise ConfigError(
            f"--in-stream audits add/remove guarantees (a canary is added or not), but [privacy] adjacency = "
            f"{adjacency!r}; a replace-one certificate says nothing about adding an example. Audit an add_remove config."
        )
    if getattr(loaded.method_class, "needs_texts", False):
        raise ConfigError(f"method {loaded.method_name!r} trains on raw text; --in-stream makes feature-space canaries only.")
    clock = StageClock()
    prepared = prepare_stream(loaded)
    tasks, sets = add_canaries(prepared.tasks, canaries)
    prepared = dataclasses.replace(prepared, tasks=tasks)
    report = audit_run(loaded, prepared)
    run = open_run(loaded, prepared, report, clock)
    delta = float(loaded.config.settings.delta)
    per_task_confidence = 1.0 - (1.0 - confidence) / len(sets)
    results = []
    for t in range(run.n_tasks):
        run_task(run, t)
        margins = canary_margins(run.method, sets[t])
        bound = audit_one_run(margins, sets[t].included, delta, confidence=per_task_confidence)
        certified = float(run.releases[-1].cumulative_epsilon)
        results.append({
            "task": t, "certified_epsilon": certified, "canaries": canaries,
            "black_box": bound.to_dict(), "empirical_epsilon_lower": bound.epsilon_lower,
            "flagged": bound.epsilon_lower > certified, "examples": int(len(tasks[t].labels)),
        })
        if progress is not None:
            progress(t)
    run.certifier.compact_ledgers()
    write_summary(run)
    flagged = [r["task"] for r in results if r["flagged"]]
    return {
        "config": str(config_path),
        "method": loaded.method_name,
        "mode": "in-stream",
        "certified_epsilon": float(run.releases[-1].cumulative_epsilon),
        "empirical_epsilon_lower": max(r["empirical_epsilon_lower"] for r in results),
        "delta": delta,
        "adjacency": adjacency,
        "unit": str(report.unit),
        "confidence": confidence,
        "canaries_per_task": canaries,
        "canary_kind": "input (uniform in the box of the task's features, a label from its public label set)",
        "verdict": "violated" if flagged else "consistent",
        "flagged_tasks": flagged,
        "run_directory": str(run.out),
        "release": CANARY_RUN_RELEASE,
        "what_is_trained": (
            f"the config's own method ({loaded.method_name}) through dpcl run's pipeline, with the included canaries "
            "as extra units of each task; scored black box from each task's released model"
        ),
        "tasks": results,
    }
