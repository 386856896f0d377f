"""The ``dpcl`` command line.

Each command lives in its own module under :mod:`dpcl.cli` and exposes
``register(subparsers)``; the module adds its sub-parser and sets
``handler=<function(args) -> int>``. :func:`main` maps dpcl's typed errors to
exit codes without a traceback: 2 for invalid input, 3 for a privacy violation
or failed verification.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from typing import Sequence

from dpcl import __version__
from dpcl.errors import DpclError

#: Command modules, in the order they appear in ``dpcl --help``.
COMMAND_MODULES = (
    "demo",
    "run",
    "audit",
    "verify",
    "calibrate",
    "epsilon",
    "audit_mechanism",
)


class _OneLineErrorParser(argparse.ArgumentParser):
    """argparse parser whose usage errors are one line on stderr and exit code 2."""

    def error(self, message: str) -> None:  # type: ignore[override]
        sys.stderr.write(f"{self.prog}: error: {message}\n")
        raise SystemExit(2)


def build_parser() -> argparse.ArgumentParser:
    parser = _OneLineErrorParser(
        prog="dpcl",
        description="Checkable differential privacy for continual learning.",
    )
    parser.add_argument("--version", action="version", version=f"dpcl {__version__}")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_OneLineErrorParser)
    for name in COMMAND_MODULES:
        try:
            module = importlib.import_module(f"dpcl.cli.{name}")
        except ModuleNotFoundError as exc:  # a command whose module is not in this build
            if exc.name != f"dpcl.cli.{name}":
                raise
            continue
        module.register(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if getattr(args, "handler", None) is None:
        parser.print_help(sys.stderr)
        return 2
    try:
        return int(args.handler(args) or 0)
    except DpclError as exc:
        sys.stderr.write(f"dpcl {args.command}: error: {exc}\n")
        return exc.exit_code
    except KeyboardInterrupt:
        sys.stderr.write("dpcl: interrupted\n")
        return 130


def entry_point() -> None:  # pragma: no cover - thin wrapper
    raise SystemExit(main())
