"""`dpcl audit` and `dpcl verify` as a user runs them: exit codes, one-line errors, JSON payloads."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import numpy as np
import pytest

import dpcl
from dpcl.accounting.events import GaussianEvent
from dpcl.cli import main
from dpcl.guarantees import ledger as ledger_module
from dpcl.guarantees.atomic_io import sha256_file
from dpcl.guarantees.certificates import certificate_from_ledger, write_certificate
from dpcl.guarantees.ledger import TaskLedger


def _load_reference():
    import importlib.util

    path = Path(__file__).resolve().parents[1] / "guarantees" / "reference.py"
    spec = importlib.util.spec_from_file_location("dpcl_tests_reference", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


reference_compute = _load_reference().reference_compute

CONFIGS = Path(dpcl.__file__).parent / "configs"


@pytest.fixture(autouse=True)
def reference_accountant(monkeypatch):
    monkeypatch.setattr(ledger_module, "_compute", reference_compute)


def _run(capsys, *argv):
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def _write(tmp_path, text, name="cfg.toml"):
    path = tmp_path / name
    path.write_text(text)
    return str(path)


def test_audit_bundled_cosine_json(capsys):
    code, out, err = _run(capsys, "audit", str(CONFIGS / "cosine.toml"), "--json")
    assert code == 0, err
    payload = json.loads(out)
    assert payload["sound"] is True and payload["violations"] == []
    assert payload["across_tasks"] == "parallel"
    assert payload["epsilon"] == pytest.approx(1.0, rel=1e-8)
    assert len(payload["per_task"]) == 5 and all(p["filtered_out"] == 0 for p in payload["per_task"])
    assert sum(p["examples"] for p in payload["per_task"]) > 1000  # digits training split


def test_audit_table_output(capsys):
    code, out, _ = _run(capsys, "audit", str(CONFIGS / "cosine.toml"))
    assert code == 0 and "sound" in out and "parallel" in out


COSINE_TEXT = (CONFIGS / "cosine.toml").read_text() if (CONFIGS / "cosine.toml").exists() else ""


@pytest.mark.parametrize(
    ("old", "new", "message"),
    [
        ('name = "cosine"', 'name = "cosine"\nepoch = 2', "unknown [method] key(s) epoch"),
        ("epsilon = 1.0", "epsilon = -1.0", "[privacy] epsilon must be > 0"),
        ("epsilon = 1.0", 'epsilon = "one"', "[privacy] epsilon must be a finite number"),
        ('dataset = "digits"', 'dataset = "digits"\nshuffle = true', "unknown [stream] key(s) shuffle"),
        ("disjoint_units = true", "", "[stream] disjoint_units is required"),
        ('label_space = "prior_const"', 'label_space = "public"', "[stream] label_space must be one of"),
        ("delta = 1e-5", "delta = [", "not valid TOML"),
    ],
)
def test_audit_invalid_config_exit_2(tmp_path, capsys, old, new, message):
    assert old in COSINE_TEXT
    code, out, err = _run(capsys, "audit", _write(tmp_path, COSINE_TEXT.replace(old, new, 1)))
    assert code == 2
    assert out == ""
    assert err.count("\n") == 1 and message in err and "Traceback" not in err


def test_audit_run_section(tmp_path, capsys):
    code, out, err = _run(capsys, "audit", _write(tmp_path, COSINE_TEXT + "\n[run]\nprivate = false\n"), "--json")
    assert code == 3 and "no differential-privacy guarantee" in json.loads(out)["violations"][0]
    code, out, err = _run(capsys, "audit", _write(tmp_path, COSINE_TEXT + "\n[run]\nprivate = true\n"))
    assert code == 0
    code, out, err = _run(capsys, "audit", _write(tmp_path, COSINE_TEXT + "\n[run]\nprivat = true\n"))
    assert code == 2 and "unknown [run] key(s) privat" in err and out == ""


def test_audit_missing_file_exit_2(tmp_path, capsys):
    code, out, err = _run(capsys, "audit", str(tmp_path / "nope.toml"))
    assert code == 2 and "does not exist" in err and out == ""


@pytest.mark.parametrize(
    ("old", "new", "message"),
    [
        ('label_space = "prior_const"', 'label_space = "data"', "Prop. 4.6"),
        ('across_tasks = "auto"', 'across_tasks = "parallel"', "disjoint_units = false"),
    ],
)
def test_audit_privacy_violation_exit_3(tmp_path, capsys, old, new, message):
    text = COSINE_TEXT.replace(old, new, 1)
    if "parallel" in new:
        text = text.replace("disjoint_units = true", "disjoint_units = false")
    code, out, err = _run(capsys, "audit", _write(tmp_path, text), "--json")
    assert code == 3
    payload = json.loads(out)
    assert payload["sound"] is False and any(message in v for v in payload["violations"])
    assert "privacy violation" in err


def test_audit_explicit_task_sizes_for_unbundled_dataset(tmp_path, capsys):
    text = COSINE_TEXT.replace('dataset = "digits"', 'dataset = "hospital-notes"\ntask_sizes = [50, 0, 70, 80, 90]')
    code, out, _ = _run(capsys, "audit", _write(tmp_path, text), "--json")
    assert code == 0
    payload = json.loads(out)
    assert [p["examples"] for p in payload["per_task"]] == [50, 0, 70, 80, 90]
    assert payload["per_task"][1]["status"].startswith("empty task")


def test_audit_prior_filtering_reports_counts(tmp_path, capsys):
    """Label 1 is not in task 0's public set: its examples are dropped before training (Eq. 6)."""
    text = COSINE_TEXT.replace('label_space = "prior_const"', 'label_space = "prior"').replace(
        "prior_labels = [[0, 1], [2, 3], [4, 5], [6, 7], [8, 9]]", "prior_labels = [[0], [2, 3], [4, 5], [6, 7], [8, 9]]"
    )
    code, out, _ = _run(capsys, "audit", _write(tmp_path, text), "--json")
    assert code == 0
    filtered = json.loads(out)["per_task"]
    code, out, _ = _run(capsys, "audit", str(CONFIGS / "cosine.toml"), "--json")
    unfiltered = json.loads(out)["per_task"]
    assert filtered[0]["filtered_out"] > 0
    assert filtered[0]["examples"] + filtered[0]["filtered_out"] == unfiltered[0]["examples"]
    assert [p["examples"] for p in filtered[1:]] == [p["examples"] for p in unfiltered[1:]]


# -- verify ---------------------------------------------------------------------------------------


@pytest.fixture()
def certificate(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    ckpt = run / "task0.ckpt"
    ckpt.write_bytes(np.random.default_rng(0).bytes(2048))
    ledger = TaskLedger(delta=1e-5, across_tasks="parallel")
    ledger.charge(0, GaussianEvent(sigma=3.0))
    ledger.release(0, checkpoint_sha256=sha256_file(ckpt))
    cert = certificate_from_ledger(
        ledger, method="cosine", label_space="prior", assumptions=["Public encoder."], checkpoint=ckpt
    )
    path = run / "task0.cert.json"
    write_certificate(path, cert)
    return path, ckpt


def test_verify_valid(certificate, capsys):
    path, _ = certificate
    code, out, err = _run(capsys, "verify", str(path), "--json")
    assert code == 0, err
    payload = json.loads(out)
    assert payload["valid"] is True and {c["name"] for c in payload["checks"]} >= {"epsilon", "checkpoint"}
    code, out, _ = _run(capsys, "verify", str(path))
    assert code == 0 and "valid" in out


def test_verify_edited_epsilon_exit_3(certificate, capsys):
    path, _ = certificate
    data = json.loads(path.read_text())
    data["guarantee"]["epsilon"] = 0.5
    path.write_text(json.dumps(data))
    code, _, err = _run(capsys, "verify", str(path))
    assert code == 3 and "failed check(s): epsilon" in err


def test_verify_swapped_checkpoint_exit_3(certificate, tmp_path, capsys):
    path, ckpt = certificate
    other = tmp_path / "other.ckpt"
    other.write_bytes(b"another model")
    code, _, err = _run(capsys, "verify", str(path), "--checkpoint", str(other))
    assert code == 3 and "checkpoint" in err
    shutil.copy(other, ckpt)
    code, _, err = _run(capsys, "verify", str(path))
    assert code == 3 and "checkpoint" in err


def test_verify_malformed_exit_2(tmp_path, capsys):
    bad = tmp_path / "bad.json"
    bad.write_text('{"format": "dpcl-certificate", "version": 1')
    code, out, err = _run(capsys, "verify", str(bad))
    assert code == 2 and out == "" and "not valid JSON" in err and err.count("\n") == 1
