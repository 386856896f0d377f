"""Privacy filters: admit adaptively chosen mechanisms while a fixed budget holds.

In fully adaptive composition the analyst picks each mechanism *and its privacy
parameters* after seeing earlier outputs, and the number of mechanisms is open
ended. Ordinary composition theorems assume the parameters are fixed in advance;
a *privacy filter* (Rogers, Roth, Ullman & Vadhan 2016, "Privacy Odometers and
Filters: Pay-as-you-Go Composition") is a stopping rule that keeps the whole
interaction (epsilon_budget, delta_budget)-DP. Two rules:

``basic``
    Admit while sum eps_t <= epsilon_budget and sum delta_t <= delta_budget.
    Basic composition remains valid as a filter under fully adaptive choice
    (Rogers et al. 2016, Sec. 3; Whitehouse, Ramdas, Rogers & Wu 2023,
    "Fully-Adaptive Composition in Differential Privacy", basic filter).
``gdp``
    For Gaussian mechanisms, mechanism t being mu_t-GDP: admit while
    sum mu_t^2 <= mu_budget^2. Smith & Thakurta (2022), "Fully Adaptive
    Composition for Gaussian Differential Privacy" (arXiv:2210.17520), main
    theorem: this is a filter for mu_budget-GDP, with the same parameters as
    non-adaptive composition; used for individual accounting by Koskela,
    Tobaben & Honkela (2023). mu_budget is the largest mu whose GDP implies
    (epsilon_budget, delta_budget)-DP (:func:`~dpcl.accounting.gaussian.gdp_mu`).
    Only plain Gaussian mechanisms are admitted: a subsampled Gaussian is not
    exactly mu-GDP, and general f-DP filters are not valid in general.

A refused event leaves the filter unchanged; the error says by how much the
budget would have been exceeded.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from dpcl.accounting.accountants import compute_epsilon
from dpcl.accounting.events import Adjacency, EpsilonDeltaEvent, LaplaceEvent, PrivacyEvent, unsampled_gaussian_mu
from dpcl.accounting.gaussian import gdp_epsilon, gdp_mu
from dpcl.accounting.validation import check_delta_scalar, check_positive_scalar
from dpcl.errors import BudgetExceededError, InvalidParameterError, UnsupportedEventError

__all__ = ["FILTER_RULES", "FilterCharge", "FilterBudget", "PrivacyFilter"]

FILTER_RULES = ("basic", "gdp")


@dataclass(frozen=True)
class FilterCharge:
    """What one admitted event cost: (epsilon, delta) under ``basic``, mu under ``gdp``."""

    epsilon: float
    delta: float
    mu: float | None = None


@dataclass(frozen=True)
class FilterBudget:
    """Budget spent or remaining.

    Under ``basic``, (epsilon, delta) are sums. Under ``gdp``, ``mu`` governs
    admission: ``spent.mu = sqrt(sum mu_t^2)`` with ``spent.epsilon`` its epsilon at
    delta_budget, and ``remaining.mu = sqrt(mu_budget^2 - sum mu_t^2)`` (the
    largest Gaussian mechanism still admissible); ``remaining.epsilon`` is only
    ``epsilon_budget - spent.epsilon`` (informational: epsilons do not add under GDP).
    """

    epsilon: float
    delta: float
    mu: float | None = None


class PrivacyFilter:
    """Stops an open-ended stream of mechanisms before it exceeds (epsilon_budget, delta_budget)."""

    def __init__(self, epsilon_budget: float, delta_budget: float, rule: str = "basic") -> None:
        self.epsilon_budget = check_positive_scalar("epsilon_budget", epsilon_budget)
        if rule not in FILTER_RULES:
            raise InvalidParameterError(f"rule must be one of {', '.join(FILTER_RULES)}; got {rule!r}.")
        self.rule = rule
        allow_zero = rule == "basic"
        self.delta_budget = check_delta_scalar("delta_budget", delta_budget, allow_zero=allow_zero)
        self.mu_budget: float | None = float(gdp_mu(self.epsilon_budget, self.delta_budget)) if rule == "gdp" else None
        self._charges: list[FilterCharge] = []
        self._adjacency: Adjacency | None = None
        self._unit: str | None = None

    # -- state -------------------------------------------------------------
    @property
    def charges(self) -> tuple[FilterCharge, ...]:
        return tuple(self._charges)

    def _mu_sq_spent(self) -> float:
        return math.fsum((c.mu or 0.0) ** 2 for c in self._charges)

    @property
    def spent(self) -> FilterBudget:
        if self.rule == "gdp":
            mu = math.sqrt(self._mu_sq_spent())
            eps = float(gdp_epsilon(mu, self.delta_budget)) if mu > 0 else 0.0
            return FilterBudget(epsilon=eps, delta=self.delta_budget if mu > 0 else 0.0, mu=mu)
        return FilterBudget(
            epsilon=math.fsum(c.epsilon for c in self._charges), delta=math.fsum(c.delta for c in self._charges)
        )

    @property
    def remaining(self) -> FilterBudget:
        if self.rule == "gdp":
            assert self.mu_budget is not None
            mu_left = math.sqrt(max(self.mu_budget**2 - self._mu_sq_spent(), 0.0))
            return FilterBudget(epsilon=self.epsilon_budget - self.spent.epsilon, delta=self.delta_budget, mu=mu_left)
        spent = self.spent
        return FilterBudget(epsilon=self.epsilon_budget - spent.epsilon, delta=self.delta_budget - spent.delta)

    # -- admission -----------------------------------------------------------
    def charge_of(self, event: PrivacyEvent, *, delta: float | None = None) -> FilterCharge:
        """What admitting ``event`` would cost, without admitting it.

        ``basic``: events made only of (epsilon, delta) and Laplace mechanisms
        cost their summed (epsilon, delta); anything with a privacy profile
        (Gaussian, subsampled Gaussian) needs ``delta`` (its share of the delta
        budget) and costs (epsilon at that delta by ``auto`` accounting, delta).
        ``gdp``: Gaussian mechanisms only; costs mu = sqrt(sum mu_i^2).
        """
        if not isinstance(event, PrivacyEvent):
            raise InvalidParameterError(f"event must be a PrivacyEvent, got {type(event).__name__}.")
        leaves = list(event.leaves())
        if self.rule == "gdp":
            if delta is not None:
                raise InvalidParameterError("the gdp rule charges mu, not delta; do not pass delta.")
            total = 0.0
            for leaf, count in leaves:
                leaf_mu = unsampled_gaussian_mu(leaf)  # one mu, or a heterogeneous event's array of them
                if leaf_mu is None:
                    raise UnsupportedEventError(
                        f"the gdp filter admits only Gaussian mechanisms (Smith & Thakurta 2022); got a {leaf.kind!r} "
                        "event. Use a filter with rule='basic'."
                    )
                total += count * (math.fsum(leaf_mu**2) if isinstance(leaf_mu, np.ndarray) else leaf_mu**2)
            mu = math.sqrt(total)
            return FilterCharge(epsilon=float(gdp_epsilon(mu, self.delta_budget)), delta=self.delta_budget, mu=mu)
        pure = all(isinstance(leaf, (EpsilonDeltaEvent, LaplaceEvent)) for leaf, _ in leaves)
        if pure and delta is None:
            eps = math.fsum(count * (leaf.epsilon) for leaf, count in leaves)
            dlt = math.fsum(count * leaf.delta for leaf, count in leaves if isinstance(leaf, EpsilonDeltaEvent))
            return FilterCharge(epsilon=eps, delta=dlt)
        if delta is None:
            raise InvalidParameterError(
                "delta (this event's share of the delta budget) is required for events with a privacy "
                "profile, e.g. Gaussian mechanisms, under the basic rule."
            )
        share = check_delta_scalar("delta", delta)
        return FilterCharge(epsilon=_auto_epsilon_of(event, share), delta=share)

    def admit(self, event: PrivacyEvent, *, delta: float | None = None) -> FilterCharge:
        """Admit ``event`` if the budget allows it, else raise :class:`BudgetExceededError`.

        On refusal nothing changes. All events must share one neighbouring
        relation and privacy unit (the first admitted event fixes them).
        """
        charge = self.charge_of(event, delta=delta)
        if self._adjacency is not None and (event.adjacency, event.unit) != (self._adjacency, self._unit):
            raise InvalidParameterError(
                f"this filter accounts {self._adjacency.value} neighbours of one {self._unit!r}; "
                f"got an event for {event.adjacency.value} / {event.unit!r}."
            )
        if self.rule == "gdp":
            assert self.mu_budget is not None and charge.mu is not None
            new_sq = self._mu_sq_spent() + charge.mu**2
            if new_sq > self.mu_budget**2:
                raise BudgetExceededError(
                    f"refused: this Gaussian event costs mu^2 = {charge.mu**2:.6g}; admitting it would make "
                    f"sum mu^2 = {new_sq:.6g} > mu_budget^2 = {self.mu_budget**2:.6g} "
                    f"(exceeds by {new_sq - self.mu_budget**2:.3g}; mu_budget = {self.mu_budget:.6g} for "
                    f"epsilon={self.epsilon_budget:g}, delta={self.delta_budget:g})."
                )
        else:
            spent = self.spent
            new_eps = math.fsum([spent.epsilon, charge.epsilon])
            new_delta = math.fsum([spent.delta, charge.delta])
            over = []
            if new_eps > self.epsilon_budget:
                over.append(f"epsilon by {new_eps - self.epsilon_budget:.3g} ({new_eps:.6g} > {self.epsilon_budget:g})")
            if new_delta > self.delta_budget:
                over.append(f"delta by {new_delta - self.delta_budget:.3g} ({new_delta:.3g} > {self.delta_budget:g})")
            if over:
                raise BudgetExceededError(
                    f"refused: this event costs epsilon={charge.epsilon:.6g}, delta={charge.delta:.3g}; "
                    "admitting it would exceed the budget: " + "; ".join(over) + "."
                )
        self._charges.append(charge)
        self._adjacency, self._unit = event.adjacency, event.unit
        return charge

    def admit_epsilon_delta(self, epsilon: float, delta: float = 0.0, *, unit: str = "example",
                            adjacency: Adjacency | str = "add_remove") -> FilterCharge:
        """Admit a mechanism known only by its (epsilon, delta) guarantee (basic rule)."""
        return self.admit(EpsilonDeltaEvent(epsilon=epsilon, delta=delta, unit=unit, adjacency=adjacency))

    def to_dict(self) -> dict[str, Any]:
        spent, remaining = self.spent, self.remaining
        return {
            "rule": self.rule,
            "epsilon_budget": self.epsilon_budget,
            "delta_budget": self.delta_budget,
            "mu_budget": self.mu_budget,
            "admitted": len(self._charges),
            "spent": {"epsilon": spent.epsilon, "delta": spent.delta, "mu": spent.mu},
            "remaining": {"epsilon": remaining.epsilon, "delta": remaining.delta, "mu": remaining.mu},
        }


@functools.lru_cache(maxsize=1024)
def _auto_epsilon_of(event: PrivacyEvent, delta: float) -> float:
    """``compute_epsilon(event, delta, "auto").epsilon``, memoised: events are immutable, and the per-task filters of
    a long parallel stream of equal-size tasks admit the same event at the same delta share."""
    return compute_epsilon(event, delta, "auto").epsilon
