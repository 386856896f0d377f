"""``dpcl verify --cross-check``: the independent dp-accounting recomputation, kept apart from ``verify``.

:mod:`dpcl.cli.verify` calls :func:`add_cross_check_flag` when it builds its
parser and :func:`run_cross_checks` after verifying; the logic is
:mod:`dpcl.guarantees.cross_check`. Exit code 3 when a stated epsilon is below
dp-accounting's by more than the discretisation error.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any, Sequence

from dpcl.cli.output import print_table
from dpcl.errors import VerificationError


def add_cross_check_flag(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--cross-check",
        action="store_true",
        help=(
            "also recompute each stated epsilon independently with dp-accounting's PLD accountant "
            "(pessimistic, per composition group) and fail (exit 3) when the stated epsilon is below it by more "
            "than the discretisation error"
        ),
    )


def run_cross_checks(args: argparse.Namespace, paths: Sequence[str]) -> tuple[list[dict[str, Any]] | None, int]:
    """Cross-check every certificate when ``--cross-check`` is given.

    Returns the JSON-able reports (None without the flag) and the exit code (0 or 3). Without ``--json`` the
    verdicts are printed as a table per certificate; a certificate with nothing to cross-check gets a line.
    """
    if not getattr(args, "cross_check", False):
        return None, 0
    # lazy import: keeps CLI start-up fast (only this command needs it)
    from dpcl.guarantees.cross_check import cross_check_certificate

    reports = [cross_check_certificate(path) for path in paths]
    if not getattr(args, "json", False):
        for path, report in zip(paths, reports):
            payload: dict[str, Any] = {"cross-check": "pass" if report.passed else "FAIL"}
            if report.message:
                payload["note"] = report.message
            for statement in report.statements:
                payload[statement.name] = statement.detail
            print_table(f"dpcl verify --cross-check {path}", payload)
    for path, report in zip(paths, reports):
        for statement in report.statements:
            if not statement.passed:
                sys.stderr.write(f"dpcl verify: certificate {path} fails the cross-check: {statement.name}: "
                                 f"{statement.detail}\n")
    code = 0 if all(r.passed for r in reports) else VerificationError.exit_code
    return [r.to_dict() for r in reports], code
