"""Ready-made audits of the accounting core's mechanisms, and ``assert_not_leaking`` for pytest.

:class:`GaussianMechanism` and :class:`LaplaceMechanism` carry their own
sampling code (``value + noise`` drawn from a seeded :class:`numpy.random.Generator`)
and their worst-case neighbouring pair: for a query of sensitivity ``Delta`` the
outputs ``M(0)`` and ``M(Delta)`` (one coordinate) are as far apart as any two
neighbouring inputs can make them, so auditing that pair audits the mechanism.
Both can be built from a privacy target through the accounting core
(:func:`dpcl.accounting.gaussian.gaussian_sigma`,
:func:`dpcl.accounting.laplace.laplace_scale`), which is what the soundness
tests audit.

:func:`assert_not_leaking` runs the black-box auditor
(:mod:`dpcl.audit.blackbox`) on any mechanism and raises ``AssertionError`` when
the high-confidence lower bound on epsilon exceeds the claimed epsilon.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Protocol, runtime_checkable

import numpy as np

from dpcl.accounting.gaussian import gaussian_epsilon, gaussian_sigma
from dpcl.accounting.laplace import laplace_epsilon, laplace_scale
from dpcl.accounting.validation import check_delta_scalar, check_positive_scalar
from dpcl.audit.blackbox import AuditResult, ScoreFunction, audit_sampler, check_audit_delta, check_trials
from dpcl.errors import InvalidParameterError


@runtime_checkable
class SamplingMechanism(Protocol):
    """A mechanism that can draw ``size`` independent outputs on ``data``: shape ``(size, *output_shape)``."""

    def sample(self, data: Any, size: int, rng: np.random.Generator) -> np.ndarray: ...


class _AdditiveNoiseMechanism:
    """What the Gaussian and Laplace mechanisms share: ``M(x) = x + noise`` drawn by :meth:`_noise`, and the
    worst-case neighbouring pair of a query of sensitivity ``sensitivity``."""

    sensitivity: float

    def _noise(self, rng: np.random.Generator, shape: tuple[int, ...]) -> np.ndarray:
        raise NotImplementedError

    def sample(self, data: Any, size: int, rng: np.random.Generator) -> np.ndarray:
        value = np.asarray(data, dtype=np.float64)
        return value + self._noise(rng, (int(size), *value.shape))

    def neighbouring_values(self) -> tuple[np.ndarray, np.ndarray]:
        """Worst-case pair of query values: ``0`` and ``sensitivity``."""
        return np.float64(0.0), np.float64(self.sensitivity)


@dataclass(frozen=True)
class GaussianMechanism(_AdditiveNoiseMechanism):
    """``M(x) = x + N(0, sigma^2 I)`` for a query value ``x`` of l2 sensitivity ``sensitivity``."""

    sigma: float
    sensitivity: float = 1.0

    def __post_init__(self) -> None:
        object.__setattr__(self, "sigma", check_positive_scalar("sigma", self.sigma))
        object.__setattr__(self, "sensitivity", check_positive_scalar("sensitivity", self.sensitivity))

    @classmethod
    def calibrated(cls, epsilon: float, delta: float, sensitivity: float = 1.0) -> "GaussianMechanism":
        """Analytic calibration (Balle & Wang 2018, Thm 8) through :func:`dpcl.accounting.gaussian.gaussian_sigma`."""
        return cls(sigma=float(gaussian_sigma(epsilon, delta, sensitivity)), sensitivity=sensitivity)

    def _noise(self, rng: np.random.Generator, shape: tuple[int, ...]) -> np.ndarray:
        return rng.normal(0.0, self.sigma, size=shape)

    def epsilon(self, delta: float) -> float:
        """The mechanism's exact epsilon at ``delta`` (Balle & Wang 2018, Thm 8), from the accounting core.

        When ``sensitivity / sigma`` overflows a float no finite epsilon is representable: ``inf``
        (an upper bound) is returned instead of the NaN the profile would give.
        """
        check_delta_scalar("delta", delta)
        return float(gaussian_epsilon(self.sigma, delta, self.sensitivity))


@dataclass(frozen=True)
class LaplaceMechanism(_AdditiveNoiseMechanism):
    """``M(x) = x + Lap(scale)`` per coordinate for a query value ``x`` of l1 sensitivity ``sensitivity``."""

    scale: float
    sensitivity: float = 1.0

    def __post_init__(self) -> None:
        object.__setattr__(self, "scale", check_positive_scalar("scale", self.scale))
        object.__setattr__(self, "sensitivity", check_positive_scalar("sensitivity", self.sensitivity))

    @classmethod
    def calibrated(cls, epsilon: float, sensitivity: float = 1.0) -> "LaplaceMechanism":
        """``scale = sensitivity / epsilon`` (Dwork & Roth 2014, Thm 3.6) via :func:`dpcl.accounting.laplace.laplace_scale`."""
        return cls(scale=float(laplace_scale(epsilon, sensitivity)), sensitivity=sensitivity)

    def _noise(self, rng: np.random.Generator, shape: tuple[int, ...]) -> np.ndarray:
        return rng.laplace(0.0, self.scale, size=shape)

    def epsilon(self, delta: float = 0.0) -> float:
        """Pure epsilon ``sensitivity / scale`` (valid at every delta in [0, 1)), from the accounting core.

        ``inf`` when ``sensitivity / scale`` overflows a float.
        """
        check_delta_scalar("delta", delta, allow_zero=True)
        return float(laplace_epsilon(self.scale, self.sensitivity))


MechanismLike = SamplingMechanism | Callable[[Any, int, np.random.Generator], np.ndarray]


def _sampler_for(mechanism: MechanismLike, data: Any) -> Callable[[int, np.random.Generator], np.ndarray]:
    if isinstance(mechanism, SamplingMechanism):
        return lambda size, rng: mechanism.sample(data, size, rng)
    if callable(mechanism):
        return lambda size, rng: mechanism(data, size, rng)
    raise InvalidParameterError(
        "mechanism must have a sample(data, size, rng) method or be a function (data, size, rng) -> outputs; "
        f"got {type(mechanism).__name__}."
    )


def _neighbours_for(mechanism: MechanismLike, neighbours: tuple[Any, Any] | None) -> tuple[Any, Any]:
    if neighbours is not None:
        if not isinstance(neighbours, (tuple, list)) or len(neighbours) != 2:
            raise InvalidParameterError("neighbours must be a pair (D, D') of neighbouring inputs.")
        return neighbours[0], neighbours[1]
    pair = getattr(mechanism, "neighbouring_values", None)
    if pair is None:
        raise InvalidParameterError(
            "give neighbours=(D, D'): this mechanism has no neighbouring_values() worst-case pair."
        )
    return pair()


def audit_mechanism(
    mechanism: MechanismLike,
    delta: float,
    *,
    neighbours: tuple[Any, Any] | None = None,
    score: ScoreFunction | None = None,
    trials: int = 200_000,
    confidence: float = 0.95,
    seed: int = 0,
    progress: Callable[[int], None] | None = None,
) -> AuditResult:
    """Lower bound on the epsilon of ``mechanism`` at ``delta`` from ``trials`` outputs on each of ``neighbours``.

    ``progress`` is passed to :func:`~dpcl.audit.blackbox.audit_sampler` (outputs per input drawn so far).
    """
    d_0, d_1 = _neighbours_for(mechanism, neighbours)
    return audit_sampler(
        _sampler_for(mechanism, d_0),
        _sampler_for(mechanism, d_1),
        check_trials(trials),
        check_audit_delta(delta),
        score=score,
        confidence=confidence,
        seed=seed,
        progress=progress,
    )


def audit_gaussian(
    sigma: float, sensitivity: float, delta: float, *, trials: int = 1_000_000, confidence: float = 0.95, seed: int = 0
) -> AuditResult:
    """Audit ``x + N(0, sigma^2)`` on its worst-case pair at ``delta``."""
    return audit_mechanism(
        GaussianMechanism(sigma, sensitivity), delta, trials=trials, confidence=confidence, seed=seed
    )


def audit_laplace(
    scale: float, sensitivity: float, delta: float, *, trials: int = 1_000_000, confidence: float = 0.95, seed: int = 0
) -> AuditResult:
    """Audit ``x + Lap(scale)`` on its worst-case pair at ``delta`` (``delta = 0`` audits pure DP)."""
    return audit_mechanism(
        LaplaceMechanism(scale, sensitivity), delta, trials=trials, confidence=confidence, seed=seed
    )


def assert_not_leaking(
    mechanism: MechanismLike,
    claimed_epsilon: float,
    delta: float,
    *,
    neighbours: tuple[Any, Any] | None = None,
    score: ScoreFunction | None = None,
    trials: int = 200_000,
    confidence: float = 0.95,
    seed: int = 0,
) -> AuditResult:
    """Fail (``AssertionError``) when ``mechanism`` provably leaks more than ``claimed_epsilon`` at ``delta``.

    ``mechanism`` has ``sample(data, size, rng)`` or is a function
    ``(data, size, rng) -> outputs``; ``neighbours=(D, D')`` is the pair to
    test (default: the mechanism's ``neighbouring_values()``); vector outputs
    need ``score``. Returns the :class:`AuditResult` when the claim survives.
    A passing audit is evidence, not proof: it only says no leak above the
    claim was found with these trials.
    """
    claim = check_positive_scalar("claimed_epsilon", claimed_epsilon)
    result = audit_mechanism(
        mechanism, delta, neighbours=neighbours, score=score, trials=trials, confidence=confidence, seed=seed
    )
    if result.epsilon_lower_bound > claim:
        raise AssertionError(
            f"mechanism leaks more than claimed: epsilon lower bound {result.epsilon_lower_bound:.4f} > "
            f"claimed epsilon {claim:.4f} at delta={result.delta:g} (confidence {result.confidence:g}, "
            f"{result.trials} trials per input; test {result.inequality!r} at threshold {result.threshold:.6g})."
        )
    return result
