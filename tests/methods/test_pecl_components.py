"""PeCL building blocks: tokenizer, sensitivity scores, TDP noise, sculpting losses, canary exposure.

Fast (no training); references are hand computations written in the tests and
:mod:`dpcl.guarantees.per_token` checked separately against closed forms.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

torch = pytest.importorskip("torch")

from dpcl.errors import InvalidParameterError  # noqa: E402
from dpcl.guarantees import per_token as pt  # noqa: E402
from dpcl.methods.pecl.canary import canary_exposures, exposure_from_nll, insert_canaries, make_canaries  # noqa: E402
from dpcl.methods.pecl.sculpting import (  # noqa: E402
    drift_penalty,
    dynamic_lambda,
    memory_regularisation,
    unlearning_loss,
)
from dpcl.methods.pecl.sensitivity import TaskTokenStatistics, fuse_scores, sensitivity_scores  # noqa: E402
from dpcl.methods.pecl.tdp import TokenDP  # noqa: E402
from dpcl.methods.pecl.tokenizer import ByteTokenizer  # noqa: E402

pytestmark = pytest.mark.torch


# ---------------------------------------------------------------- tokenizer
def test_byte_tokenizer_layout_and_truncation():
    tok = ByteTokenizer()
    ids, mask = tok.encode_batch(["ab", "", "héllo world"], max_len=6)
    assert ids.shape == mask.shape == (3, 6)
    assert ids[0].tolist() == [256, 97, 98, 257, 258, 258]
    assert ids[1].tolist() == [256, 257, 258, 258, 258, 258]
    # truncated to 4 bytes of body, then EOS
    assert ids[2, 0] == 256 and ids[2, 5] == 257 and mask[2].sum() == 6
    assert tok.decode(ids[0]) == "ab"
    assert mask[0].tolist() == [1, 1, 1, 1, 0, 0]
    with pytest.raises(InvalidParameterError, match="max_len"):
        tok.encode_batch(["x"], max_len=1)


# ---------------------------------------------------------------- scores
@given(
    s1=st.lists(st.floats(0, 50), min_size=1, max_size=16),
    s2=st.floats(0, 5),
    alpha=st.floats(0, 1),
)
def test_fused_score_in_unit_interval_and_monotone(s1, s2, alpha):
    a = torch.tensor(s1, dtype=torch.float64)
    b = torch.full_like(a, s2)
    score = fuse_scores(a, b, alpha)
    assert bool(((score >= 0) & (score <= 1)).all())
    bigger = fuse_scores(a + 1.0, b, alpha)
    assert bool((bigger >= score - 1e-12).all())


def test_fused_score_refuses_negative_components_and_bad_alpha():
    with pytest.raises(InvalidParameterError, match="alpha"):
        fuse_scores(torch.zeros(2), torch.zeros(2), 1.5)
    with pytest.raises(InvalidParameterError, match=">= 0"):
        fuse_scores(torch.tensor([-1.0]), torch.zeros(1), 0.5)


def test_score2_table_by_hand():
    # vocabulary of 4 (id 3 is special); two tasks
    stats = TaskTokenStatistics(vocab_size=4, special_ids=(3,), tau=0.5)
    stats.add_task(np.array([[0, 0, 0, 0, 1, 3]]), np.ones((1, 6), int))  # f = [4, 1, 0]
    stats.add_task(np.array([[0, 0, 2, 2, 2, 2]]), np.ones((1, 6), int))  # f = [2, 0, 4]
    p = stats.salience()
    assert np.allclose(p[:, :3], [[1.0, 0.25, 0.0], [0.5, 0.0, 1.0]])
    assert stats.support()[:3].tolist() == [2, 0, 1]
    table = stats.score2_table()
    # N = 2: token 0 has d = 2 -> log(2/3) < 0 -> floored at 0; token 1: d = 0 -> mean(p)=0.125 * log 2;
    # token 2: d = 1 -> log(2/2) = 0
    assert table[0] == 0.0
    assert table[1] == pytest.approx(0.125 * math.log(2))
    assert table[2] == 0.0
    assert table[3] == 0.0


def test_sensitivity_scores_zero_at_bos_and_padding():
    ids = torch.tensor([[256, 1, 2, 258]])
    mask = torch.tensor([[1, 1, 1, 0]])
    nll = torch.tensor([[0.0, 2.0, 0.5, 0.0]])
    table = torch.zeros(259)
    table[2] = 1.0
    scores = sensitivity_scores(nll, ids, mask, table, alpha=0.5)
    assert scores[0, 0] == 0 and scores[0, 3] == 0
    assert scores[0, 1] == pytest.approx(1 - math.exp(-1.0))
    assert scores[0, 2] == pytest.approx(1 - math.exp(-(0.25 + 0.5)))


# ---------------------------------------------------------------- TDP
def _tdp(calibration="analytic", releases=1, grid=256):
    return TokenDP(
        epsilon_lower=1.0, epsilon_upper=10.0, delta=1e-6, clip_norm=0.5,
        calibration=calibration, releases=releases, grid=grid,
    )


def test_tdp_sigma_table_is_conservative_and_monotone():
    tdp = _tdp(grid=128)
    scores = torch.rand(8, 32, generator=torch.Generator().manual_seed(0))
    sigmas = tdp.sigmas(scores).double().numpy()
    exact = pt.analytic_token_sigmas(pt.token_budgets(scores.double().numpy(), 1.0, 10.0), 1e-6, 0.5)
    assert sigmas.shape == (8, 32)
    assert np.all(sigmas >= exact * (1 - 1e-6))  # rounding the score up never lowers the noise
    order = torch.argsort(scores.flatten())
    assert np.all(np.diff(sigmas.flatten()[order.numpy()]) >= -1e-6)


def test_tdp_noise_scale_matches_the_certificate():
    tdp = _tdp(releases=2)
    batch, seq, dim = 64, 4, 256
    scores = torch.tensor([0.0, 0.3, 0.7, 1.0]).repeat(batch, 1)
    mask = torch.ones(batch, seq, dtype=torch.long)
    emb = torch.randn(batch, seq, dim, generator=torch.Generator().manual_seed(1)) * 10
    gen = torch.Generator().manual_seed(2)
    noisy = tdp.perturb(emb, scores, mask, gen, torch.arange(batch), batch)
    clipped = emb * torch.clamp(0.5 / emb.norm(dim=-1, keepdim=True), max=1.0)
    assert torch.allclose(clipped.norm(dim=-1), torch.full((batch, seq), 0.5), atol=1e-5)
    empirical = (noisy - clipped).std(dim=(0, 2)).double().numpy()
    expected = tdp.sigmas(scores[0]).double().numpy()
    assert np.allclose(empirical, expected, rtol=0.03)
    # the certified numbers are those of the sigma actually used (worst token = score 0)
    g = tdp.released_guarantee()
    assert g["sigma_min_used"] == pytest.approx(float(expected[0]))
    assert g["epsilon"] == pytest.approx(pt.true_token_epsilons(g["sigma_min_used"], 1e-6, 0.5, releases=2))
    assert g["epsilon"] <= 10.0 * (1 + 1e-6)
    # the sequence guarantee composes the four tokens of the (single) release recorded so far
    mu = math.sqrt(np.sum((1.0 / tdp.sigmas(scores[0]).double().numpy()) ** 2))
    assert g["sequence"]["mu"] == pytest.approx(mu, rel=1e-6)


def test_tdp_paper_calibration_reports_true_epsilon_above_claim():
    tdp = _tdp("paper")
    tdp.perturb(torch.zeros(1, 2, 8), torch.tensor([[0.0, 0.5]]), torch.ones(1, 2), None, torch.arange(1), 1)
    g = tdp.released_guarantee()
    assert g["claimed_epsilon_of_worst_token"] == pytest.approx(10.0)
    assert g["epsilon"] > 10.0
    assert g["sigma_min_used"] == pytest.approx(0.5 * math.sqrt(2 * math.log(1.25e6)) / 10.0)


# ---------------------------------------------------------------- sculpting
def test_unlearning_loss_by_hand():
    scores = torch.tensor([[0.0, 0.9, 0.5, 0.8]])
    token_loss = torch.tensor([[0.0, 2.0, 3.0, 1.0]])
    mask = torch.tensor([[1, 1, 1, 1]])
    # (0.9 - 0.6) * 2 + (0.8 - 0.6) * 1 over M = 4 tokens
    assert float(unlearning_loss(scores, token_loss, mask, 0.6)) == pytest.approx((0.3 * 2 + 0.2 * 1) / 4)


def test_dynamic_lambda_and_regulariser_by_hand():
    assert dynamic_lambda(0.0, 1.0, 10.0) == 10.0
    assert dynamic_lambda(1.0, 1.0, 10.0) == 1.0
    assert dynamic_lambda(0.25, 1.0, 10.0) == pytest.approx(7.75)
    cur = [torch.tensor([1.0, 2.0]), torch.tensor([[0.5]])]
    prev = [torch.tensor([0.0, 2.0]), torch.tensor([[0.0]])]
    assert float(drift_penalty(cur, prev)) == pytest.approx(1.25)
    assert float(memory_regularisation(cur, prev, 2.0, 3.0)) == pytest.approx(7.5)


# ---------------------------------------------------------------- canaries
def test_exposure_known_answer_on_enumerated_space():
    space = 1000
    secret = 5
    # toy model: the NLL of "prefix + d" is d, so exactly 5 candidates are more likely than the canary
    candidates = np.array([d for d in range(space) if d != secret], dtype=float)
    exposure, censored = exposure_from_nll(float(secret), candidates, space)
    assert exposure == pytest.approx(math.log2(space) - math.log2(6))
    assert not censored
    best, censored = exposure_from_nll(-1.0, candidates, space)
    assert best == pytest.approx(math.log2(space)) and censored
    worst, _ = exposure_from_nll(1e9, candidates, space)
    assert worst == pytest.approx(0.0)


def test_canary_exposures_with_a_toy_model():
    canaries = make_canaries(3, seed=0, digits=3)
    assert len({c.secret for c in canaries}) == 3
    assert make_canaries(3, seed=0, digits=3) == canaries  # seeded

    def toy_nll(texts):
        return np.array([float(t[-3:]) for t in texts])  # NLL = the number itself

    results = canary_exposures(toy_nll, canaries, n_candidates=4000, seed=1)
    for c, r in zip(canaries, results):
        exact = math.log2(1000) - math.log2(1 + int(c.secret))
        assert r["exposure"] == pytest.approx(exact, abs=0.35)
    texts, labels = insert_canaries(["a", "b"], [0, 1], canaries, 2, label=1)
    assert len(texts) == 8 and labels.tolist() == [0, 1, 1, 1, 1, 1, 1, 1]


def test_exposure_over_the_scored_candidates_is_bounded_and_chance_for_a_random_rank():
    from dpcl.methods.pecl.canary import Canary, candidate_exposure, chance_candidate_exposure

    n = 100
    assert candidate_exposure(1, n) == pytest.approx(math.log2(101)) and candidate_exposure(101, n) == 0.0
    ranks = np.arange(1, n + 2)
    assert chance_candidate_exposure(n) == pytest.approx(np.mean([candidate_exposure(r, n) for r in ranks]))
    assert 1.0 < chance_candidate_exposure(n) < math.log2(math.e)  # log2 e is the limit for a large space
    with pytest.raises(InvalidParameterError):
        candidate_exposure(102, n)
    # a score that knows the secret: first among its candidates; one that ignores it: every text ties (half)
    canaries = [Canary("code ", f"{s:03d}", 3) for s in (7, 500, 993)]
    first = [canary_exposures(lambda texts, c=c: np.array([0.0 if t == c.text else 1.0 for t in texts]), [c], n, 0)[0]
             for c in canaries]
    assert all(e["candidate_rank"] == 1.0 and e["censored"] for e in first)
    assert all(e["candidate_exposure"] == pytest.approx(math.log2(101)) for e in first)
    ties = canary_exposures(lambda texts: np.zeros(len(texts)), canaries, n, 0)
    assert all(e["candidate_rank"] == 1 + n / 2 for e in ties)
    drawn = canary_exposures(lambda texts: np.array([float(t[-3:]) for t in texts]), canaries, 2000, 1)
    assert all(e["exposure"] > 0 for e in drawn)  # candidates exclude each canary's own secret


def test_tdp_epoch_recording_composes_every_epoch():
    tdp = _tdp(releases=3)
    scores = torch.tensor([[0.0, 0.2, 0.9], [0.5, 0.5, 0.0]])
    mask = torch.tensor([[1, 1, 1], [1, 1, 0]])
    for _ in range(3):
        tdp.record_epoch(scores, mask)
    sig = tdp.sigmas(scores).double().numpy()
    per_row = ((1.0 / sig) ** 2 * mask.numpy()).sum(axis=1)  # (2C / sigma)^2 with C = 0.5
    g = tdp.released_guarantee()
    assert g["sequence"]["mu"] == pytest.approx(math.sqrt(3 * per_row.max()), rel=1e-6)
    assert g["sigma_min_used"] == pytest.approx(float(sig[0, 0]))
    assert g["sequence"]["longest_sequence_tokens"] == 3
    noisy = tdp.perturb_with_sigmas(torch.zeros(2, 3, 4), tdp.sigmas(scores), torch.Generator().manual_seed(0))
    assert noisy.shape == (2, 3, 4)


def test_tdp_float32_sigma_table_never_rounds_below_the_calibrated_sigma():
    """Half of a float64 table rounds *down* to float32; the applied table must not (less noise than certified)."""
    tdp = TokenDP(epsilon_lower=1.0, epsilon_upper=10.0, delta=1e-6, clip_norm=1.0, calibration="analytic",
                  releases=4, grid=1024)
    calibrated = tdp.calibration.sigmas
    nearest = calibrated.astype(np.float32).astype(np.float64)
    assert np.any(nearest < calibrated)  # the case that matters does occur in this table
    applied = tdp.sigma_table.double().numpy()
    assert np.all(applied >= calibrated)
    assert np.all(applied - calibrated <= np.spacing(calibrated.astype(np.float32)).astype(np.float64))
    # the recorded guarantee is that of the float32 sigma actually multiplied in, and still within the budget
    low = int(np.flatnonzero(nearest < calibrated)[0])
    scores = torch.tensor([[0.0, low / 1024]])
    tdp.record_epoch(torch.tensor([[low / 1024, low / 1024]]), torch.ones(1, 2))
    g = tdp.released_guarantee()
    assert g["sigma_min_used"] == float(applied[low])
    assert g["epsilon"] == pytest.approx(pt.true_token_epsilons(float(applied[low]), 1e-6, 1.0, releases=4), rel=1e-12)
    assert g["epsilon"] <= float(tdp.calibration.true_epsilons[low])
    assert tdp.sigmas(scores)[0, 1].item() == float(applied[low])


def test_exposure_ties_take_the_mid_rank():
    """|R| = 5 enumerated, sorted NLLs 1, 5, 5, 5, 9 with the canary at 5: it shares ranks 2-4 with two
    candidates, mid-rank 3 (the mean rank when ties are broken uniformly at random)."""
    exposure, censored = exposure_from_nll(5.0, np.array([1.0, 5.0, 5.0, 9.0]), 5)
    assert exposure == pytest.approx(math.log2(5) - math.log2(3))
    assert not censored
    # a canary tied with every candidate is at the middle of R, not at rank 1
    only_ties, censored = exposure_from_nll(2.0, np.full(9, 2.0), 10)
    assert only_ties == pytest.approx(math.log2(10) - math.log2(5.5)) and not censored


def test_exposure_refuses_nan_likelihoods():
    """A NaN NLL compares false with everything and would be reported as maximal exposure."""
    with pytest.raises(InvalidParameterError, match="NaN"):
        exposure_from_nll(float("nan"), np.array([1.0, 2.0]), 10)
    with pytest.raises(InvalidParameterError, match="NaN"):
        exposure_from_nll(1.0, np.array([np.nan, 2.0]), 10)
