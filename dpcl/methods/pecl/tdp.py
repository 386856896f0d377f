"""Token-level dynamic DP (TDP): clipped token embeddings + per-token Gaussian noise.

Eq. 5 of ``000_*`` / eq. 7 of ``002_*``: ``clip(e_i, C) + N(0, sigma_i^2 I)``,
for a whole ``[batch, seq, d]`` tensor in one pass. The sigma_i come from
:mod:`dpcl.guarantees.per_token` (analytic calibration at the true sensitivity
2C, or the paper's formula with its true epsilon). Calibrating a root finder for
every token of every batch would dominate the step, so sigma is tabulated once
on a score grid of ``grid`` steps and a token's score is rounded **up** to the
grid: a higher score means a smaller budget and more noise, so every token gets
at least the noise its own eps_i asks for (its true epsilon is at most the
grid's, which the certificate reports). The table is stored in float32 with
every entry rounded up, never down, from the calibrated float64 sigma.

Every token is perturbed, including score-0 tokens (which the paper leaves
noise-free: that would be epsilon = infinity for them).
"""

from __future__ import annotations

import numpy as np
import torch

from dpcl.accounting.gaussian import gdp_epsilon
from dpcl.guarantees.per_token import calibrate_tokens, embedding_sensitivity, true_token_epsilons
from dpcl.methods.pecl import tdp_triton


def torch_perturb_with_sigmas(
    embeddings: torch.Tensor, sigmas: torch.Tensor, clip_norm: float, generator: torch.Generator | None = None
) -> torch.Tensor:
    """``clip(e, C) + N(0, sigma^2 I)`` in plain torch ops (any device): the path off CUDA/triton."""
    sigma = sigmas.to(embeddings.dtype).unsqueeze(-1)
    scale = torch.clamp(clip_norm / torch.linalg.vector_norm(embeddings, dim=-1, keepdim=True).clamp_min(1e-12),
                        max=1.0)
    out = torch.randn(embeddings.shape, generator=generator, device=embeddings.device, dtype=embeddings.dtype)
    return out.mul_(sigma).addcmul_(embeddings, scale)  # N(0, sigma^2) + clip(e, C), in place


def float32_at_least(values: np.ndarray) -> np.ndarray:
    """``values`` as float32 numbers that are each ``>=`` the float64 input (returned as float64).

    Plain float32 conversion rounds to nearest, i.e. below the input for about
    half of the entries; a noise scale below the calibrated one would give a
    (slightly) larger epsilon than the certificate states.
    """
    exact = np.asarray(values, dtype=np.float64)
    single = exact.astype(np.float32)
    low = single.astype(np.float64) < exact
    single[low] = np.nextafter(single[low], np.float32(np.inf))
    return single.astype(np.float64)


class TokenDP:
    """The TDP mechanism of one task, and the bookkeeping of what it released."""

    def __init__(
        self,
        *,
        epsilon_lower: float,
        epsilon_upper: float,
        delta: float,
        clip_norm: float,
        calibration: str,
        releases: int,
        grid: int = 1024,
        device: str | torch.device = "cpu",
    ) -> None:
        self.grid = int(grid)
        self.clip_norm = float(clip_norm)
        self.delta = float(delta)
        self.releases = int(releases)
        self.calibration = calibrate_tokens(
            np.linspace(0.0, 1.0, self.grid + 1),
            epsilon_lower=epsilon_lower,
            epsilon_upper=epsilon_upper,
            delta=delta,
            clip_norm=clip_norm,
            calibration=calibration,
            releases=releases,
        )
        #: the sigmas the noise step really uses: the float32 table, each entry rounded *up* to the next
        #: float32 where plain rounding would go below the calibrated float64 sigma (never less noise than
        #: calibrated); the recorded releases and their guarantee use these values.
        self.applied_sigmas = float32_at_least(self.calibration.sigmas)
        self.sigma_table = torch.as_tensor(self.applied_sigmas, dtype=torch.float32, device=device)
        self._mu_sq_table = torch.as_tensor(
            (embedding_sensitivity(clip_norm) / self.applied_sigmas) ** 2, dtype=torch.float64, device=device
        )
        #: smallest grid index any released token used (worst token) and worst sequence mu^2 so far.
        self.min_index_used: int | None = None
        self.sequence_mu_sq: torch.Tensor | None = None
        self.longest_sequence = 0

    def grid_index(self, scores: torch.Tensor) -> torch.Tensor:
        return torch.ceil(scores.clamp(0.0, 1.0) * self.grid).long().clamp_(0, self.grid)

    def sigmas(self, scores: torch.Tensor) -> torch.Tensor:
        """sigma_i for every token, ``[B, L]``."""
        return self.sigma_table[self.grid_index(scores)]

    def perturb(
        self,
        embeddings: torch.Tensor,
        scores: torch.Tensor,
        mask: torch.Tensor,
        generator: torch.Generator | None = None,
        example_index: torch.Tensor | None = None,
        n_examples: int | None = None,
    ) -> torch.Tensor:
        """``clip(e, C) + N(0, sigma^2 I)`` for every token; records the release when indices are given."""
        index = self.grid_index(scores)
        out = self.perturb_with_sigmas(embeddings, self.sigma_table[index], generator)
        if example_index is not None:
            self._record(index, mask, example_index, n_examples)
        return out

    def perturb_with_sigmas(
        self, embeddings: torch.Tensor, sigmas: torch.Tensor, generator: torch.Generator | None = None
    ) -> torch.Tensor:
        """The noise step alone, with per-token ``sigmas [B, L]`` looked up beforehand (:meth:`sigmas`).

        Scores are fixed for a task, so training looks the sigmas up once per
        task and records the releases with :meth:`record_epoch`. On CUDA with
        triton installed the step runs as one fused kernel
        (:func:`dpcl.methods.pecl.tdp_triton.perturb_rows`, same mechanism,
        noise keyed from ``generator``); elsewhere it is the torch code below.
        """
        if tdp_triton.supports(embeddings):
            return tdp_triton.perturb_rows(embeddings, sigmas, self.clip_norm, generator)
        return torch_perturb_with_sigmas(embeddings, sigmas, self.clip_norm, generator)

    def embed_and_perturb(
        self, weight: torch.Tensor, token_ids: torch.Tensor, sigmas: torch.Tensor,
        generator: torch.Generator | None = None, *, ids_checked: bool = False,
    ) -> torch.Tensor:
        """Embedding lookup ``weight[token_ids]`` followed by :meth:`perturb_with_sigmas`.

        On CUDA with triton the gather is fused into the TDP kernel
        (:func:`dpcl.methods.pecl.tdp_triton.embed_and_perturb`); elsewhere it is
        ``torch.nn.functional.embedding`` and the torch step.
        """
        if tdp_triton.supports(weight) and token_ids.device == weight.device:
            return tdp_triton.embed_and_perturb(weight, token_ids, sigmas, self.clip_norm, generator,
                                                ids_checked=ids_checked)
        return self.perturb_with_sigmas(torch.nn.functional.embedding(token_ids, weight), sigmas, generator)

    @torch.no_grad()
    def record_epoch(self, scores: torch.Tensor, mask: torch.Tensor) -> None:
        """Record one perturbation of every token of a task's ``[n, L]`` sequences (one epoch)."""
        n = scores.shape[0]
        self._record(self.grid_index(scores), mask, torch.arange(n, device=scores.device), n)

    @torch.no_grad()
    def _record(self, index: torch.Tensor, mask: torch.Tensor, example_index: torch.Tensor, n_examples: int | None) -> None:
        valid = mask.bool()
        used = index[valid]
        if used.numel():
            lowest = int(used.min())
            self.min_index_used = lowest if self.min_index_used is None else min(self.min_index_used, lowest)
        mu_sq = (self._mu_sq_table[index] * valid.to(torch.float64)).sum(dim=1)
        if self.sequence_mu_sq is None:
            self.sequence_mu_sq = torch.zeros(int(n_examples), dtype=torch.float64, device=mu_sq.device)
        self.sequence_mu_sq.index_add_(0, example_index.to(mu_sq.device), mu_sq)
        self.longest_sequence = max(self.longest_sequence, int(valid.sum(dim=1).max()))

    def released_guarantee(self) -> dict:
        """What this task's releases guarantee: worst token and worst (longest, least noised) sequence.

        The token guarantee is the true epsilon (exact Gaussian profile at 2C,
        over ``releases`` perturbations) of the smallest sigma actually used (the
        float32 value the noise step multiplies by); the
        sequence guarantee composes exactly every perturbation of the worst
        sequence's tokens over all epochs (GDP, mu^2 summed).
        """
        cal = self.calibration
        idx = 0 if self.min_index_used is None else self.min_index_used
        sigma_used = float(self.applied_sigmas[idx])
        out = {
            "unit": "token",
            "adjacency": "replace_one",
            "calibration": cal.calibration,
            "sensitivity": cal.sensitivity,
            "delta": self.delta,
            "releases_per_token": self.releases,
            "sigma_min_used": sigma_used,
            "claimed_epsilon_of_worst_token": float(cal.claimed_epsilons[idx]),
            "epsilon": float(true_token_epsilons(sigma_used, self.delta, self.clip_norm, self.releases)),
        }
        if self.sequence_mu_sq is not None:
            worst_mu = float(torch.sqrt(self.sequence_mu_sq.max()))
            out["sequence"] = {
                "unit": "sequence",
                "longest_sequence_tokens": self.longest_sequence,
                "mu": worst_mu,
                "epsilon": float(gdp_epsilon(worst_mu, self.delta)),
                "delta": self.delta,
                "accountant": "exact Gaussian composition (GDP) over all tokens and epochs",
            }
        return out
