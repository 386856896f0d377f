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
    dp-accounting's ``RdpAccountant`` (default orders; its RDP-to-DP conversion). Where
    dp-accounting drops orders whose series it cannot sum in 1000 terms (e.g. q = 0.1,
    z = 1: 1544 at T = 1e5), prv-accountant's RDP accountant (the same series summed to
    convergence, as opacus does: 921.6) is evaluated too and the smaller bound reported.
``pld``
    dp-accounting's privacy loss distributions, ``pessimistic_estimate=True``
    (an upper bound whatever the discretisation), value discretisation interval
    1e-4 (dp-accounting's default). Sized before anything is allocated by
    dp-accounting's own Chernoff bound on the composed grid; more than
    :data:`PLD_MAX_GRID_POINTS` (~1.3 GB; :data:`PLD_MAX_SELF_COMPOSED_POINTS` for one
    self-composed piece, which dpcl composes in less memory) is refused, pointing to ``auto``.
``prv``
    prv-accountant's ``PRVAccountant``; the *upper* bound is reported, never the
    estimate. ``eps_error`` = 1% of the RDP epsilon of the same events (floor
    1e-3), ``delta_error`` = delta / 1000 (the library's recommendation).
``auto``
    Exact when it applies (it is the true epsilon: no sound accountant reports
    less). Otherwise the smallest of rdp, pld, advanced and basic, whichever
    apply, and prv where the PLD is refused or did not converge; the winner is
    named and all candidates listed. Inside auto the PLD starts at interval
    RDP epsilon / 500 clipped to [1e-5, 1e-3] (coarser if it would not fit in
    memory or would be a grid of more than 1e6 points, ``_auto_pld_fast_start``;
    finer where the discretisation error predicted from the events,
    ``_auto_pld_start``, says one halving would not converge) and is refined (halved, or more where the change says the error is
    still large) until one refinement changes epsilon by at most 0.5 %
    (:data:`AUTO_PLD_TOLERANCE`) or 8 s are spent; each step is pessimistic,
    so each is an upper bound, and the smallest is reported; a note gives the
    intervals, epsilons and why it stopped.

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
import dataclasses
import logging
import math
import re
import warnings
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from dpcl.accounting.events import (
    MAX_COMPOSITIONS,
    MAX_SAMPLED_STEPS,
    STEPS_HINT,
    Adjacency,
    ComposedEvent,
    EpsilonDeltaEvent,
    GaussianEvent,
    HeterogeneousGaussianEvent,
    LaplaceEvent,
    PoissonSampledGaussianEvent,
    PrivacyEvent,
)
from dpcl.accounting.fft_bound import bounded_self_convolve
from dpcl.accounting.gaussian import gdp_epsilon
from dpcl.accounting.laplace import laplace_epsilon_for_delta
from dpcl.accounting import work as _work
from dpcl.accounting.validation import check_delta_scalar
from dpcl.errors import InvalidParameterError, UnsupportedEventError

__all__ = [
    "check_pld_fits",
    "ACCOUNTANT_NAMES",
    "AccountingResult",
    "PLD_VALUE_DISCRETIZATION_INTERVAL",
    "AUTO_PLD_RESOLUTION",
    "AUTO_PLD_TOLERANCE",
    "AUTO_PLD_WORK_BUDGET_POINTS",
    "PLD_MAX_GRID_POINTS",
    "PRV_RELATIVE_EPS_ERROR",
    "EPSILON_MEMO",
    "clear_memo",
    "compute_epsilon",
    "settings_key",
]

ACCOUNTANT_NAMES = ("exact", "basic", "advanced", "rdp", "pld", "prv", "auto")
#: dp-accounting's default discretisation of the privacy loss, used by ``pld``.
PLD_VALUE_DISCRETIZATION_INTERVAL = 1e-4
#: Inside ``auto`` the PLD refinement starts at the RDP epsilon of the same events divided by
#: this (clipped to [1e-5, 1e-3]; coarser where the grid would not fit in memory), or finer where
#: the discretisation error predicted from the events asks for it (``_auto_pld_start``).
AUTO_PLD_RESOLUTION = 500.0
AUTO_PLD_INTERVAL_RANGE = (1e-5, 1e-3)
#: PRV ``eps_error`` as a fraction of the RDP epsilon of the same events.
PRV_RELATIVE_EPS_ERROR = 0.01
PRV_MIN_EPS_ERROR = 1e-3
#: Largest PRV grid dpcl allocates: prv-accountant peaks at ~340 bytes per point (measured: 3.0e6 points 1.0 GB,
#: 9.7e6 points 3.3 GB and 52 s), so this keeps one PRV computation under ~1.1 GB and a process under 2 GB.
PRV_MAX_GRID_POINTS = 3e6
#: PRV ``delta_error`` as a fraction of delta.
PRV_RELATIVE_DELTA_ERROR = 1e-3
# prv-accountant evaluates exp(t) over its privacy-loss domain [-L, L]; past log(float64 max) ~ 709.78 that
# overflows and its discretised PRVs come out with a wrong (even negative) mean: at q = 0.1, T = 1e6, z = 2 it
# returned epsilon upper bound -844, which dpcl used to clamp to 0 although the true epsilon is about 1600.
PRV_MAX_DOMAIN = 700.0
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


class _PldTooLarge(UnsupportedEventError):
    """A PLD at this interval would not fit in memory; ``points`` is the estimated grid size."""

    def __init__(self, message: str, points: float) -> None:
        super().__init__(message)
        self.points = points


#: Largest number of grid points of a (composed) PLD that dpcl allocates. dp-accounting's FFT
#: self-composition peaks at about 100 bytes per output point (measured: 7e6 points, 0.7 GB), so
#: this keeps one PLD computation under ~1.3 GB.
PLD_MAX_GRID_POINTS = 1.2e7
#: Largest grid of one PMF of a PLD that is one piece self-composed (e.g. a DP-SGD run at one noise multiplier and
#: sampling rate), which dpcl composes itself above :data:`_LEAN_SELF_COMPOSE_POINTS` in ~32 bytes a point
#: (:func:`_lean_self_convolve`): a process computing a 2.6e7-point PLD this way peaks at 1.35 GB (q = 0.1, T = 1e6,
#: z = 1 at 1e-4, measured 2026-11-28 with the round-off bound; 1.13 GB before), ~1.6 GB at this size; tests/accounting/test_bounded_work.py runs it under
#: the 2 GiB address-space limit of every public function (issue 18).
PLD_MAX_SELF_COMPOSED_POINTS = 3e7
#: dp-accounting's default tail mass truncated per self-composition (``DensePLDPmf.self_compose``).
_PLD_TAIL_MASS_TRUNCATION = 1e-15
#: Standard deviations of the Gaussian noise that dp-accounting's single-step discretisation spans
#: (its log_mass_truncation_bound of -50 is ~10 standard deviations per tail; 12 leaves a margin).
_PLD_GAUSSIAN_TAIL_SIGMAS = 12.0


def _single_step_points(z: float, interval: float) -> float:
    """An upper estimate of the grid size of one Gaussian (std z, sensitivity 1) step's PLD.

    Its privacy loss (x - 1/2) / z^2 is discretised for x within ~10 z of the mean on
    either side: width (2 * 10 z + 1) / z^2 in loss units. Subsampling only narrows it.
    """
    z = np.float64(z)  # numpy float: a tiny z gives inf points (refused as too large), not a ZeroDivisionError
    with np.errstate(over="ignore", divide="ignore"):
        return float((2.0 * _PLD_GAUSSIAN_TAIL_SIGMAS / z + 1.0 / (z * z)) / interval + 1.0)


def _composed_points(pld: Any, count: int) -> float:
    """Grid points of ``pld`` self-composed ``count`` times, by dp-accounting's own Chernoff bound.

    ``common.compute_self_convolve_bounds`` is what ``DensePLDPmf.self_compose`` uses to size its
    FFT; it is evaluated here (as :func:`_self_convolve_bounds`) on the single-step PMFs (cheap) before anything is composed.
    Memoised per PLD object and count (:data:`PLD_MEMO`).
    """
    key = ("composed_points", id(pld), int(count), _composed_points_uncached)
    hit = PLD_MEMO.get(key)
    if hit is not None and hit[0] is pld:
        return hit[1]
    points = _composed_points_uncached(pld, count)
    PLD_MEMO.put(key, (pld, points), 1.0)
    return points


def _composed_points_uncached(pld: Any, count: int) -> float:
    from dp_accounting.pld import common, pld_pmf

    points = 0.0
    for pmf in (pld._pmf_remove, pld._pmf_add):  # noqa: SLF001 (sizes only; nothing is modified)
        if isinstance(pmf, pld_pmf.SparsePLDPmf):
            keys = list(pmf._loss_probs)  # noqa: SLF001
            span = (max(keys) - min(keys) + 1) if keys else 1
            if span > PLD_MAX_GRID_POINTS:
                return float(span)
            pmf = pmf.to_dense_pmf()
        probs = pmf._probs  # noqa: SLF001
        if count == 1:
            points = max(points, float(probs.size))
            continue
        lower, upper = _self_convolve_bounds(probs, count, _PLD_TAIL_MASS_TRUNCATION)
        points = max(points, float(upper - lower + 1), float(probs.size))
    return points


def _self_convolve_bounds(probs: np.ndarray, count: int, tail_mass_truncation: float) -> tuple[int, int]:
    """dp-accounting's ``common.compute_self_convolve_bounds`` (its Chernoff bound at its 40 orders), each
    order's log moment generating function summed by numpy instead of one ``scipy.special.logsumexp`` call
    (whose per-call overhead made the sizing of a small PLD cost more than composing it). Used for sizing only."""
    n = probs.size
    lower, upper = 0, (n - 1) * count
    orders = np.concatenate((np.arange(-20, 0), np.arange(1, 21))) / n
    index = np.arange(n)
    log_slack = math.log(2.0 / tail_mass_truncation)
    for order in orders:
        exponents = index * order
        top = float(np.max(exponents))
        # logsumexp(exponents, b=probs) as scipy sums it (np.sum; np.dot goes to BLAS, ~100x slower here under load)
        total = float(np.sum(probs * np.exp(exponents - top)))
        if not total > 0:
            continue
        log_mgf = math.log(total) + top
        bound = (count * log_mgf + log_slack) / order
        if not math.isfinite(bound):
            continue
        if order > 0:
            upper = min(upper, math.ceil(bound))
        else:
            lower = max(lower, math.floor(bound))
    return lower, upper


def _pld_too_large(points: float, interval: float, what: str, limit: float | None = None) -> _PldTooLarge:
    limit = PLD_MAX_GRID_POINTS if limit is None else limit  # read at call time (tests scale the module's limit)
    return _PldTooLarge(
        f"a PLD for these events would need ~{points:.2g} grid points at discretisation interval {interval:g} "
        f"({what}; dpcl allocates at most {limit:.2g}, about {limit * 1.1e-7:.2g} GB); use accountant 'auto' "
        "(it coarsens the interval until the PLD fits and refines it within time and memory) or 'prv', "
        "or add noise.",
        points,
    )


class _VectorisedGaussianLoss:
    """Factory of a subclass of dp-accounting's ``GaussianPrivacyLoss`` whose hockey-stick divergence is vectorised.

    Why hand-written: building a Gaussian or Poisson-subsampled Gaussian PLD, dp-accounting (0.6)
    evaluates ``GaussianPrivacyLoss.get_delta_for_epsilon`` on its whole connect-the-dots grid with one
    scalar ``inverse_privacy_loss`` call per grid point (a Python loop: 1.3 M calls, most of the
    accounting time of ``dpcl run dpcl/configs/naive.toml``). dp-accounting offers nothing faster for
    this mechanism: connect-the-dots is already its default, and its ``MixtureGaussianPrivacyLoss``
    (vectorised, by binary search) is about 20x slower here. Only that loop is replaced: the subclass
    inverts the privacy loss in closed form on the array, delta(eps) = mu_upper_cdf(x) - e^eps
    mu_lower_cdf(x) at x = inverse loss (Meiser & Mohammadi 2018; Koskela et al. 2020), with
    dp-accounting's own CDFs, and the PMF is still built by dp-accounting's connect-the-dots code. The
    closed forms are those of the Gaussian's loss, l(x) = s (-s/2 - x) / sigma^2 under remove, and of
    Poisson subsampling, l_q = log(1 + q (e^l - 1)) (remove) / -log(1 + q (e^-l - 1)) (add), evaluated in
    the order of operations of dp-accounting's scalar path, so that the PMF agrees with it to rounding.
    Replace-one and scalar calls go to dp-accounting unchanged. Cross-checked against
    ``from_gaussian_mechanism`` (same PMF to 1e-9, same epsilon) in tests/accounting/test_fast_pld.py.
    """

    _cls: Any = None

    @classmethod
    def get(cls) -> Any:
        if cls._cls is None:
            cls._cls = cls._build()
        return cls._cls

    @staticmethod
    def _build() -> Any:
        import numbers

        from dp_accounting.pld import privacy_loss_mechanism as plm

        add, remove = plm.AdjacencyType.ADD, plm.AdjacencyType.REMOVE

        def near(a: np.ndarray, b: float) -> np.ndarray:  # math.isclose(a, b), elementwise
            return np.abs(a - b) <= 1e-9 * np.maximum(np.abs(a), abs(b))

        class VectorisedGaussianPrivacyLoss(plm.GaussianPrivacyLoss):
            def _inverse_losses(self, eps: np.ndarray) -> np.ndarray:
                s, var, q = self.sensitivity, self._standard_deviation ** 2, self.sampling_prob

                def log_a_exp_b_plus_c(b: np.ndarray) -> np.ndarray:
                    # log(e^b / q + 1 - 1/q) in the order of operations of dp-accounting's scalar path
                    d = b + np.log(1.0 / q)
                    out = d + np.log1p(-np.exp(np.log(-(1.0 - 1.0 / q)) - d))
                    return np.where(b == 0.0, np.log(1.0 / q + (1.0 - 1.0 / q)), out)

                with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
                    if self.adjacency_type == remove:
                        unsampled = eps if q == 1.0 else log_a_exp_b_plus_c(eps)
                        x = -0.5 * s - unsampled * var / s
                        if q < 1.0:
                            x = np.where(near(eps, math.log(1 - q)), math.inf, x)
                    else:
                        unsampled = eps if q == 1.0 else -log_a_exp_b_plus_c(-eps)
                        x = s + (-0.5 * s - unsampled * var / s)
                        if q < 1.0:
                            x = np.where(near(eps, -math.log(1 - q)), -math.inf, x)
                return x

            def get_delta_for_epsilon(self, epsilon: Any) -> Any:
                if isinstance(epsilon, numbers.Number) or self.adjacency_type not in (add, remove):
                    return super().get_delta_for_epsilon(epsilon)
                eps = np.asarray(epsilon, dtype=np.float64)
                delta = np.zeros_like(eps)
                q = self.sampling_prob
                if q == 1.0:
                    inside = np.ones(eps.shape, dtype=bool)
                elif self.adjacency_type == add:
                    inside = eps < -math.log1p(-q)  # beyond it e^eps mu_lower dominates mu_upper: delta 0
                else:
                    inside = eps > math.log1p(-q)  # below it the divergence is 1 - e^eps
                    delta[~inside] = -np.expm1(eps[~inside])
                x = self._inverse_losses(eps[inside])
                delta[inside] = self.mu_upper_cdf(x) - np.exp(eps[inside] + self.mu_lower_log_cdf(x))
                return np.clip(delta, 0.0, 1.0)

        return VectorisedGaussianPrivacyLoss


def _gaussian_pld(standard_deviation: float, interval: float, sampling_prob: float = 1.0, replace_one: bool = False) -> Any:
    """dp-accounting's ``from_gaussian_mechanism(standard_deviation, sensitivity=1, pessimistic_estimate=True,
    value_discretization_interval=interval, sampling_prob=...)``, built with :class:`_VectorisedGaussianLoss`.

    Replace-one, or a dp-accounting without the PMF builder used here, goes through
    ``from_gaussian_mechanism`` itself.
    """
    from dp_accounting.pld import privacy_loss_distribution as pld_lib
    from dp_accounting.pld import privacy_loss_mechanism as plm
    from dp_accounting.privacy_accountant import NeighboringRelation as NeighborRel

    build = getattr(pld_lib, "_create_pld_pmf_from_monotone_privacy_loss", None)
    if replace_one or build is None:
        return pld_lib.from_gaussian_mechanism(
            standard_deviation=standard_deviation, sensitivity=1.0, pessimistic_estimate=True,
            value_discretization_interval=interval, sampling_prob=sampling_prob,
            neighboring_relation=NeighborRel.REPLACE_ONE if replace_one else NeighborRel.ADD_OR_REMOVE_ONE,
        )
    loss = _VectorisedGaussianLoss.get()

    def pmf(adjacency: Any) -> Any:
        return build(
            loss(standard_deviation, sensitivity=1.0, pessimistic_estimate=True, sampling_prob=sampling_prob,
                 adjacency_type=adjacency),
            pessimistic_estimate=True, value_discretization_interval=interval, use_connect_dots=True,
        )

    pmf_remove = pmf(plm.AdjacencyType.REMOVE)
    if sampling_prob == 1.0:
        return pld_lib.PrivacyLossDistribution(pmf_remove)
    return pld_lib.PrivacyLossDistribution(pmf_remove, pmf(plm.AdjacencyType.ADD))


class _PldMemo:
    """Bounded in-process LRU of PLD objects and their sizes, weighted by the grid points they hold.

    dp-accounting's PLD objects are never modified by dpcl or by composing (``compose`` and
    ``self_compose`` return new objects), so one object can serve every caller. Keys are the full
    inputs of the construction; a value derived from another PLD object (its self-composition or
    its composed size) is keyed on that object's identity and holds a reference to it, so the
    identity cannot be reused while the entry exists.
    """

    def __init__(self, max_points: float) -> None:
        import collections
        import threading

        self._data: "collections.OrderedDict[Any, tuple[Any, float]]" = collections.OrderedDict()
        self._lock = threading.Lock()
        self._held = 0.0
        self.max_points = max_points

    def get(self, key: Any) -> Any:
        with self._lock:
            hit = self._data.get(key)
            if hit is None:
                return None
            self._data.move_to_end(key)
            return hit[0]

    def put(self, key: Any, value: Any, points: float) -> None:
        if not points <= self.max_points:
            return
        with self._lock:
            if key in self._data:
                self._held -= self._data.pop(key)[1]
            while self._data and self._held + points > self.max_points:
                self._held -= self._data.popitem(last=False)[1][1]
            self._data[key] = (value, points)
            self._held += points

    def clear(self) -> None:
        with self._lock:
            self._data.clear()
            self._held = 0.0


#: PLDs kept in this process (about 8 bytes a point: at most ~160 MB); cleared with :func:`clear_memo`.
PLD_MEMO = _PldMemo(2e7)


def _single_gaussian_pld(standard_deviation: float, interval: float, sampling_prob: float, replace_one: bool) -> Any:
    """:func:`_gaussian_pld`, memoised (a calibration and the ledgers after it rebuild the same steps)."""
    key = ("gaussian", float(standard_deviation), float(interval), float(sampling_prob), bool(replace_one), _gaussian_pld)
    pld = PLD_MEMO.get(key)
    if pld is None:
        pld = _gaussian_pld(standard_deviation, interval, sampling_prob, replace_one)
        PLD_MEMO.put(key, pld, _pld_points(pld))
    return pld


def _grid_spans(pld: Any) -> list[float]:
    """Width in grid points of each PMF of ``pld`` (a sparse PMF: from its smallest to its largest loss)."""
    spans = []
    for pmf in (getattr(pld, "_pmf_remove", None), getattr(pld, "_pmf_add", None)):  # noqa: SLF001 (sizes only)
        probs = getattr(pmf, "_probs", None)
        if probs is not None:
            spans.append(float(probs.size))
        else:
            keys = list(getattr(pmf, "_loss_probs", None) or {0: 0.0})
            spans.append(float(max(keys) - min(keys) + 1))
    return spans


def _pld_points(pld: Any) -> float:
    return float(sum(a.size for a in _pmf_arrays(pld)))


def _pmf_arrays(pld: Any) -> list[Any]:
    out = []
    for pmf in (getattr(pld, "_pmf_remove", None), getattr(pld, "_pmf_add", None)):  # noqa: SLF001 (sizes only)
        probs = getattr(pmf, "_probs", None)
        out.append(probs if probs is not None else np.zeros(len(getattr(pmf, "_loss_probs", {}) or {})))
    return out


#: Single-step grids larger than this are sized first on a coarser proxy grid (cheap to build).
_PLD_PROXY_POINTS = 5e4


def _pld(mech: _Mechanisms, delta: float, interval: float, work: list[float] | None = None) -> tuple[float, tuple[str, ...]]:
    """dp-accounting pessimistic PLD at ``interval``; refuses (before allocating) a grid that would not fit.

    ``work``, where given, receives the grid points of the composed PLD (its PMFs' sizes: what its
    composition cost, as a number that depends on the events and the interval alone).

    Each piece (a group of identical mechanisms) is sized by dp-accounting's Chernoff bound on its
    composed grid. Where the single step alone would have many points, that bound is first taken
    on a proxy grid with at most ~5e4 points and scaled by proxy interval / interval (the loss
    range it spans does not depend on the interval), so that a PLD which will be refused is never built.
    """
    _refuse_eps_delta(mech, "pld")
    pieces, piece_keys, notes = _pld_pieces(mech)
    notes.insert(0, f"pld: dp-accounting PLD, pessimistic estimate, value discretisation interval {interval:g}.")
    singles = _sized_single_steps_or_refuse(pieces, interval)
    try:
        with np.errstate(all="ignore"):
            total = _composed_pieces(singles, piece_keys, interval)
            eps = _epsilon_for_delta(total, delta)
            if work is not None:
                work.append(_pld_points(total))
    except UnsupportedEventError:
        raise
    except PLD_LIBRARY_FAILURES as exc:
        raise _pld_library_error(exc) from exc
    if not math.isfinite(eps):
        raise UnsupportedEventError(
            f"dp-accounting's PLD gives no finite epsilon at delta={delta!r}: the tail mass it truncates "
            "(counted as infinite loss) exceeds delta. Use a larger delta or accountant 'rdp' or 'exact'."
        )
    return eps, tuple(notes)


def check_pld_fits(events: "PrivacyEvent | Sequence[PrivacyEvent]", interval: float, max_points: float) -> None:
    """Refuse (:class:`~dpcl.errors.UnsupportedEventError`) events whose PLD at ``interval`` would need more than
    ``max_points`` grid points, before anything large is allocated: the sizing the ``pld`` accountant does
    (the same pieces and dp-accounting's own Chernoff bound on each composed grid). For callers that compose
    the events with dp-accounting themselves, such as ``dpcl verify --cross-check``
    (:mod:`dpcl.guarantees.cross_check`), whose memory it bounds."""
    pieces, _, _ = _pld_pieces(_collect(events))
    _sized_single_steps_or_refuse(pieces, interval, max_points)


def _sized_single_steps_or_refuse(
    pieces: list[tuple[Callable[[float], Any], int, float, str]], interval: float, limit: float | None = None,
) -> list[tuple[Any, int]]:
    """:func:`_sized_single_steps`, a floating-point failure of dp-accounting's constructors refused as
    :func:`_pld_library_error` says."""
    try:
        with np.errstate(all="ignore"):
            return _sized_single_steps(pieces, interval, limit)
    except UnsupportedEventError:
        raise
    except PLD_LIBRARY_FAILURES as exc:
        raise _pld_library_error(exc) from exc


def _pld_pieces(
    mech: _Mechanisms,
) -> tuple[list[tuple[Callable[[float], Any], int, float, str]], list[tuple[Any, ...]], list[str]]:
    """The pieces of ``mech``'s PLD: (builder(interval) -> single-step PLD, repetitions, single-step size
    estimate at interval 1, description), what each piece is by value (for the memo of partial
    compositions), and notes."""
    from dp_accounting.pld import privacy_loss_distribution as pld_lib

    pieces: list[tuple[Callable[[float], Any], int, float, str]] = []
    piece_keys: list[tuple[Any, ...]] = []
    notes: list[str] = []
    if mech.gauss_mus:
        mu = mech.gaussian_mu_total()
        if not mu > 0:
            raise UnsupportedEventError(
                "the Gaussian mechanisms' composed mu (sensitivity / sigma) underflows to 0 in float64 (sigma beyond "
                "~1e154 per unit of sensitivity): dp-accounting's PLD cannot discretise it; use accountant 'exact' "
                "or 'rdp'."
            )
        pieces.append((
            lambda h, mu=mu: _single_gaussian_pld(1.0 / mu, h, 1.0, False),
            1, _single_step_points(1.0 / mu, 1.0), f"one Gaussian with mu = {mu:.3g}",
        ))
        piece_keys.append(("gaussian", float(mu), 1))
        notes.append(f"pld: Gaussian mechanisms merged exactly into one with mu = {mu:.6g} (Dong, Roth & Su 2022, Cor. 3.3).")
    for eps0, count in _grouped(mech.laplace):
        pieces.append((
            lambda h, eps0=eps0: pld_lib.from_laplace_mechanism(
                parameter=1.0, sensitivity=eps0, pessimistic_estimate=True, value_discretization_interval=h,
            ),
            count, 2.0 * eps0, f"Laplace mechanisms with epsilon0 = {eps0:.3g}",
        ))
        piece_keys.append(("laplace", float(eps0), int(count)))
    for (z, q), count in _grouped_pairs(mech.sampled):
        # replace-one moves a clipped gradient by up to 2C: size it as noise z / 2
        z_size = z / 2.0 if mech.adjacency is Adjacency.REPLACE_ONE else z
        pieces.append((
            lambda h, z=z, q=q: _single_gaussian_pld(z, h, q, mech.adjacency is Adjacency.REPLACE_ONE),
            count, _single_step_points(z_size, 1.0), f"subsampled-Gaussian steps with noise multiplier {z:.3g}",
        ))
        piece_keys.append(("sampled", float(z), float(q), mech.adjacency.value, int(count)))
    return pieces, piece_keys, notes


def _epsilon_for_delta(pld: Any, delta: float) -> float:
    """``pld.get_epsilon_for_delta(delta)``, with dense PMFs scanned by :func:`_dense_epsilon_for_delta`."""
    from dp_accounting.pld import pld_pmf

    pmfs = [pld._pmf_remove] if pld._symmetric else [pld._pmf_remove, pld._pmf_add]  # noqa: SLF001 (read only)
    if not all(isinstance(p, pld_pmf.DensePLDPmf) for p in pmfs):
        return float(pld.get_epsilon_for_delta(delta))
    return max(_dense_epsilon_for_delta(p, delta) for p in pmfs)


#: Losses scanned per numpy chunk by :func:`_dense_epsilon_for_delta` (bounds its temporary arrays).
_EPSILON_SCAN_CHUNK = 1 << 18


def _dense_epsilon_for_delta(pmf: Any, delta: float) -> float:
    """dp-accounting's ``DensePLDPmf.get_epsilon_for_delta`` (``pld_pmf._get_epsilon_for_delta``) in numpy.

    dp-accounting scans the losses from the largest down in a Python loop (``math.exp`` per grid point: 3.8 s of
    a 9 s ``auto`` call at q = 0.1, T = 1e6, z = 0.6). The same scan in chunks: the losses as its
    ``itertools.count`` makes them (repeated subtraction of the interval: ``np.cumsum``, also sequential), the
    two running masses as sequential sums in its order, and its two stopping tests evaluated on every prefix;
    the first test that holds, in the loop's order, ends the scan (numpy's exp and log agree with math's to a
    few ulps, so the epsilon agrees to ~1e-15 relative). Where the loop would overflow ``math.exp``
    (a loss below about -709 reached), this raises OverflowError as it does. Cross-checked against
    dp-accounting's own in tests/accounting/test_fast_pld.py.
    """
    infinity_mass = float(pmf._infinity_mass)  # noqa: SLF001 (read only)
    if infinity_mass > delta:
        return math.inf
    probs = np.flip(np.asarray(pmf._probs, dtype=np.float64))  # noqa: SLF001
    step = -float(pmf._discretization)  # noqa: SLF001
    loss = (pmf._lower_loss + probs.size - 1) * float(pmf._discretization)  # noqa: SLF001
    upper, lower = infinity_mass, 0.0
    for start in range(0, probs.size, _EPSILON_SCAN_CHUNK):
        p = probs[start : start + _EPSILON_SCAN_CHUNK]
        losses = np.cumsum(np.concatenate(([loss], np.full(p.size - 1, step))))
        with np.errstate(over="ignore", divide="ignore", invalid="ignore"):
            weights = np.exp(-losses)
            ups = np.cumsum(np.concatenate(([upper], p)))  # ups[k]: the upper mass before loss k is added
            lows = np.cumsum(np.concatenate(([lower], weights * p)))
            stop = (ups[:-1] > delta) & (lows[:-1] > 0) & (np.log((ups[:-1] - delta) / lows[:-1]) >= losses)
        tiny = (ups[1:] >= delta) & (lows[1:] == 0)  # after adding loss k: exp(-loss) * prob underflowed to 0
        k_stop = int(np.argmax(stop)) if stop.any() else p.size
        k_tiny = int(np.argmax(tiny)) if tiny.any() else p.size
        used = min(k_stop, k_tiny + 1)
        if not np.all(np.isfinite(weights[:used])):
            raise OverflowError("math range error (exp of a privacy loss below -709)")
        if k_tiny < k_stop:
            return max(0.0, float(losses[k_tiny]))
        if k_stop < p.size:
            upper, lower = float(ups[k_stop]), float(lows[k_stop])
            break
        upper, lower = float(ups[-1]), float(lows[-1])
        loss = float(losses[-1]) + step
    if upper <= lower + delta:
        return 0.0
    return math.log((upper - delta) / lower)


def _composed_pieces(singles: list[tuple[Any, int]], piece_keys: list[tuple[Any, ...]], interval: float) -> Any:
    """The composition of the pieces' self-compositions, folded left in order, as ``_pld`` always did.

    The partial compositions (first j pieces) are memoised by value (:data:`PLD_MEMO`): a ledger that
    composes tasks 0..k at release k finds tasks 0..k-1 composed at release k-1 and composes one more
    piece, instead of all k again. The fold order and operations are unchanged, so the result is the same.
    """
    how = (float(interval), _SPARSE_SELF_COMPOSE_BLOCK, _self_compose, _gaussian_pld)
    prefixes = [("prefix", how, tuple(piece_keys[: j + 1])) for j in range(len(singles))]
    total, start = None, 0
    for j in range(len(singles) - 1, -1, -1):  # the longest partial composition already made
        hit = PLD_MEMO.get(prefixes[j])
        if hit is not None:
            total, start = hit, j + 1
            break
    for j in range(start, len(singles)):
        _work.checkpoint()  # the caller's processor-time budget (dpcl.accounting.work)
        pld, count = singles[j]
        composed = _self_compose(pld, count)
        total = composed if total is None else total.compose(composed)
        if j > 0:
            PLD_MEMO.put(prefixes[j], total, _pld_points(total))
    return total


def _sized_single_steps(
    pieces: list[tuple[Callable[[float], Any], int, float, str]], interval: float,
    limit: float | None = None,
) -> list[tuple[Any, int]]:
    """Build each piece's single-step PLD at ``interval`` after checking that its composition fits in ``limit``
    grid points (see :func:`_pld`). The default is :data:`PLD_MAX_GRID_POINTS`, or :data:`PLD_MAX_SELF_COMPOSED_POINTS`
    for one piece of more than :data:`_SPARSE_SELF_COMPOSE_BLOCK` steps, which :func:`_dense_self_compose` composes
    (fewer steps of a sparse PMF go to dp-accounting's own FFT, ~100 bytes a point); a single step, which
    dp-accounting builds, never has more than :data:`PLD_MAX_GRID_POINTS`."""
    if limit is None:  # read at call time (tests scale the module's limits)
        limit = PLD_MAX_GRID_POINTS
        if len(pieces) == 1 and pieces[0][1] > _SPARSE_SELF_COMPOSE_BLOCK:
            limit = max(limit, PLD_MAX_SELF_COMPOSED_POINTS)
    points = 0.0
    singles: list[tuple[Any, int]] = []
    for build, count, width, what in pieces:
        _work.checkpoint()  # the caller's processor-time budget (dpcl.accounting.work)
        with np.errstate(over="ignore"):
            single = width / interval + 1.0
        if not single <= min(limit, PLD_MAX_GRID_POINTS):  # a single step is built by dp-accounting
            raise _pld_too_large(single, interval, what, min(limit, PLD_MAX_GRID_POINTS))
        estimate = math.inf
        if single > _PLD_PROXY_POINTS:
            proxy = interval * single / _PLD_PROXY_POINTS
            estimate = _composed_points(build(proxy), count) * proxy / interval
            if not points + estimate <= limit:
                raise _pld_too_large(points + estimate, interval, what, limit)
        pld = build(interval)
        # the whole convolution's support, count (n - 1) + 1 points, bounds the composed grid from above:
        # where it is small, dp-accounting's (costlier) Chernoff bound is not needed to see that it fits;
        # nor where twice the proxy's estimate fits (the bound's orders scale with the grid, so in loss units
        # the proxy's truncated range is the fine grid's up to rounding; its cost grows with the grid: ~1 s at 2e5 points)
        full = max(count * (span - 1) + 1.0 for span in _grid_spans(pld))
        if points + full <= limit / 4:
            points += full
        elif points + 2.0 * estimate <= limit:
            points += 2.0 * estimate
        else:
            points += _composed_points(pld, count)
        if not points <= limit:
            raise _pld_too_large(points, interval, what, limit)
        singles.append((pld, count))
    return singles


#: What dp-accounting's PLD code raises where it cannot evaluate events (floating point; IndexError: its compose
#: truncates both tails of a PMF to nothing, an empty array, when the tails hold all but 1e-15 of its mass, e.g.
#: Laplace steps of epsilon 1e4 at interval 1); each is refused as :func:`_pld_library_error` says.
PLD_LIBRARY_FAILURES = (ValueError, OverflowError, ZeroDivisionError, FloatingPointError, IndexError)


def _pld_library_error(exc: BaseException) -> UnsupportedEventError:
    return UnsupportedEventError(
        f"dp-accounting's PLD cannot evaluate these events in floating point ({type(exc).__name__}: "
        f"{str(exc)[:120]}); use accountant 'rdp' or 'prv' (or 'auto', which picks what applies)."
    )


#: Self-compositions of a sparse PLD are split into blocks of this many copies (see :func:`_self_compose`).
_SPARSE_SELF_COMPOSE_BLOCK = 1024


def _self_compose(pld: Any, count: int) -> Any:
    """:func:`_self_compose_uncached`, memoised per PLD object and count (:data:`PLD_MEMO`)."""
    key = ("self_compose", id(pld), int(count), _SPARSE_SELF_COMPOSE_BLOCK, _self_compose_uncached)
    hit = PLD_MEMO.get(key)
    if hit is not None and hit[0] is pld:
        return hit[1]
    composed = _self_compose_uncached(pld, count)
    PLD_MEMO.put(key, (pld, composed), _pld_points(composed))
    return composed


def _self_compose_uncached(pld: Any, count: int) -> Any:
    """``pld`` composed with itself ``count`` times, as ``pld.self_compose(count)``.

    Works around a cost in dp-accounting (0.6.0): a sparse PMF (at most 1000 loss
    values, e.g. DP-SGD at a tiny sampling rate) evaluates ``size ** count`` as a
    Python integer before it switches to the dense FFT path, which takes about a
    minute at count = 1e7 and never ends at 1e9. That switch is taken whenever
    ``size ** count`` exceeds dp-accounting's sparse limit (1000 points), i.e. for
    every PMF of two or more loss values once count > 1000 (``count > 9`` already
    for two values); dpcl takes the same path without the power: the PMF is
    converted to dense (``to_dense_pmf``) and self-composed as dp-accounting's dense
    FFT does (:func:`_dense_self_compose`): the same arrays up to 1e6 points; above, each
    point a proven upper bound of the exact composition (:func:`_lean_self_convolve`).
    Dense PMFs, and counts of at most :data:`_SPARSE_SELF_COMPOSE_BLOCK`, take the
    direct path unchanged; a PMF of one loss value (which dp-accounting keeps sparse and
    composes one copy at a time) is composed in blocks of that many copies.
    """
    from dp_accounting.pld import pld_pmf
    from dp_accounting.pld import privacy_loss_distribution as pld_lib

    remove = getattr(pld, "_pmf_remove", None)
    pmfs = [remove] if pld._symmetric else [remove, pld._pmf_add]  # noqa: SLF001 (the PMFs are not modified)
    sparse = any(isinstance(p, pld_pmf.SparsePLDPmf) for p in pmfs)
    if count == 1 or (sparse and count <= _SPARSE_SELF_COMPOSE_BLOCK):
        return pld.self_compose(count)
    if any(isinstance(p, pld_pmf.SparsePLDPmf) and p.size < 2 for p in pmfs):
        # one loss value stays sparse in dp-accounting (1 ** count <= 1000), composed one copy at a time: in blocks
        blocks, rest = divmod(count, _SPARSE_SELF_COMPOSE_BLOCK)
        out = pld.self_compose(_SPARSE_SELF_COMPOSE_BLOCK).self_compose(blocks)
        return out.compose(pld.self_compose(rest)) if rest else out
    return pld_lib.PrivacyLossDistribution(*(_dense_self_compose(p.to_dense_pmf(), count) for p in pmfs))


def _dense_self_compose(pmf: Any, count: int) -> Any:
    """dp-accounting's ``DensePLDPmf.self_compose(count)`` (tail mass truncation 1e-15), its statements in its
    order, with the truncation bounds of :func:`_self_convolve_bounds` (equal to ``compute_self_convolve_bounds``,
    whose 40 ``scipy.special.logsumexp`` calls cost more than the FFT for grids under ~1e5 points). Up to
    :data:`_LEAN_SELF_COMPOSE_POINTS` output points it gives dp-accounting's arrays; above, the same convolution
    in less memory with its round-off bounded (:func:`_lean_self_convolve`), never below the exact one, its aliasing
    counted at infinity. Both checked in tests/accounting/test_fast_pld.py."""
    from dp_accounting.pld import pld_pmf
    from scipy import fft

    probs = pmf._probs  # noqa: SLF001 (read only)
    lower, upper = _self_convolve_bounds(probs, count, _PLD_TAIL_MASS_TRUNCATION)
    output_len = upper - lower + 1
    alias = 0.0
    limit = max(PLD_MAX_GRID_POINTS, PLD_MAX_SELF_COMPOSED_POINTS)  # read at call time (tests scale the limits)
    if output_len > limit:  # the sizing's estimate fell short (found by the probe: 4.8e9 points, q = 1e-9, T = 7.9e8)
        raise _pld_too_large(float(output_len), pmf._discretization, f"{count} self-compositions", limit)  # noqa: SLF001
    if output_len > _LEAN_SELF_COMPOSE_POINTS:
        composed = _lean_self_convolve(probs, count, lower, output_len)
        alias = _PLD_TAIL_MASS_TRUNCATION  # what the cyclic FFT folds into the window, bounded by the truncation
    else:
        fast_len = fft.next_fast_len(max(output_len, len(probs)))
        composed = np.real(fft.ifft(fft.fft(probs, fast_len) ** count))
        composed = np.array(np.roll(composed, -lower)[:output_len])
    infinity = _PLD_TAIL_MASS_TRUNCATION + alias - math.expm1(count * math.log1p(-pmf._infinity_mass))  # noqa: SLF001
    return pld_pmf.DensePLDPmf(
        pmf._discretization, pmf._lower_loss * count + lower, composed, infinity, pmf._pessimistic_estimate,  # noqa: SLF001
    )


#: Self-compositions with more output points than this take :func:`_lean_self_convolve`; smaller ones are
#: dp-accounting's arrays bit for bit. dp-accounting's complex FFT peaked a calibration at 1.57 GB of resident memory
#: on an 8.5e6-point grid (q = 1e-6, T = 1e4, target 1e-3; the probe of tests/accounting/test_bounded_work.py then
#: ran out of its 2 GiB address space), so every large grid is composed the lean way.
_LEAN_SELF_COMPOSE_POINTS = 1e6


def _lean_self_convolve(probs: np.ndarray, count: int, lower: int, output_len: int) -> np.ndarray:
    """An upper bound of ``probs`` convolved with itself ``count`` times at each of ``output_len`` points from index
    ``lower``, in ~32 bytes a point (:func:`dpcl.accounting.fft_bound.bounded_self_convolve`).

    dp-accounting's ``DensePLDPmf.self_compose`` (and :func:`_dense_self_compose` below this size) takes the complex
    FFT of the real PMF, raises it to ``count`` into a new array, inverts it, rolls and copies: about 50 bytes a
    point per PMF, ~100 for a PLD's two, which is why dpcl refuses grids above :data:`PLD_MAX_GRID_POINTS`. The PMF is
    real, so its real FFT holds the same spectrum in half the memory; the power is taken in place. Its result
    carries a rounding noise that can fall below the exact composition where epsilon is read at a small delta,
    so each point is returned as a proven upper bound of the exact value: the FFT's round-off bounded
    rigorously and added, and exponentially tilted FFTs making the upper tail as accurate as the bulk. With the
    cyclic aliasing counted at infinity by the caller, the PLD is never below dp-accounting's pessimistic one at the
    same interval in exact arithmetic (tests/accounting/test_fast_pld.py). Why hand-written: neither dp-accounting
    nor scipy offers a self-convolution with a bound on its round-off, or whose peak memory is that of one real
    spectrum.
    """
    from scipy import fft

    fast_len = fft.next_fast_len(max(output_len, len(probs)), real=True)
    return bounded_self_convolve(probs, count, lower, output_len, fast_len)


#: ``auto`` refines its PLD until one refinement changes epsilon by at most this (relative) ...
AUTO_PLD_TOLERANCE = 0.005
#: ... or until the next interval would take its PLDs past this many grid points in all (the composed grids of
#: every interval tried, the next one predicted from the last; the note then says so). Work, not seconds, so
#: that the epsilon returned is a function of the events, delta and these settings alone, the same on a fast
#: machine, a slow one or a loaded one (a time limit only refuses: :mod:`dpcl.accounting.work`). Composing
#: costs ~0.25-0.6 us a grid point on the 2-core benchmark machine (Laplace steps at 1e-4: 1.0e7 points in
#: 2.5 s; DP-SGD at q = 0.1, T = 1e5: 2.5e6 in 0.8 s), so this is ~8-18 s of composition there, the time
#: budget it replaced (8 s) on that machine; no point of benchmarks/GRID.md comes near it (at most 3.8e6).
AUTO_PLD_WORK_BUDGET_POINTS = 3e7
#: A PLD that does not fit is coarsened to about this fraction of :data:`PLD_MAX_GRID_POINTS`.
_AUTO_PLD_COARSEN_TARGET = 0.25
#: Coarsest interval auto starts from; a PLD that does not fit in memory is coarsened beyond it.
AUTO_PLD_MAX_INTERVAL = 1.0


#: Relative epsilon error of a pessimistic PLD at interval h predicted as ``kappa * N h^2 / V`` (see
#: :func:`_auto_pld_start`); kappa measured on the DP-SGD grid of ``benchmarks/GRID.md``: 0.1 at q = 0.001,
#: up to 0.4 at q = 0.1. Only the starting interval depends on it, never the stopping rule.
_AUTO_PLD_ERROR_CONSTANT = 0.1
#: The largest kappa measured on that grid (q = 0.1), used where auto starts coarse (:func:`_auto_pld_fast_start`).
_AUTO_PLD_ERROR_CONSTANT_MAX = 0.4
#: A PLD start interval whose grid would exceed this many points (~0.25 s to compose) is replaced by a coarser
#: one where the events predict it converges (:func:`_auto_pld_fast_start`).
AUTO_PLD_FAST_POINTS = 1e6


def _loss_variance(mech: _Mechanisms) -> tuple[float, int]:
    """V, the summed variance of the steps' privacy losses, and N, the number of steps (see :func:`_auto_pld_start`).

    V of a Poisson-subsampled Gaussian step is its chi^2 divergence q^2 (e^(1/z^2) - 1) (the mu^2 / T of the
    CLT's Gaussian DP, Bu, Dong, Long & Su 2020), of the merged Gaussians mu^2 (one step), of a Laplace about
    eps0^2; ``inf`` where q^2 (e^(1/z^2) - 1) overflows."""
    variance, steps = 0.0, 0
    if mech.gauss_mus:
        variance += mech.gaussian_mu_total() ** 2
        steps += 1
    for eps0, count in mech.laplace:
        variance += count * eps0 * eps0
        steps += count
    for z, q, count in mech.sampled:
        z_size = z / 2.0 if mech.adjacency is Adjacency.REPLACE_ONE else z
        try:
            variance += count * q * q * math.expm1(1.0 / (z_size * z_size))
        except OverflowError:
            variance = math.inf
        steps += count
    return variance, steps


def _predicted_interval(mech: _Mechanisms, tolerance: float, kappa: float) -> float | None:
    """The interval h whose first refinement (2 h -> h) is predicted to change epsilon by half ``tolerance`` when
    the relative error at h is ``kappa N h^2 / V`` (see :func:`_auto_pld_start`); None where V or N says nothing."""
    variance, steps = _loss_variance(mech)
    if steps > 0 and 0.0 < variance < math.inf:
        return math.sqrt(tolerance / 6.0 * variance / (kappa * steps))
    return None


def _auto_pld_start(
    mech: _Mechanisms, epsilon_scale: float | None, tolerance: float = AUTO_PLD_TOLERANCE, interval: float | None = None,
) -> float:
    """The interval auto's PLD refinement starts from: ``epsilon_scale`` (the RDP epsilon) / :data:`AUTO_PLD_RESOLUTION`
    clipped to :data:`AUTO_PLD_INTERVAL_RANGE`, or finer where the events predict a larger discretisation error.

    Connect-the-dots splits the mass at each privacy loss between the two grid points around it, which adds
    about t (1 - t) h^2 (t the position inside the cell; h^2 / 6 on average) to the variance of each step's
    loss, so the composed loss of N steps gains ~N h^2 / 6 of variance against its own V = sum of the steps'
    variances (:func:`_loss_variance`). The relative epsilon error at h is then about kappa N h^2 / V
    (:data:`_AUTO_PLD_ERROR_CONSTANT`).
    The start is 2 h with h chosen so that the predicted change of the first refinement (2 h -> h,
    3 kappa N h^2 / V) is half the tolerance: where the prediction holds, the refinement converges in two
    steps (at q = 0.001 the RDP rule starts at 1e-3, whose error is 6-30 %, and needed four). The start is
    never coarser than the RDP rule (but for a large grid, below), and the prediction only saves steps: the
    stopping rule is unchanged.
    ``interval`` replaces the RDP rule (calibration's coarse search passes its own). Where that start would
    be a large grid and ``epsilon_scale`` is given, :func:`_auto_pld_fast_start` makes it coarser.
    """
    lo, hi = AUTO_PLD_INTERVAL_RANGE
    if interval is not None:
        start = interval
    elif epsilon_scale is not None:
        start = min(max(epsilon_scale / AUTO_PLD_RESOLUTION, lo), hi)
    else:
        start = PLD_VALUE_DISCRETIZATION_INTERVAL
    h = _predicted_interval(mech, tolerance, _AUTO_PLD_ERROR_CONSTANT)
    if h is not None:
        start = min(start, max(2.0 * h, lo))
    return _auto_pld_fast_start(mech, start, epsilon_scale, tolerance)


def _auto_pld_fast_start(
    mech: _Mechanisms, start: float, epsilon_scale: float | None, tolerance: float = AUTO_PLD_TOLERANCE,
) -> float:
    """``start``, or a coarser interval where the PLD at ``start`` would need more than :data:`AUTO_PLD_FAST_POINTS`
    grid points and the events predict that a coarser one converges.

    The RDP rule of :func:`_auto_pld_start` never starts coarser than 1e-3, so that auto is no looser than its
    earlier versions where that is cheap. Where epsilon is large (q = 0.1, T = 1e6, z = 0.6: epsilon ~3.4e4, a grid
    of ~7e6 points at 1e-3, 2.2 s, too large to refine) the error at a far coarser interval is already a
    small fraction of epsilon (2.5e-4 at 1e-2, 0.17 s). There the start is 2 h with h from
    :func:`_predicted_interval` at the largest error constant measured (:data:`_AUTO_PLD_ERROR_CONSTANT_MAX`),
    so that the first halving is predicted to converge even where the error is 4x the typical one; never
    coarser than ``epsilon_scale`` / :data:`AUTO_PLD_RESOLUTION` or :data:`AUTO_PLD_MAX_INTERVAL`, never finer
    than ``start``. Only the start moves: every step is still a pessimistic PLD and the stopping rule
    (:func:`_pld_refined`) is unchanged, so the result is an upper bound that converged to the same tolerance.
    """
    h = _predicted_interval(mech, tolerance, _AUTO_PLD_ERROR_CONSTANT_MAX)
    if h is None or epsilon_scale is None or 2.0 * h <= start:
        return start
    pieces, _, _ = _pld_pieces(mech)
    try:
        _sized_single_steps_or_refuse(pieces, start, AUTO_PLD_FAST_POINTS)
    except _PldTooLarge:
        return max(start, min(2.0 * h, epsilon_scale / AUTO_PLD_RESOLUTION, AUTO_PLD_MAX_INTERVAL))
    except UnsupportedEventError:
        return start  # the PLD itself will say why
    return start


@dataclass
class _PldRefinement:
    """What auto's PLD refinement did: (interval, epsilon, grid points) per step and how it stopped."""

    steps: list[tuple[float, float, float]] = field(default_factory=list)
    stopped: str = ""
    interval: float = math.nan  # interval of the reported (smallest) epsilon

    def note(self) -> str:
        path = " -> ".join(f"{h:.3g} (eps {e:.6g})" for h, e, _ in self.steps)
        return f"auto: PLD intervals {path}; {self.stopped}"


def _pld_refined(
    mech: _Mechanisms, delta: float, start_interval: float, budget_points: float | None = None,
    tolerance: float = AUTO_PLD_TOLERANCE,
) -> tuple[float, tuple[str, ...], _PldRefinement]:
    """Pessimistic PLD, refined from ``start_interval`` until it has converged (see :data:`AUTO_PLD_TOLERANCE`).

    Every step is a pessimistic dp-accounting PLD, so each is an upper bound and the smallest is
    reported. Convergence: the connect-the-dots discretisation error of dp-accounting's PLD falls
    like interval^2 (measured for DP-SGD: 1e-3 -> 3e-4 -> 1e-4 changes epsilon by 0.33, then 0.027
    at q = 0.001, T = 1e6), so once halving the interval changes epsilon by at most 0.5 %, the finer
    value is within ~0.5/3 % of the limit interval -> 0 (within 0.5 % if it converged only
    linearly). A PLD too large for memory is coarsened first (x size / limit); refinement stops
    when the next interval would not fit or would take the work past ``budget_points`` grid points
    (:data:`AUTO_PLD_WORK_BUDGET_POINTS`), and the note says which happened and the last relative change.
    Nothing here reads a clock: the intervals tried, and so the epsilon, depend on the inputs alone.
    """
    budget = AUTO_PLD_WORK_BUDGET_POINTS if budget_points is None else budget_points
    info = _PldRefinement()
    h = start_interval
    last_change = math.inf
    spent = 0.0
    while True:
        work: list[float] = []
        try:
            eps, notes = _pld(mech, delta, h, work)
        except _PldTooLarge as exc:
            if info.steps:
                info.stopped = (
                    f"not refined further: interval {h:.3g} would need ~{exc.points:.2g} grid points "
                    f"(past dpcl's limit); last refinement changed epsilon by {last_change:.2%}."
                )
                break
            # aim at a quarter of the limit: a grid at the limit takes ~10 s; refinement may go finer
            coarser = h * max(2.0, exc.points / (_AUTO_PLD_COARSEN_TARGET * PLD_MAX_GRID_POINTS))
            if coarser > AUTO_PLD_MAX_INTERVAL:
                raise
            h = coarser
            continue
        except UnsupportedEventError as exc:  # dp-accounting failed at this interval: keep what the coarser ones gave
            if not info.steps:
                raise
            info.stopped = f"not refined further: at interval {h:.3g} {exc}"
            break
        points = work[0] if work else 0.0
        spent += points
        info.steps.append((h, eps, points))
        if len(info.steps) >= 2:
            prev = info.steps[-2][1]
            last_change = (prev - eps) / eps if eps > 0 else (0.0 if prev == eps else math.inf)
            if last_change <= tolerance:
                info.stopped = (
                    f"converged: the last refinement changed epsilon by {max(last_change, 0.0):.2%} "
                    f"(<= {tolerance:.1%}; the discretisation error of the finer PLD is at most about that)."
                )
                break
        # next interval: halve, or less if the change so far says the error is still large
        # (error ~ c h^2; aim at an error of ~0.35 % at the next interval, never more than /8)
        factor = 0.5
        if len(info.steps) >= 2 and math.isfinite(last_change) and last_change > 0:
            factor = min(0.5, max(0.125, math.sqrt(0.7 * tolerance / (last_change / 3.0))))
        if spent + points / factor > budget:  # a composed grid grows like 1 / interval
            change = f"last refinement changed epsilon by {last_change:.2%}" if len(info.steps) >= 2 else "not refined"
            info.stopped = (
                f"refinement stopped at its work budget ({budget:.3g} grid points; the next interval {h * factor:.3g} "
                f"would take the PLDs to ~{spent + points / factor:.3g}); {change}."
            )
            break
        h *= factor
    best = min(info.steps, key=lambda s: s[1])
    info.interval = best[0]
    eps, notes = best[1], (f"pld: dp-accounting PLD, pessimistic estimate, value discretisation interval {best[0]:.3g}.",) + notes[1:]
    return eps, notes, info


class _CountAndDropLibraryWarnings(logging.Filter):
    """Drops records below ERROR from dp-accounting's absl logger, counting excluded-order warnings."""

    def __init__(self) -> None:
        super().__init__()
        self.excluded_orders = 0
        self.orders: list[float] = []  # the excluded orders, where the message names them

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno >= logging.ERROR:
            return True
        message = record.getMessage()
        if "Excluding this order" in message:
            self.excluded_orders += 1
            match = re.search(r"alpha=([0-9]+(?:\.[0-9]*)?(?:[eE][+-]?[0-9]+)?)", message)
            if match:
                self.orders.append(float(match.group(1)))
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
        _work.checkpoint()  # the caller's processor-time budget (dpcl.accounting.work)
        # acc.compose(PoissonSampledDpEvent(q, GaussianDpEvent(z)), count) adds count x the step's RDP at
        # each order; the step's RDP vector is memoised, so that a ledger composing the same steps again
        # (every release, every filter check) does not re-sum dp-accounting's series
        acc._rdp += count * _sampled_step_rdp(z, q)  # noqa: SLF001 (the same update compose makes)
    return acc


def _sampled_step_rdp(z: float, q: float) -> np.ndarray:
    """RDP at dp-accounting's default orders of one Poisson-subsampled Gaussian step (read-only, memoised)."""
    from dp_accounting import dp_event
    from dp_accounting.rdp import rdp_privacy_accountant

    key = ("rdp_step", float(z), float(q))
    hit = PLD_MEMO.get(key)
    if hit is not None:
        return hit
    single = rdp_privacy_accountant.RdpAccountant()
    single.compose(dp_event.PoissonSampledDpEvent(q, dp_event.GaussianDpEvent(z)), 1)
    vector = np.array(single._rdp, dtype=np.float64)  # noqa: SLF001
    vector.setflags(write=False)
    PLD_MEMO.put(key, vector, 1.0)
    return vector


def _rdp_epsilon(mech: _Mechanisms, delta: float) -> float:
    if delta not in mech.rdp_cache:
        try:
            with _dp_accounting_warnings_dropped() as dropped, np.errstate(all="ignore"):
                accountant = _rdp_accountant(mech)
                eps = float(accountant.get_epsilon(delta))
        except (ValueError, OverflowError, ZeroDivisionError, FloatingPointError) as exc:
            raise UnsupportedEventError(
                f"dp-accounting's RDP accountant cannot evaluate these events in floating point "
                f"({type(exc).__name__}: {str(exc)[:120]}); use accountant 'pld' or 'prv' (or 'auto')."
            ) from exc
        # the orders dp-accounting dropped hold an infinite RDP in the accountant (its log warnings
        # are not repeated for results it has cached, so they cannot be relied on to find them)
        orders = np.asarray(getattr(accountant, "_orders", dropped.orders), dtype=np.float64)
        values = np.asarray(getattr(accountant, "_rdp", np.zeros_like(orders)), dtype=np.float64)
        excluded = sorted(set(orders[~np.isfinite(values)].tolist()) | set(dropped.orders))
        mech.rdp_excluded_orders = max(mech.rdp_excluded_orders, dropped.excluded_orders, len(excluded))
        if excluded:
            other = _prv_rdp_epsilon(mech, delta, excluded)
            if other < eps:
                eps = other
                mech.rdp_from_prv = True
        mech.rdp_cache[delta] = eps
    return mech.rdp_cache[delta]


def _prv_rdp_epsilon(mech: _Mechanisms, delta: float, orders: list[float]) -> float:
    """prv-accountant's RDP accountant on the same events at the ``orders`` dp-accounting dropped.

    dp-accounting gives up on a fractional order after 1000 terms of its series (e.g. q = 0.1,
    z = 1: orders 1.1 to 1.5 are dropped and epsilon at T = 1e5 is 1544); prv-accountant (like
    opacus) sums the same TF-Privacy series until its terms fall below e^-30 and keeps those
    orders (921.6 there). Both are RDP upper bounds of the same mechanisms, and each order's
    conversion to (epsilon, delta) is a valid bound, so the smaller is. Only the dropped orders are
    evaluated here (prv-accountant's series is slow for large noise: ~0.3 s per order at z = 1e6).
    """
    from prv_accountant.other_accountants import RDP

    prvs, counts = _prv_mechanisms(mech)
    try:
        with warnings.catch_warnings(), np.errstate(all="ignore"):
            warnings.simplefilter("ignore")
            eps = float(RDP(prvs=prvs, orders=orders).compute_epsilon(delta, counts)[2])
    except (ValueError, OverflowError, ZeroDivisionError, FloatingPointError):
        return math.inf
    return eps if math.isfinite(eps) and eps >= 0 else math.inf


def _prv_mechanisms(mech: _Mechanisms) -> tuple[list[Any], list[int]]:
    """prv-accountant's privacy random variables of ``mech`` and their counts (Gaussians merged into one by
    their total mu, equal Laplace and sampled-Gaussian mechanisms grouped)."""
    from prv_accountant.privacy_random_variables import (
        GaussianMechanism,
        LaplaceMechanism,
        PoissonSubsampledGaussianMechanism,
    )

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
    return prvs, counts


def _rdp(mech: _Mechanisms, delta: float) -> tuple[float, tuple[str, ...]]:
    eps = _rdp_epsilon(mech, delta)
    notes = ["rdp: dp-accounting RdpAccountant, default orders, its RDP-to-(epsilon, delta) conversion."]
    if mech.rdp_excluded_orders:
        notes.append(
            f"rdp: dp-accounting excluded {mech.rdp_excluded_orders} order(s) whose RDP series did not converge; "
            "the bound is the minimum over the remaining orders (still an upper bound)."
            + (
                " prv-accountant's RDP accountant (the same series summed to convergence) at those orders is "
                "tighter here and is reported."
                if mech.rdp_from_prv
                else " prv-accountant's RDP accountant at those orders was also evaluated and is not tighter."
            )
        )
    return eps, tuple(notes)


def _prv(mech: _Mechanisms, delta: float) -> tuple[float, tuple[str, ...]]:
    from prv_accountant import PRVAccountant

    _refuse_eps_delta(mech, "prv")
    _refuse_replace_one_sampling(mech, "prv")
    eps_rdp = _rdp_epsilon(mech, delta)
    eps_error = max(PRV_RELATIVE_EPS_ERROR * eps_rdp, PRV_MIN_EPS_ERROR)
    delta_error = PRV_RELATIVE_DELTA_ERROR * delta
    prvs, counts = _prv_mechanisms(mech)
    try:
        with warnings.catch_warnings(), np.errstate(all="ignore"):
            warnings.simplefilter("ignore")
            # size the grid first, as PRVAccountant would (its domain [-L, L], its mesh), and refuse
            # before allocating; then hand it the same L (eps_max) so that it is not computed twice
            domain = _prv_safe_domain(mech, counts, eps_error, delta_error)
            mesh = eps_error / math.sqrt(sum(counts) / 2.0 * math.log(12.0 / delta_error))
            points = 2.0 * domain / mesh
            if not points <= PRV_MAX_GRID_POINTS:
                raise UnsupportedEventError(
                    f"prv-accountant would need ~{points:.2g} grid points for these events (domain +-{domain:.3g}, "
                    f"mesh {mesh:.2g}; dpcl allocates at most {PRV_MAX_GRID_POINTS:.2g}, about 1 GB); use accountant "
                    "'auto', 'pld' or 'rdp'."
                )
            if not points * len(prvs) <= _work.PRV_MAX_POINT_MECHANISMS:
                raise UnsupportedEventError(
                    f"prv-accountant would discretise and compose {len(prvs)} distinct mechanisms on ~{points:.2g} grid "
                    f"points each; dpcl does at most {_work.PRV_MAX_POINT_MECHANISMS:.2g} points x mechanisms (about 20 s); "
                    "use accountant 'auto', 'pld' or 'rdp', or give equal mechanisms equal parameters."
                )
            if not domain <= PRV_MAX_DOMAIN:
                raise UnsupportedEventError(
                    f"prv-accountant would need the privacy-loss domain +-{domain:.4g} for these events; past "
                    f"+-{PRV_MAX_DOMAIN:g} its float64 exp overflows and its bound is not reliable (it gave a negative "
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


def _prv_safe_domain(mech: _Mechanisms, counts: list[int], eps_error: float, delta_error: float) -> float:
    """prv-accountant's safe domain size L (its remark 5.6, ``compute_safe_domain_size``), from dp-accounting's RDP.

    prv-accountant takes L from an RDP epsilon of the composition at delta_error / 4 and of each
    single mechanism at delta_error / (8 * compositions), plus 3; any sound RDP accountant gives a
    sound L. dp-accounting's is used because prv-accountant's own series takes minutes for large
    noise multipliers (46 s at z = 1e6); where dp-accounting dropped orders, L is only larger.
    """
    total = sum(counts)
    with _dp_accounting_warnings_dropped(), np.errstate(all="ignore"):
        domain = float(_rdp_accountant(mech).get_epsilon(delta_error / 4.0))
        pieces: list[_Mechanisms] = []
        if mech.gauss_mus:
            pieces.append(_Mechanisms(adjacency=mech.adjacency, unit=mech.unit, gauss_mus=mech.gauss_mus, gauss_counts=mech.gauss_counts))
        for eps0, _ in _grouped(mech.laplace):
            pieces.append(_Mechanisms(adjacency=mech.adjacency, unit=mech.unit, laplace=[(eps0, 1)]))
        for (z, q), _ in _grouped_pairs(mech.sampled):
            pieces.append(_Mechanisms(adjacency=mech.adjacency, unit=mech.unit, sampled=[(z, q, 1)]))
        for piece in pieces:
            domain = max(domain, float(_rdp_accountant(piece).get_epsilon(delta_error / 8.0 / total)))
    return max(domain, eps_error) + 3.0


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


# ---------------------------------------------------------------------------
# in-process memo: audit, plan, ledger and certificates ask for the same epsilons
# ---------------------------------------------------------------------------
#: Most results the in-process memo keeps (least recently used dropped first).
MEMO_MAX_ENTRIES = 4096
#: Arrays of Gaussian mus up to this many bytes enter the memo key as their bytes; larger ones as their
#: length and SHA-256 digest (a collision would need a SHA-256 collision).
_MEMO_INLINE_BYTES = 4096
#: Module-level names whose values (numbers) or objects (functions) change what an accountant computes:
#: every one is part of each memo key, so changing (or monkeypatching) any of them misses the memo.
_MEMO_SETTING_NAMES = (
    "PLD_VALUE_DISCRETIZATION_INTERVAL", "AUTO_PLD_RESOLUTION", "AUTO_PLD_INTERVAL_RANGE", "_AUTO_PLD_ERROR_CONSTANT", "AUTO_PLD_TOLERANCE",
    "_AUTO_PLD_ERROR_CONSTANT_MAX", "AUTO_PLD_FAST_POINTS", "_auto_pld_fast_start", "_loss_variance", "_predicted_interval",
    "AUTO_PLD_WORK_BUDGET_POINTS", "AUTO_PLD_MAX_INTERVAL", "_AUTO_PLD_COARSEN_TARGET", "PLD_MAX_GRID_POINTS",
    "PLD_MAX_SELF_COMPOSED_POINTS", "_LEAN_SELF_COMPOSE_POINTS", "_lean_self_convolve",
    "_PLD_TAIL_MASS_TRUNCATION", "_PLD_GAUSSIAN_TAIL_SIGMAS", "_PLD_PROXY_POINTS", "_SPARSE_SELF_COMPOSE_BLOCK",
    "PRV_RELATIVE_EPS_ERROR", "PRV_MIN_EPS_ERROR", "PRV_MAX_GRID_POINTS", "PRV_RELATIVE_DELTA_ERROR",
    "_exact", "_basic", "_advanced", "_rdp", "_rdp_epsilon", "_prv_rdp_epsilon", "_pld", "_pld_refined",
    "_sized_single_steps", "_auto_pld_start", "_epsilon_for_delta", "_dense_epsilon_for_delta",
    "_self_convolve_bounds", "_dense_self_compose", "_EPSILON_SCAN_CHUNK", "_composed_pieces", "_self_compose", "_self_compose_uncached", "_composed_points_uncached", "_gaussian_pld",
    "_single_gaussian_pld", "_sampled_step_rdp", "_rdp_accountant", "_prv", "_prv_safe_domain", "_auto", "gdp_epsilon",
)


class _Memo:
    """A bounded, thread-safe, in-process LRU map from a full-input key to an immutable result.

    Nothing is ever written to disk, so nothing can go stale across versions or processes. Keys hold
    every input the computation reads (see :func:`_memo_key`); values are frozen objects, and
    :class:`AccountingResult` values are handed out as fresh copies (their ``candidates`` dict is new).
    ``hits``/``misses`` count lookups (read by the tests and benchmarks).
    """

    def __init__(self, max_entries: int) -> None:
        import collections
        import threading

        self._data: "collections.OrderedDict[Any, Any]" = collections.OrderedDict()
        self._lock = threading.Lock()
        self.max_entries = max_entries
        self.hits = 0
        self.misses = 0

    def get(self, key: Any) -> Any:
        with self._lock:
            if key in self._data:
                self._data.move_to_end(key)
                self.hits += 1
                return self._data[key]
            self.misses += 1
            return None

    def put(self, key: Any, value: Any) -> None:
        with self._lock:
            self._data[key] = value
            self._data.move_to_end(key)
            while len(self._data) > self.max_entries:
                self._data.popitem(last=False)

    def clear(self) -> None:
        with self._lock:
            self._data.clear()
            self.hits = self.misses = 0

    def __len__(self) -> int:
        return len(self._data)


#: The memo of :func:`compute_epsilon` (and of calibration's internal ``auto`` evaluations).
EPSILON_MEMO = _Memo(MEMO_MAX_ENTRIES)


def settings_key() -> tuple[Any, ...]:
    """The current values of every module-level setting an accountant reads (part of each memo key)."""
    module = globals()
    return tuple(module[name] for name in _MEMO_SETTING_NAMES) + tuple(_ACCOUNTANTS.values())


def _array_key(values: np.ndarray) -> tuple[Any, ...]:
    data = np.ascontiguousarray(values, dtype=np.float64)
    raw = data.tobytes()
    if len(raw) <= _MEMO_INLINE_BYTES:
        return (data.size, raw)
    import hashlib

    return (data.size, hashlib.sha256(raw).hexdigest())


def _mech_key(mech: _Mechanisms) -> tuple[Any, ...]:
    """Canonical representation of collected events: every value the accountants read, in collection order.

    Two event lists with the same key are accounted by exactly the same computation (the accountants
    read nothing but the collected mechanisms, delta and the module settings), so they get the same result.
    """
    return (
        mech.adjacency.value,
        mech.unit,
        tuple((_array_key(m), int(c)) for m, c in zip(mech.gauss_mus, mech.gauss_counts)),
        tuple((float(e), int(c)) for e, c in mech.laplace),
        tuple((float(z), float(q), int(c)) for z, q, c in mech.sampled),
        tuple((float(e), float(d), int(c)) for e, d, c in mech.eps_delta),
    )


def _memo_key(kind: str, mech: _Mechanisms, delta: float, *options: Any) -> tuple[Any, ...]:
    return (kind, float(delta), options, _mech_key(mech), settings_key())


def clear_memo() -> None:
    """Forget every memoised epsilon and PLD (they live in this process only; see :data:`EPSILON_MEMO`)."""
    EPSILON_MEMO.clear()
    PLD_MEMO.clear()


def compute_epsilon(
    events: PrivacyEvent | Sequence[PrivacyEvent],
    delta: float,
    accountant: str = "auto",
) -> AccountingResult:
    """Upper bound on epsilon at ``delta`` for the adaptive composition of ``events``.

    ``accountant`` is one of :data:`ACCOUNTANT_NAMES` (see the module docstring).
    A named accountant that cannot soundly handle the events raises
    :class:`~dpcl.errors.UnsupportedEventError` saying which to use instead.

    Results are memoised in this process (:data:`EPSILON_MEMO`), keyed on the canonical form of the
    events, delta, the accountant and every module setting: an audit, the run's plan, its ledger and
    its certificates' self-verification that ask for the same epsilon compute it once.

    A computation that has spent :data:`~dpcl.accounting.work.EPSILON_TIME_BUDGET_S` seconds of processor time
    (many distinct mechanisms, each its own PLD or RDP series) is refused with
    :class:`~dpcl.errors.WorkLimitError` (see :mod:`dpcl.accounting.work`).
    """
    name = _check_accountant(accountant)
    delta = check_delta_scalar("delta", delta)
    mech = _collect(events)
    key = _memo_key(name, mech, delta)
    cached = EPSILON_MEMO.get(key)
    if cached is not None:
        return dataclasses.replace(cached)
    base = dict(delta=delta, adjacency=mech.adjacency.value, unit=mech.unit)
    with _work.epsilon_budget(mech.describe(), name, delta):  # issue 18: an answer within 60 s, or a refusal
        if name != "auto":
            eps, notes = _ACCOUNTANTS[name](mech, delta)
            _check_result(eps, name)
            result = AccountingResult(epsilon=eps, accountant=name, candidates={name: eps}, notes=(*notes, _RELATION_NOTE), **base)
        else:
            result = _auto(mech, delta, base)
    EPSILON_MEMO.put(key, result)
    return dataclasses.replace(result)


def _auto(
    mech: _Mechanisms, delta: float, base: dict[str, Any], pld_interval: float | None = None,
    tolerance: float = AUTO_PLD_TOLERANCE, used: dict[str, float] | None = None,
) -> AccountingResult:
    """The tightest sound bound of the accountants dpcl runs (see the module docstring).

    ``pld_interval`` (used by calibration, which evaluates many nearby noise levels) fixes the PLD
    interval instead of refining it; the result is still a pessimistic PLD, so still an upper bound.
    ``tolerance`` is the refinement's stopping change; ``used["pld_interval"]`` receives the PLD
    interval of the reported PLD epsilon.
    """
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
    candidates: dict[str, float] = {}
    all_notes: dict[str, tuple[str, ...]] = {}
    refusals: list[str] = []
    auto_notes: list[str] = []

    def attempt(name: str, fn: Callable[[], tuple[float, tuple[str, ...]]]) -> None:
        try:
            eps, notes = fn()
            _check_result(eps, name)
        except UnsupportedEventError as exc:
            refusals.append(f"{name}: {exc}")
            return
        candidates[name] = eps
        all_notes[name] = notes

    attempt("rdp", lambda: _rdp(mech, delta))
    pld_converged = False

    def pld_auto() -> tuple[float, tuple[str, ...]]:
        nonlocal pld_converged
        if pld_interval is not None:
            eps, notes = _pld(mech, delta, pld_interval)
            pld_converged = True
            if used is not None:
                used["pld_interval"] = pld_interval
            return eps, notes
        start = _auto_pld_start(mech, candidates.get("rdp"), tolerance)
        eps, notes, info = _pld_refined(mech, delta, start, tolerance=tolerance)
        pld_converged = info.stopped.startswith("converged")
        if used is not None:
            used["pld_interval"] = info.interval
        auto_notes.append(info.note())
        return eps, notes

    attempt("pld", pld_auto)
    attempt("advanced", lambda: _advanced(mech, delta))
    attempt("basic", lambda: _basic(mech, delta))
    if not pld_converged:
        # PLD refused or not refined to 0.5 %: prv-accountant's upper bound may be tighter
        attempt("prv", lambda: _prv(mech, delta))
    if not candidates:
        raise UnsupportedEventError("no accountant can bound these events: " + " | ".join(refusals))
    winner = min(candidates, key=lambda k: candidates[k])
    listing = ", ".join(f"{k}={v:.6g}" for k, v in candidates.items())
    skipped = [r.split(":", 1)[0] for r in refusals]
    refused = f" Not applicable or refused: {', '.join(skipped)}." if skipped else ""
    return AccountingResult(
        epsilon=candidates[winner], accountant=winner, candidates=candidates,
        notes=(*all_notes[winner], *auto_notes, f"auto: tightest of {listing}.{refused}", _RELATION_NOTE),
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


def _auto_epsilon(
    events: PrivacyEvent | Sequence[PrivacyEvent],
    delta: float,
    *,
    pld_interval: float | None = None,
    tolerance: float = AUTO_PLD_TOLERANCE,
) -> tuple[AccountingResult, float | None]:
    """``compute_epsilon(events, delta, "auto")`` with calibration's knobs; also returns the PLD interval used."""
    delta = check_delta_scalar("delta", delta)
    mech = _collect(events)
    key = _memo_key("auto-options", mech, delta, pld_interval, tolerance)
    cached = EPSILON_MEMO.get(key)
    if cached is not None:
        return dataclasses.replace(cached[0]), cached[1]
    base = dict(delta=delta, adjacency=mech.adjacency.value, unit=mech.unit)
    used: dict[str, float] = {}
    result = _auto(mech, delta, base, pld_interval=pld_interval, tolerance=tolerance, used=used)
    EPSILON_MEMO.put(key, (result, used.get("pld_interval")))
    return dataclasses.replace(result), used.get("pld_interval")


def epsilon_for(events: PrivacyEvent | Sequence[PrivacyEvent], delta: float, accountant: str = "auto") -> float:
    """Shorthand: ``compute_epsilon(events, delta, accountant).epsilon``."""
    return compute_epsilon(events, delta, accountant).epsilon

