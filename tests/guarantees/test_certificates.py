"""Certificates: content, relative checkpoint path, and verification failing on every tampering."""

from __future__ import annotations

import hashlib
import json
import shutil

import numpy as np
import pytest

from dpcl import __version__
from dpcl.accounting.events import GaussianEvent
from dpcl.errors import InvalidParameterError, MalformedCertificateError, VerificationError
from dpcl._io.atomic_io import sha256_file
from dpcl.guarantees.certificates import (
    certificate_from_ledger,
    read_certificate,
    verify_certificate,
    write_certificate,
)
from dpcl.guarantees.ledger import TaskLedger

from .certified_runs import COVERED, certify, edit_certificate
from .reference import gaussian_profile_epsilon

DELTA = 1e-5

pytestmark = pytest.mark.usefixtures("reference_accountant")


@pytest.fixture()
def certified(tmp_path, reference_accountant):
    """Two Gaussian releases (sigma 3, then 4) of a sequential stream, each with its certificate."""
    ledger = TaskLedger(delta=DELTA, across_tasks="sequential", metadata={"config": {"method": {"name": "cosine"}}})
    return [
        certify(tmp_path / "run", ledger, t, GaussianEvent(sigma=sigma, sensitivity=1.0), name=f"task{t}",
                checkpoint_bytes=np.random.default_rng(t).bytes(1000), method="cosine",
                assumptions=["Feature extractor pre-trained on public data."],
                label_filtering=[{"task": t, "kept": 10, "filtered": 2}])
        for t, sigma in enumerate([3.0, 4.0])
    ]


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


@pytest.mark.parametrize("reseal", [False, True])
def test_edited_epsilon_fails(certified, reseal):
    cert_path, _ = certified[1]
    edit_certificate(cert_path, lambda d: d["guarantee"].__setitem__("epsilon", d["guarantee"]["epsilon"] * 0.9),
                     reseal)
    report = verify_certificate(cert_path)
    assert not report.valid and [c.name for c in report.failed] == ["epsilon"] + ([] if reseal else ["integrity"])
    with pytest.raises(VerificationError, match="epsilon: stated"):
        report.raise_if_invalid()


def test_edited_event_fails(certified):
    cert_path, _ = certified[1]
    edit_certificate(cert_path, lambda d: d["events"][0]["events"][0].__setitem__("sigma", 30.0))
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
    edit_certificate(cert_path, lambda d: d["guarantee"].__setitem__("adjacency", "replace_one"))
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
    edit_certificate(cert_path, lambda d: d.pop("events"))
    with pytest.raises(MalformedCertificateError, match="events"):
        verify_certificate(cert_path)
    cert_path, _ = certified[1]
    edit_certificate(cert_path, lambda d: d["guarantee"].__setitem__("across_tasks", "sideways"))
    with pytest.raises(MalformedCertificateError, match="across_tasks"):
        verify_certificate(cert_path)
    edit_certificate(cert_path, lambda d: d["guarantee"].__setitem__("across_tasks", "sequential"))
    edit_certificate(cert_path, lambda d: d["events"][0]["events"][0].__setitem__("sigma", -1.0))
    with pytest.raises(MalformedCertificateError, match="sigma"):
        verify_certificate(cert_path)
    edit_certificate(cert_path, lambda d: d["events"][0]["events"][0].__setitem__("kind", "mystery"))
    with pytest.raises(MalformedCertificateError, match="mystery"):
        verify_certificate(cert_path)


def test_build_refuses_missing_assumptions_or_mismatched_hash(tmp_path):
    ledger = TaskLedger(delta=DELTA, across_tasks="parallel")
    ledger.charge(0, GaussianEvent(sigma=2.0))
    ckpt = tmp_path / "c.pt"
    ckpt.write_bytes(b"abc")
    ledger.release(0, checkpoint_sha256="0" * 64)
    with pytest.raises(InvalidParameterError, match="assumption"):
        certificate_from_ledger(ledger, release=COVERED, method="cosine", label_space="prior", assumptions=[" "])
    with pytest.raises(InvalidParameterError, match="hashes to"):
        certificate_from_ledger(ledger, release=COVERED, method="cosine", label_space="prior", assumptions=["x."], checkpoint=ckpt)


@pytest.mark.parametrize("reseal", [False, True])
def test_edited_group_epsilon_fails(certified, reseal):
    cert_path, _ = certified[1]
    edit_certificate(cert_path, lambda d: d["guarantee"]["groups"][0].__setitem__("epsilon", 0.1), reseal)
    report = verify_certificate(cert_path)
    assert [c.name for c in report.failed] == ["composition_groups"] + ([] if reseal else ["integrity"])
    assert "stated epsilon 0.1" in report.failed[0].detail


def test_certificate_records_the_hash_of_its_own_content(certified):
    cert_path, _ = certified[0]
    data = json.loads(cert_path.read_text())
    body = {k: v for k, v in data.items() if k != "sha256"}
    expected = hashlib.sha256(json.dumps(body, sort_keys=True, separators=(",", ":")).encode()).hexdigest()
    assert data["sha256"] == expected
    report = verify_certificate(cert_path)
    assert report.valid and [c for c in report.checks if c.name == "integrity"][0].passed


@pytest.mark.parametrize(
    "edit",
    [
        lambda d: d["assumptions"].pop(0),  # drop an assumption the guarantee relies on
        lambda d: d["assumptions"].append("Nothing else."),
        lambda d: d["config"]["method"].__setitem__("name", "naive"),
        lambda d: d.__setitem__("dpcl_version", "0.0.1"),
        lambda d: d["checkpoint"].__setitem__("sha256", "0" * 64),
        lambda d: d["label_space"].__setitem__("policy", "data"),
        lambda d: d["release"].__setitem__("task_index", 7),
        lambda d: d["extra"].__setitem__("note", "x"),
    ],
    ids=["drop_assumption", "add_assumption", "config", "version", "checkpoint_sha", "label_space", "release",
         "extra"],
)
def test_any_hand_edit_fails_integrity(certified, edit):
    cert_path, _ = certified[1]
    edit_certificate(cert_path, edit)
    report = verify_certificate(cert_path)
    assert not report.valid and "integrity" in [c.name for c in report.failed]
    assert "edited or damaged" in [c for c in report.failed if c.name == "integrity"][0].detail


def test_certificate_without_content_hash_fails_integrity(certified):
    cert_path, _ = certified[1]
    edit_certificate(cert_path, lambda d: d.pop("sha256"))
    report = verify_certificate(cert_path)
    assert [c.name for c in report.failed] == ["integrity"]
    assert "no SHA-256" in report.failed[0].detail


def test_edited_accountant_name_fails_even_when_resealed(certified):
    """The stated accountant must be the one that produced the recomputed epsilon; stating a looser-tolerance
    accountant must not widen the epsilon tolerance either."""
    cert_path, _ = certified[1]
    edit_certificate(cert_path, lambda d: d["guarantee"].__setitem__("accountant", "pld"), reseal=True)
    report = verify_certificate(cert_path)
    assert [c.name for c in report.failed] == ["accountant"]
    assert report.relative_tolerance == 1e-9  # the reference accountant ('exact'), not the stated 'pld'
    cert_path, _ = certified[0]
    edit_certificate(cert_path, lambda d: d["guarantee"]["groups"][0].__setitem__("accountant", "rdp"), reseal=True)
    report = verify_certificate(cert_path)
    assert [c.name for c in report.failed] == ["composition_groups"]
    assert "stated accountant 'rdp'" in report.failed[0].detail


def test_edited_group_charges_fail_when_resealed(certified):
    cert_path, _ = certified[1]
    edit_certificate(cert_path, lambda d: d["guarantee"]["groups"][0].__setitem__("charges", [1]), reseal=True)
    report = verify_certificate(cert_path)
    assert [c.name for c in report.failed] == ["composition_groups"]
    assert "stated charges [1]" in report.failed[0].detail


def _parallel_certificate(tmp_path, config):
    ledger = TaskLedger(delta=DELTA, across_tasks="parallel")
    for t in range(2):
        ledger.charge(t, GaussianEvent(sigma=3.0 + t))
    ledger.release(1)
    cert = certificate_from_ledger(ledger, release=COVERED, method="cosine", label_space="prior", assumptions=["x."], config=config)
    return write_certificate(tmp_path / "c.cert.json", cert)


def test_guarantee_must_agree_with_the_recorded_config(tmp_path):
    consistent = {"privacy": {"delta": DELTA, "across_tasks": "auto"}, "stream": {"disjoint_units": True}}
    assert verify_certificate(_parallel_certificate(tmp_path, consistent)).valid
    cases = {
        "disjoint_units = false": {"privacy": {"delta": DELTA}, "stream": {"disjoint_units": False}},
        "across_tasks = 'sequential'": {"privacy": {"delta": DELTA, "across_tasks": "sequential"},
                                        "stream": {"disjoint_units": True}},
        "delta = 0.001": {"privacy": {"delta": 1e-3}, "stream": {"disjoint_units": True}},
        "accountant = 'pld'": {"privacy": {"delta": DELTA, "accountant": "pld"}, "stream": {"disjoint_units": True}},
    }
    for needle, config in cases.items():
        report = verify_certificate(_parallel_certificate(tmp_path, config))
        assert [c.name for c in report.failed] == ["config"], needle
        assert needle in report.failed[0].detail


def test_certificate_of_an_earlier_release_states_that_release_filter_state(tmp_path):
    ledger = TaskLedger(delta=DELTA, across_tasks="sequential", total_epsilon=5.0)
    for t, sigma in enumerate([3.0, 4.0, 5.0]):
        ledger.charge(t, GaussianEvent(sigma=sigma))
        ledger.release(t)
    first = certificate_from_ledger(ledger, release=COVERED, method="cosine", label_space="prior", assumptions=["x."], release_index=0)
    last = certificate_from_ledger(ledger, release=COVERED, method="cosine", label_space="prior", assumptions=["x."])
    # GDP filter: spent mu is sqrt(sum 1/sigma^2) of the admitted charges (closed form)
    assert first["filter"]["stream"]["spent"]["mu"] == pytest.approx(1 / 3.0, rel=1e-12)
    assert last["filter"]["stream"]["spent"]["mu"] == pytest.approx(np.sqrt(1 / 9 + 1 / 16 + 1 / 25), rel=1e-12)
    assert len(first["events"]) == 1 and first["guarantee"]["epsilon"] < last["guarantee"]["epsilon"]
