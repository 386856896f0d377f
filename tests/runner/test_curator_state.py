"""Released checkpoints hold only what the certificate covers; curator state lives in DIR/curator/ (private).

A checkpoint's SHA-256 is what its certificate certifies as a DP release. State a
method computed from the private data without noise (privacy-unit ids, token
counts, activation norms, per-task records) must not be in it: ``dpcl run``
writes it to ``DIR/curator/taskNNN.state.pt``, records its SHA-256 in
``run.json`` and refuses to resume (exit 2) when that file is missing or altered.
"""

from __future__ import annotations

import json
import tomllib
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from dpcl.cli import main  # noqa: E402
from dpcl.data import build_stream  # noqa: E402
from dpcl.errors import LedgerCorruptError  # noqa: E402
from dpcl.guarantees.certificates import read_certificate, verify_certificate  # noqa: E402
from dpcl.runner import run_training  # noqa: E402
from dpcl.runner.run import CURATOR_STATE_ASSUMPTION  # noqa: E402

from run_helpers import write_config, write_l2dpml_config, write_pecl_config  # noqa: E402

#: names of state computed from the private data without noise (before the split, some were in checkpoints)
CURATOR_ONLY_KEYS = {"seen_units", "units", "digest", "memory_units", "memory_digests", "token_counts", "omegas",
                     "seen", "task_records", "mean_score", "lambda_dyn", "omega", "omega_bar", "guarantee",
                     "last_losses"}

SHORT_TASKS = "[[0, 1], [2, 3], [4, 5]]"


def _config(tmp_path: Path, method: str) -> Path:
    if method == "l2dpml":
        return write_l2dpml_config(tmp_path)
    if method == "pecl":
        return write_pecl_config(tmp_path)
    return write_config(tmp_path, method, tasks=SHORT_TASKS)


def _train_unit_ids(config: Path, seed: int) -> list[np.ndarray]:
    """Every task's private training unit ids, rebuilt from the config as the runner builds the stream."""
    section = dict(tomllib.loads(config.read_text(encoding="utf-8"))["stream"])
    section.setdefault("seed", seed)
    return [np.asarray(u) for u in build_stream(section).unit_ids()]


def _walk(value, path=()):
    """(key path, leaf) of every leaf of a nested dict / list payload."""
    if isinstance(value, dict):
        for k, v in value.items():
            yield from _walk(v, path + (str(k),))
    elif isinstance(value, (list, tuple)):
        for i, v in enumerate(value):
            yield from _walk(v, path + (str(i),))
    else:
        yield path, value


def _integer_arrays(payload):
    for path, leaf in _walk(payload):
        if isinstance(leaf, torch.Tensor):
            leaf = leaf.detach().cpu().numpy()
        if isinstance(leaf, np.ndarray) and leaf.dtype.kind in "iu" and leaf.size > 1:
            yield path, leaf.ravel()


@pytest.mark.parametrize("method", ["cosine", "peft_ensemble", "naive", "non_cl", "l2dpml", "pecl"])
def test_released_checkpoints_hold_no_unit_ids_or_private_statistics(tmp_path, method):
    config = _config(tmp_path, method)
    result = run_training(config, tmp_path / "out", quiet=True)
    assert result.complete
    units = _train_unit_ids(config, seed=0)
    everyone = np.concatenate(units)
    for release in result.releases:
        payload = torch.load(result.out_dir / release.checkpoint, map_location="cpu", weights_only=True)
        keys = {part for path, _ in _walk(payload) for part in path}
        assert not keys & CURATOR_ONLY_KEYS, f"{release.checkpoint} holds curator state {keys & CURATOR_ONLY_KEYS}"
        for path, array in _integer_arrays(payload):
            is_arange = np.array_equal(array, np.arange(array.size))  # position buffers of the language model
            assert is_arange or not np.isin(array, everyone).all(), (
                f"{release.checkpoint}: {'/'.join(path)} is a set of private unit ids"
            )
        # the curator file exists, is recorded in run.json and is not what the certificate certifies
        curator = result.out_dir / release.curator_state
        assert curator.is_file() and curator.parent.name == "curator"
        cert = read_certificate(result.out_dir / release.certificate)
        assert verify_certificate(result.out_dir / release.certificate).valid
        assert CURATOR_STATE_ASSUMPTION in cert["assumptions"]
        assert release.curator_sha256 not in json.dumps(cert)
    state = json.loads((result.out_dir / "run.json").read_text())
    assert [r["curator_sha256"] for r in state["releases"]] == [r.curator_sha256 for r in result.releases]


def test_l2dpml_unit_ids_are_curator_state(tmp_path):
    """What the l2dpml checkpoints used to carry is in the curator file: every task's unit ids, each memory batch's."""
    config = _config(tmp_path, "l2dpml")
    result = run_training(config, tmp_path / "out", quiet=True)
    units = _train_unit_ids(config, seed=0)
    curator = torch.load(result.out_dir / result.releases[-1].curator_state, weights_only=True)["state"]
    np.testing.assert_array_equal(curator["seen_units"].numpy(), np.concatenate(units))
    assert len(curator["memory_units"]) == len(units)  # one memory batch per task
    for task_units, batch in zip(units, curator["memory_units"]):
        assert np.isin(batch.numpy(), task_units).all() and batch.numel() > 1


@pytest.mark.parametrize("method", ["l2dpml", "pecl"])
def test_resumed_run_equals_the_uninterrupted_run(tmp_path, method):
    """The curator state restored on resume drives later tasks exactly as in one uninterrupted run."""
    config = _config(tmp_path, method)
    whole = run_training(config, tmp_path / "whole", seed=1, quiet=True, reproducible_noise=True)
    first = run_training(config, tmp_path / "split", seed=1, quiet=True, stop_after_task=0, reproducible_noise=True)
    assert not first.complete
    second = run_training(config, tmp_path / "split", seed=1, quiet=True, reproducible_noise=True, resume=True)
    assert second.resumed_after == 0 and second.complete
    assert second.metrics["accuracy_matrix"] == whole.metrics["accuracy_matrix"]
    for name in ("checkpoint", "curator_state"):
        a = torch.load(whole.out_dir / getattr(whole.releases[-1], name), weights_only=True)["state"]
        b = torch.load(second.out_dir / getattr(second.releases[-1], name), weights_only=True)["state"]
        leaves_a, leaves_b = list(_walk(a)), list(_walk(b))
        assert [p for p, _ in leaves_a] == [p for p, _ in leaves_b]
        for (path, x), (_, y) in zip(leaves_a, leaves_b):
            if isinstance(x, torch.Tensor):
                assert torch.equal(x, y), "/".join(path)
            elif not (isinstance(x, float) and np.isnan(x) and np.isnan(y)):
                assert x == y, "/".join(path)


@pytest.mark.parametrize("damage", ["missing", "edited"])
def test_resume_refuses_a_missing_or_edited_curator_file(tmp_path, capsys, damage):
    config = write_config(tmp_path, "cosine", tasks=SHORT_TASKS)
    out = tmp_path / "out"
    first = run_training(config, out, quiet=True, stop_after_task=0)
    curator = out / first.releases[-1].curator_state
    if damage == "missing":
        curator.unlink()
    else:
        curator.write_bytes(curator.read_bytes() + b"\0")
    capsys.readouterr()
    assert main(["run", str(config), "--out", str(out), "--quiet", "--resume"]) == 2
    err = capsys.readouterr().err
    assert "curator/task001.state.pt" in err and ("missing" if damage == "missing" else "modified") in err
    assert "start the run over" in err and "Traceback" not in err
    with pytest.raises(LedgerCorruptError, match="task001.state.pt"):
        run_training(config, out, quiet=True, resume=True)
    # nothing was trained or charged on the refused resume
    assert json.loads((out / "run.json").read_text())["releases"][-1]["task_index"] == 0


def test_l2dpml_curator_file_of_another_release_is_refused(tmp_path):
    """A curator file swapped in (with run.json edited to match) must still fit the checkpoint's memory."""
    config = _config(tmp_path, "l2dpml")
    out = tmp_path / "out"
    run_training(config, out, quiet=True, stop_after_task=1)
    state = json.loads((out / "run.json").read_text())
    older = state["releases"][0]
    state["releases"][1]["curator_state"] = older["curator_state"]
    state["releases"][1]["curator_sha256"] = older["curator_sha256"]
    (out / "run.json").write_text(json.dumps(state))
    with pytest.raises(LedgerCorruptError, match="task index 0"):
        run_training(config, out, quiet=True, resume=True)


def test_run_state_of_version_1_is_refused_by_name(tmp_path, capsys):
    """Runs of version 1 put curator state into their released checkpoints: they are not resumed."""
    config = write_config(tmp_path, "cosine", tasks=SHORT_TASKS)
    out = tmp_path / "out"
    run_training(config, out, quiet=True, stop_after_task=0)
    state = json.loads((out / "run.json").read_text())
    state["version"] = 1
    (out / "run.json").write_text(json.dumps(state))
    capsys.readouterr()
    assert main(["run", str(config), "--out", str(out), "--quiet", "--resume"]) == 2
    err = capsys.readouterr().err
    assert "version 1" in err and "new --out directory" in err
