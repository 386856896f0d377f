"""Helpers of the Tobaben et al. method tests: digits split into 5 class-incremental tasks, plans."""

from __future__ import annotations

import functools

import numpy as np
import torch

from dpcl.accounting.events import GaussianEvent, PoissonSampledGaussianEvent, RepeatedEvent
from dpcl.guarantees.method_schema import TaskPlan
from dpcl.methods.base import MethodSetup, TrainingData

# Tests run as 2 xdist workers on 2 cores: one intra-op thread each avoids oversubscription,
# which slows the many tiny per-step kernels of DP-SGD by an order of magnitude.
torch.set_num_threads(1)

TASK_LABELS = ((0, 1), (2, 3), (4, 5), (6, 7), (8, 9))


@functools.lru_cache(maxsize=1)
def digits_split():
    """Digits pixels in [0, 1]; a fixed 75/25 train/test split (seed 0)."""
    from sklearn.datasets import load_digits

    features, labels = load_digits(return_X_y=True)
    features = (features / 16.0).astype(np.float32)
    order = np.random.default_rng(0).permutation(len(labels))
    cut = int(0.75 * len(labels))
    train, test = order[:cut], order[cut:]
    return features[train], labels[train].astype(np.int64), features[test], labels[test].astype(np.int64)


def task_data(features, labels, task_labels) -> TrainingData:
    keep = np.flatnonzero(np.isin(labels, task_labels))
    return TrainingData(features[keep], labels[keep], keep.astype(np.int64))


def setup_for(
    method: dict, *, seed: int = 0, label_space=tuple(range(10)), input_dim: int = 64, reproducible_noise: bool = False
) -> MethodSetup:
    return MethodSetup(method=method, privacy={}, label_space=tuple(label_space), input_dim=input_dim, seed=seed,
                       reproducible_noise=reproducible_noise)


def gaussian_plan(sigma: float | None) -> TaskPlan:
    if sigma is None:
        return TaskPlan(events=(), noise={})
    return TaskPlan(events=(GaussianEvent(sigma=sigma),), noise={"sigma": sigma})


def dpsgd_plan(noise_multiplier: float | None, sample_rate: float, steps: int, max_grad_norm: float = 1.0) -> TaskPlan:
    if noise_multiplier is None:
        return TaskPlan(events=(), noise={"sample_rate": sample_rate, "steps": steps})
    event = RepeatedEvent(PoissonSampledGaussianEvent(noise_multiplier=noise_multiplier, sample_rate=sample_rate), steps)
    return TaskPlan(
        events=(event,),
        noise={"noise_multiplier": noise_multiplier, "sample_rate": sample_rate, "steps": steps, "max_grad_norm": max_grad_norm},
    )
