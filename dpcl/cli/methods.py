"""``dpcl methods [--details] [--json]``: the training methods this installation knows, with their config keys.

Lists the built-in methods and the plugins installed through the
``dpcl.methods`` entry-point group (:mod:`dpcl.guarantees.method_registry`),
one line each by default (name, origin, what it does, its ``[method]`` keys,
required ones marked ``*``); ``--details`` prints every key's type, default and
help, and ``--json`` everything -- read from the method specs, so nothing here
imports torch. A plugin that is invalid or shadows a built-in name makes the
command exit 2 naming it.
"""

from __future__ import annotations

import argparse
from typing import Any

from dpcl.cli.output import add_json_flag, print_json


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "methods",
        help="list the training methods (built-in and installed plugins) and their [method] keys",
        description=(
            "List every training method a config can name in [method] name: the built-in ones and the plugins "
            "installed through the 'dpcl.methods' entry-point group, with the keys of their [method] section "
            "(name, type, default, help). Exit 2 when an installed plugin is invalid or reuses a built-in name."
        ),
    )
    parser.add_argument("--details", action="store_true",
                        help="one table per method: every [method] key with its type, default and help")
    add_json_flag(parser)
    parser.set_defaults(handler=run_methods)


def _origin(method: dict[str, Any]) -> str:
    if method["source"] == "built-in":
        return "built-in"
    return f"plugin {method['distribution']} {method['version'] or ''}".rstrip()


def _summary(method: dict[str, Any]) -> str:
    """The spec's one-line ``summary``, else the first paragraph of its class docstring."""
    # lazy import: keeps CLI start-up fast (only this command needs it)
    from dpcl.guarantees.method_registry import REGISTRY

    spec = REGISTRY.spec(method["name"])
    if isinstance(getattr(spec, "summary", None), str) and spec.summary:
        return spec.summary
    doc = (type(spec).__doc__ or "").strip()
    return " ".join(doc.split("\n\n")[0].split()).rstrip(".") or "no description"


def _type_name(kind: Any) -> str:
    kinds = kind if isinstance(kind, tuple) else (kind,)
    return " | ".join(getattr(k, "__name__", str(k)) for k in kinds)


def describe_methods() -> list[dict[str, Any]]:
    """One JSON-able description per registered method (specs only: no method class is imported)."""
    # lazy import: keeps CLI start-up fast (only this command needs it)
    from dpcl.guarantees.method_registry import REGISTRY
    from dpcl.guarantees.method_schema import REQUIRED

    out = []
    for name in REGISTRY.names():
        entry = REGISTRY.entry(name)
        spec = REGISTRY.spec(name)
        class_path = REGISTRY.class_path(name)
        out.append(
            {
                "name": name,
                "source": entry.source,
                "distribution": entry.distribution or None,
                "version": entry.version or None,
                "spec": entry.spec_path,
                "method_class": class_path if isinstance(class_path, str)
                else f"{class_path.__module__}:{class_path.__qualname__}",
                "reuses_past_tasks": bool(spec.reuses_past_tasks),
                "keys": [
                    {
                        "name": key.name,
                        "type": _type_name(key.type),
                        "required": key.default is REQUIRED,
                        "default": None if key.default is REQUIRED else key.default,
                        "help": key.help,
                    }
                    for key in spec.keys
                ],
            }
        )
    return out


def run_methods(args: argparse.Namespace) -> int:
    methods = describe_methods()
    if getattr(args, "json", False):
        print_json({"methods": methods})
        return 0
    if not getattr(args, "details", False):
        for method in methods:
            keys = ", ".join(k["name"] + ("*" if k["required"] else "") for k in method["keys"]) or "none"
            print(f"{method['name']} ({_origin(method)}): {_summary(method)}. keys: {keys}")
        print(f"{len(methods)} methods (* required); name one in a config's [method] name; every key's type, default "
              "and help: dpcl methods --details (docs/plugins.md to add one).")
        return 0
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    console = Console()
    for method in methods:
        table = Table(title=escape(f"{method['name']} ({_origin(method)}; {method['method_class']})"),
                      header_style="bold")
        for column in ("key", "type", "default", "help"):
            table.add_column(column, overflow="fold")
        for key in method["keys"]:
            default = "required" if key["required"] else repr(key["default"])
            table.add_row(escape(key["name"]), escape(key["type"]), escape(default), escape(key["help"]))
        if not method["keys"]:
            table.add_row("(none)", "", "", "")
        console.print(table)
    console.print(f"{len(methods)} methods; name one in a config's [method] name (see docs/plugins.md to add one).")
    return 0
