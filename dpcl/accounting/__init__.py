"""Accounting layer: privacy events, mechanisms and accountants that turn events into (epsilon, delta).

Never imports torch. Modules: :mod:`~dpcl.accounting.events` (immutable events),
:mod:`~dpcl.accounting.gaussian` (exact Gaussian profile and calibration),
:mod:`~dpcl.accounting.laplace`, :mod:`~dpcl.accounting.composition`,
:mod:`~dpcl.accounting.accountants` (exact / basic / advanced / RDP / PLD / PRV /
auto, one module each, found through one registry that packages extend with the entry-point group
``dpcl.accountants``), :mod:`~dpcl.accounting.dpsgd`, :mod:`~dpcl.accounting.filter`.
"""

# the registry's functions (register_accountant, get_accountant, accountant_names, ...) are public in
# dpcl.accounting.accountants
from dpcl.accounting.accountants import ACCOUNTANT_NAMES, Accountant, AccountantBase, AccountingResult, Mechanisms, compute_epsilon
from dpcl.accounting.composition import (
    advanced_composition,
    advanced_composition_for_delta,
    basic_composition,
    compose_gaussians_epsilon,
    gaussian_composition_mu,
)
from dpcl.accounting.dpsgd import NoiseCalibration, dpsgd_epsilon, dpsgd_events, dpsgd_noise_multiplier
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
from dpcl.accounting.filter import FilterBudget, FilterCharge, PrivacyFilter
from dpcl.accounting.gaussian import (
    ClassicGaussian,
    classic_gaussian_sigma,
    gaussian_delta,
    gaussian_epsilon,
    gaussian_sigma,
    gaussian_sigma_stream,
    gdp_delta,
    gdp_epsilon,
    gdp_mu,
)
from dpcl.accounting.laplace import laplace_delta, laplace_epsilon, laplace_epsilon_for_delta, laplace_scale

__all__ = [
    "ACCOUNTANT_NAMES",
    "Accountant",
    "AccountantBase",
    "AccountingResult",
    "Mechanisms",
    "Adjacency",
    "FilterBudget",
    "FilterCharge",
    "NoiseCalibration",
    "PrivacyFilter",
    "advanced_composition",
    "advanced_composition_for_delta",
    "basic_composition",
    "compose_gaussians_epsilon",
    "compute_epsilon",
    "dpsgd_epsilon",
    "dpsgd_events",
    "dpsgd_noise_multiplier",
    "gaussian_composition_mu",
    "laplace_delta",
    "laplace_epsilon",
    "laplace_epsilon_for_delta",
    "laplace_scale",
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
    "gaussian_sigma_stream",
    "gdp_delta",
    "gdp_epsilon",
    "gdp_mu",
]
