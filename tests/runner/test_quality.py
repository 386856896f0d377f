"""Quality bars of the Tobaben et al. methods (thorough: DPCL_THOROUGH=1; minutes on 2 cores).

Split digits, 5 tasks of 2 classes, S_prior^const, delta = 1e-5, 5 seeds: the DP
Cosine Classifier reaches final AA >= 0.85 at epsilon = 8 and >= 0.65 at
epsilon = 1 per task; non-private >= 0.85. On the fortunes text stream the PEFT
Ensemble beats Naive fine-tuning at the same epsilon. Each seed's run is a full
certified run whose certificates verify. Not private, the PEFT Ensemble is at least
Naive and within 0.05 of the Cosine Classifier on fortunes and on Split Fashion-MNIST,
where it also reaches AA >= 0.5 (skipped where that dataset is not installed).
"""

from __future__ import annotations

import sys
import tomllib
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")
torch.set_num_threads(1)

from dpcl.guarantees.certificates import verify_certificate  # noqa: E402
from dpcl.runner import run_training  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))
import tobaben_results  # noqa: E402


def _aa(tmp_path: Path, name: str, seeds: range) -> list[float]:
    text = dict(tobaben_results.settings("digits" if name.startswith("digits") else "fortunes"))[name]
    config = tmp_path / f"{name}.toml"
    config.write_text(text)
    values = []
    for seed in seeds:
        result = run_training(config, tmp_path / name / str(seed), seed=seed, quiet=True)
        if result.private:
            assert verify_certificate(result.last_certificate).valid
        values.append(result.metrics["average_accuracy"])
    return values


@pytest.mark.thorough
@pytest.mark.parametrize(
    "setting, bar",
    [("digits-cosine-eps8.0", 0.85), ("digits-cosine-eps1.0", 0.65), ("digits-cosine-epsinf", 0.85)],
)
def test_split_digits_cosine_quality_bar(tmp_path, setting, bar):
    values = _aa(tmp_path, setting, range(5))
    assert np.mean(values) >= bar, values


@pytest.mark.thorough
def test_peft_ensemble_beats_naive_on_fortunes_at_epsilon_8(tmp_path):
    peft = _aa(tmp_path, "fortunes-peft_ensemble-eps8.0", range(2))
    naive = _aa(tmp_path, "fortunes-naive-eps8.0", range(2))
    assert np.mean(peft) > np.mean(naive) + 0.1, (peft, naive)


@pytest.mark.thorough
def test_not_private_peft_ensemble_is_near_the_cosine_classifier_on_fortunes(tmp_path):
    """Issue 23: not private, the ensemble is at least Naive and within 0.05 of the Cosine Classifier (2 seeds);
    privacy never helps it beyond noise (epsilon = 1 at most 0.05 above not private)."""
    peft = np.mean(_aa(tmp_path, "fortunes-peft_ensemble-epsinf", range(2)))
    cosine = np.mean(_aa(tmp_path, "fortunes-cosine-epsinf", range(1)))  # deterministic when not private
    naive = np.mean(_aa(tmp_path, "fortunes-naive-epsinf", range(2)))
    private = np.mean(_aa(tmp_path, "fortunes-peft_ensemble-eps1.0", range(2)))
    assert peft >= naive and peft >= cosine - 0.05, (peft, cosine, naive)
    assert private <= peft + 0.05, (private, peft)


def _bundled_fmnist_aa(tmp_path: Path, name: str, seeds: range, *, private: bool) -> list[float]:
    """AA of a bundled Split Fashion-MNIST config (skipped where the Debian dataset is not installed)."""
    from dpcl.data.registry import missing_dataset_folder

    source = Path(__file__).resolve().parents[2] / "dpcl" / "configs" / f"{name}.toml"
    missing = missing_dataset_folder(tomllib.loads(source.read_text())["stream"]["dataset"])
    if missing:
        pytest.skip(missing)
    config = tmp_path / f"{name}_{'private' if private else 'not_private'}.toml"
    config.write_text(source.read_text() + ("" if private else "\n[run]\nprivate = false\n"))
    values = []
    for seed in seeds:
        result = run_training(config, tmp_path / config.stem / str(seed), seed=seed, quiet=True)
        if result.private:
            assert verify_certificate(result.last_certificate).valid
        values.append(result.metrics["average_accuracy"])
    return values


@pytest.mark.thorough
def test_not_private_peft_ensemble_is_near_the_cosine_classifier_on_split_fashion_mnist(tmp_path):
    """Issue 23 item 4 on Split Fashion-MNIST with the bundled configs: not private, the ensemble reaches the
    quality bar AA >= 0.5, is at least Naive and within 0.05 of the Cosine Classifier (2 seeds); privacy never
    helps it beyond noise (the bundled epsilon = 1 at most 0.05 above not private)."""
    peft = np.mean(_bundled_fmnist_aa(tmp_path, "fmnist_peft_ensemble", range(2), private=False))
    cosine = np.mean(_bundled_fmnist_aa(tmp_path, "fmnist_cosine", range(1), private=False))  # deterministic
    naive = np.mean(_bundled_fmnist_aa(tmp_path, "fmnist_naive", range(1), private=False))
    private = np.mean(_bundled_fmnist_aa(tmp_path, "fmnist_peft_ensemble", range(1), private=True))
    assert peft >= 0.5 and peft >= naive and peft >= cosine - 0.05, (peft, cosine, naive)
    assert private <= peft + 0.05, (private, peft)
