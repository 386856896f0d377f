"""A limit on the processor time of the commands that compute (every command but ``run`` and ``demo``, which train).

Issue 18: every command answers within 60 s on this machine or refuses. Most inputs that would take longer are
refused up front with the largest value handled (:mod:`dpcl.cli.numbers`, :mod:`dpcl.accounting.validation`),
but how long an accountant or a calibration takes depends on the combination of its inputs (a tiny target epsilon
at a tiny sampling rate, a tiny noise multiplier with many steps) and on the machine, so no set of per-option
bounds both keeps every valid question answerable and every answer fast. This module is the backstop: a command
that has used :data:`DEFAULT_TIME_LIMIT_S` seconds of processor time (``DPCL_TIME_LIMIT_S`` in the environment;
``0`` waits as long as it takes) stops and refuses with exit code 2 and one line naming its inputs and what to
change. Nothing is printed before that line (commands print their answer only once it is complete).

Processor time, not wall-clock time: on an idle machine the two are about equal for these single-threaded
computations, but on a loaded one wall-clock time grows with everyone else's work (``dpcl audit
dpcl/configs/naive.toml`` took 50 s of wall-clock time for 8 s of processor time at a load of 10 on 2 cores), and
whether a question is answered must not depend on that. The limit is an ``ITIMER_PROF`` timer (``SIGPROF``), so it
only applies where signals can be set: in the main thread of a process on a POSIX system (the ``dpcl`` command
itself); elsewhere the command runs without one. The exception it raises
derives from :class:`BaseException`, like :class:`KeyboardInterrupt`, so that no ``except Exception`` in an
accountant's fallback chain turns it into "try the next accountant"; it is re-raised every second until the
command gives up.
"""

from __future__ import annotations

import argparse
import contextlib
import math
import os
import signal
import threading
from types import FrameType
from typing import Iterator

from dpcl.errors import InvalidParameterError

#: Seconds of processor time a command gets before it refuses (under the 60 s promised, leaving time to start the
#: interpreter and print).
DEFAULT_TIME_LIMIT_S = 40.0
#: Environment variable that sets the limit in seconds (0: no limit).
TIME_LIMIT_VARIABLE = "DPCL_TIME_LIMIT_S"
#: Commands that train and are not limited.
UNLIMITED_COMMANDS = frozenset({"run", "demo"})
#: Options that do not describe the question asked.
_NOT_INPUTS = frozenset({"handler", "command", "json", "quiet", "time_hint", "mechanism", "force"})


class CommandTimeLimitExceeded(BaseException):
    """Raised in the main thread when the command's processor time is up (a BaseException: see the module docstring);
    ``args[0]`` is the limit in seconds."""


def configured_limit() -> float:
    """The limit in seconds from ``DPCL_TIME_LIMIT_S`` (default :data:`DEFAULT_TIME_LIMIT_S`); 0 means none."""
    text = os.environ.get(TIME_LIMIT_VARIABLE)
    if text is None or not text.strip():
        return DEFAULT_TIME_LIMIT_S
    try:
        seconds = float(text)
    except ValueError:
        seconds = math.nan
    if not (math.isfinite(seconds) and seconds >= 0):
        raise InvalidParameterError(
            f"{TIME_LIMIT_VARIABLE} must be a number of seconds >= 0 (0: no limit), got {text!r}."
        )
    return seconds


def describe_inputs(args: argparse.Namespace) -> str:
    """The options given, as ``--name value`` pairs, for the refusal message."""
    parts = []
    for name, value in vars(args).items():
        if name in _NOT_INPUTS or value is None or value is False or callable(value):
            continue
        shown = " ".join(map(str, value)) if isinstance(value, (list, tuple)) else str(value)
        parts.append(f"--{name.replace('_', '-')} {shown[:80]}")
    return ", ".join(parts) or "these inputs"


def refusal_message(args: argparse.Namespace, seconds: float) -> str:
    hint = getattr(args, "time_hint", None) or "choose less extreme values"
    return (
        f"no answer within {seconds:g} s of processor time for {describe_inputs(args)}: {hint}; or set "
        f"{TIME_LIMIT_VARIABLE}=0 to wait as long as it takes."
    )


def _inside_import(frame: FrameType | None) -> bool:
    """Whether ``frame`` runs inside an ``import`` (a frame of importlib's bootstrap on its stack).

    The limit is not raised there: an exception thrown into a module's top-level code from a signal
    handler leaves that package half initialised (a later import of it in the same process then fails
    with a NameError inside the package, as seen with scipy under load). The interval timer fires again
    every second, so the refusal comes right after the import ends.
    """
    while frame is not None:
        if frame.f_code.co_filename.startswith("<frozen importlib"):
            return True
        frame = frame.f_back
    return False


@contextlib.contextmanager
def time_limit(command: str | None) -> Iterator[float]:
    """Run the body under the configured limit (none for ``run``/``demo``, outside the main thread, or without
    ``SIGPROF``); yields the limit in seconds (0: none)."""
    seconds = 0.0 if command in UNLIMITED_COMMANDS else configured_limit()
    usable = (seconds > 0 and hasattr(signal, "setitimer") and hasattr(signal, "SIGPROF")
              and threading.current_thread() is threading.main_thread())
    if not usable:
        yield 0.0
        return

    def on_alarm(signum: int, frame: FrameType | None) -> None:
        if _inside_import(frame):  # the timer fires again within a second, after the import
            return
        raise CommandTimeLimitExceeded(seconds)

    previous = signal.signal(signal.SIGPROF, on_alarm)
    signal.setitimer(signal.ITIMER_PROF, seconds, 1.0)  # then every second, should a handler swallow it
    try:
        yield seconds
    finally:
        signal.setitimer(signal.ITIMER_PROF, 0.0)
        signal.signal(signal.SIGPROF, previous)
