"""``rdp``: dp-accounting's ``RdpAccountant`` (default orders; its RDP-to-DP conversion).

Gaussian, Laplace and Poisson-subsampled Gaussian events under add/remove (replace-one subsampling and
(epsilon, delta) events are refused). Where dp-accounting drops orders whose series it cannot sum in 1000 terms
(e.g. q = 0.1, z = 1: 1544 at T = 1e5), prv-accountant's RDP accountant (the same series summed to convergence,
as opacus does: 921.6) is evaluated too and the smaller bound reported.
"""

from __future__ import annotations

import contextlib
import logging
import math
import re
import warnings
from dataclasses import dataclass
from typing import Any

import numpy as np

from dpcl.accounting import work as _work
from dpcl.accounting.accountants.base import (
    AccountantBase,
    Mechanisms,
    _raise_refusal,
    collect,
    eps_delta_refusal,
    replace_one_sampling_refusal,
)
from dpcl.accounting.accountants.memo import PLD_MEMO
from dpcl.errors import UnsupportedEventError

__all__ = ["ACCOUNTANT", "RdpAccountant"]


class _CountAndDropLibraryWarnings(logging.Filter):
    """Drops records below ERROR from dp-accounting's absl logger, counting excluded-order warnings."""

    def __init__(self) -> None:
        super().__init__()
        self.excluded_orders = 0
        self.orders: list[float] = []  # the excluded orders, where the message names them

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno >= logging.ERROR:
            return True
        message = record.getMessage()
        if "Excluding this order" in message:
            self.excluded_orders += 1
            match = re.search(r"alpha=([0-9]+(?:\.[0-9]*)?(?:[eE][+-]?[0-9]+)?)", message)
            if match:
                self.orders.append(float(match.group(1)))
        return False


@contextlib.contextmanager
def _dp_accounting_warnings_dropped() -> Any:
    """Silence dp-accounting's absl warnings (below ERROR) for the duration of one call into it.

    Its RDP code logs one warning per order whose log-moment series does not converge (e.g.
    sigma=0.3, q=0.5); the order is then excluded from the minimum over orders, so the bound stays
    a sound upper bound. On extreme DP-SGD settings this floods stderr. The filter sits on the
    ``absl`` logger only, is removed afterwards, and leaves dpcl's own warnings alone; the number
    of excluded orders is returned on the filter so that it can be stated in the result's notes.
    """
    logger = logging.getLogger("absl")
    dropper = _CountAndDropLibraryWarnings()
    logger.addFilter(dropper)
    try:
        yield dropper
    finally:
        logger.removeFilter(dropper)


def _rdp_accountant(mech: Mechanisms) -> Any:
    from dp_accounting import dp_event
    from dp_accounting.rdp import rdp_privacy_accountant

    _raise_refusal(_rdp_like_refusal(mech, "rdp"))
    acc = rdp_privacy_accountant.RdpAccountant()
    if mech.gauss_mus:
        acc.compose(dp_event.GaussianDpEvent(1.0 / mech.gaussian_mu_total()))
    for eps0, count in mech.laplace_groups():
        # dp-accounting takes the noise multiplier b and uses eps0 = 1 / b: step b down one ulp so that
        # the round trip 1 / fl(1 / eps0) can never come out below eps0 (rounding on the safe side)
        acc.compose(dp_event.LaplaceDpEvent(math.nextafter(1.0 / eps0, 0.0)), count)
    for (z, q), count in mech.sampled_groups():
        _work.checkpoint()  # the caller's processor-time budget (dpcl.accounting.work)
        # acc.compose(PoissonSampledDpEvent(q, GaussianDpEvent(z)), count) adds count x the step's RDP at
        # each order; the step's RDP vector is memoised, so that a ledger composing the same steps again
        # (every release, every filter check) does not re-sum dp-accounting's series
        acc._rdp += count * _sampled_step_rdp(z, q)  # noqa: SLF001 (the same update compose makes)
    return acc


def _sampled_step_rdp(z: float, q: float) -> np.ndarray:
    """RDP at dp-accounting's default orders of one Poisson-subsampled Gaussian step (read-only, memoised)."""
    from dp_accounting import dp_event
    from dp_accounting.rdp import rdp_privacy_accountant

    key = ("rdp_step", float(z), float(q))
    hit = PLD_MEMO.get(key)
    if hit is not None:
        return hit
    single = rdp_privacy_accountant.RdpAccountant()
    single.compose(dp_event.PoissonSampledDpEvent(q, dp_event.GaussianDpEvent(z)), 1)
    vector = np.array(single._rdp, dtype=np.float64)  # noqa: SLF001
    vector.setflags(write=False)
    PLD_MEMO.put(key, vector, 1.0)
    return vector


def _rdp_epsilon(mech: Mechanisms, delta: float) -> float:
    if delta not in mech.rdp_cache:
        try:
            with _dp_accounting_warnings_dropped() as dropped, np.errstate(all="ignore"):
                accountant = _rdp_accountant(mech)
                eps = float(accountant.get_epsilon(delta))
        except (ValueError, OverflowError, ZeroDivisionError, FloatingPointError) as exc:
            raise UnsupportedEventError(
                f"dp-accounting's RDP accountant cannot evaluate these events in floating point "
                f"({type(exc).__name__}: {str(exc)[:120]}); use accountant 'pld' or 'prv' (or 'auto')."
            ) from exc
        # the orders dp-accounting dropped hold an infinite RDP in the accountant (its log warnings
        # are not repeated for results it has cached, so they cannot be relied on to find them)
        orders = np.asarray(getattr(accountant, "_orders", dropped.orders), dtype=np.float64)
        values = np.asarray(getattr(accountant, "_rdp", np.zeros_like(orders)), dtype=np.float64)
        excluded = sorted(set(orders[~np.isfinite(values)].tolist()) | set(dropped.orders))
        mech.rdp_excluded_orders = max(mech.rdp_excluded_orders, dropped.excluded_orders, len(excluded))
        if excluded:
            other = _prv_rdp_epsilon(mech, delta, excluded)
            if other < eps:
                eps = other
                mech.rdp_from_prv = True
        mech.rdp_cache[delta] = eps
    return mech.rdp_cache[delta]


def _prv_rdp_epsilon(mech: Mechanisms, delta: float, orders: list[float]) -> float:
    """prv-accountant's RDP accountant on the same events at the ``orders`` dp-accounting dropped.

    dp-accounting gives up on a fractional order after 1000 terms of its series (e.g. q = 0.1,
    z = 1: orders 1.1 to 1.5 are dropped and epsilon at T = 1e5 is 1544); prv-accountant (like
    opacus) sums the same TF-Privacy series until its terms fall below e^-30 and keeps those
    orders (921.6 there). Both are RDP upper bounds of the same mechanisms, and each order's
    conversion to (epsilon, delta) is a valid bound, so the smaller is. Only the dropped orders are
    evaluated here (prv-accountant's series is slow for large noise: ~0.3 s per order at z = 1e6).
    """
    from prv_accountant.other_accountants import RDP

    prvs, counts = _prv_mechanisms(mech)
    try:
        with warnings.catch_warnings(), np.errstate(all="ignore"):
            warnings.simplefilter("ignore")
            eps = float(RDP(prvs=prvs, orders=orders).compute_epsilon(delta, counts)[2])
    except (ValueError, OverflowError, ZeroDivisionError, FloatingPointError):
        return math.inf
    return eps if math.isfinite(eps) and eps >= 0 else math.inf


def _prv_mechanisms(mech: Mechanisms) -> tuple[list[Any], list[int]]:
    """prv-accountant's privacy random variables of ``mech`` and their counts (Gaussians merged into one by
    their total mu, equal Laplace and sampled-Gaussian mechanisms grouped)."""
    from prv_accountant.privacy_random_variables import (
        GaussianMechanism,
        LaplaceMechanism,
        PoissonSubsampledGaussianMechanism,
    )

    prvs: list[Any] = []
    counts: list[int] = []
    if mech.gauss_mus:
        prvs.append(GaussianMechanism(noise_multiplier=1.0 / mech.gaussian_mu_total()))
        counts.append(1)
    for eps0, count in mech.laplace_groups():
        prvs.append(LaplaceMechanism(mu=eps0))
        counts.append(count)
    for (z, q), count in mech.sampled_groups():
        prvs.append(PoissonSubsampledGaussianMechanism(noise_multiplier=z, sampling_probability=q))
        counts.append(count)
    return prvs, counts


def _rdp(mech: Mechanisms, delta: float) -> tuple[float, tuple[str, ...]]:
    eps = _rdp_epsilon(mech, delta)
    notes = ["rdp: dp-accounting RdpAccountant, default orders, its RDP-to-(epsilon, delta) conversion."]
    if mech.rdp_excluded_orders:
        notes.append(
            f"rdp: dp-accounting excluded {mech.rdp_excluded_orders} order(s) whose RDP series did not converge; "
            "the bound is the minimum over the remaining orders (still an upper bound)."
            + (
                " prv-accountant's RDP accountant (the same series summed to convergence) at those orders is "
                "tighter here and is reported."
                if mech.rdp_from_prv
                else " prv-accountant's RDP accountant at those orders was also evaluated and is not tighter."
            )
        )
    return eps, tuple(notes)


def _rdp_like_refusal(mech: Mechanisms, name: str) -> str | None:
    """What ``rdp`` and ``prv`` refuse: (epsilon, delta) events, then replace-one subsampled Gaussians."""
    return eps_delta_refusal(mech, name) or replace_one_sampling_refusal(mech, name)


@dataclass(frozen=True)
class RdpAccountant(AccountantBase):
    """The ``rdp`` accountant (see the module docstring)."""

    name: str = "rdp"
    tolerance: float = 1e-9  # dp-accounting's series and conversion: deterministic to rounding
    for_training: bool = True

    def refusal(self, mech: Mechanisms) -> str | None:
        return _rdp_like_refusal(mech, "rdp")

    def epsilon_of(self, mech: Mechanisms, delta: float) -> tuple[float, tuple[str, ...]]:
        return _rdp(mech, delta)

    def delta_of(self, mech: Mechanisms, epsilon: float) -> float:
        with _dp_accounting_warnings_dropped(), np.errstate(all="ignore"):
            return float(_rdp_accountant(mech).get_delta(epsilon))

    def cost(self, events: Any) -> float:
        return 1.0 + 1000.0 * len(collect(events).sampled_groups())  # a series of <= 1000 terms per step kind


#: The instance dpcl registers (:mod:`~dpcl.accounting.accountants.registry`).
ACCOUNTANT = RdpAccountant()
