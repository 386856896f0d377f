"""``dpcl verify CERT.json [--checkpoint PATH] [--json]``: check a privacy certificate.

Recomputes epsilon from the certificate's events (with the accountant it names,
within the stated relative tolerance) and re-hashes the checkpoint (named in the
certificate relative to itself; ``--checkpoint`` overrides). Exit 0 when every
check passes, 3 when one fails (the failed checks are named) or when the file
is the statement of non-privacy a ``[run] private = false`` run writes
(``taskNNN.nonprivate-cert.json``: the checkpoint is NOT private), 2 when the
certificate is malformed or when the certificate or checkpoint file is missing
(nothing could be checked: the message says which file, and ``--checkpoint``
points at another copy of the checkpoint).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from dpcl.cli.output import add_json_flag, emit
from dpcl.guarantees.certificates import read_certificate, verify_certificate
from dpcl.errors import InvalidParameterError, MalformedCertificateError, VerificationError


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "verify",
        help="verify a privacy certificate against its events and checkpoint",
        description=(
            "Recompute epsilon from a certificate's events and check the checkpoint's SHA-256. "
            "Exit 0: valid; 3: a check failed, or the file states that its checkpoint is NOT private "
            "([run] private = false); 2: malformed certificate, or the certificate or checkpoint file is missing."
        ),
    )
    parser.add_argument("certificate", metavar="CERT.json", help="certificate written by dpcl run")
    parser.add_argument(
        "--checkpoint",
        metavar="PATH",
        default=None,
        help="checkpoint file to check (default: the file the certificate names, relative to the certificate)",
    )
    add_json_flag(parser)
    parser.set_defaults(handler=run_verify)


def check_input_files(certificate: str, checkpoint: str | None) -> None:
    """Refuse (exit 2) a certificate path that is not a file, and a checkpoint that is missing.

    Without the checkpoint nothing about the release can be checked, so a missing file is an input
    error naming the file, not a verification verdict. A checkpoint that exists but differs from the
    one certified is a failed check (exit 3), reported by :func:`verify_certificate`.
    """
    path = Path(certificate)
    if path.is_dir():
        raise MalformedCertificateError(f"certificate {certificate!r} is a directory; give a certificate file.")
    if checkpoint is not None:
        if not Path(checkpoint).is_file():
            what = "is a directory" if Path(checkpoint).is_dir() else "does not exist"
            raise InvalidParameterError(f"--checkpoint {checkpoint!r} {what}; give the checkpoint file to check.")
        return
    named = read_certificate(path).get("checkpoint")
    if isinstance(named, dict) and isinstance(named.get("path"), str) and named["path"]:
        resolved = (path.resolve().parent / named["path"]).resolve()
        if not resolved.is_file():
            raise InvalidParameterError(
                f"the checkpoint this certificate names, {named['path']!r} (relative to the certificate: "
                f"{str(resolved)!r}), does not exist; give its location with --checkpoint PATH."
            )


def run_verify(args: argparse.Namespace) -> int:
    check_input_files(args.certificate, args.checkpoint)
    report = verify_certificate(args.certificate, checkpoint=args.checkpoint)
    if getattr(args, "json", False):
        emit(args, "dpcl verify", report.to_dict())
    else:
        payload = {
            "verdict": "valid" if report.valid else "INVALID",
            "stated epsilon": report.stated_epsilon,
            "recomputed epsilon": report.recomputed_epsilon if report.recomputed_epsilon is not None else "n/a",
            "delta": report.delta,
            "relative tolerance": report.relative_tolerance,
        }
        for check in report.checks:
            payload[f"check {check.name}"] = f"{'pass' if check.passed else 'FAIL'}: {check.detail}"
        emit(args, f"dpcl verify {args.certificate}", payload)
    if not report.valid:
        failed = ", ".join(c.name for c in report.failed)
        details = "; ".join(f"{c.name}: {' '.join(c.detail.split())}" for c in report.failed)
        sys.stderr.write(f"dpcl verify: certificate does not verify; failed check(s): {failed} ({details})\n")
        return VerificationError.exit_code
    return 0
