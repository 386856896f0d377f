"""`dpcl verify` as a reviewer reads it: run directories, one line per certificate, signatures said plainly."""

from __future__ import annotations

import json

import pytest

from dpcl import Certifier, ReleaseCoverage
from dpcl.accounting.events import GaussianEvent
from dpcl.cli import main
from dpcl.guarantees.signing import generate_key_pair, sign_certificate

COVERED = ReleaseCoverage.post_processing("the file is the noisy release itself")


@pytest.fixture()
def five_task_run(tmp_path):
    run = tmp_path / "run"
    certifier = Certifier(run, delta=1e-5, label_space="prior", prior_labels=[[t] for t in range(5)],
                          disjoint_units=True)
    for t in range(5):
        certifier.charge(t, GaussianEvent(sigma=3.0, sensitivity=1.0))
        certifier.release(t, f"release {t}".encode(), coverage=COVERED, assumptions=["Rows have norm at most 1."])
    assert (run / "ledger.json").is_file()
    return run


def _verify(capsys, *argv):
    code = main(["verify", *map(str, argv)])
    out, err = capsys.readouterr()
    return code, out, err


def test_a_run_directory_gets_one_line_per_certificate(five_task_run, capsys):
    code, out, err = _verify(capsys, five_task_run)
    lines = out.splitlines()
    assert code == 0 and err == "" and len(lines) <= 15, out
    header, rows = lines[0].split(), lines[1:6]
    assert header[:7] == ["task", "epsilon", "delta", "unit", "private", "signature", "verdict"]
    for t, row in enumerate(rows, start=1):
        assert row.split()[:5] == [str(t), "1.271", "1e-05", "example", "yes"] and "not signed" in row
        assert row.split()[-2:] == ["valid", str(five_task_run / "certificates" / f"task{t:03d}.cert.json")]
    assert "5 certificates: all valid" in out and "pass" not in out and "ledger" not in out
    # the certificates folder itself works too, and --details adds every check
    code, details, _ = _verify(capsys, five_task_run / "certificates", "--details")
    assert code == 0 and details.startswith(out.splitlines()[0]) and details.count("check epsilon") == 5
    assert "check signature" in details and "not signed" in details and "pass: unsigned" not in details
    code, as_json, _ = _verify(capsys, five_task_run, "--json")
    payload = json.loads(as_json)
    assert code == 0 and len(payload["certificates"]) == 5
    assert all(c["signature"] == "not signed" and len(c["checks"]) >= 8 for c in payload["certificates"])


def test_signatures_not_signed_not_checked_and_required(five_task_run, tmp_path, capsys):
    keys = generate_key_pair(tmp_path / "keys" / "key")
    first = five_task_run / "certificates" / "task001.cert.json"
    sign_certificate(first, keys.private_key)
    code, out, err = _verify(capsys, first)
    assert code == 0 and "signed, NOT CHECKED" in out
    assert "warning" in err and "not checked" in err and "--public-key" in err and err.count("\n") == 1
    code, out, _ = _verify(capsys, first, "--public-key", keys.public_key, "--require-signature")
    assert code == 0 and "verified" in out
    code, out, err = _verify(capsys, five_task_run, "--require-signature")
    assert code == 3 and "NOT SIGNED" in out and "4 are not signed" in out
    assert "--require-signature: 4 certificate(s) not signed" in err
    code, out, _ = _verify(capsys, five_task_run, "--require-signature", "--json")
    assert code == 3 and [c["signature"] for c in json.loads(out)["certificates"]] == (
        ["signed, NOT CHECKED"] + ["not signed"] * 4)


def test_a_directory_without_certificates_and_the_ledger_are_refused(five_task_run, tmp_path, capsys):
    (tmp_path / "empty").mkdir()
    code, out, err = _verify(capsys, tmp_path / "empty")
    assert code == 2 and out == "" and "without certificates" in err and err.count("\n") == 1
    code, out, err = _verify(capsys, five_task_run / "ledger.json")
    assert code == 2 and out == "" and "not a certificate; give the run directory" in err
