"""Data-parallel DP-SGD on torch.distributed: ``dpcl run --nproc N`` and ``torchrun ... -m dpcl run``.

Two gloo processes on the CPU train small two-task Naive and PEFT-Ensemble
configs. What must hold (dpcl.runner.distributed): the ledger charges the same
events as a single-process run and every epsilon is the same (to 1e-9
relative), every certificate verifies, only rank 0 writes, and with
``--reproducible-noise`` the released weights equal the single-process ones up
to the float32 rounding of the cross-rank gradient sum (rank 0 draws the same
masks and noise; no noise is added on rank 1).
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("opacus")
import torch.distributed as dist  # noqa: E402

if not (dist.is_available() and dist.is_gloo_available()):  # pragma: no cover - every CPU torch build has gloo
    pytest.skip("this torch build has no torch.distributed gloo backend", allow_module_level=True)

from dpcl.errors import ConfigError, InvalidParameterError  # noqa: E402
from dpcl.guarantees.certificates import verify_certificate  # noqa: E402
from dpcl.guarantees.ledger import TaskLedger  # noqa: E402
from dpcl.runner import run_training  # noqa: E402
from dpcl.runner.distributed import run_data_parallel  # noqa: E402
from dpcl.runner.ranks import refuse_on_other_ranks  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]


def _config(tmp_path: Path, method: str) -> Path:
    path = tmp_path / f"{method}.toml"
    path.write_text(
        '[privacy]\nepsilon = 2.0\ndelta = 1e-5\nacross_tasks = "sequential"\naccountant = "rdp"\n'
        '[stream]\ndataset = "digits"\ntasks = [[0, 1], [2, 3]]\nlabel_space = "prior_const"\n'
        "prior_labels = [0, 1, 2, 3]\ndisjoint_units = false\n"
        f'[method]\nname = "{method}"\nepochs = 1\nbatch_size = 64\nmax_grad_norm = 1.0\nadapter_dim = 8\n'
        "learning_rate = 0.05\n",
        encoding="utf-8",
    )
    return path


def _ledger_events(out: Path) -> list:
    return [c["events"] for c in json.loads((out / "ledger.json").read_text())["charges"]]


def _weights(out: Path, task: int) -> dict:
    state = torch.load(out / "checkpoints" / f"task{task:03d}.pt", map_location="cpu", weights_only=True)["state"]
    return state["model"] if "model" in state else {f"{i}.{k}": v for i, m in enumerate(state["models"])
                                                   for k, v in m.items()}


def _same_run(single: Path, double: Path) -> None:
    """Same events, same epsilons, verified certificates, the same weights up to float32 rounding."""
    assert _ledger_events(double) == _ledger_events(single)
    certificates = sorted((double / "certificates").glob("*.cert.json"))
    assert len(certificates) == 2
    for cert in certificates:
        verify_certificate(cert).raise_if_invalid()
        mine = json.loads(cert.read_text())["guarantee"]["epsilon"]
        theirs = json.loads((single / "certificates" / cert.name).read_text())["guarantee"]["epsilon"]
        assert math.isclose(mine, theirs, rel_tol=1e-9)
    for task in (1, 2):
        a, b = _weights(single, task), _weights(double, task)
        assert a.keys() == b.keys()
        for key in a:
            torch.testing.assert_close(b[key], a[key], rtol=0, atol=1e-5)
    assert not list(double.glob("**/*.tmp*"))  # atomic writes by one writer: no leftovers


def test_two_gloo_processes_train_naive_as_one_process_does(tmp_path):
    config = _config(tmp_path, "naive")
    single = run_training(config, tmp_path / "one", seed=3, quiet=True, reproducible_noise=True)
    double = run_data_parallel(config, tmp_path / "two", nproc=2, seed=3, quiet=True, reproducible_noise=True)
    assert double.complete and double.metrics["cumulative_epsilon"] == single.metrics["cumulative_epsilon"]
    _same_run(tmp_path / "one", tmp_path / "two")


def test_torchrun_two_gloo_processes_train_peft_ensemble_as_one_process_does(tmp_path):
    config = _config(tmp_path, "peft_ensemble")
    run_training(config, tmp_path / "one", seed=3, quiet=True, reproducible_noise=True)
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", "-m", "dpcl", "run",
         str(config), "--out", str(tmp_path / "two"), "--seed", "3", "--reproducible-noise", "--json"],
        capture_output=True, text=True, timeout=600, env=env,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(proc.stdout)  # rank 0's report only: rank 1 prints nothing
    assert report["complete"] and report["method"] == "peft_ensemble"
    _same_run(tmp_path / "one", tmp_path / "two")


def test_nproc_refuses_methods_that_do_not_train_by_dp_sgd_and_bad_counts(tmp_path):
    from run_helpers import write_config, write_l2dpml_config

    for config in (write_config(tmp_path, "cosine"), write_l2dpml_config(tmp_path)):
        with pytest.raises(ConfigError, match=r"DP-SGD methods only \(naive, non_cl, peft_ensemble: "):
            run_data_parallel(config, tmp_path / "out", nproc=2, quiet=True)
    with pytest.raises(InvalidParameterError, match="nproc must be an integer >= 1, got 0"):
        run_data_parallel(_config(tmp_path, "naive"), tmp_path / "out", nproc=0, quiet=True)
    assert not (tmp_path / "out").exists()


def test_run_training_refuses_to_write_on_a_rank_other_than_0(monkeypatch):
    monkeypatch.setattr(dist, "is_initialized", lambda: True)
    monkeypatch.setattr(dist, "get_rank", lambda group=None: 1)
    with pytest.raises(InvalidParameterError, match="only rank 0 writes the ledger"):
        refuse_on_other_ranks()


KILL_RANK_1 = """
import os, sys
import torch.distributed as dist
from dpcl.methods import dpsgd_training
original = dpsgd_training._header
calls = []
def header_then_die(*args, **kwargs):
    header = original(*args, **kwargs)
    calls.append(1)
    if dist.get_rank() == 1 and len(calls) == 2:
        os._exit(17)  # rank 1 dies once rank 0 has started training the second task
    return header
dpsgd_training._header = header_then_die
from dpcl.cli import main
sys.exit(main(sys.argv[1:]))
"""


@pytest.mark.thorough
def test_a_rank_that_dies_leaves_a_consistent_ledger_and_a_rerun_resumes(tmp_path):
    config = _config(tmp_path, "naive")
    script = tmp_path / "dying_rank.py"
    script.write_text(KILL_RANK_1, encoding="utf-8")
    out = tmp_path / "run"
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", str(script), "run",
         str(config), "--out", str(out), "--seed", "3", "--quiet"],
        capture_output=True, text=True, timeout=600, env=env,
    )
    assert proc.returncode != 0
    state = json.loads((out / "run.json").read_text())
    assert [r["task_index"] for r in state["releases"]] == [0]
    # the ledger's file and its journal of appended charges, read as the library reads them
    charged = [list(c.tasks) for c in TaskLedger.load(out / "ledger.json").charges]
    assert charged == [[0], [1]]  # task 1 stays charged, it was not released
    verify_certificate(out / "certificates" / "task001.cert.json").raise_if_invalid()
    resumed = run_data_parallel(config, out, nproc=2, seed=3, quiet=True, resume=True)
    assert resumed.resumed_after == 0 and resumed.complete
    # the attempt at task 1 committed nothing: the retrained task reuses its charge (charged once, never twice)
    assert [list(c.tasks) for c in TaskLedger.load(out / "ledger.json").charges] == [[0], [1]]
    verify_certificate(resumed.last_certificate).raise_if_invalid()


@pytest.mark.thorough
@pytest.mark.parametrize("variant", ["non_cl", "not_private"])
def test_two_gloo_processes_train_non_cl_and_non_private_runs_as_one_process_does(tmp_path, variant):
    config = _config(tmp_path, "non_cl" if variant == "non_cl" else "naive")
    text = config.read_text()
    if variant == "non_cl":  # Non-CL rereads past tasks: the audit wants disjoint units (parallel composition)
        text = text.replace("disjoint_units = false", "disjoint_units = true").replace('"sequential"', '"auto"')
    else:
        text += "[run]\nprivate = false\n"
    config.write_text(text)
    single = run_training(config, tmp_path / "one", seed=3, quiet=True, reproducible_noise=True)
    double = run_data_parallel(config, tmp_path / "two", nproc=2, seed=3, quiet=True, reproducible_noise=True)
    assert double.metrics["cumulative_epsilon"] == single.metrics["cumulative_epsilon"]
    for task in (1, 2):
        a, b = _weights(tmp_path / "one", task), _weights(tmp_path / "two", task)
        for key in a:
            torch.testing.assert_close(b[key], a[key], rtol=0, atol=1e-5)
    if variant == "non_cl":
        _same_run(tmp_path / "one", tmp_path / "two")
