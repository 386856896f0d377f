"""Privacy-guided memory sculpting (eq. 7-13 of ``000_*``; eq. 8-14 of ``002_*``).

* LoRA increment ``Delta W_j^(k) = B_j^(k) A_j^(k)`` (eq. 7 / 8), one adapter per task;
* task importance ``Omega_k = ||Delta W^(k)||_F * ||x||_2`` (eq. 8 / 9), ``x`` the input
  activations of the adapted layers on task k (mean l2 norm per token);
* ``Omega_bar_k`` the running mean of the importances (eq. 9 / 10). The paper
  averages ``Omega_1..Omega_k``, but ``Omega_k`` needs the task-k update being
  trained; we average the finished tasks ``1..k-1``;
* ``L_reg = lambda_dyn * Omega_bar_k * ||W^(k) - W^(k-1)||_F^2`` (eq. 10 / 11) over the
  LoRA parameters;
* ``lambda_dyn = lambda_max (1 - s_bar_k) + lambda_min s_bar_k`` (eq. 11 / 12), ``s_bar_k``
  the task's mean token score;
* ``L_unlearn = (1/M) sum_i (Score_i - theta) l(t_i) 1[Score_i > theta]`` (eq. 12 / 13),
  added as ``+ lambda_unlearn L_unlearn`` (eq. 13 / 14). As written this term is
  *minimised*, which lowers the loss of the sensitive tokens further (it up-weights
  them); docs/pecl.md discusses the sign and the ablation measures its effect.
"""

from __future__ import annotations

from typing import Iterable

import torch


def dynamic_lambda(mean_score: float, lambda_min: float, lambda_max: float) -> float:
    """Eq. 11 (000) / eq. 12 (002)."""
    return float(lambda_max * (1.0 - mean_score) + lambda_min * mean_score)


def unlearning_loss_per_sequence(
    scores: torch.Tensor, token_loss: torch.Tensor, mask: torch.Tensor, theta: float
) -> torch.Tensor:
    """Eq. 12 (000) / eq. 13 (002) of every sequence -> ``[B]`` (DP-SGD clips each sequence's own gradient).

    ``M`` is the number of (non-padding) tokens of each sequence.
    """
    weight = (scores - theta).clamp_min(0.0)  # (Score - theta) * 1[Score > theta]
    m = mask.to(token_loss.dtype).sum(dim=1).clamp_min(1.0)
    return (weight * token_loss * mask.to(token_loss.dtype)).sum(dim=1) / m


def unlearning_loss(scores: torch.Tensor, token_loss: torch.Tensor, mask: torch.Tensor, theta: float) -> torch.Tensor:
    """Eq. 12 (000) / eq. 13 (002), per sequence then averaged over the batch -> scalar."""
    return unlearning_loss_per_sequence(scores, token_loss, mask, theta).mean()


def drift_penalty(current: Iterable[torch.Tensor], previous: Iterable[torch.Tensor]) -> torch.Tensor:
    """``sum_j ||W_j - W_j^(k-1)||_F^2`` over matching parameter tensors."""
    terms = [torch.sum((c - p) ** 2) for c, p in zip(current, previous)]
    return torch.stack(terms).sum() if terms else torch.zeros(())


def memory_regularisation(
    current: Iterable[torch.Tensor], previous: Iterable[torch.Tensor], lambda_dyn: float, omega_bar: float
) -> torch.Tensor:
    """Eq. 10 (000) / eq. 11 (002)."""
    return lambda_dyn * omega_bar * drift_penalty(current, previous)


@torch.no_grad()
def lora_increment_norm(lora_pairs: Iterable[tuple[torch.Tensor, torch.Tensor]], scaling: float) -> float:
    """``||Delta W||_F`` summed over adapted layers: ``Delta W_j = scaling * B_j A_j`` (eq. 7 / 8)."""
    total = 0.0
    for a, b in lora_pairs:
        total += float(torch.linalg.matrix_norm(scaling * (b @ a)))
    return total


def task_importance(increment_norm: float, mean_activation_norm: float) -> float:
    """Eq. 8 (000) / eq. 9 (002): ``Omega_k = ||Delta W^(k)||_F * ||x||_2``."""
    return float(increment_norm * mean_activation_norm)
