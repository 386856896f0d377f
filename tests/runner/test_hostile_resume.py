"""Resuming a run from a hostile run directory: exit 2 and one line, never code execution or a traceback.

Checkpoints and curator files are loaded only with ``torch.load(weights_only=True)``: a pickle that would run
code when unpickled is refused, and the code does not run. Paths in run.json stay inside the run directory.
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from dpcl.cli import main  # noqa: E402
from dpcl._io.atomic_io import MAX_JSON_BYTES, sha256_file  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from run_helpers import write_config  # noqa: E402


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory):
    """A run stopped after its first task (resuming continues with the second)."""
    from dpcl.runner import run_training

    base = tmp_path_factory.mktemp("hostile")
    config = write_config(base, "cosine", tasks="[[0, 1], [2, 3]]")
    run_training(config, base / "out", quiet=True, stop_after_task=0)
    return config, base / "out"


@pytest.fixture()
def run_copy(finished_run, tmp_path):
    config, out = finished_run
    copy = tmp_path / "out"
    shutil.copytree(out, copy, symlinks=True)
    return config, copy


class _RunsCode:
    """Unpickling this runs ``exec``: what a malicious checkpoint would do."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return (exec, (f"open({str(self.marker)!r}, 'w').write('code ran')",))


def _resume(capsys, config, out):
    code = main(["run", str(config), "--out", str(out), "--quiet", "--resume"])
    stdout, err = capsys.readouterr()
    return code, stdout, err


def _state(out):
    return json.loads((out / "run.json").read_text())


@pytest.mark.parametrize("which", ["checkpoint", "curator_state"])
def test_a_pickle_that_runs_code_is_refused_and_never_runs(run_copy, tmp_path, capsys, which):
    config, out = run_copy
    marker = tmp_path / "pwned"
    release = _state(out)["releases"][-1]
    target = out / release[which]
    payload = torch.load(target, map_location="cpu", weights_only=True)
    payload["state"] = {"weights": _RunsCode(marker)}
    torch.save(payload, target)
    # the attacker also rewrote the hashes dpcl compares, so only the unpickler stands in the way
    digest = sha256_file(target)
    if which == "checkpoint":
        cert_path = out / release["certificate"]
        cert = json.loads(cert_path.read_text())
        cert["checkpoint"]["sha256"] = digest
        cert_path.write_text(json.dumps(cert))
    else:
        state = _state(out)
        state["releases"][-1]["curator_sha256"] = digest
        (out / "run.json").write_text(json.dumps(state))
    code, stdout, err = _resume(capsys, config, out)
    assert code == 2 and err.count("\n") == 1 and "Traceback" not in err, err
    assert "cannot be read" in err
    assert not marker.exists()
    with pytest.raises(Exception):  # the file really would run code when unpickled without weights_only
        torch.load(target, weights_only=True)


@pytest.mark.parametrize(
    ("field", "value", "needle"),
    [
        ("checkpoint", "../../outside.pt", "points outside"),
        ("curator_state", "/etc/passwd", "is absolute"),
        ("certificate", "../x.json", "points outside"),
        ("checkpoint", 7, "does not exist"),
    ],
)
def test_run_json_paths_must_stay_inside_the_run_directory(run_copy, capsys, field, value, needle):
    config, out = run_copy
    state = _state(out)
    state["releases"][-1][field] = value
    (out / "run.json").write_text(json.dumps(state))
    code, _, err = _resume(capsys, config, out)
    assert code == 2 and err.count("\n") == 1 and needle in err, err


def test_a_checkpoint_symlinked_from_elsewhere_is_refused(run_copy, tmp_path, capsys):
    config, out = run_copy
    release = _state(out)["releases"][-1]
    real = out / release["checkpoint"]
    elsewhere = tmp_path / "elsewhere.pt"
    shutil.move(real, elsewhere)
    real.symlink_to(elsewhere)
    code, _, err = _resume(capsys, config, out)
    assert code == 2 and "symbolic link" in err and err.count("\n") == 1


@pytest.mark.parametrize("kind", ["huge", "deep", "list", "releases_not_a_list", "release_missing_keys"])
def test_a_hostile_run_json_is_refused(run_copy, capsys, kind):
    config, out = run_copy
    path = out / "run.json"
    if kind == "huge":
        with open(path, "r+b") as handle:
            handle.truncate(MAX_JSON_BYTES + 1)
    elif kind == "deep":
        path.write_text("[" * 100_000 + "]" * 100_000)
    elif kind == "list":
        path.write_text("[]")
    else:
        state = _state(out)
        state["releases"] = 5 if kind == "releases_not_a_list" else [{"task_index": 0}]
        path.write_text(json.dumps(state))
    code, _, err = _resume(capsys, config, out)
    assert code == 2 and err.count("\n") == 1 and "Traceback" not in err, err
