"""Immutable, validated privacy events (in the spirit of dp-accounting's ``DpEvent``).

An event says *what was done*: which mechanism, with which noise, at which
sensitivity, how often, under which neighbouring relation and for which privacy
unit. It computes nothing; an accountant (:mod:`dpcl.accounting.accountants`)
turns events into (epsilon, delta). Invalid parameters are refused at
construction with :class:`~dpcl.errors.InvalidParameterError`.

Sensitivities are stated *for the event's own neighbouring relation*: a sum of
per-example vectors clipped to norm ``C`` has l2 sensitivity ``C`` under
``add_remove`` and ``2C`` under ``replace_one``. The noise multiplier of a
Poisson-subsampled Gaussian is relative to the add/remove sensitivity (the
clipping norm), as in DP-SGD.

Every event serialises to a plain JSON-able dict (:meth:`PrivacyEvent.to_dict`)
and back (:func:`event_from_dict`), so certificates can carry the full event
list needed to recompute epsilon.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from enum import Enum
from typing import Any, Iterator

import numpy as np

from dpcl.accounting.validation import (
    check_count,
    check_delta_scalar,
    check_nonnegative_scalar,
    check_positive,
    check_positive_scalar,
    check_sample_rate,
    parse_choice,
)
from dpcl.errors import InvalidParameterError


class Adjacency(str, Enum):
    """Neighbouring relation between datasets."""

    ADD_REMOVE = "add_remove"
    REPLACE_ONE = "replace_one"

    @classmethod
    def parse(cls, value: "Adjacency | str") -> "Adjacency":
        return parse_choice(cls, value, lambda allowed: InvalidParameterError(
            f"adjacency must be one of {allowed}, got {value!r}."))


#: Common privacy units. Any non-empty string is accepted ("patient", "document"...).
PRIVACY_UNITS = ("example", "token", "sequence", "user")


def _check_unit(unit: Any) -> str:
    if not isinstance(unit, str) or not unit.strip():
        raise InvalidParameterError(
            f"privacy unit must be a non-empty string such as {', '.join(PRIVACY_UNITS)}; got {unit!r}."
        )
    return unit


@dataclass(frozen=True, kw_only=True)
class PrivacyEvent:
    """Base class. ``adjacency`` and ``unit`` are stated by every event."""

    adjacency: Adjacency = Adjacency.ADD_REMOVE
    unit: str = "example"

    kind: str = field(default="", init=False, repr=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "adjacency", Adjacency.parse(self.adjacency))
        object.__setattr__(self, "unit", _check_unit(self.unit))

    # -- serialisation -------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"kind": self.kind}
        for f in dataclasses.fields(self):
            if f.name == "kind":
                continue
            value = getattr(self, f.name)
            if isinstance(value, Adjacency):
                value = value.value
            elif isinstance(value, PrivacyEvent):
                value = value.to_dict()
            elif isinstance(value, tuple) and value and isinstance(value[0], PrivacyEvent):
                value = [v.to_dict() for v in value]
            elif isinstance(value, np.ndarray):
                value = value.tolist()
            out[f.name] = value
        return out

    def leaves(self) -> Iterator[tuple["PrivacyEvent", int]]:
        """Yield ``(elementary event, repetition count)`` pairs."""
        yield self, 1


@dataclass(frozen=True, kw_only=True)
class GaussianEvent(PrivacyEvent):
    """Gaussian mechanism: noise N(0, sigma^2 I) added to a query of l2 sensitivity ``sensitivity``."""

    sigma: float
    sensitivity: float = 1.0
    kind: str = field(default="gaussian", init=False, repr=False)

    def __post_init__(self) -> None:
        super().__post_init__()
        object.__setattr__(self, "sigma", check_positive_scalar("sigma", self.sigma))
        object.__setattr__(self, "sensitivity", check_positive_scalar("sensitivity", self.sensitivity))

    @property
    def mu(self) -> float:
        """Gaussian-DP parameter mu = sensitivity / sigma (Dong, Roth & Su 2022)."""
        return self.sensitivity / self.sigma


@dataclass(frozen=True, kw_only=True)
class HeterogeneousGaussianEvent(PrivacyEvent):
    """Many Gaussian mechanisms at once (e.g. one per token), stored as arrays.

    ``sigmas`` and ``sensitivities`` broadcast against each other; the arrays are
    copied and made read-only so the event stays immutable.
    """

    sigmas: np.ndarray
    sensitivities: np.ndarray | float = 1.0
    kind: str = field(default="heterogeneous_gaussian", init=False, repr=False)

    def __post_init__(self) -> None:
        super().__post_init__()
        sigmas = np.array(check_positive("sigmas", np.atleast_1d(self.sigmas)), dtype=np.float64).ravel()
        sens = np.array(check_positive("sensitivities", np.atleast_1d(self.sensitivities)), dtype=np.float64).ravel()
        if sens.size not in (1, sigmas.size):
            raise InvalidParameterError(
                f"sensitivities must be one value or one per sigma ({sigmas.size}), got {sens.size}."
            )
        sigmas.setflags(write=False)
        sens.setflags(write=False)
        object.__setattr__(self, "sigmas", sigmas)
        object.__setattr__(self, "sensitivities", sens)

    @property
    def count(self) -> int:
        return int(self.sigmas.size)

    @property
    def mus(self) -> np.ndarray:
        return self.sensitivities / self.sigmas

    def __eq__(self, other: object) -> bool:
        return (
            isinstance(other, HeterogeneousGaussianEvent)
            and self.adjacency == other.adjacency
            and self.unit == other.unit
            and np.array_equal(self.sigmas, other.sigmas)
            and np.array_equal(self.sensitivities, other.sensitivities)
        )

    def __hash__(self) -> int:
        return hash((self.kind, self.adjacency, self.unit, self.sigmas.tobytes(), self.sensitivities.tobytes()))


@dataclass(frozen=True, kw_only=True)
class LaplaceEvent(PrivacyEvent):
    """Laplace mechanism: noise Lap(scale) per coordinate on a query of l1 sensitivity ``sensitivity``."""

    scale: float
    sensitivity: float = 1.0
    kind: str = field(default="laplace", init=False, repr=False)

    def __post_init__(self) -> None:
        super().__post_init__()
        object.__setattr__(self, "scale", check_positive_scalar("scale", self.scale))
        object.__setattr__(self, "sensitivity", check_positive_scalar("sensitivity", self.sensitivity))

    @property
    def epsilon(self) -> float:
        """Pure-DP epsilon = sensitivity / scale (Dwork & Roth 2014, Thm 3.6)."""
        return self.sensitivity / self.scale


#: Noise multipliers a Poisson-subsampled Gaussian event accepts (the accountants are tested on it).
NOISE_MULTIPLIER_RANGE = (1e-4, 1e6)
#: Smallest Poisson sampling rate accepted (below it dp-accounting's PLD breaks down in float64).
MIN_SAMPLE_RATE = 1e-12
#: Most repetitions of one Poisson-subsampled Gaussian step the accountants take (DP-SGD steps).
MAX_SAMPLED_STEPS = 10**9
#: Most repetitions of any one mechanism in a composition.
MAX_COMPOSITIONS = 10**15
STEPS_HINT = "split the run into stages or account a shorter one; no DP-SGD run needs more steps"


@dataclass(frozen=True, kw_only=True)
class PoissonSampledGaussianEvent(PrivacyEvent):
    """One DP-SGD step: Poisson sampling at rate ``sample_rate``, clipped sum, Gaussian noise.

    ``noise_multiplier`` = sigma / clipping norm. Wrap in :class:`RepeatedEvent`
    for T steps.
    """

    noise_multiplier: float
    sample_rate: float
    kind: str = field(default="poisson_sampled_gaussian", init=False, repr=False)

    def __post_init__(self) -> None:
        super().__post_init__()
        z = check_positive_scalar("noise_multiplier", self.noise_multiplier)
        low, high = NOISE_MULTIPLIER_RANGE
        if not low <= z <= high:
            raise InvalidParameterError(
                f"noise_multiplier must lie in [{low:g}, {high:g}] for accounting, got {z!r}; "
                + (
                    "below it every step alone has epsilon > 1e5 and no accountant bounds it reliably in floating point."
                    if z < low
                    else "above it a step's privacy loss is below float resolution (its epsilon is ~0): use the largest value."
                )
            )
        object.__setattr__(self, "noise_multiplier", z)
        q = check_sample_rate("sample_rate", self.sample_rate)
        if q < MIN_SAMPLE_RATE:
            raise InvalidParameterError(
                f"sample_rate must be at least {MIN_SAMPLE_RATE:g} for accounting, got {q!r}; a smaller rate is "
                f"bounded by the same accounting at {MIN_SAMPLE_RATE:g} (less sampling can only help), so use that."
            )
        object.__setattr__(self, "sample_rate", q)


def unsampled_gaussian_mu(leaf: PrivacyEvent) -> "float | np.ndarray | None":
    """The Gaussian-DP parameter of an elementary event that is a Gaussian mechanism without subsampling (mu-GDP,
    Dong, Roth & Su 2022), or None for any other event.

    ``mu`` of a :class:`GaussianEvent`; of a :class:`PoissonSampledGaussianEvent` at sample rate 1 (no sampling: a
    Gaussian with sensitivity C under add/remove, 2C under replace-one, noise z C), ``factor / noise_multiplier``;
    the array ``mus`` of a :class:`HeterogeneousGaussianEvent`. None for Laplace, subsampled-Gaussian and
    (epsilon, delta) events (and for composites: pass their :meth:`~PrivacyEvent.leaves`).
    """
    if isinstance(leaf, GaussianEvent):
        return leaf.mu
    if isinstance(leaf, HeterogeneousGaussianEvent):
        return leaf.mus
    if isinstance(leaf, PoissonSampledGaussianEvent) and leaf.sample_rate == 1.0:
        factor = 2.0 if leaf.adjacency is Adjacency.REPLACE_ONE else 1.0
        return factor / leaf.noise_multiplier
    return None


@dataclass(frozen=True, kw_only=True)
class EpsilonDeltaEvent(PrivacyEvent):
    """A mechanism known only through an (epsilon, delta)-DP guarantee (delta may be 0: pure DP).

    Used for mechanisms whose privacy is proved by a theorem rather than a noise
    distribution we can account exactly (e.g. the functional mechanism).
    ``source`` says where the guarantee comes from.
    """

    epsilon: float
    delta: float = 0.0
    source: str = ""
    kind: str = field(default="epsilon_delta", init=False, repr=False)

    def __post_init__(self) -> None:
        super().__post_init__()
        object.__setattr__(self, "epsilon", check_nonnegative_scalar("epsilon", self.epsilon))
        object.__setattr__(self, "delta", check_delta_scalar("delta", self.delta, allow_zero=True))
        if not isinstance(self.source, str):
            raise InvalidParameterError(f"source must be a string, got {self.source!r}.")


@dataclass(frozen=True, kw_only=True)
class RepeatedEvent(PrivacyEvent):
    """``count`` adaptive repetitions of ``event``. Adjacency and unit are the inner event's."""

    event: PrivacyEvent
    count: int
    kind: str = field(default="repeated", init=False, repr=False)

    def __init__(self, event: PrivacyEvent, count: int) -> None:  # noqa: D107
        if not isinstance(event, PrivacyEvent):
            raise InvalidParameterError(f"event must be a PrivacyEvent, got {type(event).__name__}.")
        object.__setattr__(self, "event", event)
        object.__setattr__(self, "count", check_count("count", count))
        object.__setattr__(self, "adjacency", event.adjacency)
        object.__setattr__(self, "unit", event.unit)
        object.__setattr__(self, "kind", "repeated")

    def leaves(self) -> Iterator[tuple[PrivacyEvent, int]]:
        for leaf, n in self.event.leaves():
            yield leaf, n * self.count


@dataclass(frozen=True, kw_only=True)
class ComposedEvent(PrivacyEvent):
    """Adaptive sequential composition of ``events``; all must share adjacency and unit."""

    events: tuple[PrivacyEvent, ...]
    kind: str = field(default="composed", init=False, repr=False)

    def __init__(self, events: "list[PrivacyEvent] | tuple[PrivacyEvent, ...]") -> None:  # noqa: D107
        events = tuple(events)
        if not events:
            raise InvalidParameterError("a composed event needs at least one event.")
        for e in events:
            if not isinstance(e, PrivacyEvent):
                raise InvalidParameterError(f"events must be PrivacyEvent objects, got {type(e).__name__}.")
        adjacencies = {e.adjacency for e in events}
        units = {e.unit for e in events}
        if len(adjacencies) > 1:
            raise InvalidParameterError(
                "cannot compose events under different neighbouring relations "
                f"({sorted(a.value for a in adjacencies)}); restate them under one relation."
            )
        if len(units) > 1:
            raise InvalidParameterError(
                f"cannot compose events for different privacy units ({sorted(units)}); "
                "convert them to one unit (e.g. group privacy) first."
            )
        object.__setattr__(self, "events", events)
        object.__setattr__(self, "adjacency", events[0].adjacency)
        object.__setattr__(self, "unit", events[0].unit)
        object.__setattr__(self, "kind", "composed")

    def leaves(self) -> Iterator[tuple[PrivacyEvent, int]]:
        for e in self.events:
            yield from e.leaves()


_EVENT_TYPES: dict[str, type[PrivacyEvent]] = {
    "gaussian": GaussianEvent,
    "heterogeneous_gaussian": HeterogeneousGaussianEvent,
    "laplace": LaplaceEvent,
    "poisson_sampled_gaussian": PoissonSampledGaussianEvent,
    "epsilon_delta": EpsilonDeltaEvent,
    "repeated": RepeatedEvent,
    "composed": ComposedEvent,
}


def event_from_dict(data: Any) -> PrivacyEvent:
    """Rebuild an event from :meth:`PrivacyEvent.to_dict` output; malformed input raises InvalidParameterError."""
    if not isinstance(data, dict) or "kind" not in data:
        raise InvalidParameterError(f"an event must be a JSON object with a 'kind' key, got {data!r:.80}.")
    kind = data["kind"]
    if kind not in _EVENT_TYPES:
        raise InvalidParameterError(f"unknown event kind {kind!r}; known kinds: {', '.join(_EVENT_TYPES)}.")
    fields = {k: v for k, v in data.items() if k != "kind"}
    try:
        if kind == "repeated":
            return RepeatedEvent(event_from_dict(fields["event"]), fields["count"])
        if kind == "composed":
            return ComposedEvent([event_from_dict(e) for e in fields["events"]])
        return _EVENT_TYPES[kind](**fields)
    except (KeyError, TypeError) as exc:
        raise InvalidParameterError(f"malformed {kind!r} event: {exc}.") from exc
