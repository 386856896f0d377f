"""``prv``: prv-accountant's ``PRVAccountant``; the *upper* bound is reported, never the estimate.

``eps_error`` = 1% of the RDP epsilon of the same events (floor 1e-3), ``delta_error`` = delta / 1000 (the
library's recommendation). The grid is sized before anything is allocated and refused past
``PRV_MAX_GRID_POINTS``; a composition that cannot be right (negative mean loss, lost mass) is refused.
Gaussian, Laplace and Poisson-subsampled Gaussian events under add/remove.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np

from dpcl.accounting import work as _work
from dpcl.accounting.accountants import settings
from dpcl.accounting.accountants.base import (
    AccountantBase,
    Mechanisms,
    _raise_refusal,
)
from dpcl.accounting.accountants.rdp import (
    _dp_accounting_warnings_dropped,
    _prv_mechanisms,
    _rdp_accountant,
    _rdp_epsilon,
    _rdp_like_refusal,
)
from dpcl.errors import UnsupportedEventError

__all__ = ["ACCOUNTANT", "PrvAccountant"]


def _prv(mech: Mechanisms, delta: float) -> tuple[float, tuple[str, ...]]:
    from prv_accountant import PRVAccountant

    _raise_refusal(_rdp_like_refusal(mech, "prv"))
    eps_rdp = _rdp_epsilon(mech, delta)
    eps_error = max(settings.PRV_RELATIVE_EPS_ERROR * eps_rdp, settings.PRV_MIN_EPS_ERROR)
    delta_error = settings.PRV_RELATIVE_DELTA_ERROR * delta
    prvs, counts = _prv_mechanisms(mech)
    try:
        with warnings.catch_warnings(), np.errstate(all="ignore"):
            warnings.simplefilter("ignore")
            # size the grid first, as PRVAccountant would (its domain [-L, L], its mesh), and refuse
            # before allocating; then hand it the same L (eps_max) so that it is not computed twice
            domain = _prv_safe_domain(mech, counts, eps_error, delta_error)
            mesh = eps_error / math.sqrt(sum(counts) / 2.0 * math.log(12.0 / delta_error))
            points = 2.0 * domain / mesh
            if not points <= settings.PRV_MAX_GRID_POINTS:
                raise UnsupportedEventError(
                    f"prv-accountant would need ~{points:.2g} grid points for these events (domain +-{domain:.3g}, "
                    f"mesh {mesh:.2g}; dpcl allocates at most {settings.PRV_MAX_GRID_POINTS:.2g}, about 1 GB); use accountant "
                    "'auto', 'pld' or 'rdp'."
                )
            if not points * len(prvs) <= _work.PRV_MAX_POINT_MECHANISMS:
                raise UnsupportedEventError(
                    f"prv-accountant would discretise and compose {len(prvs)} distinct mechanisms on ~{points:.2g} grid "
                    f"points each; dpcl does at most {_work.PRV_MAX_POINT_MECHANISMS:.2g} points x mechanisms (about 20 s); "
                    "use accountant 'auto', 'pld' or 'rdp', or give equal mechanisms equal parameters."
                )
            if not domain <= settings.PRV_MAX_DOMAIN:
                raise UnsupportedEventError(
                    f"prv-accountant would need the privacy-loss domain +-{domain:.4g} for these events; past "
                    f"+-{settings.PRV_MAX_DOMAIN:g} its float64 exp overflows and its bound is not reliable (it gave a negative "
                    "epsilon where the true one is about 1600); use accountant 'auto', 'pld' or 'rdp'."
                )
            acc = PRVAccountant(
                prvs=prvs, eps_error=eps_error, delta_error=delta_error, max_self_compositions=counts, eps_max=domain,
            )
            composed = acc.compute_composition(num_self_compositions=counts)
            _check_prv_composition(acc.composer.prvs, counts, composed, mesh)
            _, _, eps_upper = composed.compute_epsilon(delta, delta_error, eps_error)
    except UnsupportedEventError:
        raise
    except (ValueError, RuntimeError, FloatingPointError, OverflowError, ZeroDivisionError) as exc:
        raise UnsupportedEventError(
            f"prv-accountant cannot bound epsilon for these events at delta={delta!r} ({exc}); use accountant 'pld' or 'rdp'."
        ) from exc
    eps_upper = float(eps_upper)
    if not math.isfinite(eps_upper):
        raise UnsupportedEventError(
            f"prv-accountant returned no finite upper bound at delta={delta!r}; use accountant 'pld' or 'rdp'."
        )
    if eps_upper <= 0.0:
        # epsilon 0 is a valid answer only if delta(0) <= delta; a non-positive bound from prv-accountant cannot
        # be told apart from a numerical failure of its composition, so it is not reported
        raise UnsupportedEventError(
            f"prv-accountant returned a non-positive upper bound ({eps_upper:.4g}) at delta={delta!r}, which dpcl "
            "cannot tell apart from a numerical failure; use accountant 'pld' or 'rdp'."
        )
    return eps_upper, (
        f"prv: prv-accountant upper bound (not its estimate), eps_error={eps_error:.3g}, delta_error={delta_error:.3g}.",
    )


def _check_prv_composition(singles: Sequence[Any], counts: Sequence[int], composed: Any, mesh: float) -> None:
    """Refuse a prv-accountant composition that cannot be right: the mean privacy loss of each step is a KL
    divergence (>= 0), its pmf has mass 1, and the composed mean is the sum of the steps' means (an FFT
    composition that wrapped mass around its domain breaks this). prv-accountant checks none of these after
    composing; dpcl refuses (the caller falls back to PLD or RDP) rather than report a wrong bound."""
    means = [float(np.dot(p.domain.ts(), p.pmf)) for p in singles]
    if any(not m >= -mesh for m in means):
        raise UnsupportedEventError(
            "prv-accountant discretised a step with a negative mean privacy loss (a KL divergence is >= 0); its "
            "bound is not reliable here; use accountant 'pld' or 'rdp'."
        )
    expected = sum(n * m for n, m in zip(counts, means))
    got = float(np.dot(composed.domain.ts(), composed.pmf))
    mass = float(np.sum(composed.pmf))
    if not (abs(mass - 1.0) <= 1e-6 and abs(got - expected) <= max(1e-6 * abs(expected), sum(counts) * 1e-9 + mesh)):
        raise UnsupportedEventError(
            f"prv-accountant's composition is inconsistent (mass {mass:.8g}, mean {got:.6g} instead of "
            f"{expected:.6g}); its bound is not reliable here; use accountant 'pld' or 'rdp'."
        )


def _prv_safe_domain(mech: Mechanisms, counts: list[int], eps_error: float, delta_error: float) -> float:
    """prv-accountant's safe domain size L (its remark 5.6, ``compute_safe_domain_size``), from dp-accounting's RDP.

    prv-accountant takes L from an RDP epsilon of the composition at delta_error / 4 and of each
    single mechanism at delta_error / (8 * compositions), plus 3; any sound RDP accountant gives a
    sound L. dp-accounting's is used because prv-accountant's own series takes minutes for large
    noise multipliers (46 s at z = 1e6); where dp-accounting dropped orders, L is only larger.
    """
    total = sum(counts)
    with _dp_accounting_warnings_dropped(), np.errstate(all="ignore"):
        domain = float(_rdp_accountant(mech).get_epsilon(delta_error / 4.0))
        pieces: list[Mechanisms] = []
        if mech.gauss_mus:
            pieces.append(Mechanisms(adjacency=mech.adjacency, unit=mech.unit, gauss_mus=mech.gauss_mus, gauss_counts=mech.gauss_counts))
        for eps0, _ in mech.laplace_groups():
            pieces.append(Mechanisms(adjacency=mech.adjacency, unit=mech.unit, laplace=[(eps0, 1)]))
        for (z, q), _ in mech.sampled_groups():
            pieces.append(Mechanisms(adjacency=mech.adjacency, unit=mech.unit, sampled=[(z, q, 1)]))
        for piece in pieces:
            domain = max(domain, float(_rdp_accountant(piece).get_epsilon(delta_error / 8.0 / total)))
    return max(domain, eps_error) + 3.0


@dataclass(frozen=True)
class PrvAccountant(AccountantBase):
    """The ``prv`` accountant (see the module docstring)."""

    name: str = "prv"
    tolerance: float = 1e-6  # recomputed deterministically, but FFT numerics may differ across numpy/scipy builds
    for_training: bool = True

    def refusal(self, mech: Mechanisms) -> str | None:
        return _rdp_like_refusal(mech, "prv")

    def epsilon_of(self, mech: Mechanisms, delta: float) -> tuple[float, tuple[str, ...]]:
        return _prv(mech, delta)

    def cost(self, events: Any) -> float:
        return float(settings.PRV_MAX_GRID_POINTS)  # the grid it may allocate (sized from the RDP epsilon)


#: The instance dpcl registers (:mod:`~dpcl.accounting.accountants.registry`).
ACCOUNTANT = PrvAccountant()
