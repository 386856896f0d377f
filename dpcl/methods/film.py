"""FiLM members of PEFT Ensemble: the layer-norm scale and shift of a frozen pre-trained encoder, plus a head.

Tobaben et al. (Sec. 5, App. H) fine-tune a ViT-B/16 pre-trained on public data
with FiLM parameters (Perez et al. 2018; Tobaben et al. 2023 "On the efficacy of
DP few-shot image classification"): the scale ``gamma`` and shift ``beta`` of
every layer norm inside the backbone are trained, everything else of the
backbone stays frozen, and a linear head (zero-initialised) classifies the
backbone's feature. The backbone is loaded offline from ``[stream] encoder``
(:func:`dpcl.data.pretrained.load_pretrained`), and the feature is the one the
feature path (:func:`dpcl.data.pretrained.encode_with_encoder`) computes:

* :class:`FilmClassifier`, an **image encoder** (ViT-style): images are resized
  and normalised on the device as its image processor says
  (:func:`dpcl.data.pretrained.to_pixel_values`), the feature is the ``[CLS]``
  token of the last hidden state (:func:`dpcl.data.pretrained.image_embedding`);
* :class:`TextFilmClassifier`, a **text encoder** (BERT-style, e.g. MiniLM): the
  method tokenises the task's texts once (:func:`dpcl.data.pretrained.text_tokens`,
  padded to the longest text, truncated at ``min(model_max_length, 512)``) and
  the feature is the attention-masked mean of the last hidden state
  (:func:`dpcl.data.pretrained.text_embedding`). The same FiLM idea applied to a
  transformer text encoder (the paper's experiments are on images only).

The frozen backbone also keeps its dropout off (eval mode) while the member
trains: "frozen" means the feature map differs from the pre-trained one only
through the trained FiLM parameters, and the features are those of the feature
path (which runs in eval mode). Only the head and the layer norms are put in
train mode (opacus records activations of modules in train mode only), which
changes nothing in what they compute.

Per-example gradients: :func:`dpcl.methods.dpsgd_training.train_classifier`
wraps the model in opacus' ``GradSampleModule`` (hooks mode), whose registered
grad samplers compute them for exactly the trainable modules here:
``opacus.grad_sample.layer_norm.compute_layer_norm_grad_sample`` for every
``nn.LayerNorm`` (gamma and beta; for text it sums over the token positions of
each example, padded positions contributing zero since the masked mean and the
attention mask ignore them) and ``opacus.grad_sample.linear.compute_linear_grad_sample``
for the head. Frozen modules (patch or token embeddings, attention and MLP
weights, position embeddings) have no trainable parameter, so opacus neither
hooks nor clips them; clipping and noise are opacus' ``DPOptimizer`` over the
FiLM parameters and the head together. No functorch path is used.

Each task starts from the pre-trained (public, data-independent) layer-norm
values, so a member's FiLM parameters are a function of its own task's DP-SGD
run only; the members share the frozen backbone, which is public and named in
every certificate (by path and files' SHA-256), not released in checkpoints.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from dpcl.data.pretrained import image_embedding, text_embedding, to_pixel_values

__all__ = ["FilmClassifier", "TextFilmClassifier", "film_parameter_names", "freeze_all_but_film"]


def film_parameter_names(backbone: nn.Module) -> list[str]:
    """Names of the FiLM parameters of ``backbone``: weight (scale) and bias (shift) of every ``nn.LayerNorm``."""
    names = []
    for module_name, module in backbone.named_modules():
        if isinstance(module, nn.LayerNorm):
            for param_name, _ in module.named_parameters(recurse=False):
                names.append(f"{module_name}.{param_name}" if module_name else param_name)
    return names


def freeze_all_but_film(backbone: nn.Module) -> list[str]:
    """Freeze ``backbone`` except its layer norms' scale and shift; returns their names."""
    backbone.requires_grad_(False)
    for module in backbone.modules():
        if isinstance(module, nn.LayerNorm):
            module.requires_grad_(True)
    names = film_parameter_names(backbone)
    if not names:
        raise ValueError("the encoder has no nn.LayerNorm: it has no FiLM parameters to train.")
    return names


class _FilmModel(nn.Module):
    """A frozen backbone (FiLM parameters aside) and a zero-initialised linear head over its feature."""

    def __init__(self, backbone: nn.Module, n_outputs: int) -> None:
        super().__init__()
        self.backbone = backbone
        self.head = nn.Linear(int(backbone.config.hidden_size), n_outputs)
        nn.init.zeros_(self.head.weight)
        nn.init.zeros_(self.head.bias)

    def train(self, mode: bool = True) -> "_FilmModel":
        """``mode`` for the head and the layer norms only: the rest of the frozen backbone stays in eval mode
        (no dropout, in attention either), see the module doc. The layer norms follow ``mode`` because opacus
        records a module's activations in train mode only; a layer norm computes the same in either mode."""
        super().train(mode)
        self.backbone.eval()
        for module in self.backbone.modules():
            if isinstance(module, nn.LayerNorm):
                module.train(mode)
        return self


class FilmClassifier(_FilmModel):
    """``logits = W cls(backbone_FiLM(preprocess(x))) + b``: pixel rows ``[b, C * S * S]`` in [0, 1] -> logits."""

    def __init__(self, backbone: nn.Module, settings: Any, n_outputs: int) -> None:
        super().__init__(backbone, n_outputs)
        self.settings = settings

    def forward(self, rows: torch.Tensor) -> torch.Tensor:
        return self.head(image_embedding(self.backbone, to_pixel_values(rows, self.settings)))


class TextFilmClassifier(_FilmModel):
    """``logits = W meanpool(backbone_FiLM(tokens)) + b``: ``(input_ids, attention_mask)`` ``[b, L]`` -> logits."""

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        return self.head(text_embedding(self.backbone, input_ids, attention_mask))
