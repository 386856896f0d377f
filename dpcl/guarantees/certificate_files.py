"""Certificate files: the content hash, atomic writing, and reading a certificate back into its typed model."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any, Mapping

from dpcl._io.atomic_io import read_json, write_json_atomic
from dpcl.accounting.validation import describe_number, integer_beyond_float
from dpcl.errors import InvalidParameterError, MalformedCertificateError, VerificationError
from dpcl.guarantees.certificate_model import CERTIFICATE_FORMAT, Certificate

#: Format of the statement that ``dpcl run`` wrote before certificate version 2 for a release of a
#: ``[run] private = false`` run (``taskNNN.nonprivate-cert.json``). It is not a certificate (no content
#: hash, nothing to recompute) and is refused with :class:`NonPrivateReleaseError`; runs now write a
#: version-2 certificate with ``private: false`` instead.
NON_PRIVATE_FORMAT = "dpcl-non-private-release"


def content_sha256(certificate: Mapping[str, Any]) -> str:
    """SHA-256 of a certificate's canonical JSON (sorted keys, no whitespace), its ``sha256`` field excluded.

    The ``signature`` block (:mod:`dpcl.guarantees.signing`) is excluded too: it is added after the hash and
    covers the hash, so signing a certificate does not change it."""
    body = {k: v for k, v in certificate.items() if k not in ("sha256", "signature")}
    return hashlib.sha256(
        json.dumps(body, sort_keys=True, separators=(",", ":"), allow_nan=False).encode()
    ).hexdigest()


def write_certificate(path: "str | os.PathLike[str]", certificate: "Certificate | Mapping[str, Any]") -> Path:
    """Write ``certificate`` (a :class:`~dpcl.guarantees.certificate_model.Certificate` or its JSON form)
    atomically to ``path``, storing the checkpoint path relative to it and the SHA-256 of the certificate's
    content (:func:`content_sha256`) in its ``sha256`` field."""
    target = Path(path)
    if isinstance(certificate, Certificate):
        certificate = certificate.to_json()
    # a signature covers the content it was made for: a (re)written certificate is unsigned until signed again
    cert = {k: v for k, v in certificate.items() if k not in ("sha256", "signature")}
    ckpt = cert.get("checkpoint")
    if ckpt and ckpt.get("path"):
        absolute = Path(ckpt["path"]).resolve()
        rel = os.path.relpath(absolute, target.resolve().parent)
        cert["checkpoint"] = {**ckpt, "path": Path(rel).as_posix()}
    try:  # hash exactly what is written (tuples become lists ...)
        cert = json.loads(json.dumps(cert, allow_nan=False))
    except (TypeError, ValueError) as exc:
        raise InvalidParameterError(f"certificate is not strict JSON (finite numbers, plain values): {exc}.") from exc
    cert["sha256"] = content_sha256(cert)
    return write_json_atomic(target, cert)


class NonPrivateReleaseError(VerificationError):
    """A statement of non-privacy was given where a certificate was expected: the checkpoint it names was
    trained without differential privacy, so there is nothing to verify (exit code 3, like any failed check)."""


def _non_private_message(path: Path, data: Mapping[str, Any]) -> str:
    release = data.get("release") if isinstance(data.get("release"), Mapping) else {}
    ckpt = data.get("checkpoint") if isinstance(data.get("checkpoint"), Mapping) else {}
    what = ", ".join(
        part
        for part in (
            f"task {release['task_index']}" if "task_index" in release else "",
            f"method {release['method']!r}" if "method" in release else "",
            f"checkpoint {ckpt['path']!r}" if "path" in ckpt else "",
        )
        if part
    )
    return (
        f"{str(path)!r} is a statement that the checkpoint is NOT differentially private"
        + (f" ({what})" if what else "")
        + ": it was trained with [run] private = false (no noise, no clipping), so it has no privacy guarantee "
        "(epsilon is infinite). It is not a certificate (a legacy statement written before certificate version 2, with "
        "nothing to verify); train with private = true to get a certificate of a private checkpoint."
    )


def load_certificate(path: "str | os.PathLike[str]", model: type[Certificate] = Certificate) -> Certificate:
    """Read a certificate (any of :data:`READABLE_VERSIONS`) into ``model``
    (:class:`~dpcl.guarantees.certificate_model.Certificate` or a subclass declaring more fields); malformed input
    raises MalformedCertificateError naming the field, a legacy statement of non-privacy NonPrivateReleaseError."""
    p = Path(path)
    try:
        data = read_json(p)
    except FileNotFoundError:
        raise MalformedCertificateError(f"certificate {str(p)!r} does not exist.") from None
    except (ValueError, UnicodeDecodeError) as exc:
        raise MalformedCertificateError(f"certificate {str(p)!r} is not valid JSON: {exc}.") from exc
    if isinstance(data, dict) and data.get("format") == NON_PRIVATE_FORMAT:
        raise NonPrivateReleaseError(_non_private_message(p, data))
    if not isinstance(data, dict) or data.get("format") != CERTIFICATE_FORMAT:
        raise MalformedCertificateError(f"{str(p)!r} is not a dpcl certificate (format must be {CERTIFICATE_FORMAT!r}).")
    found = integer_beyond_float(data)
    if found is not None:
        where = "".join(f"[{k}]" if isinstance(k, int) else f".{k}" for k in found[0]).lstrip(".")
        raise MalformedCertificateError(
            f"certificate {str(p)!r} field {where} must be a number within float range (~1.8e308), got "
            f"{describe_number(found[1])}."
        )
    return model.from_json(data)


def read_certificate(path: "str | os.PathLike[str]") -> dict[str, Any]:
    """Read and validate a certificate (:func:`load_certificate`); returns its JSON object as written."""
    return dict(load_certificate(path).content())
