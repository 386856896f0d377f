"""``exact``: compositions of Gaussian mechanisms (any sigmas and sensitivities, incl. a DP-SGD run at sample
rate 1) and a single Laplace mechanism, nothing else.

mu = sqrt(sum mu_i^2) is exact (Dong, Roth & Su 2022, Cor. 3.3) and its epsilon is the root of Balle & Wang
(2018) Thm 8; a single Laplace mechanism: the inverse of its exact profile.
"""

from __future__ import annotations

from dataclasses import dataclass

from dpcl.accounting.accountants.base import AccountantBase, Mechanisms
from dpcl.accounting.gaussian import gdp_delta, gdp_epsilon
from dpcl.accounting.laplace import laplace_delta, laplace_epsilon_for_delta
from dpcl.errors import UnsupportedEventError

__all__ = ["ACCOUNTANT", "ExactAccountant"]


def _single_laplace(mech: Mechanisms) -> bool:
    return len(mech.laplace) == 1 and mech.laplace[0][1] == 1 and not (mech.gauss_mus or mech.sampled or mech.eps_delta)


def _exact_refusal(mech: Mechanisms) -> str | None:
    if mech.only_gaussian or _single_laplace(mech):
        return None
    return (
        f"exact accounting covers compositions of Gaussian mechanisms and a single Laplace mechanism; "
        f"these events are {mech.describe()}. Use accountant 'pld', 'prv', 'rdp', 'advanced' or 'basic'."
    )


def _exact(mech: Mechanisms, delta: float) -> tuple[float, tuple[str, ...]]:
    if mech.only_gaussian:
        mu = mech.gaussian_mu_total()
        eps = float(gdp_epsilon(mu, delta))
        return eps, (
            f"exact: Gaussian mechanisms compose to mu = {mu:.6g} (Dong, Roth & Su 2022, Cor. 3.3); "
            "epsilon is the root of Balle & Wang (2018) Thm 8.",
        )
    if _single_laplace(mech):
        eps0 = mech.laplace[0][0]
        eps = float(laplace_epsilon_for_delta(1.0, delta, sensitivity=eps0))  # scale 1: no 1/(1/eps0) rounding
        return eps, ("exact: inverse of the Laplace profile delta = 1 - exp((eps - eps0)/2), scalar query.",)
    raise UnsupportedEventError(_exact_refusal(mech))


@dataclass(frozen=True)
class ExactAccountant(AccountantBase):
    """The ``exact`` accountant (see the module docstring)."""

    name: str = "exact"
    tolerance: float = 1e-9  # closed forms: deterministic to rounding
    for_training: bool = False

    def refusal(self, mech: Mechanisms) -> str | None:
        return _exact_refusal(mech)

    def epsilon_of(self, mech: Mechanisms, delta: float) -> tuple[float, tuple[str, ...]]:
        return _exact(mech, delta)

    def delta_of(self, mech: Mechanisms, epsilon: float) -> float:
        if mech.only_gaussian:
            return float(gdp_delta(epsilon, mech.gaussian_mu_total()))
        return float(laplace_delta(epsilon, 1.0, sensitivity=mech.laplace[0][0]))


#: The instance dpcl registers (:mod:`~dpcl.accounting.accountants.registry`).
ACCOUNTANT = ExactAccountant()
