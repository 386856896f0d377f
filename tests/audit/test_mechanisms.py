import numpy as np
import pytest
from audit_reference import (
    classic_gaussian_sigma_closed_form,
    gaussian_epsilon_closed_form,
    gaussian_sigma_closed_form,
)

from dpcl.audit.mechanisms import (
    GaussianMechanism,
    LaplaceMechanism,
    assert_not_leaking,
    audit_gaussian,
    audit_laplace,
    audit_mechanism,
)
from dpcl.errors import InvalidParameterError


@pytest.mark.parametrize("epsilon, delta, sensitivity", [(0.3, 1e-6, 1.0), (1.0, 1e-5, 2.5), (4.0, 1e-3, 0.1)])
def test_calibrated_gaussian_uses_the_accounting_sigma(epsilon, delta, sensitivity):
    m = GaussianMechanism.calibrated(epsilon, delta, sensitivity)
    assert m.sigma == pytest.approx(gaussian_sigma_closed_form(epsilon, delta, sensitivity), rel=1e-7)
    assert m.epsilon(delta) == pytest.approx(gaussian_epsilon_closed_form(m.sigma, delta, sensitivity), rel=1e-7)


@pytest.mark.parametrize("epsilon, delta, sensitivity", [(0.5, 1e-5, 1.0), (1.0, 1e-6, 3.0), (3.0, 1e-4, 0.2)])
def test_calibrated_gaussian_passes_across_seeds(epsilon, delta, sensitivity):
    m = GaussianMechanism.calibrated(epsilon, delta, sensitivity)
    for seed in range(15):
        r = assert_not_leaking(m, epsilon, delta, trials=100_000, seed=seed)
        assert 0.0 <= r.epsilon_lower_bound <= epsilon


@pytest.mark.parametrize("epsilon", [0.5, 1.0, 3.0])
def test_calibrated_laplace_passes_across_seeds_and_gets_close(epsilon):
    # Laplace is audited tightly (its likelihood ratio equals e^eps on whole tails), so the bound sits
    # just below epsilon; at confidence 1 - alpha it may exceed it in at most a fraction alpha of seeds.
    # At 0.999 no seed here does.
    m = LaplaceMechanism.calibrated(epsilon, sensitivity=2.0)
    assert m.scale == pytest.approx(2.0 / epsilon)
    bounds = [
        assert_not_leaking(m, epsilon, 0.0, trials=100_000, seed=s, confidence=0.999).epsilon_lower_bound
        for s in range(15)
    ]
    assert max(bounds) <= epsilon
    assert np.mean(bounds) > 0.8 * epsilon


def test_coverage_on_a_tight_audit_is_at_least_the_confidence():
    # The statement "eps_hat <= eps with probability >= confidence" checked as a frequency over seeds,
    # on the tight Laplace case (exceedances are possible here, unlike for the Gaussian).
    epsilon, confidence, seeds = 3.0, 0.9, 100
    m = LaplaceMechanism.calibrated(epsilon, sensitivity=1.0)
    bounds = np.array([audit_mechanism(m, 0.0, trials=20_000, seed=s, confidence=confidence).epsilon_lower_bound
                       for s in range(seeds)])
    # binomial(100, 0.1) exceeds 22 with probability < 3e-3
    assert np.sum(bounds > epsilon) <= 22


def test_gaussian_at_half_the_sensitivity_is_caught():
    epsilon, delta = 1.0, 1e-5
    wrong = GaussianMechanism(gaussian_sigma_closed_form(epsilon, delta, sensitivity=0.5), sensitivity=1.0)
    with pytest.raises(AssertionError, match=r"lower bound .* > claimed epsilon 1\.0000"):
        assert_not_leaking(wrong, epsilon, delta, trials=1_000_000, seed=0)


def test_laplace_with_half_the_scale_is_caught():
    m = LaplaceMechanism(scale=0.5, sensitivity=1.0)  # true eps = 2
    with pytest.raises(AssertionError, match="claimed epsilon 1.0000"):
        assert_not_leaking(m, 1.0, 0.0, trials=100_000, seed=1)


def test_classic_formula_at_large_epsilon_and_delta_is_caught():
    # eps = 8, delta = 0.1: the classic sigma is outside its proven range (eps < 1) and its exact epsilon
    # at delta = 0.1 is ~10.05 (computed below from the closed-form profile).
    epsilon, delta = 8.0, 0.1
    sigma = classic_gaussian_sigma_closed_form(epsilon, delta)
    true_eps = gaussian_epsilon_closed_form(sigma, delta)
    assert true_eps > 10.0
    r = audit_gaussian(sigma, 1.0, delta, trials=1_000_000, seed=0)
    assert epsilon < r.epsilon_lower_bound <= true_eps


@pytest.mark.thorough
@pytest.mark.parametrize("epsilon, delta", [(8.0, 0.1), (8.0, 0.05)])
def test_thorough_classic_formula_flagged_at_1e7_trials_across_seeds(epsilon, delta):
    sigma = classic_gaussian_sigma_closed_form(epsilon, delta)
    true_eps = gaussian_epsilon_closed_form(sigma, delta)
    for seed in range(10):
        r = audit_gaussian(sigma, 1.0, delta, trials=10_000_000, seed=seed)
        assert epsilon < r.epsilon_lower_bound <= true_eps


@pytest.mark.thorough
@pytest.mark.parametrize("epsilon, delta", [(0.5, 1e-5), (1.0, 1e-6), (4.0, 1e-3)])
def test_thorough_calibrated_gaussian_never_flagged_over_many_seeds(epsilon, delta):
    # At small delta the Gaussian's worst case lies in tails of probability ~delta that 10^6 trials
    # cannot resolve, so the bound stays clearly below epsilon and no seed exceeds it.
    m = GaussianMechanism.calibrated(epsilon, delta)
    bounds = [audit_mechanism(m, delta, trials=1_000_000, seed=s).epsilon_lower_bound for s in range(200)]
    assert max(bounds) <= epsilon


@pytest.mark.thorough
@pytest.mark.parametrize(
    "mechanism, epsilon, delta",
    [(LaplaceMechanism(1 / 3.0), 3.0, 0.0), (GaussianMechanism(1.0), None, 0.05)],
    ids=["laplace-eps3", "gaussian-delta0.05"],
)
def test_thorough_coverage_on_tight_cases(mechanism, epsilon, delta):
    # Where the audit is nearly tight (Laplace; Gaussian at large delta) the bound may exceed epsilon,
    # but in at most a fraction 1 - confidence of seeds.
    eps = epsilon if epsilon is not None else gaussian_epsilon_closed_form(mechanism.sigma, delta)
    bounds = np.array([audit_mechanism(mechanism, delta, trials=100_000, seed=s, confidence=0.95).epsilon_lower_bound
                       for s in range(1000)])
    assert np.mean(bounds) > 0.9 * eps  # the case is tight
    # binomial(1000, 0.05) exceeds 75 with probability < 2e-4
    assert np.sum(bounds > eps) <= 75


def test_classic_formula_at_eps_8_delta_1e5_is_not_a_violation():
    # The classic sigma at (8, 1e-5) happens to be (7.91, 1e-5)-DP: no audit may flag it.
    sigma = classic_gaussian_sigma_closed_form(8.0, 1e-5)
    assert gaussian_epsilon_closed_form(sigma, 1e-5) < 8.0
    assert audit_gaussian(sigma, 1.0, 1e-5, trials=1_000_000, seed=0).epsilon_lower_bound <= 8.0


def test_plain_function_mechanism_and_explicit_neighbours():
    def randomised_response(bit, size, rng):  # eps = log 3
        flip = rng.random(size) < 0.25
        return np.where(flip, 1 - bit, bit).astype(float)

    r = audit_mechanism(randomised_response, 0.0, neighbours=(0, 1), trials=200_000)
    assert 0.9 < r.epsilon_lower_bound <= np.log(3)
    with pytest.raises(AssertionError):
        assert_not_leaking(randomised_response, 0.5, 0.0, neighbours=(0, 1), trials=200_000)
    with pytest.raises(InvalidParameterError, match="neighbours"):
        audit_mechanism(randomised_response, 0.0, trials=1000)


def test_laplace_epsilon_checks_delta_and_overflows_to_inf_quietly():
    import warnings

    assert LaplaceMechanism(0.5, 1.0).epsilon(0.3) == 2.0
    with pytest.raises(InvalidParameterError, match="delta"):
        LaplaceMechanism(0.5, 1.0).epsilon(1.5)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert LaplaceMechanism(1e-310, 1e10).epsilon() == np.inf


def test_gaussian_epsilon_is_inf_not_nan_when_sensitivity_over_sigma_overflows():
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for delta in (1e-5, 0.5, 0.9):
            assert GaussianMechanism(1e-300, 1e300).epsilon(delta) == np.inf
    with pytest.raises(InvalidParameterError, match="delta"):
        GaussianMechanism(1e-300, 1e300).epsilon(1.0)


@pytest.mark.parametrize(
    "call, word",
    [
        (lambda: GaussianMechanism(0.0), "sigma"),
        (lambda: GaussianMechanism(1.0, sensitivity=float("inf")), "sensitivity"),
        (lambda: LaplaceMechanism(-1.0), "scale"),
        (lambda: assert_not_leaking(GaussianMechanism(1.0), 0.0, 1e-5), "claimed_epsilon"),
        (lambda: assert_not_leaking(GaussianMechanism(1.0), 1.0, 1.5), "delta"),
        (lambda: audit_laplace(1.0, 1.0, 0.0, trials=3), "trials"),
        (lambda: audit_mechanism(object(), 1e-5, neighbours=(0, 1), trials=100), "mechanism"),
    ],
)
def test_invalid_input_is_refused(call, word):
    with pytest.raises(InvalidParameterError, match=word):
        call()
