"""Signing certificate files: :func:`sign_certificate_data`, :func:`sign_certificate` and :func:`sign_certificates`.

The keys, the bytes a signature covers and the signature check (which
:func:`~dpcl.guarantees.certificates.verify_certificate` runs) live in :mod:`dpcl.guarantees.ed25519`, below the
certificate module; this module sits above it (signing verifies a certificate first) and re-exports the key and
check functions, so ``dpcl.guarantees.signing`` stays the one place a user imports from. What is signed is
described in :mod:`dpcl.guarantees.ed25519` and ``docs/guarantees.md``.
"""

from __future__ import annotations

import base64
import os
from pathlib import Path
from typing import Any, Mapping, Sequence

from dpcl._io.atomic_io import write_json_atomic
from dpcl.errors import MalformedCertificateError, VerificationError
from dpcl.guarantees.certificates import content_sha256, read_certificate, verify_certificate
from dpcl.guarantees.ed25519 import (
    SIGNATURE_ALGORITHM,
    SIGNATURE_FIELD,
    KeyFileError,
    KeyPair,
    SignatureResult,
    generate_key_pair,
    load_private_key,
    load_public_key,
    public_key_fingerprint,
    signature_check,
    signature_state,
    signature_status,
    signed_bytes,
    verify_certificate_signature,
)

__all__ = [
    "SIGNATURE_FIELD",
    "SIGNATURE_ALGORITHM",
    "KeyFileError",
    "KeyPair",
    "SignatureResult",
    "generate_key_pair",
    "load_private_key",
    "load_public_key",
    "public_key_fingerprint",
    "signed_bytes",
    "sign_certificate_data",
    "sign_certificate",
    "sign_certificates",
    "signature_status",
    "signature_check",
    "signature_state",
    "verify_certificate_signature",
]


def sign_certificate_data(certificate: Mapping[str, Any], key: Any) -> dict[str, Any]:
    """A copy of ``certificate`` with a ``signature`` block (replacing any earlier one) made with ``key``.

    The certificate must already carry its content ``sha256`` and that hash must match its content: a
    damaged or hand-edited certificate is refused rather than vouched for.
    """
    private = load_private_key(key)
    body = {k: v for k, v in certificate.items() if k != SIGNATURE_FIELD}
    stored = body.get("sha256")
    if not isinstance(stored, str) or stored != content_sha256(body):
        raise VerificationError(
            "the certificate's content does not match its sha256 (edited or damaged after it was written, or written "
            "without write_certificate); refusing to sign it. Re-issue it with write_certificate, then sign."
        )
    value = private.sign(signed_bytes(body))
    return {
        **body,
        SIGNATURE_FIELD: {
            "algorithm": SIGNATURE_ALGORITHM,
            "public_key_fingerprint": public_key_fingerprint(private),
            "value": base64.b64encode(value).decode("ascii"),
        },
    }


def sign_certificate(path: "str | os.PathLike[str]", key: Any, *, verify: bool = True) -> str:
    """Sign the certificate file ``path`` in place with ``key`` (a key file path or an Ed25519 private key).

    With ``verify`` (default) the certificate must pass every check of
    :func:`~dpcl.guarantees.certificates.verify_certificate` first (a signature vouches for it; a certificate
    that does not verify raises :class:`~dpcl.errors.VerificationError`); a caller that has just verified it
    (``dpcl run``) passes ``verify=False``. The content hash is always checked. The file is rewritten
    atomically. Returns the signer's public-key fingerprint.
    """
    private = load_private_key(key)
    target = Path(path)
    if verify:
        verify_certificate(target).raise_if_invalid()
    data = read_certificate(target)
    signed = sign_certificate_data(data, private)
    write_json_atomic(target, signed)
    return signed[SIGNATURE_FIELD]["public_key_fingerprint"]


def sign_certificates(paths: Sequence["str | os.PathLike[str]"], key: Any) -> list[tuple[Path, str]]:
    """Sign several certificate files with one key: every file is verified first, then each is signed.

    Nothing is written when any certificate is malformed or does not verify.
    """
    private = load_private_key(key)
    targets = [Path(p) for p in paths]
    for target in targets:
        if target.is_dir():
            raise MalformedCertificateError(f"certificate {str(target)!r} is a directory; give certificate files.")
        read_certificate(target)
    for target in targets:
        verify_certificate(target).raise_if_invalid()
    return [(target, sign_certificate(target, private, verify=False)) for target in targets]
