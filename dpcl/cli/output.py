"""Shared output helpers: one JSON object on stdout with ``--json``, a readable table otherwise."""

from __future__ import annotations

import argparse
import json
import math
from typing import Any, Mapping

import numpy as np


def add_json_flag(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help="print one JSON object on stdout instead of a table")


#: Options several commands share, as ``(flag, add_argument keywords)``.
DELTA_OPTION = ("--delta", {"required": True, "metavar": "D", "help": "delta, in (0, 1)"})
SAMPLE_RATE_OPTION = ("--sample-rate", {"required": True, "metavar": "Q", "help": "Poisson sampling rate, in (0, 1]"})
STEPS_OPTION = ("--steps", {"required": True, "metavar": "T", "help": "number of noisy steps, integer >= 1"})


def add_command(
    subparsers: argparse._SubParsersAction, name: str, *, help: str, description: str,
    options: list[tuple[str, dict[str, Any]]], handler: Any, time_hint: str | None = None,
) -> argparse.ArgumentParser:
    """A (sub)command: its parser with ``options`` (``(flag, add_argument keywords)``, in order) and ``--json``,
    run by ``handler``; ``time_hint`` is what the time-limit message suggests."""
    parser = subparsers.add_parser(name, help=help, description=description)
    for flag, keywords in options:
        parser.add_argument(flag, **keywords)
    add_json_flag(parser)
    parser.set_defaults(handler=handler, **({} if time_hint is None else {"time_hint": time_hint}))
    return parser


def to_jsonable(value: Any) -> Any:
    """Convert numpy scalars/arrays, tuples, enums and dataclass-likes to JSON types."""
    if isinstance(value, Mapping):
        return {str(k): to_jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [to_jsonable(v) for v in value]
    if isinstance(value, np.ndarray):
        return to_jsonable(value.tolist())
    if isinstance(value, np.generic):
        return value.item()
    if hasattr(value, "value") and type(value).__module__.startswith("dpcl"):
        return value.value
    if isinstance(value, float) and not math.isfinite(value):
        return None  # listed by non_finite_fields; see print_json
    return value


#: Top-level key of a ``--json`` object that lists the fields written as null because they are not finite.
NON_FINITE_KEY = "non_finite"


def non_finite_fields(value: Any, path: str = "") -> dict[str, str]:
    """Dotted key paths of the non-finite floats in ``value``, mapped to ``"inf"``, ``"-inf"`` or ``"nan"``."""
    found: dict[str, str] = {}
    if isinstance(value, Mapping):
        for k, v in value.items():
            found.update(non_finite_fields(v, f"{path}.{k}" if path else str(k)))
    elif isinstance(value, (list, tuple)):
        for i, v in enumerate(value):
            found.update(non_finite_fields(v, f"{path}.{i}" if path else str(i)))
    elif isinstance(value, (float, np.floating)) and not math.isfinite(float(value)):
        found[path] = str(float(value))
    return found


def print_json(payload: Mapping[str, Any]) -> None:
    """One JSON object (strict JSON: no Infinity/NaN tokens).

    A non-finite number (an epsilon too large for a float: a true but vacuous upper bound) is
    written as ``null`` and its key path listed in the top-level ``"non_finite"`` object with
    the value ``"inf"`` (``"-inf"``, ``"nan"``), e.g. ``{"epsilon": null, ..., "non_finite":
    {"epsilon": "inf"}}``. Without non-finite values the key is absent.
    """
    obj = to_jsonable(payload)
    missing = non_finite_fields(payload)
    if missing and isinstance(obj, dict):
        obj[NON_FINITE_KEY] = missing
    print(json.dumps(obj, indent=2, sort_keys=False, allow_nan=False))


def _fmt(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.6g}"
    if isinstance(value, (list, tuple)):
        return ", ".join(_fmt(v) for v in value)
    return str(value)


def print_table(title: str, payload: Mapping[str, Any]) -> None:
    """A two-column key/value table (rich)."""
    from rich.console import Console
    from rich.table import Table

    table = Table(title=title, show_header=True, header_style="bold")
    table.add_column("quantity")
    table.add_column("value", overflow="fold")
    for key, value in payload.items():
        table.add_row(str(key), _fmt(value))
    Console().print(table)


def emit(args: argparse.Namespace, title: str, payload: Mapping[str, Any]) -> None:
    """Print ``payload`` as JSON (``--json``) or as a table."""
    if getattr(args, "json", False):
        print_json(payload)
    else:
        print_table(title, payload)


def emit_lines(args: argparse.Namespace, title: str, payload: Mapping[str, Any]) -> None:
    """:func:`emit` with ``candidates`` and ``notes`` shown one per line in the table view."""
    if not getattr(args, "json", False):
        if "candidates" in payload:
            payload = {**payload, "candidates": "\n".join(f"{k}: {v:.6g}" for k, v in payload["candidates"].items())}
        if "notes" in payload:
            payload = {**payload, "notes": "\n".join(payload["notes"])}
    emit(args, title, payload)
