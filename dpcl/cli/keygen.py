"""``dpcl keygen --out KEY [--force] [--json]``: an Ed25519 key pair for signing certificates.

Writes the private key to ``KEY`` (PEM PKCS#8, mode 0600, atomically) and the
public key to ``KEY.pub`` (PEM); an existing key is never overwritten unless
``--force``. Prints the public key's fingerprint (hex SHA-256 of the raw key),
the value ``dpcl verify`` reports as ``signed by FINGERPRINT``. Give ``KEY.pub``
(or its fingerprint, through a channel a reviewer trusts) to whoever checks
your certificates; keep ``KEY`` secret.
"""

from __future__ import annotations

import argparse

from dpcl.cli.output import add_json_flag, emit


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "keygen",
        help="create an Ed25519 key pair for signing certificates",
        description=(
            "Write an Ed25519 private key to KEY (mode 0600) and its public key to KEY.pub, for dpcl sign, "
            "dpcl run --sign and dpcl verify --public-key. Refuses to overwrite an existing key unless --force."
        ),
    )
    parser.add_argument("--out", required=True, metavar="KEY", help="private key file to write (KEY.pub is written too)")
    parser.add_argument("--force", action="store_true", help="replace an existing KEY and KEY.pub")
    add_json_flag(parser)
    parser.set_defaults(handler=run_keygen)


def run_keygen(args: argparse.Namespace) -> int:
    # lazy import: keeps CLI start-up fast (only this command needs it)
    from dpcl.guarantees.ed25519 import generate_key_pair

    pair = generate_key_pair(args.out, force=args.force)
    emit(
        args,
        "dpcl keygen",
        {
            "private_key": str(pair.private_key),
            "public_key": str(pair.public_key),
            "fingerprint": pair.fingerprint,
            "algorithm": "ed25519",
        },
    )
    return 0
