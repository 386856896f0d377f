"""Token sensitivity scores of PeCL (eq. 1-3 of ``000_*``; eq. 1-5 of ``002_*``).

``Score(t_i) = 1 - exp(-(alpha * Score_1(t_i) + (1 - alpha) * Score_2(t_i)))`` fuses

* ``Score_1(t_i) = -log P_theta(t_i | t_<i)`` (eq. 2), the model's surprise at the
  token -- computed here from the language-model head for a whole
  ``[batch, seq]`` array at once;
* ``Score_2(t_i) = (1/N) sum_n p_n(t_i) log(N / (1 + d(t_i)))`` (eq. 3), with
  ``p_n(t) = f_n(t) / f_n^max`` (eq. 4 of 002) the within-task salience and
  ``d(t) = |{n : p_n(t) >= tau}|`` (eq. 5 of 002) the number of tasks in which
  the token is salient -- a lookup table over the vocabulary built with
  ``np.bincount``.

Two points where the paper is underspecified or inconsistent, and what we do:

* eq. 3 sums over *all* N tasks of the stream, i.e. over future tasks' data,
  which a continual learner does not have. We use the tasks seen so far
  (``N = k`` at task ``k``, the current task included).
* ``log(N / (1 + d))`` is negative when ``d = N`` (a token salient in every
  task), which makes Score_2 < 0 and breaks Lemma 2 (Score in [0, 1]) and
  Corollary 1 (eps_i <= eps_upper). We use ``max(0, log(N / (1 + d)))``: such a
  token is simply not discriminative. This is stated in docs/pecl.md.

Both components are computed from the private text; see
:data:`dpcl.guarantees.per_token.DATA_DEPENDENCE_ASSUMPTION`.
"""

from __future__ import annotations

import numpy as np
import torch

from dpcl.errors import InvalidParameterError


def fuse_scores(score1: torch.Tensor, score2: torch.Tensor, alpha: float) -> torch.Tensor:
    """Eq. 1: ``1 - exp(-(alpha s1 + (1 - alpha) s2))`` in [0, 1) for non-negative inputs."""
    if not 0.0 <= alpha <= 1.0:
        raise InvalidParameterError(f"alpha must lie in [0, 1], got {alpha!r}.")
    if bool((score1 < 0).any()) or bool((score2 < 0).any()):
        raise InvalidParameterError("Score_1 and Score_2 must be >= 0 (PeCL Lemma 2).")
    return -torch.expm1(-(alpha * score1 + (1.0 - alpha) * score2))


class TaskTokenStatistics:
    """Per-task token counts ``f_n(t)`` and the Score_2 lookup table over the vocabulary."""

    def __init__(self, vocab_size: int, special_ids: tuple[int, ...], tau: float = 0.2) -> None:
        if not 0.0 < tau < 1.0:
            raise InvalidParameterError(f"tau must lie in (0, 1), got {tau!r}.")
        self.vocab_size = int(vocab_size)
        self.special_ids = tuple(int(i) for i in special_ids)
        self.tau = float(tau)
        self.counts = np.zeros((0, self.vocab_size), dtype=np.int64)

    def add_task(self, ids: np.ndarray, mask: np.ndarray) -> None:
        """Count the tokens of one task (padding and special tokens excluded)."""
        flat = np.asarray(ids)[np.asarray(mask).astype(bool)]
        counts = np.bincount(flat.ravel(), minlength=self.vocab_size)[: self.vocab_size]
        counts[list(self.special_ids)] = 0
        self.counts = np.vstack([self.counts, counts[None, :]])

    @property
    def n_tasks(self) -> int:
        return int(self.counts.shape[0])

    def salience(self) -> np.ndarray:
        """``p_n(t) = f_n(t) / f_n^max`` -> ``[N, V]`` (0 for an empty task)."""
        peak = self.counts.max(axis=1, keepdims=True)
        return np.where(peak > 0, self.counts / np.maximum(peak, 1), 0.0)

    def support(self) -> np.ndarray:
        """``d(t) = |{n : p_n(t) >= tau}|`` -> ``[V]``."""
        return (self.salience() >= self.tau).sum(axis=0)

    def score2_table(self) -> np.ndarray:
        """Score_2 of every vocabulary entry (eq. 3, log factor floored at 0) -> ``[V]``."""
        n = self.n_tasks
        if n == 0:
            raise InvalidParameterError("Score_2 needs at least one task's token counts; call add_task first.")
        p = self.salience()
        log_factor = np.maximum(0.0, np.log(n / (1.0 + self.support())))
        return p.mean(axis=0) * log_factor


@torch.no_grad()
def sensitivity_scores(
    per_token_nll: torch.Tensor,
    ids: torch.Tensor,
    mask: torch.Tensor,
    score2_table: torch.Tensor,
    alpha: float,
) -> torch.Tensor:
    """Fused Score for every token of a ``[B, L]`` batch; 0 at BOS and padding.

    ``per_token_nll`` is Score_1 (:func:`dpcl.methods.pecl.model.per_token_lm_loss`
    on clean embeddings), ``score2_table`` the ``[V]`` output of
    :meth:`TaskTokenStatistics.score2_table` on the same device.
    """
    s2 = score2_table[ids]
    score = fuse_scores(per_token_nll.clamp_min(0.0), s2, alpha)
    valid = mask.bool().clone()
    valid[:, 0] = False
    return torch.where(valid, score, torch.zeros_like(score))
