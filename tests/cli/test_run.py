"""`dpcl run` as a user runs it: exit codes, JSON output, progress bars, a real killed run that resumes."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytest.importorskip("torch")

from dpcl.guarantees.certificates import verify_certificate  # noqa: E402
from dpcl.guarantees.ledger import TaskLedger  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "runner"))
from run_helpers import write_config  # noqa: E402

ENV = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}


def dpcl(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "dpcl", *args], capture_output=True, text=True, env=ENV, timeout=timeout
    )


def test_run_json_reports_every_release_and_the_certificates_verify(tmp_path):
    config = write_config(tmp_path, "cosine", epsilon=2.0)
    done = dpcl("run", str(config), "--out", str(tmp_path / "out"), "--json", "--seed", "2")
    assert done.returncode == 0, done.stderr
    payload = json.loads(done.stdout)
    assert payload["complete"] and payload["private"] and len(payload["releases"]) == 5
    assert payload["average_accuracy"] > 0.6  # chance: 0.1
    for release in payload["releases"]:
        assert "cert" in Path(release["certificate"]).name
        assert verify_certificate(tmp_path / "out" / release["certificate"]).valid
    verified = dpcl("verify", str(tmp_path / "out" / payload["releases"][-1]["certificate"]))
    assert verified.returncode == 0, verified.stdout + verified.stderr


def _snapshot(directory: Path) -> dict[str, bytes]:
    return {p.relative_to(directory).as_posix(): p.read_bytes() for p in sorted(directory.rglob("*")) if p.is_file()}


def test_a_second_run_into_the_same_out_is_refused_unless_resume(tmp_path):
    """Running again into a run directory would charge every task again: refused (exit 2, nothing changed)."""
    config = write_config(tmp_path, "cosine", tasks="[[0, 1], [2, 3]]")
    out = tmp_path / "out"
    assert dpcl("run", str(config), "--out", str(out), "--quiet").returncode == 0
    before = _snapshot(out)
    again = dpcl("run", str(config), "--out", str(out), "--quiet")
    assert again.returncode == 2, again.stderr
    assert "already holds a run" in again.stderr and "ledger.json" in again.stderr and "--resume" in again.stderr
    assert "certificates/ (2 files" in again.stderr and "Traceback" not in again.stderr
    assert _snapshot(out) == before
    resumed = dpcl("run", str(config), "--out", str(out), "--quiet", "--json", "--resume")
    assert resumed.returncode == 0, resumed.stderr
    assert json.loads(resumed.stdout)["complete"]
    assert len(TaskLedger.load(out / "ledger.json").charges) == 2  # nothing charged again
    assert sorted(p.name for p in (out / "certificates").iterdir()) == ["task001.cert.json", "task002.cert.json"]


def test_reproducible_noise_flag_repeats_the_run_and_the_certificate_says_so(tmp_path):
    from dpcl.guarantees.certificates import read_certificate
    from dpcl.methods.noise_source import REPRODUCIBLE_NOISE_NO_SAMPLING_ASSUMPTION as REPRODUCIBLE_NOISE_ASSUMPTION

    config = write_config(tmp_path, "cosine", tasks="[[0, 1], [2, 3]]")
    runs = [dpcl("run", str(config), "--out", str(tmp_path / name), "--json", "--reproducible-noise")
            for name in ("a", "b")]
    assert all(done.returncode == 0 for done in runs), runs[0].stderr
    a, b = (json.loads(done.stdout) for done in runs)
    assert a["average_accuracy"] == b["average_accuracy"]
    assert (tmp_path / "a" / "checkpoints" / "task002.pt").read_bytes() == (
        tmp_path / "b" / "checkpoints" / "task002.pt").read_bytes()
    cert = read_certificate(tmp_path / "a" / a["releases"][-1]["certificate"])
    assert REPRODUCIBLE_NOISE_ASSUMPTION in cert["assumptions"]


def test_table_output_shows_progress_bars_unless_quiet(tmp_path):
    config = write_config(tmp_path, "cosine")
    loud = dpcl("run", str(config), "--out", str(tmp_path / "a"))
    assert loud.returncode == 0, loud.stderr
    assert "task 1/5" in loud.stderr and "average accuracy" in loud.stdout
    quiet = dpcl("run", str(config), "--out", str(tmp_path / "b"), "--quiet")
    assert quiet.returncode == 0 and "task 1/5" not in quiet.stderr


def test_a_config_audit_refuses_exits_3_before_training(tmp_path):
    config = write_config(tmp_path, "cosine", label_space="data")
    done = dpcl("run", str(config), "--out", str(tmp_path / "out"))
    assert done.returncode == 3
    assert "Prop. 4.6" in done.stderr and len(done.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "out" / "checkpoints").exists()
    audited = dpcl("audit", str(config))
    assert audited.returncode == 3


@pytest.mark.parametrize(
    "mutation, needle",
    [("epsilon = 2.0", "epsilon = -1"), ('name = "cosine"', 'name = "cosine"\nlearning_rat = 0.1')],
)
def test_an_invalid_config_exits_2_naming_the_key(tmp_path, mutation, needle):
    config = write_config(tmp_path, "cosine", epsilon=2.0)
    config.write_text(config.read_text().replace(mutation, needle))
    done = dpcl("run", str(config), "--out", str(tmp_path / "out"))
    assert done.returncode == 2
    assert ("epsilon" in done.stderr) or ("learning_rat" in done.stderr)


def test_missing_config_file_exits_2(tmp_path):
    done = dpcl("run", str(tmp_path / "nope.toml"), "--out", str(tmp_path / "out"))
    assert done.returncode == 2 and "does not exist" in done.stderr


def test_killed_run_resumes_with_its_spent_budget(tmp_path):
    """SIGKILL a real run after its first certified release; the rerun resumes and keeps every charge."""
    config = write_config(
        tmp_path, "peft_ensemble", epsilon=2.0, label_space="prior",
        method_extra="", tasks="[[0, 1], [2, 3], [4, 5], [6, 7], [8, 9]]",
    )
    config.write_text(config.read_text().replace("epochs = 1", "epochs = 4"))
    out = tmp_path / "out"
    process = subprocess.Popen(
        [sys.executable, "-m", "dpcl", "run", str(config), "--out", str(out), "--quiet"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=ENV,
    )
    state = out / "run.json"
    try:
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline and process.poll() is None:
            if state.exists() and json.loads(state.read_text())["releases"]:
                break
            time.sleep(0.05)
        killed = process.poll() is None
        if killed:
            process.send_signal(signal.SIGKILL)
        process.wait(timeout=30)
    finally:
        if process.poll() is None:
            process.kill()
    released_before = len(json.loads(state.read_text())["releases"])
    charges_before = len(TaskLedger.load(out / "ledger.json").charges)
    assert released_before >= 1 and charges_before >= released_before

    done = dpcl("run", str(config), "--out", str(out), "--json", "--resume")
    assert done.returncode == 0, done.stderr
    payload = json.loads(done.stdout)
    assert payload["complete"] and len(payload["releases"]) == 5
    if killed and released_before < 5:
        assert payload["resumed_after_task"] == released_before
    ledger = TaskLedger.load(out / "ledger.json")
    # nothing already spent was forgotten: every earlier charge is still there, followed by the new ones
    assert len(ledger.charges) >= max(5, charges_before)
    assert all(verify_certificate(out / r["certificate"]).valid for r in payload["releases"])


@pytest.mark.parametrize("where", ["file", "under_a_file"])
def test_out_that_cannot_be_a_directory_exits_2_naming_out(tmp_path, where):
    config = write_config(tmp_path, "cosine")
    blocker = tmp_path / "blocker"
    blocker.write_text("not a directory")
    out = blocker if where == "file" else blocker / "run"
    done = dpcl("run", str(config), "--out", str(out))
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.count("\n") == 1 and "--out" in done.stderr and "Traceback" not in done.stderr
    assert blocker.read_text() == "not a directory"
    demo = dpcl("demo", "--out", str(out))
    assert demo.returncode == 2 and demo.stdout == "" and demo.stderr.count("\n") == 1 and "--out" in demo.stderr
