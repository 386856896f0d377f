"""Per-token budgets, noise calibration and sequence composition of PeCL.

References are independent of dpcl: the Balle & Wang (2018, Thm 8) privacy
profile written out below with scipy, and dp-accounting's PLD accountant.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from scipy import optimize
from scipy.stats import norm

from dpcl.errors import ConfigError, InvalidParameterError
from dpcl.guarantees import per_token as pt
import dpcl.methods.pecl.spec as pecl_spec  # noqa: E402


def reference_delta(epsilon: float, sigma: float, sensitivity: float) -> float:
    """Exact delta(epsilon) of the Gaussian mechanism (Balle & Wang 2018, Thm 8)."""
    a = sensitivity / (2.0 * sigma)
    b = epsilon * sigma / sensitivity
    return float(norm.cdf(a - b) - math.exp(epsilon + norm.logcdf(-a - b)))


def reference_epsilon(sigma: float, delta: float, sensitivity: float) -> float:
    """Smallest epsilon with reference_delta <= delta, by bisection on the closed form."""
    if reference_delta(0.0, sigma, sensitivity) <= delta:
        return 0.0
    return float(optimize.brentq(lambda e: reference_delta(e, sigma, sensitivity) - delta, 0.0, 500.0, xtol=1e-12))


def pld_delta(epsilon: float, sigma: float, sensitivity: float, count: int = 1) -> float:
    from dp_accounting.pld import privacy_loss_distribution as pld

    dist = pld.from_gaussian_mechanism(sigma, sensitivity=sensitivity, value_discretization_interval=1e-4)
    if count > 1:
        dist = dist.self_compose(count)
    return float(dist.get_delta_for_epsilon(epsilon))


# ---------------------------------------------------------------- budgets
def test_budget_endpoints_and_paper_values():
    assert pt.token_budgets(0.0, 1.0, 10.0) == pytest.approx(10.0)
    assert pt.token_budgets(1.0, 1.0, 10.0) == pytest.approx(1.0)
    # eq. 4 at Score = 0.5: 1 + 9 * 0.25
    assert pt.token_budgets(0.5, 1.0, 10.0) == pytest.approx(3.25)


@given(
    s1=st.floats(0, 1),
    s2=st.floats(0, 1),
    lower=st.floats(0.01, 5),
    width=st.floats(0, 20),
)
def test_budget_monotone_in_score_and_in_range(s1, s2, lower, width):
    upper = lower + width
    e1, e2 = pt.token_budgets(np.array([s1, s2]), lower, upper)
    if s1 <= s2:
        assert e1 >= e2 - 1e-12
    assert lower - 1e-12 <= min(e1, e2) and max(e1, e2) <= upper + 1e-12


@pytest.mark.parametrize("bad", [-0.1, 1.1, float("nan"), float("inf")])
def test_scores_outside_unit_interval_are_refused(bad):
    with pytest.raises(InvalidParameterError, match="scores"):
        pt.token_budgets(np.array([0.2, bad]), 1.0, 10.0)


def test_budget_range_must_be_ordered():
    with pytest.raises(InvalidParameterError, match="epsilon_upper"):
        pt.token_budgets(0.5, 5.0, 1.0)
    with pytest.raises(InvalidParameterError, match="epsilon_lower"):
        pt.token_budgets(0.5, 0.0, 1.0)


# ---------------------------------------------------------------- calibration
def test_sensitivity_is_two_c():
    assert pt.embedding_sensitivity(0.7) == pytest.approx(1.4)
    with pytest.raises(InvalidParameterError, match="clip_norm"):
        pt.embedding_sensitivity(-1.0)


@pytest.mark.parametrize("epsilon", [0.5, 1.0, 3.25, 10.0])
@pytest.mark.parametrize("clip_norm", [0.5, 2.0])
def test_analytic_sigma_meets_delta_at_true_sensitivity(epsilon, clip_norm):
    delta = 1e-6
    sigma = pt.analytic_token_sigmas(epsilon, delta, clip_norm)
    sens = 2 * clip_norm
    assert reference_delta(epsilon, sigma, sens) <= delta * (1 + 1e-6)
    # tight: 1% less noise breaks the budget
    assert reference_delta(epsilon, 0.99 * sigma, sens) > delta
    # dp-accounting PLD (pessimistic discretisation) agrees within its discretisation error
    assert pld_delta(epsilon, sigma, sens) <= delta * 1.05


def test_analytic_sigma_over_several_releases_matches_pld_composition():
    delta, clip_norm, releases, epsilon = 1e-5, 1.0, 3, 2.0
    sigma = pt.analytic_token_sigmas(epsilon, delta, clip_norm, releases)
    assert pld_delta(epsilon, sigma, 2 * clip_norm, count=releases) <= delta * 1.05
    assert reference_delta(epsilon, sigma / math.sqrt(releases), 2 * clip_norm) <= delta * (1 + 1e-6)


@pytest.mark.parametrize("epsilon", [1.0, 2.0, 5.0, 10.0])
def test_paper_sigma_violates_its_claimed_epsilon(epsilon):
    delta, clip_norm = 1e-6, 1.0
    sigma = pt.paper_token_sigmas(epsilon, delta, clip_norm)
    assert sigma == pytest.approx(clip_norm * math.sqrt(2 * math.log(1.25 / delta)) / epsilon)
    # at the true sensitivity 2C the claimed (eps_i, delta) does not hold ...
    assert reference_delta(epsilon, sigma, 2 * clip_norm) > delta
    # ... and the true epsilon reported by dpcl is larger than claimed, and matches the closed form
    true = pt.true_token_epsilons(sigma, delta, clip_norm)
    assert true > epsilon
    assert true == pytest.approx(reference_epsilon(sigma, delta, 2 * clip_norm), rel=1e-6)


def test_calibrate_tokens_is_vectorised_over_batch_and_sequence():
    rng = np.random.default_rng(0)
    scores = rng.uniform(size=(4, 7))
    for calibration in pt.CALIBRATIONS:
        cal = pt.calibrate_tokens(
            scores, epsilon_lower=1, epsilon_upper=10, delta=1e-6, clip_norm=1.0, calibration=calibration
        )
        assert cal.claimed_epsilons.shape == cal.sigmas.shape == cal.true_epsilons.shape == (4, 7)
        # every entry equals the scalar computation
        i, j = 2, 5
        expected_sigma = (
            pt.analytic_token_sigmas(cal.claimed_epsilons[i, j], 1e-6, 1.0)
            if calibration == "analytic"
            else pt.paper_token_sigmas(cal.claimed_epsilons[i, j], 1e-6, 1.0)
        )
        assert cal.sigmas[i, j] == pytest.approx(expected_sigma)
        if calibration == "analytic":
            assert np.all(cal.true_epsilons <= cal.claimed_epsilons * (1 + 1e-6))
        else:
            assert np.all(cal.true_epsilons > cal.claimed_epsilons)


@given(scores=st.lists(st.floats(0, 1), min_size=1, max_size=20), delta=st.sampled_from([1e-8, 1e-6, 1e-3]))
def test_analytic_calibration_round_trip(scores, delta):
    cal = pt.calibrate_tokens(np.array(scores), epsilon_lower=0.5, epsilon_upper=8, delta=delta, clip_norm=1.0)
    assert np.all(np.isfinite(cal.sigmas)) and np.all(cal.sigmas > 0)
    assert np.all(cal.true_epsilons <= cal.claimed_epsilons * (1 + 1e-6))
    # sigma never decreases with the score (more sensitive -> more noise)
    order = np.argsort(scores, kind="stable")
    assert np.all(np.diff(cal.sigmas[order]) >= -1e-9 * cal.sigmas.max())


def test_unknown_calibration_is_refused():
    with pytest.raises(InvalidParameterError, match="calibration"):
        pt.calibrate_tokens([0.5], epsilon_lower=1, epsilon_upper=2, delta=1e-6, clip_norm=1, calibration="classic")


# ---------------------------------------------------------------- mechanism
def test_per_token_noise_clips_and_scales_per_token():
    rng = np.random.default_rng(1)
    emb = rng.normal(scale=5.0, size=(3, 4, 64))
    clipped = pt.clip_embeddings(emb, 1.5)
    assert np.all(np.linalg.norm(clipped, axis=-1) <= 1.5 + 1e-12)
    small = np.full((1, 1, 64), 0.01)
    assert np.allclose(pt.clip_embeddings(small, 1.5), small)  # short vectors are untouched
    sigmas = np.array([[0.1, 1.0, 2.0, 4.0]] * 3)
    out = pt.per_token_gaussian_noise(emb, sigmas, 1.5, np.random.default_rng(2))
    assert out.shape == emb.shape
    standardised = (out - clipped) / sigmas[..., None]
    assert np.std(standardised) == pytest.approx(1.0, abs=0.05)
    per_token_std = np.std(out - clipped, axis=(0, 2))
    assert np.allclose(per_token_std, sigmas[0], rtol=0.15)


def test_per_token_noise_refuses_mismatched_sigmas():
    with pytest.raises(InvalidParameterError, match="broadcast"):
        pt.per_token_gaussian_noise(np.zeros((2, 3, 4)), np.ones(5), 1.0, np.random.default_rng(0))


# ---------------------------------------------------------------- sequences
def test_sequence_guarantee_equals_exact_composition():
    delta, clip_norm = 1e-6, 1.0
    sigmas = np.array([3.0, 5.0, 8.0, 12.0])
    eps_claimed = np.array([2.0, 1.5, 1.2, 1.0])
    seq = pt.sequence_guarantee(sigmas, eps_claimed, delta, clip_norm)
    mu = math.sqrt(np.sum((2 * clip_norm / sigmas) ** 2))
    assert seq.mu == pytest.approx(mu)
    # composition of Gaussians is one Gaussian with sensitivity mu at sigma 1
    assert seq.epsilon == pytest.approx(reference_epsilon(1.0, delta, mu), rel=1e-6)
    # dp-accounting PLD: compose the four mechanisms
    from dp_accounting.pld import privacy_loss_distribution as pld

    dist = pld.from_gaussian_mechanism(sigmas[0], sensitivity=2 * clip_norm, value_discretization_interval=1e-4)
    for s in sigmas[1:]:
        dist = dist.compose(
            pld.from_gaussian_mechanism(s, sensitivity=2 * clip_norm, value_discretization_interval=1e-4)
        )
    assert dist.get_delta_for_epsilon(seq.epsilon) <= delta * 1.05
    # Remark 1 as printed in the paper
    remark = eps_claimed.sum() + math.sqrt(2 * 4 * math.log(1 / delta)) * eps_claimed.max()
    assert seq.remark1_epsilon == pytest.approx(remark)
    assert seq.remark1_delta == pytest.approx(2 * delta)
    assert seq.remark1_true_delta == pytest.approx(reference_delta(remark, 1.0, mu), abs=1e-15)


def test_remark1_is_flagged_when_unsound():
    # paper sigmas at sensitivity 2C for a long sequence: composed true delta at Remark 1's epsilon
    delta, clip_norm, length = 1e-6, 1.0, 128
    eps = np.full(length, 10.0)
    sigmas = pt.paper_token_sigmas(eps, delta, clip_norm)
    seq = pt.sequence_guarantee(sigmas, eps, delta, clip_norm)
    assert seq.remark1_true_delta == pytest.approx(reference_delta(seq.remark1_epsilon, 1.0, seq.mu), abs=1e-15)
    assert seq.remark1_sound == (seq.remark1_true_delta <= seq.remark1_delta)
    assert seq.epsilon > 0
    if not seq.remark1_sound:
        assert any("NOT a valid bound" in n for n in seq.notes)
    # a pair that claims far less than the noise gives is caught
    bad = pt.sequence_guarantee(np.full(4, 0.1), np.full(4, 1.0), delta, clip_norm)
    assert not bad.remark1_sound
    assert bad.remark1_true_delta > bad.remark1_delta
    assert any("NOT a valid bound" in n for n in bad.notes)
    # a single token: the paper's claim (eps_i = 10 per token) is unsound at the true sensitivity
    single = pt.sequence_guarantee(sigmas[:1], eps[:1], delta, clip_norm)
    assert single.epsilon > 10.0


@given(
    sigmas=st.lists(st.floats(0.2, 50), min_size=1, max_size=30),
    extra=st.floats(0.2, 50),
)
def test_sequence_epsilon_grows_with_tokens_and_shrinks_with_noise(sigmas, extra):
    delta = 1e-6
    sig = np.array(sigmas)
    eps = np.ones_like(sig)
    base = pt.sequence_guarantee(sig, eps, delta, 1.0).epsilon
    longer = pt.sequence_guarantee(np.append(sig, extra), np.append(eps, 1.0), delta, 1.0).epsilon
    noisier = pt.sequence_guarantee(sig * 2.0, eps, delta, 1.0).epsilon
    assert np.isfinite(base)
    assert longer >= base - 1e-9
    assert noisier <= base + 1e-9


# ---------------------------------------------------------------- method spec
def test_pecl_spec_plan_uses_worst_token_at_true_sensitivity():
    from dpcl.guarantees.method_schema import get_method_spec

    spec = get_method_spec("pecl")
    assert spec is pecl_spec.PECL_SPEC
    assert all(k.help for k in spec.keys)
    method = {"training": "paper", "calibration": "analytic", "epochs": 2, "clip_norm": 0.5, "epsilon_upper": 8.0, "max_seq_len": 32}
    plan = spec.plan_task(method, {"delta": 1e-5}, n_examples=100, task_index=0)
    (event,) = plan.scoped[0].events  # the per-token statement is scoped to the input embeddings
    assert plan.events == ()
    assert event.count == 2
    assert event.event.sensitivity == pytest.approx(1.0)
    assert event.event.adjacency.value == "replace_one" and event.event.unit == "token"
    sigma = event.event.sigma
    # the worst token (score 0, budget 8) over 2 releases is (8, 1e-5)-DP and not much better
    assert reference_delta(8.0, sigma / math.sqrt(2), 1.0) <= 1e-5 * (1 + 1e-6)
    assert reference_delta(8.0, 0.99 * sigma / math.sqrt(2), 1.0) > 1e-5
    assert plan.noise["sigma_min"] == pytest.approx(sigma)
    assert pt.DATA_DEPENDENCE_ASSUMPTION in plan.assumptions
    assert "lambda_dyn" in pt.DATA_DEPENDENCE_ASSUMPTION and "Omega_k" in pt.DATA_DEPENDENCE_ASSUMPTION  # sculpting too
    assert plan.noise["per_token"]["sequence"]["length"] == 32


def test_pecl_spec_paper_calibration_reports_true_epsilon():
    plan = pecl_spec.PECL_SPEC.plan_task({"training": "paper", "calibration": "paper"}, {"delta": 1e-6}, n_examples=10, task_index=3)
    sigma = plan.scoped[0].events[0].event.sigma
    assert sigma == pytest.approx(math.sqrt(2 * math.log(1.25e6)) / 10.0)
    true_eps = plan.noise["per_token"]["epsilon"]
    assert true_eps == pytest.approx(reference_epsilon(sigma, 1e-6, 2.0), rel=1e-6)
    assert true_eps > 10.0
    assert any("true per-token epsilon" in n for n in plan.notes)


def test_pecl_spec_refuses_bad_config():
    with pytest.raises(ConfigError, match="delta"):
        pecl_spec.PECL_SPEC.plan_task({"training": "paper"}, {}, n_examples=10, task_index=0)
    with pytest.raises(ConfigError, match="epsilon_upper"):
        pecl_spec.PECL_SPEC.plan_task({"training": "paper", "epsilon_lower": 5.0, "epsilon_upper": 2.0}, {"delta": 1e-6}, 10, 0)
    keys = {k.name: k for k in pecl_spec.PECL_SPEC.keys}
    assert keys["calibration"].check("classic") is not None
    assert keys["calibration"].check("paper") is None
    assert keys["alpha"].check(1.5) is not None


@pytest.mark.parametrize(
    "method, message",
    [
        ({"lambda_min": 20.0, "lambda_max": 10.0}, r"lambda_min = 20 exceeds lambda_max = 10"),
        ({"max_seq_len": 1}, r"max_seq_len must be >= 2"),
        ({"n_embd": 64, "n_head": 3}, r"n_embd = 64 is not divisible by n_head = 3"),
    ],
)
def test_pecl_spec_refuses_keys_the_learner_would_refuse_only_at_training(method, message):
    """`dpcl audit` must refuse what `dpcl run` would refuse, before any training."""
    with pytest.raises(ConfigError, match=message):
        pecl_spec.PECL_SPEC.plan_task({"training": "paper", **method}, {"delta": 1e-6}, 10, 0)


def test_pecl_spec_n_head_is_not_checked_against_a_loaded_model():
    """With pretrained_path the model's own config decides its heads; n_embd/n_head are unused."""
    plan = pecl_spec.PECL_SPEC.plan_task({"training": "paper", "n_embd": 64, "n_head": 3, "pretrained_path": "/some/model"}, {"delta": 1e-6}, 10, 0)
    assert plan.scoped[0].events


def test_pecl_spec_budget_check_against_privacy_epsilon():
    with pytest.raises(ConfigError, match="epsilon_upper"):
        pecl_spec.PECL_SPEC.plan_task({"training": "paper", "epsilon_upper": 10.0}, {"delta": 1e-6, "epsilon": 8.0}, 10, 0)
    # the paper calibration is not refused: its true epsilon is certified and the excess is stated
    plan = pecl_spec.PECL_SPEC.plan_task({"training": "paper", "calibration": "paper"}, {"delta": 1e-6, "epsilon": 10.0}, 10, 0)
    assert any("exceeds [privacy] epsilon" in n for n in plan.notes)
    # every task gets the same data-independent plan; every release states its per-token and sequence
    # guarantee, the Remark 1 discussion is stated once, with task 0
    first = pecl_spec.PECL_SPEC.plan_task({"training": "paper"}, {"delta": 1e-6, "epsilon": 10.0}, 10, 0)
    later = pecl_spec.PECL_SPEC.plan_task({"training": "paper"}, {"delta": 1e-6, "epsilon": 10.0}, 99, 2)
    assert later.scoped == first.scoped and later.events == first.events == ()
    assert any(n.startswith("sequence-level guarantee") for n in later.notes)
    assert not any("Remark 1" in n for n in later.notes) and any("Remark 1" in n for n in first.notes)


@pytest.mark.parametrize("calibration", ["analytic", "paper"])
def test_pecl_paper_certificate_is_not_private_and_scopes_the_true_per_token_guarantee(tmp_path, calibration):
    """The paper's checkpoint is covered by no charged event: its certificate says private false with the
    plan's reasons; the per-token statement is a scoped guarantee (input embeddings), recomputed by verify."""
    from dpcl.cli import main
    from dpcl.guarantees.certificates import ScopedLedger, non_private_certificate, verify_certificate, write_certificate
    from dpcl.guarantees.ledger import TaskLedger

    method = {"training": "paper", "calibration": calibration, "epochs": 3, "max_seq_len": 16}
    privacy = {"delta": 1e-6, "epsilon": 10.0}
    scoped = TaskLedger(delta=1e-6, across_tasks="parallel", adjacency="replace_one", unit="token")
    for t in range(3):
        plan = pecl_spec.PECL_SPEC.plan_task(method, privacy, n_examples=20, task_index=t)
        assert plan.events == () and not plan.release.covered
        (statement,) = plan.scoped
        scoped.charge(t, statement.events, unit_ids=np.arange(20) + 100 * t, label=f"pecl task {t}")
        scoped.release(t)
    checkpoint = tmp_path / "task003.pt"
    checkpoint.write_bytes(b"weights")
    first = pecl_spec.PECL_SPEC.plan_task(method, privacy, 20, 0)
    cert = non_private_certificate(
        release_task=2, method="pecl", label_space="prior", assumptions=list(first.assumptions),
        reasons=first.release.reasons, checkpoint=checkpoint, extra={"plan_notes": list(first.notes)},
        scoped={statement.name: ScopedLedger(statement.scope, scoped)},
    )
    path = write_certificate(tmp_path / "task003.cert.json", cert)
    assert verify_certificate(path).raise_if_invalid().private is False
    assert main(["verify", str(path)]) == 0
    assert cert["guarantee"]["private"] is False and cert["guarantee"]["epsilon"] is None
    assert cert["guarantee"]["reasons"] == list(pecl_spec.PAPER_RELEASE.reasons)
    (entry,) = cert["scoped_guarantees"]
    assert entry["name"] == pt.INPUT_EMBEDDINGS_SCOPE_NAME and entry["scope"] == pt.INPUT_EMBEDDINGS_SCOPE
    sigma = first.noise["sigma_min"]
    # parallel over tasks (disjoint fortunes): the worst token over 3 perturbations, at sensitivity 2C
    assert entry["epsilon"] == pytest.approx(reference_epsilon(sigma / math.sqrt(3), 1e-6, 2.0), rel=1e-6)
    assert entry["unit"] == "token" and entry["adjacency"] == "replace_one"
    assert pt.DATA_DEPENDENCE_ASSUMPTION in cert["assumptions"]
    if calibration == "paper":
        assert entry["epsilon"] > 10.0
    else:
        assert entry["epsilon"] <= 10.0 * (1 + 1e-6)
    # a certificate whose stated scoped epsilon is lowered no longer verifies
    entry["epsilon"] = entry["epsilon"] * 0.5
    bad = write_certificate(tmp_path / "bad.cert.json", cert)
    assert main(["verify", str(bad)]) == 3
