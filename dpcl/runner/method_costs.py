"""The training-cost estimate of each built-in method: the functions their specs name in ``cost_estimator``.

Each takes ``(config, sizes, input_dim, n_outputs, device)`` and returns a :class:`~dpcl.runner.cost.TrainingCost`;
:func:`dpcl.runner.cost.estimate_training_cost` imports the one a config's spec names. What each memory part
holds, and how the estimate compares with measured peaks, is in :mod:`dpcl.runner.cost` and docs/guarantees.md.
Parameters are counted on the ``meta`` device (:mod:`dpcl.runner.model_size`).
"""

from __future__ import annotations

import math
from typing import Any, Mapping, Sequence

from dpcl.errors import ConfigError
from dpcl.guarantees.public_encoder import encoder_directory
from dpcl.guarantees.schedules import dpsgd_schedule
from dpcl.runner.cost import BATCH_SIGMAS, FLOAT32, FLOAT64, INT64, OPACUS_COPIES, TrainingCost, name_of
from dpcl.runner.model_size import (
    META_LIMIT,
    _hidden_width,
    _lora_parameters,
    _meta_adapter_parameters,
    _meta_transformer,
    _peft_variant,
)

__all__ = ["agem_cost", "cosine_cost", "l2dpml_cost", "pecl_cost", "peft_ensemble_cost", "single_adapter_cost"]


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


def cosine_cost(config: Any, sizes: list[int], d: int, labels: int, device: str) -> TrainingCost:
    """The DP Cosine Classifier: one noisy class-sum release per task (the ``cosine`` spec's estimate)."""
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


def peft_ensemble_cost(config: Any, sizes: list[int], d: int, labels: int, device: str) -> TrainingCost:
    """PEFT Ensemble: one DP-SGD member per task, adapters on features or members inside a transformer."""
    method = config.method
    variant = _peft_variant(config)
    if variant == "film" or d == 0:
        return _transformer_peft(config, sizes, d, labels, device, variant)
    adapter_dim = _adapter_dim(method)
    head = labels if method.get("head", "label_space") == "label_space" else max(
        (len(g) for g in (config.stream.get("tasks") or [[0]])), default=labels)
    trainable, member = _meta_adapter_parameters(d, head, adapter_dim)
    members = len(sizes)
    notes = (f"one member per task: {members} members of {member:,} parameters after the last task",)
    return _adapter_cost(config, sizes, d, labels, device, adapter_dim, trainable, member * members, notes)


def single_adapter_cost(config: Any, sizes: list[int], d: int, labels: int, device: str) -> TrainingCost:
    """One adapter and head trained with DP-SGD through the stream (Naive, Non-CL)."""
    if d == 0:
        raise ConfigError(f"method {name_of(config)!r} needs encoder features, but the stream gives raw texts")
    adapter_dim = _adapter_dim(config.method)
    trainable, total = _meta_adapter_parameters(d, labels, adapter_dim)
    return _adapter_cost(config, sizes, d, labels, device, adapter_dim, trainable, total, ())


def agem_cost(config: Any, sizes: list[int], d: int, labels: int, device: str) -> TrainingCost:
    """DP-SGD A-GEM: Naive's single adapter and head, plus the episodic memory (``memory_per_task`` examples of
    every earlier task) and, at every step from the second task on, a second released gradient on a Poisson
    sample of that memory (per-example gradients and activations of the larger of the two samples)."""
    cost = single_adapter_cost(config, sizes, d, labels, device)
    method = config.method  # validated: every key's default filled in
    adapter_dim, trainable = _adapter_dim(method), cost.trainable_parameters
    rows, _, _ = _dpsgd_schedule(config, sizes)
    kept = [min(int(method["memory_per_task"]), n) for n in sizes]
    memory_sizes = [sum(kept[:t]) for t in range(len(sizes))]  # the memory while task t trains
    configured = method.get("memory_sample_rate")
    reference = [(m, float(configured) if configured is not None else q, steps) if m else (0, 0.0, 0)
                 for m, (_, q, steps) in zip(memory_sizes, rows)]
    reference_batch = max((_poisson_batch(m, q) for m, q, _ in reference), default=0)
    memory = dict(cost.memory_bytes)
    # the two samples' per-example gradients are not held at once: DpSgdEngine.release clears the task sample's
    # (the optimiser's zero_grad) before the memory sample's backward pass, so the larger sample sets the peak
    memory["per_example_gradients"] = max(memory["per_example_gradients"],
                                          OPACUS_COPIES * reference_batch * trainable * FLOAT32)
    memory["activations"] = max(memory["activations"],
                                reference_batch * _adapter_activation_floats(d, adapter_dim, labels) * FLOAT32)
    memory["episodic_memory"] = max(memory_sizes, default=0) * (d * FLOAT32 + INT64)
    if method["optimizer"] == "sgd":
        memory["optimizer_state"] = 0  # plain SGD (A-GEM's projected step) keeps no state
    examples = cost.examples_processed + int(round(sum(q * m * steps for m, q, steps in reference)))
    key = _largest_key(memory, {**_adapter_keys(adapter_dim, d, labels), "episodic_memory": "[method] memory_per_task",
                                "per_example_gradients": "[method] batch_size or memory_sample_rate"})
    notes = (f"the episodic memory holds up to {max(memory_sizes, default=0):,} examples (memory_per_task of "
             "every earlier task); each step from the second task on releases a second gradient on a Poisson "
             "sample of it",)
    return TrainingCost(cost.method, device, d, trainable, cost.total_parameters, memory, cost.optimizer_steps,
                        examples, key, notes)


def _adapter_dim(method: Mapping[str, Any]) -> int:
    return int(method.get("adapter_dim") if method.get("adapter_dim") is not None else 64)


def _adapter_cost(config: Any, sizes: list[int], d: int, labels: int, device: str, adapter_dim: int,
                  trainable: int, total: int, notes: tuple[str, ...]) -> TrainingCost:
    """The DP-SGD memory and steps of adapter models (residual adapter + head) with these parameter counts."""
    rows, steps, examples = _dpsgd_schedule(config, sizes)
    memory = _dpsgd_memory(trainable, total, rows, _adapter_activation_floats(d, adapter_dim, labels), d)
    key = _largest_key(memory, _adapter_keys(adapter_dim, d, labels))
    return TrainingCost(name_of(config), device, d, trainable, total, memory, steps, examples, key, notes)


def _adapter_activation_floats(d: int, adapter_dim: int, labels: int) -> int:
    """Floats an adapter model keeps per example for backpropagation: the input row, D v, relu(D v), U h, v + U h
    and the logits."""
    return d + (2 * adapter_dim + 2 * d if adapter_dim > 0 else 0) + labels


def _adapter_keys(adapter_dim: int, d: int, labels: int) -> dict[str, str]:
    """The key to change for each memory part of an adapter model."""
    adapter_heavy = adapter_dim > 0 and 2 * adapter_dim * d > d * labels  # the adapter holds most parameters
    size_key = "[method] adapter_dim" if adapter_heavy else "[method] batch_size"
    return {
        "model": size_key, "gradients": size_key, "optimizer_state": size_key,
        "per_example_gradients": "[method] adapter_dim or batch_size" if adapter_heavy else "[method] batch_size",
        "activations": "[method] batch_size", "data": "[stream] dataset or tasks (the task sizes)",
    }


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


def l2dpml_cost(config: Any, sizes: list[int], d: int, labels: int, device: str) -> TrainingCost:
    """L2DP-ML: the auto-encoder and classifier of Lai et al. with their per-batch coefficient matrices."""
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


def pecl_cost(config: Any, sizes: list[int], d: int, labels: int, device: str) -> TrainingCost:
    """PeCL: a LoRA adapter per task on a frozen language model."""
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
