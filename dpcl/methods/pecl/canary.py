"""Canary exposure (Carlini et al. 2019, *The Secret Sharer*, Sec. 4).

A canary is a synthetic secret ``prefix + s`` with ``s`` drawn uniformly from a
randomness space R (here: ``digits``-digit numbers, |R| = 10^digits); the
prefix names a fake person generated with ``faker`` (seeded), so nothing real is
inserted. After training on text that contains the canary, its *rank* is its
position when every candidate ``prefix + r`` is sorted by the model's
log-perplexity (total negative log-likelihood), and

    exposure = log2 |R| - log2 rank                                  (Def. 4 of Carlini et al.)

Scoring all of R is too costly, so -- as Carlini et al. do for large spaces --
the rank is estimated from ``n`` candidates drawn uniformly from ``R`` minus the
canary: with ``k`` of them more likely than the canary (ties count half), the
estimated rank is ``1 + (|R| - 1) k / n``, exact when the candidates enumerate
``R`` minus the canary. When no candidate beats the canary the estimate is rank
1 (exposure ``log2 |R|``), reported as *censored*: the sample only shows that
the true rank is small compared with ``|R| / n``. Beside it, the exposure over
the scored set itself (:func:`candidate_exposure`, at most ``log2(n + 1)``) is
bounded by what the sample resolves; tables average that one.

A causal LM ranks by the text's NLL. An encoder has no likelihood of a text: it
ranks by its classification loss ``-log p(label | text)`` under the label the
canary was trained with (:meth:`dpcl.methods.pecl.learner.ContinualLM.label_nll`),
the analogue for a model that only classifies: a memorised (canary, label) pair
shows as a lower loss of the true secret than of the same prefix with another.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Sequence

import numpy as np

from dpcl.errors import InvalidParameterError


@dataclass(frozen=True)
class Canary:
    prefix: str
    secret: str
    digits: int

    @property
    def text(self) -> str:
        return f"{self.prefix}{self.secret}"

    @property
    def space_size(self) -> int:
        return 10**self.digits


def make_canaries(n: int, seed: int, digits: int = 6) -> list[Canary]:
    """``n`` canaries "The secret code of <fake name> is <digits digits>", seeded (faker + numpy)."""
    if n < 1 or digits < 1:
        raise InvalidParameterError(f"n and digits must be >= 1, got n={n}, digits={digits}.")
    from faker import Faker

    fake = Faker()
    fake.seed_instance(seed)
    rng = np.random.default_rng(seed)
    secrets = rng.integers(0, 10**digits, size=n)
    return [
        Canary(prefix=f"The secret code of {fake.name()} is ", secret=f"{int(s):0{digits}d}", digits=digits)
        for s in secrets
    ]


def insert_canaries(
    texts: Sequence[str], labels: Sequence[int], canaries: Sequence[Canary], repeats: int, label: int
) -> tuple[list[str], np.ndarray]:
    """Training texts with every canary appended ``repeats`` times (labelled ``label``)."""
    if repeats < 1:
        raise InvalidParameterError(f"repeats must be >= 1, got {repeats}.")
    extra = [c.text for c in canaries for _ in range(repeats)]
    return list(texts) + extra, np.concatenate([np.asarray(labels, dtype=np.int64), np.full(len(extra), label)])


def exposure_from_nll(canary_nll: float, candidate_nll: np.ndarray, space_size: int) -> tuple[float, bool]:
    """Estimated exposure of a canary from its NLL and those of uniform candidates; returns (exposure, censored).

    rank = 1 + (|R| - 1) * (#{candidates with smaller NLL} + 0.5 #{ties}) / n_candidates.
    """
    cand = np.asarray(candidate_nll, dtype=np.float64).ravel()
    if cand.size == 0:
        raise InvalidParameterError("need at least one candidate to estimate a rank.")
    if space_size < 2:
        raise InvalidParameterError(f"space_size must be >= 2, got {space_size}.")
    if math.isnan(canary_nll) or bool(np.isnan(cand).any()):
        # NaN compares false with everything: the canary would count as beating every candidate
        raise InvalidParameterError("canary_nll and candidate_nll must not be NaN (the model's NLL is undefined).")
    better, exposure = _exposures(np.array([canary_nll], dtype=np.float64), cand[None, :],
                                  np.array([space_size], dtype=np.int64))
    return float(exposure[0]), bool(better[0] == 0)


def _exposures(own: np.ndarray, candidates: np.ndarray, spaces: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per canary (rows): the candidates with a lower score (ties count half) and the estimated exposure."""
    better = (candidates < own[:, None]).sum(1) + 0.5 * (candidates == own[:, None]).sum(1)
    rank = np.minimum(1.0 + (spaces - 1) * better / candidates.shape[1], spaces.astype(np.float64))
    return better, np.log2(spaces.astype(np.float64)) - np.log2(rank)


def canary_exposures(
    nll: Callable[[Sequence[str]], np.ndarray],
    canaries: Sequence[Canary],
    n_candidates: int,
    seed: int,
) -> list[dict]:
    """Exposure of each canary under a model given by ``nll(texts) -> score per text`` (lower = more likely).

    The score is the total NLL of a text under a causal LM, or an encoder's classification loss of the text under
    the canary's training label (:meth:`dpcl.methods.pecl.learner.ContinualLM.label_nll`). Each canary gets
    ``n_candidates`` secrets drawn uniformly from its space minus its own secret; every canary and candidate is
    scored in one call and the ranks are counted on the ``[canaries, candidates]`` array.
    """
    if not canaries:
        return []
    if n_candidates < 1:
        raise InvalidParameterError(f"n_candidates must be >= 1, got {n_candidates}.")
    spaces = np.array([c.space_size for c in canaries], dtype=np.int64)
    if (spaces < 2).any():
        raise InvalidParameterError(f"every canary's space must hold >= 2 secrets, got sizes {spaces.tolist()}.")
    secrets = np.array([int(c.secret) for c in canaries], dtype=np.int64)
    rng = np.random.default_rng(seed)
    draws = (rng.random((len(canaries), n_candidates)) * (spaces - 1)[:, None]).astype(np.int64)
    draws += draws >= secrets[:, None]  # uniform over the space minus the canary's own secret
    texts = [c.text for c in canaries] + [
        f"{c.prefix}{int(d):0{c.digits}d}" for c, row in zip(canaries, draws) for d in row
    ]
    scores = np.asarray(nll(texts), dtype=np.float64).ravel()
    if scores.shape != (len(texts),):
        raise InvalidParameterError(f"nll returned {scores.shape[0]} scores for {len(texts)} texts.")
    if np.isnan(scores).any():
        raise InvalidParameterError("canary and candidate scores must not be NaN (the model's loss is undefined).")
    better, exposure = _exposures(scores[: len(canaries)], scores[len(canaries) :].reshape(len(canaries), n_candidates),
                                  spaces)
    return [
        {"secret": c.secret, "exposure": float(e), "censored": bool(b == 0), "max_exposure": math.log2(c.space_size),
         "candidate_rank": float(1.0 + b), "candidate_exposure": candidate_exposure(1.0 + b, n_candidates)}
        for c, e, b in zip(canaries, exposure, better)
    ]


def candidate_exposure(rank: float, n_candidates: int) -> float:
    """Exposure over the scored set itself (the canary and its ``n_candidates`` uniform candidates, Carlini et al.'s
    definition with that set as the space): ``log2(n + 1) - log2(rank)``, from 0 (last) to ``log2(n + 1)`` (first).

    Unlike the estimate over the whole space, it is bounded by what the sample resolves, so a mean over canaries
    is not dominated by one censored canary; a model that has not memorised a canary ranks it uniformly, and the
    mean is then :func:`chance_candidate_exposure`.
    """
    if n_candidates < 1 or not 1.0 <= rank <= n_candidates + 1:
        raise InvalidParameterError(f"rank must lie in [1, {n_candidates + 1}] for {n_candidates} candidates, got {rank}.")
    return float(math.log2(n_candidates + 1) - math.log2(rank))


def chance_candidate_exposure(n_candidates: int) -> float:
    """Mean :func:`candidate_exposure` of a canary ranked uniformly among ``n_candidates + 1`` texts (no memorisation)."""
    ranks = np.arange(1, n_candidates + 2, dtype=np.float64)
    return float(math.log2(n_candidates + 1) - np.log2(ranks).mean())
