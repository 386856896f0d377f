"""Laplace mechanism: scale, pure epsilon and the exact profile against a numerical integral."""

from __future__ import annotations

import math

import numpy as np
import pytest
from dp_accounting.pld import privacy_loss_distribution as pld_lib
from hypothesis import given
from hypothesis import strategies as st
from scipy import integrate
from scipy.stats import laplace

from dpcl.accounting.laplace import laplace_delta, laplace_epsilon, laplace_epsilon_for_delta, laplace_scale
from dpcl.errors import InvalidParameterError


def hockey_stick(eps: float, b: float, sens: float) -> float:
    """int max(0, p(x) - e^eps q(x)) dx, p = Lap(0, b), q = Lap(sens, b), by quadrature."""
    f = lambda x: max(0.0, laplace.pdf(x, 0, b) - math.exp(eps) * laplace.pdf(x, sens, b))  # noqa: E731
    pieces = [(-np.inf, 0.0), (0.0, sens), (sens, np.inf)]
    return sum(integrate.quad(f, a, c, epsabs=1e-13, epsrel=1e-11, limit=200)[0] for a, c in pieces)


@pytest.mark.parametrize("b,sens", [(1.0, 1.0), (0.5, 2.0), (3.0, 1.0)])
@pytest.mark.parametrize("eps", [0.0, 0.1, 0.4, 0.9, 5.0])
def test_profile_matches_numerical_integral(b: float, sens: float, eps: float) -> None:
    assert laplace_delta(eps, b, sens) == pytest.approx(hockey_stick(eps, b, sens), abs=1e-9)


def test_profile_closed_form_and_pure_point() -> None:
    eps0 = 2.0 / 0.5
    assert laplace_delta(1.0, 0.5, 2.0) == pytest.approx(1 - math.exp((1.0 - eps0) / 2), rel=1e-14)
    assert laplace_delta(eps0, 0.5, 2.0) == 0.0
    assert laplace_delta(eps0 + 1, 0.5, 2.0) == 0.0
    np.testing.assert_allclose(laplace_delta(np.array([0.0, 1.0]), 1.0), [1 - math.exp(-0.5), 0.0], atol=1e-15)


def test_profile_agrees_with_dp_accounting_pld() -> None:
    pld = pld_lib.from_laplace_mechanism(parameter=2.0, sensitivity=1.0, value_discretization_interval=1e-5)
    for eps in (0.05, 0.2, 0.4):
        assert laplace_delta(eps, 2.0) == pytest.approx(pld.get_delta_for_epsilon(eps), abs=1e-4)


def test_scale_and_epsilon() -> None:
    assert laplace_scale(0.5, 2.0) == 4.0
    assert laplace_epsilon(4.0, 2.0) == 0.5
    np.testing.assert_allclose(laplace_scale(np.array([1.0, 2.0])), [1.0, 0.5])


@given(b=st.floats(0.01, 100.0), delta=st.floats(1e-12, 0.99))
def test_property_epsilon_for_delta_is_safe_root(b: float, delta: float) -> None:
    eps = laplace_epsilon_for_delta(b, delta)
    assert 0.0 <= eps <= 1.0 / b
    assert laplace_delta(eps, b) <= delta
    if eps > 0:
        assert laplace_delta(eps * (1 - 1e-9), b) > delta or eps * 1e-9 < 1e-15


@given(eps=st.floats(0.0, 100.0), b=st.floats(0.01, 100.0), factor=st.floats(1.0, 10.0))
def test_property_more_noise_never_raises_delta(eps: float, b: float, factor: float) -> None:
    d = laplace_delta(eps, b)
    assert 0.0 <= d <= 1.0 and not math.isnan(d)
    assert laplace_delta(eps, b * factor) <= d


@pytest.mark.parametrize("bad", [0.0, -1.0, float("nan"), float("inf")])
def test_invalid_inputs(bad: float) -> None:
    with pytest.raises(InvalidParameterError, match="epsilon"):
        laplace_scale(bad)
    with pytest.raises(InvalidParameterError, match="scale"):
        laplace_epsilon(bad)
    with pytest.raises(InvalidParameterError, match="sensitivity"):
        laplace_delta(0.5, 1.0, bad)
    with pytest.raises(InvalidParameterError, match="delta"):
        laplace_epsilon_for_delta(1.0, bad if bad != 0.0 else 1.0)


def test_mismatched_shapes_raise_a_typed_error_naming_the_parameters() -> None:
    with pytest.raises(InvalidParameterError, match=r"epsilon, scale, sensitivity .*epsilon \(3,\), scale \(2,\)"):
        laplace_delta(np.ones(3), np.ones(2))
    with pytest.raises(InvalidParameterError, match="scale, delta, sensitivity"):
        laplace_epsilon_for_delta(np.ones(3), np.full(2, 1e-5))
    with pytest.raises(InvalidParameterError, match=r"scale must be > 0 and finite, got -1.0 \(element 1"):
        laplace_epsilon([1.0, -1.0])


def test_overflowing_sensitivity_over_scale_is_infinite_epsilon_without_warnings():
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert laplace_epsilon(1e-300, 1e300) == math.inf
        assert laplace_epsilon_for_delta(1e-300, 0.5, 1e300) == math.inf
        assert laplace_delta(5.0, 1e-300, 1e300) == 1.0
