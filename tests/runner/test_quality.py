"""Quality bars of the Tobaben et al. methods (thorough: DPCL_THOROUGH=1; minutes on 2 cores).

Split digits, 5 tasks of 2 classes, S_prior^const, delta = 1e-5, 5 seeds: the DP
Cosine Classifier reaches final AA >= 0.85 at epsilon = 8 and >= 0.65 at
epsilon = 1 per task; non-private >= 0.85. On the fortunes text stream the PEFT
Ensemble beats Naive fine-tuning at the same epsilon. Each seed's run is a full
certified run whose certificates verify.
"""

from __future__ import annotations

import sys
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
