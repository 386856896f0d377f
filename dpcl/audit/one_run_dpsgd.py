"""One-run audit of DP-SGD: train once with canaries, report a lower bound on epsilon beside the certified one.

Needs torch (the ``train`` extra); :mod:`dpcl.audit` does not import this module.

The run (Steinke, Nasr & Jagielski 2023, Sec. 6; the white-box "Dirac
canary" setting of Nasr et al. 2023 and of Steinke et al.'s Fig. 1):

* a softmax-regression model on the real examples' features, widened by one
  feature per canary that no real example uses (0 for every real example), so
  every canary's gradient lies in parameters nothing else touches — the worst
  case DP-SGD's accounting is proven against;
* ``canaries`` canaries, each included in the training data independently
  with probability 1/2 (bits from the operating system's entropy unless the
  caller passes a generator for a reproducible test);
  ``canary_kind="gradient"`` (white box): canary ``i``'s per-example gradient
  is ``clip_norm`` on its own coordinate, whatever the model;
  ``canary_kind="input"``: canary ``i`` is the input ``canary_norm`` on its own
  feature with label 0, and its gradient is whatever the loss gives (so an
  implementation that forgets to clip shows it);
* DP-SGD over real examples and included canaries: Poisson sampling at
  ``sample_rate``, per-example clipping to ``clip_norm``, Gaussian noise of
  standard deviation ``noise_multiplier * clip_norm`` on the clipped sum, step
  ``learning_rate * noisy_sum / expected_batch_size`` (as opacus normalises);
  the implementation under audit is a :class:`DpsgdStep`, whose ``clip`` and
  ``noise`` a caller may replace to audit their own;
* scores per canary, each its own guessing game (:func:`dpcl.audit.one_run.audit_one_run`):
  ``"likelihood"`` (white box: every noisy sum is seen, as DP-SGD's accounting
  assumes): the Neyman-Pearson statistic of the transcript for a
  Poisson-subsampled Gaussian, ``sum_t log(1 - q + q exp((|g| a_t - |g|^2/2) / s^2))``
  with ``a_t`` the noisy sum projected on the canary's clipped gradient;
  ``"variation"`` (white box, when the sampling rate is below 1):
  ``sum_t |a_t - a_{t-1}|``, which is noise for a correct run and exposes noise
  reused across steps;
  ``"final_model"`` (black box: only the released model is seen): minus the
  final model's loss on the canary (for a gradient canary, how far its own
  coordinate moved).

The certified epsilon is :func:`dpcl.accounting.dpsgd.dpsgd_epsilon` of the
same run (add/remove, unit = one example: a canary is one example). A lower
bound above it means the implementation is not what was certified.
The steps are sequential; examples and canaries are vectorised.
"""

from __future__ import annotations

import secrets
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
import torch

from dpcl.accounting.dpsgd import dpsgd_epsilon
from dpcl.accounting.validation import check_positive_scalar, check_sample_rate
from dpcl.audit.blackbox import check_confidence
from dpcl.audit.canary import step_likelihood_ratio
from dpcl.audit.one_run import OneRunAuditResult, audit_one_run, check_integer_count
from dpcl.errors import InvalidParameterError

__all__ = ["CANARY_KINDS", "DpsgdStep", "OneRunDpsgdAudit", "WHITE_BOX_SCORES", "audit_dpsgd_one_run"]

CANARY_KINDS = ("gradient", "input")
WHITE_BOX_SCORES = ("likelihood", "variation", "final_model")
BLACK_BOX_SCORES = ("final_model",)


class DpsgdStep:
    """The DP-SGD step under audit: per-example clipping and Gaussian noise, as dpcl's DP-SGD methods do them.

    ``clip(norms)`` returns the factor each per-example gradient is scaled by
    (opacus's ``min(1, C / (|g| + 1e-6))``); ``noise(shape, step)`` the noise
    added to the clipped sum at ``step`` (fresh ``N(0, (z C)^2)`` each step,
    from ``generator``). Replace either to audit another implementation.
    """

    def __init__(self, noise_multiplier: float, clip_norm: float, generator: torch.Generator) -> None:
        self.noise_multiplier = noise_multiplier
        self.clip_norm = clip_norm
        self.generator = generator

    def clip(self, norms: torch.Tensor) -> torch.Tensor:
        return (self.clip_norm / (norms + 1e-6)).clamp(max=1.0)

    def noise(self, shape: tuple[int, ...], step: int) -> torch.Tensor:
        std = self.noise_multiplier * self.clip_norm
        return std * torch.randn(shape, generator=self.generator, dtype=torch.float64)


@dataclass(frozen=True)
class OneRunDpsgdAudit:
    """Certified epsilon of a DP-SGD run beside one-run lower bounds from the same run.

    ``white_box`` / ``black_box`` are the best bound over the scores each
    setting may use (the confidence split over every score and number of
    guesses); ``flagged`` is true when a lower bound exceeds the certified
    epsilon, which a correct implementation does with probability at most
    ``1 - confidence``.
    """

    certified_epsilon: float
    accountant: str
    delta: float
    confidence: float
    noise_multiplier: float
    sample_rate: float
    steps: int
    examples: int
    canaries: int
    canary_kind: str
    adjacency: str
    unit: str
    white_box: OneRunAuditResult
    black_box: OneRunAuditResult
    scores: tuple[str, ...]
    train_accuracy: float

    @property
    def empirical_epsilon_lower(self) -> float:
        return max(self.white_box.epsilon_lower, self.black_box.epsilon_lower)

    @property
    def flagged(self) -> bool:
        return self.empirical_epsilon_lower > self.certified_epsilon

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["white_box"] = self.white_box.to_dict()
        out["black_box"] = self.black_box.to_dict()
        out["empirical_epsilon_lower"] = self.empirical_epsilon_lower
        out["flagged"] = self.flagged
        return out


def os_generator() -> torch.Generator:
    """A CPU generator seeded from the operating system's entropy (independent of ``torch.manual_seed``)."""
    return torch.Generator().manual_seed(secrets.randbits(63))


def _train(
    x: torch.Tensor, y: torch.Tensor, m: int, included: torch.Tensor, *, kind: str, canary_norm: float,
    classes: int, sample_rate: float, steps: int, learning_rate: float, dpsgd: DpsgdStep, sampler: torch.Generator,
) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
    """DP-SGD on (x, y) plus the included canaries; returns per-canary scores and the final weights.

    Weights: ``real`` (d, K) for the real features, ``canary`` (m, K) for the canaries' own features.
    """
    n, d = x.shape
    s = dpsgd.noise_multiplier * dpsgd.clip_norm
    c = dpsgd.clip_norm
    real = torch.zeros(d, classes, dtype=torch.float64)
    canary = torch.zeros(m, classes, dtype=torch.float64)
    onehot = torch.nn.functional.one_hot(y, classes).to(torch.float64)
    canary_target = torch.zeros(m, classes, dtype=torch.float64)
    canary_target[:, 0] = 1.0
    x_norm = x.norm(dim=1)
    expected_batch = sample_rate * (n + float(included.sum()))
    likelihood = torch.zeros(m, dtype=torch.float64)
    variation = torch.zeros(m, dtype=torch.float64)
    previous = None
    for t in range(steps):  # steps are sequential; examples and canaries are vectorised
        sampled_real = (torch.rand(n, generator=sampler, dtype=torch.float64) < sample_rate).to(torch.float64)
        sampled_canary = (torch.rand(m, generator=sampler, dtype=torch.float64) < sample_rate).to(torch.float64)
        sampled_canary = sampled_canary * included
        residual = torch.softmax(x @ real, dim=1) - onehot  # per-example gradient is x_j (outer) residual_j
        f_real = dpsgd.clip(x_norm * residual.norm(dim=1))
        if kind == "gradient":
            g = torch.zeros(m, classes, dtype=torch.float64)
            g[:, 0] = c  # the Dirac canary: clip_norm on its own coordinate
        else:
            g = canary_norm * (torch.softmax(canary_norm * canary, dim=1) - canary_target)
        g = g * dpsgd.clip(g.norm(dim=1)).unsqueeze(1)
        noise = dpsgd.noise((d + m, classes), t)
        noisy_real = x.T @ (sampled_real.unsqueeze(1) * f_real.unsqueeze(1) * residual) + noise[:d]
        noisy_canary = sampled_canary.unsqueeze(1) * g + noise[d:]
        # the white-box adversary sees every noisy sum and knows each canary's clipped gradient g at this model
        a, step_llr = step_likelihood_ratio(noisy_canary, g, sample_rate=sample_rate, noise_std=s)
        likelihood += step_llr
        if previous is not None:
            variation += (a - previous).abs()
        previous = a
        real = real - learning_rate * noisy_real / expected_batch
        canary = canary - learning_rate * noisy_canary / expected_batch
    if kind == "gradient":
        final = -canary[:, 0]
    else:
        logits = canary_norm * canary
        final = -torch.nn.functional.cross_entropy(logits, torch.zeros(m, dtype=torch.long), reduction="none")
    return {"likelihood": likelihood, "variation": variation, "final_model": final}, real


def audit_dpsgd_one_run(
    features: Any,
    labels: Any,
    *,
    canaries: int,
    noise_multiplier: float,
    sample_rate: float,
    steps: int,
    delta: float,
    clip_norm: float = 1.0,
    learning_rate: float = 0.5,
    canary_kind: str = "gradient",
    canary_norm: float = 10.0,
    confidence: float = 0.95,
    accountant: str = "auto",
    step: DpsgdStep | None = None,
    generator: torch.Generator | None = None,
) -> OneRunDpsgdAudit:
    """Train DP-SGD once on ``(features, labels)`` with ``canaries`` canaries; audit it (see the module docstring).

    ``features`` (n, d) and integer ``labels`` (n,) are the real training
    examples. ``step`` is the implementation under audit (default: dpcl's, a
    :class:`DpsgdStep` drawing noise from ``generator``). ``generator`` draws
    the canaries' inclusion bits, the Poisson samples and the default step's
    noise; it defaults to one seeded from the operating system's entropy, so
    only a test passes its own.
    """
    x, y = _training_data(features, labels)
    classes = max(int(y.max()) + 1, 2)
    m = check_integer_count("canaries", canaries, 2)
    z = check_positive_scalar("noise_multiplier", noise_multiplier)
    q = check_sample_rate("sample_rate", sample_rate)
    t = check_integer_count("steps", steps, 1)
    c = check_positive_scalar("clip_norm", clip_norm)
    lr = check_positive_scalar("learning_rate", learning_rate)
    b = check_positive_scalar("canary_norm", canary_norm)
    conf = check_confidence(confidence)
    if canary_kind not in CANARY_KINDS:
        raise InvalidParameterError(f"canary_kind must be one of {', '.join(CANARY_KINDS)}; got {canary_kind!r}.")
    accounting = dpsgd_epsilon(z, q, t, delta, accountant=accountant)
    gen = generator if generator is not None else os_generator()
    dpsgd = step if step is not None else DpsgdStep(z, c, gen)
    included = (torch.rand(m, generator=gen, dtype=torch.float64) < 0.5).to(torch.float64)
    scores, real = _train(
        x, y, m, included, kind=canary_kind, canary_norm=b, classes=classes, sample_rate=q, steps=t,
        learning_rate=lr, dpsgd=dpsgd, sampler=gen,
    )
    white, black = _white_and_black_box(scores, included.numpy().astype(bool), float(delta), conf, q, canary_kind)
    accuracy = float((torch.argmax(x @ real, dim=1) == y).to(torch.float64).mean())
    return OneRunDpsgdAudit(
        certified_epsilon=float(accounting.epsilon), accountant=str(accounting.accountant), delta=float(delta),
        confidence=conf, noise_multiplier=z, sample_rate=q, steps=t, examples=int(x.shape[0]), canaries=m,
        canary_kind=canary_kind, adjacency="add_remove", unit="example", white_box=white[0], black_box=black[0],
        scores=(white[1], black[1]), train_accuracy=accuracy,
    )


def _training_data(features: Any, labels: Any) -> tuple[torch.Tensor, torch.Tensor]:
    """The real training examples as tensors: ``features`` (n, d) finite, ``labels`` (n,) class indices >= 0."""
    x = torch.as_tensor(np.asarray(features, dtype=np.float64))
    y_np = np.asarray(labels)
    if x.ndim != 2 or y_np.shape != (x.shape[0],) or x.shape[0] < 1:
        raise InvalidParameterError(f"features must be (n, d) and labels (n,); got {tuple(x.shape)} and {y_np.shape}.")
    if not torch.isfinite(x).all():
        raise InvalidParameterError("features must be finite.")
    if not np.issubdtype(y_np.dtype, np.integer) or y_np.min() < 0:
        raise InvalidParameterError("labels must be non-negative integer class indices.")
    return x, torch.as_tensor(y_np.astype(np.int64))


def _white_and_black_box(scores: dict[str, torch.Tensor], bits: np.ndarray, delta: float, conf: float, q: float,
                         canary_kind: str) -> tuple[tuple[OneRunAuditResult, str], tuple[OneRunAuditResult, str]]:
    """The best white-box and black-box lower bounds (and the scores that gave them) at joint confidence ``conf``."""
    # the Gaussian f-DP analysis tests "as private as a Gaussian mechanism", which the certificate implies
    # only without subsampling (full-batch DP-SGD is a composition of Gaussian mechanisms)
    gaussian = q == 1.0
    # full batch with Dirac gradient canaries: every score is a sum of independent Gaussian coordinates (plus the
    # canary's constant signal when included), so the Gaussian view's assumption holds by construction
    view = gaussian and canary_kind == "gradient"
    conf_each = 1.0 - (1.0 - conf) / 2  # white box and black box are two claims: Bonferroni over them
    # full batch: every step carries the canary, so the likelihood ratio is the whole white-box evidence (the
    # variation of a constant signal is pure noise, the final model a function of the same sums); splitting the
    # confidence over scores that cannot add evidence would only loosen the bound
    white_scores = ("likelihood",) if q == 1.0 else WHITE_BOX_SCORES
    white = _best(
        [audit_one_run(scores[name].numpy(), bits, delta, confidence=1.0 - (1.0 - conf_each) / len(white_scores),
                       gaussian_claim=gaussian, gaussian_view=view) for name in white_scores],
        white_scores,
    )
    black = _best(
        [audit_one_run(scores["final_model"].numpy(), bits, delta, confidence=conf_each, gaussian_claim=gaussian,
                       gaussian_view=view)],
        BLACK_BOX_SCORES,
    )
    return white, black


def _best(results: list[OneRunAuditResult], names: tuple[str, ...]) -> tuple[OneRunAuditResult, str]:
    i = max(range(len(results)), key=lambda j: results[j].epsilon_lower)
    return results[i], names[i]
