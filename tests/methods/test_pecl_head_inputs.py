"""The classification head reads pooled features standardised with public statistics.

Regression for ``dpcl run dpcl/configs/pecl.toml`` predicting one class for every input: the mean-pooled last
hidden states of the pre-trained LM share a common component (norm about 8) much larger than their spread
between examples (about 1), so the initial head's logits were the same offset for every input and the few
optimiser steps of a task could not turn it: every test fortune got the same label, even without any noise.
"""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from dpcl.methods.pecl.learner import ContinualLM, learner_config  # noqa: E402

pytestmark = pytest.mark.torch

SMALL = {"n_layer": 2, "n_embd": 32, "n_head": 2, "max_seq_len": 24, "pretrain_steps": 60, "batch_size": 8,
         "lora_rank": 2, "epochs": 2, "learning_rate": 3e-3}
WORDS = ["tea", "rain", "maps", "owls", "river", "stone", "lamp", "cloud"]
PUBLIC = [f"a public line {i} on {w} and {v}" for i, (w, v) in enumerate(zip(WORDS * 6, WORDS[::-1] * 6))]
PUBLIC_LABELS = [i % 2 for i in range(len(PUBLIC))]


def _separable(n: int, offset: int = 0) -> tuple[list[str], np.ndarray]:
    a = [f"apples and pears {i + offset}" for i in range(n)]
    b = [f"zebra crossing {i + offset} zz" for i in range(n)]
    return a + b, np.repeat([0, 1], n)


def test_noise_free_training_on_separable_data_predicts_more_than_one_class():
    config = learner_config(**SMALL, strategy="pecl", privacy="none", training="dp_sgd")
    learner = ContinualLM(2, config, 0, PUBLIC, reproducible_noise=True, public_labels=PUBLIC_LABELS)
    texts, labels = _separable(24)
    schedule = {"noise_multiplier": 0.0, "sample_rate": 8 / 48, "steps": 12, "max_grad_norm": 1.0}
    learner.fit_task(0, texts, labels, output_labels=[0, 1], dpsgd=schedule)
    test, test_labels = _separable(12, offset=100)
    predicted = learner.predict(test)
    assert len(np.unique(predicted)) == 2, np.bincount(predicted)
    assert np.mean(predicted == test_labels) >= 0.75


def test_task_softmax_is_a_dp_pecl_option_and_gives_earlier_labels_no_classification_gradient(monkeypatch):
    from dpcl.errors import InvalidParameterError

    with pytest.raises(InvalidParameterError, match="task_softmax"):
        learner_config(**SMALL, strategy="pecl", privacy="none", training="paper", task_softmax=True)
    config = learner_config(**{**SMALL, "pretrain_steps": 2, "epochs": 1}, strategy="pecl", privacy="none",
                            training="dp_sgd", task_softmax=True)
    learner = ContinualLM(4, config, 0, PUBLIC, reproducible_noise=True, public_labels=PUBLIC_LABELS)
    seen: list[torch.Tensor] = []
    original = torch.nn.functional.cross_entropy

    def spy(logits, target, *args, **kwargs):
        if logits.dim() == 2 and logits.shape[1] == 4:  # the classification loss (not the language-model loss)
            seen.append(logits.detach())
        return original(logits, target, *args, **kwargs)

    monkeypatch.setattr(torch.nn.functional, "cross_entropy", spy)
    texts, labels = _separable(8)
    schedule = {"noise_multiplier": 0.0, "sample_rate": 0.5, "steps": 2, "max_grad_norm": 1.0}
    learner.fit_task(1, texts, labels + 2, output_labels=[2, 3], dpsgd=schedule)
    assert seen and all(bool((s[:, [0, 1]] < -1e8).all()) and bool((s[:, [2, 3]] > -1e8).all()) for s in seen)
