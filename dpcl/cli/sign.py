"""``dpcl sign CERT.json [CERT.json ...] --key KEY [--json]``: sign certificates with an Ed25519 key.

Every certificate is verified first (as ``dpcl verify``: epsilon recomputed,
checkpoint re-hashed, content hash checked); nothing is signed when one is
missing or malformed (exit 2) or does not verify (exit 3). Each file is then
rewritten atomically with a ``signature`` block (see ``docs/guarantees.md`` for
exactly what is signed); a certificate signed before is signed again.
"""

from __future__ import annotations

import argparse

from dpcl.cli.output import add_json_flag, emit


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "sign",
        help="sign certificates with an Ed25519 private key",
        description=(
            "Verify each certificate, then add an Ed25519 signature by KEY (from dpcl keygen) that dpcl verify "
            "--public-key KEY.pub checks. Exit 0: all signed; 3: a certificate does not verify (nothing signed); "
            "2: a missing or malformed certificate or key."
        ),
    )
    parser.add_argument("certificates", metavar="CERT.json", nargs="+", help="certificate(s) to sign")
    parser.add_argument("--key", required=True, metavar="KEY", help="Ed25519 private key (PEM) written by dpcl keygen")
    add_json_flag(parser)
    parser.set_defaults(handler=run_sign)


def run_sign(args: argparse.Namespace) -> int:
    # lazy import: keeps CLI start-up fast (only this command needs it)
    from dpcl.guarantees.signing import sign_certificates

    signed = sign_certificates(args.certificates, args.key)
    fingerprint = signed[0][1]
    emit(
        args,
        "dpcl sign",
        {"signed": [str(path) for path, _ in signed], "fingerprint": fingerprint, "algorithm": "ed25519"},
    )
    return 0
