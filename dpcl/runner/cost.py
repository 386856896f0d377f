"""What a training config costs: parameters, peak memory, optimiser steps and examples, and whether it fits.

``dpcl audit`` reports this beside the privacy guarantee (the ``cost`` section,
also in ``--json``), and refuses (exit 2) a config whose estimated peak memory
exceeds what the chosen device has free; ``dpcl run`` makes the same check
before it builds the method, so a run that cannot fit is refused before
anything is allocated (:func:`check_fits`).

Parameters are counted without allocating: the torch models are built on the
``meta`` device (shapes only, no storage), the rest from the shapes the
methods allocate. The memory estimate adds up, per release, what training
holds at its peak:

* ``model``: every parameter of the method (all members of a PEFT ensemble after
  the last task), float32 (float64 for L2DP-ML and the cosine class sums);
* ``gradients`` and ``optimizer_state``: one gradient and Adam's two moments per
  trainable parameter;
* ``per_example_gradients`` (DP-SGD): opacus keeps one gradient per example of
  the Poisson batch, ``batch x trainable`` floats. The batch is the expected
  size ``q n`` plus four standard deviations of the binomial batch size (a
  larger batch occurs with probability below 4e-5 per step);
* ``activations``: the layer outputs of one batch that backpropagation keeps
  (the adapter models; for transformers, hidden states of every layer);
* ``data``: the release's training data as a torch tensor on the device;
* ``work_arrays``: method-specific temporaries (L2DP-ML's per-batch coefficient
  matrices, the cosine classifier's float64 copy of the features).

The estimate excludes what the process holds before training (the Python
interpreter, torch's own libraries, the loaded data set): the device's free
memory is measured after those (:func:`memory_headroom`). ``docs/audit.md``
states how the estimate compared with measured peaks.

This module is in the runner layer: it imports torch (lazily, only to count
parameters on the meta device). Without torch the audit says the cost is
unavailable and why (:func:`training_cost` returns a :class:`CostUnavailable`).
"""

from __future__ import annotations

import math
import os
import resource
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, Sequence

from dpcl.data.idx import find_idx_files
from dpcl.errors import ConfigError
from dpcl.guarantees.label_space import output_label_sets
from dpcl.guarantees.public_encoder import _read_json, encoder_directory, packaged_encoder
from dpcl.guarantees.schedules import dpsgd_schedule
from dpcl.methods.peft_ensemble.spec import peft_variant

__all__ = [
    "CostUnavailable",
    "MemoryHeadroom",
    "TrainingCost",
    "check_fits",
    "estimate_training_cost",
    "memory_headroom",
    "stream_input_dim",
    "training_cost",
]

FLOAT32, FLOAT64, INT64 = 4, 8, 8
#: Batch x trainable arrays opacus holds at once in a DP-SGD step: the grad samples the backward hooks compute,
#: the per-step accumulation buffer they are copied into, and the clipped product summed over the batch.
OPACUS_COPIES = 3
#: Standard deviations of the Poisson batch size above its mean that the per-example gradients are sized for.
BATCH_SIGMAS = 4.0


@dataclass(frozen=True)
class TrainingCost:
    """The estimated cost of training a config (see the module docstring for what each memory part holds)."""

    method: str
    device: str
    input_dim: int
    trainable_parameters: int
    total_parameters: int
    memory_bytes: Mapping[str, int]
    optimizer_steps: int
    examples_processed: int
    #: the ``[method]`` (or ``[stream]``) key that drives the largest memory part: what to change to fit
    largest_key: str
    notes: tuple[str, ...] = ()

    @property
    def peak_memory_bytes(self) -> int:
        return int(sum(self.memory_bytes.values()))

    def to_dict(self) -> dict[str, Any]:
        return {
            "available": True,
            "method": self.method,
            "device": self.device,
            "input_dim": self.input_dim,
            "trainable_parameters": self.trainable_parameters,
            "total_parameters": self.total_parameters,
            "peak_memory_bytes": self.peak_memory_bytes,
            "memory_bytes": dict(self.memory_bytes),
            "optimizer_steps": self.optimizer_steps,
            "examples_processed": self.examples_processed,
            "largest_key": self.largest_key,
            "notes": list(self.notes),
        }


@dataclass(frozen=True)
class CostUnavailable:
    """Why no estimate could be made (torch missing, a stream without data...): the audit reports it, never fails."""

    reason: str

    def to_dict(self) -> dict[str, Any]:
        return {"available": False, "reason": self.reason}


@dataclass(frozen=True)
class MemoryHeadroom:
    """Bytes the device can still give this process, and which limit sets it (``limits``: every limit found)."""

    device: str
    bytes: int
    binding: str
    limits: Mapping[str, int] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {"device": self.device, "free_bytes": self.bytes, "binding": self.binding, "limits": dict(self.limits)}


def human_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB", "PiB"):
        if abs(n) < 1024 or unit == "PiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} PiB"  # pragma: no cover


# -- the input dimension ----------------------------------------------------------------------------------------
def stream_input_dim(config: Any) -> tuple[int | None, str]:
    """The feature dimension the method will be built with, read without loading the features; ``(None, why)``
    when it cannot be known before the data is loaded (``dpcl run`` then uses the loaded features)."""
    stream = config.raw.get("stream", {})
    encoder = stream.get("encoder")
    dataset = stream.get("dataset")
    options = dict(stream.get("dataset_options") or {})
    method_class_trains_encoder = config.method.get("name") == "peft_ensemble" and _peft_variant(config) == "film"
    if encoder is not None and not method_class_trains_encoder:
        return _encoder_feature_dim(encoder)
    if dataset == "digits":
        return 64, ""
    if dataset == "fortunes":
        return 384, ""  # MiniLM sentence embeddings (dpcl.data.encoder)
    if dataset == "fortunes_texts":
        return 0, ""
    if isinstance(dataset, str) and dataset.startswith("idx:"):
        return _idx_dim(dataset[4:], str(options.get("prefix", "")))
    if isinstance(dataset, str) and dataset.startswith("cifar:"):
        return 3072, ""
    if isinstance(dataset, str) and dataset.startswith("image_folder:") and options.get("size"):
        height, width = (int(v) for v in options["size"])
        return height * width * (3 if options.get("mode", "L") == "RGB" else 1), ""
    return None, f"the feature dimension of [stream] dataset {dataset!r} is known only once its data is loaded"


def _peft_variant(config: Any) -> str:

    return peft_variant(config.method)


def _encoder_feature_dim(encoder: Any) -> tuple[int | None, str]:

    packaged = packaged_encoder(encoder)
    if packaged is not None:
        return packaged.feature_dim, ""
    try:
        cfg = _read_json(encoder_directory(encoder) / "config.json")
    except Exception as exc:  # noqa: BLE001 - the audit reports why, the run reads the loaded features
        return None, f"[stream] encoder {encoder!r}: {exc}"
    for key in ("hidden_size", "hidden_sizes", "dim", "d_model"):
        value = cfg.get(key)
        if isinstance(value, list) and value:
            value = value[-1]
        if isinstance(value, int) and value > 0:
            return value, ""
    return None, f"[stream] encoder {encoder!r}: its config.json gives no hidden_size"


def _idx_dim(folder: str, prefix: str) -> tuple[int | None, str]:
    import gzip


    try:
        path = find_idx_files(folder, prefix=prefix)[("train", "images")]
        with open(path, "rb") as raw:
            head = raw.read(2)
        opener = gzip.open if head == b"\x1f\x8b" else open
        with opener(path, "rb") as f:
            header = f.read(16)
        rows, cols = int.from_bytes(header[8:12], "big"), int.from_bytes(header[12:16], "big")
    except Exception as exc:  # noqa: BLE001 - reported, never fatal to the audit
        return None, f"cannot read the image size of idx:{folder} ({exc})"
    return rows * cols, ""


# -- parameters counted on the meta device -------------------------------------------------------------------------
#: Models with more parameters than this are counted analytically only (building them, even on ``meta``, is slow).
META_LIMIT = 1 << 36


def _meta_adapter_parameters(input_dim: int, n_outputs: int, adapter_dim: int) -> tuple[int, int]:
    """(trainable, total) parameters of :class:`~dpcl.methods.dpsgd_training.AdapterClassifier`, built on ``meta``
    (analytically, ``2 d a + a + d`` for the adapter and ``d L + L`` for the head, when that is beyond
    :data:`META_LIMIT`)."""
    analytic = (2 * input_dim * adapter_dim + adapter_dim + input_dim if adapter_dim > 0 else 0) + (
        input_dim * n_outputs + n_outputs)
    if analytic > META_LIMIT:
        return analytic, analytic
    import torch

    # lazy import: loads torch (counting parameters needs the model); the audit works without it
    from dpcl.methods.dpsgd_training import AdapterClassifier

    with torch.device("meta"):
        model = AdapterClassifier(input_dim, n_outputs, adapter_dim)
    total = sum(p.numel() for p in model.parameters())
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    return int(trainable), int(total)


def _meta_transformer(path: Any, *, causal: bool = False, config_overrides: Mapping[str, Any] | None = None,
                      gpt2: Mapping[str, Any] | None = None) -> Any:
    """A transformers model on ``meta`` from a local directory's config (or a fresh GPT-2 config): shapes only."""
    import torch

    with torch.device("meta"):
        if gpt2 is not None:
            from transformers import GPT2Config, GPT2LMHeadModel

            return GPT2LMHeadModel(GPT2Config(**gpt2))
        from transformers import AutoConfig, AutoModel, AutoModelForCausalLM

        cfg = AutoConfig.from_pretrained(str(path), local_files_only=True, **dict(config_overrides or {}))
        return (AutoModelForCausalLM if causal else AutoModel).from_config(cfg)


def _lora_parameters(model: Any, rank: int, targets: Sequence[str] | None) -> int:
    """Parameters of rank-``rank`` LoRA factors on the Linear (or GPT-2 Conv1D) modules named by ``targets``."""
    total = 0
    for name, module in model.named_modules():
        leaf = name.rsplit(".", 1)[-1]
        weight = getattr(module, "weight", None)
        if weight is None or weight.dim() != 2 or (targets is not None and leaf not in targets):
            continue
        if targets is None and leaf not in ("q_proj", "v_proj", "query", "value", "c_attn"):
            continue
        total += rank * (weight.shape[0] + weight.shape[1])
    return total


def _hidden_width(model: Any) -> tuple[int, int]:
    cfg = model.config
    width = int(getattr(cfg, "hidden_size", None) or getattr(cfg, "n_embd"))
    layers = int(getattr(cfg, "num_hidden_layers", None) or getattr(cfg, "n_layer"))
    return width, layers


# -- the estimate ---------------------------------------------------------------------------------------------------
def _poisson_batch(n: int, q: float) -> int:
    """The batch size the per-example gradients are sized for: ``q n`` plus :data:`BATCH_SIGMAS` standard deviations."""
    mean = q * n
    return int(min(n, math.ceil(mean + BATCH_SIGMAS * math.sqrt(max(mean * (1 - q), 0.0))))) if n else 0


def _release_sizes(config: Any, sizes: Sequence[int]) -> list[int]:
    """Examples each release trains on (Non-CL: the union of the tasks so far)."""
    if getattr(config.spec, "reuses_past_tasks", False):
        out, running = [], 0
        for n in sizes:
            running += int(n)
            out.append(running)
        return out
    return [int(n) for n in sizes]


def _n_outputs(config: Any, n_tasks: int) -> int:
    """How many labels the trained head has: the task labels (label space from the data), else the public sets."""
    settings = config.settings
    if settings.label_space == "data":
        groups = config.stream.get("tasks") or []
        return max(1, len({int(o) for g in groups for o in g}))
    sets = output_label_sets(settings.label_space, settings.prior_labels, n_tasks)
    return max(1, len({int(o) for s in sets for o in s}))


def _dpsgd_schedule(config: Any, sizes: Sequence[int]) -> tuple[list[tuple[int, float, int]], int, int]:
    """Per release ``(n, q, steps)``, total steps and expected examples, as the DP-SGD plans give them."""

    batch_size, epochs = int(config.method["batch_size"]), int(config.method["epochs"])
    rows, steps_total, examples = [], 0, 0.0
    for t, n in enumerate(_release_sizes(config, sizes)):
        if n == 0:
            rows.append((0, 0.0, 0))
            continue
        q, steps = dpsgd_schedule(n, batch_size, epochs, t)
        rows.append((n, q, steps))
        steps_total += steps
        examples += q * n * steps
    return rows, steps_total, int(round(examples))


def _dpsgd_memory(trainable: int, model_total: int, rows: Sequence[tuple[int, float, int]], per_example_floats: int,
                  input_floats: int) -> dict[str, int]:
    batch = max((_poisson_batch(n, q) for n, q, _ in rows), default=0)
    largest = max((n for n, _, _ in rows), default=0)
    return {
        "model": model_total * FLOAT32,
        "gradients": trainable * FLOAT32,
        "optimizer_state": 2 * trainable * FLOAT32,
        # opacus: the grad samples of the backward hooks, their accumulation buffer, and the clipped product
        "per_example_gradients": OPACUS_COPIES * batch * trainable * FLOAT32,
        "activations": batch * per_example_floats * FLOAT32,
        # the release's features (the runner's float32 array and the method's torch copy) and labels
        "data": largest * (2 * input_floats * FLOAT32 + INT64),
    }


def _largest_key(memory: Mapping[str, int], keys: Mapping[str, str]) -> str:
    part = max(memory, key=lambda k: memory[k])
    return keys.get(part, keys.get("*", "[method] batch_size"))


def estimate_training_cost(config: Any, sizes: Sequence[int], input_dim: int, device: str = "cpu") -> TrainingCost:
    """The cost of training ``config`` on tasks of ``sizes`` examples with ``input_dim`` features (torch needed)."""
    name = str(config.method["name"])
    sizes = [int(n) for n in sizes]
    n_outputs = _n_outputs(config, len(sizes))
    estimator = _ESTIMATORS.get(name)
    if estimator is None:
        raise ConfigError(f"no cost estimate for method {name!r}")  # a plugin: reported as unavailable
    return estimator(config, sizes, int(input_dim), n_outputs, device)


def _cosine(config: Any, sizes: list[int], d: int, labels: int, device: str) -> TrainingCost:
    largest = max(sizes, default=0)
    memory = {
        "model": labels * d * FLOAT64,  # the released class sums
        "data": largest * d * (FLOAT32 + FLOAT64),  # the release's float32 features and their float64 tensor
        # normalise_rows: |x| (then the scaled rows), their quotient by the norms and the selected result
        "work_arrays": 3 * largest * d * FLOAT64,
    }
    return TrainingCost(name_of(config), device, d, 0, labels * d, memory, 0, sum(sizes),
                        _largest_key(memory, {"model": "[stream] prior_labels", "*": "[stream] dataset"}),
                        ("the cosine classifier has no optimiser: one noisy class-sum release per task; its "
                         "parameters are the class sums (labels x features)",))


def name_of(config: Any) -> str:
    return str(config.method["name"])


def _adapter_dpsgd(config: Any, sizes: list[int], d: int, labels: int, device: str) -> TrainingCost:
    name = name_of(config)
    method = config.method
    adapter_dim = int(method.get("adapter_dim") if method.get("adapter_dim") is not None else 64)
    notes: list[str] = []
    if name == "peft_ensemble":
        variant = _peft_variant(config)
        if variant == "film" or d == 0:
            return _transformer_peft(config, sizes, d, labels, device, variant)
        head = labels if method.get("head", "label_space") == "label_space" else max(
            (len(g) for g in (config.stream.get("tasks") or [[0]])), default=labels)
        trainable, member = _meta_adapter_parameters(d, head, adapter_dim)
        members = len(sizes)
        total = member * members
        notes.append(f"one member per task: {members} members of {member:,} parameters after the last task")
    else:
        if d == 0:
            raise ConfigError(f"method {name!r} needs encoder features, but the stream gives raw texts")
        trainable, total = _meta_adapter_parameters(d, labels, adapter_dim)
    rows, steps, examples = _dpsgd_schedule(config, sizes)
    # kept for backpropagation, per example: the input row, D v, relu(D v), U h, v + U h, the logits
    per_example = d + (2 * adapter_dim + 2 * d if adapter_dim > 0 else 0) + labels
    memory = _dpsgd_memory(trainable, total, rows, per_example, d)
    adapter_heavy = adapter_dim > 0 and 2 * adapter_dim * d > d * labels  # the adapter holds most parameters
    size_key = "[method] adapter_dim" if adapter_heavy else "[method] batch_size"
    key = _largest_key(memory, {
        "model": size_key, "gradients": size_key, "optimizer_state": size_key,
        "per_example_gradients": "[method] adapter_dim or batch_size" if adapter_heavy else "[method] batch_size",
        "activations": "[method] batch_size", "data": "[stream] dataset or tasks (the task sizes)",
    })
    return TrainingCost(name, device, d, trainable, total, memory, steps, examples, key, tuple(notes))


def _transformer_peft(config: Any, sizes: list[int], d: int, labels: int, device: str, variant: str) -> TrainingCost:
    """PEFT ensemble members on a transformer encoder: FiLM (layer norms) or LoRA on MiniLM (raw texts)."""
    method = config.method
    if variant == "film":

        model = _meta_transformer(encoder_directory(method["encoder"]))
        trainable_body = sum(p.numel() for n, p in model.named_parameters() if "LayerNorm" in n or "layernorm" in n
                             or "norm" in n.rsplit(".", 2)[-2].lower())
        key_name = "[stream] encoder"
    else:
        # lazy import: loads torch (the LoRA text model); the audit works without it
        from dpcl.methods.lora_text import LORA_TARGETS, MAX_TOKENS, _encoder_path

        model = _meta_transformer(_encoder_path())
        trainable_body = _lora_parameters(model, int(method["adapter_dim"]), tuple(LORA_TARGETS))
        key_name = "[method] adapter_dim"
        seq = MAX_TOKENS
    width, layers = _hidden_width(model)
    backbone = sum(p.numel() for p in model.parameters())
    head = width * labels + labels
    trainable = int(trainable_body + head)
    members = len(sizes)
    total = int(backbone + members * trainable)
    rows, steps, examples = _dpsgd_schedule(config, sizes)
    if variant == "film":  # texts are truncated at min(model_max_length, 512) tokens (dpcl.methods.film)
        seq = min(int(getattr(model.config, "max_position_embeddings", 512) or 512), 512)
    per_example = layers * seq * width * 16  # attention and feed-forward outputs kept per layer (about 16 widths)
    memory = _dpsgd_memory(trainable, total, rows, per_example, max(d, seq))
    return TrainingCost(name_of(config), device, d, trainable, total, memory, steps, examples,
                        _largest_key(memory, {"per_example_gradients": "[method] batch_size",
                                              "activations": "[method] batch_size", "*": key_name}),
                        (f"{variant} members on a frozen {backbone:,}-parameter encoder (built on the meta device); "
                         "activations are an upper estimate for sequences of max_seq_len tokens",))


def _l2dpml(config: Any, sizes: list[int], d: int, labels: int, device: str) -> TrainingCost:
    method = config.method
    hidden = [int(v) for v in method.get("hidden_sizes") or [16, 16]]
    batch_size, epochs = int(method["batch_size"]), int(method["epochs"])
    p = hidden[-1] + 1
    fixed = sum(a * b + b for a, b in zip(hidden[:-1], hidden[1:]))
    trainable = d * hidden[0] + p * labels  # theta1 (auto-encoder) and W (output layer), both released
    largest = max(sizes, default=0)
    nb = math.ceil(largest / batch_size) if largest else 0
    lam = min(batch_size, largest)
    trains_ae = str(method.get("autoencoder_training", "every_task"))
    steps = 0
    for t, n in enumerate(sizes):
        batches = math.ceil(n / batch_size) if n else 0
        ae = trains_ae == "every_task" or t == 0
        steps += batches * epochs * (2 if ae else 1)
    memory_batches = int(method.get("memory_batches_per_task", 1)) * len(sizes)
    memory = {
        "model": (trainable + fixed) * FLOAT64,
        "data": largest * d * (FLOAT32 + FLOAT64),  # the release's float32 features and their float64 copy
        # per batch: the padded rows, X^T X, the coefficients, the Laplace draw (numpy, its triangles) and the
        # normalised copy: about six d x d float64 matrices per batch at the peak of the auto-encoder phase
        "work_arrays": nb * (lam * d + 6 * d * d) * FLOAT64 + nb * (lam * (p + labels) + 6 * p * p) * FLOAT64,
        "episodic_memory": memory_batches * (d * d + p * p + p * labels) * FLOAT64,
    }
    return TrainingCost(name_of(config), device, d, trainable, trainable + fixed, memory, steps, sum(sizes),
                        _largest_key(memory, {"work_arrays": "raise [method] batch_size (fewer batches, each "
                                              "holding d x d coefficient matrices)",
                                              "episodic_memory": "[method] memory_batches_per_task",
                                              "model": "[method] hidden_sizes", "data": "[stream] dataset"}),
                        ("optimiser steps: descent steps of the A-GEM projected gradient (Alg. 2), over the auto-encoder "
                         "and the output layer; each example is read once, when its batch's coefficients are computed",))


def _pecl(config: Any, sizes: list[int], d: int, labels: int, device: str) -> TrainingCost:
    method = config.method
    rank = int(method.get("lora_rank") or 8)
    seq = int(method.get("max_seq_len") or 64)
    if method.get("pretrained_path"):
        # lazy import: loads torch (the LoRA text model); the audit works without it
        from dpcl.methods.lora_text import _encoder_path

        path = method["pretrained_path"]
        model = _meta_transformer(_encoder_path() if path == "minilm" else path)
        lora = _lora_parameters(model, rank, None)
    else:
        # lazy import: the PeCL package loads torch; the audit works without it
        from dpcl.methods.pecl.tokenizer import ByteTokenizer

        tok = ByteTokenizer()
        width, layers = int(method.get("n_embd") or 64), int(method.get("n_layer") or 2)
        analytic = layers * (12 * width * width + 13 * width) + (tok.vocab_size + seq + 2) * width
        if analytic > META_LIMIT or layers > 4096:
            raise ConfigError(
                f"the language model of [method] n_embd = {width}, n_layer = {layers} has about {analytic:,} "
                "parameters, beyond what dpcl builds even on the meta device; lower [method] n_embd or n_layer")
        model = _meta_transformer(None, gpt2=dict(
            vocab_size=tok.vocab_size, n_positions=seq, n_embd=width, n_layer=layers,
            n_head=int(method.get("n_head") or 2),
            bos_token_id=tok.bos_id, eos_token_id=tok.eos_id, pad_token_id=tok.pad_id))
        lora = _lora_parameters(model, rank, ("c_attn",))
    width, layers = _hidden_width(model)
    backbone = sum(p.numel() for p in model.parameters())
    head = width * labels + labels
    trainable = lora + head
    total = backbone + lora * len(sizes) + head
    if str(method.get("training", "dp_sgd")) == "dp_sgd":
        rows, steps, examples = _dpsgd_schedule(config, sizes)
    else:
        batch_size, epochs = int(method["batch_size"]), int(method["epochs"])
        rows = [(n, min(1.0, batch_size / n) if n else 0.0, epochs * math.ceil(n / batch_size) if n else 0)
                for n in sizes]
        steps, examples = sum(r[2] for r in rows), sum(epochs * n for n in sizes)
    vocab = int(getattr(model.config, "vocab_size", 256))
    per_example = layers * seq * width * 16 + seq * vocab  # hidden states per layer, and the LM logits
    memory = _dpsgd_memory(trainable, total, rows, per_example, seq)
    return TrainingCost(name_of(config), device, d, trainable, total, memory, steps, examples,
                        _largest_key(memory, {"per_example_gradients": "[method] batch_size or lora_rank",
                                              "activations": "[method] batch_size or max_seq_len",
                                              "*": "[method] n_embd, n_layer or pretrained_path"}),
                        ("a LoRA adapter per task on a frozen language model (built on the meta device); the "
                         "public pre-training before the first task is not counted",))


_ESTIMATORS = {
    "cosine": _cosine,
    "peft_ensemble": _adapter_dpsgd,
    "naive": _adapter_dpsgd,
    "non_cl": _adapter_dpsgd,
    "l2dpml": _l2dpml,
    "pecl": _pecl,
}


def training_cost(config: Any, sizes: Sequence[int], *, input_dim: int | None = None,
                  device: str | None = None) -> "TrainingCost | CostUnavailable":
    """:func:`estimate_training_cost`, or :class:`CostUnavailable` saying why none can be made (never raises for
    a missing torch, a plugin method or a stream whose feature dimension is unknown)."""
    device = device or str(config.method.get("device") or "cpu")
    if str(config.method["name"]) not in _ESTIMATORS:  # checked first: a plugin's audit never imports torch
        return CostUnavailable(f"dpcl has no cost estimate for the plugin method {config.method['name']!r}")
    if input_dim is None:
        input_dim, why = stream_input_dim(config)
        if input_dim is None:
            return CostUnavailable(why)
    try:
        import torch  # noqa: F401
    except ImportError as exc:
        return CostUnavailable(f"torch is not installed ({exc}); install the training extra to see the cost")
    try:
        return estimate_training_cost(config, sizes, input_dim, device)
    except ConfigError as exc:
        return CostUnavailable(str(exc))
    except (ImportError, OSError, ValueError) as exc:
        return CostUnavailable(f"the {config.method['name']} model could not be built on the meta device: {exc}")


# -- what the device has free --------------------------------------------------------------------------------------
def _proc_status() -> dict[str, int]:
    out: dict[str, int] = {}
    try:
        with open("/proc/self/status", encoding="ascii") as f:
            for line in f:
                key, _, value = line.partition(":")
                parts = value.split()
                if len(parts) == 2 and parts[1] == "kB":
                    out[key] = int(parts[0]) * 1024
    except OSError:
        pass
    return out


def _cgroup_headroom() -> int | None:
    """``memory.max - memory.current`` of this process's cgroup (v2), or v1's limit minus usage; None if unlimited."""
    try:
        with open("/proc/self/cgroup", encoding="ascii") as f:
            lines = f.read().splitlines()
    except OSError:
        return None
    for line in lines:
        _, controllers, path = line.split(":", 2)
        if controllers == "":  # cgroup v2
            base = Path("/sys/fs/cgroup") / path.lstrip("/")
            for folder in (base, Path("/sys/fs/cgroup")):
                try:
                    limit = (folder / "memory.max").read_text().strip()
                    current = int((folder / "memory.current").read_text())
                except (OSError, ValueError):
                    continue
                return None if limit == "max" else max(int(limit) - current, 0)
        elif "memory" in controllers.split(","):
            folder = Path("/sys/fs/cgroup/memory") / path.lstrip("/")
            try:
                limit = int((folder / "memory.limit_in_bytes").read_text())
                usage = int((folder / "memory.usage_in_bytes").read_text())
            except (OSError, ValueError):
                return None
            return None if limit >= 1 << 60 else max(limit - usage, 0)
    return None


def _mem_available() -> int | None:
    try:
        with open("/proc/meminfo", encoding="ascii") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    try:
        return int(os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"))
    except (ValueError, OSError, AttributeError):
        return None


def memory_headroom(device: str = "cpu") -> MemoryHeadroom:
    """What ``device`` can still give this process: for the CPU the least of the available RAM, the address-space
    and data-segment limits (RLIMIT_AS, RLIMIT_DATA, minus what the process already maps) and the cgroup's limit;
    for CUDA the free memory ``torch.cuda.mem_get_info`` reports."""
    if device.startswith("cuda"):
        import torch

        index = int(device.split(":", 1)[1]) if ":" in device else torch.cuda.current_device()
        free, _total = torch.cuda.mem_get_info(index)
        return MemoryHeadroom(device, int(free), "torch.cuda.mem_get_info", {"cuda_free": int(free)})
    limits: dict[str, int] = {}
    available = _mem_available()
    if available is not None:
        limits["MemAvailable"] = available
    status = _proc_status()
    for name, rlimit, used in (("RLIMIT_AS", resource.RLIMIT_AS, status.get("VmSize", 0)),
                               ("RLIMIT_DATA", resource.RLIMIT_DATA, status.get("VmData", 0))):
        soft, _hard = resource.getrlimit(rlimit)
        if soft != resource.RLIM_INFINITY:
            limits[name] = max(int(soft) - used, 0)
    cgroup = _cgroup_headroom()
    if cgroup is not None:
        limits["cgroup memory.max"] = cgroup
    if not limits:
        return MemoryHeadroom(device, 1 << 62, "none found", {})
    binding = min(limits, key=lambda k: limits[k])
    return MemoryHeadroom(device, limits[binding], binding, limits)


class MemoryLimitError(ConfigError):
    """A config whose estimated training memory exceeds what the device has free (exit 2, naming the key)."""


def check_fits(cost: "TrainingCost | CostUnavailable", headroom: MemoryHeadroom) -> None:
    """Refuse (:class:`MemoryLimitError`, exit 2) a cost whose peak memory exceeds the headroom."""
    if not isinstance(cost, TrainingCost) or cost.peak_memory_bytes <= headroom.bytes:
        return
    parts = ", ".join(f"{k} {human_bytes(v)}" for k, v in sorted(cost.memory_bytes.items(), key=lambda kv: -kv[1])
                      if v)
    raise MemoryLimitError(
        f"training this config needs about {human_bytes(cost.peak_memory_bytes)} on {headroom.device} ({parts}; "
        f"{cost.trainable_parameters:,} trainable of {cost.total_parameters:,} parameters) but only "
        f"{human_bytes(headroom.bytes)} is free ({headroom.binding}); "
        f"{cost.largest_key if cost.largest_key.startswith('raise ') else 'lower ' + cost.largest_key} "
        "(or use a device with more memory)."
    )


def audit_cost(config: Any, sizes: Sequence[int], *, input_dim: int | None = None,
               device: str | None = None) -> dict[str, Any]:
    """The ``cost`` section of ``dpcl audit`` (and of ``dpcl run``'s check): the estimate, the device's free memory,
    and whether it fits. Raises :class:`MemoryLimitError` (exit 2) when it does not fit."""
    device = device or str(config.method.get("device") or "cpu")
    cost = training_cost(config, sizes, input_dim=input_dim, device=device)
    out = cost.to_dict()
    if not isinstance(cost, TrainingCost):
        return out
    if device.startswith("cuda"):
        import torch

        if not torch.cuda.is_available():
            out["fits"] = None
            out["headroom"] = f"not checked: {device} is not available on this machine"
            return out
    headroom = memory_headroom(device)
    out["headroom"] = headroom.to_dict()
    check_fits(cost, headroom)
    out["fits"] = True
    return out


def cost_rows(section: Mapping[str, Any]) -> dict[str, str]:
    """The cost section as rows of ``dpcl audit``'s table."""
    if not section.get("available"):
        return {"cost": f"unavailable: {section.get('reason', 'unknown')}"}
    parts = ", ".join(f"{k} {human_bytes(v)}" for k, v in sorted(section["memory_bytes"].items(),
                                                                    key=lambda kv: -kv[1]) if v)
    headroom = section.get("headroom")
    free = (f"{human_bytes(headroom['free_bytes'])} free on {headroom['device']} ({headroom['binding']})"
            if isinstance(headroom, Mapping) else str(headroom))
    return {
        "cost parameters": f"{section['trainable_parameters']:,} trainable of {section['total_parameters']:,} "
                           f"(input dimension {section['input_dim']})",
        "cost peak memory": f"about {human_bytes(section['peak_memory_bytes'])} on {section['device']} ({parts}); "
                            f"{free}",
        "cost training": f"{section['optimizer_steps']:,} optimiser steps, {section['examples_processed']:,} "
                         "examples processed (expected)",
    }


def check_run_cost(config: Any, sizes: Sequence[int], input_dim: int, device: str) -> dict[str, Any]:
    """``dpcl run``'s check before the method is built: the cost on the loaded stream's real input dimension and
    the run's device; :class:`MemoryLimitError` (exit 2) when it cannot fit, before anything is allocated."""
    return audit_cost(config, sizes, input_dim=input_dim, device=device)
