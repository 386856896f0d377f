import numpy as np
import pytest
from audit_reference import gaussian_epsilon_closed_form, gaussian_sigma_closed_form
from scipy.stats import norm

from dpcl.audit.blackbox import (
    audit_outputs,
    audit_sampler,
    audit_scores,
    epsilon_from_error_rates,
    linear_score,
)
from dpcl.errors import InvalidParameterError


@pytest.mark.parametrize("sigma, delta", [(1.0, 1e-5), (0.5, 1e-3), (3.0, 1e-6)])
def test_exact_rates_of_the_optimal_test_recover_the_gaussian_epsilon(sigma, delta):
    # For N(0, s^2) vs N(1, s^2) the threshold tests are the likelihood-ratio tests, so the supremum
    # of the Kairouz bound over thresholds equals the exact epsilon of Balle & Wang's profile.
    t = np.linspace(-10 * sigma, 10 * sigma + 1, 400_001)
    fpr = norm.sf(t / sigma)
    fnr = norm.cdf((t - 1) / sigma)
    eps_hat = epsilon_from_error_rates(fpr, fnr, delta)
    assert eps_hat.max() == pytest.approx(gaussian_epsilon_closed_form(sigma, delta), rel=1e-4)
    assert eps_hat.max() <= gaussian_epsilon_closed_form(sigma, delta) + 1e-9


def test_exact_rates_of_laplace_recover_pure_epsilon():
    b = 0.5  # eps = 1 / 0.5 = 2
    t = np.linspace(-5, 6, 10_001)
    fpr = np.where(t >= 0, 0.5 * np.exp(-t / b), 1 - 0.5 * np.exp(t / b))  # P(Lap(b) > t)
    fnr = np.where(t - 1 >= 0, 1 - 0.5 * np.exp(-(t - 1) / b), 0.5 * np.exp((t - 1) / b))  # P(1 + Lap(b) <= t)
    eps_hat = epsilon_from_error_rates(fpr, fnr, 0.0)
    assert eps_hat.max() == pytest.approx(2.0, rel=1e-9)


def test_rates_formula_is_floored_at_zero_and_checks_input():
    assert epsilon_from_error_rates(0.5, 0.5, 0.0) == 0.0
    assert epsilon_from_error_rates(0.9, 0.9, 1e-5) == 0.0
    with pytest.raises(InvalidParameterError, match="rate"):
        epsilon_from_error_rates(1.2, 0.1, 1e-5)
    with pytest.raises(InvalidParameterError, match="delta"):
        epsilon_from_error_rates(0.1, 0.1, 1.0)


def _gaussian_samplers(sigma, shift=1.0):
    return (lambda n, rng: rng.normal(0.0, sigma, n)), (lambda n, rng: rng.normal(shift, sigma, n))


@pytest.mark.parametrize("epsilon, delta", [(0.5, 1e-5), (2.0, 1e-5), (4.0, 1e-3)])
def test_lower_bound_never_exceeds_true_epsilon_across_seeds(epsilon, delta):
    sigma = gaussian_sigma_closed_form(epsilon, delta)
    s_d, s_dp = _gaussian_samplers(sigma)
    bounds = [audit_sampler(s_d, s_dp, 100_000, delta, seed=seed).epsilon_lower_bound for seed in range(25)]
    assert max(bounds) <= epsilon
    assert np.mean(bounds) > 0.3 * epsilon  # and it is not vacuous


def test_fixed_grid_mode_is_sound_and_uses_all_samples():
    epsilon, delta = 2.0, 1e-5
    sigma = gaussian_sigma_closed_form(epsilon, delta)
    grid = np.linspace(-3, 4, 50) * sigma  # fixed before sampling
    rng = np.random.default_rng(3)
    bounds = []
    for _ in range(30):
        r = audit_scores(rng.normal(0, sigma, 50_000), rng.normal(1, sigma, 50_000), delta, thresholds=grid)
        bounds.append(r.epsilon_lower_bound)
        assert r.bound_trials == 50_000 and "Bonferroni" in r.selection
    assert 0 < max(bounds) <= epsilon


def test_score_direction_does_not_matter():
    sigma = 1.0
    rng = np.random.default_rng(1)
    a, b = rng.normal(0, sigma, 200_000), rng.normal(1, sigma, 200_000)
    up = audit_scores(a, b, 1e-5, seed=2).epsilon_lower_bound
    down = audit_scores(-a, -b, 1e-5, seed=2).epsilon_lower_bound
    assert up > 1.5 and down > 1.5
    assert up <= gaussian_epsilon_closed_form(sigma, 1e-5)


def test_identical_distributions_give_zero():
    rng = np.random.default_rng(5)
    r = audit_scores(rng.normal(size=100_000), rng.normal(size=100_000), 1e-5)
    assert r.epsilon_lower_bound == 0.0


def test_half_sensitivity_gaussian_is_flagged():
    # sigma calibrated for sensitivity 1/2 but the query moves by 1: true eps far above the claim.
    epsilon, delta = 1.0, 1e-5
    sigma = gaussian_sigma_closed_form(epsilon, delta, sensitivity=0.5)
    s_d, s_dp = _gaussian_samplers(sigma)
    r = audit_sampler(s_d, s_dp, 1_000_000, delta, seed=0)
    assert r.epsilon_lower_bound > epsilon
    assert r.epsilon_lower_bound <= gaussian_epsilon_closed_form(sigma, delta)


def test_vector_outputs_with_linear_score():
    rng = np.random.default_rng(0)
    x0, x1 = np.zeros(3), np.array([0.6, 0.0, 0.8])  # ||x1 - x0|| = 1
    out0 = x0 + rng.normal(0, 1.0, (200_000, 3))
    out1 = x1 + rng.normal(0, 1.0, (200_000, 3))
    r = audit_outputs(out0, out1, 1e-5, score=linear_score(x1 - x0))
    assert 1.5 < r.epsilon_lower_bound <= gaussian_epsilon_closed_form(1.0, 1e-5)
    with pytest.raises(InvalidParameterError, match="score function"):
        audit_outputs(out0, out1, 1e-5)


def test_result_serialises():
    rng = np.random.default_rng(0)
    d = audit_scores(rng.normal(size=1000), rng.normal(1, 1, size=1000), 1e-3).to_dict()
    assert {"epsilon_lower_bound", "delta", "confidence", "threshold", "trials", "selection"} <= set(d)


@pytest.mark.parametrize(
    "kwargs, word",
    [
        ({"delta": -0.1}, "delta"),
        ({"delta": 1.0}, "delta"),
        ({"delta": float("nan")}, "delta"),
        ({"confidence": 1.0}, "confidence"),
        ({"confidence": 0.0}, "confidence"),
        ({"trials": 2}, "trials"),
        ({"trials": 10**9}, "trials"),
        ({"trials": 1000.5}, "trials"),
        ({"seed": -1}, "seed"),
        ({"seed": True}, "seed"),
        ({"chunk_size": 0}, "chunk_size"),  # used to ask the sampler for 0 outputs, over and over
        ({"chunk_size": -5}, "chunk_size"),
        ({"chunk_size": 2.5}, "chunk_size"),
    ],
)
def test_sampler_audit_refuses_bad_input(kwargs, word):
    s_d, s_dp = _gaussian_samplers(1.0)
    args = {"trials": 1000, "delta": 1e-5} | kwargs
    with pytest.raises(InvalidParameterError, match=word):
        audit_sampler(s_d, s_dp, args.pop("trials"), args.pop("delta"), **args)


@pytest.mark.parametrize("seed", [-1, 1.5, "abc", True])
def test_score_audit_refuses_bad_seed_with_a_typed_error(seed):
    with pytest.raises(InvalidParameterError, match="seed"):
        audit_scores(np.arange(10.0), np.arange(10.0) + 5, 0.0, seed=seed)


def test_score_audit_accepts_none_seed():
    assert audit_scores(np.arange(10.0), np.arange(10.0) + 5, 0.0, seed=None).epsilon_lower_bound >= 0


def test_boolean_outputs_are_refused_with_a_hint():
    with pytest.raises(InvalidParameterError, match="astype"):
        audit_scores(np.arange(10) % 2 == 0, np.arange(10) % 3 == 0, 0.0)


def test_non_finite_scores_are_refused():
    with pytest.raises(InvalidParameterError, match="NaN or inf"):
        audit_scores(np.array([0.0, 1.0, np.nan, 2.0, 3.0]), np.arange(5.0), 1e-5)
    with pytest.raises(InvalidParameterError, match="at least 4"):
        audit_scores(np.arange(3.0), np.arange(3.0), 1e-5)
    with pytest.raises(InvalidParameterError, match="thresholds"):
        audit_scores(np.arange(10.0), np.arange(10.0), 1e-5, thresholds=[np.inf])


from hypothesis import given  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from dpcl.audit.strategies import gaussian_parameters  # noqa: E402


@given(
    params=gaussian_parameters(min_epsilon=0.05, max_epsilon=10.0, min_delta=1e-10, max_delta=0.2),
    z=st.floats(-8.0, 8.0),
    slack=st.floats(0.0, 0.2),
)
def test_rate_formula_never_exceeds_epsilon_of_a_calibrated_gaussian(params, z, slack):
    # Any threshold test on a correctly calibrated Gaussian, with its exact error rates (or rates made
    # larger, as upper confidence bounds are), gives a value <= epsilon.
    sigma = gaussian_sigma_closed_form(params.epsilon, params.delta, params.sensitivity)
    t = z * sigma
    fpr = min(1.0, norm.sf(t / sigma) * (1 + slack))
    fnr = min(1.0, norm.cdf((t - params.sensitivity) / sigma) * (1 + slack))
    assert epsilon_from_error_rates(fpr, fnr, params.delta) <= params.epsilon * (1 + 1e-9)


@given(fpr=st.floats(0.0, 1.0), fnr=st.floats(0.0, 1.0), bump=st.floats(0.0, 1.0), delta=st.floats(0.0, 0.5))
def test_rate_formula_is_monotone_in_the_rates(fpr, fnr, bump, delta):
    base = epsilon_from_error_rates(fpr, fnr, delta)
    assert epsilon_from_error_rates(min(1.0, fpr + bump), fnr, delta) <= base
    assert epsilon_from_error_rates(fpr, min(1.0, fnr + bump), delta) <= base
    assert base >= 0.0


def test_selection_part_is_capped_and_the_rest_goes_to_the_bound(monkeypatch):
    import dpcl.audit.blackbox as blackbox

    monkeypatch.setattr(blackbox, "MAX_SELECTION_TRIALS", 1000)
    s_d, s_dp = _gaussian_samplers(1.0)
    steps = []
    r = audit_sampler(s_d, s_dp, 10_000, 1e-3, seed=0, chunk_size=777, progress=steps.append)
    assert r.trials == 10_000 and r.bound_trials == 9000
    assert steps[0] == 1000 and sum(steps) == 10_000 and max(steps[1:]) == 777
    assert 0 < r.epsilon_lower_bound <= gaussian_epsilon_closed_form(1.0, 1e-3)


def test_reported_bound_is_the_clopper_pearson_kairouz_bound_recomputed_with_scipy_binomtest():
    """One fixed threshold (K = 1): the result must equal the largest of the four
    log((P_x(S)_lb - delta) / P_y(S)_ub), each one-sided exact binomial bound at alpha / 4, computed here
    with scipy.stats.binomtest (a two-sided exact interval at confidence 1 - 2a has one-sided tails a)."""
    from scipy.stats import binomtest

    rng = np.random.default_rng(11)
    n, delta, confidence, t = 40_000, 1e-3, 0.9, 1.3
    s_d, s_dp = rng.normal(0.0, 1.0, n), rng.normal(1.0, 1.0, n + 123)
    a = (1 - confidence) / 4
    k_d, k_dp = int(np.sum(s_d > t)), int(np.sum(s_dp > t))
    n_d, n_dp = s_d.size, s_dp.size

    def one_sided(k, m):
        ci = binomtest(k, m).proportion_ci(confidence_level=1 - 2 * a, method="exact")
        return ci.low, ci.high

    candidates = []
    for kx, nx, ky, ny in [(k_d, n_d, k_dp, n_dp), (k_dp, n_dp, k_d, n_d),
                           (n_d - k_d, n_d, n_dp - k_dp, n_dp), (n_dp - k_dp, n_dp, n_d - k_d, n_d)]:
        lower, upper = one_sided(kx, nx)[0], one_sided(ky, ny)[1]
        candidates.append(np.log((lower - delta) / upper) if lower > delta else -np.inf)
    expected = max(max(candidates), 0.0)
    result = audit_scores(s_d, s_dp, delta, confidence=confidence, thresholds=[t])
    assert expected > 0.5  # the pair is far apart: the bound is informative
    assert result.epsilon_lower_bound == pytest.approx(expected, rel=1e-9)
    assert result.false_positive_rate == k_d / n_d and result.false_negative_rate == (n_dp - k_dp) / n_dp
