"""The learner perturbs embeddings through TokenDP.embed_and_perturb (the fused kernel on CUDA)."""

from __future__ import annotations

import numpy as np

from dpcl.methods.pecl import tdp as tdp_module
from dpcl.methods.pecl.learner import ContinualLM, learner_config

TINY = {"n_layer": 1, "n_embd": 16, "n_head": 1, "max_seq_len": 24, "pretrain_steps": 2, "batch_size": 8,
        "lora_rank": 2, "epochs": 2}
PUBLIC = [f"public sentence number {i} about nothing" for i in range(16)]


def test_every_training_batch_goes_through_embed_and_perturb_with_ids_checked_once(monkeypatch):
    seen = []
    original = tdp_module.TokenDP.embed_and_perturb

    def spy(self, weight, token_ids, sigmas, generator=None, *, ids_checked=False):
        seen.append((tuple(token_ids.shape), ids_checked))
        assert tuple(sigmas.shape) == tuple(token_ids.shape)
        return original(self, weight, token_ids, sigmas, generator, ids_checked=ids_checked)

    monkeypatch.setattr(tdp_module.TokenDP, "embed_and_perturb", spy)
    texts = [f"apples and pears {i}" for i in range(8)] + [f"12 Main Street {i}" for i in range(8)]
    learner = ContinualLM(2, learner_config(**TINY, strategy="pecl", privacy="tdp"), 0, PUBLIC)
    learner.fit_task(0, texts, np.repeat([0, 1], 8))
    assert len(seen) == TINY["epochs"] * 2  # 16 examples in batches of 8, every epoch
    assert all(checked for _, checked in seen)
