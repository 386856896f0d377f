"""DP-SGD training of the PeCL learner: the DP PeCL (``training = "dp_sgd"``) and the DP-SGD baselines.

Both run on the one DP-SGD step engine (:mod:`dpcl.methods.dpsgd_engine`); a strategy's part of a step is a hook
(:mod:`.strategies`).

* The DP PeCL trains the adapters and the head only by DP-SGD (opacus per-example clipping, Poisson sampling
  at the planned rate, exactly the planned steps, noise from the plan). Everything else comes from public data
  or earlier releases (:meth:`ContinualLM.public_scores`): the score table over the vocabulary and its mean are
  computed once from the public corpus under the public pre-trained model, lambda_dyn from that mean, Omega_k's
  activation norm from the public corpus through the released adapter, the label set from the public prior.
  TDP stays as defence in depth with one sigma for every token (from the public mean score), drawn once per
  epoch for every example (the epoch's DP-SGD steps reuse it). Inside a DP-SGD step an example's loss
  (classification, language modelling, unlearning weighted by the public score of its own tokens) depends only
  on that example and public or released state, so its clipped gradient is what DP-SGD accounts; the memory
  regulariser depends on parameters only, and its gradient is added after the noise (post-processing).
* Baselines with ``privacy = "dpsgd"``: noise multiplier from :func:`dpcl.accounting.dpsgd.dpsgd_noise_multiplier`
  or a planned schedule. The EWC Fisher is computed from the *noisy* gradients DP-SGD released; O-LoRA's
  orthogonality penalty is added after the noise; GEM reads its memories only through DP-SGD queries at the
  task's sampling rate and noise multiplier, and projects the noisy task gradient against them.
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np
import torch
from torch import nn

from dpcl.errors import InvalidParameterError, PrivacyViolationError
from dpcl.methods.dpsgd_engine import (
    AccumulateSquaredGradient,
    AddPenaltyGradient,
    DpSgdEngine,
    ProjectGradient,
    StepHook,
    backward_quietly,
    flat_grad,
    poisson_sample,
)
from dpcl.methods.gem import gem_project
from dpcl.methods.pecl.config import _noise_multiplier, baseline_dpsgd_schedule
from dpcl.methods.pecl.model import per_token_lm_loss
from dpcl.methods.pecl.sculpting import dynamic_lambda, memory_regularisation, unlearning_loss_per_sequence

__all__ = ["DpSgdTraining"]

#: chunk of sequences perturbed at once when a DP PeCL epoch draws its noisy embeddings
_PERTURB_CHUNK = 256


class _EmbeddingSchedule(StepHook):
    """An empty Poisson sample still asks for its (empty) embeddings: that keeps the per-epoch TDP draw of a DP
    PeCL on schedule when an epoch starts with an empty sample (the draw comes before the step's noise)."""

    def __init__(self, embed, device: torch.device) -> None:
        self.embed, self.device = embed, device

    def on_empty_sample(self, step: int, engine: DpSgdEngine) -> None:
        with torch.no_grad():
            self.embed(step, torch.zeros(0, dtype=torch.long, device=self.device))


class DpSgdTraining:
    """The DP-SGD part of :class:`~dpcl.methods.pecl.learner.ContinualLM` (a mixin: it uses the learner's model,
    generators and strategy)."""

    def _fit_task_dp(
        self, task_index: int, texts: Sequence[str], labels_np: np.ndarray, output_labels: Sequence[int],
        dpsgd: dict[str, Any],
    ) -> dict[str, Any]:
        """``training = "dp_sgd"``: the private task is read only inside the DP-SGD steps."""
        cfg = self.config
        self.seen[np.asarray(output_labels, dtype=np.int64)] = True  # the public prior, not the data's labels
        self._logit_offset = None
        if cfg.task_softmax:
            allowed = np.zeros(self.n_labels, dtype=bool)
            allowed[np.asarray(output_labels, dtype=np.int64)] = True
            self._logit_offset = torch.as_tensor(np.where(allowed, 0.0, -1e9), dtype=torch.float32, device=self.device)
        record: dict[str, Any] = {"task": task_index, "n_examples": len(texts), "n_trained": len(texts)}
        self._task_generators(task_index)
        public = self.public_scores()
        lam = (dynamic_lambda(public["mean_score"], cfg.lambda_min, cfg.lambda_max) if cfg.dynamic_lambda
               else 0.5 * (cfg.lambda_min + cfg.lambda_max))
        omega_bar = float(np.mean(self.omegas)) if self.omegas else 0.0
        record.update(public_mean_score=public["mean_score"], lambda_dyn=lam, omega_bar=omega_bar)
        if len(texts) == 0:  # nothing read, nothing trained: the previous release is released again
            return self._finish_task(record)
        ids, mask = self._encode(texts)
        y = torch.tensor(labels_np, dtype=torch.int64, device=self.device)
        previous = self.strategy.start_adapter(self, task_index)
        tdp = self._token_dp()
        record.update(self._fit_pecl_dpsgd(ids, mask, y, tdp, previous, lam, omega_bar, dpsgd))
        if tdp is not None:
            record["guarantee"] = tdp.released_guarantee()
            record["guarantee"]["scope"] = "input embeddings (scoped statement, not the checkpoint)"
        # Omega_k (eq. 8): the released adapter's increment x activation norms of the *public* corpus
        record["omega"] = self._task_importance(public["public_ids"], public["public_mask"])
        self.omegas.append(record["omega"])
        return self._finish_task(record)

    def _fit_pecl_dpsgd(self, ids, mask, y, tdp, previous, lam, omega_bar, dpsgd) -> dict[str, Any]:
        """DP-SGD of a DP PeCL task on the adapter + head, with the plan's schedule (opacus, Poisson sampling).

        TDP noise is drawn once per epoch for every example (``steps / epochs``
        DP-SGD steps per epoch); a step's examples use their embeddings of that
        epoch. The unlearning weights come from the public score table.
        """
        cfg = self.config
        n = ids.shape[0]
        steps, q = int(dpsgd["steps"]), float(dpsgd["sample_rate"])
        if steps < cfg.epochs or steps % cfg.epochs:
            raise InvalidParameterError(
                f"the planned {steps} DP-SGD steps are not a whole number of steps per epoch for epochs="
                f"{cfg.epochs}: the plan and the learner disagree."
            )
        steps_per_epoch = steps // cfg.epochs
        public = self.public_scores()
        valid = mask.bool().clone()
        valid[:, 0] = False
        unlearn_scores = torch.where(valid, public["table"][ids], torch.zeros((), device=self.device))
        sigma_scores = torch.full(ids.shape, public["mean_score"], dtype=torch.float32, device=self.device)
        token_sigmas = tdp.sigmas(sigma_scores) if tdp is not None else None
        self._check_token_ids(ids)
        state: dict[str, torch.Tensor | None] = {"perturbed": None}

        def embed(step: int, idx: torch.Tensor) -> torch.Tensor:
            if tdp is None:
                return self.embedding(ids[idx])
            if step % steps_per_epoch == 0:  # a new epoch: every example's tokens perturbed afresh, once
                tdp.record_epoch(sigma_scores, mask)
                state["perturbed"] = torch.cat([
                    tdp.embed_and_perturb(self.embedding.weight, ids[c : c + _PERTURB_CHUNK],
                                          token_sigmas[c : c + _PERTURB_CHUNK], self.noise_generator,
                                          ids_checked=True)
                    for c in range(0, n, _PERTURB_CHUNK)
                ])
            return state["perturbed"][idx]

        def extra(idx: torch.Tensor, tok_loss: torch.Tensor, b_mask: torch.Tensor) -> torch.Tensor | None:
            if not (cfg.unlearning and cfg.lambda_unlearn > 0):
                return None
            return cfg.lambda_unlearn * unlearning_loss_per_sequence(unlearn_scores[idx], tok_loss, b_mask, cfg.theta)

        def memory_penalty() -> torch.Tensor:
            return memory_regularisation(self._lora_parameters(self.adapter), previous, lam, omega_bar)

        penalty = memory_penalty if previous is not None and omega_bar > 0 else None

        run = self._dpsgd_steps(
            ids, mask, y, noise_multiplier=float(dpsgd["noise_multiplier"]), sample_rate=q, steps=steps,
            max_grad_norm=float(dpsgd["max_grad_norm"]), embed=embed, extra_loss=extra, penalty=penalty,
        )
        record = {
            "dpsgd": {
                "noise_multiplier": float(dpsgd["noise_multiplier"]),
                "sample_rate": q,
                "steps": steps,
                "max_grad_norm": float(dpsgd["max_grad_norm"]),
                "delta": cfg.delta,
                **run,
            }
        }
        if tdp is not None:
            record["tdp_sigma"] = float(token_sigmas.flatten()[0]) if token_sigmas.numel() else None
        return record

    def _dpsgd_steps(
        self, ids, mask, y, *, noise_multiplier: float, sample_rate: float, steps: int, max_grad_norm: float,
        embed, extra_loss=None, penalty=None, fisher: list[torch.Tensor] | None = None,
        memories: Sequence[tuple[Sequence[str], np.ndarray]] = (),
    ) -> dict[str, Any]:
        """``steps`` DP-SGD steps on the trainable parameters (opacus per-example clipping and noise).

        Each step draws a Poisson sample at ``sample_rate`` from the secret
        sampling generator (empty samples still release a noise-only step);
        ``embed(step, idx)`` gives the sampled examples' input embeddings,
        ``extra_loss(idx, token_loss, mask)`` an optional per-example loss term,
        ``penalty()`` an optional parameter-only loss whose gradient is added after
        the noise (it depends on no private example). ``memories`` (GEM) are
        earlier tasks' examples: at every step each memory is Poisson-sampled at
        ``sample_rate`` and its gradient released by the same DP-SGD query
        (clipping, ``noise_multiplier``); the noisy task gradient is projected
        against those noisy memory gradients (:func:`dpcl.methods.gem.gem_project`,
        post-processing). Returns the counts of steps run, empty steps, examples
        sampled and GEM projections.
        """
        from opacus import GradSampleModule
        from opacus.optimizers import DPOptimizer

        n = ids.shape[0]
        params = self._trainable()
        gsm = GradSampleModule(self.model)
        opt = DPOptimizer(
            torch.optim.AdamW(self._param_groups()),
            noise_multiplier=noise_multiplier,
            max_grad_norm=max_grad_norm,
            expected_batch_size=max(1, round(sample_rate * n)),
            generator=self.noise_generator,
        )
        memory_queries = []
        for texts, labels in memories:  # one DP-SGD query per memory, its expected sample size q * m
            m_ids, m_mask = self._encode(texts)
            m_y = torch.as_tensor(labels, dtype=torch.int64, device=self.device)
            query = DPOptimizer(torch.optim.SGD(params, lr=0.0), noise_multiplier=noise_multiplier,
                                max_grad_norm=max_grad_norm, expected_batch_size=max(1, round(sample_rate * len(texts))),
                                generator=self.noise_generator)
            memory_queries.append((m_ids, m_mask, m_y, query))
        hooks: list[StepHook] = [_EmbeddingSchedule(embed, self.device)]
        gem = None
        if memory_queries:  # GEM: the noisy task gradient projected against the noisy memory gradients
            gem = ProjectGradient(lambda gradient, step, engine: gem_project(gradient, torch.stack(
                [self._noisy_memory_gradient(gsm, query, params, sample_rate) for query in memory_queries])))
            hooks.append(gem)
        if fisher is not None:
            hooks.append(AccumulateSquaredGradient(fisher, steps))
        if penalty is not None:  # the penalty depends only on earlier releases: post-processing, after the noise
            hooks.append(AddPenaltyGradient(penalty))

        def sample(step: int) -> tuple[torch.Tensor, int]:
            batch = poisson_sample(n, sample_rate, self.sampling_generator, self.device, draw_device="cpu")
            return batch, int(batch.numel())

        def backward(step: int, idx: torch.Tensor) -> None:
            with torch.no_grad():
                emb = embed(step, idx)
            per_example, tok = self._per_example_losses(gsm, emb, ids[idx], mask[idx], y[idx], self._logit_offset)
            more = extra_loss(idx, tok, mask[idx]) if extra_loss is not None else None
            if more is not None:
                per_example = per_example + more
            # GradSampleModule (loss_reduction="mean") multiplies by the actual batch size, so the mean over the
            # batch gives grad_sample = each example's own gradient, which is what gets clipped; the DPOptimizer
            # then divides the noisy sum by the expected batch size
            backward_quietly(per_example.mean())

        gsm.train()
        engine = DpSgdEngine(params, opt, True, sample, backward, hooks, set_to_none=False)
        run = engine.run(steps)
        gsm._close()
        if gem is not None:
            run["gem_projections"] = gem.projections
        return run

    def _per_example_losses(self, gsm, emb, b_ids, b_mask, b_y, logit_offset=None):
        """Each example's classification + language-modelling loss, and its token losses (for an extra term);
        ``logit_offset`` (task_softmax) restricts the classification to the task's public label set."""
        cls_logits, lm_logits = gsm(emb, b_mask)
        tok = per_token_lm_loss(lm_logits, b_ids, b_mask)
        if logit_offset is not None:
            cls_logits = cls_logits + logit_offset
        loss = nn.functional.cross_entropy(cls_logits, b_y, reduction="none") + self.config.lm_weight * (
            tok.sum(1) / b_mask[:, 1:].sum(1).clamp_min(1)
        )
        return loss, tok

    def _per_example_loss(self, gsm, emb, b_ids, b_mask, b_y) -> torch.Tensor:
        return self._per_example_losses(gsm, emb, b_ids, b_mask, b_y)[0]

    def _noisy_memory_gradient(self, gsm, memory_query, params, sample_rate: float) -> torch.Tensor:
        """One DP-SGD query on a GEM memory: Poisson sample at ``sample_rate`` (secret), per-example clipping and
        Gaussian noise by the memory's DPOptimizer; returns the released (noisy) gradient, flat."""
        m_ids, m_mask, m_y, query = memory_query
        query.zero_grad(set_to_none=True)  # the task step's released gradient was read before this call
        take = torch.rand(m_ids.shape[0], generator=self.sampling_generator) < sample_rate
        idx = torch.nonzero(take).flatten().to(self.device)
        if idx.numel() == 0:  # an empty sample still releases noise, as in the task's own steps
            for p in params:
                p.grad_sample = torch.zeros((0, *p.shape), dtype=p.dtype, device=p.device)
        else:
            with torch.no_grad():
                emb = self.embedding(m_ids[idx])
            backward_quietly(self._per_example_loss(gsm, emb, m_ids[idx], m_mask[idx], m_y[idx]).mean())
        query.pre_step()
        row = flat_grad(params)
        query.zero_grad(set_to_none=True)
        return row

    def _fit_dpsgd(self, ids, mask, y, planned: dict[str, Any] | None = None) -> dict[str, Any]:
        """DP-SGD (opacus, Poisson sampling) on the adapter + head of a baseline; noise from dpcl.accounting.

        Without ``planned`` the noise multiplier meets ``dpsgd_epsilon`` for this task's run alone. A
        ``planned`` schedule (``noise_multiplier``, ``sample_rate``, ``steps``, ``max_grad_norm``: e.g. one
        calibrated over the whole stream, ``baseline_dpsgd_plan`` of ``benchmarks/pecl_experiment.py``) is run as
        given, after checking that its sampling rate, steps and clipping are the ones this task trains with.
        """
        cfg = self.config
        n = ids.shape[0]
        sample_rate, steps = baseline_dpsgd_schedule(cfg, n)
        if planned is None:
            noise_multiplier = _noise_multiplier(cfg.dpsgd_epsilon, cfg.delta, sample_rate, steps)
            target = cfg.dpsgd_epsilon
        else:
            trained = {"sample_rate": sample_rate, "steps": steps, "max_grad_norm": cfg.max_grad_norm}
            for key, value in trained.items():
                if planned.get(key) != value:
                    raise PrivacyViolationError(
                        f"the planned DP-SGD {key} = {planned.get(key)!r} differs from the trained {key} = {value!r} "
                        f"({n} examples): what is trained must be what is charged."
                    )
            noise_multiplier = float(planned["noise_multiplier"])
            target = planned.get("target_epsilon", cfg.dpsgd_epsilon)
        params = self._trainable()
        fisher = self.strategy.new_fisher(params)
        penalty = self.strategy.dpsgd_penalty(self)
        run = self._dpsgd_steps(
            ids, mask, y, noise_multiplier=noise_multiplier, sample_rate=sample_rate, steps=steps,
            max_grad_norm=cfg.max_grad_norm, embed=lambda _step, idx: self.embedding(ids[idx]), penalty=penalty,
            fisher=fisher, memories=self.strategy.dpsgd_memories(self),
        )
        self.strategy.after_fit(self, params, fisher)
        return {
            "dpsgd": {
                "noise_multiplier": noise_multiplier,
                "sample_rate": sample_rate,
                "steps": steps,
                "target_epsilon": target,
                "delta": cfg.delta,
                "max_grad_norm": cfg.max_grad_norm,
                **run,
            }
        }
