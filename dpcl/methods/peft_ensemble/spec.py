"""PEFT Ensemble's plan (Tobaben et al., Alg. 2), torch-free: ``[method] name = "peft_ensemble"``.

Per task, a fresh adapter + head (``variant = "adapter"``) or fresh FiLM parameters of the encoder's layer
norms + head (``variant = "film"``, :func:`peft_variant`) trained with DP-SGD (Alg. A1) on D_t only. The head
predicts every public label of the stream (``head = "label_space"``, S_prior^const as in the paper's
experiments) or the task's own public labels (``head = "task"``); either set is public and fixed before
training, so it changes neither the data DP-SGD reads (D_t) nor the clipped per-example sensitivity. Poisson
sampling rate q = batch_size / n_t, T = epochs * ceil(n_t / batch_size) steps, noise multiplier calibrated so
that the T-fold subsampled Gaussian meets the per-task epsilon
(:func:`dpcl.accounting.dpsgd.dpsgd_noise_multiplier`). An empty task releases the (data-independent)
initialisation.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Mapping

from dpcl.errors import ConfigError
from dpcl.guarantees.method_schema import MethodKey, TaskPlan, method_value, nonnegative, one_of
from dpcl.guarantees.public_encoder import encoder_modality, packaged_encoder
from dpcl.guarantees.schedules import DPSGD_KEYS, DpSgdSpec
from dpcl.guarantees.settings import PrivacySettings

__all__ = ["PEFT_ENSEMBLE", "PEFT_HEADS", "PEFT_KEYS", "PEFT_VARIANTS", "PeftEnsembleSpec", "peft_variant"]


#: ``[method] variant`` of PEFT Ensemble: what each task's member trains.
PEFT_VARIANTS = ("auto", "adapter", "film")


#: What each PEFT Ensemble member's head predicts (``[method] head``).
PEFT_HEADS = ("label_space", "task")


PEFT_KEYS: tuple[MethodKey, ...] = DPSGD_KEYS + (
    MethodKey("aggregation", str, "argmax", "ensemble prediction rule: 'argmax' (eq. 10), 'median' (eq. A41) "
              "or 'entropy'", one_of("argmax", "median", "entropy")),
    MethodKey("variant", str, "auto", "what each member trains: 'film' (the scale and shift of the [stream] encoder's "
              "layer norms plus a head, as in the paper; needs an image or text encoder), 'adapter' (a residual "
              "adapter and head on precomputed features) or 'auto' (film when [stream] encoder is given, else "
              "adapter)", one_of(*PEFT_VARIANTS)),
    MethodKey("head", str, "label_space", "labels of each member's head: 'label_space' (every public label of the "
              "stream, as S_prior^const in the paper's experiments; the labels a task lacks are the member's "
              "negatives) or 'task' (the task's own public labels O_t only, Sec. 6.3)", one_of(*PEFT_HEADS)),
    MethodKey("normalize_features", bool, False, "adapter variant: l2-normalise each feature vector before the "
              "member, as the cosine classifier does (a fixed per-example map; no privacy cost). Helps the head-only "
              "members (adapter_dim = 0) of the bundled configs; with a per-member adapter it slows learning"),
    MethodKey("center_features", bool, False, "adapter variant: subtract each feature vector's own mean over its "
              "coordinates (before normalize_features), a fixed per-example map; no privacy cost"),
    MethodKey("weight_decay", float, 0.0, "L2 penalty of Adam on the member's parameters, added after clipping and "
              "noise (post-processing; no privacy cost)", nonnegative),
)


def peft_variant(method: Mapping[str, Any]) -> str:
    """The PEFT Ensemble variant a validated ``[method]`` section (with the injected ``encoder``) trains.

    ``film``: per task, the scale and shift of every layer norm of the ``[stream] encoder`` plus a head
    (Tobaben et al., Sec. 5 / App. H: FiLM parameters of a frozen ViT; the same for a text encoder);
    needs an encoder (image or text).
    ``adapter``: a residual adapter and head on precomputed features (the encoder's, or raw pixels).
    ``auto`` resolves to ``film`` when the stream names an encoder, else ``adapter``. Both run the same
    DP-SGD plan: the variant never changes the events or the epsilon.
    """
    requested = str(method.get("variant", "auto") or "auto")
    if requested not in PEFT_VARIANTS:
        raise ConfigError(f"[method] variant must be one of {', '.join(map(repr, PEFT_VARIANTS))}; got {requested!r}.")
    encoder = method.get("encoder")
    if encoder is not None:
        encoder_modality(encoder)  # a model directory dpcl can load (image or text), else ConfigError
    packaged = encoder is not None and packaged_encoder(encoder) is not None
    if requested == "auto":  # a packaged encoder is not a Hugging Face model: FiLM cannot train inside it
        return "film" if encoder is not None and not packaged else "adapter"
    if requested == "film" and packaged:
        raise ConfigError(
            f"[method] variant = 'film' trains the layer norms of a Hugging Face encoder; {encoder!r} is a packaged "
            "encoder, whose features PEFT Ensemble uses with variant = 'adapter' (or 'auto')."
        )
    if requested == "film" and encoder is None:
        raise ConfigError(
            "[method] variant = 'film' trains the layer norms of a pre-trained encoder: set [stream] encoder "
            "to a local Hugging Face model directory (an image model with its image processor, or a text encoder "
            "with its tokenizer), or use variant = 'adapter'."
        )
    return requested


@dataclass(frozen=True)
class PeftEnsembleSpec(DpSgdSpec):
    """PEFT Ensemble's DP-SGD plan (the same events and calibration as :class:`DpSgdSpec`), recording the
    variant (:func:`peft_variant`) in the plan's noise (``peft_variant``) and notes."""

    def trains_encoder(self, method: Mapping[str, Any]) -> bool:
        """True for the ``film`` variant: its members run the encoder, so the stream hands them the encoder's
        inputs (pixel rows, or raw texts for a text encoder), not its features."""
        return peft_variant(method) == "film"

    def plan_task(
        self, method: Mapping[str, Any], privacy: "PrivacySettings | Mapping[str, Any]", n_examples: int, task_index: int
    ) -> TaskPlan:
        variant = peft_variant(method)
        plan = super().plan_task(method, privacy, n_examples, task_index)
        what = (
            "per task, the scale and shift of every layer norm of the frozen pre-trained encoder plus a zero-initialised "
            "head, with per-example gradients from opacus (LayerNorm and Linear grad samplers)"
            if variant == "film"
            else "per task, a residual adapter (none when adapter_dim = 0) and a zero-initialised head on "
            "precomputed (frozen) features"
        )
        head = str(method_value(method, PEFT_KEYS, "head", "peft_ensemble"))
        labels = (
            "every public label of the stream (the labels the task lacks are its negatives)"
            if head == "label_space"
            else "the task's own public labels"
        )
        return dataclasses.replace(
            plan,
            noise={**plan.noise, "peft_variant": variant},
            notes=(
                *plan.notes,
                f"PEFT Ensemble variant {variant!r}: DP-SGD trains {what}; the head predicts {labels} (public, "
                "fixed before training: the same data, clipping and noise whatever its size).",
            ),
        )


#: ``[method] name = "peft_ensemble"``
PEFT_ENSEMBLE = PeftEnsembleSpec(
    "peft_ensemble",
    PEFT_KEYS,
    False,
    "PEFT Ensemble trains a fresh member per task (an adapter, or the encoder's FiLM parameters, and a head) "
    "on that task's data only (Tobaben et al., Alg. 2).",
    method_class="dpcl.methods.peft_ensemble.method:PeftEnsemble",
    data_parallel=True,
    summary="PEFT Ensemble (Tobaben et al., Alg. 2): one DP-SGD member per task",
    cost_estimator="dpcl.runner.method_costs:peft_ensemble_cost",
)
