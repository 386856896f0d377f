"""Continual learner on a small causal LM: PeCL and the paper's baselines on one code path.

The strategies (``pecl``, ``seqft``, ``er``, ``ewc``, ``olora``, ``gem``, ``mtl``; Zhan et al., Sec.
"Baselines") are objects with hooks, :mod:`.strategies`; PeCL with ``privacy="none"`` (sculpting on clean
embeddings, not private) is the "w/o TDP" ablation of the paper's Table 2.

PeCL has two trainings (``training``): ``"paper"`` -- as in the paper: adapters and head trained on the clean
private targets and labels, scores from the private text (token counts of the tasks, model surprise),
lambda_dyn from the task's mean score, Omega_k from the task's clean text; only the perturbed input embeddings
have a (per-token) guarantee, the checkpoint is not DP. ``"dp_sgd"`` -- a DP checkpoint, trained only by DP-SGD
with every other input public or released (:mod:`.dp_training`). Baselines run without DP
(``privacy="none"``) or with DP-SGD (``"dpsgd"``, :mod:`.dp_training`); a planned schedule
(``fit_task(..., dpsgd=...)``; :func:`baseline_task_reads` says which tasks each run reads and on how many
examples) replaces the per-task calibration: the PeCL table calibrates ER and GEM on the whole stream
(``baseline_dpsgd_plan`` of ``benchmarks/pecl_experiment.py``).

Every strategy starts from the same language model pre-trained on a public
corpus (fortune categories outside the task stream), whose token embeddings and
transformer weights are then frozen: only LoRA adapters on the attention
projections and the classification head are trained on the private tasks.
The task loss is the classification cross-entropy plus the language-modelling
loss of the task text (weight ``lm_weight``), as in the paper's generative
formulation; the latter is what canary exposure measures.

With ``pretrained_path`` set, the language model and its tokenizer are loaded
from that local directory (:func:`.model.load_pretrained_causal_lm`, or
:func:`.model.load_pretrained_encoder` for a BERT-like encoder, the kind read
from its config.json; ``"minilm"`` names the installed MiniLM; nothing
downloaded) instead of being built and pre-trained here: the public
pre-training step is skipped (the loaded weights are taken as the public
pre-trained model; ``n_layer``/``n_embd``/``n_head``/``pretrain_*`` are then
unused). LoRA targets peft's default attention projections for the model's
architecture (``c_attn`` for GPT-2, ``query``/``value`` for BERT); TDP clips and perturbs the model's input
embeddings whatever their width. An encoder has no next-token distribution: the task loss is the
classification loss alone, Score_1 and the unlearning loss are refused (``alpha = 0``,
``unlearning = false``), and :meth:`ContinualLM.sequence_nll` (canary exposure) refuses.

The head reads the mean-pooled last hidden states centred and scaled with the
public corpus' statistics under the public model
(:meth:`.model.LMClassifier.set_feature_statistics`): read raw, their common
component made every prediction the same label.
"""

from __future__ import annotations

import math
from dataclasses import asdict
from typing import Any, Sequence

import numpy as np
import torch
from torch import nn

from dpcl.errors import InvalidParameterError
from dpcl.methods.noise_source import noise_torch_generator
from dpcl.methods.pecl.config import (  # noqa: F401  (re-exported: the learner's options and schedules)
    PRIVACY_MODES,
    STRATEGIES,
    TRAININGS,
    LearnerConfig,
    _check_encoder_options,
    baseline_dpsgd_schedule,
    baseline_task_reads,
    learner_config,
)
from dpcl.methods.pecl.dp_training import DpSgdTraining
from dpcl.methods.pecl.model import (
    LMClassifier,
    build_causal_lm,
    hidden_size,
    load_pretrained_causal_lm,
    load_pretrained_encoder,
    per_token_lm_loss,
    pretrained_kind,
    resolve_pretrained_path,
)
from dpcl.methods.pecl.scoring import Scoring
from dpcl.methods.pecl.sculpting import lora_increment_norm, task_importance
from dpcl.methods.pecl.sensitivity import TaskTokenStatistics
from dpcl.methods.pecl.strategies import OLoRA, TaskContext, strategy
from dpcl.methods.pecl.tdp import TokenDP
from dpcl.methods.pecl.tokenizer import ByteTokenizer, load_pretrained_tokenizer

#: In-process cache of pre-trained public models (pre-training reads only public text).
_PRETRAINED: dict[tuple, tuple[dict[str, torch.Tensor], float, torch.Tensor]] = {}
#: In-process cache of a loaded public model's pooled features of the public corpus (the head's standardisation:
#: public data under the public model, the same for every run; LoRA starts at zero increment)
_FEATURE_STATISTICS: dict[tuple, torch.Tensor] = {}
#: distinct lists of texts whose tokenisation a learner keeps (the tasks' training and test sets)
_ENCODED_LISTS = 64


def _batches(n: int, batch_size: int, generator: torch.Generator) -> list[torch.Tensor]:
    order = torch.randperm(n, generator=generator)
    return list(torch.split(order, batch_size))


class ContinualLM(DpSgdTraining, Scoring):
    """One continual learner (PeCL or a baseline) over a public label space of ``n_labels`` classes; its
    ``config.strategy`` is an object with hooks (:mod:`.strategies`), its DP-SGD training runs on the one
    DP-SGD step engine (:mod:`.dp_training`)."""

    def __init__(
        self, n_labels: int, config: LearnerConfig, seed: int, public_texts: Sequence[str],
        reproducible_noise: bool = False, public_labels: Sequence[int] | None = None,
    ) -> None:
        if n_labels < 1:
            raise InvalidParameterError(f"n_labels must be >= 1, got {n_labels}.")
        self.config = config
        #: the strategy's hooks (:mod:`.strategies`); its state (buffer, memories, Fisher terms, Omega) lives here
        self.strategy = strategy(config.strategy)
        self.n_labels = int(n_labels)
        self.seed = int(seed)
        #: False (default): token noise, DP-SGD noise and Poisson masks come from OS entropy
        #: (dpcl.methods.noise_source); True: from ``seed`` (research reproducibility only).
        self.reproducible_noise = bool(reproducible_noise)
        self.device = torch.device(config.device)
        self.generator = torch.Generator().manual_seed(self.seed)
        self._encoded: dict[tuple[str, ...], tuple[torch.Tensor, torch.Tensor]] = {}
        #: privacy generators, fresh for every task in :meth:`fit_task`; never checkpointed
        self.noise_generator: torch.Generator | None = None
        self.sampling_generator: torch.Generator | None = None
        lm = self._public_language_model(public_texts)
        for p in lm.parameters():
            p.requires_grad_(False)
        from peft import LoraConfig, get_peft_model

        gpt2_like = not config.pretrained_path or getattr(lm.config, "model_type", "") == "gpt2"
        self.lora_config = LoraConfig(
            r=config.lora_rank,
            lora_alpha=2 * config.lora_rank,
            # GPT-2's fused attention projection (a Conv1D, hence fan_in_fan_out); other architectures: peft's
            # default attention targets for their model type
            target_modules=["c_attn"] if gpt2_like else None,
            fan_in_fan_out=gpt2_like,
            lora_dropout=0.0,
        )
        self.adapter = "task_0"
        # LoRA and the head are initialised from ``seed`` (peft draws from the global RNG), without touching
        # the caller's global RNG: a method's initialisation does not depend on what ran before it
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(self.seed + 1)
            peft_lm = get_peft_model(lm, self.lora_config, adapter_name=self.adapter)
            torch.manual_seed(self.seed + 2)
            self.model = LMClassifier(peft_lm, hidden_size(lm), self.n_labels,
                                      generative=self.model_kind != "encoder").to(self.device)
        self.embedding = lm.get_input_embeddings()
        #: task_softmax: 0 on the current task's public labels, -1e9 elsewhere, added to the training logits
        self._logit_offset: torch.Tensor | None = None
        self.public_texts = list(public_texts)
        self._standardise_head_input()
        self.seen = np.zeros(self.n_labels, dtype=bool)
        self.tasks_fitted = 0
        # PeCL state
        self.token_stats = TaskTokenStatistics(
            max(self.tokenizer.vocab_size, self.embedding.num_embeddings), self.tokenizer.special_ids, config.tau
        )
        self.omegas: list[float] = []
        self.task_records: list[dict[str, Any]] = []
        #: public corpus (self.public_texts; dp_sgd: source of the score table, lambda_dyn and Omega's activation
        #: norms; every strategy: the head's input standardisation)
        self.public_labels = None if public_labels is None else np.asarray(public_labels, dtype=np.int64)
        if self.public_labels is not None and self.public_labels.shape != (len(self.public_texts),):
            raise InvalidParameterError(
                f"public_labels must give one label per public text ({len(self.public_texts)}), got shape "
                f"{self.public_labels.shape}."
            )
        self._public_scores: dict[str, Any] | None = None
        if config.dp_pecl:
            self.public_scores()  # before any private task: a function of public data and the public model only
        # baseline state
        self.buffer_texts: list[str] = []
        self.buffer_labels: list[int] = []
        #: GEM's episodic memories, one (texts, labels) per earlier task
        self.memories: list[tuple[list[str], np.ndarray]] = []
        self.ewc_terms: list[tuple[list[torch.Tensor], list[torch.Tensor]]] = []

    def _public_language_model(self, public_texts: Sequence[str]) -> nn.Module:
        """The public language model: loaded from ``pretrained_path`` (its tokenizer too), or the small GPT-2
        model built here and pre-trained on ``public_texts`` (cached per corpus and seed in the process)."""
        config = self.config
        #: "built" (the small GPT-2 model pre-trained here), or a loaded "causal" LM or "encoder"
        self.model_kind = "built"
        if config.pretrained_path:
            path = resolve_pretrained_path(config.pretrained_path)
            self.model_kind = pretrained_kind(path)
            if self.model_kind == "encoder":
                _check_encoder_options(config)
            self.tokenizer = load_pretrained_tokenizer(path)
            load = load_pretrained_encoder if self.model_kind == "encoder" else load_pretrained_causal_lm
            self.pretrain_loss = float("nan")  # no public pre-training step here: the loaded model is the public one
            return load(path, self.tokenizer, config.max_seq_len).to(self.device)
        self.tokenizer = ByteTokenizer()
        lm = build_causal_lm(config.model, self.tokenizer, self.seed).to(self.device)
        key = (config.model, config.pretrain_steps, config.pretrain_learning_rate, self.seed, hash(tuple(public_texts)))
        if key in _PRETRAINED:  # same public corpus, same seed: the same pre-trained model, computed once
            state, self.pretrain_loss, generator_state = _PRETRAINED[key]
            lm.load_state_dict(state)
            # the batch generator as pre-training left it: a cache hit trains on the same batches as a miss
            self.generator.set_state(generator_state)
        else:
            self.pretrain_loss = self._pretrain(lm, public_texts)
            _PRETRAINED[key] = ({k: v.detach().clone() for k, v in lm.state_dict().items()}, self.pretrain_loss,
                                self.generator.get_state())
        return lm

    # ------------------------------------------------------------------ helpers
    def _encode(self, texts: Sequence[str]) -> tuple[torch.Tensor, torch.Tensor]:
        """``(ids, mask)`` of ``texts`` on the device, tokenised once per distinct list of texts (test sets are
        evaluated after every task; the tensors are never written to)."""
        key = tuple(str(t) for t in texts)
        cached = self._encoded.get(key)
        if cached is None:
            ids, mask = self.tokenizer.encode_batch(list(key), self.config.max_seq_len)
            cached = (torch.as_tensor(ids, device=self.device), torch.as_tensor(mask, device=self.device))
            if len(self._encoded) < _ENCODED_LISTS:
                self._encoded[key] = cached
        return cached

    def token_lengths(self, texts: Sequence[str]) -> np.ndarray:
        """Number of tokens of each text with its special tokens, untruncated (what ``max_seq_len`` must hold)."""
        longest = max([len(str(t).encode("utf-8")) for t in texts], default=0) + 2  # >= tokens of any tokenizer
        _, mask = self.tokenizer.encode_batch([str(t) for t in texts], max(2, longest))
        return np.asarray(mask).sum(1)

    def _length_batches(self, mask: torch.Tensor, batch_size: int) -> list[tuple[torch.Tensor, int]]:
        """Inference batches of indices sorted by length, each with its longest sequence's length: padding past
        a batch's longest sequence is masked out, so trimming it changes no output but saves its compute."""
        lengths = mask.sum(1)
        order = torch.argsort(lengths, descending=True, stable=True)
        return [(idx, max(1, int(lengths[idx[0]]))) for idx in torch.split(order, batch_size)]

    @torch.no_grad()
    def _standardise_head_input(self, batch_size: int = 64, limit: int = 512) -> None:
        """The head reads pooled features centred and scaled with the public corpus' statistics under the public
        model (:meth:`LMClassifier.set_feature_statistics`), from its first ``limit`` texts: a function of public
        data only, computed before any private task. Without a public corpus the head reads the raw pooled
        features."""
        if not self.public_texts:
            return
        key = None
        if self.config.pretrained_path:  # a loaded public model: the same statistics in every run of a process
            key = (self.config.pretrained_path, float(self.embedding.weight.double().sum()), self.config.max_seq_len,
                   self.config.device, limit, hash(tuple(self.public_texts[:limit])))
        if key not in _FEATURE_STATISTICS:
            ids, mask = self._encode(self.public_texts[:limit])
            self.model.eval()
            pooled = torch.zeros((ids.shape[0], self.model.head.in_features), dtype=torch.float32, device=self.device)
            for idx, length in self._length_batches(mask, batch_size):
                b_ids, b_mask = ids[idx, :length], mask[idx, :length]
                out = self.model.lm(inputs_embeds=self.embedding(b_ids), attention_mask=b_mask,
                                    output_hidden_states=True)
                pooled[idx] = self.model.pooled(out, b_mask).float()
            if key is None:
                self.model.set_feature_statistics(pooled)
                return
            _FEATURE_STATISTICS[key] = pooled.cpu()
        self.model.set_feature_statistics(_FEATURE_STATISTICS[key].to(self.device))

    def _pretrain(self, lm: nn.Module, public_texts: Sequence[str]) -> float:
        """Language-model pre-training on public text (full model), returns the last loss."""
        if not public_texts:
            raise InvalidParameterError("public_texts is empty; the model needs a public pre-training corpus.")
        ids, mask = self.tokenizer.encode_batch(list(public_texts), self.config.max_seq_len)
        ids_t, mask_t = torch.as_tensor(ids, device=self.device), torch.as_tensor(mask, device=self.device)
        opt = torch.optim.AdamW(lm.parameters(), lr=self.config.pretrain_learning_rate)
        sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, self.config.pretrain_steps)
        lm.train()
        loss_value = float("nan")
        for _ in range(self.config.pretrain_steps):
            idx = torch.randint(0, ids_t.shape[0], (min(32, ids_t.shape[0]),), generator=self.generator)
            out = lm(input_ids=ids_t[idx], attention_mask=mask_t[idx])
            tok = per_token_lm_loss(out.logits, ids_t[idx], mask_t[idx])
            loss = tok.sum() / mask_t[idx][:, 1:].sum().clamp_min(1)
            opt.zero_grad()
            loss.backward()
            opt.step()
            sched.step()
            loss_value = float(loss.detach())
        return loss_value

    def _peft(self):
        return self.model.lm

    def _lora_parameters(self, adapter: str) -> list[torch.Tensor]:
        return [p for n, p in self.model.lm.named_parameters() if "lora_" in n and f".{adapter}." in n]

    def _lora_pairs(self, adapter: str) -> list[tuple[torch.Tensor, torch.Tensor]]:
        pairs = []
        for module in self.model.lm.modules():
            if hasattr(module, "lora_A") and adapter in getattr(module, "lora_A", {}):
                pairs.append((module.lora_A[adapter].weight, module.lora_B[adapter].weight))
        return pairs

    def _trainable(self) -> list[torch.Tensor]:
        return [p for p in self.model.parameters() if p.requires_grad]

    def _param_groups(self) -> list[dict[str, Any]]:
        head = list(self.model.head.parameters())
        head_ids = {id(p) for p in head}
        adapters = [p for p in self._trainable() if id(p) not in head_ids]
        return [
            {"params": adapters, "lr": self.config.learning_rate},
            {"params": head, "lr": self.config.head_learning_rate},
        ]

    def _lora_a(self, adapter: str) -> list[torch.Tensor]:
        """The ``lora_A`` weights (``[r, d_in]``) of ``adapter``, one per adapted layer, in module order."""
        return [a for a, _ in self._lora_pairs(adapter)]

    def _olora_penalty(self) -> torch.Tensor | None:
        """O-LoRA's lambda_1 L_orth of the current adapter (:meth:`.strategies.OLoRA.penalty`)."""
        return OLoRA.penalty(self)

    def _memory_gradients(self, params: Sequence[torch.Tensor]) -> torch.Tensor:
        """GEM without DP: the gradient of each earlier task's memory loss (clean embeddings), ``[t, p]``."""
        rows = []
        for texts, labels in self.memories:
            ids, mask = self._encode(texts)
            y = torch.as_tensor(labels, dtype=torch.int64, device=self.device)
            loss, _ = self._task_loss(ids, mask, y, self.embedding(ids))
            grads = torch.autograd.grad(loss, params, allow_unused=True)
            rows.append(torch.cat([(g if g is not None else torch.zeros_like(p)).reshape(-1)
                                   for p, g in zip(params, grads)]))
        return torch.stack(rows)

    # ------------------------------------------------------------------ training
    def fit_task(
        self, task_index: int, texts: Sequence[str], labels: Sequence[int], *,
        output_labels: Sequence[int] | None = None, dpsgd: dict[str, Any] | None = None,
    ) -> dict[str, Any]:
        """Train on one task; returns the task record (losses, PeCL guarantee / DP-SGD parameters).

        ``output_labels`` (the task's public label set) marks the labels the
        classifier predicts from now on; without it (not allowed under
        ``training = "dp_sgd"``) the labels present in ``labels`` are used.
        ``dpsgd`` is the planned DP-SGD schedule of a DP PeCL task
        (``noise_multiplier``, ``sample_rate``, ``steps``, ``max_grad_norm``:
        the plan's noise, :meth:`dpcl.methods.pecl.spec.PeCLSpec.plan_task`), or the planned
        schedule of a DP-SGD baseline (``privacy = "dpsgd"``; without one the task is calibrated alone).
        """
        cfg = self.config
        labels_np = np.asarray(labels, dtype=np.int64)
        if labels_np.size and (labels_np.min() < 0 or labels_np.max() >= self.n_labels):
            raise InvalidParameterError(f"labels must lie in [0, {self.n_labels}).")
        if cfg.dp_pecl:
            if output_labels is None or dpsgd is None:
                raise InvalidParameterError(
                    "training='dp_sgd' needs the task's public output_labels and its planned dpsgd schedule "
                    "(noise_multiplier, sample_rate, steps, max_grad_norm from the plan)."
                )
            return self._fit_task_dp(task_index, texts, labels_np, output_labels, dpsgd)
        if dpsgd is not None and cfg.privacy != "dpsgd":
            raise InvalidParameterError(
                f"a planned dpsgd schedule is for privacy='dpsgd' baselines or training='dp_sgd' PeCL, not "
                f"strategy={cfg.strategy!r} with privacy={cfg.privacy!r}."
            )
        released = np.asarray(output_labels, dtype=np.int64) if output_labels is not None else np.unique(labels_np)
        self.seen[released] = True
        train_texts, train_labels = self.strategy.training_set(self, texts, labels_np)
        record: dict[str, Any] = {"task": task_index, "n_examples": len(texts), "n_trained": len(train_texts)}
        self._task_generators(task_index)
        if len(train_texts) == 0:
            return self._finish_task(record)
        ids, mask = self._encode(train_texts)
        y = torch.tensor(train_labels, dtype=torch.int64, device=self.device)
        previous = self.strategy.start_adapter(self, task_index)
        ctx = self.strategy.prepare(self, ids, mask, record)
        ctx.previous = previous
        tdp = self._token_dp()
        if cfg.privacy == "dpsgd":
            record.update(self._fit_dpsgd(ids, mask, y, dpsgd))
        else:
            record.update(self._fit_plain(ids, mask, y, tdp, ctx))
        if tdp is not None:
            record["guarantee"] = tdp.released_guarantee()
        self.strategy.after_task(self, texts, labels_np, ids, mask, record)
        return self._finish_task(record)

    def _task_generators(self, task_index: int) -> None:
        """The task's privacy generators: TDP and DP-SGD noise, and the Poisson masks (OS entropy by default)."""
        self.noise_generator = noise_torch_generator(
            self.seed, self.reproducible_noise, int(task_index), 0, device=self.device)
        self.sampling_generator = noise_torch_generator(self.seed, self.reproducible_noise, int(task_index), 1)

    def _token_dp(self) -> TokenDP | None:
        """PeCL's token-level DP on the input embeddings (``privacy = "tdp"``), or None."""
        cfg = self.config
        if cfg.privacy != "tdp":
            return None
        return TokenDP(
            epsilon_lower=cfg.epsilon_lower, epsilon_upper=cfg.epsilon_upper, delta=cfg.delta,
            clip_norm=cfg.clip_norm, calibration=cfg.calibration, releases=cfg.epochs, device=self.device,
        )

    def _finish_task(self, record: dict[str, Any]) -> dict[str, Any]:
        self.tasks_fitted += 1
        self.task_records.append(record)
        return record

    def _check_token_ids(self, ids: torch.Tensor) -> None:
        """Token ids inside the embedding table (checked once per task, so the fused CUDA gather needs no
        per-batch sync)."""
        if ids.numel():
            low, high = (int(v) for v in torch.aminmax(ids))
            if low < 0 or high >= self.embedding.num_embeddings:
                raise InvalidParameterError(
                    f"token ids must lie in [0, {self.embedding.num_embeddings}), got values in [{low}, {high}]"
                )

    def _task_loss(self, ids, mask, y, emb):
        cls_logits, lm_logits = self.model(emb, mask)
        tok_loss = per_token_lm_loss(lm_logits, ids, mask)
        per_example_lm = tok_loss.sum(1) / mask[:, 1:].sum(1).clamp_min(1)
        loss = nn.functional.cross_entropy(cls_logits, y) + self.config.lm_weight * per_example_lm.mean()
        return loss, tok_loss

    def _ewc_penalty(self) -> torch.Tensor:
        total = torch.zeros((), device=self.device)
        params = self._trainable()
        for fisher, anchor in self.ewc_terms:
            for p, f, a in zip(params, fisher, anchor):
                total = total + (f * (p - a) ** 2).sum()
        return 0.5 * self.config.ewc_lambda * total

    def _fit_plain(self, ids, mask, y, tdp: TokenDP | None, ctx: TaskContext) -> dict[str, Any]:
        """Training without DP-SGD (PeCL as in the paper, the non-private baselines): AdamW with a cosine schedule
        over shuffled mini-batches; TDP perturbs the inputs, the strategy adds its loss terms and gradient steps."""
        cfg = self.config
        params = self._trainable()
        opt = torch.optim.AdamW(self._param_groups())
        batches_per_epoch = math.ceil(ids.shape[0] / cfg.batch_size)
        sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, max(1, cfg.epochs * batches_per_epoch))
        fisher = self.strategy.new_fisher(params)
        n = ids.shape[0]
        last = {}
        scores = ctx.scores
        token_sigmas = tdp.sigmas(scores) if tdp is not None else None  # scores are fixed for the task
        if tdp is not None:
            self._check_token_ids(ids)
        self.model.train()
        for _ in range(cfg.epochs):
            if tdp is not None:
                tdp.record_epoch(scores, mask)  # every token of every sequence is perturbed once per epoch
            for idx in _batches(n, cfg.batch_size, self.generator):
                idx = idx.to(self.device)
                b_ids, b_mask, b_y = ids[idx], mask[idx], y[idx]
                with torch.no_grad():
                    if tdp is not None:  # lookup + clip + per-token noise (one fused kernel on CUDA)
                        emb = tdp.embed_and_perturb(self.embedding.weight, b_ids, token_sigmas[idx],
                                                    self.noise_generator, ids_checked=True)
                    else:
                        emb = self.embedding(b_ids)
                loss, tok_loss = self._task_loss(b_ids, b_mask, b_y, emb)
                terms = {"task": float(loss.detach())}
                loss = self.strategy.loss_terms(self, ctx, loss, tok_loss, idx, b_mask, terms)
                opt.zero_grad()
                loss.backward()
                self.strategy.after_backward(self, params, fisher, batches_per_epoch, terms)
                opt.step()
                sched.step()
                last = terms
        self.strategy.after_fit(self, params, fisher)
        return {"last_losses": last, "steps": cfg.epochs * batches_per_epoch}

    @torch.no_grad()
    def _task_importance(self, ids: torch.Tensor, mask: torch.Tensor) -> float:
        """Omega_k (eq. 8): ||Delta W^(k)||_F x mean l2 norm of the adapted layers' inputs on the task.

        The mean runs over the non-padding tokens of (up to) the first 64 sequences of the task.
        """
        norms: list[torch.Tensor] = []
        sample = slice(0, min(64, ids.shape[0]))
        valid = mask[sample].bool()

        def hook(_module, inputs, _output):
            norms.append(inputs[0].norm(dim=-1)[valid])

        handles = []
        for name, module in self.model.lm.named_modules():
            if hasattr(module, "lora_A") and self.adapter in getattr(module, "lora_A", {}):
                handles.append(module.register_forward_hook(hook))
        self.model.eval()
        try:
            self.model(self.embedding(ids[sample]), mask[sample])
        finally:
            for h in handles:
                h.remove()
        mean_norm = float(torch.cat(norms).mean()) if norms else 0.0
        scaling = self.lora_config.lora_alpha / self.lora_config.r
        return task_importance(lora_increment_norm(self._lora_pairs(self.adapter), scaling), mean_norm)

    def config_dict(self) -> dict[str, Any]:
        return asdict(self.config)

