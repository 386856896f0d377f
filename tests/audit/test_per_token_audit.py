"""assert_not_leaking on PeCL's per-token mechanism from the guarantees layer.

The mechanism is ``dpcl.guarantees.per_token.per_token_gaussian_noise`` (clip the
token embedding to norm C, add N(0, sigma_i^2 I)); the worst-case neighbouring
pair is a token replaced by its opposite, both clipped to the boundary, so the
clipped embeddings differ by exactly 2C.
"""

import numpy as np
import pytest
from audit_reference import gaussian_epsilon_closed_form

from dpcl.audit import assert_not_leaking, audit_mechanism, linear_score
from dpcl.guarantees.per_token import calibrate_tokens, per_token_gaussian_noise

DIM, CLIP, DELTA = 4, 1.0, 1e-5
TOKEN = np.array([3.0, -1.0, 2.0, 0.5])  # norm > C: clipped to the boundary
REPLACED = -TOKEN


def token_mechanism(sigma):
    def release(embedding, size, rng):
        return per_token_gaussian_noise(np.broadcast_to(embedding, (size, DIM)), sigma, CLIP, rng)

    return release


def _score():
    return linear_score(REPLACED - TOKEN)


def test_analytic_per_token_budgets_are_not_leaking():
    scores = np.array([0.0, 0.3, 0.7, 1.0])
    cal = calibrate_tokens(scores, epsilon_lower=0.5, epsilon_upper=4.0, delta=DELTA, clip_norm=CLIP)
    for eps_i, sigma_i in zip(cal.claimed_epsilons, cal.sigmas):
        # independent check of the calibration: exact epsilon at sensitivity 2C within the budget
        assert gaussian_epsilon_closed_form(sigma_i, DELTA, 2 * CLIP) <= eps_i * (1 + 1e-9)
        result = assert_not_leaking(
            token_mechanism(sigma_i), eps_i, DELTA, neighbours=(TOKEN, REPLACED), score=_score(),
            trials=200_000, seed=11,
        )
        assert 0 < result.epsilon_lower_bound <= eps_i


def test_paper_calibration_leaks_more_than_its_token_budget():
    # eq. 5 uses sensitivity C and the classic formula: at eps_i = 2 the true epsilon at 2C is ~3.5.
    cal = calibrate_tokens(np.array([0.0]), epsilon_lower=2.0, epsilon_upper=2.0, delta=DELTA, clip_norm=CLIP,
                           calibration="paper")
    sigma, claimed = float(cal.sigmas[0]), float(cal.claimed_epsilons[0])
    true_eps = gaussian_epsilon_closed_form(sigma, DELTA, 2 * CLIP)
    assert true_eps > 1.5 * claimed
    with pytest.raises(AssertionError, match="claimed epsilon 2.0000"):
        assert_not_leaking(token_mechanism(sigma), claimed, DELTA, neighbours=(TOKEN, REPLACED), score=_score(),
                           trials=1_000_000, seed=0)
    bound = audit_mechanism(token_mechanism(sigma), DELTA, neighbours=(TOKEN, REPLACED), score=_score(),
                            trials=1_000_000, seed=0).epsilon_lower_bound
    assert claimed < bound <= true_eps
