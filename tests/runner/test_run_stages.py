"""``dpcl run`` as named stages on the public Certifier: stage timings, short functions, public stage functions."""

from __future__ import annotations

import ast
import json
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
torch.set_num_threads(1)

from dpcl.guarantees.certificates import read_certificate, verify_certificate  # noqa: E402
from dpcl.guarantees.ledger import TaskLedger  # noqa: E402
from dpcl.runner import run_training  # noqa: E402
from dpcl.runner.run import STAGES  # noqa: E402
from run_helpers import write_config  # noqa: E402

RUNNER = Path(__file__).resolve().parents[2] / "dpcl" / "runner"
MAX_FUNCTION_LINES = 80


def test_a_run_records_the_seconds_of_every_stage_in_its_result_and_run_state(tmp_path):
    config = write_config(tmp_path, "cosine", tasks="[[0, 1], [2, 3]]")
    result = run_training(config, tmp_path / "out", quiet=True)
    assert tuple(result.stage_seconds) == STAGES
    assert all(seconds >= 0 for seconds in result.stage_seconds.values())
    assert result.stage_seconds["train"] > 0 and result.stage_seconds["certify"] > 0
    state = json.loads((tmp_path / "out" / "run.json").read_text())
    assert tuple(state["stage_seconds"]) == STAGES


def test_an_empty_dpsgd_task_releases_the_previous_checkpoint_under_the_charges_so_far(tmp_path):
    """Task 2's public labels miss its data: nothing is charged for it (Prop. F.1), its release is committed."""
    config = write_config(tmp_path, "naive", label_space="prior", tasks="[[0, 1], [2, 3]]",
                          prior_labels="[[0, 1], [7, 8]]")
    result = run_training(config, tmp_path / "out", quiet=True)
    assert result.complete and result.releases[1].examples == 0
    ledger = TaskLedger.load(tmp_path / "out" / "ledger.json")
    assert [c.tasks for c in ledger.charges] == [(0,)] and ledger.released_tasks() == [0, 1]
    cert = read_certificate(tmp_path / "out" / result.releases[1].certificate)
    assert cert["guarantee"]["private"] is True
    assert cert["guarantee"]["epsilon"] == pytest.approx(result.releases[0].cumulative_epsilon, rel=1e-12)
    assert verify_certificate(tmp_path / "out" / result.releases[1].certificate).valid


def _functions(path: Path) -> list[tuple[str, int]]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    return [(node.name, node.end_lineno - node.lineno + 1) for node in ast.walk(tree)
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))]


@pytest.mark.parametrize("module", ["run.py", "tasks.py", "run_state.py", "distributed.py"])
def test_runner_functions_are_short_stages(module):
    long = [(name, n) for name, n in _functions(RUNNER / module) if n > MAX_FUNCTION_LINES]
    assert not long, f"functions over {MAX_FUNCTION_LINES} lines in dpcl/runner/{module}: {long}"


def test_distributed_runs_use_public_stage_functions_only():
    tree = ast.parse((RUNNER / "distributed.py").read_text(encoding="utf-8"))
    private = [(node.module, alias.name) for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)
               and (node.module or "").startswith("dpcl.runner") for alias in node.names
               if alias.name.startswith("_")]
    assert not private, private
