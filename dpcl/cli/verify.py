"""``dpcl verify CERT.json [--checkpoint PATH] [--json]``: check a privacy certificate.

Recomputes epsilon from the certificate's events (with the accountant it names,
within the stated relative tolerance) and re-hashes the checkpoint (named in the
certificate relative to itself; ``--checkpoint`` overrides). Exit 0 when every
check passes, 3 when one fails (the failed checks are named) or when the file
is the statement of non-privacy a ``[run] private = false`` run writes
(``taskNNN.nonprivate-cert.json``: the checkpoint is NOT private), 2 when the
certificate is malformed.
"""

from __future__ import annotations

import argparse
import sys

from dpcl.cli.output import add_json_flag, emit
from dpcl.guarantees.certificates import verify_certificate
from dpcl.errors import VerificationError


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "verify",
        help="verify a privacy certificate against its events and checkpoint",
        description=(
            "Recompute epsilon from a certificate's events and check the checkpoint's SHA-256. "
            "Exit 0: valid; 3: a check failed, or the file states that its checkpoint is NOT private "
            "([run] private = false); 2: malformed certificate."
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


def run_verify(args: argparse.Namespace) -> int:
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
        sys.stderr.write(f"dpcl verify: certificate does not verify; failed check(s): {failed}\n")
        return VerificationError.exit_code
    return 0
