"""The ``dpcl`` command line.

Each command lives in its own module under :mod:`dpcl.cli` and exposes
``register(subparsers)``; the module adds its sub-parser and sets
``handler=<function(args) -> int>``. :func:`main` maps dpcl's typed errors to
exit codes without a traceback: 2 for invalid input, 3 for a privacy violation
or failed verification. A file-system error no command turned into a typed
error (a path that cannot be read or written) is still one line on stderr and
exit code 2; output piped into a reader that stops early (``dpcl ... | head``)
ends quietly with exit code 141 (128 + SIGPIPE), as other command-line tools do.
Every command but ``run`` and ``demo`` answers within a processor-time limit or refuses
with exit code 2 (:mod:`dpcl.cli.time_limit`).
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
import warnings
from typing import Sequence

from dpcl._threads import prefer_sleeping_threads
from dpcl._version import __version__
from dpcl.cli.time_limit import CommandTimeLimitExceeded, refusal_message, time_limit
from dpcl.errors import DpclError

#: Command modules, in the order they appear in ``dpcl --help``.
COMMAND_MODULES = (
    "demo",
    "run",
    "audit",
    "verify",
    "report",
    "methods",
    "calibrate",
    "epsilon",
    "audit_mechanism",
    "audit_run",
    "keygen",
    "sign",
)


#: Longest refusal message printed; a longer one (a message that quotes a huge value back) keeps its start and end.
MAX_MESSAGE_CHARACTERS = 2000


def one_line(message: str) -> str:
    """A refusal as one line of at most :data:`MAX_MESSAGE_CHARACTERS` characters: line breaks in it (from a quoted
    argument or file name) are written as ``\\n``, and the middle of an overlong message is cut."""
    text = str(message).replace("\r", "\\r").replace("\n", "\\n")
    if len(text) > MAX_MESSAGE_CHARACTERS:
        cut = len(text) - MAX_MESSAGE_CHARACTERS + 200
        head, tail = text[: MAX_MESSAGE_CHARACTERS - 600], text[-400:]
        text = f"{head} ... ({cut} characters cut) ... {tail}"
    return text


class UsageError(SystemExit):
    """A command-line usage error (exit code 2), already reported on stderr; carries the message for ``--json``."""

    def __init__(self, message: str):
        super().__init__(2)
        self.message = message


class _OneLineErrorParser(argparse.ArgumentParser):
    """argparse parser whose usage errors are one line on stderr and exit code 2."""

    def error(self, message: str) -> None:  # type: ignore[override]
        message = one_line(f"{self.prog}: error: {message}")
        sys.stderr.write(f"{message}\n")
        raise UsageError(message)


def _asks_for_json(argv: Sequence[str]) -> bool:
    """``--json`` among the options (before a ``--`` that ends them)."""
    for token in argv:
        if token == "--":
            return False
        if token == "--json":
            return True
    return False


def _print_json_error(message: str, code: int) -> None:
    """Under ``--json`` a refusal is one JSON object on stdout too: ``{"error": ..., "exit_code": ...}``."""
    import json

    try:
        print(json.dumps({"error": message, "exit_code": code}))
        sys.stdout.flush()
    except (BrokenPipeError, ValueError, OSError):  # nobody reads stdout any more
        pass


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
    parser._dpcl_commands = tuple(subparsers.choices)  # type: ignore[attr-defined]
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run one command; returns its exit code. Every refusal (exit 2 or 3 from an error) is one line on stderr
    and, under ``--json``, also one JSON object ``{"error": MESSAGE, "exit_code": CODE}`` on stdout."""
    prefer_sleeping_threads()  # before any command imports torch: idle OpenMP threads sleep (dpcl.runner.threads)
    argv = list(sys.argv[1:] if argv is None else argv)
    as_json = _asks_for_json(argv)
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except UsageError as exc:
        if as_json:
            _print_json_error(exc.message, 2)
        raise
    if getattr(args, "handler", None) is None:
        commands = ", ".join(sorted(getattr(parser, "_dpcl_commands", ())))
        message = f"a command is required ({commands}); see dpcl --help."
        sys.stderr.write(f"dpcl: error: {message}\n")
        if as_json:
            _print_json_error(message, 2)
        return 2
    try:
        with time_limit(args.command), warnings.catch_warnings():
            # numpy's floating-point RuntimeWarnings (an intermediate that overflows, which dpcl then checks: every
            # number it reports is checked finite and sound, or refused) say nothing a user can act on
            warnings.simplefilter("ignore", RuntimeWarning)
            code = int(args.handler(args) or 0)
            sys.stdout.flush()  # a closed pipe shows here, not in the interpreter's final flush
        return code
    except CommandTimeLimitExceeded as exc:  # a computation past its time (dpcl.cli.time_limit): a refusal
        message = one_line(refusal_message(args, exc.args[0]))
        sys.stderr.write(f"dpcl {args.command}: error: {message}\n")
        if as_json:
            _print_json_error(message, 2)
        return 2
    except DpclError as exc:
        message = one_line(str(exc))
        sys.stderr.write(f"dpcl {args.command}: error: {message}\n")
        if as_json:
            _print_json_error(message, exc.exit_code)
        return exc.exit_code
    except BrokenPipeError:
        return _stdout_closed()
    except OSError as exc:  # a path that cannot be read or written, not caught where it was used
        where = f": {exc.filename!r}" if getattr(exc, "filename", None) else ""
        message = one_line(f"{exc.strerror or exc}{where}.")
        sys.stderr.write(f"dpcl {args.command}: error: {message}\n")
        if as_json:
            _print_json_error(message, 2)
        return 2
    except KeyboardInterrupt:
        sys.stderr.write("dpcl: interrupted\n")
        return 130


#: Exit code when the reader of stdout went away (128 + SIGPIPE).
BROKEN_PIPE_EXIT = 141


def _stdout_closed() -> int:
    """The reader of stdout closed the pipe: stop quietly; point stdout at /dev/null so the
    interpreter's final flush does not raise again."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):  # stdout already closed or not a real file
        pass
    return BROKEN_PIPE_EXIT


def entry_point() -> None:  # pragma: no cover - thin wrapper
    raise SystemExit(main())
