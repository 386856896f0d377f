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


# How idle OpenMP threads wait. GNU OpenMP (torch's on Linux) prints its settings on stderr when torch loads it and
# OMP_DISPLAY_ENV=VERBOSE is set: GOMP_SPINCOUNT = '0' where idle threads sleep (OMP_WAIT_POLICY=PASSIVE), 300000
# (its default) where they spin. Nothing here times anything: the policy itself is pinned.

SLEEPING = "GOMP_SPINCOUNT = '0'"


def _openmp_settings(code: str, **env: str) -> tuple[str, str]:
    """stdout and stderr of ``code`` in a fresh interpreter without any thread or wait variable of the caller's."""
    from dpcl.runner.threads import THREAD_ENV_VARS, WAIT_ENV_VARS

    clean = {k: v for k, v in os.environ.items() if k not in (*THREAD_ENV_VARS, *WAIT_ENV_VARS)}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                          env={**clean, "PYTHONPATH": str(REPO), "OMP_DISPLAY_ENV": "VERBOSE", **env})
    assert done.returncode == 0, done.stderr
    if "GOMP_SPINCOUNT" not in done.stderr:
        pytest.skip("torch's OpenMP runtime here is not GNU OpenMP (it prints no GOMP_SPINCOUNT)")
    return done.stdout, done.stderr


def test_torch_alone_spins_so_the_pin_below_can_fail():
    _, stderr = _openmp_settings("import torch")
    assert "GOMP_SPINCOUNT = '300000'" in stderr and SLEEPING not in stderr


@pytest.mark.parametrize("entry", ["from dpcl.cli import main\nmain(['--version'])",  # the dpcl console script
                                   "import runpy, sys\nsys.argv = ['dpcl', '--version']\n"
                                   "runpy.run_module('dpcl', run_name='__main__')"])  # python -m dpcl
def test_the_command_line_makes_idle_threads_sleep_before_torch_loads(entry):
    code = f"try:\n    {entry.replace(chr(10), chr(10) + '    ')}\nexcept SystemExit:\n    pass\n" \
           "import os, torch\nprint(os.environ['OMP_WAIT_POLICY'])"
    stdout, stderr = _openmp_settings(code)
    assert stdout.split()[-1] == "PASSIVE" and SLEEPING in stderr


def test_a_users_wait_policy_stays():
    code = "from dpcl.runner.threads import prefer_sleeping_threads\nprint(prefer_sleeping_threads())\nimport torch"
    for name, value, spin in [("OMP_WAIT_POLICY", "ACTIVE", None), ("GOMP_SPINCOUNT", "1000", "'1000'")]:
        stdout, stderr = _openmp_settings(code, **{name: value})
        assert stdout.split() == ["False"] and SLEEPING not in stderr
        if spin is not None:
            assert f"GOMP_SPINCOUNT = {spin}" in stderr


def test_nothing_changes_once_torch_is_loaded():
    # OpenMP has read the environment when torch loaded it: setting OMP_WAIT_POLICY then would claim what is not so
    (printed, _) = _openmp_settings("import os, torch\nfrom dpcl.runner.threads import prefer_sleeping_threads\n"
                                    "print(prefer_sleeping_threads(), os.environ.get('OMP_WAIT_POLICY'))")
    assert printed.split() == ["False", "None"]


def test_run_training_uses_the_usable_cores_with_sleeping_threads(tmp_path):
    """The library entry point (what ``dpcl run`` calls) in a fresh process: threads capped at the usable cores,
    idle threads sleeping; ``dpcl run`` from the command line goes through the same two steps."""
    config = REPO / "dpcl" / "configs" / "cosine.toml"
    code = ("import os, sys\nfrom dpcl.runner import run_training\n"
            f"run_training({str(config)!r}, {str(tmp_path / 'run')!r}, quiet=True)\n"
            "import torch\nprint(torch.get_num_threads(), len(os.sched_getaffinity(0)), os.environ['OMP_WAIT_POLICY'])")
    stdout, stderr = _openmp_settings(code)
    threads, cores, policy = stdout.split()[-3:]
    assert 1 <= int(threads) <= int(cores) and policy == "PASSIVE" and SLEEPING in stderr
