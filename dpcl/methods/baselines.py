"""Baselines of Tobaben et al., App. G: Naive fine-tuning (Alg. A2) and the full-data, non-CL model (Alg. A3).

Both use one adapter + head (:class:`~dpcl.methods.dpsgd_training.AdapterClassifier`)
over the whole public label space, trained with DP-SGD as each release's plan says.

* :class:`NaiveFineTuning` (Alg. A2): one model, trained further on each task's
  data in turn; nothing counters forgetting (the lower reference). Each task's
  data is used only while that task is trained.
* :class:`NonContinualTraining` (Alg. A3): at each release a fresh model is
  trained on the union of all tasks seen so far. This reuses past tasks' data
  (its spec says ``reuses_past_tasks``), so the runner hands it the union and
  the ledger composes every release that touched a task's data. It is the
  upper reference, not a continual-learning method.
* :class:`AGemFineTuning` (``[method] name = "agem"``): DP-SGD A-GEM, Naive
  fine-tuning whose every step (from task 2 on) is projected with A-GEM
  (Chaudhry et al. 2019, eq. 11) against a noisy reference gradient of an
  episodic memory of earlier tasks' examples; the DP-SGD baseline of Lai et al.
  (Sec. 6, "NaiveGaussian") on dpcl's adapter model. Its plan is
  :data:`dpcl.guarantees.schedules.AGEM`.
"""

from __future__ import annotations

from typing import Any, Mapping

import numpy as np
import torch

from dpcl.errors import ConfigError, InvalidParameterError, PrivacyViolationError
from dpcl.guarantees.method_schema import TaskPlan
from dpcl.methods.base import ContinualMethod, MethodSetup, ProgressCallback, TrainingData
from dpcl.methods.dpsgd_training import (
    AdapterClassifier,
    ReferenceGradient,
    schedule_from_plan,
    seeded_adapter,
    train_classifier,
)
from dpcl.methods.gem import agem_project
from dpcl.methods.peft_ensemble import method_option


class _SingleModelDPSGD(ContinualMethod):
    """One adapter + head over the whole label space; subclasses decide whether it restarts per release."""

    restart_each_release = False
    #: the optimiser of every step ("adam"; A-GEM: the ``[method] optimizer`` key, SGD by default)
    optimizer_name = "adam"

    def __init__(self, setup: MethodSetup) -> None:
        super().__init__(setup)
        if int(setup.input_dim) == 0:
            raise ConfigError(
                f"method {self.name!r} needs encoder features, but the stream gives raw texts; "
                "use dataset = 'fortunes' (MiniLM features) instead of 'fortunes_texts'."
            )
        self.device = torch.device(setup.device)
        self.adapter_dim = int(method_option(setup.method, "adapter_dim", 64))
        self.learning_rate = float(method_option(setup.method, "learning_rate", 1e-3))
        if self.adapter_dim < 0:
            raise InvalidParameterError(f"[method] adapter_dim must be >= 0, got {self.adapter_dim}.")
        #: initialisation only; noise and Poisson masks come from :meth:`noise_generator`
        # a CPU generator whatever the device: its state restores on any device, so a run resumed on
        # another device initialises later models exactly as an uninterrupted run would
        self.generator = torch.Generator(device="cpu").manual_seed(int(setup.seed))
        self.model = self._fresh_model()

    def _fresh_model(self) -> AdapterClassifier:
        return seeded_adapter(
            int(self.setup.input_dim), len(self.label_space), self.adapter_dim, self.generator, self.device
        )

    def fit_task(
        self,
        task_index: int,
        data: TrainingData,
        output_labels: tuple[int, ...],
        plan: TaskPlan,
        progress: ProgressCallback | None = None,
    ) -> None:
        labels = np.asarray(data.labels, dtype=np.int64)
        if not np.all(np.isin(labels, np.asarray(output_labels, dtype=np.int64))):
            raise InvalidParameterError(
                f"task {task_index} has examples whose label is outside its public labels {list(output_labels)}; "
                "apply the label-space filter first (Tobaben et al., Prop. 4.7)."
            )
        self.label_positions(output_labels)
        schedule = schedule_from_plan(plan, self.setup.method, len(data))
        if self.restart_each_release:
            self.model = self._fresh_model()
        features = torch.tensor(np.asarray(data.features), dtype=torch.float32, device=self.device)
        targets = torch.as_tensor(self.label_positions(labels), dtype=torch.long, device=self.device)
        train_classifier(
            self.model,
            features,
            targets,
            schedule,
            learning_rate=self.learning_rate,
            generator=self.noise_generator(task_index),  # Poisson masks + DP-SGD noise
            progress=progress,
            reference=self._reference(task_index, data, plan, schedule.sample_rate),
            optimizer_name=self.optimizer_name,
        )
        self._after_task(data, features, targets)
        self.mark_released(output_labels)
        self.tasks_fitted += 1

    def _reference(self, task_index: int, data: TrainingData, plan: TaskPlan, task_rate: float
                   ) -> ReferenceGradient | None:
        """The second sample of every step (none here; A-GEM's episodic memory)."""
        return None

    def _after_task(self, data: TrainingData, features: torch.Tensor, targets: torch.Tensor) -> None:
        """Called once a task is trained (A-GEM stores its memory sample here)."""

    def scores(self, features: np.ndarray) -> np.ndarray:
        with torch.no_grad():
            x = torch.tensor(np.asarray(features), dtype=torch.float32, device=self.device)
            return self.model(x).double().cpu().numpy()

    def state_dict(self) -> dict[str, Any]:
        return {
            **self._base_state(),
            "label_space": list(self.label_space),
            "adapter_dim": self.adapter_dim,
            "model": {k: v.detach().cpu().clone() for k, v in self.model.state_dict().items()},
            "generator_state": self.generator.get_state(),
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        if list(state["label_space"]) != list(self.label_space) or int(state["adapter_dim"]) != self.adapter_dim:
            raise InvalidParameterError("checkpoint was written for another label space or adapter size.")
        self._load_base_state(state)
        self.model.load_state_dict(state["model"])
        self.model.eval()
        self.generator.set_state(state["generator_state"])


class NaiveFineTuning(_SingleModelDPSGD):
    """Alg. A2: keep fine-tuning one model with DP-SGD on each task in turn."""

    name = "naive"
    restart_each_release = False


class NonContinualTraining(_SingleModelDPSGD):
    """Alg. A3: a fresh model trained with DP-SGD on the union of the tasks seen so far, at every release."""

    name = "non_cl"
    restart_each_release = True


class AGemFineTuning(_SingleModelDPSGD):
    """DP-SGD A-GEM: Naive fine-tuning with the A-GEM projection (Chaudhry et al. 2019, Alg. 1 and eq. 11).

    After task ``t`` is trained, ``memory_per_task`` of its examples, a uniform
    sample whose indices come from the public seed (never from the data), join the
    episodic memory. Every DP-SGD step of a later task computes two released
    gradients with the same clipping and noise
    (:class:`~dpcl.methods.dpsgd_training.ReferenceGradient`): ``g`` on the
    step's Poisson sample of the task, ``g_ref`` on a Poisson sample of the
    memory at ``plan.noise["memory_sample_rate"]``; the update is
    :func:`~dpcl.methods.gem.agem_project` ``(g, g_ref)``, post-processing of the
    two. The plan (:data:`dpcl.guarantees.schedules.AGEM`) accounts each step at
    ``max(q_t, q_mem)`` and composes all tasks sequentially.

    The memory holds raw private examples: it is curator state
    (:meth:`curator_state_dict`), never part of the released checkpoint. It also
    keeps the memory's unit ids: a task whose units are in the memory is refused
    (:class:`~dpcl.errors.PrivacyViolationError`), since such a unit could be in
    both samples of one step, which the per-step accounting excludes.
    """

    name = "agem"
    restart_each_release = False

    def __init__(self, setup: MethodSetup) -> None:
        super().__init__(setup)
        self.optimizer_name = str(method_option(setup.method, "optimizer", "sgd"))
        self.memory_per_task = int(method_option(setup.method, "memory_per_task", 256))
        if self.memory_per_task < 1:
            raise InvalidParameterError(f"[method] memory_per_task must be >= 1, got {self.memory_per_task}.")
        self.memory_features: torch.Tensor | None = torch.zeros((0, int(setup.input_dim)), device=self.device)
        self.memory_targets = torch.zeros(0, dtype=torch.long, device=self.device)
        self.memory_units = np.zeros(0, dtype=object)

    def _require_memory(self) -> None:
        if self.memory_features is None:
            raise InvalidParameterError(
                "this agem model was restored from its release only: continuing the stream needs its episodic "
                "memory; call load_curator_state_dict with the state curator_state_dict returned."
            )

    def _reference(self, task_index: int, data: TrainingData, plan: TaskPlan, task_rate: float
                   ) -> ReferenceGradient | None:
        self._require_memory()
        assert self.memory_features is not None
        if not len(self.memory_targets):
            return None
        shared = np.intersect1d(np.asarray(data.unit_ids).astype(str), self.memory_units.astype(str))
        if shared.size:
            raise PrivacyViolationError(
                f"task {task_index} holds {shared.size} privacy unit(s) that are also in the A-GEM episodic memory; "
                "DP-SGD A-GEM's accounting (one subsampled Gaussian per step and unit) needs tasks with disjoint "
                "units. Use a stream whose tasks hold disjoint units ([stream] disjoint_units = true)."
            )
        rate = plan.noise.get("memory_sample_rate")
        if rate is None or not plan.events:  # not private: the memory is read at the configured or the task's rate
            rate = self.setup.method.get("memory_sample_rate") or task_rate
        return ReferenceGradient(self.memory_features, self.memory_targets, float(rate), agem_project)

    def _after_task(self, data: TrainingData, features: torch.Tensor, targets: torch.Tensor) -> None:
        self._require_memory()
        assert self.memory_features is not None
        n = len(data)
        keep = torch.randperm(n, generator=self.generator)[: min(self.memory_per_task, n)]  # public randomness
        self.memory_features = torch.cat([self.memory_features, features[keep.to(self.device)]])
        self.memory_targets = torch.cat([self.memory_targets, targets[keep.to(self.device)]])
        self.memory_units = np.concatenate([self.memory_units, np.asarray(data.unit_ids, dtype=object)[keep.numpy()]])

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        super().load_state_dict(state)
        self.memory_features = None  # until load_curator_state_dict

    def curator_state_dict(self) -> dict[str, Any]:
        """The episodic memory: raw training examples, their label positions and unit ids (private)."""
        self._require_memory()
        assert self.memory_features is not None
        return {
            "memory_features": self.memory_features.detach().cpu().clone(),
            "memory_targets": self.memory_targets.detach().cpu().clone(),
            "memory_units": [str(u) for u in self.memory_units],
        }

    def load_curator_state_dict(self, state: Mapping[str, Any]) -> None:
        if set(state) != {"memory_features", "memory_targets", "memory_units"}:
            raise InvalidParameterError(f"an agem curator state holds memory_features, memory_targets and "
                                        f"memory_units; got {sorted(state)}.")
        self.memory_features = state["memory_features"].to(self.device, copy=True)
        self.memory_targets = state["memory_targets"].to(self.device, copy=True)
        self.memory_units = np.asarray(list(state["memory_units"]), dtype=object)
