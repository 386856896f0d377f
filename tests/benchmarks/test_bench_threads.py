"""bench_threads: the settings it compares are dpcl's policy, the one-thread baseline and the spinning threads of
before, and its shortened run is the bundled config with fewer tasks (no timing is checked here)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))

import bench_threads  # noqa: E402

from dpcl._threads import usable_cores  # noqa: E402
from dpcl.data import STREAM_KEYS  # noqa: E402
from dpcl.guarantees.config import load_config  # noqa: E402


def test_the_settings_are_the_policy_the_baseline_and_the_old_default():
    assert bench_threads.SETTINGS[bench_threads.DEFAULT] == {}  # nothing set: whatever dpcl does by itself
    assert bench_threads.SETTINGS[bench_threads.SINGLE] == {"OMP_NUM_THREADS": "1"}
    assert bench_threads.SETTINGS[bench_threads.SPINNING] == {"GOMP_SPINCOUNT": "300000"}  # GNU OpenMP's own default
    written_out = bench_threads._loop_settings()  # the loop's child is not started through dpcl
    assert written_out[bench_threads.DEFAULT] == {"OMP_NUM_THREADS": str(usable_cores()), "OMP_WAIT_POLICY": "PASSIVE"}
    # the caller's own thread or wait variables never reach a measured run
    env = bench_threads._environment({"OMP_NUM_THREADS": "1"})
    assert env["OMP_NUM_THREADS"] == "1" and not {"OMP_WAIT_POLICY", "GOMP_SPINCOUNT", "MKL_NUM_THREADS"} & set(env)


def test_the_shortened_run_keeps_the_config_but_its_tasks(tmp_path):
    config = ROOT / "dpcl" / "configs" / "fmnist_naive.toml"
    short = bench_threads.shortened_config(config, 2, tmp_path)
    full, cut = (load_config(path, data_stream_keys=STREAM_KEYS) for path in (config, short))
    assert [list(t) for t in cut.stream["tasks"]] == [list(t) for t in full.stream["tasks"]][:2]
    assert cut.method == full.method and cut.settings == full.settings
    assert bench_threads.shortened_config(config, 0, tmp_path) == config
    with pytest.raises(SystemExit, match="fewer than --tasks 9"):
        bench_threads.shortened_config(config, 9, tmp_path)
