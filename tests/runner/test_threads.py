"""torch's intra-op threads default to the cores this process may use, never more, and a user's choice stays."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")

REPO = Path(__file__).resolve().parents[2]
CORES = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []


def _child(code: str, **env: str) -> list[int]:
    clean = {k: v for k, v in os.environ.items() if k not in ("OMP_NUM_THREADS", "MKL_NUM_THREADS")}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                          env={**clean, "PYTHONPATH": str(REPO), **env})
    assert done.returncode == 0, done.stderr
    return [int(v) for v in done.stdout.split()]


def test_default_is_the_affinity_count():
    default, cores, used = _child(
        "import os, torch\nfrom dpcl.runner.threads import use_usable_cores\n"
        "print(torch.get_num_threads(), len(os.sched_getaffinity(0)), use_usable_cores())"
    )
    assert cores == len(CORES)
    # torch's own default counts physical cores; where it reaches the affinity count, dpcl uses all usable cores
    assert used == min(default, cores)
    if default >= cores:
        assert used == cores


@pytest.mark.skipif(len(CORES) < 2, reason="needs a process allowed on at least 2 cores to restrict it to 1")
def test_never_more_than_the_affinity_mask_allows():
    start = f"import os, torch\nos.sched_setaffinity(0, {{{CORES[0]}}})\nfrom dpcl.runner.threads import use_usable_cores\n"
    default, used = _child(start + "print(torch.get_num_threads(), use_usable_cores())")
    assert default > 1 and used == 1  # torch alone would start more threads than the one allowed core
    # an explicit OMP_NUM_THREADS is the user's choice and stays, even above the mask
    (used,) = _child(start + "print(use_usable_cores())", OMP_NUM_THREADS="2")
    assert used == 2


def test_a_lower_count_set_by_the_caller_stays():
    (used,) = _child("import torch\ntorch.set_num_threads(1)\nfrom dpcl.runner.threads import use_usable_cores\n"
                     "print(use_usable_cores())")
    assert used == 1


@pytest.mark.skipif(len(CORES) < 2, reason="needs a process allowed on at least 2 cores to restrict it to 1")
def test_dpcl_run_caps_the_threads(tmp_path):
    config = REPO / "dpcl" / "configs" / "cosine.toml"
    code = (f"import os, torch\nos.sched_setaffinity(0, {{{CORES[0]}}})\nbefore = torch.get_num_threads()\n"
            "from dpcl.runner import run_training\n"
            f"run_training({str(config)!r}, {str(tmp_path / 'run')!r}, quiet=True)\n"
            "print(before, torch.get_num_threads())")
    before, after = _child(code)
    assert before > 1 and after == 1
