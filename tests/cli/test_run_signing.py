"""`dpcl run --sign KEY`: every certificate of a run is signed and verifies with the public key."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")

from dpcl.cli import main  # noqa: E402
from dpcl.guarantees.signing import generate_key_pair  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "runner"))
from run_helpers import write_config  # noqa: E402

class Done:
    def __init__(self, returncode: int, stdout: str, stderr: str):
        self.returncode, self.stdout, self.stderr = returncode, stdout, stderr


@pytest.fixture()
def dpcl(capsys):
    def run(*args: str) -> Done:
        code = main(list(args))
        out, err = capsys.readouterr()
        return Done(code, out, err)

    return run


def test_run_signs_every_certificate(tmp_path, dpcl):
    keys = generate_key_pair(tmp_path / "issuer")
    other = generate_key_pair(tmp_path / "other")
    config = write_config(tmp_path, "cosine", tasks="[[0, 1], [2, 3]]")
    done = dpcl("run", str(config), "--out", str(tmp_path / "out"), "--json", "--quiet", "--sign", str(keys.private_key))
    assert done.returncode == 0, done.stderr
    certificates = [str(tmp_path / "out" / r["certificate"]) for r in json.loads(done.stdout)["releases"]]
    assert len(certificates) == 2
    verified = dpcl("verify", *certificates, "--public-key", str(keys.public_key), "--json")
    assert verified.returncode == 0, verified.stderr
    for report in json.loads(verified.stdout)["certificates"]:
        check = [c for c in report["checks"] if c["name"] == "signature"][0]
        assert check["passed"] and keys.fingerprint in check["detail"]
    wrong = dpcl("verify", *certificates, "--public-key", str(other.public_key))
    assert wrong.returncode == 3 and wrong.stderr.count("signed by another key") == 2


def test_run_with_a_bad_key_exits_2_before_training(tmp_path, dpcl):
    config = write_config(tmp_path, "cosine", tasks="[[0, 1], [2, 3]]")
    done = dpcl("run", str(config), "--out", str(tmp_path / "out"), "--sign", str(tmp_path / "missing"))
    assert done.returncode == 2 and "--sign" in done.stderr and "does not exist" in done.stderr
    assert done.stdout == "" and not (tmp_path / "out").exists()
