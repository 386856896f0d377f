"""Per-token privacy budgets of PeCL and what they really guarantee.

PeCL (Zhan et al., *Forget What's Sensitive, Remember What Matters: Token-Level
Differential Privacy in Memory Sculpting for Continual Learning*; two versions,
``000_*`` and ``002_*`` in the paper index) gives every token ``t_i`` a budget

    eps_i = eps_lower + (eps_upper - eps_lower) * (1 - Score(t_i))^2      (eq. 4 of 000 / eq. 6 of 002)

and perturbs its clipped input embedding, ``clip(e_i, C) + N(0, sigma_i^2 I)``
(eq. 5 / eq. 7), with the *classic* Gaussian formula at sensitivity ``C``:

    sigma_i = C * sqrt(2 log(1.25 / delta)) / eps_i.

Three problems, each handled here soundly:

1. **Sensitivity.** Replacing one token changes its clipped embedding by up to
   ``||clip(e) - clip(e')|| <= 2C`` -- the paper's own appendix (Lemma 1) derives
   ``2C``, but the main text's sigma_i uses ``C``. Every epsilon in this module is
   computed at the true replace-one sensitivity ``2C``
   (:func:`embedding_sensitivity`).
2. **Range of the classic formula.** ``sigma = Delta sqrt(2 log(1.25/delta)) / eps``
   is proven only for ``eps < 1`` (Dwork & Roth 2014, Thm A.1), yet PeCL uses
   ``eps_i`` up to 10. The ``"analytic"`` calibration uses the exact privacy
   profile of the Gaussian mechanism (Balle & Wang 2018, Thm 8) through
   :func:`dpcl.accounting.gaussian.gaussian_sigma`; the ``"paper"`` calibration
   reproduces the paper's sigma_i and reports its *true* epsilon
   (:func:`true_token_epsilons`), which exceeds the claimed eps_i.
3. **Data dependence.** Score(t_i) is computed from the private text (model
   surprise, eq. 2, and cross-task token frequencies, eq. 3), so sigma_i depends
   on private data. A Gaussian mechanism whose noise scale depends on the input is
   not covered by the Gaussian-mechanism theorem (the noise scale itself leaks).
   Every guarantee built here therefore carries :data:`DATA_DEPENDENCE_ASSUMPTION`.

A token's embedding is perturbed afresh every time the token is fed to the
model (once per epoch), so a token's guarantee over a task is the composition of
``releases`` Gaussian mechanisms. Gaussian mechanisms compose exactly in
Gaussian differential privacy (Dong, Roth & Su 2022, Cor. 3.3): ``mu_total =
sqrt(sum_j mu_j^2)`` with ``mu_j = Delta_j / sigma_j``; the same exact rule
gives the sequence-level guarantee (all ``L`` tokens of one sequence replaced).
The paper's Remark 1 (an "advanced composition" formula with failure
probability ``delta + delta'``) is reported next to it, with the true delta of
the composed mechanism at the paper's epsilon, and flagged when it is not a
sound bound.

This module is numpy only (no torch): the guarantees layer must stay importable
without the training extra.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from dpcl.accounting.events import Adjacency, GaussianEvent, RepeatedEvent
from dpcl.accounting.gaussian import gaussian_delta, gaussian_epsilon, gaussian_sigma, gdp_epsilon
from dpcl.accounting.validation import check_count, check_delta, check_positive
from dpcl.errors import InvalidParameterError


#: Sentence copied into every PeCL certificate.
DATA_DEPENDENCE_ASSUMPTION = (
    "Per-token noise scales sigma_i are derived from sensitivity scores; the per-token and sequence-level "
    "guarantees hold only if those scores do not depend on the private data (computed from public data or "
    "themselves privatised). PeCL computes them from the private training text (model surprise, eq. 2, and "
    "cross-task token frequencies, eq. 3 of Zhan et al.), so as run the stated epsilons are conditional on "
    "this assumption, not unconditional DP guarantees. The same holds for the memory-sculpting weights: "
    "lambda_dyn (eq. 11, from the task's mean score) and Omega_k (eq. 8, activation norms of the clean text) "
    "are computed from the private text without noise and shape the released adapters."
)

#: What the guarantee covers (and what it does not).
SCOPE_ASSUMPTION = (
    "The guarantee covers the release of the perturbed input embeddings, one token (replace-one) as the "
    "privacy unit, every token perturbed (also score-0 tokens, which the paper leaves noise-free). Model "
    "weights trained on them are a post-processing of that release only where the training targets "
    "(next tokens, labels) are public; in language modelling the targets are the clean private tokens."
)


#: Name and scope of the per-token statement (a release of perturbed input embeddings, not the checkpoint).
INPUT_EMBEDDINGS_SCOPE_NAME = "input_embeddings"
INPUT_EMBEDDINGS_SCOPE = (
    "The release of the perturbed (clipped, Gaussian-noised) input embeddings of the training tokens, one token "
    "replaced as the privacy unit; it does not cover the model weights trained on them."
)

CALIBRATIONS = ("analytic", "paper")


# ---------------------------------------------------------------------------
# budgets and noise scales
# ---------------------------------------------------------------------------
def _check_scores(scores: Any) -> np.ndarray:
    try:
        array = np.asarray(scores, dtype=np.float64)
    except (TypeError, ValueError) as exc:
        raise InvalidParameterError(f"scores must be numbers in [0, 1], got {scores!r:.80}.") from exc
    if array.size == 0:
        raise InvalidParameterError("scores is empty; give at least one token score.")
    bad = ~np.isfinite(array) | (array < 0) | (array > 1)
    if np.any(bad):
        raise InvalidParameterError(
            f"scores must lie in [0, 1] (PeCL Lemma 2), got {float(array[bad].ravel()[0])!r}."
        )
    return array


def check_budget_range(epsilon_lower: float, epsilon_upper: float) -> tuple[float, float]:
    lower = float(check_positive("epsilon_lower", epsilon_lower))
    upper = float(check_positive("epsilon_upper", epsilon_upper))
    if upper < lower:
        raise InvalidParameterError(
            f"epsilon_upper must be >= epsilon_lower, got epsilon_lower={lower!r} > epsilon_upper={upper!r}."
        )
    return lower, upper


def token_budgets(scores: Any, epsilon_lower: float, epsilon_upper: float) -> np.ndarray | float:
    """Per-token budgets ``eps_i = eps_lower + (eps_upper - eps_lower)(1 - Score_i)^2``.

    Eq. 4 of ``000_*`` / eq. 6 of ``002_*``. Vectorised over any array shape
    (e.g. ``[batch, seq]``); non-increasing in the score, equal to ``eps_upper``
    at score 0 and ``eps_lower`` at score 1 (Corollary 1). Scores outside
    ``[0, 1]`` raise :class:`InvalidParameterError`.
    """
    array = _check_scores(scores)
    lower, upper = check_budget_range(epsilon_lower, epsilon_upper)
    out = lower + (upper - lower) * np.square(1.0 - array)
    return float(out) if out.ndim == 0 else out


def embedding_sensitivity(clip_norm: float) -> float:
    """l2 sensitivity ``2C`` of a clipped embedding under replacement of one token.

    ``||clip(e, C) - clip(e', C)||_2 <= ||clip(e, C)|| + ||clip(e', C)|| <= 2C``,
    tight for ``e' = -e`` (PeCL appendix, Lemma 1). The main text's sigma_i uses
    ``C`` instead.
    """
    return 2.0 * float(check_positive("clip_norm", clip_norm))


def _perturbations_sensitivity(clip_norm: float, releases: int) -> float:
    """``2C sqrt(releases)``: the sensitivity of one Gaussian mechanism equal to ``releases`` independent Gaussian
    perturbations of the same clipped embedding (Dong, Roth & Su 2022, Cor. 3.3)."""
    n = check_count("releases", releases)
    return embedding_sensitivity(clip_norm) * math.sqrt(n)


def paper_token_sigmas(epsilons: Any, delta: float, clip_norm: float) -> np.ndarray | float:
    """The paper's noise scale ``sigma_i = C sqrt(2 log(1.25/delta)) / eps_i`` (eq. 5 / eq. 7).

    Reproduced as written: sensitivity ``C`` (not ``2C``) and the classic
    formula, which is proven only for ``eps_i < 1``. Use
    :func:`true_token_epsilons` for what these sigmas actually guarantee.
    """
    eps = check_positive("epsilons", epsilons)
    d = check_delta("delta", delta)
    c = float(check_positive("clip_norm", clip_norm))
    return c * math.sqrt(2.0 * math.log(1.25 / d)) / eps


def analytic_token_sigmas(
    epsilons: Any, delta: float, clip_norm: float, releases: int = 1
) -> np.ndarray | float:
    """Smallest sigma_i such that ``releases`` perturbations of a token are (eps_i, delta)-DP.

    Analytic Gaussian calibration (Balle & Wang 2018, Thm 8, via
    :func:`dpcl.accounting.gaussian.gaussian_sigma`) at the true replace-one
    sensitivity ``2C``. ``releases`` independent Gaussian perturbations of the
    same clipped embedding compose exactly into one Gaussian mechanism of
    sensitivity ``2C sqrt(releases)`` (Dong, Roth & Su 2022, Cor. 3.3), so
    calibrating at that sensitivity makes the whole task's training (one
    release per epoch) satisfy ``(eps_i, delta)`` per token.

    Distinct budgets are calibrated once each (scores of a batch share few
    distinct values only by accident, but ``np.unique`` keeps repeated work out
    of the root finder when they do), in blocks of at most 2^20 budgets, so the
    working memory is bounded whatever the number of tokens.
    """
    eps = check_positive("epsilons", epsilons)
    d = check_delta("delta", delta)
    sens = _perturbations_sensitivity(clip_norm, releases)
    if np.ndim(eps) == 0:
        return float(gaussian_sigma(float(eps), d, sensitivity=sens))
    # blockwise, so the working memory stays bounded (the sigmas are gaussian_sigma's, bit for bit)
    flat = np.ravel(eps)
    out = np.empty(flat.size, dtype=np.float64)
    step = max(1 << 16, min(1 << 20, flat.size // 16))
    for start in range(0, flat.size, step):
        unique, inverse = np.unique(flat[start : start + step], return_inverse=True)
        out[start : start + step] = np.asarray(gaussian_sigma(unique, d, sensitivity=sens))[inverse]
    return out.reshape(np.shape(eps))


def true_token_epsilons(sigmas: Any, delta: float, clip_norm: float, releases: int = 1) -> np.ndarray | float:
    """The smallest epsilon at ``delta`` that noise ``sigmas`` really gives a token.

    Exact Gaussian privacy profile (Balle & Wang 2018, Thm 8, via
    :func:`dpcl.accounting.gaussian.gaussian_epsilon`) at sensitivity
    ``2C sqrt(releases)``: replace-one, ``releases`` perturbations per token.
    """
    sig = check_positive("sigmas", sigmas)
    d = check_delta("delta", delta)
    sens = _perturbations_sensitivity(clip_norm, releases)
    if np.ndim(sig) == 0:
        return float(gaussian_epsilon(float(sig), d, sensitivity=sens))
    unique, inverse = np.unique(np.asarray(sig), return_inverse=True)
    eps = np.asarray(gaussian_epsilon(unique, d, sensitivity=sens), dtype=np.float64)
    return eps[inverse].reshape(np.shape(sig))


@dataclass(frozen=True)
class TokenCalibration:
    """Per-token budgets, the noise used, and what that noise really guarantees.

    ``claimed_epsilons`` are eq. 4's eps_i; ``sigmas`` the noise scales applied;
    ``true_epsilons`` the epsilons at ``delta`` of those sigmas at sensitivity
    ``2C`` over ``releases`` perturbations (exact Gaussian profile). For
    ``calibration="analytic"`` ``true <= claimed`` (up to root-finding
    tolerance); for ``"paper"`` ``true > claimed``.
    """

    calibration: str
    claimed_epsilons: np.ndarray
    sigmas: np.ndarray
    true_epsilons: np.ndarray
    delta: float
    clip_norm: float
    releases: int

    @property
    def sensitivity(self) -> float:
        return embedding_sensitivity(self.clip_norm)


def calibrate_tokens(
    scores: Any,
    *,
    epsilon_lower: float,
    epsilon_upper: float,
    delta: float,
    clip_norm: float,
    calibration: str = "analytic",
    releases: int = 1,
) -> TokenCalibration:
    """Scores -> (eps_i, sigma_i, true eps_i) for a whole ``[batch, seq]`` array at once."""
    if calibration not in CALIBRATIONS:
        raise InvalidParameterError(f"calibration must be one of {CALIBRATIONS}, got {calibration!r}.")
    claimed = np.asarray(token_budgets(scores, epsilon_lower, epsilon_upper), dtype=np.float64)
    n = check_count("releases", releases)
    if calibration == "analytic":
        sigmas = np.asarray(analytic_token_sigmas(claimed, delta, clip_norm, n), dtype=np.float64)
    else:
        sigmas = np.asarray(paper_token_sigmas(claimed, delta, clip_norm), dtype=np.float64)
    true = np.asarray(true_token_epsilons(sigmas, delta, clip_norm, n), dtype=np.float64)
    return TokenCalibration(
        calibration=calibration,
        claimed_epsilons=claimed,
        sigmas=sigmas,
        true_epsilons=true,
        delta=float(delta),
        clip_norm=float(clip_norm),
        releases=n,
    )


# ---------------------------------------------------------------------------
# the mechanism itself (numpy), for audits and reference
# ---------------------------------------------------------------------------
def clip_embeddings(embeddings: Any, clip_norm: float) -> np.ndarray:
    """Scale every embedding (last axis) to l2 norm at most ``clip_norm``: ``e * min(1, C/||e||)``."""
    e = np.asarray(embeddings, dtype=np.float64)
    if e.ndim < 1 or e.shape[-1] == 0:
        raise InvalidParameterError(f"embeddings must have a non-empty last (feature) axis, got shape {e.shape}.")
    if not np.all(np.isfinite(e)):
        raise InvalidParameterError("embeddings must be finite.")
    c = float(check_positive("clip_norm", clip_norm))
    norms = np.linalg.norm(e, axis=-1, keepdims=True)
    return e * np.minimum(1.0, c / np.maximum(norms, np.finfo(np.float64).tiny))


def per_token_gaussian_noise(
    embeddings: Any, sigmas: Any, clip_norm: float, rng: np.random.Generator
) -> np.ndarray:
    """PeCL's token-level mechanism (eq. 5 / eq. 7): ``clip(e_i, C) + N(0, sigma_i^2 I)``.

    ``embeddings`` has shape ``[..., d]``; ``sigmas`` broadcasts against
    ``embeddings.shape[:-1]`` (one sigma per token). Every token receives noise.
    """
    clipped = clip_embeddings(embeddings, clip_norm)
    sig = np.asarray(check_positive("sigmas", sigmas), dtype=np.float64)
    try:
        sig = np.broadcast_to(sig, clipped.shape[:-1])
    except ValueError:
        raise InvalidParameterError(
            f"sigmas of shape {sig.shape} do not broadcast to the token shape {clipped.shape[:-1]}."
        ) from None
    if not isinstance(rng, np.random.Generator):
        raise InvalidParameterError(f"rng must be a numpy.random.Generator, got {type(rng).__name__}.")
    return clipped + rng.standard_normal(clipped.shape) * sig[..., None]


# ---------------------------------------------------------------------------
# sequence / user level
# ---------------------------------------------------------------------------
@dataclass(frozen=True)
class SequenceGuarantee:
    """Guarantee for a whole token sequence (every token replaced: sequence/user unit).

    ``epsilon`` is sound: exact composition of the ``L x releases`` Gaussian
    mechanisms, ``mu = sqrt(releases * sum_i (2C/sigma_i)^2)``, converted to
    (epsilon, delta) with the exact GDP profile. ``remark1_*`` reproduce the
    paper's Remark 1: ``sum eps_i + sqrt(2 L log(1/delta')) max eps_i`` with
    failure probability ``delta + delta'``, computed from the *claimed* eps_i
    of one release; ``remark1_true_delta`` is the true delta of the composed
    mechanism at ``remark1_epsilon`` and ``remark1_sound`` says whether the
    paper's pair is a valid guarantee.
    """

    length: int
    releases: int
    mu: float
    epsilon: float
    delta: float
    remark1_epsilon: float
    remark1_delta: float
    remark1_true_delta: float
    remark1_sound: bool
    notes: tuple[str, ...] = field(default_factory=tuple)

    def to_dict(self) -> dict[str, Any]:
        return {
            "unit": "sequence",
            "adjacency": Adjacency.REPLACE_ONE.value,
            "length": self.length,
            "releases": self.releases,
            "mu": self.mu,
            "epsilon": self.epsilon,
            "delta": self.delta,
            "accountant": "exact Gaussian composition (GDP)",
            "remark1_epsilon": self.remark1_epsilon,
            "remark1_delta": self.remark1_delta,
            "remark1_true_delta": self.remark1_true_delta,
            "remark1_sound": self.remark1_sound,
            "notes": list(self.notes),
        }


def sequence_mu(sigmas: Any, clip_norm: float, releases: int = 1) -> float:
    """GDP parameter of one sequence: ``sqrt(releases * sum_i (2C / sigma_i)^2)`` (Dong, Roth & Su, Cor. 3.3)."""
    sig = np.atleast_1d(np.asarray(check_positive("sigmas", sigmas), dtype=np.float64))
    n = check_count("releases", releases)
    mus = embedding_sensitivity(clip_norm) / sig
    return float(math.sqrt(n) * np.linalg.norm(mus))


def sequence_guarantee(
    sigmas: Any,
    claimed_epsilons: Any,
    delta: float,
    clip_norm: float,
    *,
    releases: int = 1,
    delta_prime: float | None = None,
) -> SequenceGuarantee:
    """Sequence-level guarantee of the tokens of one sequence, next to the paper's Remark 1.

    ``sigmas`` and ``claimed_epsilons`` are the per-token values of one
    sequence (1-D, same length L). ``delta`` is the target delta of the sound
    bound; ``delta_prime`` (default ``delta``) is Remark 1's slack, so the
    paper's pair is ``(remark1_epsilon, delta + delta')``.
    """
    sig = np.atleast_1d(np.asarray(check_positive("sigmas", sigmas), dtype=np.float64)).ravel()
    eps = np.atleast_1d(np.asarray(check_positive("claimed_epsilons", claimed_epsilons), dtype=np.float64)).ravel()
    if eps.size != sig.size:
        raise InvalidParameterError(
            f"claimed_epsilons ({eps.size}) and sigmas ({sig.size}) must have one value per token."
        )
    d = check_delta("delta", delta)
    dp = d if delta_prime is None else check_delta("delta_prime", delta_prime)
    n = check_count("releases", releases)
    length = int(sig.size)
    mu = sequence_mu(sig, clip_norm, n)
    epsilon = float(gdp_epsilon(mu, d))
    remark_eps = float(eps.sum() + math.sqrt(2.0 * length * math.log(1.0 / dp)) * eps.max())
    remark_delta = float(d + dp)
    # The composed mechanism is one Gaussian mechanism with mu = sensitivity / sigma.
    true_delta = float(gaussian_delta(remark_eps, 1.0, sensitivity=mu))
    sound = bool(true_delta <= remark_delta)
    notes = [
        "Remark 1 of Zhan et al.: its epsilon expression is implied by heterogeneous advanced composition "
        "(Kairouz, Oh & Viswanath 2017, Thm 3.5), but it charges delta + delta' where composing L "
        "(eps_i, delta) mechanisms costs 1 - (1 - delta')(1 - delta)^L, about L*delta + delta', and it is "
        "computed from the claimed eps_i of one release, which the paper's sigma_i do not achieve "
        "(sensitivity 2C, classic formula at eps >= 1, one perturbation per epoch).",
    ]
    if not sound:
        notes.append(
            f"Remark 1's pair (epsilon={remark_eps:.6g}, delta={remark_delta:.3g}) is NOT a valid bound: the "
            f"composed mechanism's true delta at that epsilon is {true_delta:.3g}."
        )
    elif remark_eps > epsilon:
        notes.append(
            f"Remark 1's epsilon {remark_eps:.6g} happens to hold here but is looser than the exact "
            f"composition ({epsilon:.6g} at delta={d:.3g})."
        )
    return SequenceGuarantee(
        length=length,
        releases=n,
        mu=mu,
        epsilon=epsilon,
        delta=d,
        remark1_epsilon=remark_eps,
        remark1_delta=remark_delta,
        remark1_true_delta=true_delta,
        remark1_sound=sound,
        notes=tuple(notes),
    )


# ---------------------------------------------------------------------------
# the token-level guarantee of a whole run
# ---------------------------------------------------------------------------
def token_event(sigma: float, clip_norm: float, releases: int) -> RepeatedEvent:
    """Privacy event of one token over a task: ``releases`` Gaussian perturbations at sensitivity 2C."""
    inner = GaussianEvent(
        sigma=sigma, sensitivity=embedding_sensitivity(clip_norm), adjacency=Adjacency.REPLACE_ONE, unit="token"
    )
    return RepeatedEvent(inner, releases)


def per_token_guarantee(calibration: TokenCalibration, max_sequence_length: int | None = None) -> dict[str, Any]:
    """Summary of a run's per-token guarantee, for certificates.

    The worst token (smallest sigma) sets the per-token epsilon; the sequence
    guarantee is for the longest sequence, each of whose tokens is given the
    worst observed sigma when ``max_sequence_length`` exceeds the number of
    calibrated tokens (a sound upper bound: less noise never lowers epsilon).
    """
    sig = calibration.sigmas.ravel()
    worst = int(np.argmin(sig))
    out: dict[str, Any] = {
        "unit": "token",
        "adjacency": Adjacency.REPLACE_ONE.value,
        "sensitivity": calibration.sensitivity,
        "clip_norm": calibration.clip_norm,
        "calibration": calibration.calibration,
        "releases_per_token": calibration.releases,
        "delta": calibration.delta,
        "sigma_min": float(sig[worst]),
        "sigma_max": float(sig.max()),
        "epsilon": float(calibration.true_epsilons.ravel().max()),
        "claimed_epsilon_max": float(calibration.claimed_epsilons.ravel().max()),
        "claimed_epsilon_min": float(calibration.claimed_epsilons.ravel().min()),
        "accountant": "exact Gaussian privacy profile (Balle & Wang 2018, Thm 8)",
        "assumptions": [DATA_DEPENDENCE_ASSUMPTION, SCOPE_ASSUMPTION],
    }
    if max_sequence_length is not None:
        length = check_count("max_sequence_length", max_sequence_length)
        seq_sig = np.full(length, sig[worst])
        seq_eps = np.full(length, float(calibration.claimed_epsilons.ravel()[worst]))
        out["sequence"] = sequence_guarantee(
            seq_sig, seq_eps, calibration.delta, calibration.clip_norm, releases=calibration.releases
        ).to_dict()
    return out
