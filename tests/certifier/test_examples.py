"""The scripts in examples/ run as documented and every certificate they write verifies."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _run_example(script: str, out: Path) -> str:
    done = subprocess.run([sys.executable, str(ROOT / "examples" / script), "--out", str(out)],
                          capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert done.returncode == 0, done.stderr
    return done.stdout


def _verify_all(out: Path) -> None:
    certificates = sorted((out / "certificates").glob("*.json"))
    assert [c.name for c in certificates] == [f"task{t:03d}.cert.json" for t in range(1, 6)]
    done = subprocess.run([sys.executable, "-m", "dpcl", "verify", *map(str, certificates)],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr


def test_plain_loop_example(tmp_path):
    out = tmp_path / "plain"
    printed = _run_example("plain_loop.py", out)
    assert printed.count("epsilon 1.000") == 5  # calibrated to 1 per task, parallel over disjoint tasks
    _verify_all(out)
    assert sorted(p.name for p in (out / "checkpoints").iterdir()) == [f"task{t:03d}.npz" for t in range(1, 6)]


@pytest.mark.torch
def test_opacus_own_loop_example(tmp_path):
    out = tmp_path / "opacus"
    printed = _run_example("opacus_own_loop.py", out)
    lines = [line for line in printed.splitlines() if line.startswith("task ")]
    assert len(lines) == 5 and all("epsilon 1.000" in line or "epsilon 0.999" in line for line in lines)
    _verify_all(out)
