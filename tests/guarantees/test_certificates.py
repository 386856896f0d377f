"""Certificates: content, relative checkpoint path, and verification failing on every tampering."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest

from dpcl import __version__
from dpcl.accounting.events import GaussianEvent
from dpcl.errors import InvalidParameterError, MalformedCertificateError, VerificationError
from dpcl.guarantees import ledger as ledger_module
from dpcl.guarantees.atomic_io import sha256_file
from dpcl.guarantees.certificates import (
    certificate_from_ledger,
    read_certificate,
    verify_certificate,
    write_certificate,
)
from dpcl.guarantees.ledger import TaskLedger

from .reference import gaussian_profile_epsilon, reference_compute

DELTA = 1e-5


@pytest.fixture(autouse=True)
def reference_accountant(monkeypatch):
    monkeypatch.setattr(ledger_module, "_compute", reference_compute)


@pytest.fixture()
def certified(tmp_path):
    ckpt_dir = tmp_path / "run" / "checkpoints"
    ckpt_dir.mkdir(parents=True)
    ledger = TaskLedger(delta=DELTA, across_tasks="sequential", metadata={"config": {"method": {"name": "cosine"}}})
    paths = []
    for t, sigma in enumerate([3.0, 4.0]):
        ckpt = ckpt_dir / f"task{t}.pt"
        ckpt.write_bytes(np.random.default_rng(t).bytes(1000))
        ledger.charge(t, GaussianEvent(sigma=sigma, sensitivity=1.0), label=f"task {t}")
        ledger.release(t, checkpoint_sha256=sha256_file(ckpt))
        cert = certificate_from_ledger(
            ledger,
            method="cosine",
            label_space="prior_const",
            assumptions=["Feature extractor pre-trained on public data."],
            checkpoint=ckpt,
            label_filtering=[{"task": t, "kept": 10, "filtered": 2}],
        )
        cert_path = tmp_path / "run" / "certificates" / f"task{t}.cert.json"
        write_certificate(cert_path, cert)
        paths.append((cert_path, ckpt))
    return paths


def test_certificate_content(certified):
    cert_path, ckpt = certified[1]
    cert = read_certificate(cert_path)
    g = cert["guarantee"]
    expected = gaussian_profile_epsilon(np.sqrt(1 / 9 + 1 / 16), DELTA)
    assert g["epsilon"] == pytest.approx(expected, rel=1e-12)
    assert g["delta"] == DELTA and g["adjacency"] == "add_remove" and g["unit"] == "example"
    assert g["across_tasks"] == "sequential" and "Thm 4.5" in g["composition"]
    assert cert["label_space"]["policy"] == "prior_const"
    assert cert["label_space"]["filtered"] == [{"task": 1, "kept": 10, "filtered": 2}]
    assert cert["assumptions"] == ["Feature extractor pre-trained on public data."]
    assert len(cert["events"]) == 2 and cert["events"][1]["events"][0]["sigma"] == 4.0
    assert cert["checkpoint"] == {"path": "../checkpoints/task1.pt", "sha256": sha256_file(ckpt)}
    assert cert["dpcl_version"] == __version__
    assert cert["config"] == {"method": {"name": "cosine"}}
    assert cert["release"] == {"task_index": 1, "method": "cosine"}


def test_valid_certificate_verifies_and_survives_moving_the_run(certified, tmp_path):
    for cert_path, _ in certified:
        report = verify_certificate(cert_path).raise_if_invalid()
        assert report.valid and {c.name for c in report.checks} >= {"epsilon", "checkpoint", "relation"}
    moved = tmp_path / "moved"
    shutil.copytree(tmp_path / "run", moved)
    assert verify_certificate(moved / "certificates" / "task1.cert.json").valid


def _edit(path, fn):
    data = json.loads(path.read_text())
    fn(data)
    path.write_text(json.dumps(data))


def test_edited_epsilon_fails(certified):
    cert_path, _ = certified[1]
    _edit(cert_path, lambda d: d["guarantee"].__setitem__("epsilon", d["guarantee"]["epsilon"] * 0.9))
    report = verify_certificate(cert_path)
    assert not report.valid and [c.name for c in report.failed] == ["epsilon"]
    with pytest.raises(VerificationError, match="epsilon: stated"):
        report.raise_if_invalid()


def test_edited_event_fails(certified):
    cert_path, _ = certified[1]
    _edit(cert_path, lambda d: d["events"][0]["events"][0].__setitem__("sigma", 30.0))
    report = verify_certificate(cert_path)
    assert "epsilon" in [c.name for c in report.failed]


def test_swapped_checkpoint_fails(certified):
    (cert0, ckpt0), (cert1, ckpt1) = certified
    report = verify_certificate(cert1, checkpoint=ckpt0)
    assert [c.name for c in report.failed] == ["checkpoint"]
    ckpt1.write_bytes(ckpt0.read_bytes())
    assert [c.name for c in verify_certificate(cert1).failed] == ["checkpoint"]
    ckpt1.unlink()
    assert "not found" in verify_certificate(cert1).failed[0].detail


def test_edited_relation_fails(certified):
    cert_path, _ = certified[0]
    _edit(cert_path, lambda d: d["guarantee"].__setitem__("adjacency", "replace_one"))
    assert "relation" in [c.name for c in verify_certificate(cert_path).failed]


def test_malformed_certificates(tmp_path, certified):
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(MalformedCertificateError, match="not valid JSON"):
        verify_certificate(bad)
    bad.write_text(json.dumps({"format": "something"}))
    with pytest.raises(MalformedCertificateError, match="not a dpcl certificate"):
        verify_certificate(bad)
    with pytest.raises(MalformedCertificateError, match="does not exist"):
        verify_certificate(tmp_path / "missing.json")
    cert_path, _ = certified[0]
    _edit(cert_path, lambda d: d.pop("events"))
    with pytest.raises(MalformedCertificateError, match="events"):
        verify_certificate(cert_path)
    cert_path, _ = certified[1]
    _edit(cert_path, lambda d: d["guarantee"].__setitem__("across_tasks", "sideways"))
    with pytest.raises(MalformedCertificateError, match="across_tasks"):
        verify_certificate(cert_path)
    _edit(cert_path, lambda d: d["guarantee"].__setitem__("across_tasks", "sequential"))
    _edit(cert_path, lambda d: d["events"][0]["events"][0].__setitem__("sigma", -1.0))
    with pytest.raises(MalformedCertificateError, match="sigma"):
        verify_certificate(cert_path)
    _edit(cert_path, lambda d: d["events"][0]["events"][0].__setitem__("kind", "mystery"))
    with pytest.raises(MalformedCertificateError, match="mystery"):
        verify_certificate(cert_path)


def test_build_refuses_missing_assumptions_or_mismatched_hash(tmp_path):
    ledger = TaskLedger(delta=DELTA, across_tasks="parallel")
    ledger.charge(0, GaussianEvent(sigma=2.0))
    ckpt = tmp_path / "c.pt"
    ckpt.write_bytes(b"abc")
    ledger.release(0, checkpoint_sha256="0" * 64)
    with pytest.raises(InvalidParameterError, match="assumption"):
        certificate_from_ledger(ledger, method="cosine", label_space="prior", assumptions=[" "])
    with pytest.raises(InvalidParameterError, match="hashes to"):
        certificate_from_ledger(ledger, method="cosine", label_space="prior", assumptions=["x."], checkpoint=ckpt)


def test_edited_group_epsilon_fails(certified):
    cert_path, _ = certified[1]
    _edit(cert_path, lambda d: d["guarantee"]["groups"][0].__setitem__("epsilon", 0.1))
    report = verify_certificate(cert_path)
    assert [c.name for c in report.failed] == ["composition_groups"]
    assert "stated epsilon 0.1" in report.failed[0].detail
