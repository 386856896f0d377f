"""dpcl's vectorised Gaussian PLD construction against dp-accounting's own ``from_gaussian_mechanism``."""

from __future__ import annotations

import numpy as np
import pytest
from dp_accounting.pld import privacy_loss_distribution as pld_lib
from dp_accounting.privacy_accountant import NeighboringRelation

from dpcl.accounting.accountants import _gaussian_pld


def _pmfs(pld):
    return [p for p in (pld._pmf_remove, pld._pmf_add)]  # noqa: SLF001


@pytest.mark.parametrize(
    "z,q,interval",
    [(1.0, 32 / 288, 1e-3), (2.2, 0.11, 1e-3), (0.74, 0.001, 1e-3), (1.0, 1e-6, 1e-3), (0.5, 0.5, 1e-3),
     (3.0, 1.0, 1e-3), (0.3, 0.9, 1e-2)],
)
def test_same_pmf_and_epsilon_as_dp_accounting(z: float, q: float, interval: float) -> None:
    reference = pld_lib.from_gaussian_mechanism(
        z, sensitivity=1.0, pessimistic_estimate=True, value_discretization_interval=interval, sampling_prob=q
    )
    ours = _gaussian_pld(z, interval, q)
    for a, b in zip(_pmfs(reference), _pmfs(ours)):
        assert type(a) is type(b)
        if hasattr(a, "_probs"):
            assert a._lower_loss == b._lower_loss and a._infinity_mass == b._infinity_mass
            np.testing.assert_allclose(b._probs, a._probs, rtol=1e-12, atol=0)
        else:
            assert a._loss_probs.keys() == b._loss_probs.keys()
            np.testing.assert_allclose(list(b._loss_probs.values()), list(a._loss_probs.values()), rtol=1e-12, atol=0)
    for delta in (1e-5, 1e-3):
        expected = reference.self_compose(50).get_epsilon_for_delta(delta)
        assert ours.self_compose(50).get_epsilon_for_delta(delta) == pytest.approx(expected, rel=1e-12, abs=1e-15)


def test_replace_one_is_dp_accountings_own() -> None:
    reference = pld_lib.from_gaussian_mechanism(
        1.0, sensitivity=1.0, pessimistic_estimate=True, value_discretization_interval=1e-3, sampling_prob=0.1,
        neighboring_relation=NeighboringRelation.REPLACE_ONE,
    )
    ours = _gaussian_pld(1.0, 1e-3, 0.1, replace_one=True)
    assert ours.get_epsilon_for_delta(1e-5) == reference.get_epsilon_for_delta(1e-5)
