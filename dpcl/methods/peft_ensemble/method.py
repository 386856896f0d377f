"""PEFT Ensemble (Tobaben et al., Alg. 2, eq. 10, App. H.2).

For every task ``t`` a fresh task model ``f_t`` — a parameter-efficient adapter
(or none: ``adapter_dim = 0``) plus a zero-initialised head — is trained on that
task's data only, with DP-SGD as the task's plan prescribes
(:mod:`dpcl.methods.dpsgd_training`, opacus). The encoder stays frozen and
public: the adapter works on its output features (MiniLM sentence embeddings
for text, raw pixels for digits), l2-normalised when ``normalize_features``.

``head = "label_space"`` (default): the head predicts every public label of the
stream, as the members of the paper's experiments (S_prior^const, "an output
layer of size 100/200", Sec. 6.3); the labels the task lacks are its negatives,
so the rows of its own labels also score how much an input resembles the task,
which makes the members' logits comparable under eq. 10. ``head = "task"``: the
task's own labels ``O_t`` only (Sec. 6.3's S_prior members). A two-label head
trained from zero has logits ``(z, -z)`` (the two rows' gradients cancel), so
eq. 10 then picks the most confident member whatever the input's task. Both
label sets are public and fixed before training: the member reads the same
data with the same clipping and noise, so the plan and its events do not depend
on the choice. The ensemble ``{f_1, ..., f_t}`` predicts by one of three
aggregation rules over the labels released so far:

* ``argmax`` (eq. 10): the label of the largest logit of any model;
* ``median`` (eq. A41): each model's logits minus that model's median logit
  over the labels released so far, then the largest;
* ``entropy`` (App. H.2, the entropy-weighted rule of Zhao et al. 2024, eq. 11,
  with gamma = 1): model ``l`` gets weight ``softmax_l(-gamma * H(p_l))`` where
  ``p_l`` is its softmax over its own labels and ``H`` the Shannon entropy;
  the score of label ``o`` is the weighted sum of the *logits*,
  ``sum_l w_l f_l(x, o)`` over the models that predict ``o``, as in the SAFE
  reference implementation (weights on the learners' logits, not on their
  probabilities). Tobaben et al. do not say how members with different label
  sets are combined; a model contributes nothing to labels it does not predict.

Raw-text streams without ``[stream] encoder`` (no features, ``input_dim = 0``):
each member is a LoRA adapter on the bundled pre-trained MiniLM encoder plus a
head (:mod:`dpcl.methods.lora_text`, ``adapter_dim`` = LoRA rank), trained the
same way. (With a text encoder the ``film`` variant below reads the raw texts.)

An empty task (no example left after label filtering) gets a plan with no
steps and no charge: its member is released at its data-independent
initialisation (a zero head), still a proper classifier (Prop. F.1). A private plan with steps on empty data (not what
the spec plans) would take noise-only DP-SGD steps.

Variants (``[method] variant``, resolved by :func:`dpcl.methods.peft_ensemble.spec.peft_variant`
and recorded in every plan's noise and notes, hence in audits and certificates):

* ``film`` -- as in the paper: each member trains the FiLM parameters (scale and
  shift of every layer norm) of the frozen pre-trained encoder named by
  ``[stream] encoder``, plus a zero-initialised head (:mod:`dpcl.methods.film`).
  The stream hands it what the encoder reads (``trains_encoder``): pixel rows for
  an image encoder (ViT-style), the raw texts for a text encoder (BERT-style,
  e.g. MiniLM; tokenised once per task, mean-pooled as the feature path does).
  Per-example gradients come from opacus' LayerNorm and Linear grad samplers.
* ``adapter`` -- the residual adapter (or LoRA on raw text) described above, on
  precomputed features: the default without an encoder.
* ``auto`` (default) -- ``film`` when ``[stream] encoder`` is given (image or text), else ``adapter``.

Both variants run the same DP-SGD plan (sampling rate, steps, noise multiplier,
clipping norm), so the variant never changes the privacy cost.

Hyper-parameters read from the ``[method]`` section: ``learning_rate``,
``adapter_dim`` (adapter variant), ``aggregation``, ``variant``, ``head``,
``center_features`` and ``normalize_features`` (adapter variant: each feature
vector minus its own mean, then l2-normalised; fixed per-example maps, applied
alike in training and prediction, so no privacy cost), ``weight_decay`` (Adam's
L2 penalty, applied after clipping and noise: post-processing), and
``max_grad_norm`` / ``batch_size`` / ``epochs`` (the last three enter the plan).
"""

from __future__ import annotations

from typing import Any, Mapping

import numpy as np
import torch

from dpcl.data.pretrained import (
    image_embedding,
    load_pretrained,
    pixel_settings,
    text_embedding,
    text_tokens,
    to_pixel_values,
)
from dpcl.errors import ConfigError, InvalidParameterError
from dpcl.guarantees.public_encoder import encoder_directory, encoder_fingerprint, encoder_modality
from dpcl.methods.peft_ensemble.spec import PEFT_HEADS, peft_variant
from dpcl.methods.base import ContinualMethod, MethodSetup, ProgressCallback, TrainingData, TrainingTask
from dpcl.methods.dpsgd_training import AdapterClassifier, schedule_from_plan, seeded_adapter, train_classifier
from dpcl.methods.film import FilmClassifier, TextFilmClassifier, freeze_all_but_film
from dpcl.methods.lora_text import LoraTextEncoder, TextMember, pooled_features, tokenize

#: Aggregation rules of the ensemble (Tobaben et al., eq. 10, eq. A41, App. H.2).
AGGREGATION_RULES = ("argmax", "median", "entropy")

#: gamma of the entropy rule (the value recommended by Zhao et al. and used by Tobaben et al., App. H.2).
ENTROPY_GAMMA = 1.0


def method_option(method: Mapping[str, Any], key: str, default: Any) -> Any:
    """``[method] key`` if the validated section has it, else the documented default."""
    value = method.get(key, default)
    return default if value is None else value


def aggregate(logits: np.ndarray, label_masks: np.ndarray, released: np.ndarray, rule: str) -> np.ndarray:
    """Ensemble scores [n, L] from per-model logits [m, n, L].

    ``label_masks`` [m, L] says which labels model ``l`` predicts (its ``O_l``);
    ``released`` [L] the labels released so far. Entries of ``logits`` outside a
    model's labels are ignored. Vectorised over models, examples and labels.
    """
    if rule not in AGGREGATION_RULES:
        raise ConfigError(f"[method] aggregation must be one of {', '.join(AGGREGATION_RULES)}; got {rule!r}.")
    logits = np.asarray(logits, dtype=np.float64)
    masks = np.asarray(label_masks, dtype=bool)[:, None, :]
    if rule == "argmax":
        return np.where(masks, logits, -np.inf).max(axis=0)
    if rule == "median":
        # median over the labels released so far of each model's own logits (eq. A41)
        considered = masks & np.asarray(released, dtype=bool)[None, None, :]
        median = np.nanmedian(np.where(considered, logits, np.nan), axis=2, keepdims=True)
        return np.where(masks, logits - median, -np.inf).max(axis=0)
    # entropy weights from each model's probabilities over its own labels, applied to its logits (SAFE, eq. 11)
    shifted = np.where(masks, logits, -np.inf)
    shifted = shifted - shifted.max(axis=2, keepdims=True)
    probs = np.where(masks, np.exp(shifted), 0.0)
    probs /= probs.sum(axis=2, keepdims=True)
    entropy = -np.sum(np.where(probs > 0, probs * np.log(np.where(probs > 0, probs, 1.0)), 0.0), axis=2)  # [m, n]
    weights = np.exp(-ENTROPY_GAMMA * (entropy - entropy.min(axis=0, keepdims=True)))
    weights /= weights.sum(axis=0, keepdims=True)
    return np.einsum("mn,mnl->nl", weights, np.where(masks, logits, 0.0))


class PeftEnsemble(ContinualMethod):
    """Alg. 2: one DP-SGD-trained adapter + head per task, combined by an aggregation rule."""

    name = "peft_ensemble"

    def __init__(self, setup: MethodSetup) -> None:
        super().__init__(setup)
        method = setup.method
        self.variant = peft_variant(method)
        #: film variant: the encoder directory, its files' fingerprint, the backbone (loaded on first use), members
        self.encoder_path = method.get("encoder") if self.variant == "film" else None
        self.encoder_sha256: str | None = None
        #: film variant: "image" (pixel rows in, FilmClassifier) or "text" (texts in, TextFilmClassifier)
        self.encoder_modality: str | None = None
        if self.encoder_path is not None:
            self.encoder_sha256 = encoder_fingerprint(self.encoder_path)
            self.encoder_modality = encoder_modality(self.encoder_path)
        self._film_model: Any = None
        self.film_members: list[dict[str, Any]] = []
        self.device = torch.device(setup.device)
        self.adapter_dim = int(method_option(method, "adapter_dim", 64))
        self.learning_rate = float(method_option(method, "learning_rate", 1e-3))
        self.aggregation = str(method_option(method, "aggregation", "argmax"))
        self.head = str(method_option(method, "head", "label_space"))
        if self.head not in PEFT_HEADS:
            raise ConfigError(f"[method] head must be one of {', '.join(map(repr, PEFT_HEADS))}; got {self.head!r}.")
        self.normalize_features = bool(method_option(method, "normalize_features", False))
        self.center_features = bool(method_option(method, "center_features", False))
        self.weight_decay = float(method_option(method, "weight_decay", 0.0))
        if not np.isfinite(self.weight_decay) or self.weight_decay < 0:
            raise ConfigError(f"[method] weight_decay must be a finite number >= 0, got {self.weight_decay}.")
        if self.aggregation not in AGGREGATION_RULES:
            raise ConfigError(
                f"[method] aggregation must be one of {', '.join(AGGREGATION_RULES)}; got {self.aggregation!r}."
            )
        if self.adapter_dim < 0:
            raise ConfigError(f"[method] adapter_dim must be >= 0, got {self.adapter_dim}.")
        #: initialisation only (adapter seeds); noise and Poisson masks come from :meth:`noise_generator`
        # a CPU generator whatever the device: its state restores on any device, so a run resumed on
        # another device initialises later models exactly as an uninterrupted run would
        self.generator = torch.Generator(device="cpu").manual_seed(int(setup.seed))
        self.models: list[AdapterClassifier] = []
        self.model_labels: list[tuple[int, ...]] = []
        #: raw-text mode (input_dim 0, no encoder): members are LoRA adapters on MiniLM (dpcl.methods.lora_text)
        self.text_mode = int(setup.input_dim) == 0 and self.variant != "film"
        if self.text_mode and self.adapter_dim < 1:
            raise ConfigError(
                "[method] adapter_dim is the LoRA rank on raw-text streams and must be an integer >= 1 there "
                f"(0, head-only training, needs encoder features: dataset = 'fortunes'); got {self.adapter_dim}."
            )
        if self.center_features and (self.text_mode or self.variant == "film"):
            raise ConfigError(
                "[method] center_features = true centres precomputed feature vectors (the adapter variant); this "
                f"ensemble trains {'LoRA members on raw texts' if self.text_mode else 'FiLM members inside the encoder'}"
                ", which read no such vectors. Remove center_features, or give the stream precomputed features."
            )
        self.text_members: list[dict[str, Any]] = []
        self._text_encoder: Any = None

    def _encoder(self) -> Any:
        if self._text_encoder is None:
            self._text_encoder = LoraTextEncoder(self.adapter_dim).to(self.device)
        return self._text_encoder

    def _features(self, features: np.ndarray) -> torch.Tensor:
        """What an adapter member reads: the feature rows, each minus its own mean over its coordinates when
        ``center_features`` (so that raw pixels, all >= 0, do not make every image resemble every task), then
        l2-normalised when ``normalize_features`` (as the cosine classifier, Alg. 1, line 13), so that no member's
        logits grow with the scale of its inputs. Both are per-example maps: they read no other example."""
        x = torch.tensor(np.asarray(features), dtype=torch.float32, device=self.device)
        if self.center_features:
            x = x - x.mean(dim=1, keepdim=True)
        if self.normalize_features:
            x = torch.nn.functional.normalize(x, dim=1)
        return x

    def _train(self, task_index: int, model: Any, inputs: Any, targets: np.ndarray, schedule: Any,
               progress: ProgressCallback | None) -> None:
        """One member's DP-SGD run at the plan's schedule (dpcl.methods.dpsgd_training.train_classifier)."""
        train_classifier(
            model,
            inputs,
            torch.as_tensor(targets, dtype=torch.long, device=self.device),
            schedule,
            learning_rate=self.learning_rate,
            generator=self.noise_generator(task_index),  # Poisson masks + DP-SGD noise
            progress=progress,
            weight_decay=self.weight_decay,
        )

    def _fit_text_member(self, task_index: int, data: TrainingData, targets: np.ndarray, n_outputs: int,
                         schedule: Any, progress: ProgressCallback | None) -> None:
        if data.texts is None:
            raise InvalidParameterError("text mode needs the raw texts of the task (TrainingData.texts).")
        encoder = self._encoder()
        encoder.reset_adapter(int(torch.randint(0, 2**31 - 1, (1,), generator=self.generator)))
        member = TextMember(encoder, n_outputs).to(self.device)
        self._train(task_index, member, tokenize(data.texts, self.device), targets, schedule, progress)
        self.text_members.append(
            {"adapter": encoder.adapter_state(), "head": {k: v.detach().cpu().clone() for k, v in member.head.state_dict().items()}}
        )

    def _film_backbone(self) -> tuple[Any, Any, dict[str, torch.Tensor]]:
        """(backbone with only its FiLM parameters trainable, its input settings, pre-trained FiLM values).

        The input settings are the image processor's :class:`~dpcl.data.pretrained.PixelSettings` for an image
        encoder, the tokenizer for a text encoder."""
        if self._film_model is None:
            import copy

            shared, tokenizer = load_pretrained(self.encoder_path, str(self.device))
            backbone = copy.deepcopy(shared)  # the process-wide cached encoder stays untouched
            names = freeze_all_but_film(backbone)
            params = dict(backbone.named_parameters())
            initial = {name: params[name].detach().clone() for name in names}
            settings = tokenizer if self.encoder_modality == "text" else pixel_settings(self.encoder_path)
            self._film_model = (backbone, settings, initial)
        return self._film_model

    def _film_inputs(self, examples: np.ndarray) -> Any:
        """What a FiLM member reads, on the device: the pixel rows ``[n, C * S * S]`` as a tensor, or
        ``(input_ids, attention_mask)`` of an array of texts (one tokenizer call, padded to the longest)."""
        if self.encoder_modality != "text":
            return torch.tensor(np.asarray(examples), dtype=torch.float32, device=self.device)
        _, tokenizer, _ = self._film_backbone()
        return text_tokens(tokenizer, np.asarray(examples, dtype=object).ravel().tolist(), self.device)

    def _load_film(self, backbone: Any, film: Mapping[str, torch.Tensor]) -> None:
        params = dict(backbone.named_parameters())
        with torch.no_grad():
            for name, value in film.items():
                params[name].copy_(value.to(params[name].device))

    def _fit_film_member(self, task_index: int, data: TrainingData, targets: np.ndarray, n_outputs: int,
                         schedule: Any, progress: ProgressCallback | None) -> None:
        backbone, settings, initial = self._film_backbone()
        self._load_film(backbone, initial)  # every member starts from the public pre-trained values
        if self.encoder_modality == "text":
            if data.texts is None:
                raise InvalidParameterError("a text FiLM member needs the raw texts of the task (TrainingData.texts).")
            member: Any = TextFilmClassifier(backbone, n_outputs).to(self.device)
            inputs = self._film_inputs(data.texts)
        else:
            member = FilmClassifier(backbone, settings, n_outputs).to(self.device)
            inputs = self._film_inputs(data.features)
        self._train(task_index, member, inputs, targets, schedule, progress)
        params = dict(backbone.named_parameters())
        self.film_members.append({
            "film": {name: params[name].detach().cpu().clone() for name in initial},
            "head": {k: v.detach().cpu().clone() for k, v in member.head.state_dict().items()},
        })

    def _film_logits(self, inputs: Any, member: Mapping[str, Any], batch_size: int = 256) -> torch.Tensor:
        """A member's logits over its labels for pixel rows, or for ``(input_ids, attention_mask)`` of texts."""
        backbone, settings, _ = self._film_backbone()
        self._load_film(backbone, member["film"])
        weight, bias = member["head"]["weight"].to(self.device), member["head"]["bias"].to(self.device)
        parts = inputs if isinstance(inputs, tuple) else (inputs,)
        out = []
        for start in range(0, parts[0].shape[0], batch_size):  # batches of examples, bounded memory
            batch = [x[start : start + batch_size] for x in parts]
            if self.encoder_modality == "text":
                features = text_embedding(backbone, *batch)
            else:
                features = image_embedding(backbone, to_pixel_values(batch[0], settings))
            out.append(features @ weight.T + bias)
        return torch.cat(out) if out else torch.zeros((0, weight.shape[0]), device=self.device)

    def _new_model(self, n_outputs: int) -> AdapterClassifier:
        return seeded_adapter(int(self.setup.input_dim), n_outputs, self.adapter_dim, self.generator, self.device)

    def learn_task(self, task: TrainingTask, progress: ProgressCallback | None = None) -> None:
        data, task_labels = task.data, np.asarray(task.output_labels, dtype=np.int64)
        planned = task.plan.noise.get("peft_variant")
        if planned is not None and planned != self.variant:
            raise InvalidParameterError(
                f"task {task.index}'s plan is for PEFT variant {planned!r} but this ensemble trains {self.variant!r}."
            )
        schedule = schedule_from_plan(task.plan, self.setup.method, len(data))
        # the member's head: every public label (S_prior^const, the default) or the task's own O_t
        member_labels = np.asarray(self.label_space if self.head == "label_space" else np.sort(task_labels))
        targets = np.searchsorted(member_labels, np.asarray(data.labels, dtype=np.int64))  # sorted, holds every label
        if self.variant == "film":
            self._fit_film_member(task.index, data, targets, member_labels.size, schedule, progress)
        elif self.text_mode:
            self._fit_text_member(task.index, data, targets, member_labels.size, schedule, progress)
        else:
            model = self._new_model(member_labels.size)
            self._train(task.index, model, self._features(data.features), targets, schedule, progress)
            self.models.append(model)
        self.model_labels.append(tuple(int(o) for o in member_labels))

    def member_logits(self, features: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Logits [m, n, L] of every ensemble member over the label space, and masks [m, L] of their labels.

        In text mode, and for FiLM on a text encoder, ``features`` is a 1-D array of texts.
        """
        n_labels = len(self.label_space)
        if self.variant == "film":
            rows = self._film_inputs(features)
            n = (rows[0] if isinstance(rows, tuple) else rows).shape[0]
            logits = np.zeros((len(self.film_members), n, n_labels))
            masks = np.zeros((len(self.film_members), n_labels), dtype=bool)
            with torch.no_grad():
                for i, (member, labels) in enumerate(zip(self.film_members, self.model_labels)):
                    positions = self.label_positions(labels)
                    logits[i][:, positions] = self._film_logits(rows, member).double().cpu().numpy()
                    masks[i, positions] = True
            return logits, masks
        if self.text_mode:
            inputs = tokenize(np.asarray(features, dtype=object).ravel(), self.device)
            logits = np.zeros((len(self.text_members), inputs[0].shape[0], n_labels))
            masks = np.zeros((len(self.text_members), n_labels), dtype=bool)
            for i, (member, labels) in enumerate(zip(self.text_members, self.model_labels)):
                pooled = pooled_features(self._encoder(), member["adapter"], inputs)
                weight, bias = member["head"]["weight"].to(self.device), member["head"]["bias"].to(self.device)
                positions = self.label_positions(labels)
                logits[i][:, positions] = (pooled @ weight.T + bias).double().cpu().numpy()
                masks[i, positions] = True
            return logits, masks
        x = self._features(features)
        logits = np.zeros((len(self.models), x.shape[0], n_labels))
        masks = np.zeros((len(self.models), n_labels), dtype=bool)
        with torch.no_grad():
            for i, (model, labels) in enumerate(zip(self.models, self.model_labels)):
                positions = self.label_positions(labels)
                logits[i][:, positions] = model(x).double().cpu().numpy()
                masks[i, positions] = True
        return logits, masks

    def certificate_extra(self, task_index: int) -> dict[str, Any]:
        """What the certificate records about the ensemble: its variant and, for ``film``, the encoder it
        trains inside (resolved path and files' SHA-256; the backbone is public and not in the checkpoint)."""
        extra: dict[str, Any] = {"variant": self.variant, "members": len(self.model_labels)}
        if self.variant == "film":
            extra["encoder"] = {"path": str(encoder_directory(self.encoder_path)), "sha256": self.encoder_sha256,
                                "modality": self.encoder_modality,
                                "trained": "scale and shift of every nn.LayerNorm (FiLM), per member, plus a head"}
        return {"peft_ensemble": extra}

    def scores(self, features: np.ndarray) -> np.ndarray:
        """Eq. 10 (or A41, or the entropy rule) over the labels released so far: a member's logits for labels
        no task has released yet take no part (its head may predict them, ``head = "label_space"``)."""
        logits, masks = self.member_logits(features)
        return aggregate(logits, masks & self.seen_labels[None, :], self.seen_labels, self.aggregation)

    def state_dict(self) -> dict[str, Any]:
        return {
            **self._base_state(),
            "label_space": list(self.label_space),
            "adapter_dim": self.adapter_dim,
            "models": [{k: v.detach().cpu().clone() for k, v in m.state_dict().items()} for m in self.models],
            "text_members": list(self.text_members),
            "variant": self.variant,
            "encoder_sha256": self.encoder_sha256,
            "film_members": list(self.film_members),
            "model_labels": [list(labels) for labels in self.model_labels],
            "generator_state": self.generator.get_state(),
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        if list(state["label_space"]) != list(self.label_space) or int(state["adapter_dim"]) != self.adapter_dim:
            raise InvalidParameterError("checkpoint was written for another label space or adapter size.")
        if state.get("variant", "adapter") != self.variant or state.get("encoder_sha256") != self.encoder_sha256:
            raise InvalidParameterError(
                f"checkpoint was written for PEFT variant {state.get('variant', 'adapter')!r} with encoder files "
                f"sha256 {state.get('encoder_sha256')}; this run trains {self.variant!r} with {self.encoder_sha256}."
            )
        self._load_base_state(state)
        self.models, self.model_labels = [], []
        self.text_members = [dict(m) for m in state.get("text_members", [])]
        self.film_members = [dict(m) for m in state.get("film_members", [])]
        if self.text_mode or self.variant == "film":
            self.model_labels = [tuple(int(o) for o in labels) for labels in state["model_labels"]]
        for weights, labels in zip(state["models"], [] if self.text_mode or self.variant == "film" else state["model_labels"]):
            model = AdapterClassifier(int(self.setup.input_dim), len(labels), self.adapter_dim).to(self.device)
            model.load_state_dict(weights)
            model.eval()
            self.models.append(model)
            self.model_labels.append(tuple(int(o) for o in labels))
        self.generator.set_state(state["generator_state"])
