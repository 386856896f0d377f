"""The tasks a run trains: its stream built from the config, filtered by the public label sets, and planned.

These are the stages of :func:`dpcl.runner.run.run_training` that read the config and the data but write
nothing; every rank of a data-parallel run (:mod:`dpcl.runner.distributed`) builds the same tasks and
plans with them, so that its training calls match rank 0's.

* :func:`run_options` -- the validated ``[run]`` section.
* :func:`build_run_stream` -- the task stream (``--seed`` drives it unless ``[stream] seed`` is set).
* :func:`label_sets` and :func:`prepare_tasks` -- the public output label set of every task and the task data
  filtered by it (Tobaben et al., eq. 6), with the filter counts.
* :func:`release_data` -- the data release ``t`` reads (the union of tasks ``0..t`` for Non-CL).
* :func:`method_setup` -- the method's :class:`~dpcl.methods.base.MethodSetup`.
* :func:`task_plan` -- the plan of task ``t`` (the plan the audit checked, or the noise-free plan of a
  non-private reference run).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np

from dpcl.data import build_stream
from dpcl.errors import ConfigError
from dpcl.guarantees.config import RUN_KEYS  # the [run] keys, validated with the rest of the config
from dpcl.guarantees.label_space import filter_task, output_label_sets
from dpcl.guarantees.method_schema import ReleaseCoverage, TaskPlan, spec_trains_encoder
from dpcl.methods.base import MethodSetup, TrainingData

NON_PRIVATE_STATEMENT = (
    "This checkpoint was trained WITHOUT differential privacy ([run] private = false): no noise was added and "
    "no gradient was clipped. It offers no privacy guarantee for its training data (epsilon is infinite)."
)


def run_options(config: Any) -> dict[str, Any]:
    """The validated ``[run]`` options (:data:`RUN_KEYS`, checked by :func:`dpcl.guarantees.config.load_config`)."""
    return {key: config.run.get(key, default) for key, (_kind, default, _help) in RUN_KEYS.items()}


def build_run_stream(config: Any, *, seed: int, device: str, quiet: bool = True) -> Any:
    """The task stream of ``config``: ``seed`` drives it unless ``[stream] seed`` is set explicitly.

    ``[stream] encoder`` features are computed on ``device``; a method whose spec says it trains inside the
    encoder (:func:`spec_trains_encoder`: PEFT Ensemble's film variant) gets the images as pixel rows instead
    of the encoder's features.
    """
    stream_options = dict(config.raw["stream"])
    stream_options.setdefault("seed", seed)
    encode = not spec_trains_encoder(config.spec, config.method)
    return build_stream(stream_options, encode=encode, device=device, progress=not quiet)


def label_sets(config: Any, n_tasks: int) -> list[tuple[int, ...]]:
    """The public output label set O_t of every task (sorted), from ``[stream] label_space`` and ``prior_labels``."""
    sets = output_label_sets(config.settings.label_space, config.settings.prior_labels, n_tasks)
    return [tuple(sorted(s)) for s in sets]


@dataclass(frozen=True)
class PreparedTask:
    """One task after the label filter: the training data it keeps and its test set."""

    index: int
    features: np.ndarray
    labels: np.ndarray
    unit_ids: np.ndarray
    output_labels: tuple[int, ...]
    filtered_out: int
    texts: np.ndarray | None
    test_features: np.ndarray  # features, or texts (object array) for raw-text streams
    test_labels: np.ndarray


def _prepared_task(task: Any, output: Sequence[int], needs_texts: bool) -> tuple[PreparedTask, Any]:
    text_only = task.train.features is None
    mask, report = filter_task(task.train.labels, output, task.index)
    if len(task.test) == 0:
        raise ConfigError(f"task {task.index} has an empty test set; lower test_fraction or change the tasks.")
    prepared = PreparedTask(
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
    return prepared, report


def prepare_tasks(
    stream: Any, output_sets: Sequence[tuple[int, ...]], needs_texts: bool = False
) -> tuple[list[PreparedTask], list[Any]]:
    """Label-filtered tasks and their filter reports. Raw-text streams, and methods that declare ``needs_texts``
    (PeCL), get the texts and are evaluated on the test texts (an object array) instead of encoder features."""
    prepared, reports = [], []
    for task, output in zip(stream, output_sets):
        text_only = task.train.features is None
        if (text_only or needs_texts) and (task.train.texts is None or task.test.texts is None):
            raise ConfigError(
                f"[stream] dataset {stream.dataset_name!r} gives no raw texts"
                + (", and this method trains on text (use dataset = 'fortunes_texts')." if needs_texts
                   else " and no features.")
            )
        task_prepared, report = _prepared_task(task, output, needs_texts)
        prepared.append(task_prepared)
        reports.append(report)
    return prepared, reports


def release_data(prepared: Sequence[PreparedTask], t: int, reuses_past_tasks: bool) -> tuple[Any, tuple[int, ...], list[int]]:
    """The data, output labels and task indices release ``t`` reads (the union 0..t for Non-CL)."""
    parts = prepared[: t + 1] if reuses_past_tasks else [prepared[t]]
    data = TrainingData(
        features=np.concatenate([p.features for p in parts]),
        labels=np.concatenate([p.labels for p in parts]),
        unit_ids=np.concatenate([p.unit_ids for p in parts]),
        texts=None if any(p.texts is None for p in parts) else np.concatenate([p.texts for p in parts]),
    )
    outputs = tuple(sorted({o for p in parts for o in p.output_labels}))
    return data, outputs, [p.index for p in parts]


def method_setup(config: Any, output_sets: Sequence[tuple[int, ...]], prepared: Sequence[PreparedTask], *,
                 across: str, seed: int, device: str, reproducible_noise: bool) -> Any:
    """The method's :class:`~dpcl.methods.base.MethodSetup`; ``across`` is the resolved composition the ledger applies."""
    return MethodSetup(
        method=config.method,
        privacy=config.settings.replace(across_tasks=across),
        label_space=tuple(sorted({o for s in output_sets for o in s})),
        input_dim=int(prepared[0].features.shape[1]),
        seed=seed,
        device=device,
        reproducible_noise=reproducible_noise,
    )


def task_plan(config: Any, t: int, n_examples: int, *, trains_plan: bool) -> Any:
    """The plan of task ``t`` for ``n_examples`` examples.

    ``trains_plan``: the method's own plan (the one the audit checked). Otherwise (a non-private reference
    run of a method whose plan covers its checkpoint) the noise-free plan: no events, not covered.
    """
    if trains_plan:
        return config.spec.plan_task(config.method, config.settings, n_examples, t)
    return TaskPlan(events=(), noise={}, assumptions=(), release=ReleaseCoverage.not_covered(NON_PRIVATE_STATEMENT))


def trains_plan(private: bool, covered: bool) -> bool:
    """Whether a run trains its method's plan as it is (with its noise).

    A private run is refused by the audit unless its plan covers the checkpoint; a non-private run of a plan
    that does not cover it trains the plan as it is (PeCL as in the paper); one of a plan that does is a
    noise-free reference run.
    """
    return private or not covered
