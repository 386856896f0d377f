"""Conversion between dpcl's privacy events and dp-accounting's ``DpEvent`` objects.

:func:`to_dp_event` turns a :class:`~dpcl.accounting.events.PrivacyEvent` into
the ``dp_accounting.dp_event.DpEvent`` that any dp-accounting accountant
(``PLDAccountant``, ``RdpAccountant``) consumes; :func:`from_dp_event` turns a
``DpEvent`` back into dpcl's events. Both directions keep the privacy curve
exactly (the same dominating pair of distributions), so an epsilon computed by
dp-accounting from the converted events is an independent number for the same
mechanism (used by ``dpcl verify --cross-check``,
:mod:`dpcl.guarantees.cross_check`).

Conventions (the part that needs care):

* A dp-accounting event carries no neighbouring relation and no privacy unit: the
  relation is a property of the accountant (``NeighboringRelation``). The
  ``DpEvent`` returned by :func:`to_dp_event` must be accounted under
  :func:`neighboring_relation` of the event's adjacency (or of the ``relation``
  it was restated under); :func:`from_dp_event` takes ``adjacency`` and
  ``unit`` as arguments.
* dp-accounting's ``noise_multiplier`` is the noise scale over the bound ``C``
  on *one record's* contribution (l2 norm for Gaussian, l1 for Laplace); its
  accountant derives the shift from the relation: ``C`` under add/remove, ``2C``
  under replace-one (``privacy_loss_mechanism.AdditiveNoisePrivacyLoss``, REPLACE
  adjacency). A dpcl Gaussian/Laplace event states its sensitivity *under its
  own relation* (``2C`` already under replace-one). So the noise multiplier is
  ``sigma / sensitivity`` under add/remove and ``sigma / (sensitivity / 2)``
  under replace-one; back, a multiplier ``z`` becomes ``sigma = z`` at
  sensitivity 1 (add/remove) or 2 (replace-one).
* A Poisson-subsampled Gaussian's noise multiplier is relative to the clipping
  norm in both libraries (DP-SGD): it converts unchanged, as
  ``PoissonSampledDpEvent(q, GaussianDpEvent(z))``.
* Without Poisson subsampling, replace-one with record bound ``C`` has the same
  privacy curve as add/remove with shift ``2C`` (dp-accounting's note in
  ``AdditiveNoisePrivacyLoss``). ``to_dp_event(event, relation=...)`` uses this
  to restate such an event under the other relation (dp-accounting's PLD
  accountant analyses Laplace events only under add/remove); a subsampled event
  cannot be restated and is refused.

Exactness. ``DpEvent -> dpcl -> DpEvent`` is the identity for every supported
event. ``dpcl -> DpEvent -> dpcl`` returns the event in its canonical form
(sensitivity 1 under add/remove, 2 under replace-one), equal to the original
when it already was canonical; the noise multiplier ``sigma / sensitivity`` is
exact whenever the quotient is a float (e.g. a power-of-two sensitivity),
otherwise it is rounded *down* by one unit in the last place, so the converted
mechanism never has more noise than the original (a bound computed from it
stays an upper bound). A :class:`~dpcl.accounting.events.HeterogeneousGaussianEvent`
becomes a ``ComposedDpEvent`` of one ``SelfComposedDpEvent`` per distinct
noise multiplier (composition is commutative), which converts back to a
:class:`~dpcl.accounting.events.ComposedEvent` with the same privacy curve.

Refused with :class:`~dpcl.errors.UnsupportedEventError` naming the event and why:
:class:`~dpcl.accounting.events.EpsilonDeltaEvent` (dp-accounting has no event
for a mechanism known only by an (epsilon, delta) guarantee), and every
``DpEvent`` without a dpcl counterpart (no-op, non-private, randomized
response, discrete Laplace, sampling with/without replacement, tree
aggregation, repeat-and-select, mixtures of Gaussians, zCDP, truncated
subsampling, Poisson-subsampled Laplace, a sampling probability of 0 or a
count of 0).

Why a hand-written module: dp-accounting defines the ``DpEvent`` types but
knows nothing of dpcl's events; this module only maps parameters between the
two and computes no privacy number itself.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from dpcl.accounting.events import (
    Adjacency,
    ComposedEvent,
    EpsilonDeltaEvent,
    GaussianEvent,
    HeterogeneousGaussianEvent,
    LaplaceEvent,
    PoissonSampledGaussianEvent,
    PrivacyEvent,
    RepeatedEvent,
)
from dpcl.errors import InvalidParameterError, UnsupportedEventError

__all__ = ["from_dp_event", "has_subsampling", "neighboring_relation", "to_dp_event"]

#: Sensitivity of a canonical dpcl Gaussian/Laplace event under each relation (one record's bound C = 1).
CANONICAL_SENSITIVITY = {Adjacency.ADD_REMOVE: 1.0, Adjacency.REPLACE_ONE: 2.0}


def _dp_event_module() -> Any:
    from dp_accounting import dp_event

    return dp_event


def neighboring_relation(adjacency: "Adjacency | str") -> Any:
    """dp-accounting's ``NeighboringRelation`` for a dpcl adjacency."""
    from dp_accounting.privacy_accountant import NeighboringRelation

    adj = Adjacency.parse(adjacency)
    return NeighboringRelation.REPLACE_ONE if adj is Adjacency.REPLACE_ONE else NeighboringRelation.ADD_OR_REMOVE_ONE


def has_subsampling(event: PrivacyEvent) -> bool:
    """True when a leaf of ``event`` is a Poisson-subsampled Gaussian with sample rate below 1."""
    return any(isinstance(leaf, PoissonSampledGaussianEvent) and leaf.sample_rate < 1.0 for leaf, _ in event.leaves())


def _two_product(a: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``a * b = p + e`` exactly (Dekker 1971, Veltkamp splitting); finite, non-overflowing inputs."""
    p = a * b
    split = 134217729.0  # 2**27 + 1
    ca = split * a
    a_hi = ca - (ca - a)
    a_lo = a - a_hi
    cb = split * b
    b_hi = cb - (cb - b)
    b_lo = b - b_hi
    e = ((a_hi * b_hi - p) + a_hi * b_lo + a_lo * b_hi) + a_lo * b_lo
    return p, e


def quotient_rounded_down(numerator: np.ndarray | float, denominator: np.ndarray | float) -> np.ndarray:
    """``numerator / denominator`` (positive floats), rounded down: exact when the quotient is a float.

    The correctly rounded quotient ``q`` is stepped down one ulp exactly when
    ``q * denominator`` exceeds ``numerator`` (checked with an error-free product,
    Dekker 1971); where the check itself could over- or underflow, ``q`` is
    stepped down unconditionally (still rounded down, at most 2 ulp).
    """
    num = np.asarray(numerator, dtype=np.float64)
    den = np.asarray(denominator, dtype=np.float64)
    with np.errstate(over="ignore", under="ignore", invalid="ignore"):
        q = num / den
        p, e = _two_product(q, den)
        excess = (p - num) + e  # p - num is exact (Sterbenz): q * den is within 2 ulp of num
        checkable = np.isfinite(p) & np.isfinite(e) & (np.abs(num) > 2.0**-960) & (np.abs(num) < 2.0**960) \
            & (np.abs(q) > 2.0**-960) & (np.abs(q) < 2.0**960)
    down = np.nextafter(q, 0.0)
    return np.where(checkable, np.where(excess > 0, down, q), down)


def _noise_multiplier(scale: float, sensitivity: float, relation: Adjacency) -> float:
    """dp-accounting's noise multiplier under ``relation`` for noise ``scale`` on a query of ``sensitivity``.

    Without subsampling the curve is a shift by ``sensitivity`` (in noise units ``sensitivity / scale``) under
    either relation; dp-accounting shifts by ``CANONICAL_SENSITIVITY[relation] / multiplier``.
    """
    bound = sensitivity / CANONICAL_SENSITIVITY[relation]  # division by 1 or 2: exact
    multiplier = float(quotient_rounded_down(scale, bound))
    if not (np.isfinite(multiplier) and multiplier > 0):
        raise UnsupportedEventError(
            f"noise scale {scale!r} over record bound {bound!r} is not a positive finite float; dp-accounting "
            "cannot represent this mechanism."
        )
    return multiplier


def to_dp_event(event: PrivacyEvent, relation: "Adjacency | str | None" = None) -> Any:
    """The dp-accounting ``DpEvent`` with the same privacy curve as ``event``.

    The result is to be accounted under ``neighboring_relation(relation)``;
    ``relation`` defaults to ``event.adjacency``. Restating an event under the
    other relation is exact for events without Poisson subsampling (see the
    module docstring) and refused otherwise. Events without a dp-accounting
    counterpart raise :class:`~dpcl.errors.UnsupportedEventError`.
    """
    if not isinstance(event, PrivacyEvent):
        raise InvalidParameterError(f"to_dp_event needs a dpcl PrivacyEvent, got {type(event).__name__}.")
    target = event.adjacency if relation is None else Adjacency.parse(relation)
    if target is not event.adjacency and has_subsampling(event):
        raise UnsupportedEventError(
            f"a {event.kind!r} event stated under {event.adjacency.value!r} with Poisson subsampling (sample rate < 1) "
            f"has a different privacy curve under {target.value!r}; account it under {event.adjacency.value!r}."
        )
    return _to_dp(event, target)


def _to_dp(event: PrivacyEvent, relation: Adjacency) -> Any:
    dp = _dp_event_module()
    if isinstance(event, GaussianEvent):
        return dp.GaussianDpEvent(_noise_multiplier(event.sigma, event.sensitivity, relation))
    if isinstance(event, LaplaceEvent):
        return dp.LaplaceDpEvent(_noise_multiplier(event.scale, event.sensitivity, relation))
    if isinstance(event, PoissonSampledGaussianEvent):
        z = event.noise_multiplier
        if relation is not event.adjacency:  # only reached with sample_rate == 1 (checked by to_dp_event)
            # add/remove shift C <-> replace-one shift 2C: z relative to C becomes 2z or z/2 relative to the new bound
            z = z * 2.0 if relation is Adjacency.REPLACE_ONE else z / 2.0
            if not (np.isfinite(z) and z > 0):
                raise UnsupportedEventError(
                    f"noise multiplier {event.noise_multiplier!r} restated under {relation.value!r} is not a positive "
                    "finite float; dp-accounting cannot represent this mechanism."
                )
        return dp.PoissonSampledDpEvent(event.sample_rate, dp.GaussianDpEvent(z))
    if isinstance(event, HeterogeneousGaussianEvent):
        sens = np.broadcast_to(event.sensitivities, event.sigmas.shape)
        bound = sens / CANONICAL_SENSITIVITY[relation]
        multipliers = quotient_rounded_down(event.sigmas, bound)
        if not np.all(np.isfinite(multipliers) & (multipliers > 0)):
            raise UnsupportedEventError(
                "a heterogeneous_gaussian event has a noise multiplier (sigma / record bound) that is not a positive "
                "finite float; dp-accounting cannot represent it."
            )
        values, counts = np.unique(multipliers, return_counts=True)
        parts = [
            dp.GaussianDpEvent(float(v)) if c == 1 else dp.SelfComposedDpEvent(dp.GaussianDpEvent(float(v)), int(c))
            for v, c in zip(values.tolist(), counts.tolist())
        ]
        return parts[0] if len(parts) == 1 else dp.ComposedDpEvent(parts)
    if isinstance(event, RepeatedEvent):
        return dp.SelfComposedDpEvent(_to_dp(event.event, relation), event.count)
    if isinstance(event, ComposedEvent):
        return dp.ComposedDpEvent([_to_dp(e, relation) for e in event.events])
    if isinstance(event, EpsilonDeltaEvent):
        raise UnsupportedEventError(
            f"an epsilon_delta event (epsilon={event.epsilon!r}, delta={event.delta!r}"
            + (f", {event.source}" if event.source else "")
            + ") has no dp-accounting counterpart: dp-accounting's DpEvents describe noise distributions, and this "
            "mechanism is known only through its (epsilon, delta) guarantee. Account it with dpcl's 'basic' or "
            "'advanced' accountant."
        )
    raise UnsupportedEventError(f"a {event.kind or type(event).__name__!r} event has no dp-accounting counterpart.")


def _adjacency_of(relation: Any) -> Adjacency:
    """A dpcl adjacency from a dpcl name or a dp-accounting ``NeighboringRelation``."""
    from dp_accounting.privacy_accountant import NeighboringRelation

    if isinstance(relation, NeighboringRelation):
        if relation is NeighboringRelation.ADD_OR_REMOVE_ONE:
            return Adjacency.ADD_REMOVE
        if relation is NeighboringRelation.REPLACE_ONE:
            return Adjacency.REPLACE_ONE
        raise UnsupportedEventError(
            f"dpcl has no neighbouring relation for dp-accounting's {relation.name}; use ADD_OR_REMOVE_ONE or "
            "REPLACE_ONE."
        )
    return Adjacency.parse(relation)


def from_dp_event(dp_event: Any, adjacency: "Adjacency | str", unit: str = "example") -> PrivacyEvent:
    """The dpcl event with the same privacy curve as ``dp_event`` accounted under ``adjacency``.

    dp-accounting's events carry neither the neighbouring relation nor the
    privacy unit, so both are arguments: ``adjacency`` is the relation the
    ``DpEvent`` is meant to be accounted under (``add_remove`` for dp-accounting's
    ``ADD_OR_REMOVE_ONE``, ``replace_one`` for ``REPLACE_ONE``; either
    ``NeighboringRelation`` is accepted too). Events without a
    dpcl counterpart raise :class:`~dpcl.errors.UnsupportedEventError` naming
    the event class and why.
    """
    adj = _adjacency_of(adjacency)
    if not isinstance(unit, str) or not unit.strip():
        raise InvalidParameterError(f"unit must be a non-empty string such as 'example'; got {unit!r}.")
    return _from_dp(dp_event, adj, unit)


_NO_COUNTERPART = {
    "NoOpDpEvent": "it charges nothing: leave it out of the dpcl events",
    "NonPrivateDpEvent": "the mechanism is not differentially private for any epsilon, so no dpcl event can state it",
    "UnsupportedDpEvent": "dp-accounting itself has no privacy analysis for it",
    "RandomizedResponseDpEvent": "dpcl has no randomized-response event",
    "DiscreteLaplaceDpEvent": "dpcl has no discrete Laplace event",
    "SampledWithReplacementDpEvent": "dpcl accounts Poisson subsampling only",
    "SampledWithoutReplacementDpEvent": "dpcl accounts Poisson subsampling only",
    "SingleEpochTreeAggregationDpEvent": "dpcl has no tree-aggregation event",
    "RepeatAndSelectDpEvent": "dpcl has no repeat-and-select event",
    "MixtureOfGaussiansDpEvent": "dpcl has no mixture-of-Gaussians event",
    "ZCDpEvent": "dpcl has no zCDP event",
    "TruncatedSubsampledGaussianDpEvent": "dpcl accounts untruncated Poisson subsampling only",
}


def _positive_multiplier(name: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float, np.floating, np.integer)) \
            or not np.isfinite(value) or value <= 0:
        raise UnsupportedEventError(
            f"a {name} with noise multiplier {value!r} has no dpcl counterpart: dpcl events need a positive finite "
            "noise scale (a noise multiplier of 0 is not private)."
        )
    return float(value)


def _from_dp(ev: Any, adj: Adjacency, unit: str) -> PrivacyEvent:
    dp = _dp_event_module()
    name = type(ev).__name__
    if not isinstance(ev, dp.DpEvent):
        raise InvalidParameterError(f"from_dp_event needs a dp_accounting DpEvent, got {name}.")
    if isinstance(ev, dp.GaussianDpEvent):
        sigma = _positive_multiplier(name, ev.noise_multiplier)
        return GaussianEvent(sigma=sigma, sensitivity=CANONICAL_SENSITIVITY[adj], adjacency=adj, unit=unit)
    if isinstance(ev, dp.LaplaceDpEvent):
        scale = _positive_multiplier(name, ev.noise_multiplier)
        return LaplaceEvent(scale=scale, sensitivity=CANONICAL_SENSITIVITY[adj], adjacency=adj, unit=unit)
    if isinstance(ev, dp.PoissonSampledDpEvent):
        q = ev.sampling_probability
        if not isinstance(ev.event, dp.GaussianDpEvent):
            raise UnsupportedEventError(
                f"a PoissonSampledDpEvent of a {type(ev.event).__name__} has no dpcl counterpart: dpcl accounts "
                "Poisson subsampling of the Gaussian mechanism only (DP-SGD)."
            )
        if isinstance(q, bool) or not isinstance(q, (int, float, np.floating)) or not 0 < q <= 1:
            raise UnsupportedEventError(
                f"a PoissonSampledDpEvent with sampling probability {q!r} has no dpcl counterpart: dpcl needs a rate "
                "in (0, 1] (a rate of 0 reads no record: leave the event out)."
            )
        z = _positive_multiplier("PoissonSampledDpEvent's GaussianDpEvent", ev.event.noise_multiplier)
        return PoissonSampledGaussianEvent(noise_multiplier=z, sample_rate=float(q), adjacency=adj, unit=unit)
    if isinstance(ev, dp.SelfComposedDpEvent):
        count = ev.count
        if isinstance(count, bool) or not isinstance(count, (int, np.integer)) or count < 1:
            raise UnsupportedEventError(
                f"a SelfComposedDpEvent with count {count!r} has no dpcl counterpart: dpcl repeats an event 1 or "
                "more times (a count of 0 charges nothing: leave it out)."
            )
        return RepeatedEvent(_from_dp(ev.event, adj, unit), int(count))
    if isinstance(ev, dp.ComposedDpEvent):
        if not ev.events:
            raise UnsupportedEventError(
                "an empty ComposedDpEvent has no dpcl counterpart: it charges nothing, leave it out."
            )
        return ComposedEvent([_from_dp(e, adj, unit) for e in ev.events])
    reason = _NO_COUNTERPART.get(name, "dpcl has no event for this mechanism")
    raise UnsupportedEventError(f"a {name} has no dpcl counterpart: {reason}.")
