"""Ed25519 signatures on certificates: keygen, sign, verify with a public key; forgeries and other keys fail.

The signature is also checked with ``cryptography`` directly from the description in docs/guarantees.md,
not through dpcl's verify.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import stat

import pytest
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization

from dpcl.cli import main
from dpcl.errors import VerificationError
from dpcl.guarantees.certificates import verify_certificate, write_certificate
from dpcl.guarantees.signing import (
    KeyFileError,
    generate_key_pair,
    load_private_key,
    sign_certificate,
    signature_status,
)

from .certified_runs import resealed

DELTA = 1e-5


pytestmark = pytest.mark.usefixtures("reference_accountant")


@pytest.fixture()
def keys(tmp_path):
    return generate_key_pair(tmp_path / "keys" / "issuer")


def _cli(capsys, *argv):
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_keygen_writes_a_private_key_readable_only_by_its_owner(tmp_path, capsys):
    key = tmp_path / "k"
    code, out, err = _cli(capsys, "keygen", "--out", str(key), "--json")
    assert code == 0, err
    payload = json.loads(out)
    assert stat.S_IMODE(os.stat(key).st_mode) == 0o600
    assert (tmp_path / "k.pub").read_bytes().startswith(b"-----BEGIN PUBLIC KEY-----")
    raw = serialization.load_pem_public_key((tmp_path / "k.pub").read_bytes()).public_bytes(
        serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    assert payload["fingerprint"] == hashlib.sha256(raw).hexdigest()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no temp file left behind
    before = key.read_bytes()
    code, out, err = _cli(capsys, "keygen", "--out", str(key))
    assert code == 2 and "already exists" in err and "--force" in err and out == ""
    assert key.read_bytes() == before
    code, _, err = _cli(capsys, "keygen", "--out", str(key), "--force")
    assert code == 0, err
    assert key.read_bytes() != before and stat.S_IMODE(os.stat(key).st_mode) == 0o600


def test_keygen_refuses_when_only_the_public_key_exists(tmp_path):
    (tmp_path / "k.pub").write_text("someone else's key")
    with pytest.raises(KeyFileError, match="already exists"):
        generate_key_pair(tmp_path / "k")
    assert not (tmp_path / "k").exists()


def test_valid_signature_verifies_with_the_public_key(certificate, keys, capsys):
    sha_before = json.loads(certificate.read_text())["sha256"]
    code, out, err = _cli(capsys, "sign", str(certificate), "--key", str(keys.private_key), "--json")
    assert code == 0, err
    assert json.loads(out)["fingerprint"] == keys.fingerprint
    data = json.loads(certificate.read_text())
    assert data["sha256"] == sha_before  # the signature does not change the content hash
    assert data["signature"]["public_key_fingerprint"] == keys.fingerprint
    code, out, err = _cli(capsys, "verify", str(certificate), "--public-key", str(keys.public_key), "--json")
    assert code == 0, err
    check = [c for c in json.loads(out)["checks"] if c["name"] == "signature"][0]
    assert check["passed"] and keys.fingerprint in check["detail"]


def test_signature_checks_with_cryptography_from_the_documented_serialisation(certificate, keys):
    """docs/guarantees.md: Ed25519 over json.dumps(cert without 'signature', sort_keys=True, separators=(',', ':'),
    ensure_ascii=True, allow_nan=False) in UTF-8; base64 signature; fingerprint = SHA-256 of the raw public key."""
    sign_certificate(certificate, keys.private_key)
    data = json.loads(certificate.read_text())
    block = data.pop("signature")
    message = json.dumps(data, sort_keys=True, separators=(",", ":"), ensure_ascii=True, allow_nan=False).encode("utf-8")
    public = serialization.load_pem_public_key(keys.public_key.read_bytes())
    raw = public.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    assert block["algorithm"] == "ed25519"
    assert block["public_key_fingerprint"] == hashlib.sha256(raw).hexdigest()
    public.verify(base64.b64decode(block["value"]), message)  # raises InvalidSignature if not
    data["guarantee"]["epsilon"] *= 0.5
    with pytest.raises(InvalidSignature):
        public.verify(base64.b64decode(block["value"]),
                      json.dumps(data, sort_keys=True, separators=(",", ":"), ensure_ascii=True).encode("utf-8"))


def test_forged_certificate_with_recomputed_hash_fails_only_with_the_key(certificate, keys, capsys):
    sign_certificate(certificate, keys.private_key)
    data = json.loads(certificate.read_text())
    data["assumptions"].append("Nothing else is assumed.")  # any edit: here one that ε cannot catch
    certificate.write_text(json.dumps(resealed(data)))
    # without the key the forgery passes every check dpcl can make alone (the hash was recomputed)
    code, out, err = _cli(capsys, "verify", str(certificate), "--json")
    assert code == 0, err
    check = [c for c in json.loads(out)["checks"] if c["name"] == "signature"][0]
    assert check["passed"] and check["detail"] == f"signed by {keys.fingerprint} (not checked)"
    code, out, err = _cli(capsys, "verify", str(certificate), "--public-key", str(keys.public_key))
    assert code == 3
    assert "signature" in err and "edited after signing" in err
    report = verify_certificate(certificate, public_key=keys.public_key)
    assert [c.name for c in report.failed] == ["signature"]


def test_signature_from_another_key_fails(certificate, keys, tmp_path, capsys):
    other = generate_key_pair(tmp_path / "keys" / "other")
    sign_certificate(certificate, other.private_key)
    code, _, err = _cli(capsys, "verify", str(certificate), "--public-key", str(keys.public_key))
    assert code == 3 and f"signed by another key ({other.fingerprint})" in err
    # a forger who re-labels the fingerprint with the expected key's does not get through either
    data = json.loads(certificate.read_text())
    data["signature"]["public_key_fingerprint"] = keys.fingerprint
    certificate.write_text(json.dumps(data))
    report = verify_certificate(certificate, public_key=keys.public_key)
    assert [c.name for c in report.failed] == ["signature"] and "does not match" in report.failed[0].detail


def test_unsigned_certificate_fails_with_a_key_and_is_reported_without(certificate, keys, capsys):
    code, out, err = _cli(capsys, "verify", str(certificate), "--public-key", str(keys.public_key))
    assert code == 3 and "unsigned" in err
    code, out, _ = _cli(capsys, "verify", str(certificate), "--json")
    assert code == 0
    check = [c for c in json.loads(out)["checks"] if c["name"] == "signature"][0]
    assert check == {"name": "signature", "passed": True, "detail": "unsigned"}


@pytest.mark.parametrize(
    "block",
    [[], {"algorithm": "rsa"}, {"algorithm": "ed25519", "public_key_fingerprint": "x", "value": "AA=="},
     {"algorithm": "ed25519", "public_key_fingerprint": "0" * 64, "value": "not base64!"}],
    ids=["list", "algorithm", "fingerprint", "value"],
)
def test_malformed_signature_block_fails(certificate, keys, block):
    data = json.loads(certificate.read_text())
    data["signature"] = block
    certificate.write_text(json.dumps(data))
    for key in (None, keys.public_key):
        report = verify_certificate(certificate, public_key=key)
        assert [c.name for c in report.failed] == ["signature"]


def test_sign_refuses_an_edited_certificate_and_signs_nothing(certificate, keys, tmp_path, capsys):
    second = certificate.with_name("copy.cert.json")
    second.write_text(certificate.read_text().replace('"../checkpoints/', '"../checkpoints/'))
    data = json.loads(certificate.read_text())
    data["guarantee"]["epsilon"] *= 0.5
    certificate.write_text(json.dumps(resealed(data)))  # a consistent hash, but ε does not verify
    code, out, err = _cli(capsys, "sign", str(second), str(certificate), "--key", str(keys.private_key))
    assert code == 3 and "epsilon" in err and out == ""
    assert "signature" not in json.loads(second.read_text())
    data["guarantee"]["epsilon"] *= 2  # back to the true value, hash now stale
    certificate.write_text(json.dumps(data))
    with pytest.raises(VerificationError, match="sha256"):
        sign_certificate(certificate, keys.private_key, verify=False)


def test_rewriting_a_signed_certificate_drops_its_signature(certificate, keys):
    sign_certificate(certificate, keys.private_key)
    data = json.loads(certificate.read_text())
    write_certificate(certificate, data)
    assert signature_status(json.loads(certificate.read_text())) == "unsigned"


@pytest.mark.parametrize(
    ("content", "match"),
    [(None, "does not exist"), (b"junk", "not a PEM private key"), (b"x" * 100_000, "more than a key file holds")],
)
def test_bad_private_key_files_are_refused(tmp_path, content, match):
    path = tmp_path / "key"
    if content is not None:
        path.write_bytes(content)
    with pytest.raises(KeyFileError, match=match):
        load_private_key(path)


def test_public_key_given_as_private_key_and_vice_versa(certificate, keys, capsys):
    code, out, err = _cli(capsys, "sign", str(certificate), "--key", str(keys.public_key))
    assert code == 2 and "public key" in err and "\n" == err[-1] and err.count("\n") == 1
    code, out, err = _cli(capsys, "verify", str(certificate), "--public-key", str(keys.private_key))
    assert code == 2 and "PRIVATE key" in err
