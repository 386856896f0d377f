"""Tiny randomly initialised models saved with ``save_pretrained`` (a ViT, a BERT) and data for them: an image
folder of scikit-learn digits, a fortunes directory of synthetic sentences.

What a user with a pre-trained model on disk has: a Hugging Face model directory (``config.json``,
weights, ``preprocessor_config.json``) and ``<root>/<class>/*.png``. Sizes are tiny so the
end-to-end runs take seconds.
"""

from __future__ import annotations

import textwrap
from pathlib import Path

import numpy as np


def encoder_config_text(method: str, dataset: str, encoder: str, *, method_lines: str = "",
                        stream_lines: str = "") -> str:
    """A two-task run config (epsilon 2, public label sets, disjoint units) of ``method`` on ``dataset`` with
    ``[stream] encoder = encoder``; ``stream_lines`` / ``method_lines`` are added to ``[stream]`` / ``[method]``."""
    return textwrap.dedent(
        f"""
        [privacy]
        epsilon = 2.0
        delta = 1e-5
        accountant = "rdp"
        [stream]
        {stream_lines}
        dataset = "{dataset}"
        encoder = "{encoder}"
        tasks = [[0, 1], [2, 3]]
        label_space = "prior_const"
        prior_labels = [[0, 1], [2, 3]]
        disjoint_units = true
        [method]
        name = "{method}"
        """
    ) + method_lines


def audit_in_fresh_process(config: Path, env: dict | None = None,
                           heavy: tuple[str, ...] = ("torch", "transformers", "opacus")) -> tuple[int, dict, list[str]]:
    """``(exit code, JSON report, heavy modules imported)`` of ``dpcl audit CONFIG --json`` in a new interpreter."""
    import json
    import subprocess
    import sys

    code = textwrap.dedent(
        f"""
        import contextlib, io, json, sys
        from dpcl.cli import main
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            rc = main(["audit", {str(config)!r}, "--json"])
        print(json.dumps({{"rc": rc, "report": json.loads(out.getvalue()),
                          "heavy": [m for m in {list(heavy)!r} if m in sys.modules]}}))
        """
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    result = json.loads(done.stdout.strip().splitlines()[-1])
    return result["rc"], result["report"], result["heavy"]


def write_tiny_vit(directory: Path, *, seed: int = 0) -> Path:
    """A 1-layer ViT (hidden 16, 8x8 RGB inputs, 4x4 patches) and its ViTImageProcessor, under ``directory``."""
    import torch
    from transformers import ViTConfig, ViTImageProcessor, ViTModel

    torch.manual_seed(seed)
    config = ViTConfig(
        hidden_size=16, num_hidden_layers=1, num_attention_heads=2, intermediate_size=32,
        image_size=8, patch_size=4, num_channels=3,
    )
    ViTModel(config, add_pooling_layer=False).save_pretrained(directory)
    ViTImageProcessor(size={"height": 8, "width": 8}, image_mean=[0.5] * 3, image_std=[0.5] * 3).save_pretrained(directory)
    return directory


def write_digits_folder(directory: Path, *, classes: int = 4, per_class: int = 15) -> Path:
    """``classes`` digit classes with ``per_class`` 8x8 grey-scale PNGs each, from scikit-learn's digits."""
    from PIL import Image
    from sklearn.datasets import load_digits

    digits = load_digits()
    for label in range(classes):
        folder = directory / f"digit{label}"
        folder.mkdir(parents=True, exist_ok=True)
        images = digits.images[digits.target == label][:per_class]
        for i, image in enumerate(images):  # a few dozen files
            Image.fromarray(np.round(image * (255 / 16)).astype(np.uint8), mode="L").save(folder / f"{i:03d}.png")
    return directory


def write_tiny_bert(directory: Path) -> Path:
    """A 1-layer BERT (hidden 8) with a ten-word WordPiece tokenizer, under ``directory``."""
    from transformers import BertConfig, BertModel, BertTokenizer

    words = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "the", "cat", "dog", "sat", "ran"]
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "vocab.txt").write_text("\n".join(words) + "\n", encoding="utf-8")
    BertTokenizer(str(directory / "vocab.txt")).save_pretrained(directory)
    config = BertConfig(vocab_size=len(words), hidden_size=8, num_hidden_layers=1, num_attention_heads=2,
                        intermediate_size=16, max_position_embeddings=32)
    BertModel(config, add_pooling_layer=False).save_pretrained(directory)
    return directory


#: Categories of :func:`write_text_fortunes`: sentence ``k`` of category ``c`` is ``"the c w1 w2"``.
TEXT_CATEGORIES = ("cat", "dog", "sat", "ran")


def write_text_fortunes(directory: Path) -> Path:
    """A fortunes directory (``dataset_options fortunes_path``) with one file per :data:`TEXT_CATEGORIES` entry,
    each holding 25 distinct sentences over the tiny BERT's words, separated by ``%`` lines as fortune files are."""
    import itertools

    words = ("the", *TEXT_CATEGORIES)
    directory.mkdir(parents=True, exist_ok=True)
    for category in TEXT_CATEGORIES:
        sentences = [f"the {category} {a} {b}" for a, b in itertools.product(words, repeat=2)]
        (directory / category).write_text("\n%\n".join(sentences) + "\n%\n", encoding="utf-8")
    return directory
