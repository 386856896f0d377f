"""DP-SGD A-GEM (``[method] name = "agem"``): Naive fine-tuning whose every step (from task 2 on) is projected
with A-GEM (Chaudhry et al. 2019, eq. 11) against a noisy reference gradient of an episodic memory of earlier
tasks' examples; the DP-SGD baseline of Lai et al. (Sec. 6, "NaiveGaussian") on dpcl's adapter model. Its
plan is :data:`dpcl.methods.agem.spec.AGEM`.
"""

from __future__ import annotations

from typing import Any, Mapping

import numpy as np
import torch

from dpcl.errors import InvalidParameterError, PrivacyViolationError
from dpcl.guarantees.method_schema import TaskPlan
from dpcl.methods.base import MethodSetup, TrainingData
from dpcl.methods.dpsgd_training import ReferenceGradient
from dpcl.methods.gem import agem_project
from dpcl.methods.peft_ensemble.method import method_option
from dpcl.methods.single_model import SingleModelDPSGD

__all__ = ["AGemFineTuning"]


class AGemFineTuning(SingleModelDPSGD):
    """DP-SGD A-GEM: Naive fine-tuning with the A-GEM projection (Chaudhry et al. 2019, Alg. 1 and eq. 11).

    After task ``t`` is trained, ``memory_per_task`` of its examples, a uniform
    sample whose indices come from the public seed (never from the data), join the
    episodic memory. Every DP-SGD step of a later task computes two released
    gradients with the same clipping and noise
    (:class:`~dpcl.methods.dpsgd_training.ReferenceGradient`): ``g`` on the
    step's Poisson sample of the task, ``g_ref`` on a Poisson sample of the
    memory at ``plan.noise["memory_sample_rate"]``; the update is
    :func:`~dpcl.methods.gem.agem_project` ``(g, g_ref)``, post-processing of the
    two. The plan (:data:`dpcl.methods.agem.spec.AGEM`) accounts each step at
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
