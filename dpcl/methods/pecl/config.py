"""The options of the PeCL learner (:class:`LearnerConfig`) and the DP-SGD schedule of its baselines.

Which ``privacy`` and ``training`` modes a strategy takes is the strategy's own (:mod:`.strategies`).
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, replace
from typing import Any, Sequence

import numpy as np
import torch

from dpcl.accounting.dpsgd import dpsgd_noise_multiplier
from dpcl.errors import InvalidParameterError
from dpcl.methods.pecl.model import ModelConfig
from dpcl.methods.pecl.strategies import STRATEGIES, strategy

__all__ = [
    "LearnerConfig",
    "PRIVACY_MODES",
    "STRATEGIES",
    "TRAININGS",
    "baseline_dpsgd_schedule",
    "baseline_task_reads",
    "learner_config",
]

PRIVACY_MODES = ("tdp", "dpsgd", "none")
TRAININGS = ("paper", "dp_sgd")


@dataclass(frozen=True)
class LearnerConfig:
    strategy: str = "pecl"
    privacy: str = "tdp"
    #: PeCL only: "paper" (clean targets, private scores; not DP) or "dp_sgd" (DP-SGD, public scores)
    training: str = "paper"
    # model and optimisation
    n_layer: int = 2
    n_embd: int = 64
    n_head: int = 2
    max_seq_len: int = 128
    lora_rank: int = 8
    epochs: int = 1
    batch_size: int = 16
    learning_rate: float = 5e-4
    head_learning_rate: float = 5e-3
    lm_weight: float = 1.0
    pretrain_steps: int = 200
    pretrain_learning_rate: float = 3e-3
    device: str = "cpu"
    #: "" builds the small GPT-2-architecture model; a local directory loads a pre-trained causal LM from it
    pretrained_path: str = ""
    # PeCL (defaults: Zhan et al., implementation details)
    alpha: float = 0.5
    tau: float = 0.2
    theta: float = 0.6
    lambda_unlearn: float = 1.0
    lambda_min: float = 1.0
    lambda_max: float = 10.0
    dynamic_lambda: bool = True
    unlearning: bool = True
    #: DP PeCL: the classification loss of a task is a softmax over the task's public label set only (the
    #: labels of earlier tasks get no gradient pushing them down); prediction still ranks every released label
    task_softmax: bool = False
    epsilon_lower: float = 1.0
    epsilon_upper: float = 10.0
    clip_norm: float = 1.0
    calibration: str = "analytic"
    delta: float = 1e-6
    # baselines
    #: ER's buffer and GEM's episodic memory: examples kept per task
    replay_per_task: int = 16
    ewc_lambda: float = 100.0
    #: O-LoRA's lambda_1 (weight of the orthogonality loss; Wang et al. 2023 use 0.5)
    olora_lambda: float = 0.5
    dpsgd_epsilon: float = 1.0
    max_grad_norm: float = 1.0

    def __post_init__(self) -> None:
        if self.strategy not in STRATEGIES:
            raise InvalidParameterError(f"strategy must be one of {STRATEGIES}, got {self.strategy!r}.")
        if self.privacy not in PRIVACY_MODES:
            raise InvalidParameterError(f"privacy must be one of {PRIVACY_MODES}, got {self.privacy!r}.")
        if self.privacy not in strategy(self.strategy).privacy_modes:
            raise InvalidParameterError(
                "privacy='tdp' is PeCL's mechanism and only PeCL uses it; PeCL takes privacy='tdp' (or 'none' for "
                "the not-private 'w/o TDP' ablation), baselines take privacy='none' or 'dpsgd' "
                f"(got strategy={self.strategy!r}, privacy={self.privacy!r})."
            )
        if self.training not in TRAININGS:
            raise InvalidParameterError(f"training must be one of {TRAININGS}, got {self.training!r}.")
        if self.training not in strategy(self.strategy).trainings:
            raise InvalidParameterError(
                f"training='dp_sgd' is PeCL's DP training; baselines take privacy='dpsgd' (got strategy="
                f"{self.strategy!r})."
            )
        if self.task_softmax is True and not self.dp_pecl:
            raise InvalidParameterError(
                "task_softmax is an option of the DP PeCL (strategy='pecl', training='dp_sgd'); set it to false."
            )
        if self.device not in ("cpu", "cuda"):
            raise InvalidParameterError(f"device must be 'cpu' or 'cuda', got {self.device!r}.")
        if not isinstance(self.pretrained_path, str):
            raise InvalidParameterError(
                f"pretrained_path must be a string (a local directory, or \"\"), got {self.pretrained_path!r}."
            )
        if self.device == "cuda" and not torch.cuda.is_available():
            raise InvalidParameterError("device='cuda' was requested but torch sees no CUDA device; use 'cpu'.")
        self._check_numbers()

    def _check_numbers(self) -> None:
        """Every numeric option in its allowed range (a typed error naming it, never a silent run)."""
        minimum_int = {"n_layer": 1, "n_embd": 1, "n_head": 1, "max_seq_len": 2, "lora_rank": 1, "epochs": 1,
                       "batch_size": 1, "pretrain_steps": 1, "replay_per_task": 0}
        for name, low in minimum_int.items():
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < low:
                raise InvalidParameterError(f"{name} must be an integer >= {low}, got {value!r}.")
        for name in ("dynamic_lambda", "unlearning", "task_softmax"):
            if not isinstance(getattr(self, name), bool):
                raise InvalidParameterError(f"{name} must be true or false, got {getattr(self, name)!r}.")
        # name -> (lowest, highest, lowest allowed itself, highest allowed itself, what is allowed)
        ranges = {
            "learning_rate": (0.0, math.inf, True, False, ">= 0"),
            "head_learning_rate": (0.0, math.inf, True, False, ">= 0"),
            "pretrain_learning_rate": (0.0, math.inf, True, False, ">= 0"),
            "lm_weight": (0.0, math.inf, True, False, ">= 0"),
            "alpha": (0.0, 1.0, True, True, "in [0, 1]"),
            "tau": (0.0, 1.0, False, False, "in (0, 1)"),
            "theta": (0.0, 1.0, True, False, "in [0, 1)"),
            "lambda_unlearn": (0.0, math.inf, True, False, ">= 0"),
            "lambda_min": (0.0, math.inf, True, False, ">= 0"),
            "lambda_max": (0.0, math.inf, True, False, ">= 0"),
            "epsilon_lower": (0.0, math.inf, False, False, "> 0"),
            "epsilon_upper": (0.0, math.inf, False, False, "> 0"),
            "clip_norm": (0.0, math.inf, False, False, "> 0"),
            "delta": (0.0, 1.0, False, False, "in (0, 1)"),
            "ewc_lambda": (0.0, math.inf, True, False, ">= 0"),
            "olora_lambda": (0.0, math.inf, True, False, ">= 0"),
            "dpsgd_epsilon": (0.0, math.inf, False, False, "> 0"),
            "max_grad_norm": (0.0, math.inf, False, False, "> 0"),
        }
        for name, (low, high, low_ok, high_ok, allowed) in ranges.items():
            value = getattr(self, name)
            ok = (
                not isinstance(value, bool)
                and isinstance(value, (int, float, np.integer, np.floating))
                and math.isfinite(value)
                and (value > low or (low_ok and value == low))
                and (value < high or (high_ok and value == high))
            )
            if not ok:
                raise InvalidParameterError(f"{name} must be a finite number {allowed}, got {value!r}.")
        if self.lambda_min > self.lambda_max:
            raise InvalidParameterError(
                f"lambda_min must be <= lambda_max (eq. 11: the weakest and strongest regularisation), got "
                f"lambda_min={self.lambda_min!r} > lambda_max={self.lambda_max!r}."
            )
        if not self.pretrained_path and self.n_embd % self.n_head:
            raise InvalidParameterError(
                f"n_embd must be divisible by n_head (each attention head takes n_embd / n_head dimensions), got "
                f"n_embd={self.n_embd!r}, n_head={self.n_head!r}."
            )
        if self.epsilon_lower > self.epsilon_upper:
            raise InvalidParameterError(
                f"epsilon_lower must be <= epsilon_upper (eq. 4), got epsilon_lower={self.epsilon_lower!r} > "
                f"epsilon_upper={self.epsilon_upper!r}."
            )

    @property
    def model(self) -> ModelConfig:
        return ModelConfig(self.n_layer, self.n_embd, self.n_head, self.max_seq_len)

    @property
    def dp_pecl(self) -> bool:
        """The DP PeCL (``training = "dp_sgd"``, which only PeCL takes): its checkpoint is trained by DP-SGD."""
        return self.training == "dp_sgd"




@functools.lru_cache(maxsize=64)
def _noise_multiplier(epsilon: float, delta: float, sample_rate: float, steps: int) -> float:
    """DP-SGD noise multiplier for (epsilon, delta) after ``steps`` Poisson steps (cached: calibration is costly)."""
    return float(dpsgd_noise_multiplier(epsilon, delta, sample_rate, steps).noise_multiplier)


def baseline_dpsgd_schedule(config: LearnerConfig, n_trained: int) -> tuple[float, int]:
    """(sample_rate, steps) of a DP-SGD baseline task training on ``n_trained`` examples: Poisson sampling at
    ``batch_size / n_trained``, ``epochs`` expected passes."""
    sample_rate = min(1.0, config.batch_size / n_trained)
    return sample_rate, max(1, config.epochs * math.ceil(1.0 / sample_rate))


def baseline_task_reads(config: LearnerConfig, task_sizes: Sequence[int]) -> list[tuple[tuple[int, ...], int]]:
    """Per task of a stream of ``task_sizes`` examples: the tasks whose data its training reads, and how many
    examples its DP-SGD run samples from (what :meth:`ContinualLM.fit_task` will do, known before training).

    ER trains task k on its own examples and the buffer, ``min(replay_per_task, n_j)`` examples of every
    earlier task j; GEM queries the memory of every earlier task (the same number kept) at task k's sampling
    rate and steps, its own run sampling from task k alone. The other strategies read their own task.
    """
    sizes = [int(n) for n in task_sizes]
    chosen = strategy(config.strategy)
    kept = [min(config.replay_per_task, n) if chosen.keeps_examples else 0 for n in sizes]
    out = []
    for k, n in enumerate(sizes):
        earlier = tuple(j for j in range(k) if kept[j] > 0)
        n_trained = n + sum(kept[j] for j in earlier) if chosen.trains_on_kept else n
        out.append((earlier + (k,), n_trained))
    return out


def _check_encoder_options(config: LearnerConfig) -> None:
    """Refuse the PeCL options that need a next-token distribution, which an encoder does not have."""
    if not strategy(config.strategy).needs_next_token:
        return
    if config.alpha > 0:
        raise InvalidParameterError(
            f"alpha = {config.alpha!r}: Score_1 (eq. 2) is the model's surprise at each token, from a causal LM's "
            "next-token distribution; an encoder has none. Set alpha = 0 (the score is then Score_2 alone)."
        )
    if config.unlearning and config.lambda_unlearn > 0:
        raise InvalidParameterError(
            "unlearning = true: the privacy-aware unlearning loss (eq. 13) raises the language-modelling loss of "
            "sensitive tokens; an encoder generates no tokens. Set unlearning = false."
        )


def learner_config(**overrides: Any) -> LearnerConfig:
    """A :class:`LearnerConfig` with ``overrides`` (unknown keys raise InvalidParameterError)."""
    known = set(LearnerConfig.__dataclass_fields__)
    unknown = sorted(set(overrides) - known)
    if unknown:
        raise InvalidParameterError(f"unknown learner option(s) {unknown}; known: {sorted(known)}.")
    return replace(LearnerConfig(), **overrides)
