"""``basic``: every event type; epsilons and deltas add (Dwork & Roth 2014, Thm 3.16).

Events with a whole privacy profile (Gaussian, subsampled Gaussian) get an equal share of delta; Poisson
subsampling is amplified by (log(1 + q(e^eps - 1)), q delta) (Balle, Barthe & Gaboardi 2018, Poisson
subsampling under add/remove). Replace-one subsampled Gaussians are refused.
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
from dpcl.accounting.gaussian import gdp_epsilon
from dpcl.errors import InvalidParameterError, UnsupportedEventError

__all__ = ["ACCOUNTANT", "BasicAccountant"]


def _profile_pieces(mech: Mechanisms) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Mechanisms that need a delta share: unique (kind, parameter) rows with counts.

    Returns (mus, qs, counts, is_sampled): Gaussians have q = 1; a subsampled
    Gaussian row holds mu = 1/z and its q.
    """
    mus, qs, counts = [], [], []
    for m, c in zip(mech.gauss_mus, mech.gauss_counts):
        u, k = np.unique(m, return_counts=True)
        mus.append(u)
        qs.append(np.ones_like(u))
        counts.append(k * c)
    for (z, q), c in mech.sampled_groups():
        mus.append(np.array([1.0 / z]))
        qs.append(np.array([q]))
        counts.append(np.array([c]))
    if not mus:
        empty = np.zeros(0)
        return empty, empty, empty.astype(np.int64), empty.astype(bool)
    mu = np.concatenate(mus)
    q = np.concatenate(qs)
    return mu, q, np.concatenate(counts).astype(np.int64), q < 1.0


def _profile_epsilons(mu: np.ndarray, q: np.ndarray, deltas: np.ndarray) -> np.ndarray:
    """Per-mechanism epsilon at per-mechanism delta (broadcast); subsampled rows amplified.

    Poisson subsampling at rate q of an (eps, d)-DP mechanism is
    (log(1 + q(e^eps - 1)), q d)-DP under add/remove (Balle, Barthe & Gaboardi 2018, Poisson subsampling),
    so a row with delta share d uses base delta d/q (capped at 1/2, still valid).
    """
    base_delta = np.minimum(deltas / q, 0.5)
    base = gdp_epsilon(np.broadcast_to(mu, np.broadcast(mu, base_delta).shape), base_delta)
    # log(1 + q(e^eps - 1)) = eps + log(q + (1 - q) e^-eps): the second form cannot overflow for large eps
    with np.errstate(over="ignore"):
        small = np.log1p(q * np.expm1(np.minimum(base, 1.0)))
    large = base + np.log(q + (1.0 - q) * np.exp(-base))
    return np.where(q < 1.0, np.where(base <= 1.0, small, large), base)


def _basic(mech: Mechanisms, delta: float) -> tuple[float, tuple[str, ...]]:
    _raise_refusal(replace_one_sampling_refusal(mech, "basic"))
    fixed_eps = math.fsum([e * c for e, _, c in mech.eps_delta] + [e * c for e, c in mech.laplace])
    fixed_delta = math.fsum([d * c for _, d, c in mech.eps_delta])
    mu, q, counts, _ = _profile_pieces(mech)
    n = int(counts.sum()) if counts.size else 0
    remaining = delta - fixed_delta
    if n == 0:
        if remaining < 0:
            raise InvalidParameterError(
                f"delta must be at least the summed deltas of the events ({fixed_delta:.3g}); got {delta!r}."
            )
        return fixed_eps, ("basic: epsilons and deltas add (Dwork & Roth 2014, Thm 3.16).",)
    if not remaining > 0:
        raise InvalidParameterError(
            f"delta must exceed the summed deltas of the (epsilon, delta) events ({fixed_delta:.3g}) to leave a share "
            f"for the Gaussian mechanisms; got {delta!r}."
        )
    share = remaining / n * (1.0 - 1e-12)  # shares sum to <= remaining after rounding
    if not share > 0:
        raise UnsupportedEventError(
            f"delta={delta!r} is too small to split between {n} mechanisms in float64 (each share underflows to 0); "
            "use a larger delta or another accountant."
        )
    eps = _profile_epsilons(mu, q, np.array(share))
    total = fixed_eps + math.fsum(eps * counts)
    return total, (
        f"basic: epsilons and deltas add (Dwork & Roth 2014, Thm 3.16); each of the {n} Gaussian-type mechanisms "
        f"gets delta {share:.3g}.",
    )


@dataclass(frozen=True)
class BasicAccountant(AccountantBase):
    """The ``basic`` accountant (see the module docstring)."""

    name: str = "basic"
    tolerance: float = 1e-9  # closed forms: deterministic to rounding
    for_training: bool = False

    def refusal(self, mech: Mechanisms) -> str | None:
        return replace_one_sampling_refusal(mech, "basic")

    def epsilon_of(self, mech: Mechanisms, delta: float) -> tuple[float, tuple[str, ...]]:
        return _basic(mech, delta)


#: The instance dpcl registers (:mod:`~dpcl.accounting.accountants.registry`).
ACCOUNTANT = BasicAccountant()
