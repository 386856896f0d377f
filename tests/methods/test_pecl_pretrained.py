"""PeCL on a pre-trained causal LM loaded from a local directory (``pretrained_path``).

Each test saves a tiny GPT-2 model (1 layer, width 16) and a WordLevel
tokenizer trained on a few sentences with ``save_pretrained`` into tmp_path,
then loads it through the learner and through ``PeCLMethod``. The network is
blocked (HF_HUB_OFFLINE=1 and a socket that refuses to connect) for every test.
"""

from __future__ import annotations


import numpy as np
import pytest

torch = pytest.importorskip("torch")

from dpcl.errors import ConfigError  # noqa: E402
from dpcl.guarantees import per_token as pt  # noqa: E402
import dpcl.methods.pecl.spec as pecl_spec  # noqa: E402
from dpcl.methods.pecl.learner import ContinualLM, learner_config  # noqa: E402

pytestmark = [pytest.mark.torch, pytest.mark.usefixtures("no_network")]  # tests/methods/conftest.py

WIDTH = 16
TINY = {"max_seq_len": 12, "batch_size": 8, "lora_rank": 2, "epochs": 2}
SENTENCES = [
    "apples and pears are fruit", "12 Main Street is an address", "zebra crossing on the road",
    "call the number now", "public sentence about nothing",
]


def _tasks():
    a = [f"apples and pears {i}" for i in range(8)] + [f"12 Main Street {i}" for i in range(8)]
    b = [f"zebra crossing {i}" for i in range(8)] + [f"call number {i}" for i in range(8)]
    return [(a, np.repeat([0, 1], 8)), (b, np.repeat([2, 3], 8))]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    """A tiny pre-trained-style GPT-2 + WordLevel tokenizer (no BOS, no PAD token) saved to disk."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers
    from transformers import GPT2Config, GPT2LMHeadModel, PreTrainedTokenizerFast

    raw = Tokenizer(models.WordLevel(unk_token="[UNK]"))
    raw.pre_tokenizer = pre_tokenizers.Whitespace()
    raw.train_from_iterator(SENTENCES, trainers.WordLevelTrainer(special_tokens=["[UNK]", "<eos>"]))
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=raw, unk_token="[UNK]", eos_token="<eos>")
    torch.manual_seed(0)
    config = GPT2Config(vocab_size=len(tokenizer), n_positions=16, n_embd=WIDTH, n_layer=1, n_head=2,
                        bos_token_id=tokenizer.eos_token_id, eos_token_id=tokenizer.eos_token_id)
    path = tmp_path_factory.mktemp("tiny_lm")
    GPT2LMHeadModel(config).save_pretrained(path)
    tokenizer.save_pretrained(path)
    return str(path)


def test_tokenizer_adapter_gives_bos_tokens_eos_and_a_length_mask(model_dir):
    from transformers import AutoTokenizer

    from dpcl.methods.pecl.tokenizer import load_pretrained_tokenizer

    tok = load_pretrained_tokenizer(model_dir)
    hf = AutoTokenizer.from_pretrained(model_dir, local_files_only=True)
    eos = hf.convert_tokens_to_ids("<eos>")
    assert tok.bos_id == tok.eos_id == tok.pad_id == eos  # no BOS, no PAD in this tokenizer: EOS stands in
    assert any("BOS" in n for n in tok.notes) and any("PAD" in n for n in tok.notes)
    texts = ["apples and pears", "zebra", "call the number now on the road and the street twice"]
    ids, mask = tok.encode_batch(texts, max_len=8)
    words = [hf.convert_tokens_to_ids(t.split()) for t in texts]
    for row, (w, m) in enumerate(zip(words, mask)):
        body = w[:6]
        expected = [eos, *body, eos] + [eos] * (8 - 2 - len(body))
        assert ids[row].tolist() == expected
        assert m.tolist() == [1] * (len(body) + 2) + [0] * (8 - 2 - len(body))


def test_learner_trains_pecl_on_a_loaded_model_with_its_per_token_guarantee(model_dir):
    learner = ContinualLM(4, learner_config(**TINY, pretrained_path=model_dir), seed=0, public_texts=[])
    assert learner.embedding.embedding_dim == WIDTH  # default n_embd (64) is not used for a loaded model
    assert np.isnan(learner.pretrain_loss)  # the public pre-training step is skipped
    before = learner.embedding.weight.detach().clone()

    records = [learner.fit_task(k, texts, labels) for k, (texts, labels) in enumerate(_tasks())]
    for r in records:
        g = r["guarantee"]
        assert g["unit"] == "token" and g["adjacency"] == "replace_one" and g["sensitivity"] == 2.0
        assert g["releases_per_token"] == 2
        assert g["epsilon"] == pytest.approx(pt.true_token_epsilons(g["sigma_min_used"], 1e-6, 1.0, releases=2))
        assert g["epsilon"] <= 10.0 * (1 + 1e-6)
        assert g["sequence"]["longest_sequence_tokens"] <= TINY["max_seq_len"]
    assert records[1]["omega_bar"] > 0 and learner.adapter == "task_1"
    assert torch.equal(learner.embedding.weight, before)  # the loaded weights stay frozen
    lora = [n for n, p in learner.model.lm.named_parameters() if p.requires_grad]
    assert lora and all("lora_" in n and ".task_1." in n for n in lora)
    preds = learner.predict(_tasks()[0][0])
    assert set(preds.tolist()) <= {0, 1, 2, 3}
    assert learner.sequence_nll(["apples and pears"]).shape == (1,)


def test_tdp_perturbs_the_loaded_models_input_embeddings(model_dir, monkeypatch):
    from dpcl.methods.pecl import tdp as tdp_module

    widths = []
    original = tdp_module.TokenDP.embed_and_perturb

    def spy(self, weight, ids, sigmas, generator, ids_checked=False):
        out = original(self, weight, ids, sigmas, generator, ids_checked=ids_checked)
        widths.append((weight.shape[1], out.shape[-1]))
        return out

    monkeypatch.setattr(tdp_module.TokenDP, "embed_and_perturb", spy)
    learner = ContinualLM(4, learner_config(**TINY, pretrained_path=model_dir), seed=0, public_texts=[])
    texts, labels = _tasks()[0]
    learner.fit_task(0, texts, labels)
    assert len(widths) == TINY["epochs"] * 2  # 16 sequences, batch 8: every batch of every epoch
    assert all(w == (WIDTH, WIDTH) for w in widths)


def _setup(model_dir, **method):
    from dpcl.methods.base import MethodSetup

    keys = {"training": "paper", **TINY, "pretrained_path": model_dir, **method}
    return MethodSetup(method={"name": "pecl", **keys}, privacy={"delta": 1e-6, "epsilon": 10.0},
                       label_space=(0, 1, 2, 3), input_dim=1, seed=0)


def _data(texts, labels):
    from dpcl.methods.base import TrainingData

    n = len(texts)
    return TrainingData(features=np.zeros((n, 1), np.float32), labels=np.asarray(labels),
                        unit_ids=np.arange(n) + 10_000 * int(labels[0]), texts=tuple(texts))


def test_pecl_method_runs_the_plan_on_a_loaded_model_and_round_trips(model_dir):
    from dpcl.methods.base import method_class

    cls = method_class("pecl")
    setup = _setup(model_dir)
    method = cls(setup)
    plan = pecl_spec.PECL_SPEC.plan_task(setup.method, setup.privacy, 16, 0)
    assert any(note.startswith("per-token guarantee") for note in plan.notes)
    assert all(e.to_dict()["adjacency"] == "replace_one" for e in plan.events)
    texts, labels = _tasks()[0]
    method.fit_task(0, _data(texts, labels), (0, 1), plan)
    record = method.learner.task_records[0]
    assert record["guarantee"]["epsilon"] <= 10.0 * (1 + 1e-6)
    assert record["guarantee"]["sigma_min_used"] >= plan.noise["sigma_min"] * (1 - 1e-9)
    scores = method.scores(np.asarray(texts, dtype=object))
    assert scores.shape == (16, 4)
    again = cls(setup)
    again.load_state_dict(method.state_dict())
    assert np.allclose(again.scores(np.asarray(texts, dtype=object)), scores, atol=1e-5)


def test_pretrained_path_is_a_documented_method_key():
    key = {k.name: k for k in pecl_spec.PECL_KEYS}["pretrained_path"]
    assert key.type is str and key.default == ""


def test_missing_or_invalid_directory_is_a_config_error_naming_key_and_path(tmp_path, model_dir):
    missing = str(tmp_path / "no_such_model")
    with pytest.raises(ConfigError, match=r"pretrained_path.*no_such_model"):
        ContinualLM(4, learner_config(**TINY, pretrained_path=missing), seed=0, public_texts=[])
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(ConfigError, match=r"pretrained_path.*empty"):
        ContinualLM(4, learner_config(**TINY, pretrained_path=str(empty)), seed=0, public_texts=[])
    with pytest.raises(ConfigError, match="pretrained_path"):  # a hub name is not a local directory
        ContinualLM(4, learner_config(**TINY, pretrained_path="gpt2"), seed=0, public_texts=[])
    with pytest.raises(ConfigError, match=r"max_seq_len = 40 exceeds the 16 positions"):
        ContinualLM(4, learner_config(**{**TINY, "max_seq_len": 40}, pretrained_path=model_dir), seed=0,
                    public_texts=[])


def test_dpcl_run_with_pretrained_path_writes_verified_per_token_certificates(model_dir, tmp_path):
    from dpcl.guarantees.certificates import read_certificate, verify_certificate
    from dpcl.runner import run_training

    config = tmp_path / "pecl.toml"
    config.write_text(
        "[privacy]\nepsilon = 10.0\ndelta = 1e-6\nadjacency = \"replace_one\"\naccountant = \"auto\"\n"
        "across_tasks = \"auto\"\n\n[stream]\ndataset = \"fortunes_texts\"\n"
        "dataset_options = { categories = [\"food\", \"law\", \"science\", \"work\"], max_per_class = 6 }\n"
        "tasks = [[0, 1], [2, 3]]\nlabel_space = \"prior\"\nprior_labels = [[0, 1], [2, 3]]\n"
        "disjoint_units = true\n\n[method]\nname = \"pecl\"\ntraining = \"paper\"\nepsilon_lower = 1.0\n"
        f"epsilon_upper = 10.0\nepochs = 1\nbatch_size = 8\nmax_seq_len = 16\nlora_rank = 2\npretrained_path = {model_dir!r}\n"
        "\n[run]\nprivate = false\n",  # PeCL as in the paper: its checkpoint is not private, a private run is refused
        encoding="utf-8",
    )
    result = run_training(config, tmp_path / "out", quiet=True)
    assert result.complete and len(result.releases) == 2
    for release in result.releases:
        assert verify_certificate(result.out_dir / release.certificate).valid
    cert = read_certificate(result.last_certificate)
    assert cert["guarantee"]["private"] is False  # the per-token statement is scoped to the input embeddings
    (g,) = cert["scoped_guarantees"]
    assert cert["release"]["method"] == "pecl" and g["adjacency"] == "replace_one" and g["unit"] == "token"
    assert cert["config"]["method"]["pretrained_path"] == model_dir
    from dpcl.methods.pecl.spec import PRETRAINED_PUBLIC_ASSUMPTION

    assert PRETRAINED_PUBLIC_ASSUMPTION in cert["assumptions"]
    assert any(n.startswith("per-token guarantee") for n in cert["extra"]["plan_notes"])
    event = g["events"][-1]["events"][0]["event"]
    assert event["kind"] == "gaussian" and event["sensitivity"] == 2.0
    # Balle & Wang (2018) Thm 8 written out here: the certified epsilon has delta(epsilon) = 1e-6 at mu = 2 / sigma
    from scipy.stats import norm

    mu = event["sensitivity"] / event["sigma"]
    eps = g["epsilon"]
    delta = norm.cdf(-eps / mu + mu / 2) - np.exp(eps) * norm.cdf(-eps / mu - mu / 2)
    assert delta == pytest.approx(1e-6, rel=1e-6) and eps <= 10.0 * (1 + 1e-9)


def test_a_non_gpt2_architecture_gets_lora_on_its_attention_and_its_own_special_tokens(tmp_path):
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    raw = Tokenizer(models.WordLevel(unk_token="[UNK]"))
    raw.pre_tokenizer = pre_tokenizers.Whitespace()
    raw.train_from_iterator(SENTENCES, trainers.WordLevelTrainer(special_tokens=["[UNK]", "<s>", "</s>", "<pad>"]))
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=raw, unk_token="[UNK]", bos_token="<s>", eos_token="</s>",
                                        pad_token="<pad>")
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=24, intermediate_size=32, num_hidden_layers=1,
                         num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=32)
    LlamaForCausalLM(config).save_pretrained(tmp_path)
    tokenizer.save_pretrained(tmp_path)
    learner = ContinualLM(4, learner_config(**TINY, pretrained_path=str(tmp_path)), seed=0, public_texts=[])
    tok = learner.tokenizer
    assert (tok.bos_id, tok.eos_id, tok.pad_id) == tuple(tokenizer.convert_tokens_to_ids(["<s>", "</s>", "<pad>"]))
    assert tok.notes == ()
    texts, labels = _tasks()[0]
    ids, mask = tok.encode_batch(texts[:1], TINY["max_seq_len"])
    assert ids[0, 0] == tok.bos_id and ids[0, int(mask[0].sum()) - 1] == tok.eos_id
    record = learner.fit_task(0, texts, labels)
    assert record["guarantee"]["epsilon"] <= 10.0 * (1 + 1e-6) and record["omega"] > 0
    assert learner.embedding.embedding_dim == 24
    trained = {n.split(".lora_")[0].rsplit(".", 1)[-1] for n, p in learner.model.lm.named_parameters()
               if p.requires_grad}
    assert trained == {"q_proj", "v_proj"}  # peft's default LoRA targets for llama


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device (none on this machine)")
def test_dp_pecl_with_pretrained_path_trains_on_cuda_and_certifies_the_checkpoint(model_dir, tmp_path):
    """``pretrained_path`` on CUDA: the DP PeCL (DP-SGD on the adapters and head) of a local causal LM, private."""
    from dpcl.guarantees.certificates import read_certificate, verify_certificate
    from dpcl.runner import run_training

    config = tmp_path / "pecl.toml"
    config.write_text(
        "[privacy]\nepsilon = 8.0\ndelta = 1e-6\nadjacency = \"add_remove\"\naccountant = \"auto\"\n"
        "across_tasks = \"auto\"\n\n[stream]\ndataset = \"fortunes_texts\"\n"
        "dataset_options = { categories = [\"food\", \"law\", \"science\", \"work\"], max_per_class = 6 }\n"
        "tasks = [[0, 1], [2, 3]]\nlabel_space = \"prior\"\nprior_labels = [[0, 1], [2, 3]]\n"
        "disjoint_units = true\n\n[method]\nname = \"pecl\"\ntraining = \"dp_sgd\"\nmax_grad_norm = 1.0\n"
        "epsilon_lower = 1.0\nepsilon_upper = 10.0\nepochs = 1\nbatch_size = 8\nmax_seq_len = 16\nlora_rank = 2\n"
        f"pretrained_path = {model_dir!r}\ndevice = \"cuda\"\n",
        encoding="utf-8",
    )
    result = run_training(config, tmp_path / "out", quiet=True)
    assert result.complete and len(result.releases) == 2 and result.metrics["device"].startswith("cuda")
    for release in result.releases:
        verify_certificate(result.out_dir / release.certificate).raise_if_invalid()
    cert = read_certificate(result.last_certificate)
    assert cert["guarantee"]["private"] is True and cert["guarantee"]["unit"] == "example"
    assert cert["config"]["method"]["pretrained_path"] == model_dir
