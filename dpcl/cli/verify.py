"""``dpcl verify CERT.json [CERT.json ...] [--checkpoint PATH] [--json]``: check privacy certificates.

Recomputes epsilon from the certificate's events (with the accountant it names,
within the stated relative tolerance) -- the headline's when the checkpoint is
private, and every scoped statement's -- and re-hashes the checkpoint (named in the
certificate relative to itself; ``--checkpoint`` overrides). Exit 0 when every
check passes, also for a valid certificate whose checkpoint is NOT private
(``private: false`` in ``--json``, a ``NOT PRIVATE`` line in the table); 3 when a
check fails (the failed checks are named) or when the file is the legacy
statement of non-privacy that ``[run] private = false`` runs wrote before
certificate version 2 (``taskNNN.nonprivate-cert.json``); 2 when the
certificate is malformed or when the certificate or checkpoint file is missing
(nothing could be checked: the message says which file, and ``--checkpoint``
points at another copy of the checkpoint).

Several certificates (e.g. ``dpcl verify RUN/certificates/*.json``) are checked
one after the other: every input file is checked first (exit 2 before any
verdict), then each certificate is verified and reported, and the exit code is
3 when any of them fails. ``--json`` then prints one object holding every
report; ``--checkpoint`` needs exactly one certificate.

``--cross-check`` also recomputes every stated epsilon independently with
dp-accounting (:mod:`dpcl.guarantees.cross_check`, CLI part in
:mod:`dpcl.cli.verify_cross_check`) and exits 3 when a stated epsilon is below
it by more than the discretisation error.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from dpcl.cli.output import add_json_flag, emit
from dpcl.cli.verify_cross_check import add_cross_check_flag, run_cross_checks
from dpcl.errors import InvalidParameterError, MalformedCertificateError, VerificationError

if TYPE_CHECKING:  # imported where used: every command's module is imported to build the parser (start-up time)
    from dpcl.guarantees.certificates import VerificationReport


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "verify",
        help="verify a privacy certificate against its events and checkpoint",
        description=(
            "Recompute epsilon from each certificate's events and check its checkpoint's SHA-256. "
            "Exit 0: every certificate valid (a valid certificate may state that its checkpoint is NOT private: "
            "the output says so); 3: a check failed, or the file is a legacy non-private statement "
            "(taskNNN.nonprivate-cert.json); 2: malformed certificate, or the certificate or checkpoint file is missing."
        ),
    )
    parser.add_argument(
        "certificates", metavar="CERT.json", nargs="+",
        help="certificate(s) written by dpcl run, e.g. RUN/certificates/*.json",
    )
    parser.add_argument(
        "--checkpoint",
        metavar="PATH",
        default=None,
        help="checkpoint file to check (default: the file the certificate names, relative to the certificate)",
    )
    add_cross_check_flag(parser)
    parser.add_argument(
        "--public-key",
        metavar="PUB",
        default=None,
        help="the issuer's Ed25519 public key (KEY.pub from dpcl keygen): a certificate without a valid signature by "
        "it fails (exit 3). Without it the signature is reported (unsigned / signed by FINGERPRINT), not checked",
    )
    add_json_flag(parser)
    parser.set_defaults(handler=run_verify, time_hint=(
        "recomputing these certificates' epsilon is too expensive here; verify fewer certificates at a time or on a "
        "faster machine"))


def check_input_files(certificate: str, checkpoint: str | None) -> None:
    """Refuse (exit 2) a certificate path that is not a file, and a checkpoint that is missing.

    Without the checkpoint nothing about the release can be checked, so a missing file is an input
    error naming the file, not a verification verdict. A checkpoint that exists but differs from the
    one certified is a failed check (exit 3), reported by :func:`verify_certificate`.
    """
    path = Path(certificate)
    if path.is_dir():
        raise MalformedCertificateError(
            f"certificate {certificate!r} is a directory; give certificate files (e.g. {certificate.rstrip('/')}/*.json)."
        )
    if checkpoint is not None:
        if not Path(checkpoint).is_file():
            what = "is a directory" if Path(checkpoint).is_dir() else "does not exist"
            raise InvalidParameterError(f"--checkpoint {checkpoint!r} {what}; give the checkpoint file to check.")
        return
    from dpcl.guarantees.certificates import certified_checkpoint_path, read_certificate

    named = read_certificate(path).get("checkpoint")
    if isinstance(named, dict) and isinstance(named.get("path"), str) and named["path"]:
        resolved = certified_checkpoint_path(path, named["path"])  # stays inside the run directory, no symlink
        if not resolved.is_file():
            raise InvalidParameterError(
                f"the checkpoint this certificate names, {named['path']!r} (relative to the certificate: "
                f"{str(resolved)!r}), does not exist; give its location with --checkpoint PATH."
            )


def _table(report: VerificationReport) -> dict[str, object]:
    payload: dict[str, object] = {"verdict": "valid" if report.valid else "INVALID"}
    if report.private:
        payload.update(
            {
                "checkpoint privacy": "private",
                "stated epsilon": report.stated_epsilon,
                "recomputed epsilon": report.recomputed_epsilon if report.recomputed_epsilon is not None else "n/a",
                "delta": report.delta,
                "relative tolerance": report.relative_tolerance,
            }
        )
    else:
        payload["checkpoint privacy"] = "NOT PRIVATE: no epsilon bounds the released checkpoint"
        payload["reasons"] = "\n".join(f"- {r}" for r in report.reasons)
    for scoped in report.scoped:
        again = "n/a" if scoped.recomputed_epsilon is None else repr(scoped.recomputed_epsilon)
        payload[f"scoped {scoped.name}"] = (
            f"stated epsilon {scoped.stated_epsilon!r}, recomputed {again}, delta {scoped.delta:g}, "
            f"{scoped.adjacency} / {scoped.unit}: {scoped.scope}"
        )
    for check in report.checks:
        payload[f"check {check.name}"] = f"{'pass' if check.passed else 'FAIL'}: {check.detail}"
    # the table is rendered by rich: "[run]", "[privacy]"... are text, not markup
    from rich.markup import escape

    return {escape(key): escape(value) if isinstance(value, str) else value for key, value in payload.items()}


def run_verify(args: argparse.Namespace) -> int:
    paths = list(args.certificates)
    if args.checkpoint is not None and len(paths) > 1:
        raise InvalidParameterError(
            f"--checkpoint names the checkpoint of one certificate, but {len(paths)} certificates were given; "
            "give one CERT.json with --checkpoint."
        )
    for path in paths:  # every input first: nothing is reported when a file is missing or malformed
        check_input_files(path, args.checkpoint)
    public_key = None
    if getattr(args, "public_key", None) is not None:
        from dpcl.guarantees.signing import load_public_key

        public_key = load_public_key(args.public_key)
    from dpcl.guarantees.certificates import verify_certificate

    reports = [verify_certificate(path, checkpoint=args.checkpoint, public_key=public_key) for path in paths]
    dicts = [r.to_dict() for r in reports]
    if getattr(args, "json", False):
        cross, cross_code = run_cross_checks(args, paths)
        for d, c in zip(dicts, cross or ()):
            d["cross_check"] = c
        if len(reports) == 1:
            emit(args, "dpcl verify", dicts[0])
        else:
            emit(args, "dpcl verify", {"valid": all(r.valid for r in reports), "certificates": dicts})
    else:
        for path, report in zip(paths, reports):
            emit(args, f"dpcl verify {path}", _table(report))
        if len(reports) > 1:
            bad = sum(not r.valid for r in reports)
            not_private = sum(r.valid and not r.private for r in reports)
            print(
                f"{len(reports)} certificates: " + ("all valid" if not bad else f"{bad} do not verify")
                + (f"; {not_private} valid but NOT PRIVATE (their checkpoints have no DP guarantee)" if not_private else "")
            )
        for path, report in zip(paths, reports):
            if report.valid and not report.private:
                print(f"NOT PRIVATE: {path} verifies, and states that its checkpoint has no differential-privacy "
                      "guarantee (see its reasons)")
        cross, cross_code = run_cross_checks(args, paths)
    for path, report in zip(paths, reports):
        if not report.valid:
            failed = ", ".join(c.name for c in report.failed)
            details = "; ".join(f"{c.name}: {' '.join(c.detail.split())}" for c in report.failed)
            sys.stderr.write(f"dpcl verify: certificate {path} does not verify; failed check(s): {failed} ({details})\n")
    return max(0 if all(r.valid for r in reports) else VerificationError.exit_code, cross_code)
