"""A tiny randomly initialised ViT saved with ``save_pretrained`` and an image folder of scikit-learn digits.

What a user with a pre-trained model on disk has: a Hugging Face model directory (``config.json``,
weights, ``preprocessor_config.json``) and ``<root>/<class>/*.png``. Sizes are tiny so the
end-to-end runs take seconds.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np


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
