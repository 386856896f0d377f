"""Accountants: turn privacy events into one (epsilon, delta) upper bound.

``compute_epsilon(events, delta, accountant)`` composes the events adaptively
and returns an :class:`AccountingResult` naming epsilon, delta, the neighbouring
relation, the privacy unit, the accountant, the candidates it compared and the
assumptions/settings behind the number.

Each accountant is one module of this package holding an :class:`Accountant` (``name``, ``supports``,
``epsilon``, ``delta``, ``tolerance`` for certificate verification, ``cost``) and is found by name in
one registry (:mod:`~dpcl.accounting.accountants.registry`), which a package extends through the
entry-point group ``dpcl.accountants``:

:mod:`~.exact`
    Compositions of Gaussian mechanisms (mu = sqrt(sum mu_i^2), Dong, Roth & Su 2022, Cor. 3.3; epsilon the
    root of Balle & Wang 2018, Thm 8) and a single Laplace mechanism. Nothing else.
:mod:`~.basic` / :mod:`~.advanced`
    Every event type: sums (Dwork & Roth 2014, Thm 3.16) / Kairouz, Oh & Viswanath (2017) Thm 3.5, with a
    delta share for each event with a privacy profile and Poisson subsampling amplified.
:mod:`~.rdp`
    dp-accounting's ``RdpAccountant`` (and prv-accountant's RDP series at the orders dp-accounting drops).
:mod:`~.pld`
    dp-accounting's pessimistic privacy loss distributions, sized before anything is allocated.
:mod:`~.prv`
    prv-accountant's *upper* bound, never its estimate.
:mod:`~.auto`
    Exact when it applies; otherwise the tightest of the accountants that support the events (its PLD refined
    until it converges); the winner is named and every candidate listed.

Every number these computations read is in :mod:`~.settings`; ``dpcl.accounting.accountants.NAME`` reads and
sets it there (tests scale the limits that way).

Neighbouring relations. A Gaussian or Laplace event states its sensitivity
*under its own relation*, so its privacy curve is the same shift-by-sensitivity
curve for add/remove and replace-one; it is handed to the libraries as a shift
of 1 with noise sigma/Delta (scale b/Delta). A Poisson-subsampled Gaussian's
noise multiplier is relative to the clipping norm C: under add/remove this is
dp-accounting's/prv-accountant's ADD_OR_REMOVE_ONE; under replace-one (a record
changes, difference up to 2C) only dp-accounting's PLD has a sound analysis
(its REPLACE_ONE mixture pair); rdp, prv, basic and advanced refuse it.
(epsilon, delta) events compose only by basic/advanced.
"""

from __future__ import annotations

import sys
import types
from typing import Any

from dpcl.accounting.accountants import settings
from dpcl.accounting.accountants import advanced as _advanced_module
from dpcl.accounting.accountants import auto as _auto_module
from dpcl.accounting.accountants import basic as _basic_module
from dpcl.accounting.accountants import exact as _exact_module
from dpcl.accounting.accountants import pld as _pld_module
from dpcl.accounting.accountants import prv as _prv_module
from dpcl.accounting.accountants import rdp as _rdp_module
from dpcl.accounting.accountants._pld_grid import PLD_LIBRARY_FAILURES
from dpcl.accounting.accountants.base import Accountant, AccountantBase, AccountingResult, Mechanisms, collect
from dpcl.accounting.accountants.compute import compute_epsilon, epsilon_for, settings_key
from dpcl.accounting.accountants.memo import EPSILON_MEMO, PLD_MEMO, clear_memo
from dpcl.accounting.accountants.pld import check_pld_fits
from dpcl.accounting.accountants.registry import (
    ENTRY_POINT_GROUP,
    TRAINING_CHOICES,
    accountant_names,
    get_accountant,
    register_accountant,
    registered_accountants,
    training_accountant_names,
    unregister_accountant,
)

__all__ = [
    "ACCOUNTANT_NAMES",
    "Accountant",
    "AccountantBase",
    "AccountingResult",
    "AUTO_PLD_RESOLUTION",
    "AUTO_PLD_TOLERANCE",
    "AUTO_PLD_WORK_BUDGET_POINTS",
    "ENTRY_POINT_GROUP",
    "EPSILON_MEMO",
    "Mechanisms",
    "PLD_LIBRARY_FAILURES",
    "PLD_MAX_GRID_POINTS",
    "PLD_MEMO",
    "PLD_VALUE_DISCRETIZATION_INTERVAL",
    "PRV_RELATIVE_EPS_ERROR",
    "TRAINING_CHOICES",
    "accountant_names",
    "check_pld_fits",
    "clear_memo",
    "collect",
    "compute_epsilon",
    "epsilon_for",
    "get_accountant",
    "register_accountant",
    "registered_accountants",
    "settings_key",
    "training_accountant_names",
    "unregister_accountant",
]

#: The built-in accountants, registered in this order (the order the config and the CLI list them in).
BUILTIN_ACCOUNTANTS = tuple(
    register_accountant(module.ACCOUNTANT, builtin=True)
    for module in (_exact_module, _basic_module, _advanced_module, _prv_module, _pld_module, _rdp_module, _auto_module)
)
#: The names of the built-in accountants (:func:`accountant_names` adds those packages register).
ACCOUNTANT_NAMES = tuple(a.name for a in BUILTIN_ACCOUNTANTS)


class _Package(types.ModuleType):
    """This package, whose attributes named like a setting are properties reading and writing :mod:`.settings`:
    setting one here (or monkeypatching it) changes what the accountants read, and the memo keys with it."""


def _forward(name: str) -> property:
    def read(_: Any) -> Any:
        return getattr(settings, name)

    def write(_: Any, value: Any) -> None:
        setattr(settings, name, value)

    return property(read, write, doc=f"``settings.{name}``")


for _name in settings.names():
    setattr(_Package, _name, _forward(_name))
del _name
sys.modules[__name__].__class__ = _Package
