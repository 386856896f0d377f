"""The sizes a cost estimate starts from: the input dimension of a stream, and parameter counts of the torch
models built on the ``meta`` device (shapes only, no storage)."""

from __future__ import annotations

from typing import Any, Mapping, Sequence

from dpcl.data.idx import find_idx_files
from dpcl.guarantees.method_schema import spec_trains_encoder
from dpcl.guarantees.public_encoder import _read_json, encoder_directory, packaged_encoder
from dpcl.methods.peft_ensemble.spec import peft_variant


def stream_input_dim(config: Any) -> tuple[int | None, str]:
    """The feature dimension the method will be built with, read without loading the features; ``(None, why)``
    when it cannot be known before the data is loaded (``dpcl run`` then uses the loaded features)."""
    stream = config.raw.get("stream", {})
    encoder = stream.get("encoder")
    dataset = stream.get("dataset")
    options = dict(stream.get("dataset_options") or {})
    if encoder is not None and not spec_trains_encoder(config.spec, config.method):
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

