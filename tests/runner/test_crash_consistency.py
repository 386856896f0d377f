"""Crash-consistent resume: a release is one atomic commit (the ledger's release record).

`dpcl run` is killed with SIGKILL right after each file write of a release (test-only hook
``DPCL_TEST_KILL_AFTER=STEP:TASK``), then resumed; its certificates and ledger must equal those of a run that
was never interrupted (same seed, reproducible noise): no task the ledger shows released is retrained, no task
is charged twice, no file of an uncommitted attempt survives.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")

import dpcl  # noqa: E402
from dpcl.runner import run_training  # noqa: E402
from dpcl.runner.run import CRASH_HOOK_ENV  # noqa: E402
from run_helpers import write_config  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
STEPS = ("checkpoint", "curator_state", "ledger", "rename", "certificate", "run_state")


def _killed_run(config: Path, out: Path, step: str, task: int) -> None:
    env = {**os.environ, CRASH_HOOK_ENV: f"{step}:{task}", "PYTHONPATH": str(REPO)}
    proc = subprocess.run(
        [sys.executable, "-m", "dpcl", "run", str(config), "--out", str(out), "--seed", "3",
         "--reproducible-noise", "--quiet"],
        capture_output=True, text=True, env=env, timeout=600,
    )
    assert proc.returncode == -signal.SIGKILL, proc.stderr


def _without_notes(value):
    """``notes`` of accountant results depend on which warnings the process has already seen (dp-accounting's
    RDP convergence warning is reported once per process), not on the run: they are left out of the comparison."""
    if isinstance(value, dict):
        return {k: _without_notes(v) for k, v in value.items() if k != "notes"}
    if isinstance(value, list):
        return [_without_notes(v) for v in value]
    return value


def _release_files(out: Path) -> dict[str, object]:
    """Certificates (without their creation time and content hash) and the ledger (without its hash), by name."""
    ledger = json.loads((out / "ledger.json").read_text())
    ledger.pop("sha256")
    files: dict[str, object] = {"ledger.json": _without_notes(ledger)}
    for cert in sorted((out / "certificates").glob("*.json")):
        data = json.loads(cert.read_text())
        data.pop("created")
        data.pop("sha256")
        files[cert.name] = _without_notes(data)
    return files


def _check_resumed_equals_clean(config: Path, tmp_path: Path, clean: Path, step: str, task: int) -> None:
    out = tmp_path / f"killed_{step}"
    _killed_run(config, out, step, task)
    resumed = run_training(config, out, seed=3, quiet=True, reproducible_noise=True, resume=True)
    assert resumed.complete
    assert _release_files(out) == _release_files(clean), step
    assert not list(out.rglob("*.pending")), step
    assert sorted(p.name for p in (out / "checkpoints").iterdir()) == sorted(
        p.name for p in (clean / "checkpoints").iterdir()
    )


@pytest.fixture(scope="module")
def small_naive(tmp_path_factory):
    directory = tmp_path_factory.mktemp("naive")
    config = write_config(directory, "naive", tasks="[[0, 1], [2, 3]]")
    clean = directory / "clean"
    run_training(config, clean, seed=3, quiet=True, reproducible_noise=True)
    return config, clean


@pytest.mark.parametrize("step", ["curator_state", "ledger"])
def test_killed_before_and_after_the_commit_point_resumes_to_the_clean_run(small_naive, tmp_path, step):
    config, clean = small_naive
    _check_resumed_equals_clean(config, tmp_path, clean, step, task=1)


@pytest.mark.thorough
def test_bundled_naive_killed_after_every_write_of_a_release_resumes_to_the_clean_run(tmp_path):
    config = tmp_path / "naive.toml"
    shutil.copy(Path(dpcl.__file__).parent / "configs" / "naive.toml", config)
    clean = tmp_path / "clean"
    run_training(config, clean, seed=3, quiet=True, reproducible_noise=True)
    for step in STEPS:
        _check_resumed_equals_clean(config, tmp_path, clean, step, task=1)
