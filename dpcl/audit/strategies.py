"""Hypothesis strategies for property tests of privacy mechanisms.

Import explicitly (``from dpcl.audit.strategies import ...``); this module needs
``hypothesis`` (the ``test`` extra), which ``import dpcl.audit`` does not load.

* :func:`epsilons`, :func:`deltas`, :func:`sigmas`, :func:`sensitivities` —
  valid scalar parameters, drawn log-uniformly between the given bounds (so
  small and large magnitudes are equally exercised).
* :func:`gaussian_parameters`, :func:`laplace_parameters` — a privacy target
  plus sensitivity, ready for calibration.
* :func:`neighbouring_datasets` — a dataset of bounded vectors and a neighbour
  under ``add_remove`` (one record added or removed) or ``replace_one`` (one
  record replaced). Every record has norm at most ``norm_bound``, so a sum
  query has sensitivity ``norm_bound`` (add/remove) or ``2 * norm_bound``
  (replace-one) in that norm.

Example (docs/audit.md runs it as a test)::

    @given(params=gaussian_parameters(), pair=neighbouring_datasets("replace_one", dim=3))
    def test_noisy_sum(params, pair): ...
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from dpcl.errors import InvalidParameterError

#: Relative margin kept below ``norm_bound`` so float rounding never pushes a record's norm above it.
NORM_MARGIN = 1e-12

ADJACENCIES = ("add_remove", "replace_one")
NORMS = ("l2", "l1")


def _range(name: str, low: Any, high: Any, *, upper_limit: float = math.inf) -> tuple[float, float]:
    """Validated ``(low, high)`` with ``0 < low <= high < upper_limit`` (or finite when no limit)."""
    try:
        lo, hi = float(low), float(high)
    except (TypeError, ValueError):
        raise InvalidParameterError(f"{name} bounds must be numbers, got {low!r} and {high!r}.") from None
    if not (math.isfinite(lo) and math.isfinite(hi)) or lo <= 0 or hi < lo or hi >= upper_limit:
        limit = f" < {upper_limit}" if math.isfinite(upper_limit) else ""
        raise InvalidParameterError(
            f"{name} bounds must satisfy 0 < min_value <= max_value{limit} (finite), got {low!r} and {high!r}."
        )
    return lo, hi


def _log_uniform(lo: float, hi: float, *, exclusive_high: bool = False) -> st.SearchStrategy[float]:
    if lo == hi:
        return st.just(lo)
    top = math.nextafter(hi, 0.0) if exclusive_high else hi
    return st.floats(math.log(lo), math.log(hi)).map(lambda x: float(min(max(math.exp(x), lo), top)))


def epsilons(min_value: float = 0.01, max_value: float = 20.0) -> st.SearchStrategy[float]:
    """epsilon > 0, log-uniform in [min_value, max_value]."""
    return _log_uniform(*_range("epsilon", min_value, max_value))


def deltas(min_value: float = 1e-12, max_value: float = 0.1) -> st.SearchStrategy[float]:
    """delta in (0, 1), log-uniform in [min_value, max_value] (max_value < 1)."""
    lo, hi = _range("delta", min_value, max_value, upper_limit=1.0)
    return _log_uniform(lo, hi, exclusive_high=True)


def sigmas(min_value: float = 0.01, max_value: float = 100.0) -> st.SearchStrategy[float]:
    """Noise standard deviation sigma > 0, log-uniform."""
    return _log_uniform(*_range("sigma", min_value, max_value))


def sensitivities(min_value: float = 0.01, max_value: float = 100.0) -> st.SearchStrategy[float]:
    """Query sensitivity > 0, log-uniform."""
    return _log_uniform(*_range("sensitivity", min_value, max_value))


@dataclass(frozen=True)
class GaussianParameters:
    """A Gaussian-mechanism privacy target: (epsilon, delta) for a query of l2 ``sensitivity``."""

    epsilon: float
    delta: float
    sensitivity: float


@dataclass(frozen=True)
class LaplaceParameters:
    """A Laplace-mechanism target: pure epsilon for a query of l1 ``sensitivity``."""

    epsilon: float
    sensitivity: float


def gaussian_parameters(
    min_epsilon: float = 0.01,
    max_epsilon: float = 20.0,
    min_delta: float = 1e-12,
    max_delta: float = 0.1,
    min_sensitivity: float = 0.01,
    max_sensitivity: float = 100.0,
) -> st.SearchStrategy[GaussianParameters]:
    """(epsilon, delta, sensitivity) triples for the Gaussian mechanism."""
    return st.builds(
        GaussianParameters,
        epsilon=epsilons(min_epsilon, max_epsilon),
        delta=deltas(min_delta, max_delta),
        sensitivity=sensitivities(min_sensitivity, max_sensitivity),
    )


def laplace_parameters(
    min_epsilon: float = 0.01, max_epsilon: float = 20.0, min_sensitivity: float = 0.01, max_sensitivity: float = 100.0
) -> st.SearchStrategy[LaplaceParameters]:
    """(epsilon, sensitivity) pairs for the Laplace mechanism."""
    return st.builds(
        LaplaceParameters,
        epsilon=epsilons(min_epsilon, max_epsilon),
        sensitivity=sensitivities(min_sensitivity, max_sensitivity),
    )


@dataclass(frozen=True)
class NeighbouringPair:
    """Two neighbouring datasets (rows are records) and how they differ.

    ``change`` is ``"add"`` (``neighbour`` has one more record, at ``index``),
    ``"remove"`` (``neighbour`` lacks ``dataset[index]``) or ``"replace"``
    (``neighbour[index]`` differs). Every record has ``norm`` at most
    ``norm_bound``.
    """

    dataset: np.ndarray
    neighbour: np.ndarray
    adjacency: str
    change: str
    index: int
    norm: str
    norm_bound: float

    @property
    def sum_sensitivity(self) -> float:
        """Sensitivity of the sum query under this adjacency: ``norm_bound`` or ``2 * norm_bound``."""
        return self.norm_bound * (2.0 if self.adjacency == "replace_one" else 1.0)


def _bounded_records(n: int, dim: int, norm: str, bound: float) -> st.SearchStrategy[np.ndarray]:
    """``n`` records in R^dim with ``norm`` at most ``bound``: a direction times a radius in [0, bound]."""
    directions = hnp.arrays(np.float64, (n, dim), elements=st.floats(-1.0, 1.0, allow_subnormal=False))
    radii = hnp.arrays(np.float64, (n,), elements=st.one_of(st.just(1.0), st.floats(0.0, 1.0)))
    order = 2 if norm == "l2" else 1

    def build(args: tuple[np.ndarray, np.ndarray]) -> np.ndarray:
        v, r = args
        # rescale each direction to max |v_i| = 1 first: the norm of a tiny vector (e.g. entries 1e-160)
        # loses precision in its squares and let records exceed the bound
        peak = np.max(np.abs(v), axis=1, keepdims=True)
        v = np.divide(v, peak, out=np.zeros_like(v), where=peak > 0)
        lengths = np.linalg.norm(v, ord=order, axis=1)
        scale = np.divide(r * bound * (1.0 - NORM_MARGIN), lengths, out=np.zeros(n), where=lengths > 0)
        return v * scale[:, None]

    return st.tuples(directions, radii).map(build)


@st.composite
def _pairs(draw: Any, adjacency: str | None, min_size: int, max_size: int, dim: int, norm: str, bound: float) -> NeighbouringPair:
    adj = adjacency or draw(st.sampled_from(ADJACENCIES))
    n = draw(st.integers(min_size, max_size))
    records = draw(_bounded_records(n + 1, dim, norm, bound))
    data, extra = records[:n], records[n]
    if adj == "replace_one":
        index = draw(st.integers(0, n - 1))
        neighbour = data.copy()
        neighbour[index] = extra
        change = "replace"
    else:
        change = draw(st.sampled_from(("add", "remove"))) if n >= 1 else "add"
        if change == "add":
            index = draw(st.integers(0, n))
            neighbour = np.insert(data, index, extra, axis=0)
        else:
            index = draw(st.integers(0, n - 1))
            neighbour = np.delete(data, index, axis=0)
    return NeighbouringPair(
        dataset=data, neighbour=neighbour, adjacency=adj, change=change, index=int(index), norm=norm, norm_bound=bound
    )


def neighbouring_datasets(
    adjacency: str | None = None,
    *,
    min_size: int = 1,
    max_size: int = 20,
    dim: int = 2,
    norm: str = "l2",
    norm_bound: float = 1.0,
) -> st.SearchStrategy[NeighbouringPair]:
    """Pairs of neighbouring datasets of ``dim``-dimensional records with ``norm`` <= ``norm_bound``.

    ``adjacency`` is ``"add_remove"``, ``"replace_one"`` or ``None`` (either).
    Datasets have between ``min_size`` and ``max_size`` records (the added
    record of an ``add`` pair comes on top). Records on the norm boundary are
    drawn often, since they are where sensitivity bounds are tight.
    """
    if adjacency is not None and adjacency not in ADJACENCIES:
        raise InvalidParameterError(f"adjacency must be one of {ADJACENCIES} or None, got {adjacency!r}.")
    if norm not in NORMS:
        raise InvalidParameterError(f"norm must be one of {NORMS}, got {norm!r}.")
    for name, value, low in (("min_size", min_size, 1), ("max_size", max_size, 1), ("dim", dim, 1)):
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < low:
            raise InvalidParameterError(f"{name} must be an integer >= {low}, got {value!r}.")
    if max_size < min_size:
        raise InvalidParameterError(f"max_size must be >= min_size, got {max_size} < {min_size}.")
    try:
        bound = float(norm_bound)
    except (TypeError, ValueError):
        bound = math.nan
    if isinstance(norm_bound, bool) or not math.isfinite(bound) or bound <= 0:
        raise InvalidParameterError(f"norm_bound must be a finite number > 0, got {norm_bound!r}.")
    return _pairs(adjacency, int(min_size), int(max_size), int(dim), norm, bound)
