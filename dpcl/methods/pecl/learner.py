"""Continual learner on a small causal LM: PeCL and the paper's baselines on one code path.

Strategies (Zhan et al., Sec. "Baselines"):

* ``pecl`` -- token-level dynamic DP on the input embeddings (:mod:`.tdp`) plus
  privacy-guided memory sculpting (:mod:`.sculpting`): one LoRA adapter per
  task (initialised from the previous one), memory regularisation with
  lambda_dyn and the privacy-aware unlearning loss;
* ``seqft`` -- sequential fine-tuning of one LoRA adapter + head;
* ``er`` -- experience replay (Rolnick et al. 2019): a buffer of
  ``replay_per_task`` examples of every past task is mixed into each new task;
* ``ewc`` -- elastic weight consolidation (Kirkpatrick et al. 2017) with a
  diagonal Fisher of the adapter + head: the squared mini-batch gradients of the
  task's own loss (not of the EWC penalty of earlier tasks), averaged over the
  task's training steps;
* ``olora`` -- O-LoRA (Wang et al. 2023): a fresh LoRA adapter per task, the
  earlier tasks' adapters frozen and summed with it at inference, and an
  orthogonality penalty between the new adapter's subspace and the old ones
  (:mod:`dpcl.methods.olora`);
* ``gem`` -- gradient episodic memory (Lopez-Paz & Ranzato 2017): a memory of
  ``replay_per_task`` examples of every earlier task; an update whose gradient
  would raise a memory's loss is projected (:mod:`dpcl.methods.gem`);
* ``mtl`` -- multi-task learning on the union of all tasks (upper reference).

PeCL with ``privacy="none"`` (sculpting on clean embeddings, not private) is the
"w/o TDP" ablation of the paper's Table 2.

PeCL has two trainings (``training``):

* ``"paper"`` -- as in the paper: adapters and head trained on the clean
  private targets and labels, scores from the private text (token counts of the
  tasks, model surprise), lambda_dyn from the task's mean score, Omega_k from the
  task's clean text. Only the perturbed input embeddings have a (per-token)
  guarantee; the checkpoint is not DP.
* ``"dp_sgd"`` -- a DP checkpoint: the adapters and the head are trained only by
  DP-SGD (opacus per-example clipping, Poisson sampling at the planned rate,
  exactly the planned steps, noise from the plan). Everything else comes from
  public data or earlier releases (:meth:`ContinualLM.public_scores`): the
  score table over the vocabulary and its mean are computed once from the
  public corpus under the public pre-trained model (Score_2's "tasks" are the
  public categories), lambda_dyn from that mean, Omega_k's activation norm from
  the public corpus through the released adapter, the label set from the
  public prior. TDP stays as defence in depth with one sigma for every token
  (from the public mean score), drawn once per epoch for every example (the
  epoch's DP-SGD steps reuse it), so its per-token statement counts ``epochs``
  perturbations whatever the Poisson sampling does. Inside a DP-SGD step an
  example's loss (classification, language modelling, unlearning weighted by
  the public score of its own tokens) depends only on that example and public
  or released state, so its clipped gradient is what DP-SGD accounts; the
  memory regulariser depends on parameters only, and its gradient is added
  after the noise (post-processing).
Baselines run without DP (``privacy="none"``) or with DP-SGD (``"dpsgd"``,
opacus, Poisson sampling; noise multiplier from
:func:`dpcl.accounting.dpsgd.dpsgd_noise_multiplier`). Under DP-SGD the EWC
Fisher is computed from the *noisy* gradients DP-SGD released (post-processing),
never from fresh per-example gradients. O-LoRA's orthogonality penalty depends
on parameters only (the new adapter and the released old ones): its gradient is
added after the noise. GEM under DP-SGD reads its memories (private examples
of earlier tasks) only through DP-SGD queries: at every step each memory is
Poisson-sampled at the task's sampling rate, its examples' gradients clipped to
``max_grad_norm`` and noised with the task's noise multiplier (opacus), and the
projection uses these noisy memory gradients and the noisy task gradient
(post-processing). A memory example therefore takes part, in every later task,
in a mechanism identical to that task's DP-SGD run: its example-level epsilon is
the composition over its own task and every later one, as for ER's buffer. A
planned schedule (``fit_task(..., dpsgd=...)``; :func:`baseline_task_reads` says
which tasks each run reads and on how many examples) replaces the per-task
calibration: the PeCL table calibrates ER and GEM on the whole stream
(:func:`dpcl.methods.pecl.experiment.baseline_dpsgd_plan`).

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

import functools
import math
import warnings
from dataclasses import asdict, dataclass, replace
from typing import Any, Sequence

import numpy as np
import torch
from torch import nn

from dpcl.accounting.dpsgd import dpsgd_noise_multiplier
from dpcl.errors import InvalidParameterError, PrivacyViolationError
from dpcl.methods.gem import gem_project
from dpcl.methods.noise_source import noise_torch_generator
from dpcl.methods.olora import orthogonality_loss
from dpcl.methods.pecl.model import (
    LMClassifier,
    ModelConfig,
    build_causal_lm,
    hidden_size,
    load_pretrained_causal_lm,
    load_pretrained_encoder,
    per_token_lm_loss,
    pretrained_kind,
    resolve_pretrained_path,
)
from dpcl.methods.pecl.sculpting import (
    dynamic_lambda,
    lora_increment_norm,
    memory_regularisation,
    task_importance,
    unlearning_loss,
    unlearning_loss_per_sequence,
)
from dpcl.methods.pecl.sensitivity import TaskTokenStatistics, fuse_scores, sensitivity_scores
from dpcl.methods.pecl.tdp import TokenDP
from dpcl.methods.pecl.tokenizer import ByteTokenizer, load_pretrained_tokenizer

STRATEGIES = ("pecl", "seqft", "er", "ewc", "olora", "gem", "mtl")
PRIVACY_MODES = ("tdp", "dpsgd", "none")
TRAININGS = ("paper", "dp_sgd")
#: chunk of sequences perturbed at once when a DP PeCL epoch draws its noisy embeddings
_PERTURB_CHUNK = 256


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
        if (self.privacy == "tdp" and self.strategy != "pecl") or (self.strategy == "pecl" and self.privacy == "dpsgd"):
            raise InvalidParameterError(
                "privacy='tdp' is PeCL's mechanism and only PeCL uses it; PeCL takes privacy='tdp' (or 'none' for "
                "the not-private 'w/o TDP' ablation), baselines take privacy='none' or 'dpsgd' "
                f"(got strategy={self.strategy!r}, privacy={self.privacy!r})."
            )
        if self.training not in TRAININGS:
            raise InvalidParameterError(f"training must be one of {TRAININGS}, got {self.training!r}.")
        if self.training == "dp_sgd" and self.strategy != "pecl":
            raise InvalidParameterError(
                f"training='dp_sgd' is PeCL's DP training; baselines take privacy='dpsgd' (got strategy="
                f"{self.strategy!r})."
            )
        if self.task_softmax is True and not (self.strategy == "pecl" and self.training == "dp_sgd"):
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


#: In-process cache of pre-trained public models (pre-training reads only public text).
_PRETRAINED: dict[tuple, tuple[dict[str, torch.Tensor], float, torch.Tensor]] = {}
#: In-process cache of a loaded public model's pooled features of the public corpus (the head's standardisation:
#: public data under the public model, the same for every run; LoRA starts at zero increment)
_FEATURE_STATISTICS: dict[tuple, torch.Tensor] = {}
#: distinct lists of texts whose tokenisation a learner keeps (the tasks' training and test sets)
_ENCODED_LISTS = 64


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
    kept = [min(config.replay_per_task, n) if config.strategy in ("er", "gem") else 0 for n in sizes]
    out = []
    for k, n in enumerate(sizes):
        earlier = tuple(j for j in range(k) if kept[j] > 0)
        n_trained = n + sum(kept[j] for j in earlier) if config.strategy == "er" else n
        out.append((earlier + (k,), n_trained))
    return out


def _check_encoder_options(config: LearnerConfig) -> None:
    """Refuse the PeCL options that need a next-token distribution, which an encoder does not have."""
    if config.strategy != "pecl":
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


def _batches(n: int, batch_size: int, generator: torch.Generator) -> list[torch.Tensor]:
    order = torch.randperm(n, generator=generator)
    return list(torch.split(order, batch_size))


class ContinualLM:
    """One continual learner (PeCL or a baseline) over a public label space of ``n_labels`` classes."""

    def __init__(
        self, n_labels: int, config: LearnerConfig, seed: int, public_texts: Sequence[str],
        reproducible_noise: bool = False, public_labels: Sequence[int] | None = None,
    ) -> None:
        if n_labels < 1:
            raise InvalidParameterError(f"n_labels must be >= 1, got {n_labels}.")
        self.config = config
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
        #: "built" (the small GPT-2 model pre-trained here), or a loaded "causal" LM or "encoder"
        self.model_kind = "built"
        if config.pretrained_path:
            path = resolve_pretrained_path(config.pretrained_path)
            self.model_kind = pretrained_kind(path)
            if self.model_kind == "encoder":
                _check_encoder_options(config)
            self.tokenizer = load_pretrained_tokenizer(path)
            load = load_pretrained_encoder if self.model_kind == "encoder" else load_pretrained_causal_lm
            lm = load(path, self.tokenizer, config.max_seq_len).to(self.device)
            self.pretrain_loss = float("nan")  # no public pre-training step here: the loaded model is the public one
        else:
            self.tokenizer = ByteTokenizer()
            lm = build_causal_lm(config.model, self.tokenizer, seed).to(self.device)
            key = (config.model, config.pretrain_steps, config.pretrain_learning_rate, seed, hash(tuple(public_texts)))
            if key in _PRETRAINED:  # same public corpus, same seed: the same pre-trained model, computed once
                state, self.pretrain_loss, generator_state = _PRETRAINED[key]
                lm.load_state_dict(state)
                # the batch generator as pre-training left it: a cache hit trains on the same batches as a miss
                self.generator.set_state(generator_state)
            else:
                self.pretrain_loss = self._pretrain(lm, public_texts)
                _PRETRAINED[key] = ({k: v.detach().clone() for k, v in lm.state_dict().items()}, self.pretrain_loss,
                                    self.generator.get_state())
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
        if config.strategy == "pecl" and config.training == "dp_sgd":
            self.public_scores()  # before any private task: a function of public data and the public model only
        # baseline state
        self.buffer_texts: list[str] = []
        self.buffer_labels: list[int] = []
        #: GEM's episodic memories, one (texts, labels) per earlier task
        self.memories: list[tuple[list[str], np.ndarray]] = []
        self.ewc_terms: list[tuple[list[torch.Tensor], list[torch.Tensor]]] = []

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

    def _start_olora_adapter(self, task_index: int) -> None:
        """O-LoRA: a fresh adapter for this task, summed with the frozen adapters of the earlier tasks."""
        name = f"task_{task_index}"
        peft_lm = self._peft()
        with torch.random.fork_rng(devices=[]):  # peft draws lora_A from the global RNG: seeded, caller untouched
            torch.manual_seed(self.seed + 1 + task_index)
            peft_lm.add_adapter(name, self.lora_config)
        active = [f"task_{k}" for k in range(task_index + 1)]
        peft_lm.base_model.set_adapter(active)  # every listed adapter's output is added (LoraLayer.forward)
        for n, p in peft_lm.named_parameters():
            p.requires_grad_("lora_" in n and f".{name}." in n)
        self.adapter = name

    def _olora_penalty(self) -> torch.Tensor | None:
        """lambda_1 L_orth of the current adapter against every earlier task's (None for task 0 or lambda_1 = 0)."""
        index = int(self.adapter.split("_")[1])
        if index == 0 or self.config.olora_lambda == 0:
            return None
        earlier = [self._lora_a(f"task_{k}") for k in range(index)]
        return self.config.olora_lambda * orthogonality_loss(self._lora_a(self.adapter), earlier)

    def _flat_grad(self, params: Sequence[torch.Tensor]) -> torch.Tensor:
        return torch.cat([(p.grad if p.grad is not None else torch.zeros_like(p)).reshape(-1) for p in params])

    def _set_flat_grad(self, params: Sequence[torch.Tensor], flat: torch.Tensor) -> None:
        offset = 0
        for p in params:
            p.grad = flat[offset : offset + p.numel()].view_as(p).clone()
            offset += p.numel()

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

    def _start_adapter(self, task_index: int) -> list[torch.Tensor] | None:
        """PeCL: a new adapter per task, initialised from the previous one; returns W^(k-1)."""
        if task_index > 0 and self.config.strategy == "olora":
            self._start_olora_adapter(task_index)
            return None
        if task_index == 0 or self.config.strategy != "pecl":
            return None
        previous = self.adapter
        name = f"task_{task_index}"
        peft_lm = self._peft()
        with torch.random.fork_rng(devices=[]):  # its initial weights are overwritten just below
            peft_lm.add_adapter(name, self.lora_config)
        with torch.no_grad():
            for src, dst in zip(self._lora_parameters(previous), self._lora_parameters(name)):
                dst.copy_(src)
        peft_lm.set_adapter(name)
        for n, p in peft_lm.named_parameters():
            p.requires_grad_("lora_" in n and f".{name}." in n)
        self.adapter = name
        return [p.detach().clone() for p in self._lora_parameters(previous)]

    # ------------------------------------------------------------------ scores
    @torch.no_grad()
    def token_scores(self, ids: torch.Tensor, mask: torch.Tensor, batch_size: int = 64) -> torch.Tensor:
        """Fused sensitivity scores (eq. 1) for every token, using the current model (clean inputs)."""
        table = torch.as_tensor(self.token_stats.score2_table(), dtype=torch.float32, device=self.device)
        self.model.eval()
        out = []
        for start in range(0, ids.shape[0], batch_size):
            b_ids, b_mask = ids[start : start + batch_size], mask[start : start + batch_size]
            _, lm_logits = self.model(self.embedding(b_ids), b_mask)
            nll = per_token_lm_loss(lm_logits, b_ids, b_mask)
            out.append(sensitivity_scores(nll, b_ids, b_mask, table, self.config.alpha))
        return torch.cat(out) if out else torch.zeros_like(ids, dtype=torch.float32)

    @torch.no_grad()
    def public_scores(self) -> dict[str, Any]:
        """Sensitivity scores of ``training = "dp_sgd"``, from the public corpus only (computed once, cached).

        * Score_2 (eq. 3) from the token counts of the public corpus, each public
          category one "task" of eq. 3 (one group when no public labels are given:
          Score_2 is then 0);
        * Score_1 (eq. 2) of a vocabulary entry: its mean surprise over its
          occurrences in the public corpus under the public pre-trained model
          (entries absent from the corpus: the corpus mean);
        * ``table[v]``: the fused Score (eq. 1) of entry ``v``;
        * ``mean_score``: the mean fused score of the public corpus' tokens (eq. 1
          in context) -- it sets lambda_dyn (eq. 11) and the one TDP sigma.

        Called before any private task is trained (in the constructor), so
        neither the private text nor a private release enters it.
        """
        if self._public_scores is not None:
            return self._public_scores
        cfg = self.config
        if not self.public_texts:
            raise InvalidParameterError("training='dp_sgd' needs a public corpus for its scores; public_texts is empty.")
        ids, mask = self._encode(self.public_texts)
        stats = TaskTokenStatistics(self.token_stats.vocab_size, self.tokenizer.special_ids, cfg.tau)
        groups = np.zeros(len(self.public_texts), dtype=np.int64) if self.public_labels is None else self.public_labels
        ids_np, mask_np = ids.cpu().numpy(), mask.cpu().numpy()
        for group in np.unique(groups):  # one "task" of eq. 3 per public category (a handful, not per token)
            stats.add_task(ids_np[groups == group], mask_np[groups == group])
        score2 = torch.as_tensor(stats.score2_table(), dtype=torch.float32, device=self.device)
        self.model.eval()
        if self.model.generative:
            nll = torch.cat([
                per_token_lm_loss(self.model(self.embedding(ids[s : s + 64]), mask[s : s + 64])[1], ids[s : s + 64],
                                  mask[s : s + 64])
                for s in range(0, ids.shape[0], 64)
            ])
        else:  # an encoder has no surprise (Score_1): alpha = 0 is required, the score is Score_2 alone
            nll = torch.zeros(ids.shape, dtype=torch.float32, device=self.device)
        valid = mask.bool().clone()
        valid[:, 0] = False
        vocab = self.token_stats.vocab_size
        flat_ids, flat_nll = ids[valid], nll[valid].double()
        sums = torch.zeros(vocab, dtype=torch.float64, device=self.device).index_add_(0, flat_ids, flat_nll)
        counts = torch.bincount(flat_ids, minlength=vocab)[:vocab].double()
        corpus_mean = float(flat_nll.mean()) if flat_nll.numel() else 0.0
        score1 = torch.where(counts > 0, sums / counts.clamp_min(1), torch.full_like(sums, corpus_mean))
        table = fuse_scores(score1.float().clamp_min(0.0), score2, cfg.alpha)
        table[list(self.tokenizer.special_ids)] = 0.0
        in_context = sensitivity_scores(nll, ids, mask, score2, cfg.alpha)
        mean_score = float(in_context[valid].mean()) if bool(valid.any()) else 0.0
        self._public_scores = {
            "table": table,
            "mean_score": mean_score,
            "public_ids": ids[: min(64, ids.shape[0])],
            "public_mask": mask[: min(64, ids.shape[0])],
            "n_public_texts": len(self.public_texts),
            "n_public_groups": int(stats.n_tasks),
        }
        return self._public_scores

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
        the plan's noise, :meth:`dpcl.guarantees.per_token.PeCLSpec.plan_task`), or the planned
        schedule of a DP-SGD baseline (``privacy = "dpsgd"``; without one the task is calibrated alone).
        """
        cfg = self.config
        labels_np = np.asarray(labels, dtype=np.int64)
        if labels_np.size and (labels_np.min() < 0 or labels_np.max() >= self.n_labels):
            raise InvalidParameterError(f"labels must lie in [0, {self.n_labels}).")
        dp_pecl = cfg.strategy == "pecl" and cfg.training == "dp_sgd"
        if dp_pecl:
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
        if output_labels is not None:
            self.seen[np.asarray(output_labels, dtype=np.int64)] = True
        else:
            self.seen[np.unique(labels_np)] = True
        own_n = len(texts)
        train_texts, train_labels = list(texts), labels_np
        if cfg.strategy == "er" and self.buffer_texts:
            train_texts = train_texts + self.buffer_texts
            train_labels = np.concatenate([labels_np, np.asarray(self.buffer_labels, dtype=np.int64)])
        record: dict[str, Any] = {"task": task_index, "n_examples": own_n, "n_trained": len(train_texts)}
        self.noise_generator = noise_torch_generator(
            self.seed, self.reproducible_noise, int(task_index), 0, device=self.device)
        self.sampling_generator = noise_torch_generator(self.seed, self.reproducible_noise, int(task_index), 1)
        if len(train_texts) == 0:
            self.tasks_fitted += 1
            self.task_records.append(record)
            return record
        ids, mask = self._encode(train_texts)
        y = torch.tensor(train_labels, dtype=torch.int64, device=self.device)
        previous = self._start_adapter(task_index)

        scores = None
        tdp = None
        lam = omega_bar = 0.0
        if cfg.strategy == "pecl":
            self.token_stats.add_task(ids.cpu().numpy(), mask.cpu().numpy())
            scores = self.token_scores(ids, mask)
            valid = mask.bool().clone()
            valid[:, 0] = False
            mean_score = float(scores[valid].mean()) if bool(valid.any()) else 0.0
            lam = (
                dynamic_lambda(mean_score, cfg.lambda_min, cfg.lambda_max)
                if cfg.dynamic_lambda
                else 0.5 * (cfg.lambda_min + cfg.lambda_max)
            )
            omega_bar = float(np.mean(self.omegas)) if self.omegas else 0.0
            record.update(mean_score=mean_score, lambda_dyn=lam, omega_bar=omega_bar)
        if cfg.privacy == "tdp":
            tdp = TokenDP(
                epsilon_lower=cfg.epsilon_lower,
                epsilon_upper=cfg.epsilon_upper,
                delta=cfg.delta,
                clip_norm=cfg.clip_norm,
                calibration=cfg.calibration,
                releases=cfg.epochs,
                device=self.device,
            )

        if cfg.privacy == "dpsgd":
            record.update(self._fit_dpsgd(ids, mask, y, dpsgd))
        else:
            record.update(self._fit_plain(ids, mask, y, scores, tdp, previous, lam, omega_bar))

        if tdp is not None:
            record["guarantee"] = tdp.released_guarantee()
        if cfg.strategy == "pecl":
            record["omega"] = self._task_importance(ids, mask)
            self.omegas.append(record["omega"])
        if cfg.strategy in ("er", "gem"):
            keep = torch.randperm(own_n, generator=self.generator)[: cfg.replay_per_task].numpy()
            if cfg.strategy == "er":
                self.buffer_texts.extend(texts[i] for i in keep)
                self.buffer_labels.extend(int(labels_np[i]) for i in keep)
            elif keep.size:
                self.memories.append(([texts[i] for i in keep], labels_np[keep].copy()))
        self.tasks_fitted += 1
        self.task_records.append(record)
        return record

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
        self.noise_generator = noise_torch_generator(
            self.seed, self.reproducible_noise, int(task_index), 0, device=self.device)
        self.sampling_generator = noise_torch_generator(self.seed, self.reproducible_noise, int(task_index), 1)
        public = self.public_scores()
        lam = (dynamic_lambda(public["mean_score"], cfg.lambda_min, cfg.lambda_max) if cfg.dynamic_lambda
               else 0.5 * (cfg.lambda_min + cfg.lambda_max))
        omega_bar = float(np.mean(self.omegas)) if self.omegas else 0.0
        record.update(public_mean_score=public["mean_score"], lambda_dyn=lam, omega_bar=omega_bar)
        if len(texts) == 0:  # nothing read, nothing trained: the previous release is released again
            self.tasks_fitted += 1
            self.task_records.append(record)
            return record
        ids, mask = self._encode(texts)
        y = torch.tensor(labels_np, dtype=torch.int64, device=self.device)
        previous = self._start_adapter(task_index)
        tdp = None
        if cfg.privacy == "tdp":
            tdp = TokenDP(
                epsilon_lower=cfg.epsilon_lower, epsilon_upper=cfg.epsilon_upper, delta=cfg.delta,
                clip_norm=cfg.clip_norm, calibration=cfg.calibration, releases=cfg.epochs, device=self.device,
            )
        record.update(self._fit_pecl_dpsgd(ids, mask, y, tdp, previous, lam, omega_bar, dpsgd))
        if tdp is not None:
            record["guarantee"] = tdp.released_guarantee()
            record["guarantee"]["scope"] = "input embeddings (scoped statement, not the checkpoint)"
        # Omega_k (eq. 8): the released adapter's increment x activation norms of the *public* corpus
        record["omega"] = self._task_importance(public["public_ids"], public["public_mask"])
        self.omegas.append(record["omega"])
        self.tasks_fitted += 1
        self.task_records.append(record)
        return record

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
        if ids.numel():
            low, high = (int(v) for v in torch.aminmax(ids))
            if low < 0 or high >= self.embedding.num_embeddings:
                raise InvalidParameterError(
                    f"token ids must lie in [0, {self.embedding.num_embeddings}), got values in [{low}, {high}]"
                )
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

        penalty = None
        if previous is not None and omega_bar > 0:
            def penalty() -> torch.Tensor:
                return memory_regularisation(self._lora_parameters(self.adapter), previous, lam, omega_bar)

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

        cfg = self.config
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
        gsm.train()
        steps_run = empty_steps = sampled = projections = 0
        for step in range(steps):
            take = torch.rand(n, generator=self.sampling_generator) < sample_rate  # Poisson sampling (secret)
            idx = torch.nonzero(take).flatten().to(self.device)
            opt.zero_grad()
            if idx.numel() == 0:
                # An empty Poisson sample still releases a noise-only step: skipping it would reveal that the
                # sample was empty, which the subsampled-Gaussian accounting does not cover.
                for p in params:
                    p.grad_sample = torch.zeros((0, *p.shape), dtype=p.dtype, device=p.device)
                empty_steps += 1
            else:
                b_ids, b_mask, b_y = ids[idx], mask[idx], y[idx]
                with torch.no_grad():
                    emb = embed(step, idx)
                cls_logits, lm_logits = gsm(emb, b_mask)
                tok = per_token_lm_loss(lm_logits, b_ids, b_mask)
                if self._logit_offset is not None:  # task_softmax: the task's public label set only
                    cls_logits = cls_logits + self._logit_offset
                per_example = nn.functional.cross_entropy(cls_logits, b_y, reduction="none") + cfg.lm_weight * (
                    tok.sum(1) / b_mask[:, 1:].sum(1).clamp_min(1)
                )
                more = extra_loss(idx, tok, b_mask) if extra_loss is not None else None
                if more is not None:
                    per_example = per_example + more
                # GradSampleModule (loss_reduction="mean") multiplies by the actual batch size, so the mean over
                # the batch gives grad_sample = each example's own gradient, which is what gets clipped; the
                # DPOptimizer then divides the noisy sum by the expected batch size
                with warnings.catch_warnings():
                    # opacus' backward hooks fire on module outputs because the frozen inputs need no grad
                    warnings.filterwarnings("ignore", message="Full backward hook is firing")
                    per_example.mean().backward()
                sampled += int(idx.numel())
            if idx.numel() == 0 and embed is not None:
                with torch.no_grad():
                    embed(step, idx)  # keeps the per-epoch TDP draw on schedule when an epoch starts empty
            if opt.pre_step():  # clip per-example gradients, add noise: p.grad is the released gradient
                if memory_queries:
                    gradient = self._flat_grad(params)
                    rows = [self._noisy_memory_gradient(gsm, query, params, sample_rate)
                            for query in memory_queries]
                    projected = gem_project(gradient, torch.stack(rows))
                    projections += int(projected is not gradient)
                    self._set_flat_grad(params, projected)
                if fisher is not None:
                    for f, p in zip(fisher, params):
                        f += p.grad.detach() ** 2 / steps
                if penalty is not None:
                    # the penalty depends only on earlier releases: post-processing, added after the noise
                    penalty_grads = torch.autograd.grad(penalty(), params, allow_unused=True)
                    for p, g in zip(params, penalty_grads):
                        if g is not None:
                            p.grad = p.grad + g
                opt.original_optimizer.step()
                steps_run += 1
        gsm._close()
        run = {"steps_run": steps_run, "empty_steps": empty_steps, "examples_sampled": sampled}
        if memory_queries:
            run["gem_projections"] = projections
        return run

    def _per_example_loss(self, gsm, emb, b_ids, b_mask, b_y) -> torch.Tensor:
        cls_logits, lm_logits = gsm(emb, b_mask)
        tok = per_token_lm_loss(lm_logits, b_ids, b_mask)
        return nn.functional.cross_entropy(cls_logits, b_y, reduction="none") + self.config.lm_weight * (
            tok.sum(1) / b_mask[:, 1:].sum(1).clamp_min(1)
        )

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
            with warnings.catch_warnings():
                warnings.filterwarnings("ignore", message="Full backward hook is firing")
                self._per_example_loss(gsm, emb, m_ids[idx], m_mask[idx], m_y[idx]).mean().backward()
        query.pre_step()
        row = self._flat_grad(params)
        query.zero_grad(set_to_none=True)
        return row

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

    def _fit_plain(self, ids, mask, y, scores, tdp, previous, lam, omega_bar) -> dict[str, Any]:
        cfg = self.config
        params = self._trainable()
        opt = torch.optim.AdamW(self._param_groups())
        batches_per_epoch = math.ceil(ids.shape[0] / cfg.batch_size)
        sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, max(1, cfg.epochs * batches_per_epoch))
        fisher = [torch.zeros_like(p) for p in params] if cfg.strategy == "ewc" else None
        n = ids.shape[0]
        last = {}
        token_sigmas = tdp.sigmas(scores) if tdp is not None else None  # scores are fixed for the task
        if tdp is not None and ids.numel():  # checked once here, so the fused CUDA gather needs no per-batch sync
            low, high = (int(v) for v in torch.aminmax(ids))
            if low < 0 or high >= self.embedding.num_embeddings:
                raise InvalidParameterError(
                    f"token ids must lie in [0, {self.embedding.num_embeddings}), got values in [{low}, {high}]"
                )
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
                if cfg.strategy == "pecl":
                    if previous is not None and omega_bar > 0:
                        reg = memory_regularisation(self._lora_parameters(self.adapter), previous, lam, omega_bar)
                        loss = loss + reg
                        terms["reg"] = float(reg.detach())
                    if cfg.unlearning and cfg.lambda_unlearn > 0:
                        unl = unlearning_loss(scores[idx], tok_loss, b_mask, cfg.theta)
                        loss = loss + cfg.lambda_unlearn * unl
                        terms["unlearn"] = float(unl.detach())
                if cfg.strategy == "olora":
                    orth = self._olora_penalty()
                    if orth is not None:
                        loss = loss + orth
                        terms["orth"] = float(orth.detach())
                opt.zero_grad()
                loss.backward()
                if cfg.strategy == "gem" and self.memories:
                    gradient = self._flat_grad(params)
                    projected = gem_project(gradient, self._memory_gradients(params))
                    terms["gem_projected"] = float(projected is not gradient)
                    self._set_flat_grad(params, projected)
                if fisher is not None:  # Fisher of this task's loss: taken before the EWC penalty's gradient is added
                    for f, p in zip(fisher, params):
                        f += p.grad.detach() ** 2 / batches_per_epoch / cfg.epochs
                if cfg.strategy == "ewc" and self.ewc_terms:
                    penalty = self._ewc_penalty()
                    penalty.backward()
                    terms["ewc"] = float(penalty.detach())
                opt.step()
                sched.step()
                last = terms
        if fisher is not None:
            self.ewc_terms.append((fisher, [p.detach().clone() for p in params]))
        return {"last_losses": last, "steps": cfg.epochs * batches_per_epoch}

    def _fit_dpsgd(self, ids, mask, y, planned: dict[str, Any] | None = None) -> dict[str, Any]:
        """DP-SGD (opacus, Poisson sampling) on the adapter + head of a baseline; noise from dpcl.accounting.

        Without ``planned`` the noise multiplier meets ``dpsgd_epsilon`` for this task's run alone. A
        ``planned`` schedule (``noise_multiplier``, ``sample_rate``, ``steps``, ``max_grad_norm``: e.g. one
        calibrated over the whole stream, :func:`dpcl.methods.pecl.experiment.baseline_dpsgd_plan`) is run as
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
        fisher = [torch.zeros_like(p) for p in params] if cfg.strategy == "ewc" else None
        penalty = None
        if cfg.strategy == "ewc" and self.ewc_terms:
            penalty = self._ewc_penalty
        elif cfg.strategy == "olora" and self._olora_penalty() is not None:
            penalty = self._olora_penalty
        run = self._dpsgd_steps(
            ids, mask, y, noise_multiplier=noise_multiplier, sample_rate=sample_rate, steps=steps,
            max_grad_norm=cfg.max_grad_norm, embed=lambda _step, idx: self.embedding(ids[idx]), penalty=penalty,
            fisher=fisher, memories=self.memories if cfg.strategy == "gem" else (),
        )
        if fisher is not None:
            self.ewc_terms.append((fisher, [p.detach().clone() for p in params]))
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

    # ------------------------------------------------------------------ inference
    @torch.inference_mode()
    def class_scores(self, texts: Sequence[str], batch_size: int = 64) -> np.ndarray:
        """Class logits ``[n, n_labels]`` on clean inputs (test data is not trained on), in the order of ``texts``.

        Batches hold sequences of similar length, cut after their longest one (:meth:`_length_batches`)."""
        self.model.eval()
        ids, mask = self._encode(texts)
        out = torch.zeros((ids.shape[0], self.n_labels), dtype=torch.float32)
        for idx, length in self._length_batches(mask, batch_size):
            b_ids, b_mask = ids[idx, :length], mask[idx, :length]
            out[idx.cpu()] = self.model(self.embedding(b_ids), b_mask)[0].float().cpu()
        return out.numpy()

    def accuracies(self, texts: Sequence[str], labels: Sequence[int], label_set: Sequence[int] | None
                   ) -> tuple[float, float]:
        """(class-incremental, task-incremental) accuracy from one pass of :meth:`class_scores`: argmax over the
        labels released so far, and over ``label_set`` (every released label when None)."""
        labels = np.asarray(labels, dtype=np.int64)
        if labels.size == 0:
            return float("nan"), float("nan")
        scores = self.class_scores(texts)
        return (float(np.mean(self._argmax(scores, None) == labels)),
                float(np.mean(self._argmax(scores, label_set) == labels)))

    def _argmax(self, scores: np.ndarray, label_set: Sequence[int] | None) -> np.ndarray:
        if label_set is None:
            allowed = self.seen
        else:
            allowed = np.zeros(self.n_labels, dtype=bool)
            allowed[np.asarray(label_set, dtype=np.int64)] = True
        return np.argmax(np.where(allowed[None, :], scores, -np.inf), axis=1)

    def label_nll(self, texts: Sequence[str], label: int) -> np.ndarray:
        """``-log p(label | text)`` (nats) of each text: the classifier's softmax over the labels released so far.

        An encoder's canary score (:func:`dpcl.methods.pecl.canary.canary_exposures`): with no likelihood of a
        text, a secret memorised from a (canary, label) training pair shows as a lower loss of the true canary
        under its label than of the same prefix with another secret."""
        label = int(label)
        if not 0 <= label < self.n_labels or not self.seen[label]:
            raise InvalidParameterError(
                f"label {label} is not one of the released labels {np.flatnonzero(self.seen).tolist()}; give the "
                "canary's training label."
            )
        scores = torch.as_tensor(self.class_scores(texts), dtype=torch.float64)
        scores[:, torch.as_tensor(~self.seen)] = -torch.inf
        return (-torch.log_softmax(scores, dim=1)[:, label]).numpy()

    def predict(self, texts: Sequence[str], label_set: Sequence[int] | None = None) -> np.ndarray:
        """argmax over the labels released so far (class-incremental prediction), or over ``label_set``
        (task-incremental prediction: the evaluated task's own public label set)."""
        if not self.seen.any():
            raise InvalidParameterError("predict called before any task was fitted.")
        return self._argmax(self.class_scores(texts), label_set)

    def accuracy(self, texts: Sequence[str], labels: Sequence[int], label_set: Sequence[int] | None = None) -> float:
        labels = np.asarray(labels, dtype=np.int64)
        if labels.size == 0:
            return float("nan")
        return float(np.mean(self.predict(texts, label_set) == labels))

    @torch.no_grad()
    def sequence_nll(self, texts: Sequence[str], batch_size: int = 128) -> np.ndarray:
        """Total negative log-likelihood (nats) of each text under the LM (log-perplexity x length)."""
        if not self.model.generative:
            raise InvalidParameterError(
                "sequence_nll needs a causal LM's next-token likelihood; the model is an encoder (no likelihood of "
                "a text): canary exposure by perplexity does not apply to it."
            )
        self.model.eval()
        ids, mask = self._encode(texts)
        out = []
        for s in range(0, ids.shape[0], batch_size):
            b_ids, b_mask = ids[s : s + batch_size], mask[s : s + batch_size]
            _, lm_logits = self.model(self.embedding(b_ids), b_mask)
            out.append(per_token_lm_loss(lm_logits, b_ids, b_mask).sum(1).double().cpu().numpy())
        return np.concatenate(out) if out else np.zeros(0)

    def config_dict(self) -> dict[str, Any]:
        return asdict(self.config)


def learner_config(**overrides: Any) -> LearnerConfig:
    """A :class:`LearnerConfig` with ``overrides`` (unknown keys raise InvalidParameterError)."""
    known = set(LearnerConfig.__dataclass_fields__)
    unknown = sorted(set(overrides) - known)
    if unknown:
        raise InvalidParameterError(f"unknown learner option(s) {unknown}; known: {sorted(known)}.")
    return replace(LearnerConfig(), **overrides)


__all__ = ["ContinualLM", "LearnerConfig", "learner_config", "STRATEGIES", "PRIVACY_MODES"]
