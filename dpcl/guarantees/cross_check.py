"""Independent recomputation of a certificate's epsilon with dp-accounting (``dpcl verify --cross-check``).

``dpcl verify`` recomputes a certificate's epsilon with dpcl's own accountants;
that catches edits, not a wrong formula in dpcl. The cross-check recomputes it
with another implementation: the certificate's events are converted to
dp-accounting ``DpEvent`` objects (:mod:`dpcl.accounting.interop`) and
composed by dp-accounting's privacy-loss-distribution accountant, per
composition group exactly as the certificate composes them (Tobaben et al.,
Thm 4.4: under ``parallel`` the stream's epsilon is the largest group's; under
``sequential`` there is one group).

Two numbers per group, both from dp-accounting at the value discretisation
interval :data:`CROSS_CHECK_INTERVAL`:

``upper``
    ``PLDAccountant`` (pessimistic estimate, connect-the-dots): an upper bound on
    the true epsilon whatever the discretisation. This is the independent epsilon
    reported.
``lower``
    the same events as optimistic PLDs (``pessimistic_estimate=False``, built with
    dp-accounting's ``privacy_loss_distribution`` constructors; truncated tail
    mass dropped): a lower bound on the true epsilon.

So the true epsilon lies in ``[lower, upper]`` and ``upper - lower`` bounds the
discretisation error of the independent number. A stated epsilon below
``lower`` -- below the independent one by more than that error -- is an
under-statement: no discretisation explains it, and the cross-check fails
(``dpcl verify`` exits 3). Every group's stated epsilon is checked the same way.

What is cross-checked: the headline guarantee when the checkpoint is private
(certificate version 1 always; version 2 when ``guarantee.private`` is true),
and every entry of ``scoped_guarantees`` (version 2). A certificate without
either (a non-private checkpoint without scoped statements) is skipped with a
message. A group whose events have no dp-accounting counterpart (an
``epsilon_delta`` event) or that dp-accounting's PLD does not analyse is
reported as not cross-checked, with the reason; it neither passes nor fails. So is a
group whose PLD would need more than :data:`CROSS_CHECK_MAX_POINTS` grid points (sized
before anything is allocated), one that dp-accounting cannot evaluate in floating point,
and one for which it gives no finite epsilon (a delta below what its discretisation resolves).

Repetition stays compressed: a ``RepeatedEvent`` (and a run of equal charges stored once with
``"repeat": n``, certificate version 3) becomes one dp-accounting ``SelfComposedDpEvent``, which the PLD
accountant composes by self-convolution from its count.

Replace-one Laplace events (L2DP-ML): dp-accounting's PLD analyses Laplace only
under add/remove; without Poisson subsampling a replace-one mechanism has the
same privacy curve as add/remove at the same shift, so such a group is
restated under add/remove (:func:`dpcl.accounting.interop.to_dp_event`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, Sequence

from dpcl.accounting.accountants import PLD_LIBRARY_FAILURES, check_pld_fits
from dpcl.accounting.events import Adjacency, ComposedEvent, PrivacyEvent
from dpcl.accounting.interop import has_subsampling, neighboring_relation, to_dp_event
from dpcl.errors import InvalidParameterError, MalformedCertificateError, UnsupportedEventError
from dpcl._io.atomic_io import read_json
from dpcl.guarantees.ledger import (
    ACROSS_TASKS,
    _composition_groups,
    _group_events,
    charges_from_list,
    expand_indices,
)

__all__ = [
    "CROSS_CHECK_INTERVAL",
    "GroupCrossCheck",
    "StatementCrossCheck",
    "CrossCheckReport",
    "independent_epsilon",
    "cross_check_certificate",
]

#: Value discretisation interval of both PLDs (dp-accounting's default; dpcl's ``pld`` accountant uses the same).
CROSS_CHECK_INTERVAL = 1e-4

#: Most grid points a cross-checked group's PLD may need (sized before anything is allocated, by the ``pld``
#: accountant's sizing, :func:`dpcl.accounting.accountants.check_pld_fits`): half of what dpcl's own PLD
#: allocates, since the pessimistic and the optimistic PLD are held together; a larger group is not
#: cross-checked (with the reason), so that ``dpcl verify --cross-check`` stays within 2 GB.
CROSS_CHECK_MAX_POINTS = 6e6


@dataclass(frozen=True)
class IndependentEpsilon:
    """dp-accounting's bounds on the true epsilon of some events: ``lower <= true <= upper``."""

    upper: float
    lower: float
    relation: str
    interval: float
    notes: tuple[str, ...] = ()

    @property
    def discretisation_error(self) -> float:
        return self.upper - self.lower


def _optimistic_pld(dp_event: Any, relation: Any, interval: float, count: int = 1) -> Any | None:
    """Optimistic PLD of ``dp_event`` composed ``count`` times (None for an empty composition).

    Mirrors the dispatch of dp-accounting's ``PLDAccountant`` for the event types
    :func:`~dpcl.accounting.interop.to_dp_event` produces, with
    ``pessimistic_estimate=False`` (the accountant has no such switch).
    """
    from dp_accounting import dp_event as dp
    from dp_accounting.pld import privacy_loss_distribution as pld_lib
    from dp_accounting.privacy_accountant import NeighboringRelation

    common = dict(pessimistic_estimate=False, value_discretization_interval=interval)
    if isinstance(dp_event, dp.SelfComposedDpEvent):
        return _optimistic_pld(dp_event.event, relation, interval, count * dp_event.count)
    if isinstance(dp_event, dp.ComposedDpEvent):
        total = None
        for inner in dp_event.events:
            part = _optimistic_pld(inner, relation, interval, count)
            total = part if total is None else (total if part is None else total.compose(part))
        return total
    if isinstance(dp_event, dp.GaussianDpEvent):
        # count Gaussians = one with std / sqrt(count); rounded up (more noise) so the bound stays a lower bound
        std = math.nextafter(dp_event.noise_multiplier / math.sqrt(count), math.inf)
        return pld_lib.from_gaussian_mechanism(
            standard_deviation=std, neighboring_relation=relation, use_connect_dots=False, **common
        )
    if isinstance(dp_event, dp.LaplaceDpEvent):
        if relation is not NeighboringRelation.ADD_OR_REMOVE_ONE:
            raise UnsupportedEventError("dp-accounting's PLD analyses Laplace events under add/remove only.")
        return pld_lib.from_laplace_mechanism(
            parameter=dp_event.noise_multiplier, use_connect_dots=False, **common
        ).self_compose(count)
    if isinstance(dp_event, dp.PoissonSampledDpEvent) and isinstance(dp_event.event, dp.GaussianDpEvent):
        return pld_lib.from_gaussian_mechanism(
            standard_deviation=dp_event.event.noise_multiplier, sampling_prob=dp_event.sampling_probability,
            neighboring_relation=relation, use_connect_dots=False, **common,
        ).self_compose(count)
    raise UnsupportedEventError(f"no optimistic PLD for {type(dp_event).__name__}.")


def independent_epsilon(
    events: PrivacyEvent | Sequence[PrivacyEvent], delta: float, interval: float = CROSS_CHECK_INTERVAL
) -> IndependentEpsilon:
    """dp-accounting's upper (pessimistic PLD accountant) and lower (optimistic PLD) epsilon of ``events``.

    The events are converted with :func:`~dpcl.accounting.interop.to_dp_event`
    and accounted under their own neighbouring relation, or restated under
    add/remove when dp-accounting's PLD does not analyse them under replace-one
    and they hold no Poisson subsampling. Raises
    :class:`~dpcl.errors.UnsupportedEventError` when neither works.
    """
    if not (isinstance(delta, float) and 0 < delta < 1):
        raise InvalidParameterError(f"delta must be a number in (0, 1), got {delta!r}.")
    if not (isinstance(interval, float) and 0 < interval < 1):
        raise InvalidParameterError(f"interval must be a number in (0, 1), got {interval!r}.")
    root = events if isinstance(events, PrivacyEvent) else ComposedEvent(list(events))
    key = (root, delta, interval)
    if key not in _CACHE:
        if len(_CACHE) >= _CACHE_SIZE:
            _CACHE.pop(next(iter(_CACHE)))
        _CACHE[key] = _independent_epsilon(root, delta, interval)
    return _CACHE[key]


#: Groups recur across the certificates of one run (task k's certificate holds the groups of tasks < k under
#: parallel composition): results are memoised per process by (events, delta, interval); events are immutable.
_CACHE: dict[Any, IndependentEpsilon] = {}
_CACHE_SIZE = 256


def _independent_epsilon(root: PrivacyEvent, delta: float, interval: float) -> IndependentEpsilon:
    from dp_accounting.pld.pld_privacy_accountant import PLDAccountant

    notes: list[str] = []
    relation = root.adjacency
    dp_event = to_dp_event(root)
    accountant = PLDAccountant(neighboring_relation(relation), value_discretization_interval=interval)
    if not accountant.supports(dp_event):
        if relation is Adjacency.REPLACE_ONE and not has_subsampling(root):
            relation = Adjacency.ADD_REMOVE
            dp_event = to_dp_event(root, relation=relation)
            accountant = PLDAccountant(neighboring_relation(relation), value_discretization_interval=interval)
            notes.append(
                "replace-one events without Poisson subsampling restated under add/remove (same privacy curve): "
                "dp-accounting's PLD analyses Laplace only under add/remove."
            )
        if not accountant.supports(dp_event):
            raise UnsupportedEventError(
                f"dp-accounting's PLD accountant does not analyse these events under {relation.value!r}."
            )
    check_pld_fits(root, interval, CROSS_CHECK_MAX_POINTS)  # refused before dp-accounting allocates anything
    try:
        accountant.compose(dp_event)
        upper = float(accountant.get_epsilon(delta))
        optimistic = _optimistic_pld(dp_event, neighboring_relation(relation), interval)
        lower = float(optimistic.get_epsilon_for_delta(delta)) if optimistic is not None else 0.0
    except (*PLD_LIBRARY_FAILURES, MemoryError) as exc:
        raise UnsupportedEventError(
            f"dp-accounting's PLD cannot evaluate these events ({type(exc).__name__}: {str(exc)[:120]})."
        ) from None
    if not (math.isfinite(upper) and math.isfinite(lower)):
        raise UnsupportedEventError(
            f"dp-accounting's PLD gives no finite epsilon at delta={delta!r} (its discretisation does not resolve "
            "so small a delta): nothing to compare with."
        )
    return IndependentEpsilon(upper=upper, lower=min(lower, upper), relation=relation.value,
                              interval=interval, notes=tuple(notes))


@dataclass(frozen=True)
class GroupCrossCheck:
    """One composition group: the stated epsilon (if the certificate states one) and dp-accounting's bounds."""

    tasks: tuple[int, ...]
    charges: tuple[int, ...]
    stated_epsilon: float | None
    independent_epsilon: float | None
    lower_epsilon: float | None
    relation: str | None = None
    skipped: str = ""

    @property
    def passed(self) -> bool:
        if self.skipped or self.stated_epsilon is None or self.lower_epsilon is None:
            return True
        return self.stated_epsilon >= self.lower_epsilon

    def to_dict(self) -> dict[str, Any]:
        return {
            "tasks": list(self.tasks),
            "charges": list(self.charges),
            "stated_epsilon": self.stated_epsilon,
            "independent_epsilon": self.independent_epsilon,
            "lower_epsilon": self.lower_epsilon,
            "relation": self.relation,
            "passed": self.passed,
            "skipped": self.skipped or None,
        }


@dataclass(frozen=True)
class StatementCrossCheck:
    """The cross-check of one stated guarantee (``checkpoint`` for the headline, else a scoped statement's name)."""

    name: str
    stated_epsilon: float
    delta: float
    across_tasks: str
    groups: tuple[GroupCrossCheck, ...]
    interval: float
    notes: tuple[str, ...] = ()

    @property
    def skipped(self) -> str:
        reasons = [g.skipped for g in self.groups if g.skipped]
        return "; ".join(dict.fromkeys(reasons))

    @property
    def independent_epsilon(self) -> float | None:
        """dp-accounting's epsilon of the stream: the largest group's (parallel) or the only group's."""
        if self.skipped:
            return None
        return max(g.independent_epsilon for g in self.groups)

    @property
    def lower_epsilon(self) -> float | None:
        if self.skipped:
            return None
        return max(g.lower_epsilon for g in self.groups)

    @property
    def discretisation_error(self) -> float | None:
        if self.skipped:
            return None
        return self.independent_epsilon - self.lower_epsilon

    @property
    def passed(self) -> bool:
        ok_stream = self.skipped or self.stated_epsilon >= self.lower_epsilon
        return bool(ok_stream) and all(g.passed for g in self.groups)

    @property
    def detail(self) -> str:
        if self.skipped:
            return f"not cross-checked: {self.skipped}"
        verdict = "pass" if self.passed else "FAIL"
        text = (
            f"{verdict}: stated epsilon {self.stated_epsilon:.6g}, dp-accounting PLD {self.independent_epsilon:.6g} "
            f"(pessimistic; the true epsilon is at least {self.lower_epsilon:.6g}, discretisation error "
            f"<= {self.discretisation_error:.3g} at interval {self.interval:g}), delta {self.delta:g}"
        )
        if not self.passed:
            bad = [g for g in self.groups if not g.passed]
            text += "; the stated epsilon is below the independent one by more than the discretisation error"
            if bad:
                text += " (groups " + ", ".join(
                    f"tasks {list(g.tasks)}: stated {g.stated_epsilon:.6g} < {g.lower_epsilon:.6g}" for g in bad
                ) + ")"
        return text

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "passed": self.passed,
            "skipped": self.skipped or None,
            "stated_epsilon": self.stated_epsilon,
            "independent_epsilon": self.independent_epsilon,
            "lower_epsilon": self.lower_epsilon,
            "discretisation_error": self.discretisation_error,
            "delta": self.delta,
            "across_tasks": self.across_tasks,
            "accountant": "dp-accounting PLDAccountant (pessimistic) / optimistic PLD",
            "value_discretization_interval": self.interval,
            "groups": [g.to_dict() for g in self.groups],
            "notes": list(self.notes),
        }


@dataclass(frozen=True)
class CrossCheckReport:
    """Outcome of :func:`cross_check_certificate`: one entry per cross-checked statement."""

    path: str
    statements: tuple[StatementCrossCheck, ...] = field(default_factory=tuple)
    message: str = ""

    @property
    def passed(self) -> bool:
        return all(s.passed for s in self.statements)

    def to_dict(self) -> dict[str, Any]:
        return {
            "certificate": self.path,
            "passed": self.passed,
            "message": self.message or None,
            "statements": [s.to_dict() for s in self.statements],
        }


def _statement(
    name: str, stated: Mapping[str, Any], raw_charges: Any, interval: float
) -> StatementCrossCheck:
    try:
        charges = charges_from_list(raw_charges, f"{name} events")  # "repeat": n equal charges, never expanded
        epsilon = float(stated["epsilon"])
        delta = float(stated["delta"])
        across = str(stated["across_tasks"])
        stated_groups = {
            expand_indices(g["tasks"], f"{name} group tasks"): float(g["epsilon"]) for g in stated.get("groups", ())
        }
    except (KeyError, TypeError, ValueError, InvalidParameterError) as exc:
        raise MalformedCertificateError(f"{name} guarantee cannot be cross-checked: malformed ({exc}).") from exc
    if across not in ACROSS_TASKS or not charges:
        raise MalformedCertificateError(
            f"{name} guarantee cannot be cross-checked: across_tasks must be one of {', '.join(ACROSS_TASKS)} "
            "and at least one charge must be recorded."
        )
    groups: list[GroupCrossCheck] = []
    notes: list[str] = []
    for tasks, idx in _composition_groups(charges, across):
        events = _group_events(charges, idx)  # a run of equal charges: one SelfComposedDpEvent
        try:
            bounds = independent_epsilon(events, delta, interval)
        except InvalidParameterError as exc:  # UnsupportedEventError, or events dpcl refuses: not bounded here
            groups.append(GroupCrossCheck(tasks, idx, stated_groups.get(tasks), None, None, skipped=str(exc)))
            continue
        notes.extend(n for n in bounds.notes if n not in notes)
        groups.append(GroupCrossCheck(tasks, idx, stated_groups.get(tasks), bounds.upper, bounds.lower, bounds.relation))
    return StatementCrossCheck(name, epsilon, delta, across, tuple(groups), interval, tuple(notes))


def cross_check_certificate(
    certificate: "str | Path | Mapping[str, Any]", interval: float = CROSS_CHECK_INTERVAL
) -> CrossCheckReport:
    """Cross-check a certificate (a path or its parsed JSON) against dp-accounting; see the module docstring.

    The certificate's structure is taken as given (``dpcl verify`` checks it and
    its integrity first); a field the cross-check needs that is missing or
    malformed raises :class:`~dpcl.errors.MalformedCertificateError`.
    """
    if isinstance(certificate, Mapping):
        data, path = certificate, "<certificate>"
    else:
        path = str(certificate)
        try:
            data = read_json(Path(certificate))
        except FileNotFoundError:
            raise MalformedCertificateError(f"certificate {path!r} does not exist.") from None
        except (ValueError, UnicodeDecodeError) as exc:
            raise MalformedCertificateError(f"certificate {path!r} is not valid JSON: {exc}.") from exc
    if not isinstance(data, Mapping) or not isinstance(data.get("guarantee"), Mapping):
        raise MalformedCertificateError(f"{path!r} has no guarantee to cross-check.")
    statements: list[StatementCrossCheck] = []
    headline = data["guarantee"]
    private = headline.get("private", True)  # version 1 certificates have no 'private': always private
    if private is True:
        statements.append(_statement("checkpoint", headline, data.get("events"), interval))
    scoped = data.get("scoped_guarantees") or []
    if not isinstance(scoped, list):
        raise MalformedCertificateError("scoped_guarantees must be a list of statements.")
    for entry in scoped:
        if not isinstance(entry, Mapping):
            raise MalformedCertificateError("every scoped guarantee must be an object.")
        statements.append(_statement(f"scoped {entry.get('name', '?')}", entry, entry.get("events"), interval))
    message = ""
    if private is not True:
        message = (
            "the checkpoint is not private (no headline epsilon): "
            + ("only the scoped statements were cross-checked." if statements else
               "there is no epsilon to cross-check.")
        )
    return CrossCheckReport(path=path, statements=tuple(statements), message=message)
