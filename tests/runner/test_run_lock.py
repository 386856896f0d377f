"""One live `dpcl run` per --out directory: a second run is refused (exit 2); a killed run's lock is taken over."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from dpcl._io.run_lock import LOCK_NAME, RunDirectoryLockedError, acquire_run_lock, releases_run_locks

ENV = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}


def _wait_for_holder(lock_file: Path, process: subprocess.Popen, timeout: float = 120) -> dict:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert process.poll() is None, process.stderr.read() if process.stderr else "child ended"
        text = lock_file.read_text() if lock_file.exists() else ""
        if text.strip():
            return json.loads(text)
        time.sleep(0.05)
    raise AssertionError("the child never took the lock")


def test_a_second_lock_on_the_same_directory_is_refused_until_released(tmp_path):
    first = acquire_run_lock(tmp_path)
    with pytest.raises(RunDirectoryLockedError, match=f"pid {os.getpid()}"):
        acquire_run_lock(tmp_path)
    first.release()
    assert (tmp_path / LOCK_NAME).read_text() == ""  # emptied, not deleted
    second = acquire_run_lock(tmp_path)
    assert second.took_over is None  # released properly: nothing stale
    second.release()


def test_locks_taken_inside_a_decorated_function_are_released_when_it_raises(tmp_path):
    @releases_run_locks
    def failing_run():
        acquire_run_lock(tmp_path)
        raise ValueError("training failed")

    with pytest.raises(ValueError):
        failing_run()
    acquire_run_lock(tmp_path).release()


def test_a_symlinked_lock_file_is_not_followed(tmp_path):
    target = tmp_path / "elsewhere"
    target.write_text("precious")
    (tmp_path / LOCK_NAME).symlink_to(target)
    with pytest.raises(Exception, match="lock file"):
        acquire_run_lock(tmp_path)
    assert target.read_text() == "precious"


SLOW_RUN = """
import sys, time
from dpcl.methods.cosine.method import CosineClassifier
fit = CosineClassifier.fit_task
def slow_fit(self, *args, **kwargs):
    time.sleep(600)  # a long training step: the run holds its directory meanwhile
    return fit(self, *args, **kwargs)
CosineClassifier.fit_task = slow_fit
from dpcl.cli import main
sys.exit(main(sys.argv[1:]))
"""


def test_two_runs_on_one_directory_and_a_killed_run(tmp_path, capsys):
    """A live run holds --out: a second `dpcl run` exits 2 naming it. SIGKILL the first: its lock is stale, and the
    next run takes it over and completes."""
    pytest.importorskip("torch")
    from dpcl.cli import main

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from run_helpers import write_config

    config = write_config(tmp_path, "cosine", tasks="[[0, 1], [2, 3]]")
    out = tmp_path / "out"
    first = subprocess.Popen(
        [sys.executable, "-c", SLOW_RUN, "run", str(config), "--out", str(out), "--quiet"],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=ENV,
    )
    try:
        holder = _wait_for_holder(out / LOCK_NAME, first)
        assert holder["pid"] == first.pid
        code = main(["run", str(config), "--out", str(out), "--quiet", "--json", "--resume"])
        stdout, err = capsys.readouterr()
        assert code == 2 and err.count("\n") == 1 and f"pid {first.pid}" in err and "in use" in err
        assert json.loads(stdout)["exit_code"] == 2
        assert first.poll() is None  # the refused run did not disturb the live one
        first.send_signal(signal.SIGKILL)
        first.wait(timeout=30)
    finally:
        if first.poll() is None:
            first.kill()
            first.wait(timeout=30)
    assert json.loads((out / LOCK_NAME).read_text())["pid"] == first.pid  # left behind by the killed run
    code = main(["run", str(config), "--out", str(out), "--resume"])
    stdout, err = capsys.readouterr()
    assert code == 0, err
    assert "taking it over" in err and str(first.pid) in err
    assert len(json.loads((out / "run.json").read_text())["releases"]) == 2
    assert (out / LOCK_NAME).read_text() == ""  # released at the end of the run
