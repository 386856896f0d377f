"""Certificate format v2: the headline is the checkpoint (private or not, and why), narrower statements are
scoped; version-1 certificates still verify."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from dpcl.accounting.events import GaussianEvent
from dpcl.errors import InvalidParameterError, MalformedCertificateError, UndeclaredReleaseError
from dpcl.guarantees.certificates import (
    CERTIFICATE_VERSION,
    ScopedLedger,
    certificate_from_ledger,
    non_private_certificate,
    read_certificate,
    verify_certificate,
    write_certificate,
)
from dpcl.guarantees.ledger import TaskLedger
from dpcl.guarantees.method_schema import ReleaseCoverage

from .certified_runs import edit_certificate
from .reference import gaussian_profile_epsilon

DELTA = 1e-5
V1_FIXTURE = Path(__file__).parent / "data" / "v1"
BASIS = "The weights are a post-processing of the noisy per-class sums."
REASONS = ("The head is trained on the clean private labels.", "The noise scale is computed from the private data.")
SCOPE = "The release of the noisy input features only; it does not cover the weights trained on them."


pytestmark = pytest.mark.usefixtures("reference_accountant")


def _ledgers(n_tasks=2, *, across="sequential"):
    headline = TaskLedger(delta=DELTA, across_tasks=across)
    scoped = TaskLedger(delta=DELTA, across_tasks=across, adjacency="replace_one", unit="token")
    for t in range(n_tasks):
        headline.charge(t, GaussianEvent(sigma=3.0 + t))
        scoped.charge(t, GaussianEvent(sigma=2.0, sensitivity=2.0, adjacency="replace_one", unit="token"))
        headline.release(t)
        scoped.release(t)
    return headline, scoped


def test_version_1_certificate_written_before_v2_still_verifies(tmp_path):
    """tests/guarantees/data/v1 was written by the version-1 code path (dpcl before format v2)."""
    copy = tmp_path / "v1"
    shutil.copytree(V1_FIXTURE, copy)
    data = read_certificate(copy / "certificate.json")
    assert data["version"] == 1 and "private" not in data["guarantee"] and "scoped_guarantees" not in data
    report = verify_certificate(copy / "certificate.json").raise_if_invalid()
    assert report.version == 1 and report.private is True and report.scoped == ()
    # closed form: two Gaussians composed sequentially are one Gaussian of mu = sqrt(1/16 + 1/25)
    assert report.recomputed_epsilon == pytest.approx(gaussian_profile_epsilon(np.sqrt(1 / 16 + 1 / 25), DELTA), rel=1e-9)
    assert report.to_dict()["private"] is True
    # a hand edit of a v1 certificate still fails its integrity check
    edit_certificate(copy / "certificate.json", lambda d: d["assumptions"].append("More."), reseal=False)
    assert [c.name for c in verify_certificate(copy / "certificate.json").failed] == ["integrity"]


def test_covered_release_gives_a_private_headline_with_its_basis(tmp_path):
    headline, scoped = _ledgers()
    cert = certificate_from_ledger(
        headline, method="cosine", label_space="prior", assumptions=["x."],
        release=ReleaseCoverage.post_processing(BASIS), scoped={"inputs": (SCOPE, scoped)},
    )
    assert cert["version"] == CERTIFICATE_VERSION == 2
    g = cert["guarantee"]
    assert g["private"] is True and g["basis"] == BASIS and "reasons" not in g
    assert g["epsilon"] == pytest.approx(gaussian_profile_epsilon(np.sqrt(1 / 9 + 1 / 16), DELTA), rel=1e-12)
    (entry,) = cert["scoped_guarantees"]
    assert entry["name"] == "inputs" and entry["scope"] == SCOPE and entry["unit"] == "token"
    # two Gaussians of mu = 2/2 = 1 each, sequential: mu = sqrt(2)
    assert entry["epsilon"] == pytest.approx(gaussian_profile_epsilon(np.sqrt(2.0), DELTA), rel=1e-12)
    assert len(entry["events"]) == 2 and entry["adjacency"] == "replace_one"
    path = write_certificate(tmp_path / "c.cert.json", cert)
    report = verify_certificate(path).raise_if_invalid()
    assert report.private and [s.name for s in report.scoped] == ["inputs"]
    assert report.scoped[0].recomputed_epsilon == pytest.approx(entry["epsilon"], rel=1e-12)
    assert {"scoped[inputs].epsilon", "scoped[inputs].relation", "epsilon"} <= {c.name for c in report.checks}


def test_undeclared_release_is_never_certified():
    headline, _ = _ledgers(1)
    with pytest.raises(UndeclaredReleaseError, match="release=None"):
        certificate_from_ledger(headline, method="cosine", label_space="prior", assumptions=["x."], release=None)
    with pytest.raises(InvalidParameterError, match="ReleaseCoverage"):
        certificate_from_ledger(headline, method="cosine", label_space="prior", assumptions=["x."], release="yes")


def test_not_covered_release_gives_private_false_with_reasons_and_verifies(tmp_path):
    headline, scoped = _ledgers()
    cert = certificate_from_ledger(
        headline, method="pecl", label_space="prior", assumptions=["x."],
        release=ReleaseCoverage.not_covered(*REASONS), scoped={"inputs": ScopedLedger(SCOPE, scoped)},
    )
    g = cert["guarantee"]
    assert g["private"] is False and g["epsilon"] is None and g["delta"] is None and g["reasons"] == list(REASONS)
    assert cert["events"] == [] and g["groups"] == []
    path = write_certificate(tmp_path / "c.cert.json", cert)
    report = verify_certificate(path).raise_if_invalid()
    assert report.private is False and report.stated_epsilon is None and report.reasons == REASONS
    payload = report.to_dict()
    assert payload["private"] is False and payload["valid"] is True
    assert payload["scoped_guarantees"][0]["name"] == "inputs"
    # an edited scoped event no longer verifies, even when the content hash is recomputed
    edit_certificate(path, lambda d: d["scoped_guarantees"][0]["events"][0]["events"][0].__setitem__("sigma", 20.0),
                     reseal=True)
    assert "scoped[inputs].epsilon" in [c.name for c in verify_certificate(path).failed]


def test_non_private_certificate_states_its_reasons_and_scoped_statements(tmp_path):
    _, scoped = _ledgers()
    ckpt = tmp_path / "task002.pt"
    ckpt.write_bytes(b"weights")
    cert = non_private_certificate(
        release_task=1, method="naive", label_space="prior", assumptions=["x."], reasons=["Trained without noise."],
        checkpoint=ckpt,
    )
    assert cert["scoped_guarantees"] == [] and cert["guarantee"]["reasons"] == ["Trained without noise."]
    path = write_certificate(tmp_path / "c.cert.json", cert)
    assert verify_certificate(path).raise_if_invalid().private is False
    with pytest.raises(InvalidParameterError, match="reason"):
        non_private_certificate(release_task=1, method="naive", label_space="prior", assumptions=["x."], reasons=[])
    with pytest.raises(InvalidParameterError, match="no release of task 5"):
        non_private_certificate(release_task=5, method="naive", label_space="prior", assumptions=["x."],
                                reasons=["r."], scoped={"inputs": (SCOPE, scoped)})


@pytest.mark.parametrize(
    "edit, message",
    [
        (lambda d: d["guarantee"].__setitem__("epsilon", 1.0), "epsilon null"),
        (lambda d: d["guarantee"].__setitem__("reasons", []), "reasons"),
        (lambda d: d["guarantee"].__setitem__("private", "no"), "true or false"),
        (lambda d: d.__setitem__("version", 4), "version 4"),
        (lambda d: d.pop("scoped_guarantees"), "scoped_guarantees"),
        (lambda d: d["scoped_guarantees"][0].__setitem__("scope", ""), "scope sentence"),
        (lambda d: d["scoped_guarantees"].append(dict(d["scoped_guarantees"][0])), "distinct"),
    ],
)
def test_malformed_v2_certificates_are_refused(tmp_path, edit, message):
    headline, scoped = _ledgers()
    cert = certificate_from_ledger(
        headline, method="pecl", label_space="prior", assumptions=["x."],
        release=ReleaseCoverage.not_covered(*REASONS), scoped={"inputs": (SCOPE, scoped)},
    )
    path = write_certificate(tmp_path / "c.cert.json", cert)
    edit_certificate(path, edit, reseal=True)
    with pytest.raises(MalformedCertificateError, match=message):
        verify_certificate(path)


def test_private_headline_needs_its_basis_and_must_agree_with_run_private(tmp_path):
    headline, _ = _ledgers()
    cert = certificate_from_ledger(headline, method="cosine", label_space="prior", assumptions=["x."],
                                   release=ReleaseCoverage.post_processing(BASIS), config={"run": {"private": False}})
    path = write_certificate(tmp_path / "c.cert.json", cert)
    report = verify_certificate(path)
    assert [c.name for c in report.failed] == ["config"] and "[run] private = false" in report.failed[0].detail
    edit_certificate(path, lambda d: d["guarantee"].pop("basis"), reseal=True)
    with pytest.raises(MalformedCertificateError, match="basis"):
        verify_certificate(path)


def test_cli_verify_not_private_exits_0_and_says_so(tmp_path, capsys):
    from dpcl.cli import main

    headline, scoped = _ledgers()
    cert = certificate_from_ledger(
        headline, method="pecl", label_space="prior", assumptions=["x."],
        release=ReleaseCoverage.not_covered("Trained with [run] private = false on clean targets."),
        scoped={"inputs": (SCOPE, scoped)},
    )
    path = write_certificate(tmp_path / "c.cert.json", cert)
    assert main(["verify", str(path), "--details"]) == 0
    out = capsys.readouterr().out
    assert "NOT PRIVATE" in out and "[run] private = false" in out and "scoped inputs" in out
    assert "check scoped[inputs].epsilon" in out  # rich markup escaped in keys too
    assert main(["verify", str(path), "--json"]) == 0
    payload = json.loads(capsys.readouterr().out)
    assert payload["valid"] is True and payload["private"] is False
    assert payload["scoped_guarantees"][0]["recomputed_epsilon"] > 0
