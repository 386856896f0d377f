"""PEFT Ensemble's ``film`` variant (Tobaben et al., Sec. 5 / App. H): per task, DP-SGD trains the scale and
shift of the pre-trained encoder's layer norms plus a head, exactly on the planned schedule."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("opacus")

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "data"))
from pretrained_helpers import write_digits_folder, write_tiny_bert, write_tiny_vit  # noqa: E402

import dpcl.methods.peft_ensemble as peft_module  # noqa: E402
from dpcl.data import build_stream  # noqa: E402
from dpcl.errors import ConfigError  # noqa: E402
from dpcl.guarantees.schedules import PEFT_ENSEMBLE, peft_variant  # noqa: E402
from dpcl.methods.base import MethodSetup, TrainingData  # noqa: E402

PRIVACY = {"epsilon": 2.0, "delta": 1e-5, "accountant": "rdp", "adjacency": "add_remove"}


@pytest.fixture(scope="module")
def assets(tmp_path_factory):
    root = tmp_path_factory.mktemp("film")
    return write_tiny_vit(root / "vit"), write_digits_folder(root / "digits", classes=4, per_class=12)


def method_section(encoder, **extra):
    return {"name": "peft_ensemble", "epochs": 2, "batch_size": 6, "max_grad_norm": 1.0, "learning_rate": 0.05,
            "adapter_dim": 64, "aggregation": "argmax", "variant": "auto", "device": "cpu",
            "encoder": str(encoder), **extra}


def test_film_trains_only_layer_norm_scale_shift_and_head_on_the_planned_schedule(assets, monkeypatch):
    from dpcl.methods.film import film_parameter_names

    encoder, images = assets
    stream = build_stream({"dataset": f"image_folder:{images}", "tasks": [[0, 1], [2, 3]], "encoder": str(encoder)},
                          encode=False)
    method = method_section(encoder)
    ensemble = peft_module.PeftEnsemble(MethodSetup(method=method, privacy=PRIVACY, label_space=(0, 1, 2, 3),
                                                    input_dim=stream[0].train.n_features, seed=0))
    assert ensemble.variant == "film" and peft_module.PeftEnsemble.trains_encoder(method)
    backbone, _, initial = ensemble._film_backbone()
    pretrained = {k: v.clone() for k, v in backbone.state_dict().items()}
    film_names = film_parameter_names(backbone)
    assert set(film_names) == set(initial) and all(n.endswith((".weight", ".bias")) for n in film_names)
    assert {n for n, m in backbone.named_modules() if isinstance(m, torch.nn.LayerNorm)} == {
        n.rsplit(".", 1)[0] for n in film_names}

    calls = []
    real = peft_module.train_classifier

    def spy(model, features, targets, schedule, **kwargs):
        calls.append((schedule, sorted(n for n, p in model.named_parameters() if p.requires_grad)))
        return real(model, features, targets, schedule, **kwargs)

    monkeypatch.setattr(peft_module, "train_classifier", spy)
    for task in stream:
        plan = PEFT_ENSEMBLE.plan_task(method, PRIVACY, len(task.train), task.index)
        assert plan.noise["peft_variant"] == "film"
        done = []
        data = TrainingData(features=task.train.features, labels=task.train.labels, unit_ids=task.train.unit_ids)
        ensemble.fit_task(task.index, data, task.labels, plan, progress=done.append)
        schedule, trainable = calls[-1]
        # exactly the planned DP-SGD run: Poisson rate, number of steps, noise and clipping
        assert sum(done) == schedule.steps == plan.noise["steps"] == 2 * int(np.ceil(len(task.train) / 6))
        assert schedule.sample_rate == plan.noise["sample_rate"] == 6 / len(task.train)
        assert schedule.noise_multiplier == plan.noise["noise_multiplier"] and schedule.max_grad_norm == 1.0
        assert trainable == sorted([f"backbone.{n}" for n in film_names] + ["head.bias", "head.weight"])
        member = ensemble.film_members[-1]
        # only the layer norms' scale and shift moved away from the pre-trained weights, and the head
        trained = {**{f"{n}": v for n, v in member["film"].items()}}
        moved = {n for n in film_names if not torch.equal(trained[n], pretrained[n])}
        assert moved, "DP-SGD changed no FiLM parameter"
        assert torch.count_nonzero(member["head"]["weight"]) > 0
    after = backbone.state_dict()
    assert all(torch.equal(after[k], pretrained[k]) for k in pretrained if k not in initial)
    assert not torch.equal(ensemble.film_members[0]["film"][film_names[0]], ensemble.film_members[1]["film"][film_names[0]])

    test = stream.seen_test(1)
    scores = ensemble.scores(test.features)
    assert scores.shape == (len(test), 4) and np.all(np.isfinite(scores))
    restored = peft_module.PeftEnsemble(MethodSetup(method=method, privacy=PRIVACY, label_space=(0, 1, 2, 3),
                                                    input_dim=stream[0].train.n_features, seed=0))
    restored.load_state_dict(ensemble.state_dict())
    np.testing.assert_allclose(restored.scores(test.features), scores, rtol=1e-5, atol=1e-6)


def test_variant_is_resolved_and_validated(assets, tmp_path):
    encoder, _ = assets
    no_encoder = {k: v for k, v in method_section(encoder).items() if k != "encoder"}
    assert peft_variant(no_encoder) == "adapter"
    assert peft_variant(method_section(encoder)) == "film"
    assert peft_variant(method_section(encoder, variant="adapter")) == "adapter"
    with pytest.raises(ConfigError, match="variant = 'film'.*\\[stream\\] encoder"):
        peft_variant({**no_encoder, "variant": "film"})
    text_encoder = write_tiny_bert(tmp_path / "bert")
    assert peft_variant(method_section(text_encoder)) == "adapter"
    with pytest.raises(ConfigError, match="text encoder"):
        peft_variant(method_section(text_encoder, variant="film"))
    plan = PEFT_ENSEMBLE.plan_task(no_encoder, PRIVACY, 30, 0)
    assert plan.noise["peft_variant"] == "adapter" and any("variant 'adapter'" in n for n in plan.notes)
