"""The interface every continual-learning training method implements.

``dpcl run`` (:mod:`dpcl.runner`) drives a method through a task stream:

1. the runner builds the method with :meth:`ContinualMethod.__init__` from the
   validated config, the public label space and the input dimension;
2. for each task ``t`` the runner asks the method's :class:`MethodSpec`
   (:mod:`dpcl.guarantees.method_schema`) for the task's :class:`TaskPlan` —
   the same plan ``dpcl audit`` checks — charges ``plan.events`` to the task
   ledger, and only then calls :meth:`ContinualMethod.fit_task` with the task's
   label-filtered training data, its public output labels ``O_t`` and the plan;
3. the runner saves :meth:`ContinualMethod.state_dict` as the task's checkpoint,
   certifies it, saves :meth:`ContinualMethod.curator_state_dict` as the task's
   curator state (a separate, private file), and evaluates
   :meth:`ContinualMethod.predict` on the test sets of the tasks seen so far.

Release vs curator state. The checkpoint is the *release*: its SHA-256 is what
the certificate certifies, so it must hold only what the DP guarantee covers --
what the noised mechanisms produced, their post-processing, and public
information (configuration, seeded initialisation, public labels ``O_t``, task
sizes). Anything a method computed from the private data *without* noise and
needs only to continue the stream (privacy-unit ids for the disjointness
checks, raw statistics, exact counts) is *curator state*: it goes to
:meth:`ContinualMethod.curator_state_dict`, which the runner keeps under
``DIR/curator/`` (private, like the ledger; never published) and restores with
:meth:`ContinualMethod.load_curator_state_dict` when a run resumes.

A method never computes epsilon: it takes its noise (``sigma`` or
``noise_multiplier`` / ``sample_rate`` / ``steps``) from ``plan.noise`` and
must not touch the private data in any other way than the plan describes.
A method must release a proper classifier for every task, even when the task's
filtered data set is empty (Tobaben et al., Prop. F.1).

Methods are looked up lazily by ``[method] name`` through the method registry
(:mod:`dpcl.guarantees.method_registry`; :data:`METHOD_CLASSES` is a view of it),
so ``import dpcl.methods`` does not import torch. Third-party methods register
through the ``dpcl.methods`` entry-point group (docs/plugins.md).
"""

from __future__ import annotations

import importlib
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any, Callable, ClassVar, Mapping, Sequence

import numpy as np

from dpcl.errors import ConfigError, InvalidParameterError, MethodPluginError, MissingDependencyError
from dpcl.guarantees.method_registry import REGISTRY, RegistryView
from dpcl.guarantees.method_schema import TaskPlan
from dpcl.methods.noise_source import noise_rng, noise_torch_generator
from dpcl.guarantees.settings import PrivacySettings, privacy_settings

#: ``[method] name`` -> "module:class" of its :class:`ContinualMethod`: a read-only view of the method
#: registry (:mod:`dpcl.guarantees.method_registry`), built-in methods and installed plugins.
METHOD_CLASSES: Mapping[str, str] = RegistryView("class")

#: Called by a method after each unit of work (one DP-SGD step, one class-sum release) with the count done.
ProgressCallback = Callable[[int], None]


@dataclass(frozen=True)
class TrainingData:
    """One task's private training data, after the label-space filter.

    ``features`` [n, d] float32, ``labels`` [n] int64 (global label ids),
    ``unit_ids`` [n] (privacy unit of each example). ``n`` may be 0: the method
    must still release a proper classifier (Prop. F.1). ``texts`` is set for
    text streams whose methods need the raw text (e.g. LoRA on the encoder).
    """

    features: np.ndarray
    labels: np.ndarray
    unit_ids: np.ndarray
    texts: "tuple[str, ...] | np.ndarray | None" = None

    def __post_init__(self) -> None:
        n = len(self.labels)
        if self.features.ndim != 2 or self.features.shape[0] != n or len(self.unit_ids) != n:
            raise InvalidParameterError(
                "training data must have features [n, d] with one label and one unit id per row; got "
                f"features {self.features.shape}, {n} labels, {len(self.unit_ids)} unit ids."
            )
        if self.texts is not None and len(self.texts) != n:
            raise InvalidParameterError(f"texts must hold one text per example ({n}), got {len(self.texts)}.")

    def __len__(self) -> int:
        return int(len(self.labels))


@dataclass(frozen=True)
class TrainingTask:
    """One task as a method learns it (:meth:`ContinualMethod.learn_task`), its labels already checked.

    ``index`` is the task's position in the stream, ``data`` its label-filtered
    private training data, ``output_labels`` its public label set ``O_t`` and
    ``plan`` the :class:`TaskPlan` whose events the runner charged before
    training (its ``noise`` is what the method may use).
    """

    index: int
    data: TrainingData
    output_labels: tuple[int, ...]
    plan: TaskPlan


@dataclass(frozen=True)
class MethodSetup:
    """What a method is built from: everything here is public or configuration.

    ``label_space`` is the sorted union of every task's public output labels
    (``O^prior`` under ``prior_const``, the union of the ``O_t^prior`` under
    ``prior``); ``input_dim`` the feature dimension of the (public, frozen)
    encoder, or 0 when the stream gives raw texts (methods that can fine-tune an
    encoder read ``TrainingData.texts``; the others refuse). ``device`` is a torch device string ("cpu", "cuda" or
    "cuda:N"; :func:`dpcl.runner.run.resolve_device` checks that it exists).
    ``seed`` drives initialisation and shuffles; privacy noise and Poisson
    sampling come from OS entropy unless ``reproducible_noise`` is set
    (:mod:`dpcl.methods.noise_source`).
    """

    method: Mapping[str, Any]
    #: The run's privacy settings (a ``[privacy]`` mapping is validated into them), ``across_tasks`` resolved.
    privacy: PrivacySettings
    label_space: tuple[int, ...]
    input_dim: int
    seed: int
    device: str = "cpu"
    reproducible_noise: bool = False

    def __post_init__(self) -> None:
        object.__setattr__(self, "privacy", privacy_settings(self.privacy))
        if not self.label_space:
            raise InvalidParameterError("label_space must list at least one public label.")
        if int(self.input_dim) < 0:
            raise InvalidParameterError(f"input_dim must be >= 0 (0: raw-text inputs), got {self.input_dim}.")
        if not isinstance(self.reproducible_noise, bool):
            raise InvalidParameterError(f"reproducible_noise must be true or false, got {self.reproducible_noise!r}.")


class ContinualMethod(ABC):
    """A continual-learning method trained task by task under a privacy plan.

    Subclasses set :attr:`name` (the ``[method] name``) and implement
    :meth:`learn_task`, :meth:`scores`, :meth:`state_dict` and
    :meth:`load_state_dict`; the runner calls :meth:`fit_task`, which checks a
    task's labels around :meth:`learn_task`. Prediction (:meth:`predict`) is
    restricted to the labels released so far, ``\\cup_{k<=t} O_k`` (Tobaben et
    al., eq. 9 / 10).
    """

    name: ClassVar[str] = ""

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if "fit_task" in vars(cls):
            raise MethodPluginError(
                f"{cls.__module__}.{cls.__qualname__} overrides fit_task, which ContinualMethod implements (it checks "
                "the task's labels and records the release); implement learn_task(self, task, progress=None) instead, "
                "reading task.index, task.data, task.output_labels and task.plan (docs/plugins.md)."
            )

    def __init__(self, setup: MethodSetup) -> None:
        self.setup = setup
        self.label_space = tuple(int(label) for label in setup.label_space)
        self._label_index = {label: i for i, label in enumerate(self.label_space)}
        #: Boolean mask over ``label_space``: labels some released task covered.
        self.seen_labels = np.zeros(len(self.label_space), dtype=bool)
        self.tasks_fitted = 0

    # -- label bookkeeping ---------------------------------------------
    def label_positions(self, labels: Sequence[int] | np.ndarray) -> np.ndarray:
        """Positions of global ``labels`` in :attr:`label_space`; labels outside it raise."""
        labels = np.asarray(labels, dtype=np.int64).ravel()
        lookup = np.asarray(self.label_space, dtype=np.int64)
        positions = np.searchsorted(lookup, labels)
        positions = np.clip(positions, 0, len(lookup) - 1)
        bad = lookup[positions] != labels
        if np.any(bad):
            raise InvalidParameterError(
                f"label {int(labels[bad][0])} is not in the public label space {list(self.label_space)}; "
                "filter the task with its public prior labels first."
            )
        return positions

    def require_encoder_features(self, what: str = "encoder features") -> None:
        """Refuse a stream of raw texts (``setup.input_dim == 0``) for a method that trains on ``what``."""
        if int(self.setup.input_dim) == 0:
            raise ConfigError(
                f"method {self.name!r} needs {what}, but the stream gives raw texts; use dataset = 'fortunes' "
                "(MiniLM features) instead of 'fortunes_texts'."
            )

    @property
    def compute_device(self) -> str:
        """The device this method computes on (recorded in metrics and certificates): ``setup.device`` by default."""
        return str(self.setup.device)

    # -- privacy-relevant randomness ---------------------------------------
    def noise_generator(self, task_index: int, stream: int = 0, device: Any = None) -> Any:
        """A fresh ``torch.Generator`` for task ``task_index``'s noise / Poisson masks (never stored in a checkpoint).

        Seeded from OS entropy unless the run opted in to ``reproducible_noise``
        (:func:`dpcl.methods.noise_source.noise_torch_generator`).
        """
        return noise_torch_generator(
            int(self.setup.seed), self.setup.reproducible_noise, int(task_index), int(stream),
            device=device if device is not None else self.setup.device,
        )

    def noise_rng(self, task_index: int, stream: int = 0) -> np.random.Generator:
        """A fresh numpy generator for task ``task_index``'s noise (see :meth:`noise_generator`)."""
        return noise_rng(int(self.setup.seed), self.setup.reproducible_noise, int(task_index), int(stream))

    def mark_released(self, output_labels: Sequence[int]) -> None:
        self.seen_labels[self.label_positions(output_labels)] = True

    # -- the contract ----------------------------------------------------
    def fit_task(
        self,
        task_index: int,
        data: TrainingData,
        output_labels: Sequence[int],
        plan: TaskPlan,
        progress: ProgressCallback | None = None,
    ) -> None:
        """Learn task ``task_index`` from ``data`` with the noise in ``plan.noise``; what the runner calls.

        ``output_labels`` is the task's public label set ``O_t``. Before the
        method's :meth:`learn_task` runs, this checks the contract every method
        relies on: ``O_t`` is non-empty, distinct and in the public label space,
        and every label in ``data.labels`` is in ``O_t`` (the label-space filter,
        Tobaben et al., Prop. 4.7). After it, the labels of ``O_t`` count as
        released (:meth:`mark_released`) and :attr:`tasks_fitted` goes up by one.
        """
        task = TrainingTask(int(task_index), data, tuple(int(o) for o in output_labels), plan)
        self.label_positions(task.output_labels)  # every O_t label is public
        if not task.output_labels or len(set(task.output_labels)) != len(task.output_labels):
            raise InvalidParameterError(f"output_labels must be distinct public labels, got {output_labels!r}.")
        if not np.all(np.isin(np.asarray(data.labels, dtype=np.int64), np.asarray(task.output_labels))):
            raise InvalidParameterError(
                f"task {task.index} has examples whose label is outside its public labels {list(task.output_labels)}; "
                "apply the label-space filter first (Tobaben et al., Prop. 4.7)."
            )
        self.learn_task(task, progress)
        self.mark_released(task.output_labels)
        self.tasks_fitted += 1

    @abstractmethod
    def learn_task(self, task: TrainingTask, progress: ProgressCallback | None = None) -> None:
        """Train on ``task.data`` under ``task.plan`` (the method's own part of :meth:`fit_task`).

        The labels are checked when this runs; the release bookkeeping happens
        after it returns. Report units of work through ``progress``
        (:meth:`planned_work` of them in all).
        """

    @abstractmethod
    def scores(self, features: np.ndarray) -> np.ndarray:
        """Scores [n, len(label_space)] (higher = more likely); any value for unreleased labels."""

    def predict(self, features: np.ndarray) -> np.ndarray:
        """Predicted global labels, argmax over the labels released so far."""
        if not self.seen_labels.any():
            raise InvalidParameterError("predict called before any task was fitted.")
        scores = np.asarray(self.scores(features), dtype=np.float64)
        scores = np.where(self.seen_labels[None, :], scores, -np.inf)
        return np.asarray(self.label_space, dtype=np.int64)[np.argmax(scores, axis=1)]

    def accuracy(self, features: np.ndarray, labels: np.ndarray) -> float:
        """Fraction of correct predictions (NaN for an empty test set)."""
        labels = np.asarray(labels, dtype=np.int64)
        if labels.size == 0:
            return float("nan")
        return float(np.mean(self.predict(features) == labels))

    def planned_work(self, plan: TaskPlan) -> int:
        """Units of work :meth:`fit_task` reports through ``progress`` (for the progress bar)."""
        return int(plan.noise.get("steps", 1))

    @abstractmethod
    def state_dict(self) -> dict[str, Any]:
        """The release: what predicting needs, and only what the certificate covers (torch tensors, plain containers).

        Nothing computed from the private data without noise belongs here (no
        privacy-unit ids, raw counts or statistics of the private data): that
        is :meth:`curator_state_dict`. Together the two restore the method.
        """

    @abstractmethod
    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore :meth:`state_dict` output (used to resume a run, with :meth:`load_curator_state_dict`)."""

    def curator_state_dict(self) -> dict[str, Any]:
        """Curator-side state: what continuing the stream needs but the DP guarantee does not cover.

        E.g. the privacy-unit ids the disjointness checks compare against, raw
        statistics of the private data. The runner writes it to
        ``DIR/curator/taskNNN.state.pt`` (private: it must never be published),
        records its SHA-256 in ``run.json`` and restores it on resume. Tensors,
        numbers, strings and plain containers only (it is read with
        ``torch.load(weights_only=True)``). Default: nothing.
        """
        return {}

    def load_curator_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore :meth:`curator_state_dict` output after :meth:`load_state_dict` (used to resume a run).

        The default accepts only the empty state a method without curator state
        writes; anything else is refused rather than ignored.
        """
        if dict(state):
            raise InvalidParameterError(
                f"method {self.name!r} keeps no curator state, but the curator state to restore holds "
                f"{sorted(state)}; it belongs to another method or run."
            )

    def _base_state(self) -> dict[str, Any]:
        return {"seen_labels": [bool(v) for v in self.seen_labels], "tasks_fitted": self.tasks_fitted}

    def _load_base_state(self, state: Mapping[str, Any]) -> None:
        seen = np.asarray(state["seen_labels"], dtype=bool)
        if seen.shape != self.seen_labels.shape:
            raise InvalidParameterError(
                f"checkpoint covers {seen.size} labels but this run's label space has {self.seen_labels.size}."
            )
        self.seen_labels = seen.copy()
        self.tasks_fitted = int(state["tasks_fitted"])


def method_class(name: str) -> type[ContinualMethod]:
    """The :class:`ContinualMethod` subclass for ``[method] name`` (built-in or plugin, through the registry).

    Unknown names raise :class:`ConfigError`; a known method whose module needs
    the training extra raises :class:`MissingDependencyError` with the install
    command; a plugin whose class cannot be imported or is not a
    :class:`ContinualMethod` named ``name`` raises :class:`MethodPluginError`.
    """
    entry = REGISTRY.entry(name)
    path = REGISTRY.class_path(name)
    where = f"method {name!r} ({entry.describe()})"
    if isinstance(path, type):
        cls = path
    else:
        module_name, _, attribute = path.partition(":")
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as exc:
            if exc.name in {"torch", "opacus", "peft", "transformers"}:
                raise MissingDependencyError(
                    f"{where} needs {exc.name}; install the training extra: "
                    "pip install torch==2.13.0 && pip install 'dpcl[train]'"
                ) from exc
            if exc.name == module_name:
                if entry.is_plugin:
                    raise MethodPluginError(f"{where}: its class module {module_name!r} cannot be imported.") from exc
                raise ConfigError(f"{where} is declared but not available in this build ({module_name}).") from exc
            raise
        cls = getattr(module, attribute, None)
        if cls is None:
            error = MethodPluginError if entry.is_plugin else ConfigError
            raise error(f"{where}: {module_name} defines no {attribute}.")
    if not (isinstance(cls, type) and issubclass(cls, ContinualMethod)):
        raise MethodPluginError(f"{where}: {path!r} is not a subclass of dpcl.methods.base.ContinualMethod.")
    if cls.name != name:
        raise MethodPluginError(f"{where}: its class {cls.__name__} sets name = {cls.name!r}; it must be {name!r}.")
    return cls
