"""``dpcl report RUN_DIR [--out PAGE.html] [--public-key PUB] [--json]``: a privacy reviewer's page of a run.

Writes one self-contained HTML page (:mod:`dpcl.guarantees.report`; default ``RUN_DIR/report.html``): the
releases with their epsilon, delta, unit, adjacency, composition and whether each is private; epsilon over the
stream, the privacy profile of the last release and the accuracy matrix as figures embedded in the page; the
assumptions, the coverage of each checkpoint and the verification and signature results (``dpcl verify``'s
checks). Exit 0 when the page is written and every certificate verifies; 3 when it is written and a certificate
does not verify (the page says which check failed); 2 when ``RUN_DIR`` is not a run directory.
"""

from __future__ import annotations

import argparse

from dpcl.cli.output import add_json_flag, emit
from dpcl.errors import VerificationError


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "report",
        help="write a self-contained HTML page of a run for a privacy reviewer",
        description=(
            "Write one HTML page (no network: figures embedded) stating every release's guarantee, epsilon over "
            "the stream, the privacy profile of the last release, the accuracy matrix, the assumptions, the "
            "coverage of each checkpoint and the verification and signature results. Exit 0: written, every "
            "certificate valid; 3: written, a certificate does not verify; 2: not a run directory."
        ),
    )
    parser.add_argument("run_dir", metavar="RUN_DIR", help="a run directory (dpcl run --out, or a Certifier's run_dir)")
    parser.add_argument("--out", metavar="PAGE.html", default=None, help="where to write the page (default: RUN_DIR/report.html)")
    parser.add_argument(
        "--public-key", metavar="PUB", default=None,
        help="the issuer's Ed25519 public key (KEY.pub from dpcl keygen): every signature is checked against it",
    )
    parser.add_argument(
        "--audit", metavar="AUDIT.json", default=None,
        help="a one-run audit (dpcl audit-run's audit.json) to show beside the certified epsilon "
             "(default: RUN_DIR/audit/audit.json when it exists)",
    )
    add_json_flag(parser)
    parser.set_defaults(handler=run_report, time_hint=(
        "recomputing these certificates' epsilon is too expensive here; report on a faster machine"))


def run_report(args: argparse.Namespace) -> int:
    # lazy import: keeps CLI start-up fast (only this command needs it)
    from dpcl.guarantees.report import certificate_paths, write_report

    certificate_paths(args.run_dir)  # a path that is not a run directory is refused before anything is read
    public_key = None
    if args.public_key is not None:
        # lazy import: keeps CLI start-up fast (only this command needs it)
        from dpcl.guarantees.signing import load_public_key

        public_key = load_public_key(args.public_key)
    summary = write_report(args.run_dir, args.out, public_key=public_key, audit=args.audit)
    emit(args, "dpcl report", {
        "report": str(summary.path),
        "certificates": summary.certificates,
        "all valid": summary.valid,
        "last release private": summary.last_private,
        "signatures": summary.signatures,
    })
    return 0 if summary.valid else VerificationError.exit_code
