"""The noise PeCL's training really adds to the embeddings is the noise its certificate states.

The embeddings the model receives during training are captured, the clipped
clean embedding is subtracted, and the residual is divided by the sigma the
guarantees layer gives each token's score (budget of eq. 4 at the score rounded
up to TDP's grid, sigma from :mod:`dpcl.guarantees.per_token`, which is checked
against closed forms and dp-accounting elsewhere). The standardised residual
must be N(0, 1) in every sigma group; a run whose noise is off by a factor (e.g.
the paper's C instead of 2C) is caught.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from dpcl.guarantees import per_token as pt  # noqa: E402
from dpcl.methods.pecl import tdp as tdp_module  # noqa: E402
from dpcl.methods.pecl.learner import ContinualLM, learner_config  # noqa: E402
from dpcl.methods.pecl.model import LMClassifier  # noqa: E402

pytestmark = pytest.mark.torch

TINY = {"n_layer": 1, "n_embd": 16, "n_head": 1, "max_seq_len": 24, "pretrain_steps": 2, "batch_size": 8,
        "lora_rank": 2, "epochs": 3, "clip_norm": 0.5}
PUBLIC = [f"public sentence number {i} about nothing" for i in range(16)]
TEXTS = [f"apples and pears {i}" for i in range(8)] + [f"12 Main Street {i}" for i in range(8)]
GRID = 1024  # TokenDP's default grid


def _train_and_capture(monkeypatch, calibration, sigma_factor=1.0):
    """Fit one task; returns (learner, record, scores, [(ids, model input embeddings)] of every training step)."""
    captured_scores, steps = [], []
    original_scores = ContinualLM.token_scores
    original_forward = LMClassifier.forward
    original_embed = tdp_module.TokenDP.embed_and_perturb

    def scores_spy(self, ids, mask, batch_size=64):
        out = original_scores(self, ids, mask, batch_size)
        captured_scores.append(out.detach().clone())
        return out

    def forward_spy(self, input_embeds, mask):
        if self.training:
            steps[-1].append(input_embeds.detach().clone())
        return original_forward(self, input_embeds, mask)

    def embed_spy(self, weight, token_ids, sigmas, generator=None, *, ids_checked=False):
        steps.append([token_ids.detach().clone()])
        return original_embed(self, weight, token_ids, sigmas * sigma_factor, generator, ids_checked=ids_checked)

    monkeypatch.setattr(ContinualLM, "token_scores", scores_spy)
    monkeypatch.setattr(LMClassifier, "forward", forward_spy)
    monkeypatch.setattr(tdp_module.TokenDP, "embed_and_perturb", embed_spy)
    learner = ContinualLM(2, learner_config(**TINY, calibration=calibration), seed=0, public_texts=PUBLIC)
    record = learner.fit_task(0, TEXTS, np.repeat([0, 1], 8))
    assert len(captured_scores) == 1 and len(steps) == TINY["epochs"] * 2
    assert all(len(s) == 2 for s in steps)  # one model forward per perturbed batch
    return learner, record, captured_scores[0], steps


def _reference_sigmas(scores: np.ndarray, calibration: str) -> np.ndarray:
    """sigma of each token from the guarantees layer: eq. 4 budget at the score rounded up to the grid."""
    index = np.ceil(scores.astype(np.float32) * np.float32(GRID))
    budgets = pt.token_budgets(np.clip(index, 0, GRID) / GRID, 1.0, 10.0)
    if calibration == "analytic":
        return np.asarray(pt.analytic_token_sigmas(budgets, 1e-6, TINY["clip_norm"], TINY["epochs"]))
    return np.asarray(pt.paper_token_sigmas(budgets, 1e-6, TINY["clip_norm"]))


def _standardised_residuals(learner, scores, steps, calibration):
    weight = learner.embedding.weight.detach().double().numpy()
    all_ids, _ = learner._encode(TEXTS)
    all_ids = all_ids.numpy()
    sigma_ref = _reference_sigmas(scores.numpy(), calibration)
    z, sig = [], []
    for ids, embeds in steps:
        ids = ids.numpy()
        rows = np.array([int(np.flatnonzero((all_ids == row).all(axis=1))[0]) for row in ids])
        clean = weight[ids]
        clipped = clean * np.minimum(1.0, TINY["clip_norm"] / np.linalg.norm(clean, axis=-1, keepdims=True))
        s = sigma_ref[rows]
        z.append((embeds.double().numpy() - clipped) / s[..., None])
        sig.append(np.broadcast_to(s[..., None], clipped.shape))
    return np.concatenate([a.ravel() for a in z]), np.concatenate([a.ravel() for a in sig])


def _noise_matches(z: np.ndarray, sig: np.ndarray) -> bool:
    """Mean of z^2 within 6 standard errors of 1 in the low-sigma and the high-sigma half of the tokens, mean ~ 0."""
    split = np.median(sig)
    groups = [sig <= split, sig > split] if np.any(sig > split) else [np.ones_like(sig, bool)]
    ok = abs(float(z.mean())) <= 6 / math.sqrt(z.size)
    for g in groups:
        n = int(g.sum())
        ok &= abs(float(np.mean(z[g] ** 2)) - 1.0) <= 6 * math.sqrt(2.0 / n)
    return bool(ok)


@pytest.mark.parametrize("calibration", ["analytic", "paper"])
def test_training_adds_exactly_the_certified_noise(monkeypatch, calibration):
    learner, record, scores, steps = _train_and_capture(monkeypatch, calibration)
    z, sig = _standardised_residuals(learner, scores, steps, calibration)
    assert z.size == TINY["epochs"] * 16 * TINY["max_seq_len"] * TINY["n_embd"]
    assert len(np.unique(sig)) > 2  # tokens really got different budgets
    assert _noise_matches(z, sig)
    # the certificate's worst token is the least-noised token that was released
    g = record["guarantee"]
    mask = learner._encode(TEXTS)[1].numpy().astype(bool)
    least = float(_reference_sigmas(scores.numpy(), calibration)[mask].min())
    assert g["sigma_min_used"] == pytest.approx(least, rel=1e-6)
    assert g["epsilon"] == pytest.approx(pt.true_token_epsilons(least, 1e-6, TINY["clip_norm"], TINY["epochs"]),
                                         rel=1e-6)


@pytest.mark.parametrize("factor", [0.5, 2.0])
def test_a_noise_mismatch_is_caught(monkeypatch, factor):
    """Training with sigma off by 2x (e.g. sensitivity C instead of 2C) must fail the check above."""
    learner, _, scores, steps = _train_and_capture(monkeypatch, "analytic", sigma_factor=factor)
    z, sig = _standardised_residuals(learner, scores, steps, "analytic")
    assert not _noise_matches(z, sig)
