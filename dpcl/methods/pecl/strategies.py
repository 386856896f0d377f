"""The continual-learning strategies of the PeCL learner, as objects with hooks (Zhan et al., Sec. "Baselines").

:class:`~dpcl.methods.pecl.learner.ContinualLM` runs one code path; a strategy decides, at fixed points of a
task, what differs (as Avalanche's strategy plugins do on its training loop):

* ``pecl`` (:class:`PeCL`) -- token-level dynamic DP on the input embeddings (:mod:`.tdp`) plus
  privacy-guided memory sculpting (:mod:`.sculpting`): one LoRA adapter per task (initialised from the
  previous one), memory regularisation with lambda_dyn and the privacy-aware unlearning loss;
* ``seqft`` (:class:`Strategy`) -- sequential fine-tuning of one LoRA adapter + head;
* ``er`` (:class:`ExperienceReplay`) -- experience replay (Rolnick et al. 2019): a buffer of
  ``replay_per_task`` examples of every past task is mixed into each new task;
* ``ewc`` (:class:`EWC`) -- elastic weight consolidation (Kirkpatrick et al. 2017) with a diagonal Fisher of
  the adapter + head: the squared mini-batch gradients of the task's own loss (not of the EWC penalty of
  earlier tasks), averaged over the task's training steps;
* ``olora`` (:class:`OLoRA`) -- O-LoRA (Wang et al. 2023): a fresh LoRA adapter per task, the earlier tasks'
  adapters frozen and summed with it at inference, and an orthogonality penalty between the new adapter's
  subspace and the old ones (:mod:`dpcl.methods.olora`);
* ``gem`` (:class:`GEM`) -- gradient episodic memory (Lopez-Paz & Ranzato 2017): a memory of
  ``replay_per_task`` examples of every earlier task; an update whose gradient would raise a memory's loss
  is projected (:mod:`dpcl.methods.gem`);
* ``mtl`` -- multi-task learning on the union of all tasks (upper reference; the caller hands it the union).

Under DP-SGD a strategy's part of a step is a hook on the one DP-SGD engine
(:mod:`dpcl.methods.dpsgd_engine`): EWC's Fisher from the released gradients and its penalty's gradient added
after the noise, O-LoRA's penalty likewise, GEM's projection against noisy memory gradients.

A strategy object holds no state of its own: the buffer, memories, Fisher terms and Omega values live on the
learner (they are what it releases or keeps between tasks).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar, Sequence

import numpy as np
import torch

from dpcl.methods.dpsgd_engine import flat_grad, set_flat_grad
from dpcl.methods.gem import gem_project
from dpcl.methods.olora import orthogonality_loss
from dpcl.methods.pecl.sculpting import dynamic_lambda, memory_regularisation, unlearning_loss

__all__ = ["EWC", "GEM", "OLoRA", "PeCL", "STRATEGIES", "ExperienceReplay", "Strategy", "TaskContext", "strategy"]


@dataclass
class TaskContext:
    """What a task's training reads besides its data: PeCL's token scores, lambda_dyn, mean Omega and the
    previous adapter W^(k-1) (None for the other strategies)."""

    scores: torch.Tensor | None = None
    lam: float = 0.0
    omega_bar: float = 0.0
    previous: list[torch.Tensor] | None = None


class Strategy:
    """Sequential fine-tuning (``seqft``; ``mtl`` is the same learner on the union of the tasks). Every hook is
    a no-op here; a strategy overrides the ones it needs."""

    name: ClassVar[str] = "seqft"
    #: ``privacy`` modes the strategy takes, and ``training`` modes
    privacy_modes: ClassVar[tuple[str, ...]] = ("none", "dpsgd")
    trainings: ClassVar[tuple[str, ...]] = ("paper",)
    #: keeps ``replay_per_task`` examples of every task (ER's buffer, GEM's memory), and trains later tasks on
    #: them (ER) rather than only querying them (GEM)
    keeps_examples: ClassVar[bool] = False
    trains_on_kept: ClassVar[bool] = False
    #: needs a next-token distribution (Score_1, the unlearning loss): refused on an encoder
    needs_next_token: ClassVar[bool] = False

    # -- before the task ---------------------------------------------------------------------------------
    def start_adapter(self, learner: Any, task_index: int) -> list[torch.Tensor] | None:
        """Prepare the adapter task ``task_index`` trains; returns the previous adapter's weights, or None."""
        return None

    def training_set(self, learner: Any, texts: Sequence[str], labels: np.ndarray) -> tuple[list[str], np.ndarray]:
        """The examples the task trains on (its own, and ER's buffer)."""
        return list(texts), labels

    def prepare(self, learner: Any, ids: torch.Tensor, mask: torch.Tensor, record: dict[str, Any]) -> TaskContext:
        return TaskContext()

    # -- one step of the non-private training ---------------------------------------------------------------
    def loss_terms(self, learner: Any, ctx: TaskContext, loss: torch.Tensor, tok_loss: torch.Tensor,
                   idx: torch.Tensor, b_mask: torch.Tensor, terms: dict[str, float]) -> torch.Tensor:
        """The batch loss with the strategy's terms added (``terms`` records each term's value)."""
        return loss

    def new_fisher(self, params: Sequence[torch.Tensor]) -> list[torch.Tensor] | None:
        return None

    def after_backward(self, learner: Any, params: Sequence[torch.Tensor], fisher: list[torch.Tensor] | None,
                       batches_per_epoch: int, terms: dict[str, float]) -> None:
        """The batch gradient is in ``p.grad``; the optimiser steps next."""

    # -- DP-SGD -----------------------------------------------------------------------------------------------
    def dpsgd_penalty(self, learner: Any):
        """A parameter-only penalty whose gradient the DP-SGD engine adds after the noise, or None."""
        return None

    def dpsgd_memories(self, learner: Any) -> Sequence[tuple[Sequence[str], np.ndarray]]:
        """Memories the DP-SGD step queries (GEM), each read only through a DP-SGD query."""
        return ()

    # -- after the task ---------------------------------------------------------------------------------------
    def after_fit(self, learner: Any, params: Sequence[torch.Tensor], fisher: list[torch.Tensor] | None) -> None:
        """The task's parameters are trained (EWC keeps its Fisher and anchor)."""

    def after_task(self, learner: Any, texts: Sequence[str], labels: np.ndarray, ids: torch.Tensor,
                   mask: torch.Tensor, record: dict[str, Any]) -> None:
        """The task is released (PeCL's Omega_k, ER's buffer, GEM's memory)."""


class _KeepsExamples(Strategy):
    keeps_examples = True

    def after_task(self, learner, texts, labels, ids, mask, record) -> None:
        keep = torch.randperm(len(texts), generator=learner.generator)[: learner.config.replay_per_task].numpy()
        self.keep(learner, texts, labels, keep)

    def keep(self, learner: Any, texts: Sequence[str], labels: np.ndarray, keep: np.ndarray) -> None:
        raise NotImplementedError


class ExperienceReplay(_KeepsExamples):
    name = "er"
    trains_on_kept = True

    def training_set(self, learner, texts, labels):
        if not learner.buffer_texts:
            return list(texts), labels
        return (list(texts) + learner.buffer_texts,
                np.concatenate([labels, np.asarray(learner.buffer_labels, dtype=np.int64)]))

    def keep(self, learner, texts, labels, keep) -> None:
        learner.buffer_texts.extend(texts[i] for i in keep)
        learner.buffer_labels.extend(int(labels[i]) for i in keep)


class GEM(_KeepsExamples):
    name = "gem"

    def after_backward(self, learner, params, fisher, batches_per_epoch, terms) -> None:
        if learner.memories:
            gradient = flat_grad(params)
            projected = gem_project(gradient, learner._memory_gradients(params))
            terms["gem_projected"] = float(projected is not gradient)
            set_flat_grad(params, projected)

    def dpsgd_memories(self, learner):
        return learner.memories

    def keep(self, learner, texts, labels, keep) -> None:
        if keep.size:
            learner.memories.append(([texts[i] for i in keep], labels[keep].copy()))


class EWC(Strategy):
    name = "ewc"

    def new_fisher(self, params):
        return [torch.zeros_like(p) for p in params]

    def after_backward(self, learner, params, fisher, batches_per_epoch, terms) -> None:
        # Fisher of this task's loss: taken before the EWC penalty's gradient is added
        for f, p in zip(fisher, params):
            f += p.grad.detach() ** 2 / batches_per_epoch / learner.config.epochs
        if learner.ewc_terms:
            penalty = learner._ewc_penalty()
            penalty.backward()
            terms["ewc"] = float(penalty.detach())

    def dpsgd_penalty(self, learner):
        return learner._ewc_penalty if learner.ewc_terms else None

    def after_fit(self, learner, params, fisher) -> None:
        learner.ewc_terms.append((fisher, [p.detach().clone() for p in params]))


class OLoRA(Strategy):
    name = "olora"

    def start_adapter(self, learner, task_index):
        """A fresh adapter for this task, summed with the frozen adapters of the earlier tasks."""
        if task_index == 0:
            return None
        name = f"task_{task_index}"
        peft_lm = learner._peft()
        with torch.random.fork_rng(devices=[]):  # peft draws lora_A from the global RNG: seeded, caller untouched
            torch.manual_seed(learner.seed + 1 + task_index)
            peft_lm.add_adapter(name, learner.lora_config)
        active = [f"task_{k}" for k in range(task_index + 1)]
        peft_lm.base_model.set_adapter(active)  # every listed adapter's output is added (LoraLayer.forward)
        for n, p in peft_lm.named_parameters():
            p.requires_grad_("lora_" in n and f".{name}." in n)
        learner.adapter = name
        return None

    @staticmethod
    def penalty(learner: Any) -> torch.Tensor | None:
        """lambda_1 L_orth of the current adapter against every earlier task's (None for task 0 or lambda_1 = 0)."""
        index = int(learner.adapter.split("_")[1])
        if index == 0 or learner.config.olora_lambda == 0:
            return None
        earlier = [learner._lora_a(f"task_{k}") for k in range(index)]
        return learner.config.olora_lambda * orthogonality_loss(learner._lora_a(learner.adapter), earlier)

    def loss_terms(self, learner, ctx, loss, tok_loss, idx, b_mask, terms):
        orth = self.penalty(learner)
        if orth is not None:
            loss = loss + orth
            terms["orth"] = float(orth.detach())
        return loss

    def dpsgd_penalty(self, learner):
        return (lambda: self.penalty(learner)) if self.penalty(learner) is not None else None


class PeCL(Strategy):
    name = "pecl"
    privacy_modes = ("tdp", "none")
    trainings = ("paper", "dp_sgd")
    needs_next_token = True

    def start_adapter(self, learner, task_index):
        """A new adapter per task, initialised from the previous one; returns W^(k-1)."""
        if task_index == 0:
            return None
        previous = learner.adapter
        name = f"task_{task_index}"
        peft_lm = learner._peft()
        with torch.random.fork_rng(devices=[]):  # its initial weights are overwritten just below
            peft_lm.add_adapter(name, learner.lora_config)
        with torch.no_grad():
            for src, dst in zip(learner._lora_parameters(previous), learner._lora_parameters(name)):
                dst.copy_(src)
        peft_lm.set_adapter(name)
        for n, p in peft_lm.named_parameters():
            p.requires_grad_("lora_" in n and f".{name}." in n)
        learner.adapter = name
        return [p.detach().clone() for p in learner._lora_parameters(previous)]

    def prepare(self, learner, ids, mask, record) -> TaskContext:
        """The paper's training: scores from the task's text (eq. 1-3), lambda_dyn from their mean (eq. 11)."""
        cfg = learner.config
        learner.token_stats.add_task(ids.cpu().numpy(), mask.cpu().numpy())
        scores = learner.token_scores(ids, mask)
        valid = mask.bool().clone()
        valid[:, 0] = False
        mean_score = float(scores[valid].mean()) if bool(valid.any()) else 0.0
        lam = (dynamic_lambda(mean_score, cfg.lambda_min, cfg.lambda_max) if cfg.dynamic_lambda
               else 0.5 * (cfg.lambda_min + cfg.lambda_max))
        omega_bar = float(np.mean(learner.omegas)) if learner.omegas else 0.0
        record.update(mean_score=mean_score, lambda_dyn=lam, omega_bar=omega_bar)
        return TaskContext(scores, lam, omega_bar)

    def loss_terms(self, learner, ctx, loss, tok_loss, idx, b_mask, terms):
        cfg = learner.config
        if ctx.previous is not None and ctx.omega_bar > 0:
            reg = memory_regularisation(learner._lora_parameters(learner.adapter), ctx.previous, ctx.lam,
                                        ctx.omega_bar)
            loss = loss + reg
            terms["reg"] = float(reg.detach())
        if cfg.unlearning and cfg.lambda_unlearn > 0:
            unl = unlearning_loss(ctx.scores[idx], tok_loss, b_mask, cfg.theta)
            loss = loss + cfg.lambda_unlearn * unl
            terms["unlearn"] = float(unl.detach())
        return loss

    def after_task(self, learner, texts, labels, ids, mask, record) -> None:
        record["omega"] = learner._task_importance(ids, mask)
        learner.omegas.append(record["omega"])


#: ``strategy`` name -> its class (``mtl`` trains as ``seqft`` does, on the union the caller hands it)
_CLASSES: dict[str, type[Strategy]] = {
    "pecl": PeCL, "seqft": Strategy, "er": ExperienceReplay, "ewc": EWC, "olora": OLoRA, "gem": GEM, "mtl": Strategy,
}
STRATEGIES: tuple[str, ...] = tuple(_CLASSES)


def strategy(name: str) -> Strategy:
    """The strategy object of ``name`` (one of :data:`STRATEGIES`)."""
    return _CLASSES[name]()
