"""`dpcl audit` and `dpcl verify` as a user runs them: exit codes, one-line errors, JSON payloads."""

from __future__ import annotations

import json
import re
import shutil
import sys
from pathlib import Path

import numpy as np
import pytest

import dpcl
from dpcl.accounting.events import GaussianEvent
from dpcl.cli import main
from dpcl.guarantees import stream_composition as composition_module
from dpcl._io.atomic_io import sha256_file
from dpcl.guarantees.certificates import certificate_from_ledger, write_certificate
from dpcl.guarantees.ledger import TaskLedger
from dpcl.guarantees.method_schema import ReleaseCoverage

COVERED = ReleaseCoverage.post_processing("The checkpoint is a post-processing of the charged noisy releases.")


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
    monkeypatch.setattr(composition_module, "_compute", reference_compute)


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
    code, out, err = _run(capsys, "audit", _write(tmp_path, COSINE_TEXT + "\n[run]\nprivate = true\n"))
    assert code == 0
    code, out, err = _run(capsys, "audit", _write(tmp_path, COSINE_TEXT + "\n[run]\nreproducible_noise = true\n"))
    assert code == 0, err
    code, out, err = _run(capsys, "audit", _write(tmp_path, COSINE_TEXT + "\n[run]\nprivat = true\n"))
    assert code == 2 and "unknown [run] key(s) privat" in err and out == ""
    code, out, err = _run(capsys, "audit", _write(tmp_path, COSINE_TEXT + "\n[run]\nprivate = 0\n"))
    assert code == 2 and "[run] private must be bool" in err and out == ""


def test_audit_non_private_run_reports_no_epsilon(tmp_path, capsys):
    path = _write(tmp_path, COSINE_TEXT + "\n[run]\nprivate = false\n")
    code, out, err = _run(capsys, "audit", path, "--json")
    assert code == 3
    payload = json.loads(out)
    assert payload["private"] is False and payload["sound"] is False and payload["epsilon"] is None
    assert "NOT private" in payload["violations"][0] and "remove `private = false`" in payload["violations"][0].lower()
    assert len(payload["per_task"]) == 5
    for entry in payload["per_task"]:
        assert not {"epsilon", "cumulative_epsilon", "release_epsilon", "noise"} & set(entry)
        assert entry["status"].startswith("not private")
    assert payload["filter"] == {}
    assert err.count("\n") == 1 and "the run is NOT private" in err and "Remove `private = false`" in err

    code, out, err = _run(capsys, "audit", path)
    assert code == 3 and "NOT PRIVATE" in out and "[run] private = false" in out
    # the private run's epsilon appears nowhere in the table
    private_eps = json.loads(_run(capsys, "audit", str(CONFIGS / "cosine.toml"), "--json")[1])["epsilon"]
    assert f"epsilon={private_eps:.6g}" not in out and "cumulative_epsilon" not in out


def test_audit_declared_disjoint_stream_with_shared_units_exit_3(tmp_path, capsys, monkeypatch):
    """A writer contributes two consecutive digit images (unit id = row // 2): a class-incremental split by
    label puts a writer's two images in different tasks, so the declared-disjoint stream shares units."""
    import dpcl.data
    from dpcl.data import registry, streams  # patched where the stream builder binds it

    real = registry.dataset_labels

    def by_writer(name, **options):
        labels, _units, n_classes = real(name, **options)
        return labels, np.arange(labels.size, dtype=np.int64) // 2, n_classes

    monkeypatch.setattr(streams, "dataset_labels", by_writer)
    section = {"dataset": "digits", "tasks": [[0, 1], [2, 3], [4, 5], [6, 7], [8, 9]]}
    units = dpcl.data.task_train_unit_ids(section)
    shared = np.intersect1d(units[0], np.concatenate(units[1:]))
    assert shared.size > 0  # the premise: this stream really shares writers across tasks

    code, out, err = _run(capsys, "audit", _write(tmp_path, COSINE_TEXT), "--json")
    assert code == 3
    payload = json.loads(out)
    assert payload["across_tasks"] == "sequential"  # accounted without the disjointness it lacks
    named = [v for v in payload["violations"] if "declared to hold disjoint privacy units but share unit" in v]
    assert len(named) == 1
    unit = int(re.search(r"share unit '(\d+)'", named[0]).group(1))
    assert sum(unit in u for u in map(set, units)) >= 2  # the named unit really is in two tasks
    assert f"share unit '{unit}'" in err and err.count("\n") == 1

    monkeypatch.setattr(streams, "dataset_labels", real)
    code, out, err = _run(capsys, "audit", _write(tmp_path, COSINE_TEXT), "--json")
    assert code == 0, err


def test_audit_blurry_stream_of_multi_image_units_is_caught(tmp_path, capsys, monkeypatch):
    """Blurry hand-over is per example: with units of ten images some unit is split across tasks."""
    from dpcl.data import registry, streams  # patched where the stream builder binds it

    real = registry.dataset_labels
    monkeypatch.setattr(
        streams, "dataset_labels",
        lambda name, **o: (lambda y, u, k: (y, np.arange(y.size, dtype=np.int64) // 10, k))(*real(name, **o)),
    )
    text = COSINE_TEXT.replace('dataset = "digits"', 'dataset = "digits"\nkind = "blurry"\nblurry_fraction = 0.3', 1)
    text = text.replace("prior_labels = [[0, 1], [2, 3], [4, 5], [6, 7], [8, 9]]", "prior_labels = [0, 1, 2, 3, 4, 5, 6, 7, 8, 9]")
    assert 'kind = "blurry"' in text and "prior_labels = [0, 1," in text
    code, out, err = _run(capsys, "audit", _write(tmp_path, text), "--json")
    assert code == 3, err
    assert any("but share unit" in v for v in json.loads(out)["violations"])


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


def test_audit_of_a_dataset_dpcl_cannot_load_points_to_task_sizes(tmp_path, capsys):
    text = COSINE_TEXT.replace('dataset = "digits"', 'dataset = "hospital-notes"')
    code, out, err = _run(capsys, "audit", _write(tmp_path, text))
    assert code == 2 and out == "" and err.count("\n") == 1
    assert "unknown dataset 'hospital-notes'" in err and "give [stream] task_sizes" in err
    text = COSINE_TEXT.replace('dataset = "digits"', f'dataset = "image_folder:{tmp_path / "none"}"')
    code, out, err = _run(capsys, "audit", _write(tmp_path, text))
    assert code == 2 and "does not exist" in err and "task_sizes" not in err  # a known loader: fix the path


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
        ledger, release=COVERED, method="cosine", label_space="prior", assumptions=["Public encoder."], checkpoint=ckpt
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
    assert code == 3 and err.count("\n") == 1
    assert "failed check(s): epsilon" in err and "epsilon: stated 0.5, recomputed" in err  # says what differs


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


def test_verify_legacy_non_private_statement_exit_3(tmp_path, capsys):
    """The statement `[run] private = false` releases carried before certificate version 2 is not a certificate
    (no content hash, nothing to recompute): verify still refuses it, saying plainly that the checkpoint is NOT
    private (exit 3), not that the file is malformed (exit 2). Runs now write v2 certificates with private false."""
    from dpcl.guarantees.certificates import NON_PRIVATE_FORMAT

    ckpt = tmp_path / "checkpoints" / "task001.pt"
    ckpt.parent.mkdir()
    ckpt.write_bytes(b"weights trained without noise")
    statement = tmp_path / "certificates" / "task001.nonprivate-cert.json"
    statement.parent.mkdir()
    statement.write_text(json.dumps({  # as dpcl run wrote it before certificate version 2
        "format": NON_PRIVATE_FORMAT, "private": False, "epsilon": "inf",
        "statement": "This checkpoint was trained WITHOUT differential privacy ([run] private = false).",
        "release": {"task_index": 0, "method": "cosine"},
        "checkpoint": {"path": "../checkpoints/task001.pt", "sha256": "0" * 64},
        "dpcl_version": "0.1.0", "config": {"run": {"private": False}},
    }))
    for extra in ((), ("--json",)):
        code, out, err = _run(capsys, "verify", str(statement), *extra)
        assert code == 3 and (json.loads(out) == {"error": err.split("error: ", 1)[1].strip(), "exit_code": 3}
                              if extra else out == "")
        assert err.count("\n") == 1 and "NOT differentially private" in err and "not a certificate" in err
        assert "private = false" in err and "task 0" in err



def test_verify_missing_or_wrong_input_files_exit_2(certificate, tmp_path, capsys):
    """Nothing can be checked without the files: exit 2, one line naming the file, nothing on stdout."""
    path, ckpt = certificate
    (tmp_path / "empty").mkdir()
    for argv, needle in [
        ((str(tmp_path / "empty"),), "is a directory without certificates"),  # a run directory gives its certificates
        ((str(tmp_path / "none.json"),), "does not exist"),
        ((str(path), "--checkpoint", str(tmp_path / "none.ckpt")), "--checkpoint"),
        ((str(path), "--checkpoint", str(tmp_path)), "--checkpoint"),
    ]:
        code, out, err = _run(capsys, "verify", *argv, "--json")
        assert code == 2 and set(json.loads(out)) == {"error", "exit_code"}, argv  # only the refusal, no verdict
        assert err.count("\n") == 1 and needle in err and "Traceback" not in err
    ckpt.rename(tmp_path / "moved.ckpt")
    code, out, err = _run(capsys, "verify", str(path), "--json")
    assert code == 2 and json.loads(out)["exit_code"] == 2 and err.count("\n") == 1
    assert "task0.ckpt" in err and "does not exist" in err and "--checkpoint" in err
    code, out, err = _run(capsys, "verify", str(path), "--checkpoint", str(tmp_path / "moved.ckpt"), "--json")
    assert code == 0, err


def test_verify_several_certificates(certificate, tmp_path, capsys):
    """`dpcl verify RUN/certificates/*.json`: every file checked, one verdict each, exit 3 if any fails."""
    path, ckpt = certificate
    second = path.with_name("task1.cert.json")
    shutil.copy(path, second)
    code, out, err = _run(capsys, "verify", str(path), str(second))
    assert code == 0 and "2 certificates: all valid" in out and err == ""
    code, out, _ = _run(capsys, "verify", str(path), str(second), "--json")
    payload = json.loads(out)
    assert code == 0 and payload["valid"] is True and [c["valid"] for c in payload["certificates"]] == [True, True]
    data = json.loads(second.read_text())
    data["guarantee"]["epsilon"] = 0.5
    second.write_text(json.dumps(data))
    code, out, err = _run(capsys, "verify", str(path), str(second))
    assert code == 3 and "1 do not verify" in out
    assert err.count("\n") == 1 and str(second) in err and "failed check(s): epsilon" in err
    # inputs are checked before any verdict; --checkpoint belongs to one certificate
    code, out, err = _run(capsys, "verify", str(path), str(tmp_path / "none.json"))
    assert code == 2 and out == "" and "does not exist" in err
    code, out, err = _run(capsys, "verify", str(path), str(second), "--checkpoint", str(ckpt))
    assert code == 2 and out == "" and "--checkpoint" in err and err.count("\n") == 1
