"""Every bundled example config passes `dpcl audit`, and its numbers say what the method does."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import tomllib

import dpcl
from dpcl.cli import main
from dpcl.guarantees.method_schema import get_method_spec

CONFIGS = sorted((Path(dpcl.__file__).parent / "configs").glob("*.toml"))
REPO = Path(__file__).resolve().parents[2]


def _audit(capsys, path):
    code = main(["audit", str(path), "--json"])
    out, err = capsys.readouterr()
    return code, (json.loads(out) if out else None), err


def test_configs_are_bundled():
    names = {p.stem for p in CONFIGS}
    assert {"cosine", "peft_ensemble", "naive", "non_cl"} <= names


def _is_paper_pecl(path: Path) -> bool:
    """PeCL as in the paper: ``[method] training = "paper"``, or no ``training`` key while the PeCL spec has none
    (before the DP-SGD variant of PeCL existed, every PeCL config was the paper's method)."""
    method = tomllib.loads(path.read_text())["method"]
    if method.get("name") != "pecl":
        return False
    if "training" in method:
        return method["training"] == "paper"
    return "training" not in {k.name for k in get_method_spec("pecl").keys}


PAPER_CONFIG = Path(dpcl.__file__).parent / "configs" / "pecl_paper.toml"


def test_pecl_paper_config_is_the_papers_method():
    assert PAPER_CONFIG in CONFIGS and _is_paper_pecl(PAPER_CONFIG)


def _missing_data(path: Path) -> str | None:
    """Why the config at ``path`` cannot be audited here: its path-based dataset's folder is absent (the
    ``fmnist_*`` configs read the Debian package dataset-fashion-mnist), else None."""
    from dpcl.data.registry import missing_dataset_folder

    missing = missing_dataset_folder(tomllib.loads(path.read_text())["stream"]["dataset"])
    return f"{path.name}: {missing}" if missing else None


@pytest.mark.parametrize("path", CONFIGS, ids=[p.stem for p in CONFIGS])
def test_bundled_config_passes_audit(capsys, path):
    if _missing_data(path):
        pytest.skip(_missing_data(path))
    code, payload, err = _audit(capsys, path)
    if _is_paper_pecl(path):  # a private run of it is a privacy violation (test below)
        assert code == 3 and payload["private"] is False and payload["covered"] is False, err
        return
    assert code == 0, err
    assert payload["sound"] is True and payload["violations"] == []
    # the headline is the checkpoint: every bundled config but the paper's PeCL certifies a covered checkpoint
    assert payload["private"] is True and payload["covered"] is True and payload["release"]["basis"]
    assert payload["epsilon"] is not None and payload["epsilon"] > 0
    assert payload["assumptions"]
    cumulative = [p["cumulative_epsilon"] for p in payload["per_task"] if "cumulative_epsilon" in p]
    assert cumulative == sorted(cumulative)  # adding a task never lowers epsilon
    name = payload["method"]
    eps = 1.0 if name in ("cosine", "naive", "non_cl") else None
    if name == "cosine":
        assert payload["across_tasks"] == "parallel" and payload["epsilon"] == pytest.approx(1.0, rel=1e-6)
    elif name == "peft_ensemble":
        per_task = [p["epsilon"] for p in payload["per_task"]]
        assert payload["across_tasks"] == "parallel" and payload["epsilon"] == max(per_task) <= 2.0
    elif name == "naive":
        assert payload["across_tasks"] == "sequential"
        assert max(p["epsilon"] for p in payload["per_task"]) < payload["epsilon"] < 5 * eps
        assert payload["filter"]["stream"]["spent"]["epsilon"] <= payload["total_epsilon"]
    elif name == "non_cl":
        # disjoint units, but task 0's examples are read by every release: all releases compose.
        assert payload["across_tasks"] == "parallel" and payload["epsilon"] > 2 * eps
        assert [p["trained_on_examples"] for p in payload["per_task"]] == sorted(
            p["trained_on_examples"] for p in payload["per_task"]
        )


def test_pecl_paper_config_is_a_privacy_violation_naming_each_reason(capsys, tmp_path):
    """PeCL as in the paper claims privacy but its checkpoint is trained on clean targets with data-dependent
    scores: `dpcl audit` exits 3 naming every reason; the per-token statement survives only as a scoped one."""
    code, payload, err = _audit(capsys, PAPER_CONFIG)
    assert code == 3 and payload["sound"] is False
    assert payload["private"] is False and payload["epsilon"] is None and payload["covered"] is False
    violations = " ".join(payload["violations"])
    assert "clean private next-token targets and class labels" in violations  # clean targets/labels
    assert "sensitivity scores" in violations and "computed from the private text without noise" in violations
    assert "lambda_dyn" in violations and "Omega_k" in violations
    assert len(payload["violations"]) == 3 and all("NOT private" in v for v in payload["violations"])
    assert "privacy violation" in err and err.count("\n") == 1
    assert all("cumulative_epsilon" not in entry for entry in payload["per_task"])
    (scoped,) = payload["scoped_guarantees"]
    assert scoped["name"] == "input_embeddings" and scoped["unit"] == "token" and "input embeddings" in scoped["scope"]
    assert 0 < scoped["epsilon"] <= 10.0 * (1 + 1e-6)  # calibrated to epsilon_upper = 10 per token
    code = main(["audit", str(PAPER_CONFIG)])
    out = capsys.readouterr().out
    assert code == 3 and "NOT PRIVATE" in out and "scoped input_embeddings" in out
    # [run] private = false: a non-private research run with the paper's noise; still NOT private, scoped kept
    research = tmp_path / "pecl_paper_research.toml"
    research.write_text(PAPER_CONFIG.read_text() + "\n[run]\nprivate = false\n")
    code, payload, err = _audit(capsys, research)
    assert code == 3 and payload["private"] is False and payload["epsilon"] is None
    assert "NOT private" in payload["violations"][0] and "clean private next-token targets" in payload["violations"][0]
    assert payload["scoped_guarantees"][0]["epsilon"] == pytest.approx(scoped["epsilon"], rel=1e-12)
    assert any("noise" in entry for entry in payload["per_task"])  # the paper's noise is applied


ISSUE_EXAMPLE = """
[privacy]
epsilon = 1.0          # per-task budget
delta = 1e-5
adjacency = "add_remove"   # or "replace_one"
accountant = "prv"         # prv | pld | rdp | auto
across_tasks = "auto"      # auto | parallel | sequential
total_epsilon = 4.0        # optional: privacy filter over the stream
[stream]
dataset = "digits"
tasks = [[0,1],[2,3],[4,5],[6,7],[8,9]]
label_space = "prior_const"   # data | prior | prior_const
prior_labels = [[0,1],[2,3],[4,5],[6,7],[8,9]]
disjoint_units = true
[method]
name = "cosine"    # cosine | peft_ensemble | naive | non_cl | l2dpml | pecl
epochs = 2
batch_size = 64
max_grad_norm = 1.0
"""


def test_audit_issue_example_verbatim(tmp_path, capsys):
    path = tmp_path / "issue.toml"
    path.write_text(ISSUE_EXAMPLE)
    code, payload, err = _audit(capsys, path)
    assert code == 0, err
    assert payload["across_tasks"] == "parallel" and payload["accountant"] == "prv"
    assert payload["total_epsilon"] == 4.0 and len(payload["filter"]) == 5
    assert any("do not affect the cosine classifier" in n for n in payload["notes"])


def test_audit_and_verify_as_a_user(tmp_path):
    """`python -m dpcl audit` in a fresh process: exit 0 on the example, 2 on an unknown key, 3 on S_data."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    cosine = Path(dpcl.__file__).parent / "configs" / "cosine.toml"
    run = lambda *a: subprocess.run(  # noqa: E731
        [sys.executable, "-m", "dpcl", *a], capture_output=True, text=True, env=env, timeout=300, cwd=tmp_path
    )
    ok = run("audit", str(cosine))
    assert ok.returncode == 0 and "sound" in ok.stdout, ok.stderr
    typo = tmp_path / "typo.toml"
    typo.write_text(cosine.read_text().replace("delta = 1e-5", "delta = 1e-5\ndeltta = 1e-6"))
    bad = run("audit", str(typo))
    assert bad.returncode == 2 and bad.stdout == "" and "unknown [privacy] key(s) deltta" in bad.stderr
    assert bad.stderr.count("\n") == 1
    leak = tmp_path / "leak.toml"
    leak.write_text(cosine.read_text().replace('label_space = "prior_const"', 'label_space = "data"'))
    violation = run("audit", str(leak), "--json")
    assert violation.returncode == 3 and "Prop. 4.6" in violation.stdout
    missing = run("verify", str(tmp_path / "none.json"))
    assert missing.returncode == 2 and "does not exist" in missing.stderr


@pytest.mark.parametrize("path", CONFIGS, ids=[p.stem for p in CONFIGS])
def test_bundled_config_states_the_privacy_unit_correctly(path):
    """The bundled datasets do not know who produced an example: the unit is one image or fortune (or a token),
    never a person; a contributor of several examples is protected only through group privacy."""
    text = " ".join(path.read_text().replace("\n#", " ").split())  # comments wrapped over lines read as one
    assert "person's contribution" not in text and "one person" not in text
    if "disjoint_units = true" in text:
        assert "group privacy" in text and ("not one writer" in text or "not one author" in text)
