"""The numerics under the PLD accountants: dp-accounting's privacy loss distributions built, sized,
self-composed and read faster or in less memory than dp-accounting does, each cross-checked against
dp-accounting's own in tests/accounting/test_fast_pld.py, and the memo of the PLDs built
(:data:`~dpcl.accounting.accountants.memo.PLD_MEMO`). Used by :mod:`~dpcl.accounting.accountants.pld` and
:mod:`~dpcl.accounting.accountants.auto`.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from dpcl.accounting import work as _work
from dpcl.accounting.accountants import settings
from dpcl.accounting.accountants.memo import PLD_MEMO
from dpcl.accounting.fft_bound import bounded_self_convolve
from dpcl.errors import UnsupportedEventError

__all__ = ["PLD_LIBRARY_FAILURES"]


class _PldTooLarge(UnsupportedEventError):
    """A PLD at this interval would not fit in memory; ``points`` is the estimated grid size."""

    def __init__(self, message: str, points: float) -> None:
        super().__init__(message)
        self.points = points


def _single_step_points(z: float, interval: float) -> float:
    """An upper estimate of the grid size of one Gaussian (std z, sensitivity 1) step's PLD.

    Its privacy loss (x - 1/2) / z^2 is discretised for x within ~10 z of the mean on
    either side: width (2 * 10 z + 1) / z^2 in loss units. Subsampling only narrows it.
    """
    z = np.float64(z)  # numpy float: a tiny z gives inf points (refused as too large), not a ZeroDivisionError
    with np.errstate(over="ignore", divide="ignore"):
        return float((2.0 * settings._PLD_GAUSSIAN_TAIL_SIGMAS / z + 1.0 / (z * z)) / interval + 1.0)


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
            if span > settings.PLD_MAX_GRID_POINTS:
                return float(span)
            pmf = pmf.to_dense_pmf()
        probs = pmf._probs  # noqa: SLF001
        if count == 1:
            points = max(points, float(probs.size))
            continue
        lower, upper = _self_convolve_bounds(probs, count, settings._PLD_TAIL_MASS_TRUNCATION)
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
    limit = settings.PLD_MAX_GRID_POINTS if limit is None else limit  # read at call time (tests scale the module's limit)
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


def _epsilon_for_delta(pld: Any, delta: float) -> float:
    """``pld.get_epsilon_for_delta(delta)``, with dense PMFs scanned by :func:`_dense_epsilon_for_delta`."""
    from dp_accounting.pld import pld_pmf

    pmfs = [pld._pmf_remove] if pld._symmetric else [pld._pmf_remove, pld._pmf_add]  # noqa: SLF001 (read only)
    if not all(isinstance(p, pld_pmf.DensePLDPmf) for p in pmfs):
        return float(pld.get_epsilon_for_delta(delta))
    return max(_dense_epsilon_for_delta(p, delta) for p in pmfs)


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
    for start in range(0, probs.size, settings._EPSILON_SCAN_CHUNK):
        p = probs[start : start + settings._EPSILON_SCAN_CHUNK]
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
    how = (float(interval), settings._SPARSE_SELF_COMPOSE_BLOCK, _self_compose, _gaussian_pld)
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


#: What dp-accounting's PLD code raises where it cannot evaluate events (floating point; IndexError: its compose
#: truncates both tails of a PMF to nothing, an empty array, when the tails hold all but 1e-15 of its mass, e.g.
#: Laplace steps of epsilon 1e4 at interval 1); each is refused as :func:`_pld_library_error` says.
PLD_LIBRARY_FAILURES = (ValueError, OverflowError, ZeroDivisionError, FloatingPointError, IndexError)


def _pld_library_error(exc: BaseException) -> UnsupportedEventError:
    return UnsupportedEventError(
        f"dp-accounting's PLD cannot evaluate these events in floating point ({type(exc).__name__}: "
        f"{str(exc)[:120]}); use accountant 'rdp' or 'prv' (or 'auto', which picks what applies)."
    )


def _self_compose(pld: Any, count: int) -> Any:
    """:func:`_self_compose_uncached`, memoised per PLD object and count (:data:`PLD_MEMO`)."""
    key = ("self_compose", id(pld), int(count), settings._SPARSE_SELF_COMPOSE_BLOCK, _self_compose_uncached)
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
    if count == 1 or (sparse and count <= settings._SPARSE_SELF_COMPOSE_BLOCK):
        return pld.self_compose(count)
    if any(isinstance(p, pld_pmf.SparsePLDPmf) and p.size < 2 for p in pmfs):
        # one loss value stays sparse in dp-accounting (1 ** count <= 1000), composed one copy at a time: in blocks
        blocks, rest = divmod(count, settings._SPARSE_SELF_COMPOSE_BLOCK)
        out = pld.self_compose(settings._SPARSE_SELF_COMPOSE_BLOCK).self_compose(blocks)
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
    lower, upper = _self_convolve_bounds(probs, count, settings._PLD_TAIL_MASS_TRUNCATION)
    output_len = upper - lower + 1
    alias = 0.0
    limit = max(settings.PLD_MAX_GRID_POINTS, settings.PLD_MAX_SELF_COMPOSED_POINTS)  # read at call time (tests scale the limits)
    if output_len > limit:  # the sizing's estimate fell short (found by the probe: 4.8e9 points, q = 1e-9, T = 7.9e8)
        raise _pld_too_large(float(output_len), pmf._discretization, f"{count} self-compositions", limit)  # noqa: SLF001
    if output_len > settings._LEAN_SELF_COMPOSE_POINTS:
        composed = _lean_self_convolve(probs, count, lower, output_len)
        alias = settings._PLD_TAIL_MASS_TRUNCATION  # what the cyclic FFT folds into the window, bounded by the truncation
    else:
        fast_len = fft.next_fast_len(max(output_len, len(probs)))
        composed = np.real(fft.ifft(fft.fft(probs, fast_len) ** count))
        composed = np.array(np.roll(composed, -lower)[:output_len])
    infinity = settings._PLD_TAIL_MASS_TRUNCATION + alias - math.expm1(count * math.log1p(-pmf._infinity_mass))  # noqa: SLF001
    return pld_pmf.DensePLDPmf(
        pmf._discretization, pmf._lower_loss * count + lower, composed, infinity, pmf._pessimistic_estimate,  # noqa: SLF001
    )


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
