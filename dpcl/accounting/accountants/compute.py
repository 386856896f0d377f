"""``compute_epsilon``: look the accountant up in the registry, collect the events, and memoise the result."""

from __future__ import annotations

import dataclasses
from typing import Any, Sequence

from dpcl.accounting import work as _work
from dpcl.accounting.accountants import settings
from dpcl.accounting.accountants.auto import _auto
from dpcl.accounting.accountants.base import AccountingResult, Mechanisms, accounting_result, collect
from dpcl.accounting.accountants.memo import EPSILON_MEMO, _mech_key
from dpcl.accounting.accountants.registry import get_accountant
from dpcl.accounting.events import PrivacyEvent
from dpcl.accounting.validation import check_delta_scalar

__all__ = ["compute_epsilon", "epsilon_for", "settings_key"]


def _check_accountant(accountant: Any) -> str:
    """``accountant`` if it names a registered accountant (else the registry's refusal naming them)."""
    return get_accountant(accountant).name


def settings_key() -> tuple[Any, ...]:
    """The current value of every setting an accountant's computation reads (:mod:`.settings`; part of each
    memo key)."""
    return settings.snapshot()


def _memo_key(accountant: Any, mech: Mechanisms, delta: float, *options: Any) -> tuple[Any, ...]:
    """The memo key: the accountant object itself (its type and parameters: a frozen dataclass compares by
    value), delta, the options, the collected events and the settings."""
    return (type(accountant), accountant, float(delta), options, _mech_key(mech), settings_key())


def compute_epsilon(
    events: PrivacyEvent | Sequence[PrivacyEvent],
    delta: float,
    accountant: str = "auto",
) -> AccountingResult:
    """Upper bound on epsilon at ``delta`` for the adaptive composition of ``events``.

    ``accountant`` is the name of a registered accountant (:func:`~.registry.accountant_names`: the built-in
    :data:`~dpcl.accounting.accountants.ACCOUNTANT_NAMES` and any a package added; see the package docstring).
    A named accountant that cannot soundly handle the events raises
    :class:`~dpcl.errors.UnsupportedEventError` saying which to use instead.

    Results are memoised in this process (:data:`EPSILON_MEMO`), keyed on the canonical form of the
    events, delta, the accountant object and every setting: an audit, the run's plan, its ledger and
    its certificates' self-verification that ask for the same epsilon compute it once.

    A computation that has spent :data:`~dpcl.accounting.work.EPSILON_TIME_BUDGET_S` seconds of processor time
    (many distinct mechanisms, each its own PLD or RDP series) is refused with
    :class:`~dpcl.errors.WorkLimitError` (see :mod:`dpcl.accounting.work`).
    """
    acc = get_accountant(accountant)
    name = acc.name
    delta = check_delta_scalar("delta", delta)
    mech = collect(events)
    key = _memo_key(acc, mech, delta)
    cached = EPSILON_MEMO.get(key)
    if cached is not None:
        return dataclasses.replace(cached)
    base = dict(delta=delta, adjacency=mech.adjacency.value, unit=mech.unit)
    with _work.epsilon_budget(mech.describe(), name, delta):  # issue 18: an answer within 60 s, or a refusal
        result_of = getattr(acc, "result", None)
        result = result_of(mech, delta, base) if result_of is not None else accounting_result(acc, mech, delta, base)
    EPSILON_MEMO.put(key, result)
    return dataclasses.replace(result)


def _auto_epsilon(
    events: PrivacyEvent | Sequence[PrivacyEvent],
    delta: float,
    *,
    pld_interval: float | None = None,
    tolerance: float = settings.AUTO_PLD_TOLERANCE,
) -> tuple[AccountingResult, float | None]:
    """``compute_epsilon(events, delta, "auto")`` with calibration's knobs; also returns the PLD interval used."""
    delta = check_delta_scalar("delta", delta)
    mech = collect(events)
    key = _memo_key("auto-options", mech, delta, pld_interval, tolerance)
    cached = EPSILON_MEMO.get(key)
    if cached is not None:
        return dataclasses.replace(cached[0]), cached[1]
    base = dict(delta=delta, adjacency=mech.adjacency.value, unit=mech.unit)
    used: dict[str, float] = {}
    result = _auto(mech, delta, base, pld_interval=pld_interval, tolerance=tolerance, used=used)
    EPSILON_MEMO.put(key, (result, used.get("pld_interval")))
    return dataclasses.replace(result), used.get("pld_interval")


def epsilon_for(events: PrivacyEvent | Sequence[PrivacyEvent], delta: float, accountant: str = "auto") -> float:
    """Shorthand: ``compute_epsilon(events, delta, accountant).epsilon``."""
    return compute_epsilon(events, delta, accountant).epsilon
