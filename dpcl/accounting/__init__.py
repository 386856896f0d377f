"""Accounting layer: privacy events, mechanisms and accountants that turn events into (epsilon, delta).

Never imports torch. Modules: :mod:`~dpcl.accounting.events` (immutable events),
:mod:`~dpcl.accounting.gaussian` (exact Gaussian profile and calibration),
:mod:`~dpcl.accounting.laplace`, :mod:`~dpcl.accounting.composition`,
:mod:`~dpcl.accounting.accountants` (exact / basic / advanced / RDP / PLD / PRV /
auto), :mod:`~dpcl.accounting.dpsgd`, :mod:`~dpcl.accounting.filter`.
"""

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
    event_from_dict,
)
from dpcl.accounting.gaussian import (
    ClassicGaussian,
    classic_gaussian_sigma,
    gaussian_delta,
    gaussian_epsilon,
    gaussian_sigma,
    gdp_delta,
    gdp_epsilon,
    gdp_mu,
)

__all__ = [
    "Adjacency",
    "ClassicGaussian",
    "ComposedEvent",
    "EpsilonDeltaEvent",
    "GaussianEvent",
    "HeterogeneousGaussianEvent",
    "LaplaceEvent",
    "PoissonSampledGaussianEvent",
    "PrivacyEvent",
    "RepeatedEvent",
    "classic_gaussian_sigma",
    "event_from_dict",
    "gaussian_delta",
    "gaussian_epsilon",
    "gaussian_sigma",
    "gdp_delta",
    "gdp_epsilon",
    "gdp_mu",
]
