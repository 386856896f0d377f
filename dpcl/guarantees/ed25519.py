"""Ed25519 keys and the signature check on certificates: who issued a certificate, checkable by anyone with the
public key. Signing a certificate *file* (which verifies it first) is :mod:`dpcl.guarantees.signing`, above the
certificate module; this module sits below it, so :func:`~dpcl.guarantees.certificates.verify_certificate` can run
:func:`signature_check`.

A certificate's ``sha256`` (:func:`dpcl.guarantees.certificates.content_sha256`)
detects edits and damage, but anyone can change a number, recompute the hash and
hand the file on. A signature made with the issuer's private key cannot be
recomputed without that key: :func:`sign_certificate` adds a ``signature`` block,
and :func:`signature_check` (used by ``dpcl verify --public-key``) checks it
against a public key the reviewer obtained from the issuer.

What is signed (documented in ``docs/guarantees.md`` so that other tools can check it):

* the certificate object **without** its ``signature`` field (the content
  ``sha256`` is included), serialised by :func:`signed_bytes` as JSON with sorted
  keys, separators ``(",", ":")``, ``ensure_ascii=True`` and no NaN/Infinity
  (Python's :func:`json.dumps`; floats in Python's shortest round-trip ``repr``),
  encoded as UTF-8;
* Ed25519 (RFC 8032) over those bytes; the 64-byte signature is stored in
  standard base64 (with padding) under ``signature.value``;
* ``signature.public_key_fingerprint`` is the hex SHA-256 of the signer's 32-byte
  raw public key (:func:`public_key_fingerprint`).

The signature is added *after* the content hash is computed, and the content hash
excludes the ``signature`` field, so signing does not change ``sha256`` and an
unsigned certificate keeps verifying as before.

Keys are PEM files: the private key PKCS#8 (unencrypted, written with mode 0600,
atomically, never over an existing key unless asked), the public key
SubjectPublicKeyInfo (``KEY.pub``), both readable by OpenSSL and by
``cryptography``. No cryptography is implemented here: key generation, signing and
verification are the ``cryptography`` package's Ed25519.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

from dpcl.errors import InvalidParameterError, MissingDependencyError
from dpcl._io.atomic_io import write_bytes_atomic

__all__ = [
    "SIGNATURE_FIELD",
    "SIGNATURE_ALGORITHM",
    "KeyFileError",
    "KeyPair",
    "generate_key_pair",
    "load_private_key",
    "load_public_key",
    "public_key_fingerprint",
    "signed_bytes",
    "signature_status",
    "signature_check",
    "signature_state",
    "SignatureResult",
    "verify_certificate_signature",
]

#: The certificate field that holds the signature block; it is excluded from what is signed and from the
#: certificate's content hash.
SIGNATURE_FIELD = "signature"
SIGNATURE_ALGORITHM = "ed25519"
#: Key files are a few hundred bytes; anything larger is not a key and is not read.
MAX_KEY_FILE_BYTES = 64 * 1024


class KeyFileError(InvalidParameterError):
    """A key file is missing, unreadable, not an Ed25519 key of the expected kind, or would be overwritten."""


def _crypto():
    try:
        from cryptography.hazmat.primitives import serialization
        from cryptography.hazmat.primitives.asymmetric import ed25519
    except ModuleNotFoundError as exc:  # pragma: no cover - cryptography is a dependency
        raise MissingDependencyError(
            f"signing certificates needs the 'cryptography' package ({exc}); install it: pip install cryptography"
        ) from exc
    return serialization, ed25519


@dataclass(frozen=True)
class KeyPair:
    """Where :func:`generate_key_pair` wrote the key pair, and the public key's fingerprint."""

    private_key: Path
    public_key: Path
    fingerprint: str


def public_key_fingerprint(public_key: Any) -> str:
    """Hex SHA-256 of the 32-byte raw Ed25519 public key (accepts a private key too: its public half)."""
    serialization, ed25519 = _crypto()
    if isinstance(public_key, ed25519.Ed25519PrivateKey):
        public_key = public_key.public_key()
    raw = public_key.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    return hashlib.sha256(raw).hexdigest()


def _public_path(private: Path) -> Path:
    return private.with_name(private.name + ".pub")


def generate_key_pair(out: "str | os.PathLike[str]", *, force: bool = False) -> KeyPair:
    """Generate an Ed25519 key pair: the private key at ``out`` (PEM PKCS#8, mode 0600) and ``out.pub``.

    Both files are written atomically. An existing ``out`` or ``out.pub`` is never overwritten unless
    ``force`` (a lost private key cannot be recovered, and certificates signed with it would no longer match
    a replaced public key): :class:`KeyFileError` names the file.
    """
    serialization, ed25519 = _crypto()
    private_path = Path(out)
    if private_path.is_dir():  # first: "", "." and "/" name no file, and have no KEY.pub beside them
        raise KeyFileError(f"--out {str(private_path)!r} is a directory; give the path of the private key file to write.")
    public_path = _public_path(private_path)
    if not force:
        for existing in (private_path, public_path):
            if existing.exists() or existing.is_symlink():
                raise KeyFileError(
                    f"{str(existing)!r} already exists; refusing to overwrite a key (certificates signed with it "
                    "would no longer verify). Give another --out, or --force to replace it."
                )
    key = ed25519.Ed25519PrivateKey.generate()
    private_pem = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    public_pem = key.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    try:
        write_bytes_atomic(private_path, private_pem, mode=0o600, overwrite=force)
        write_bytes_atomic(public_path, public_pem, mode=0o644, overwrite=force)
    except FileExistsError as exc:  # created by someone else between the check and the write
        raise KeyFileError(
            f"{exc.filename or str(private_path)!r} already exists; refusing to overwrite a key. Give another --out, "
            "or --force to replace it."
        ) from None
    return KeyPair(private_key=private_path, public_key=public_path, fingerprint=public_key_fingerprint(key))


def _read_key_file(key: Any, what: str, option: str) -> tuple[Path, bytes]:
    """The path and bytes of the ``what`` file that ``key`` names (a path given for ``option``)."""
    if not isinstance(key, (str, os.PathLike)):
        raise KeyFileError(f"{option} must be a key file path or an Ed25519 {what}, got {type(key).__name__}.")
    path = Path(key)
    try:
        size = path.stat().st_size
        if not path.is_file():
            raise KeyFileError(f"{option} {str(path)!r} is not a file; give the {what} file.")
        if size > MAX_KEY_FILE_BYTES:
            raise KeyFileError(
                f"{option} {str(path)!r} is {size} bytes, more than a key file holds (at most {MAX_KEY_FILE_BYTES}); "
                f"give the {what} file written by dpcl keygen."
            )
        with open(path, "rb") as handle:
            return path, handle.read(MAX_KEY_FILE_BYTES + 1)
    except FileNotFoundError:
        raise KeyFileError(f"{option} {str(path)!r} does not exist; create a key pair with dpcl keygen --out KEY.") from None
    except OSError as exc:
        raise KeyFileError(f"{option} {str(path)!r} cannot be read: {exc.strerror or exc}.") from None


def load_private_key(key: Any, *, option: str = "--key") -> Any:
    """An Ed25519 private key: a key object is returned as is, a path is read as PEM (PKCS#8, unencrypted)."""
    serialization, ed25519 = _crypto()
    if isinstance(key, ed25519.Ed25519PrivateKey):
        return key
    path, data = _read_key_file(key, "private key", option)
    try:
        loaded = serialization.load_pem_private_key(data, password=None)
    except TypeError:
        raise KeyFileError(
            f"{option} {str(path)!r} is encrypted; dpcl reads unencrypted PKCS#8 keys (dpcl keygen writes one)."
        ) from None
    except (ValueError, binascii.Error):
        hint = " (this is a public key: sign with the private key, check with --public-key)" if b"PUBLIC KEY" in data else ""
        raise KeyFileError(
            f"{option} {str(path)!r} is not a PEM private key{hint}; create a key pair with dpcl keygen --out KEY."
        ) from None
    except Exception as exc:  # cryptography raises UnsupportedAlgorithm for other key types
        raise KeyFileError(f"{option} {str(path)!r} cannot be read as a private key ({exc}).") from None
    if not isinstance(loaded, ed25519.Ed25519PrivateKey):
        raise KeyFileError(
            f"{option} {str(path)!r} holds a {type(loaded).__name__}, not an Ed25519 key; create one with dpcl keygen."
        )
    return loaded


def load_public_key(key: Any, *, option: str = "--public-key") -> Any:
    """An Ed25519 public key: a key object is returned as is, a path is read as PEM (SubjectPublicKeyInfo)."""
    serialization, ed25519 = _crypto()
    if isinstance(key, ed25519.Ed25519PublicKey):
        return key
    path, data = _read_key_file(key, "public key", option)
    try:
        loaded = serialization.load_pem_public_key(data)
    except (ValueError, binascii.Error):
        hint = " (this is the PRIVATE key: give KEY.pub, and keep KEY secret)" if b"PRIVATE KEY" in data else ""
        raise KeyFileError(
            f"{option} {str(path)!r} is not a PEM public key{hint}; give the KEY.pub file dpcl keygen wrote."
        ) from None
    except Exception as exc:  # UnsupportedAlgorithm
        raise KeyFileError(f"{option} {str(path)!r} cannot be read as a public key ({exc}).") from None
    if not isinstance(loaded, ed25519.Ed25519PublicKey):
        raise KeyFileError(f"{option} {str(path)!r} holds a {type(loaded).__name__}, not an Ed25519 public key.")
    return loaded


def signed_bytes(certificate: Mapping[str, Any]) -> bytes:
    """The bytes a signature covers: the certificate without its ``signature`` field, canonical JSON, UTF-8.

    ``json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=True, allow_nan=False)``.
    """
    body = {k: v for k, v in certificate.items() if k != SIGNATURE_FIELD}
    try:
        text = json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=True, allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise InvalidParameterError(f"certificate is not strict JSON (finite numbers, plain values): {exc}.") from None
    return text.encode("utf-8")


def _signature_block(certificate: Mapping[str, Any]) -> tuple[dict[str, Any] | None, str | None]:
    """(block, problem): the signature block if well formed; else ``None`` and what is wrong (``None``: unsigned)."""
    if SIGNATURE_FIELD not in certificate:
        return None, None
    block = certificate[SIGNATURE_FIELD]
    if not isinstance(block, dict):
        return None, f"the signature field must be an object, got {type(block).__name__}"
    if block.get("algorithm") != SIGNATURE_ALGORITHM:
        return None, f"signature algorithm {block.get('algorithm')!r} is not supported (only {SIGNATURE_ALGORITHM!r})"
    fingerprint = block.get("public_key_fingerprint")
    if not (isinstance(fingerprint, str) and len(fingerprint) == 64 and all(c in "0123456789abcdef" for c in fingerprint)):
        return None, "signature public_key_fingerprint must be 64 lower-case hex digits"
    value = block.get("value")
    try:
        raw = base64.b64decode(value, validate=True) if isinstance(value, str) else b""
    except (binascii.Error, ValueError):
        raw = b""
    if len(raw) != 64:
        return None, "signature value must be a base64 Ed25519 signature (64 bytes)"
    return {**block, "raw": raw}, None


def signature_status(certificate: Mapping[str, Any]) -> str:
    """``"unsigned"``, ``"signed by FINGERPRINT (not checked)"`` or what is malformed, without any key."""
    block, problem = _signature_block(certificate)
    if problem:
        return f"malformed signature: {problem}"
    if block is None:
        return "unsigned"
    return f"signed by {block['public_key_fingerprint']} (not checked)"


@dataclass(frozen=True)
class SignatureResult:
    """Outcome of checking a certificate's signature: ``passed`` and a one-line ``detail``."""

    passed: bool
    detail: str


def verify_certificate_signature(certificate: Mapping[str, Any], public_key: Any) -> SignatureResult:
    """Check ``certificate``'s signature against ``public_key`` (a path or an Ed25519 public key).

    Fails for a certificate without a signature, a malformed signature block, a signature by another key, and a
    signature that does not match the content (any edit after signing, including a recomputed content hash).
    """
    from cryptography.exceptions import InvalidSignature

    key = load_public_key(public_key)
    expected = public_key_fingerprint(key)
    block, problem = _signature_block(certificate)
    if problem:
        return SignatureResult(False, f"{problem}; the given key {expected} cannot be checked against it")
    if block is None:
        return SignatureResult(
            False, f"unsigned: the certificate carries no signature, but a signature by {expected} was asked for"
        )
    if block["public_key_fingerprint"] != expected:
        return SignatureResult(
            False, f"signed by another key ({block['public_key_fingerprint']}), not by the given key {expected}"
        )
    try:
        key.verify(block["raw"], signed_bytes(certificate))
    except InvalidSignature:
        return SignatureResult(
            False,
            f"the signature by {expected} does not match the certificate's content: it was edited after signing "
            "(or forged)",
        )
    return SignatureResult(True, f"signed by {expected}: signature valid")


def signature_check(certificate: Mapping[str, Any], public_key: Any = None) -> tuple[bool, str]:
    """The ``signature`` check of :func:`~dpcl.guarantees.certificates.verify_certificate`: (passed, detail).

    Without a public key nothing is checked (it passes, and says ``unsigned`` or ``signed by ... (not
    checked)``) unless the signature block is malformed; with one, :func:`verify_certificate_signature`.
    """
    if public_key is None:
        status = signature_status(certificate)
        return not status.startswith("malformed"), status
    result = verify_certificate_signature(certificate, public_key)
    return result.passed, result.detail


def signature_state(passed: bool, detail: str, keyed: bool) -> str:
    """The word a reader sees for a ``signature`` check (its ``passed`` and ``detail``; ``keyed``: a public key was
    given): ``not signed``, ``signed, NOT CHECKED`` (no key), ``verified``, ``INVALID`` or ``malformed``. An unsigned
    certificate never reads as a pass (``dpcl verify``'s column and ``dpcl report``'s page)."""
    if detail.startswith("malformed"):
        return "malformed"
    if "unsigned" in detail:
        return "not signed"
    if not keyed:
        return "signed, NOT CHECKED"
    return "verified" if passed else "INVALID"
