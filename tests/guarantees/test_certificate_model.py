"""The typed certificate (dpcl.guarantees.certificate_model): certificates written before it still read, verify
and re-serialise to the same bytes; malformed fields are refused by name; a new field is one attribute with its
verify rule."""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass, replace
from pathlib import Path

import pytest

from dpcl.accounting.events import GaussianEvent
from dpcl.errors import InvalidParameterError, MalformedCertificateError
from dpcl.guarantees.certificate_model import (
    CERTIFICATE_VERSION,
    MIGRATIONS,
    READABLE_VERSIONS,
    Certificate,
    json_field,
    number,
)
from dpcl.guarantees.certificates import (
    VerificationCheck,
    content_sha256,
    load_certificate,
    read_certificate,
    verify_certificate,
)
from dpcl.guarantees.ledger import TaskLedger
from dpcl.guarantees.signing import signed_bytes

from .certified_runs import certify, edit_certificate

DATA = Path(__file__).parent / "data"
BEFORE = DATA / "before_model"
#: Every certificate file written before the model: through the Python API, and by reduced runs of the bundled
#: configs (tests/guarantees/data/before_model/README.md), and the version-1 fixture.
WRITTEN_BEFORE = sorted(BEFORE.rglob("*.cert.json")) + [DATA / "v1" / "certificate.json"]


@pytest.fixture
def before(tmp_path):
    """A copy of the certificates written before the model, with their checkpoints."""
    shutil.copytree(BEFORE, tmp_path / "before")
    return tmp_path / "before"


def _layout(value):
    """``value`` with the order of every object's keys made visible (a dict compares equal in any order)."""
    if isinstance(value, dict):
        return [(k, _layout(v)) for k, v in value.items()]
    if isinstance(value, list):
        return [_layout(v) for v in value]
    return value


@pytest.mark.parametrize("path", WRITTEN_BEFORE, ids=lambda p: str(p.relative_to(DATA)))
def test_certificates_written_before_the_model_read_and_write_back_unchanged(path):
    data = json.loads(path.read_text())
    cert = Certificate.from_json(data)
    assert cert.version == data["version"] and cert.source is data
    if cert.version >= CERTIFICATE_VERSION:  # the current layout: to_json is the file, keys in the same order
        assert _layout(cert.to_json()) == _layout(data)
        assert content_sha256(cert.to_json()) == data["sha256"] == content_sha256(data)
        assert signed_bytes(cert.to_json()) == signed_bytes(data)
    # whatever the version, the model reads its own output back as the same certificate
    assert Certificate.from_json(cert.to_json()) == cert


@pytest.mark.parametrize("name", ["private_v2", "nonprivate_v2", "repeat_v3"])
def test_certificates_written_before_the_model_still_verify(before, name):
    report = verify_certificate(before / "certificates" / f"{name}.cert.json").raise_if_invalid()
    assert report.private is (name != "nonprivate_v2")
    assert report.version == (3 if name == "repeat_v3" else 2)
    if report.private:  # recomputed from the events, within the accountant's tolerance of the stated epsilon
        assert report.recomputed_epsilon == pytest.approx(report.stated_epsilon, rel=1e-6)
    assert [s.name for s in report.scoped] == ([] if name == "repeat_v3" else ["inputs"])


def test_run_certificates_written_before_the_model_still_verify(before):
    for path in sorted((before / "runs" / "cosine" / "certificates").glob("*.cert.json")):
        report = verify_certificate(path).raise_if_invalid()
        assert report.private and report.recomputed_epsilon == pytest.approx(report.stated_epsilon, rel=1e-9)


def test_signed_certificate_written_before_the_model_still_verifies_its_signature(before):
    report = verify_certificate(before / "certificates" / "signed_v2.cert.json", public_key=before / "issuer.pub")
    assert report.valid and "signature" in [c.name for c in report.checks]
    # the same signature no longer matches once a field is edited, even with the content hash recomputed
    edit_certificate(before / "certificates" / "signed_v2.cert.json",
                     lambda d: d["assumptions"].append("Edited."), reseal=True)
    report = verify_certificate(before / "certificates" / "signed_v2.cert.json", public_key=before / "issuer.pub")
    assert [c.name for c in report.failed] == ["signature"]


def test_version_1_is_read_through_the_migration_table():
    path = DATA / "v1" / "certificate.json"
    data = json.loads(path.read_text())
    assert 1 in MIGRATIONS and set(READABLE_VERSIONS) - set(MIGRATIONS) == {2, 3}
    cert = load_certificate(path)
    assert cert.version == 1 and cert.guarantee.private is True and cert.guarantee.basis is None
    assert cert.scoped_guarantees == () and "private" not in data["guarantee"]
    # the file itself is what its hash covers, not the migrated layout
    assert cert.content() is cert.source and read_certificate(path) == data


@pytest.mark.parametrize(
    "edit, field",
    [
        (lambda d: d["guarantee"].__setitem__("delta", 2.0), "guarantee.delta"),
        (lambda d: d["guarantee"].__setitem__("adjacency", 3), "guarantee.adjacency"),
        (lambda d: d["guarantee"]["groups"][0].__setitem__("epsilon", "1.0"), r"guarantee.groups\[0\].epsilon"),
        (lambda d: d["guarantee"]["groups"][0].__setitem__("tasks", "0-1"), r"guarantee.groups\[0\].tasks"),
        (lambda d: d["release"].__setitem__("task_index", "1"), "release.task_index"),
        (lambda d: d["label_space"].__setitem__("policy", None), "label_space.policy"),
        (lambda d: d["label_space"].pop("filtered"), "label_space lacks required field.*filtered"),
        (lambda d: d["scoped_guarantees"][0].__setitem__("unit", 5), r"scoped_guarantees\[0\].unit"),
        (lambda d: d["scoped_guarantees"][0]["events"][0].__setitem__("repeat", 2), r"scoped_guarantees\[0\].events"),
        (lambda d: d.__setitem__("extra", []), "extra must be an object"),
        (lambda d: d.__setitem__("checkpoint", {"sha256": "0"}), "checkpoint lacks required field.*path"),
    ],
)
def test_a_malformed_field_is_refused_by_name(before, edit, field):
    path = before / "certificates" / "private_v2.cert.json"
    edit_certificate(path, edit, reseal=True)
    with pytest.raises(MalformedCertificateError, match=field):
        verify_certificate(path)


def test_an_unknown_field_is_kept_in_the_content_the_hash_covers(before):
    path = before / "certificates" / "private_v2.cert.json"
    edit_certificate(path, lambda d: d.__setitem__("note", "added by hand"), reseal=True)
    assert verify_certificate(path).valid
    edit_certificate(path, lambda d: d.__setitem__("note", "changed by hand"), reseal=False)
    assert [c.name for c in verify_certificate(path).failed] == ["integrity"]


# -- a new field: one attribute with its verify rule --------------------------------------------------------------
def _energy_rule(owner, state):
    """The toy field's rule: energy, when stated, is not negative."""
    if owner.energy_joules is not None:
        yield VerificationCheck("energy", owner.energy_joules >= 0, f"states {owner.energy_joules!r} J")


@dataclass(frozen=True, kw_only=True)
class EnergyCertificate(Certificate):
    energy_joules: float | None = json_field(number, optional=True, verify=_energy_rule)


def test_a_new_field_is_one_attribute_and_one_verify_rule(before, tmp_path):
    path = before / "certificates" / "private_v2.cert.json"
    older = load_certificate(path, EnergyCertificate)  # written before the field: it reads, without it
    assert older.energy_joules is None and "energy" not in [c.name for c in verify_certificate(path).checks]
    assert "energy" not in [c.name for c in verify_certificate(path, model=EnergyCertificate).checks]

    # the builders set it (fields=) like any other attribute; write_certificate writes it, verify checks it
    ledger = TaskLedger(delta=1e-5, across_tasks="sequential")
    path, _ = certify(tmp_path, ledger, 0, GaussianEvent(sigma=2.0), name="task001", checkpoint_bytes=b"w",
                      method="toy", assumptions=["x."], fields={"energy_joules": 12.5}, model=EnergyCertificate)
    written = json.loads(path.read_text())
    assert list(written)[-2:] == ["energy_joules", "sha256"] and written["energy_joules"] == 12.5
    report = verify_certificate(path, model=EnergyCertificate).raise_if_invalid()
    assert [c.name for c in report.checks][-3:] == ["energy", "integrity", "signature"]
    assert verify_certificate(path).valid  # a dpcl without the field still verifies the rest
    assert load_certificate(path, EnergyCertificate) == replace(load_certificate(path, EnergyCertificate),
                                                                energy_joules=12.5)

    edit_certificate(path, lambda d: d.__setitem__("energy_joules", -1.0), reseal=True)
    assert [c.name for c in verify_certificate(path, model=EnergyCertificate).failed] == ["energy"]
    edit_certificate(path, lambda d: d.__setitem__("energy_joules", "a lot"), reseal=True)
    with pytest.raises(MalformedCertificateError, match="energy_joules must be a finite number"):
        verify_certificate(path, model=EnergyCertificate)
    with pytest.raises(InvalidParameterError, match="fields must name other attributes"):
        certify(tmp_path, ledger, 1, GaussianEvent(sigma=2.0), name="task002", checkpoint_bytes=b"v",
                method="toy", assumptions=["x."], fields={"energy_joules": 1.0})  # the base model has no such field
