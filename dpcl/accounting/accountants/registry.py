"""The one registry of accountants: the built-in ones and those packages add through entry points.

Everything that names an accountant reads it from here: :func:`~dpcl.accounting.accountants.compute_epsilon`,
the config's ``[privacy] accountant`` (:func:`training_accountant_names`), the CLI's ``--accountant``
(:data:`TRAINING_CHOICES`), and certificate verification (an accountant's ``tolerance``; a certificate naming
an accountant that is not registered fails naming it).

Plugins. A package adds an accountant with an entry point in the group ``dpcl.accountants`` whose name is the
accountant's ``name`` and whose value names the accountant *object* (an :class:`~.base.Accountant`, usually an
:class:`~.base.AccountantBase` subclass instance), e.g. in its ``pyproject.toml``::

    [project.entry-points."dpcl.accountants"]
    toy = "dpcl_toy_accountant:ACCOUNTANT"

Installed plugins are discovered the first time a name is not found among those registered (or when every
name is listed), never at import. In-process, :func:`register_accountant` does the same. A plugin can never
replace a built-in accountant (the numbers of existing certificates depend on them), nor share its name with
another: :class:`~dpcl.errors.InvalidParameterError` names both and what to change.
"""

from __future__ import annotations

import math
import threading
from typing import Any, Iterator, Mapping

from dpcl.accounting.accountants.base import Accountant
from dpcl.errors import InvalidParameterError

__all__ = [
    "ENTRY_POINT_GROUP",
    "TOLERANCES",
    "TRAINING_CHOICES",
    "accountant_names",
    "get_accountant",
    "register_accountant",
    "registered_accountants",
    "training_accountant_names",
    "unregister_accountant",
]

#: Entry-point group in which packages register accountants.
ENTRY_POINT_GROUP = "dpcl.accountants"

_REGISTRY: dict[str, Any] = {}
_BUILTIN: set[str] = set()
_LOCK = threading.RLock()
_discovered = False


def _check(accountant: Any, where: str) -> Any:
    missing = [a for a in ("name", "tolerance", "for_training", "supports", "epsilon", "delta", "cost") if not hasattr(accountant, a)]
    if missing:
        raise InvalidParameterError(
            f"{where} is not an accountant: it lacks {', '.join(missing)} (see dpcl.accounting.Accountant; "
            "dpcl.accounting.AccountantBase implements all but the numbers)."
        )
    name = accountant.name
    if not (isinstance(name, str) and name.isidentifier() and "+" not in name):
        raise InvalidParameterError(f"{where}: an accountant's name must be an identifier; got {name!r}.")
    tolerance = accountant.tolerance
    if not (isinstance(tolerance, float) and math.isfinite(tolerance) and 0.0 <= tolerance < 1.0):
        raise InvalidParameterError(
            f"{where}: accountant {name!r} needs a tolerance (relative, a float in [0, 1)) for certificate "
            f"verification; got {tolerance!r}."
        )
    try:
        hash(accountant)
    except TypeError as exc:
        raise InvalidParameterError(
            f"{where}: accountant {name!r} must be hashable (the epsilon memo is keyed on it); make it a frozen "
            "dataclass."
        ) from exc
    return accountant


def register_accountant(accountant: Accountant, *, builtin: bool = False) -> Accountant:
    """Make ``accountant`` available under ``accountant.name`` in this process and return it.

    Refuses an object that is not an accountant, a name already registered (a built-in, or another plugin's),
    and a tolerance that verification cannot use."""
    with _LOCK:
        _check(accountant, f"accountant {getattr(accountant, 'name', accountant)!r}")
        name = accountant.name
        if name in _REGISTRY and _REGISTRY[name] is not accountant:
            what = "a built-in accountant" if name in _BUILTIN else "already registered"
            raise InvalidParameterError(
                f"an accountant named {name!r} is {what}; give the new one another name (a plugin cannot replace an "
                "accountant that certificates already name)."
            )
        _REGISTRY[name] = accountant
        if builtin:
            _BUILTIN.add(name)
    return accountant


def unregister_accountant(name: str) -> None:
    """Remove a registered plugin accountant (built-ins stay)."""
    with _LOCK:
        if name in _BUILTIN:
            raise InvalidParameterError(f"{name!r} is a built-in accountant and cannot be removed.")
        _REGISTRY.pop(name, None)


def _discover() -> None:
    """Register the accountants of installed entry points (once per process)."""
    global _discovered
    with _LOCK:
        if _discovered:
            return
        _discovered = True
        import importlib.metadata  # here, not at import: ~0.1 s of CLI start-up

        seen: set[tuple[str, str]] = set()
        for ep in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP):
            if (ep.name, ep.value) in seen:  # the same distribution found twice on sys.path
                continue
            seen.add((ep.name, ep.value))
            dist = getattr(ep, "dist", None)
            where = f"entry point {ep.name!r} = {ep.value!r} ({dist.metadata['Name'] if dist is not None else 'unknown'})"
            try:
                accountant = ep.load()
            except Exception as exc:  # noqa: BLE001 (a broken plugin is named, not hidden)
                raise InvalidParameterError(f"{where} of group {ENTRY_POINT_GROUP!r} cannot be loaded: {exc}") from exc
            _check(accountant, where)
            if accountant.name != ep.name:
                raise InvalidParameterError(f"{where}: the accountant's name is {accountant.name!r}; they must agree.")
            if _REGISTRY.get(ep.name) is not accountant:
                register_accountant(accountant)


def refresh() -> None:
    """Look for installed plugins again (after installing one in this process)."""
    global _discovered
    with _LOCK:
        _discovered = False


def get_accountant(name: Any) -> Accountant:
    """The accountant registered as ``name``; :class:`~dpcl.errors.InvalidParameterError` naming the registered
    ones where there is none."""
    hit = _REGISTRY.get(name) if isinstance(name, str) else None
    if hit is None and isinstance(name, str):
        _discover()
        hit = _REGISTRY.get(name)
    if hit is None:
        raise InvalidParameterError(
            f"accountant must be one of {', '.join(accountant_names())}; got {name!r}, which is not registered (an "
            f"accountant is added by installing a package that registers it in the entry-point group "
            f"{ENTRY_POINT_GROUP!r}, or with dpcl.accounting.accountants.register_accountant)."
        )
    return hit


def registered_accountants() -> tuple[Accountant, ...]:
    """Every registered accountant (built-ins first, in registration order), installed plugins included."""
    _discover()
    return tuple(_REGISTRY.values())


def accountant_names() -> tuple[str, ...]:
    """The names of :func:`registered_accountants`."""
    return tuple(a.name for a in registered_accountants())


def training_accountant_names() -> tuple[str, ...]:
    """The accountants offered for DP-SGD training (``for_training``): the config's ``[privacy] accountant``
    and the CLI's ``--accountant`` choices."""
    return tuple(a.name for a in registered_accountants() if a.for_training)


class _Choices:
    """:func:`training_accountant_names` as argparse ``choices``, read when an option is parsed or help is
    shown, so that building the CLI's parser neither imports plugins nor scans entry points."""

    def __contains__(self, name: object) -> bool:
        known = _REGISTRY.get(name) if isinstance(name, str) else None
        if known is not None:
            return bool(known.for_training)
        return name in training_accountant_names()

    def __iter__(self) -> Iterator[str]:
        return iter(training_accountant_names())

    def __len__(self) -> int:
        return len(training_accountant_names())


#: The CLI's ``--accountant`` choices (see :class:`_Choices`).
TRAINING_CHOICES = _Choices()


class _Tolerances(Mapping[str, float]):
    """Read-only view: accountant name -> its ``tolerance`` (what certificate verification allows between a
    stated and a recomputed epsilon), over every registered accountant."""

    def __getitem__(self, name: str) -> float:
        known = _REGISTRY.get(name) if isinstance(name, str) else None
        if known is None:
            if name not in accountant_names():
                raise KeyError(name)
            known = _REGISTRY[name]
        return float(known.tolerance)

    def __iter__(self) -> Iterator[str]:
        return iter(accountant_names())

    def __len__(self) -> int:
        return len(accountant_names())


#: accountant name -> relative tolerance of certificate verification (see :class:`_Tolerances`).
TOLERANCES = _Tolerances()
