"""prv-accountant answers are reported only when they can be right.

At q = 0.1, T = 1e6, z = 2, delta = 1e-5 prv-accountant 0.2 (called with dpcl's safe domain, +-2592) returns the
"upper bound" -844, because its float64 exp overflows over that domain and its discretised step has a negative
mean privacy loss. dpcl used to clamp that to epsilon = 0, and `auto` could pick it. The true epsilon there is
about 1600 (dp-accounting's RDP accountant: 1634.9, checked below).
"""

from __future__ import annotations

import types

import numpy as np
import pytest

from dpcl.accounting import accountants
from dpcl.accounting.accountants import prv
from dpcl.accounting.dpsgd import dpsgd_epsilon
from dpcl.errors import UnsupportedEventError


def test_prv_refuses_the_overflowing_domain_instead_of_reporting_zero() -> None:
    import dp_accounting

    with pytest.raises(UnsupportedEventError, match="domain"):
        dpsgd_epsilon(noise_multiplier=2.0, sample_rate=0.1, steps=10**6, delta=1e-5, accountant="prv")
    reference = dp_accounting.rdp.RdpAccountant()
    reference.compose(
        dp_accounting.SelfComposedDpEvent(
            dp_accounting.PoissonSampledDpEvent(0.1, dp_accounting.GaussianDpEvent(2.0)), 10**6
        )
    )
    assert reference.get_epsilon(1e-5) > 1000.0


def test_prv_still_answers_where_its_domain_is_safe() -> None:
    from prv_accountant import PRVAccountant
    from prv_accountant.privacy_random_variables import PoissonSubsampledGaussianMechanism

    ours = dpsgd_epsilon(noise_multiplier=1.0, sample_rate=0.01, steps=10**4, delta=1e-5, accountant="prv").epsilon
    reference = PRVAccountant(
        prvs=[PoissonSubsampledGaussianMechanism(noise_multiplier=1.0, sampling_probability=0.01)],
        eps_error=0.01, delta_error=1e-8, max_self_compositions=[10**4],
    ).compute_epsilon(delta=1e-5, num_self_compositions=[10**4])
    assert reference[0] <= ours <= reference[2] + 0.1


def _discrete(ts: np.ndarray, pmf: np.ndarray) -> types.SimpleNamespace:
    return types.SimpleNamespace(domain=types.SimpleNamespace(ts=lambda: ts), pmf=pmf)


def test_a_step_with_negative_mean_privacy_loss_is_refused() -> None:
    ts = np.linspace(-1.0, 1.0, 5)
    single = _discrete(ts, np.array([0.5, 0.2, 0.1, 0.1, 0.1]))  # mean -0.35: not a KL divergence
    with pytest.raises(UnsupportedEventError, match="negative mean"):
        prv._check_prv_composition([single], [3], single, mesh=0.01)


def test_a_wrapped_composition_is_refused() -> None:
    ts = np.linspace(-1.0, 1.0, 5)
    single = _discrete(ts, np.array([0.0, 0.1, 0.2, 0.3, 0.4]))  # mean 0.5
    wrapped = _discrete(ts, np.array([0.4, 0.3, 0.2, 0.1, 0.0]))  # mean -0.5 instead of 1.5
    with pytest.raises(UnsupportedEventError, match="inconsistent"):
        prv._check_prv_composition([single], [3], wrapped, mesh=0.01)
    consistent = _discrete(np.linspace(-3.0, 3.0, 7), np.array([0.0, 0.0, 0.0, 0.0, 0.5, 0.5, 0.0]))
    prv._check_prv_composition([single], [3], consistent, mesh=0.01)


def test_a_non_positive_prv_bound_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    from prv_accountant.discrete_privacy_random_variable import DiscretePrivacyRandomVariable

    monkeypatch.setattr(DiscretePrivacyRandomVariable, "compute_epsilon", lambda self, *a, **k: (-3.0, -2.0, -1.0))
    accountants.clear_memo() if hasattr(accountants, "clear_memo") else None
    with pytest.raises(UnsupportedEventError, match="non-positive"):
        dpsgd_epsilon(noise_multiplier=1.3, sample_rate=0.02, steps=1234, delta=1e-5, accountant="prv")
