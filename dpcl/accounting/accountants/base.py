"""What every accountant shares: the result type, events collected into mechanism groups, and the
:class:`Accountant` protocol with :class:`AccountantBase`, the base class of the built-in accountants.

An accountant sees events as a :class:`Mechanisms`: the leaves of the event tree grouped by kind
(Gaussian mus, Laplace epsilons, Poisson-subsampled Gaussian steps, (epsilon, delta) pairs) with their
repetition counts, the neighbouring relation and the privacy unit. :func:`collect` builds it (and checks
the counts every accountant is tested to); it is what :func:`~dpcl.accounting.accountants.compute_epsilon`
hands to the accountant it looks up in the registry (:mod:`~dpcl.accounting.accountants.registry`).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any, Mapping, Protocol, Sequence, runtime_checkable

import numpy as np

from dpcl.accounting.events import (
    MAX_COMPOSITIONS,
    MAX_SAMPLED_STEPS,
    STEPS_HINT,
    Adjacency,
    ComposedEvent,
    EpsilonDeltaEvent,
    LaplaceEvent,
    PoissonSampledGaussianEvent,
    PrivacyEvent,
    unsampled_gaussian_mu,
)
from dpcl.errors import InvalidParameterError, UnsupportedEventError

__all__ = ["Accountant", "AccountantBase", "AccountingResult", "Mechanisms", "collect"]

_UNIT_ROUNDOFF = 2.0**-53


@dataclass(frozen=True)
class AccountingResult:
    """An (epsilon, delta) upper bound with everything needed to read it.

    ``candidates`` maps each accountant that was evaluated to its epsilon (for
    ``auto``; a single entry otherwise); ``notes`` states settings and assumptions.
    """

    epsilon: float
    delta: float
    accountant: str
    adjacency: str
    unit: str
    candidates: Mapping[str, float] = field(default_factory=dict)
    notes: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        object.__setattr__(self, "candidates", dict(self.candidates))
        object.__setattr__(self, "notes", tuple(self.notes))

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "notes": list(self.notes)}


@dataclass
class Mechanisms:
    """The leaves of an event tree, grouped by kind, with repetition counts."""

    adjacency: Adjacency
    unit: str
    gauss_mus: list[np.ndarray] = field(default_factory=list)
    gauss_counts: list[int] = field(default_factory=list)
    laplace: list[tuple[float, int]] = field(default_factory=list)  # (epsilon0, count)
    sampled: list[tuple[float, float, int]] = field(default_factory=list)  # (z, q, count)
    eps_delta: list[tuple[float, float, int]] = field(default_factory=list)  # (eps, delta, count)
    rdp_cache: dict[float, float] = field(default_factory=dict)  # delta -> RDP epsilon
    rdp_excluded_orders: int = 0  # RDP orders dp-accounting dropped (series did not converge)
    rdp_from_prv: bool = False  # the RDP bound came from prv-accountant's RDP accountant (tighter)

    @property
    def only_gaussian(self) -> bool:
        return bool(self.gauss_mus) and not (self.laplace or self.sampled or self.eps_delta)

    def gaussian_mu_total(self) -> float:
        """sqrt(sum count * mu^2), rounded up by a bound on its float error, never below the exact value.

        Each mu_i = sensitivity / sigma and its square carry 3 roundings, each group's
        dot product (size - 1) u (Higham 2002, eq. 3.5), the count and the running
        sum one each, the final scaling and square root 3: 2 (n + 4) u with n the
        number of terms plus groups covers them.
        """
        total = 0.0
        n = 0
        for mus, count in zip(self.gauss_mus, self.gauss_counts):
            total += count * float(np.dot(mus, mus))
            n += mus.size + 1
        return math.sqrt(total * (1.0 + 2.0 * (n + 4) * _UNIT_ROUNDOFF))

    def laplace_groups(self) -> list[tuple[float, int]]:
        """The Laplace mechanisms as ``(epsilon0, count)``, equal epsilons merged (counts added), in first-seen order."""
        out: dict[float, int] = {}
        for value, count in self.laplace:
            out[value] = out.get(value, 0) + count
        return list(out.items())

    def sampled_groups(self) -> list[tuple[tuple[float, float], int]]:
        """The Poisson-subsampled Gaussian steps as ``((z, q), count)``, equal (z, q) merged, in first-seen order."""
        out: dict[tuple[float, float], int] = {}
        for a, b, count in self.sampled:
            out[(a, b)] = out.get((a, b), 0) + count
        return list(out.items())

    def describe(self) -> str:
        parts = []
        if self.gauss_mus:
            parts.append(f"{sum(m.size * c for m, c in zip(self.gauss_mus, self.gauss_counts))} Gaussian")
        if self.laplace:
            parts.append(f"{sum(c for _, c in self.laplace)} Laplace")
        if self.sampled:
            parts.append(f"{sum(c for *_, c in self.sampled)} Poisson-subsampled Gaussian")
        if self.eps_delta:
            parts.append(f"{sum(c for *_, c in self.eps_delta)} (epsilon, delta)")
        return ", ".join(parts) + " mechanism(s)"


def collect(events: "PrivacyEvent | Sequence[PrivacyEvent] | Mechanisms") -> Mechanisms:
    """``events`` (one event, a non-empty sequence of them, or an already collected :class:`Mechanisms`,
    returned as it is) as mechanism groups."""
    if isinstance(events, Mechanisms):
        return events
    if isinstance(events, PrivacyEvent):
        root = events
    else:
        if isinstance(events, (str, bytes)) or not isinstance(events, Sequence):
            raise InvalidParameterError(
                f"events must be a PrivacyEvent or a sequence of them, got {type(events).__name__}."
            )
        root = ComposedEvent(list(events))  # validates: non-empty, same adjacency and unit
    mech = Mechanisms(adjacency=root.adjacency, unit=root.unit)
    for leaf, count in root.leaves():
        if count > MAX_COMPOSITIONS:
            raise InvalidParameterError(
                f"count (repetitions of one {leaf.kind} mechanism) must be at most {MAX_COMPOSITIONS:.0e}, got {count:.3g}; "
                "no accountant is tested beyond it."
            )
        if isinstance(leaf, PoissonSampledGaussianEvent) and leaf.sample_rate < 1.0 and count > MAX_SAMPLED_STEPS:
            raise InvalidParameterError(
                f"steps (repetitions of a Poisson-subsampled Gaussian step) must be at most {MAX_SAMPLED_STEPS:.0e}, "
                f"got {count:.3g}; {STEPS_HINT}."
            )
        mu = unsampled_gaussian_mu(leaf)  # Gaussians, and subsampled Gaussians at sample rate 1
        if mu is not None:
            mech.gauss_mus.append(np.asarray(mu, dtype=np.float64).ravel())
            mech.gauss_counts.append(count)
        elif isinstance(leaf, LaplaceEvent):
            mech.laplace.append((leaf.epsilon, count))
        elif isinstance(leaf, PoissonSampledGaussianEvent):
            mech.sampled.append((leaf.noise_multiplier, leaf.sample_rate, count))
        elif isinstance(leaf, EpsilonDeltaEvent):
            mech.eps_delta.append((leaf.epsilon, leaf.delta, count))
        else:
            raise UnsupportedEventError(f"no accountant handles events of kind {leaf.kind!r}.")
    return mech


def eps_delta_refusal(mech: Mechanisms, name: str) -> str | None:
    """Why accountant ``name`` cannot take ``mech``'s (epsilon, delta) events, or None where it has none."""
    if mech.eps_delta:
        return (
            f"the {name} accountant cannot compose (epsilon, delta) events (they carry no noise "
            "distribution); use accountant 'basic' or 'advanced'."
        )
    return None


def replace_one_sampling_refusal(mech: Mechanisms, name: str) -> str | None:
    """Why accountant ``name`` cannot take ``mech``'s Poisson-subsampled Gaussians under replace-one, or None."""
    if mech.sampled and mech.adjacency is Adjacency.REPLACE_ONE:
        return (
            f"the {name} accountant has no sound analysis of Poisson-subsampled Gaussians under "
            "replace-one neighbours; use accountant 'pld' (dp-accounting's REPLACE_ONE analysis) "
            "or state the events under add_remove."
        )
    return None


def _raise_refusal(why: str | None) -> None:
    """Raise :class:`UnsupportedEventError` with ``why``, an accountant's reason for refusing events (None: no
    refusal, nothing raised)."""
    if why is not None:
        raise UnsupportedEventError(why)


_RELATION_NOTE = (
    "Gaussian/Laplace events use their stated sensitivity under the stated relation; "
    "subsampled-Gaussian noise multipliers are relative to the clipping norm."
)


def _check_result(eps: float, name: str) -> None:
    if isinstance(eps, float) and eps == math.inf:
        raise UnsupportedEventError(
            f"the {name} accountant gives no finite epsilon for these events at this delta; "
            "try another accountant or a larger delta."
        )
    if not (isinstance(eps, float) and eps >= 0 and math.isfinite(eps)):
        raise ArithmeticError(f"accountant {name!r} produced an invalid epsilon {eps!r}")  # pragma: no cover


@runtime_checkable
class Accountant(Protocol):
    """How events become (epsilon, delta): what :func:`~dpcl.accounting.accountants.compute_epsilon`, ``auto``,
    the config parser, the CLI and certificate verification ask of an accountant.

    ``events`` below is one :class:`~dpcl.accounting.events.PrivacyEvent`, a sequence of them, or the
    :class:`Mechanisms` they collect into. :class:`AccountantBase` implements everything but the numbers.
    """

    #: The name a config, the CLI and a certificate give (``[privacy] accountant``, ``--accountant``).
    name: str
    #: Relative tolerance between a certificate's stated epsilon and the one verification recomputes.
    tolerance: float
    #: Offered for DP-SGD training (the config's ``[privacy] accountant``, the CLI's ``--accountant``).
    for_training: bool

    def supports(self, events: Any) -> bool:
        """Whether the accountant has a sound analysis of these events (without computing anything large)."""

    def epsilon(self, events: Any, delta: float) -> tuple[float, tuple[str, ...]]:
        """An upper bound on epsilon at ``delta`` and the notes that state how it was obtained."""

    def delta(self, events: Any, epsilon: float) -> float:
        """An upper bound on delta at ``epsilon``."""

    def cost(self, events: Any) -> float:
        """A rough estimate of the work ``epsilon`` does (elementary evaluations; its order of magnitude only)."""


class AccountantBase:
    """An accountant from three methods: :meth:`refusal` (why it cannot take some events), :meth:`epsilon_of`
    (the number) and, optionally, :meth:`delta_of` and :meth:`cost`. Subclasses are frozen dataclasses holding
    ``name``, ``tolerance``, ``for_training`` and their parameters, so that two equal accountants compute the
    same numbers (the epsilon memo is keyed on the accountant object).
    """

    name: str
    tolerance: float
    for_training: bool

    def refusal(self, mech: Mechanisms) -> str | None:
        """Why these events cannot be accounted soundly by this accountant (None: they can)."""
        return None

    def supports(self, events: Any) -> bool:
        return self.refusal(collect(events)) is None

    def epsilon(self, events: Any, delta: float) -> tuple[float, tuple[str, ...]]:
        mech = collect(events)
        _raise_refusal(self.refusal(mech))
        return self.epsilon_of(mech, delta)

    def epsilon_of(self, mech: Mechanisms, delta: float) -> tuple[float, tuple[str, ...]]:
        raise NotImplementedError

    def result(self, mech: Mechanisms, delta: float, base: dict[str, Any]) -> AccountingResult:
        """:meth:`epsilon` as the :class:`AccountingResult` that ``compute_epsilon`` returns (``base``: its
        delta, adjacency and unit)."""
        return accounting_result(self, mech, delta, base)

    def delta(self, events: Any, epsilon: float) -> float:
        mech = collect(events)
        _raise_refusal(self.refusal(mech))
        return self.delta_of(mech, float(epsilon))

    def delta_of(self, mech: Mechanisms, epsilon: float) -> float:
        """The smallest delta on a grid of :data:`DELTA_SEARCH_STEPS` bisections of log10(delta) in
        [-300, 0] whose epsilon is at most ``epsilon``: an upper bound on delta(epsilon), since epsilon is
        a non-increasing function of delta and the delta returned was checked. Accountants with a direct
        route (a privacy profile) override it."""
        def meets(log_delta: float) -> bool:
            try:
                return self.epsilon_of(mech, 10.0**log_delta)[0] <= epsilon
            except (InvalidParameterError, UnsupportedEventError):
                return False  # a delta too small to split or to bound: delta(epsilon) is larger

        lo, hi = -300.0, 0.0
        if meets(lo):
            return 10.0**lo
        for _ in range(DELTA_SEARCH_STEPS):
            mid = 0.5 * (lo + hi)
            lo, hi = (lo, mid) if meets(mid) else (mid, hi)
        return 1.0 if hi == 0.0 else 10.0**hi

    def cost(self, events: Any) -> float:
        mech = collect(events)
        return float(1 + len(mech.gauss_mus) + len(mech.laplace) + len(mech.sampled) + len(mech.eps_delta))


#: Bisection steps of :meth:`AccountantBase.delta_of` (log10(delta) to ~3e-10 of its range of 300).
DELTA_SEARCH_STEPS = 40


def accounting_result(accountant: Any, mech: Mechanisms, delta: float, base: dict[str, Any]) -> AccountingResult:
    """What ``compute_epsilon`` returns for any :class:`Accountant`: its epsilon, checked to be a finite
    non-negative float, with its notes and the relation note."""
    eps, notes = accountant.epsilon(mech, delta)
    _check_result(eps, accountant.name)
    return AccountingResult(
        epsilon=eps, accountant=accountant.name, candidates={accountant.name: eps}, notes=(*notes, _RELATION_NOTE), **base,
    )
