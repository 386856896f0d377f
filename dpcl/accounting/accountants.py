"""Accountants: turn privacy events into one (epsilon, delta) upper bound.

``compute_epsilon(events, delta, accountant)`` composes the events adaptively
and returns an :class:`AccountingResult` naming epsilon, delta, the neighbouring
relation, the privacy unit, the accountant, the candidates it compared and the
assumptions/settings behind the number. Accountants:

``exact``
    Compositions of Gaussian mechanisms (any sigmas/sensitivities, incl. a DP-SGD
    run with sample rate 1): mu = sqrt(sum mu_i^2) is exact (Dong, Roth & Su 2022,
    Cor. 3.3) and its epsilon is the root of Balle & Wang (2018) Thm 8. A single
    Laplace mechanism: the inverse of its exact profile. Nothing else.
``basic`` / ``advanced``
    Every event type. Events with a whole privacy profile (Gaussian, subsampled
    Gaussian) get a delta share; ``basic`` sums (Dwork & Roth 2014, Thm 3.16),
    ``advanced`` is Kairouz, Oh & Viswanath (2017) Thm 3.5 with the slack/delta
    split optimised on a grid. Poisson subsampling is amplified by
    (log(1 + q(e^eps - 1)), q delta) (Balle, Barthe & Gaboardi 2018, Poisson subsampling under add/remove).
``rdp``
    dp-accounting's ``RdpAccountant`` (default orders; its RDP-to-DP conversion).
``pld``
    dp-accounting's privacy loss distributions, ``pessimistic_estimate=True``
    (an upper bound whatever the discretisation), value discretisation interval
    1e-4 (dp-accounting's default).
``prv``
    prv-accountant's ``PRVAccountant``; the *upper* bound is reported, never the
    estimate. ``eps_error`` = 1% of the RDP epsilon of the same events (floor
    1e-3), ``delta_error`` = delta / 1000 (the library's recommendation).
``auto``
    Exact when it applies (it is the true epsilon: no sound accountant reports
    less). Otherwise the smallest of rdp, pld, advanced and basic, whichever
    apply; the winner is named and all candidates listed. Inside auto, PLD's
    interval is the RDP epsilon / 5000 clipped to [1e-5, 1e-3] (still
    pessimistic, so still an upper bound; ~0.1% of epsilon, and for DP-SGD
    at epsilon ~ 6 about 5x faster than the 1e-4 default: benchmarks/RESULTS.md, time x 0.18). PRV is not in auto's set: at equal tightness it
    is slower than pessimistic PLD here (see benchmarks/); ask for it by name.

Neighbouring relations. A Gaussian or Laplace event states its sensitivity
*under its own relation*, so its privacy curve is the same shift-by-sensitivity
curve for add/remove and replace-one; it is handed to the libraries as a shift
of 1 with noise sigma/Delta (scale b/Delta). A Poisson-subsampled Gaussian's
noise multiplier is relative to the clipping norm C: under add/remove this is
dp-accounting's/prv-accountant's ADD_OR_REMOVE_ONE; under replace-one (a record
changes, difference up to 2C) only dp-accounting's PLD has a sound analysis
(its REPLACE_ONE mixture pair); rdp, prv, basic and advanced refuse it.
(epsilon, delta) events compose only by basic/advanced.
"""

from __future__ import annotations

import contextlib
import logging
import math
import warnings
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Sequence

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
)
from dpcl.accounting.gaussian import gdp_epsilon
from dpcl.accounting.laplace import laplace_epsilon_for_delta
from dpcl.accounting.validation import check_delta_scalar
from dpcl.errors import InvalidParameterError, UnsupportedEventError

__all__ = [
    "ACCOUNTANT_NAMES",
    "AccountingResult",
    "PLD_VALUE_DISCRETIZATION_INTERVAL",
    "AUTO_PLD_RESOLUTION",
    "PRV_RELATIVE_EPS_ERROR",
    "compute_epsilon",
]

ACCOUNTANT_NAMES = ("exact", "basic", "advanced", "rdp", "pld", "prv", "auto")
#: dp-accounting's default discretisation of the privacy loss, used by ``pld``.
PLD_VALUE_DISCRETIZATION_INTERVAL = 1e-4
#: Inside ``auto`` the PLD interval is the RDP epsilon of the same events divided by
#: this (clipped to [1e-5, 1e-3]): the pessimistic discretisation error then stays
#: ~0.1% of epsilon while the cost (support size ~ epsilon / interval) stays bounded.
AUTO_PLD_RESOLUTION = 5000.0
AUTO_PLD_INTERVAL_RANGE = (1e-5, 1e-3)
#: PRV ``eps_error`` as a fraction of the RDP epsilon of the same events.
PRV_RELATIVE_EPS_ERROR = 0.01
PRV_MIN_EPS_ERROR = 1e-3
#: PRV ``delta_error`` as a fraction of delta.
PRV_RELATIVE_DELTA_ERROR = 1e-3
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
        return {
            "epsilon": self.epsilon,
            "delta": self.delta,
            "accountant": self.accountant,
            "adjacency": self.adjacency,
            "unit": self.unit,
            "candidates": dict(self.candidates),
            "notes": list(self.notes),
        }


# ---------------------------------------------------------------------------
# events -> mechanism groups
# ---------------------------------------------------------------------------
@dataclass
class _Mechanisms:
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


def _collect(events: PrivacyEvent | Sequence[PrivacyEvent]) -> _Mechanisms:
    if isinstance(events, PrivacyEvent):
        root = events
    else:
        if isinstance(events, (str, bytes)) or not isinstance(events, Sequence):
            raise InvalidParameterError(
                f"events must be a PrivacyEvent or a sequence of them, got {type(events).__name__}."
            )
        root = ComposedEvent(list(events))  # validates: non-empty, same adjacency and unit
    mech = _Mechanisms(adjacency=root.adjacency, unit=root.unit)
    for leaf, count in root.leaves():
        if isinstance(leaf, GaussianEvent):
            mech.gauss_mus.append(np.array([leaf.mu]))
            mech.gauss_counts.append(count)
        elif isinstance(leaf, HeterogeneousGaussianEvent):
            mech.gauss_mus.append(np.asarray(leaf.mus, dtype=np.float64).ravel())
            mech.gauss_counts.append(count)
        elif isinstance(leaf, LaplaceEvent):
            mech.laplace.append((leaf.epsilon, count))
        elif isinstance(leaf, PoissonSampledGaussianEvent):
            if leaf.sample_rate == 1.0:
                # no sampling: a Gaussian with sensitivity C (add/remove) or 2C (replace-one)
                factor = 2.0 if leaf.adjacency is Adjacency.REPLACE_ONE else 1.0
                mech.gauss_mus.append(np.array([factor / leaf.noise_multiplier]))
                mech.gauss_counts.append(count)
            else:
                mech.sampled.append((leaf.noise_multiplier, leaf.sample_rate, count))
        elif isinstance(leaf, EpsilonDeltaEvent):
            mech.eps_delta.append((leaf.epsilon, leaf.delta, count))
        else:
            raise UnsupportedEventError(f"no accountant handles events of kind {leaf.kind!r}.")
    return mech


def _refuse_eps_delta(mech: _Mechanisms, name: str) -> None:
    if mech.eps_delta:
        raise UnsupportedEventError(
            f"the {name} accountant cannot compose (epsilon, delta) events (they carry no noise "
            "distribution); use accountant 'basic' or 'advanced'."
        )


def _refuse_replace_one_sampling(mech: _Mechanisms, name: str) -> None:
    if mech.sampled and mech.adjacency is Adjacency.REPLACE_ONE:
        raise UnsupportedEventError(
            f"the {name} accountant has no sound analysis of Poisson-subsampled Gaussians under "
            "replace-one neighbours; use accountant 'pld' (dp-accounting's REPLACE_ONE analysis) "
            "or state the events under add_remove."
        )


_RELATION_NOTE = (
    "Gaussian/Laplace events use their stated sensitivity under the stated relation; "
    "subsampled-Gaussian noise multipliers are relative to the clipping norm."
)


# ---------------------------------------------------------------------------
# individual accountants: each returns (epsilon, notes)
# ---------------------------------------------------------------------------
def _exact(mech: _Mechanisms, delta: float) -> tuple[float, tuple[str, ...]]:
    if mech.only_gaussian:
        mu = mech.gaussian_mu_total()
        eps = float(gdp_epsilon(mu, delta))
        return eps, (
            f"exact: Gaussian mechanisms compose to mu = {mu:.6g} (Dong, Roth & Su 2022, Cor. 3.3); "
            "epsilon is the root of Balle & Wang (2018) Thm 8.",
        )
    if len(mech.laplace) == 1 and mech.laplace[0][1] == 1 and not (mech.gauss_mus or mech.sampled or mech.eps_delta):
        eps0 = mech.laplace[0][0]
        eps = float(laplace_epsilon_for_delta(1.0, delta, sensitivity=eps0))  # scale 1: no 1/(1/eps0) rounding
        return eps, ("exact: inverse of the Laplace profile delta = 1 - exp((eps - eps0)/2), scalar query.",)
    raise UnsupportedEventError(
        f"exact accounting covers compositions of Gaussian mechanisms and a single Laplace mechanism; "
        f"these events are {mech.describe()}. Use accountant 'pld', 'prv', 'rdp', 'advanced' or 'basic'."
    )


def _pld(mech: _Mechanisms, delta: float, interval: float) -> tuple[float, tuple[str, ...]]:
    from dp_accounting import dp_event  # noqa: F401  (ensures the package is importable)
    from dp_accounting.pld import privacy_loss_distribution as pld_lib
    from dp_accounting.privacy_accountant import NeighboringRelation as NeighborRel

    _refuse_eps_delta(mech, "pld")
    _pld_size_guard(mech, delta, interval)
    plds = []
    notes = [f"pld: dp-accounting PLD, pessimistic estimate, value discretisation interval {interval:g}."]
    if mech.gauss_mus:
        mu = mech.gaussian_mu_total()
        plds.append(
            pld_lib.from_gaussian_mechanism(
                standard_deviation=1.0 / mu, sensitivity=1.0, pessimistic_estimate=True,
                value_discretization_interval=interval,
            )
        )
        notes.append(f"pld: Gaussian mechanisms merged exactly into one with mu = {mu:.6g} (Dong, Roth & Su 2022, Cor. 3.3).")
    for eps0, count in _grouped(mech.laplace):
        plds.append(_self_compose(
            pld_lib.from_laplace_mechanism(
                parameter=1.0, sensitivity=eps0, pessimistic_estimate=True,
                value_discretization_interval=interval,
            ), count)
        )
    relation = (
        NeighborRel.REPLACE_ONE if mech.adjacency is Adjacency.REPLACE_ONE else NeighborRel.ADD_OR_REMOVE_ONE
    )
    for (z, q), count in _grouped_pairs(mech.sampled):
        plds.append(_self_compose(
            pld_lib.from_gaussian_mechanism(
                standard_deviation=z, sensitivity=1.0, pessimistic_estimate=True,
                value_discretization_interval=interval, sampling_prob=q, neighboring_relation=relation,
            ), count)
        )
    total = plds[0]
    for other in plds[1:]:
        total = total.compose(other)
    eps = float(total.get_epsilon_for_delta(delta))
    if not math.isfinite(eps):
        raise UnsupportedEventError(
            f"dp-accounting's PLD gives no finite epsilon at delta={delta!r}: the tail mass it truncates "
            "(counted as infinite loss) exceeds delta. Use a larger delta or accountant 'rdp' or 'exact'."
        )
    return eps, tuple(notes)


#: Self-compositions of a sparse PLD are split into blocks of this many copies (see :func:`_self_compose`).
_SPARSE_SELF_COMPOSE_BLOCK = 1024


def _self_compose(pld: Any, count: int) -> Any:
    """``pld`` composed with itself ``count`` times, as ``pld.self_compose(count)``.

    Works around a cost in dp-accounting (0.6.0): a sparse PMF (at most 1000 loss
    values, e.g. DP-SGD at a tiny sampling rate) evaluates ``size ** count`` as a
    Python integer before it switches to the dense FFT path, which takes about a
    minute at count = 1e7 and never ends at 1e9. Composing a block of 1024 copies
    first (that power is small) gives a dense PMF whenever the PMF has two or
    more loss values; the rest is the dense FFT self-composition. Every step is
    dp-accounting's own pessimistic composition, so the result stays an upper
    bound (each extra step may move at most its 1e-15 truncated tail mass to
    infinity). Dense PMFs take the direct path unchanged.
    """
    from dp_accounting.pld import pld_pmf

    sparse = isinstance(getattr(pld, "_pmf_remove", None), pld_pmf.SparsePLDPmf)
    if not sparse or count <= _SPARSE_SELF_COMPOSE_BLOCK:
        return pld.self_compose(count)
    blocks, rest = divmod(count, _SPARSE_SELF_COMPOSE_BLOCK)
    out = pld.self_compose(_SPARSE_SELF_COMPOSE_BLOCK).self_compose(blocks)
    return out.compose(pld.self_compose(rest)) if rest else out


#: PLD refuses events whose RDP epsilon / interval exceeds this (grid points of the
#: composed privacy-loss distribution grow like that ratio; 1e6 points is ~1-2 s
#: and tens of MB, far more would exhaust memory).
PLD_MAX_GRID_POINTS = 1e6


def _pld_size_guard(mech: _Mechanisms, delta: float, interval: float) -> None:
    """Refuse, before allocating, a PLD whose grid would not fit in memory."""
    scale_events = mech
    if mech.sampled and mech.adjacency is Adjacency.REPLACE_ONE:
        # size proxy only: the same steps under add/remove with doubled sensitivity
        scale_events = _Mechanisms(
            adjacency=Adjacency.ADD_REMOVE, unit=mech.unit, gauss_mus=mech.gauss_mus,
            gauss_counts=mech.gauss_counts, laplace=mech.laplace,
            sampled=[(z / 2.0, q, c) for z, q, c in mech.sampled],
        )
    eps_scale = _rdp_epsilon(scale_events, delta)
    points = eps_scale / interval
    if not points <= PLD_MAX_GRID_POINTS:
        raise UnsupportedEventError(
            f"a PLD for these events would need ~{points:.2g} grid points at discretisation interval {interval:g} "
            f"(their RDP epsilon is {eps_scale:.4g}); use accountant 'rdp' or 'prv', or add noise."
        )


class _CountAndDropLibraryWarnings(logging.Filter):
    """Drops records below ERROR from dp-accounting's absl logger, counting excluded-order warnings."""

    def __init__(self) -> None:
        super().__init__()
        self.excluded_orders = 0

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno >= logging.ERROR:
            return True
        if "Excluding this order" in record.getMessage():
            self.excluded_orders += 1
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


def _rdp_accountant(mech: _Mechanisms) -> Any:
    from dp_accounting import dp_event
    from dp_accounting.rdp import rdp_privacy_accountant

    _refuse_eps_delta(mech, "rdp")
    _refuse_replace_one_sampling(mech, "rdp")
    acc = rdp_privacy_accountant.RdpAccountant()
    if mech.gauss_mus:
        acc.compose(dp_event.GaussianDpEvent(1.0 / mech.gaussian_mu_total()))
    for eps0, count in _grouped(mech.laplace):
        # dp-accounting takes the noise multiplier b and uses eps0 = 1 / b: step b down one ulp so that
        # the round trip 1 / fl(1 / eps0) can never come out below eps0 (rounding on the safe side)
        acc.compose(dp_event.LaplaceDpEvent(math.nextafter(1.0 / eps0, 0.0)), count)
    for (z, q), count in _grouped_pairs(mech.sampled):
        acc.compose(dp_event.PoissonSampledDpEvent(q, dp_event.GaussianDpEvent(z)), count)
    return acc


def _rdp_epsilon(mech: _Mechanisms, delta: float) -> float:
    if delta not in mech.rdp_cache:
        with _dp_accounting_warnings_dropped() as dropped:
            mech.rdp_cache[delta] = float(_rdp_accountant(mech).get_epsilon(delta))
        mech.rdp_excluded_orders = max(mech.rdp_excluded_orders, dropped.excluded_orders)
    return mech.rdp_cache[delta]


def _rdp(mech: _Mechanisms, delta: float) -> tuple[float, tuple[str, ...]]:
    eps = _rdp_epsilon(mech, delta)
    notes = ["rdp: dp-accounting RdpAccountant, default orders, its RDP-to-(epsilon, delta) conversion."]
    if mech.rdp_excluded_orders:
        notes.append(
            f"rdp: dp-accounting excluded {mech.rdp_excluded_orders} order(s) whose RDP series did not converge; "
            "the bound is the minimum over the remaining orders (still an upper bound)."
        )
    return eps, tuple(notes)


def _prv(mech: _Mechanisms, delta: float) -> tuple[float, tuple[str, ...]]:
    from prv_accountant import PRVAccountant
    from prv_accountant.privacy_random_variables import (
        GaussianMechanism,
        LaplaceMechanism,
        PoissonSubsampledGaussianMechanism,
    )

    _refuse_eps_delta(mech, "prv")
    _refuse_replace_one_sampling(mech, "prv")
    eps_rdp = _rdp_epsilon(mech, delta)
    eps_error = max(PRV_RELATIVE_EPS_ERROR * eps_rdp, PRV_MIN_EPS_ERROR)
    delta_error = PRV_RELATIVE_DELTA_ERROR * delta
    prvs: list[Any] = []
    counts: list[int] = []
    if mech.gauss_mus:
        prvs.append(GaussianMechanism(noise_multiplier=1.0 / mech.gaussian_mu_total()))
        counts.append(1)
    for eps0, count in _grouped(mech.laplace):
        prvs.append(LaplaceMechanism(mu=eps0))
        counts.append(count)
    for (z, q), count in _grouped_pairs(mech.sampled):
        prvs.append(PoissonSubsampledGaussianMechanism(noise_multiplier=z, sampling_probability=q))
        counts.append(count)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            acc = PRVAccountant(prvs=prvs, eps_error=eps_error, delta_error=delta_error, max_self_compositions=counts)
            _, _, eps_upper = acc.compute_epsilon(delta=delta, num_self_compositions=counts)
    except (ValueError, RuntimeError, FloatingPointError) as exc:
        raise UnsupportedEventError(
            f"prv-accountant cannot bound epsilon for these events at delta={delta!r} ({exc}); use accountant 'pld' or 'rdp'."
        ) from exc
    eps_upper = float(eps_upper)
    if not math.isfinite(eps_upper):
        raise UnsupportedEventError(
            f"prv-accountant returned no finite upper bound at delta={delta!r}; use accountant 'pld' or 'rdp'."
        )
    return max(eps_upper, 0.0), (
        f"prv: prv-accountant upper bound (not its estimate), eps_error={eps_error:.3g}, delta_error={delta_error:.3g}.",
    )


def _profile_pieces(mech: _Mechanisms) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
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
    for (z, q), c in _grouped_pairs(mech.sampled):
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


def _basic(mech: _Mechanisms, delta: float) -> tuple[float, tuple[str, ...]]:
    _refuse_replace_one_sampling(mech, "basic")
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
    eps = _profile_epsilons(mu, q, np.array(share))
    total = fixed_eps + math.fsum(eps * counts)
    return total, (
        f"basic: epsilons and deltas add (Dwork & Roth 2014, Thm 3.16); each of the {n} Gaussian-type mechanisms "
        f"gets delta {share:.3g}.",
    )


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


def _advanced(mech: _Mechanisms, delta: float) -> tuple[float, tuple[str, ...]]:
    _refuse_replace_one_sampling(mech, "advanced")
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
    log_slack = np.log(-np.expm1(s * budget)) + math.log1p(-1e-12)
    share = -np.expm1((1.0 - s) * budget / n) * (1.0 - 1e-12)
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


def _grouped(pairs: list[tuple[float, int]]) -> list[tuple[float, int]]:
    out: dict[float, int] = {}
    for value, count in pairs:
        out[value] = out.get(value, 0) + count
    return list(out.items())


def _grouped_pairs(triples: list[tuple[float, float, int]]) -> list[tuple[tuple[float, float], int]]:
    out: dict[tuple[float, float], int] = {}
    for a, b, count in triples:
        out[(a, b)] = out.get((a, b), 0) + count
    return list(out.items())


_ACCOUNTANTS: dict[str, Callable[[_Mechanisms, float], tuple[float, tuple[str, ...]]]] = {
    "exact": _exact,
    "basic": _basic,
    "advanced": _advanced,
    "rdp": _rdp,
    "pld": lambda m, d: _pld(m, d, PLD_VALUE_DISCRETIZATION_INTERVAL),
    "prv": _prv,
}


def _check_accountant(accountant: Any) -> str:
    if accountant not in ACCOUNTANT_NAMES:
        raise InvalidParameterError(
            f"accountant must be one of {', '.join(ACCOUNTANT_NAMES)}; got {accountant!r}."
        )
    return accountant


def compute_epsilon(
    events: PrivacyEvent | Sequence[PrivacyEvent],
    delta: float,
    accountant: str = "auto",
) -> AccountingResult:
    """Upper bound on epsilon at ``delta`` for the adaptive composition of ``events``.

    ``accountant`` is one of :data:`ACCOUNTANT_NAMES` (see the module docstring).
    A named accountant that cannot soundly handle the events raises
    :class:`~dpcl.errors.UnsupportedEventError` saying which to use instead.
    """
    name = _check_accountant(accountant)
    delta = check_delta_scalar("delta", delta)
    mech = _collect(events)
    base = dict(delta=delta, adjacency=mech.adjacency.value, unit=mech.unit)
    if name != "auto":
        eps, notes = _ACCOUNTANTS[name](mech, delta)
        _check_result(eps, name)
        return AccountingResult(epsilon=eps, accountant=name, candidates={name: eps}, notes=(*notes, _RELATION_NOTE), **base)
    return _auto(mech, delta, base)


def _auto(mech: _Mechanisms, delta: float, base: dict[str, Any]) -> AccountingResult:
    try:
        eps, notes = _exact(mech, delta)
    except UnsupportedEventError:
        pass
    else:
        _check_result(eps, "exact")
        return AccountingResult(
            epsilon=eps, accountant="exact", candidates={"exact": eps},
            notes=(*notes, "auto: exact accounting applies; every other sound accountant reports at least this.", _RELATION_NOTE),
            **base,
        )
    rdp_eps: list[float] = []

    def rdp_first(m: _Mechanisms, d: float) -> tuple[float, tuple[str, ...]]:
        eps, notes = _rdp(m, d)
        rdp_eps.append(eps)
        return eps, notes

    def pld_scaled(m: _Mechanisms, d: float) -> tuple[float, tuple[str, ...]]:
        lo, hi = AUTO_PLD_INTERVAL_RANGE
        interval = min(max(rdp_eps[0] / AUTO_PLD_RESOLUTION, lo), hi) if rdp_eps else PLD_VALUE_DISCRETIZATION_INTERVAL
        return _pld(m, d, interval)

    runs: dict[str, Callable[[_Mechanisms, float], tuple[float, tuple[str, ...]]]] = {
        "rdp": rdp_first,
        "pld": pld_scaled,
        "advanced": _advanced,
        "basic": _basic,
    }
    candidates: dict[str, float] = {}
    all_notes: dict[str, tuple[str, ...]] = {}
    refusals: list[str] = []
    for cand, fn in runs.items():
        try:
            eps, notes = fn(mech, delta)
            _check_result(eps, cand)
        except UnsupportedEventError as exc:
            refusals.append(f"{cand}: {exc}")
            continue
        candidates[cand] = eps
        all_notes[cand] = notes
    if not candidates:
        raise UnsupportedEventError("no accountant can bound these events: " + " | ".join(refusals))
    winner = min(candidates, key=lambda k: candidates[k])
    listing = ", ".join(f"{k}={v:.6g}" for k, v in candidates.items())
    return AccountingResult(
        epsilon=candidates[winner], accountant=winner, candidates=candidates,
        notes=(*all_notes[winner], f"auto: tightest of {listing}.", _RELATION_NOTE),
        **base,
    )


def _check_result(eps: float, name: str) -> None:
    if isinstance(eps, float) and eps == math.inf:
        raise UnsupportedEventError(
            f"the {name} accountant gives no finite epsilon for these events at this delta; "
            "try another accountant or a larger delta."
        )
    if not (isinstance(eps, float) and eps >= 0 and math.isfinite(eps)):
        raise ArithmeticError(f"accountant {name!r} produced an invalid epsilon {eps!r}")  # pragma: no cover


def epsilon_for(events: PrivacyEvent | Sequence[PrivacyEvent], delta: float, accountant: str = "auto") -> float:
    """Shorthand: ``compute_epsilon(events, delta, accountant).epsilon``."""
    return compute_epsilon(events, delta, accountant).epsilon

