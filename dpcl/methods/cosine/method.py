"""DP Cosine Classifier (Tobaben et al., Alg. 1, eq. 8-9).

Features come from a frozen, public encoder (raw pixels for digits, MiniLM
sentence embeddings for text: whatever the data layer provides; nothing here is
fitted on private data). Each feature vector is scaled to unit l2 norm, so one
example moves one class sum by a vector of norm at most 1. At task ``t`` every
public label ``o`` in ``O_t`` gets

    s_o <- s_o + sum_{x in D_{t,o}} v(x) / ||v(x)||_2 + N(0, sigma^2 I)     (eq. 8)

with ``sigma`` taken from the task's plan (the whole ``|O_t| x K`` release is
one Gaussian mechanism of l2 sensitivity 1 under add/remove adjacency, 2 under
replace-one; the plan's event says which). Prediction is the label with the
largest cosine similarity to its noisy sum (eq. 9), over the labels released
so far. An empty task still releases noise-only sums for its labels, so every
release is a proper classifier (Prop. F.1).

The noise of each task comes from a fresh privacy generator
(:meth:`~dpcl.methods.base.ContinualMethod.noise_generator`: OS entropy unless
the run opts in to reproducible noise); no generator state is checkpointed.

The class sums, not the class means, are released: a mean would need the
(private) class count.
"""

from __future__ import annotations

from typing import Any, Mapping

import numpy as np
import torch

from dpcl.errors import InvalidParameterError
from dpcl.guarantees.method_schema import TaskPlan
from dpcl.methods.base import ContinualMethod, MethodSetup, ProgressCallback, TrainingTask


def normalise_rows(features: torch.Tensor) -> torch.Tensor:
    """Rows scaled to unit l2 norm; an all-zero row stays zero (norm 0 <= 1 keeps the sensitivity bound).

    Each row is first divided by its largest absolute entry, so the squares in the norm neither underflow (rows of
    about 1e-160 in float64) nor overflow: a norm computed from underflowed squares is too small and the "unit" row
    would have norm above 1, breaking the sensitivity bound of Alg. 1.
    """
    scale = features.abs().amax(dim=1, keepdim=True)
    scaled = features / torch.where(scale > 0, scale, torch.ones_like(scale))
    norms = torch.linalg.vector_norm(scaled, dim=1, keepdim=True)
    return torch.where(norms > 0, scaled / norms.clamp_min(1.0), scaled)


def plan_sigma(plan: TaskPlan) -> float | None:
    """The Gaussian noise scale a cosine plan prescribes; None for a non-private plan (no events)."""
    sigma = plan.noise.get("sigma")
    if not plan.events:
        if sigma is not None:
            raise InvalidParameterError("a plan with noise sigma but no privacy events is inconsistent.")
        return None
    if sigma is None:
        raise InvalidParameterError(f"a private cosine plan must give 'sigma' in its noise; got {dict(plan.noise)!r}.")
    sigma = float(sigma)
    if not np.isfinite(sigma) or sigma <= 0:
        raise InvalidParameterError(f"sigma must be > 0 and finite, got {plan.noise['sigma']!r}.")
    return sigma


class CosineClassifier(ContinualMethod):
    """Alg. 1: cumulative noisy per-class sums of normalised features, cosine-similarity prediction."""

    name = "cosine"

    def __init__(self, setup: MethodSetup) -> None:
        super().__init__(setup)
        self.require_encoder_features()
        self.device = torch.device(setup.device)
        self.class_sums = torch.zeros(len(self.label_space), int(setup.input_dim), dtype=torch.float64, device=self.device)

    def planned_work(self, plan: TaskPlan) -> int:
        return 1

    def learn_task(self, task: TrainingTask, progress: ProgressCallback | None = None) -> None:
        sigma = plan_sigma(task.plan)
        data = task.data
        if data.features.shape[1] != self.class_sums.shape[1]:
            raise InvalidParameterError(
                f"task {task.index} features have dimension {data.features.shape[1]}, "
                f"the classifier was built for {self.class_sums.shape[1]}."
            )
        rows = torch.as_tensor(self.label_positions(task.output_labels), device=self.device)
        labels = np.asarray(data.labels, dtype=np.int64)
        task_labels = np.asarray(task.output_labels, dtype=np.int64)
        # row of each example inside this task's |O_t| x K release
        order = np.argsort(task_labels)
        example_rows = torch.as_tensor(order[np.searchsorted(task_labels[order], labels)], device=self.device)
        features = normalise_rows(torch.tensor(np.asarray(data.features), dtype=torch.float64, device=self.device))
        release = torch.zeros(rows.numel(), self.class_sums.shape[1], dtype=torch.float64, device=self.device)
        release.index_add_(0, example_rows, features)
        if sigma is not None:
            noise = self.noise_generator(task.index)
            release += sigma * torch.randn(release.shape, generator=noise, dtype=torch.float64, device=self.device)
        self.class_sums[rows] += release
        if progress is not None:
            progress(1)

    def scores(self, features: np.ndarray) -> np.ndarray:
        """Cosine similarity of each (normalised) feature vector with each class sum (eq. 9)."""
        queries = normalise_rows(torch.tensor(np.asarray(features), dtype=torch.float64, device=self.device))
        return (queries @ normalise_rows(self.class_sums).T).cpu().numpy()

    def state_dict(self) -> dict[str, Any]:
        return {
            **self._base_state(),
            "class_sums": self.class_sums.detach().cpu().clone(),
            "label_space": list(self.label_space),
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        if list(state["label_space"]) != list(self.label_space):
            raise InvalidParameterError(
                f"checkpoint label space {list(state['label_space'])} differs from this run's {list(self.label_space)}."
            )
        sums = torch.as_tensor(state["class_sums"], dtype=torch.float64)
        if sums.shape != self.class_sums.shape:
            raise InvalidParameterError(f"checkpoint class sums have shape {tuple(sums.shape)}, expected {tuple(self.class_sums.shape)}.")
        self._load_base_state(state)
        self.class_sums = sums.to(self.device)
