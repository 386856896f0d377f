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
"""

from __future__ import annotations

from typing import Any, Mapping

import numpy as np
import torch

from dpcl.errors import ConfigError, InvalidParameterError
from dpcl.guarantees.method_schema import TaskPlan
from dpcl.methods.base import ContinualMethod, MethodSetup, ProgressCallback, TrainingData
from dpcl.methods.dpsgd_training import AdapterClassifier, schedule_from_plan, seeded_adapter, train_classifier
from dpcl.methods.peft_ensemble import method_option


class _SingleModelDPSGD(ContinualMethod):
    """One adapter + head over the whole label space; subclasses decide whether it restarts per release."""

    restart_each_release = False

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
        train_classifier(
            self.model,
            torch.tensor(np.asarray(data.features), dtype=torch.float32, device=self.device),
            torch.as_tensor(self.label_positions(labels), dtype=torch.long, device=self.device),
            schedule,
            learning_rate=self.learning_rate,
            generator=self.noise_generator(task_index),  # Poisson masks + DP-SGD noise
            progress=progress,
        )
        self.mark_released(output_labels)
        self.tasks_fitted += 1

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
