"""One adapter + head over the whole public label space, trained with DP-SGD as each release's plan says.

:class:`SingleModelDPSGD` is shared by the baselines of Tobaben et al., App. G -- Naive fine-tuning
(:mod:`dpcl.methods.naive`, Alg. A2) and the full-data non-CL model (:mod:`dpcl.methods.non_cl`, Alg. A3) --
and by DP-SGD A-GEM (:mod:`dpcl.methods.agem`), which adds a reference gradient and an episodic memory through
its hooks (:meth:`SingleModelDPSGD._reference`, :meth:`SingleModelDPSGD._after_task`). The model is
:class:`~dpcl.methods.dpsgd_training.AdapterClassifier`.
"""

from __future__ import annotations

from typing import Any, Mapping

import numpy as np
import torch

from dpcl.errors import InvalidParameterError
from dpcl.guarantees.method_schema import TaskPlan
from dpcl.methods.base import ContinualMethod, MethodSetup, ProgressCallback, TrainingData, TrainingTask
from dpcl.methods.dpsgd_training import (
    AdapterClassifier,
    ReferenceGradient,
    schedule_from_plan,
    seeded_adapter,
    train_classifier,
)
from dpcl.methods.peft_ensemble.method import method_option

__all__ = ["SingleModelDPSGD"]


class SingleModelDPSGD(ContinualMethod):
    """One adapter + head over the whole label space; subclasses decide whether it restarts per release."""

    restart_each_release = False
    #: the optimiser of every step ("adam"; A-GEM: the ``[method] optimizer`` key, SGD by default)
    optimizer_name = "adam"

    def __init__(self, setup: MethodSetup) -> None:
        super().__init__(setup)
        self.require_encoder_features()
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

    def learn_task(self, task: TrainingTask, progress: ProgressCallback | None = None) -> None:
        data = task.data
        schedule = schedule_from_plan(task.plan, self.setup.method, len(data))
        if self.restart_each_release:
            self.model = self._fresh_model()
        features = torch.tensor(np.asarray(data.features), dtype=torch.float32, device=self.device)
        targets = torch.as_tensor(self.label_positions(data.labels), dtype=torch.long, device=self.device)
        train_classifier(
            self.model,
            features,
            targets,
            schedule,
            learning_rate=self.learning_rate,
            generator=self.noise_generator(task.index),  # Poisson masks + DP-SGD noise
            progress=progress,
            reference=self._reference(task.index, data, task.plan, schedule.sample_rate),
            optimizer_name=self.optimizer_name,
        )
        self._after_task(data, features, targets)

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
