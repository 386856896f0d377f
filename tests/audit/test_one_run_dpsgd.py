"""One-run audit of DP-SGD: deliberately broken implementations are flagged, the correct one is not."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

torch = pytest.importorskip("torch")
sklearn_datasets = pytest.importorskip("sklearn.datasets")

from dpcl.accounting.dpsgd import dpsgd_epsilon, dpsgd_noise_multiplier  # noqa: E402
from dpcl.audit.one_run_dpsgd import DpsgdStep, audit_dpsgd_one_run  # noqa: E402
from dpcl.errors import InvalidParameterError  # noqa: E402
from tests.conftest import THOROUGH  # noqa: E402


@pytest.fixture(scope="module")
def digits():
    x, y = sklearn_datasets.load_digits(return_X_y=True)
    return x / 16.0, y


class HalfNoise(DpsgdStep):
    """Noise scaled by 1/2: the run is certified for noise_multiplier but adds half of it."""

    def noise(self, shape, step):
        return 0.5 * super().noise(shape, step)


class ReusedNoise(DpsgdStep):
    """One noise draw reused at every step."""

    def noise(self, shape, step):
        if not hasattr(self, "_drawn"):
            self._drawn = super().noise(shape, step)
        return self._drawn


class NoClipping(DpsgdStep):
    """Per-example gradients summed unclipped."""

    def clip(self, norms):
        return torch.ones_like(norms)


# full batch: the certified mechanism is a composition of Gaussians, where the f-DP analysis applies and is tight
FULL_BATCH = dict(canaries=20_000, noise_multiplier=4.0, sample_rate=1.0, steps=10, delta=1e-5)
# Poisson sampling: noise reused across steps shows as exact repeats between sampled and unsampled steps
SUBSAMPLED = dict(canaries=1_000, noise_multiplier=4.0, sample_rate=0.5, steps=20, delta=1e-5)


def _audit(digits, step_class, settings, seed, **extra):
    gen = torch.Generator().manual_seed(seed)
    step = step_class(settings["noise_multiplier"], 1.0, gen)
    return audit_dpsgd_one_run(*digits, step=step, generator=gen, **settings, **extra)


@pytest.mark.parametrize(
    "step_class, settings, extra",
    [
        (HalfNoise, FULL_BATCH, {}),
        (ReusedNoise, SUBSAMPLED, {}),
        (NoClipping, SUBSAMPLED, {"canary_kind": "input", "canary_norm": 10.0}),
    ],
    ids=["noise-halved", "noise-reused", "no-clipping"],
)
def test_broken_dpsgd_is_flagged(digits, step_class, settings, extra):
    result = _audit(digits, step_class, settings, seed=0, **extra)
    assert result.flagged, result.to_dict()
    assert result.empirical_epsilon_lower > result.certified_epsilon


@pytest.mark.parametrize("settings", [FULL_BATCH, SUBSAMPLED], ids=["full-batch", "subsampled"])
def test_correct_dpsgd_is_not_flagged(digits, settings):
    seeds = range(20) if THOROUGH else range(1)
    for seed in seeds:
        result = _audit(digits, DpsgdStep, settings, seed=seed)
        assert not result.flagged, (seed, result.to_dict())
        assert result.train_accuracy > 0.5  # the audited run learns (digits: chance 0.1)


def test_full_batch_gaussian_view_demonstrates_most_of_the_certified_epsilon(digits):
    # white box, Dirac gradient canaries, full batch: the scores are Gaussian by construction, so the Gaussian view
    # applies and, with 2,000 canaries, shows most of the certified epsilon (a correct run stays below it)
    z = dpsgd_noise_multiplier(8.0, 1e-5, 1.0, 10).noise_multiplier
    result = audit_dpsgd_one_run(*digits, canaries=2000, noise_multiplier=z, sample_rate=1.0, steps=10, delta=1e-5,
                                 generator=torch.Generator().manual_seed(11))
    assert result.white_box.analysis == "gaussian_view" and result.black_box.analysis == "gaussian_view"
    assert 0.7 * result.certified_epsilon < result.white_box.epsilon_lower <= result.certified_epsilon
    assert not result.flagged


def test_certified_epsilon_is_dpcl_accountants_for_the_same_run(digits):
    result = _audit(digits, DpsgdStep, SUBSAMPLED, seed=1)
    expected = dpsgd_epsilon(4.0, 0.5, 20, 1e-5).epsilon
    assert result.certified_epsilon == pytest.approx(expected, rel=1e-12)
    assert result.adjacency == "add_remove" and result.unit == "example"
    assert 0 < result.white_box.included < result.canaries
    # without a generator the inclusion bits come from the operating system: two runs differ
    a = audit_dpsgd_one_run(*digits, **SUBSAMPLED)
    b = audit_dpsgd_one_run(*digits, **SUBSAMPLED)
    assert a.white_box.included != b.white_box.included or a.white_box.tests != b.white_box.tests


@pytest.mark.parametrize(
    "kwargs",
    [
        {"canaries": 1},
        {"sample_rate": 1.5},
        {"noise_multiplier": 0.0},
        {"steps": 0},
        {"canary_kind": "pixels"},
        {"confidence": 1.0},
    ],
)
def test_bad_settings_are_refused(digits, kwargs):
    settings = {**SUBSAMPLED, **kwargs}
    with pytest.raises(InvalidParameterError):
        audit_dpsgd_one_run(*digits, **settings)


def test_bad_data_is_refused():
    with pytest.raises(InvalidParameterError):
        audit_dpsgd_one_run(np.zeros((3, 2)), np.array([0, 1]), **SUBSAMPLED)
    with pytest.raises(InvalidParameterError):
        audit_dpsgd_one_run(np.full((2, 2), np.nan), np.array([0, 1]), **SUBSAMPLED)
    with pytest.raises(InvalidParameterError):
        audit_dpsgd_one_run(np.zeros((2, 2)), np.array([0.5, 1.0]), **SUBSAMPLED)


def test_cli_audit_run_writes_its_report_and_exits_0_on_a_correct_run(tmp_path):
    out = tmp_path / "audit"
    proc = subprocess.run(
        [sys.executable, "-m", "dpcl", "audit-run", "dpcl/configs/naive.toml", "--out", str(out),
         "--canaries", "200", "--mode", "harness", "--json"],
        capture_output=True, text=True, timeout=600,
    )
    assert proc.returncode == 0, proc.stderr
    summary = json.loads(proc.stdout)
    report = json.loads((out / "audit.json").read_text())
    assert summary["verdict"] == "consistent"
    assert report["certified_epsilon"] == pytest.approx(summary["certified_epsilon"])
    assert len(report["tasks"]) == 5
    assert all(t["empirical_epsilon_lower"] <= t["certified_epsilon"] for t in report["tasks"])
    assert 0 <= report["empirical_epsilon_lower"] <= report["certified_epsilon"]
    text = (out / "audit.md").read_text()
    assert "not a release" in text and "| task |" in text


def test_cli_audit_run_refuses_a_method_without_dpsgd_and_a_used_directory(tmp_path):
    proc = subprocess.run(
        [sys.executable, "-m", "dpcl", "audit-run", "dpcl/configs/cosine.toml", "--out", str(tmp_path / "a"),
         "--mode", "harness"],
        capture_output=True, text=True, timeout=300,
    )
    assert proc.returncode == 2 and "DP-SGD" in proc.stderr and "Traceback" not in proc.stderr
    (tmp_path / "b").mkdir()
    (tmp_path / "b" / "x").write_text("keep")
    proc = subprocess.run(
        [sys.executable, "-m", "dpcl", "audit-run", "dpcl/configs/naive.toml", "--out", str(tmp_path / "b")],
        capture_output=True, text=True, timeout=300,
    )
    assert proc.returncode == 2 and "not empty" in proc.stderr
    assert (tmp_path / "b" / "x").read_text() == "keep"


@pytest.mark.parametrize("step, kind", [("ReusedNoise", "gradient"), ("NoClipping", "input")])
def test_cli_audit_run_flags_a_users_broken_step_with_exit_3(tmp_path, step, kind):
    (tmp_path / "my_broken_step.py").write_text(
        "import torch\n"
        "from dpcl.audit.one_run_dpsgd import DpsgdStep\n"
        "class ReusedNoise(DpsgdStep):\n"
        "    def noise(self, shape, step):\n"
        "        if not hasattr(self, '_drawn'):\n"
        "            self._drawn = super().noise(shape, step)\n"
        "        return self._drawn\n"
        "class NoClipping(DpsgdStep):\n"
        "    def clip(self, norms):\n"
        "        return torch.ones_like(norms)\n"
    )
    import os

    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", ""), "."])}
    out = tmp_path / "audit"
    proc = subprocess.run(
        [sys.executable, "-m", "dpcl", "audit-run", "dpcl/configs/naive.toml", "--out", str(out),
         "--canaries", "500", "--step", f"my_broken_step:{step}", "--canary-kind", kind, "--mode", "harness",
         "--json"],
        capture_output=True, text=True, timeout=600, env=env,
    )
    assert proc.returncode == 3, proc.stderr
    report = json.loads((out / "audit.json").read_text())
    assert report["verdict"] == "violated" and report["flagged_tasks"]
    assert report["empirical_epsilon_lower"] > max(t["certified_epsilon"] for t in report["tasks"])
    proc = subprocess.run(
        [sys.executable, "-m", "dpcl", "audit-run", "dpcl/configs/naive.toml", "--out", str(tmp_path / "x"),
         "--step", "my_broken_step:Missing", "--mode", "harness"],
        capture_output=True, text=True, timeout=600, env=env,
    )
    assert proc.returncode == 2 and "cannot be imported" in proc.stderr
