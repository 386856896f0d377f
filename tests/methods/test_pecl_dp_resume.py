"""DP PeCL (``training = "dp_sgd"``) through ``dpcl run``: a run killed after its first release resumes.

The run is killed with SIGKILL (test-only hook ``DPCL_TEST_KILL_AFTER=STEP:TASK`` of :mod:`dpcl.runner.run`)
right after the ledger commits the release of task 1, before its certificate exists. Resumed in-process, it must not train task 1 again, must not charge it again (one DP-SGD charge
and one scoped per-token charge per task), and must end with the certificates of an uninterrupted run: the same
epsilon, delta, unit and accountant, every certificate verifying. A tiny model and stream keep it to seconds.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from dpcl.guarantees.certificates import verify_certificate  # noqa: E402
from dpcl.guarantees.ledger import TaskLedger  # noqa: E402
from dpcl.methods.pecl.learner import ContinualLM  # noqa: E402
from dpcl.runner import run_training  # noqa: E402

pytestmark = pytest.mark.torch

REPO = Path(__file__).resolve().parents[2]
#: the runner's test-only crash hook (dpcl.runner.run.CRASH_HOOK_ENV)
KILL_HOOK = "DPCL_TEST_KILL_AFTER"
SEED = 5


def _dp_pecl_config(directory: Path) -> Path:
    """Two tasks of 8 fortunes each, one epoch, a one-layer width-16 model: the DP PeCL at toy size."""
    path = directory / "dp_pecl.toml"
    path.write_text(
        '[privacy]\nepsilon = 8.0\ndelta = 1e-6\nadjacency = "add_remove"\naccountant = "rdp"\n'
        'across_tasks = "auto"\n\n[stream]\ndataset = "fortunes_texts"\n'
        'dataset_options = { categories = ["food", "law", "science", "work"], max_per_class = 5 }\n'
        'tasks = [[0, 1], [2, 3]]\nlabel_space = "prior"\nprior_labels = [[0, 1], [2, 3]]\n'
        'disjoint_units = true\n\n[method]\nname = "pecl"\ntraining = "dp_sgd"\nmax_grad_norm = 1.0\n'
        "epsilon_lower = 1.0\nepsilon_upper = 10.0\nepochs = 1\nbatch_size = 4\nmax_seq_len = 32\nlora_rank = 2\n"
        "n_layer = 1\nn_embd = 16\nn_head = 2\npretrain_steps = 2\n",
        encoding="utf-8",
    )
    return path


def _killed_run(config: Path, out: Path, step: str) -> None:
    env = {**os.environ, KILL_HOOK: f"{step}:0", "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(
        [sys.executable, "-m", "dpcl", "run", str(config), "--out", str(out), "--seed", str(SEED),
         "--reproducible-noise", "--quiet"],
        capture_output=True, text=True, env=env, timeout=600,
    )
    assert proc.returncode == -signal.SIGKILL, proc.stderr[-2000:]


def _certificates(out: Path) -> list[dict]:
    return [json.loads(p.read_text()) for p in sorted((out / "certificates").glob("*.json"))]


def _charges(ledger_file: Path) -> list[tuple[int, ...]]:
    return [c.tasks for c in TaskLedger.load(ledger_file).charges]


@pytest.fixture()
def uninterrupted(tmp_path):
    config = _dp_pecl_config(tmp_path)
    clean = run_training(config, tmp_path / "clean", seed=SEED, quiet=True, reproducible_noise=True)
    assert clean.complete
    return config, tmp_path / "clean"


def test_dp_pecl_killed_after_task_one_resumes_without_retraining_or_recharging_it(uninterrupted, tmp_path, monkeypatch):
    config, clean = uninterrupted
    out = tmp_path / "killed"
    # killed right after the commit point of task 1 (the ledger's release record), before its certificate exists
    _killed_run(config, out, "ledger")
    assert not list((out / "certificates").glob("*.json"))
    assert TaskLedger.load(out / "ledger.json").released_tasks() == [0]  # task 1 was committed before the kill
    assert _charges(out / "ledger.json") == [(0,)]

    trained: list[int] = []
    original_fit = ContinualLM.fit_task

    def spy_fit(self, task_index, *args, **kwargs):
        trained.append(int(task_index))
        return original_fit(self, task_index, *args, **kwargs)

    monkeypatch.setattr(ContinualLM, "fit_task", spy_fit)
    resumed = run_training(config, out, seed=SEED, quiet=True, reproducible_noise=True, resume=True)
    assert resumed.complete
    assert trained == [1], "the resumed run trained task 1 again or skipped task 2"
    # one DP-SGD charge per task, and one per-token charge per task in the scoped ledger: task 1 charged once
    assert _charges(out / "ledger.json") == _charges(clean / "ledger.json") == [(0,), (1,)]
    scoped = sorted((out / "scoped").glob("*.ledger.json"))
    assert scoped and all(_charges(p) == [(0,), (1,)] for p in scoped)

    certificates, reference = _certificates(out), _certificates(clean)
    assert len(certificates) == len(reference) == 2
    for path in sorted((out / "certificates").glob("*.json")):
        assert verify_certificate(path).valid, path
    for mine, theirs in zip(certificates, reference):
        headline = mine["guarantee"]
        assert headline["private"] is True and headline["unit"] == "example"
        assert 0 < headline["epsilon"] <= 8.0
        for key in ("epsilon", "delta", "adjacency", "unit", "accountant"):
            assert headline[key] == theirs["guarantee"][key], key
        assert [g["epsilon"] for g in mine["scoped_guarantees"]] == [g["epsilon"] for g in theirs["scoped_guarantees"]]
        # the same noise, seed and curator state: the resumed run releases the uninterrupted run's checkpoints
        assert mine["checkpoint"]["sha256"] == theirs["checkpoint"]["sha256"]
