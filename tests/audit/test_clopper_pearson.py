import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from scipy.stats import binom

from dpcl.audit.clopper_pearson import clopper_pearson_lower, clopper_pearson_upper
from dpcl.errors import InvalidParameterError


@pytest.mark.parametrize("n", [1, 7, 1000, 10**6])
@pytest.mark.parametrize("alpha", [0.05, 0.001])
def test_zero_and_all_successes_closed_forms(n, alpha):
    # k = 0: P(X = 0 | p) = (1 - p)^n = alpha  ->  p_ub = 1 - alpha^(1/n); symmetric for k = n.
    assert clopper_pearson_upper(0, n, alpha) == pytest.approx(1 - alpha ** (1 / n), rel=1e-9)
    assert clopper_pearson_lower(n, n, alpha) == pytest.approx(alpha ** (1 / n), rel=1e-9)
    assert clopper_pearson_upper(n, n, alpha) == 1.0
    assert clopper_pearson_lower(0, n, alpha) == 0.0


@given(
    n=st.integers(1, 10**6),
    frac=st.floats(0, 1),
    alpha=st.floats(1e-6, 0.5),
)
def test_bounds_solve_the_binomial_tail_equations(n, frac, alpha):
    # Clopper-Pearson: upper u solves P(X <= k | u) = alpha, lower l solves P(X >= k | l) = alpha.
    k = int(round(frac * n))
    ub = clopper_pearson_upper(k, n, alpha)
    lb = clopper_pearson_lower(k, n, alpha)
    assert 0.0 <= lb <= k / n <= ub <= 1.0
    if k < n:
        assert binom.cdf(k, n, ub) == pytest.approx(alpha, rel=1e-5, abs=1e-12)
    if k > 0:
        assert binom.sf(k - 1, n, lb) == pytest.approx(alpha, rel=1e-5, abs=1e-12)


def test_vectorised_matches_scalar():
    k = np.array([0, 3, 50, 100])
    ub = clopper_pearson_upper(k, 100, 0.05)
    assert ub.shape == (4,)
    assert [clopper_pearson_upper(int(x), 100, 0.05) for x in k] == pytest.approx(ub.tolist())


def test_coverage_of_upper_bound_is_at_least_confidence():
    rng = np.random.default_rng(0)
    p, n, alpha = 0.03, 200, 0.1
    k = rng.binomial(n, p, size=20_000)
    covered = np.mean(clopper_pearson_upper(k, n, alpha) >= p)
    assert covered >= 1 - alpha


@pytest.mark.parametrize(
    "k, n, alpha, word",
    [(5, 0, 0.05, "trials"), (-1, 10, 0.05, "successes"), (11, 10, 0.05, "successes"),
     (1, 10, 0.0, "alpha"), (1, 10, 1.0, "alpha"), (1.5, 10, 0.05, "successes"), (np.nan, 10, 0.05, "successes")],
)
def test_invalid_input_is_refused(k, n, alpha, word):
    with pytest.raises(InvalidParameterError, match=word):
        clopper_pearson_upper(k, n, alpha)
