"""``advanced``: every event type; Kairouz, Oh & Viswanath (2017) Thm 3.5 (heterogeneous, adaptive), with the
slack/delta split optimised on a grid. Events with a privacy profile get a delta share and Poisson subsampling
is amplified as in :mod:`~dpcl.accounting.accountants.basic`. Replace-one subsampled Gaussians are refused.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from dpcl.accounting.accountants.base import (
    AccountantBase,
    Mechanisms,
    _raise_refusal,
    replace_one_sampling_refusal,
)
from dpcl.accounting.accountants.basic import _profile_epsilons, _profile_pieces
from dpcl.errors import InvalidParameterError, UnsupportedEventError

__all__ = ["ACCOUNTANT", "AdvancedAccountant"]


def _kov(eps: np.ndarray, weights: np.ndarray, log_slack: np.ndarray) -> np.ndarray:
    """Kairouz, Oh & Viswanath (2017) Thm 3.5 epsilon; eps has shape (..., k), weights (k,), slack (...)."""
    total = np.sum(eps * weights, axis=-1)
    sum_sq = np.sum(eps * eps * weights, axis=-1)
    drift = np.sum(eps * np.tanh(eps / 2.0) * weights, axis=-1)  # eps (e^eps - 1)/(e^eps + 1)
    with np.errstate(divide="ignore"):
        log_term = np.logaddexp(1.0, 0.5 * np.log(sum_sq) - log_slack)
    second = drift + np.sqrt(2.0 * sum_sq * log_term)
    third = drift + np.sqrt(2.0 * sum_sq * -log_slack)
    return np.minimum(np.minimum(total, second), third)


def _advanced(mech: Mechanisms, delta: float) -> tuple[float, tuple[str, ...]]:
    _raise_refusal(replace_one_sampling_refusal(mech, "advanced"))
    fixed = [(e, d, c) for e, d, c in mech.eps_delta] + [(e, 0.0, c) for e, c in mech.laplace]
    fixed_eps = np.array([e for e, _, _ in fixed], dtype=np.float64)
    fixed_w = np.array([c for *_, c in fixed], dtype=np.float64)
    log_keep_fixed = math.fsum(c * math.log1p(-d) for _, d, c in fixed)
    budget = math.log1p(-delta) - log_keep_fixed  # log of what slack + Gaussian shares may keep
    if not budget < 0:
        raise InvalidParameterError(
            f"delta must exceed the composed deltas of the (epsilon, delta) events; got {delta!r}."
        )
    mu, q, counts, _ = _profile_pieces(mech)
    n = int(counts.sum()) if counts.size else 0
    if n == 0:
        log_slack = math.log(-math.expm1(budget)) + math.log1p(-1e-12)  # rounding stays inside delta
        eps = float(_kov(fixed_eps, fixed_w, np.array(log_slack)))
        return eps, ("advanced: Kairouz, Oh & Viswanath (2017) Thm 3.5, heterogeneous, slack = delta left by the events.",)
    # split: log(1 - slack) = s * budget, log(1 - delta_i) = (1 - s) * budget / n for each Gaussian-type mechanism
    grid_size = 33 if mu.size * 33 <= 2_000_000 else 5
    s = 1.0 / (1.0 + np.exp(-np.linspace(-9.0, 9.0, grid_size)))
    # slack and shares both lowered by 1e-12 relative, so their float rounding cannot push the total over delta
    with np.errstate(divide="ignore"):
        log_slack = np.log(-np.expm1(s * budget)) + math.log1p(-1e-12)
    share = -np.expm1((1.0 - s) * budget / n) * (1.0 - 1e-12)
    keep = np.isfinite(log_slack) & (share > 0)  # a tiny delta's shares can underflow to 0 in float64
    if not np.any(keep):
        raise UnsupportedEventError(
            f"delta={delta!r} is too small to split between the slack and {n} mechanisms in float64 (each share "
            "underflows to 0); use a larger delta or another accountant."
        )
    s, log_slack, share = s[keep], log_slack[keep], share[keep]
    grid_size = int(s.size)
    eps_rows = _profile_epsilons(mu[None, :], q[None, :], share[:, None])  # (grid, k)
    eps_all = np.concatenate([eps_rows, np.broadcast_to(fixed_eps, (grid_size, fixed_eps.size))], axis=1)
    weights = np.concatenate([counts.astype(np.float64), fixed_w])
    values = _kov(eps_all, weights, log_slack)
    best = int(np.nanargmin(values))
    return float(values[best]), (
        "advanced: Kairouz, Oh & Viswanath (2017) Thm 3.5 (heterogeneous, adaptive); "
        f"slack delta {math.exp(log_slack[best]):.3g}, per-mechanism delta {share[best]:.3g} "
        f"(best of {grid_size} splits).",
    )


@dataclass(frozen=True)
class AdvancedAccountant(AccountantBase):
    """The ``advanced`` accountant (see the module docstring)."""

    name: str = "advanced"
    tolerance: float = 1e-9  # closed forms on a fixed grid: deterministic to rounding
    for_training: bool = False

    def refusal(self, mech: Mechanisms) -> str | None:
        return replace_one_sampling_refusal(mech, "advanced")

    def epsilon_of(self, mech: Mechanisms, delta: float) -> tuple[float, tuple[str, ...]]:
        return _advanced(mech, delta)

    def cost(self, events: object) -> float:
        return 33.0 * super().cost(events)  # every row on the grid of splits


#: The instance dpcl registers (:mod:`~dpcl.accounting.accountants.registry`).
ACCOUNTANT = AdvancedAccountant()
