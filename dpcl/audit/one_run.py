"""One-run privacy auditing: a lower bound on epsilon from a single training run.

The game (Steinke, Nasr & Jagielski 2023, "Privacy Auditing with One (1)
Training Run", NeurIPS; Alg. 1): ``m`` canaries are each included in the
training data independently with probability 1/2. After training, an auditor
scores every canary (loss, gradient alignment, ...), abstains on most of them
and guesses "included" for the ``k_plus`` highest scores and "excluded" for
the ``k_minus`` lowest. If the training algorithm is (epsilon, delta)-DP with
respect to one canary (add/remove), the number of correct guesses ``v`` out of
``r = k_plus + k_minus`` is stochastically dominated as in their Theorem 5.2,
so a large ``v`` rejects every epsilon below some value: that value is a lower
bound on the algorithm's true epsilon, holding with the stated confidence.

Two analyses turn ``(m, r, v)`` into a lower bound:

* ``"steinke"`` — the p-value of Steinke et al. (Thm 5.2 and their Alg. 2):
  ``P[V >= v] <= P[Bin(r, e^eps / (1 + e^eps)) >= v] + 2 m delta * max_i P[v - i <= Bin(r, .) < v] / i``.
  It holds for every (epsilon, delta)-DP algorithm.
* ``"gaussian_fdp"`` — the f-DP analysis of Mahloujifar, Melis & Chaudhuri
  (2024, "Auditing f-Differential Privacy in One Run", the reconstruction bound
  with a cap). Its null hypothesis is *mu-GDP* with the mu whose Gaussian
  privacy profile passes through (epsilon, delta); it is tighter, but it tests
  the claim "the algorithm is as private as a Gaussian mechanism", which an
  (epsilon, delta) certificate implies only when the certified mechanism *is* a
  composition of Gaussian mechanisms without subsampling (full-batch DP-SGD).
  :func:`audit_one_run` uses it only when the caller says so
  (``gaussian_claim=True``).
* ``"gaussian_view"`` — a parametric analysis in the spirit of the Gaussian
  view of canary-aligned signals ("Let's Ask Gauss", 2026): when each
  canary's score is Gaussian with one variance whether it was included or not
  (exactly so for full-batch DP-SGD with Dirac gradient canaries: the score is
  a sum of independent Gaussian noise coordinates plus ``c`` per step when
  included), the included and excluded scores form a Gaussian shift
  experiment ``N(0, 1)`` vs ``N(mu, 1)`` after standardising, whose trade-off
  curve is ``G_mu``. Post-processing cannot make a mechanism less private, so
  the algorithm's epsilon at ``delta`` is at least ``eps_{G_mu}(delta)``
  (:func:`dpcl.accounting.gaussian.gdp_epsilon`). ``mu`` is bounded from below
  by the exact one-sided confidence bound of the standardised mean difference
  (the two-sample t statistic follows a noncentral t distribution,
  :func:`gaussian_view_mu_lower`). The assumption is stated in the result and
  checked on the scores (normality of each group and equal variances, each at
  level :data:`GAUSSIAN_VIEW_ASSUMPTION_LEVEL`); where the check rejects it,
  the analysis gives no bound. :func:`audit_one_run` applies it only when the
  caller says the scores are Gaussian by construction (``gaussian_view=True``).

Abstention: the auditor may try several numbers of guesses; every (analysis,
number of guesses) pair is one test, and the confidence is split among them
(Bonferroni), so the reported maximum holds with the stated confidence.

This module is torch-free (numpy and scipy); :mod:`dpcl.audit.one_run_dpsgd`
runs DP-SGD with canaries and calls it.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from statistics import NormalDist
from typing import Any, Sequence

import numpy as np

from dpcl.accounting.gaussian import gdp_epsilon, gdp_mu
from dpcl.accounting.validation import check_delta_scalar, check_nonnegative_scalar
from dpcl.audit.blackbox import check_confidence
from dpcl.errors import InvalidParameterError

__all__ = [
    "ANALYSES",
    "OneRunAuditResult",
    "audit_one_run",
    "check_integer_count",
    "gaussian_fdp_epsilon_lower",
    "gaussian_fdp_rejects",
    "gaussian_view_assumption_holds",
    "gaussian_view_epsilon_lower",
    "gaussian_view_mu_lower",
    "guess_and_count",
    "one_run_epsilon_lower",
    "one_run_p_value",
]

#: The analyses :func:`audit_one_run` can apply.
ANALYSES = ("steinke", "gaussian_fdp", "gaussian_view")

#: Level at which the Gaussian view's assumption (Gaussian scores, one variance) is tested on the scores.
GAUSSIAN_VIEW_ASSUMPTION_LEVEL = 0.01

#: What a ``"gaussian_view"`` bound assumes, as the result states it.
GAUSSIAN_VIEW_ASSUMPTION = (
    "each canary's score is Gaussian with the same variance whether the canary was included or not, and scores "
    "are independent given the inclusion bits (true by construction for full-batch DP-SGD with Dirac gradient "
    "canaries on their own coordinates); checked on the scores: normality of each group and equal variances"
)

#: The smallest number of included and of excluded canaries the Gaussian view needs (its normality check needs 8).
GAUSSIAN_VIEW_MIN_GROUP = 20

#: Largest epsilon searched for; a bound this large means "no privacy at all" for any practical purpose.
EPSILON_SEARCH_LIMIT = 1000.0


def check_integer_count(name: str, value: Any, minimum: int = 0) -> int:
    """An integer count (a Python or numpy integer, not a bool and, unlike
    :func:`dpcl.accounting.validation.check_count`, not an integral float) of at least ``minimum``, or a dpcl
    error naming it."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or int(value) < minimum:
        raise InvalidParameterError(f"{name} must be an integer >= {minimum}, got {value!r}.")
    return int(value)


def _game(canaries: Any, guesses: Any, correct: Any) -> tuple[int, int, int]:
    m = check_integer_count("canaries", canaries, 1)
    r = check_integer_count("guesses", guesses, 0)
    v = check_integer_count("correct", correct, 0)
    if not v <= r <= m:
        raise InvalidParameterError(
            f"need correct <= guesses <= canaries (the auditor guesses at most once per canary); "
            f"got correct={v}, guesses={r}, canaries={m}."
        )
    return m, r, v


def one_run_p_value(canaries: int, guesses: int, correct: int, epsilon: float, delta: float) -> float:
    """Largest probability of ``>= correct`` right guesses out of ``guesses`` for an (epsilon, delta)-DP algorithm.

    Steinke, Nasr & Jagielski (2023), Theorem 5.2 (their Algorithm 2 computes
    it): with ``q = e^eps / (1 + e^eps)`` (the accuracy of eps-DP randomised
    response), ``beta = P[Bin(r, q) >= v]`` and
    ``alpha = max_{1 <= i <= v} P[v - i <= Bin(r, q) < v] / i``,
    the p-value is ``min(1, beta + 2 m delta alpha)``. The maximum over ``i``
    is taken over the whole vector of partial sums at once.
    """
    m, r, v = _game(canaries, guesses, correct)
    eps = check_nonnegative_scalar("epsilon", epsilon)
    d = check_delta_scalar("delta", delta, allow_zero=True)
    from scipy.special import expit  # noqa: PLC0415  (scipy.stats costs ~0.7 s at import; not at module import)
    from scipy.stats import binom  # noqa: PLC0415

    q = float(expit(eps))
    beta = float(binom.sf(v - 1, r, q))
    if d == 0.0 or v == 0:
        return min(beta, 1.0)
    i = np.arange(1, v + 1)
    partial = binom.sf(v - i - 1, r, q) - beta  # P[v - i <= Bin < v]
    alpha = float(np.max(np.maximum(partial, 0.0) / i))
    return min(beta + 2.0 * m * d * alpha, 1.0)


def _largest_rejected(rejects: Any) -> float:
    """Largest epsilon in [0, EPSILON_SEARCH_LIMIT] at which ``rejects(eps)`` holds, 0 when it holds nowhere.

    ``rejects`` is monotone (true on [0, e*), false after): bracketed by doubling, then bisected to 1e-6.
    """
    if not rejects(0.0):
        return 0.0
    lo, hi = 0.0, 1.0
    while rejects(hi):
        lo, hi = hi, 2.0 * hi
        if lo >= EPSILON_SEARCH_LIMIT:
            return EPSILON_SEARCH_LIMIT
    while hi - lo > 1e-6 * max(1.0, lo):
        mid = 0.5 * (lo + hi)
        if rejects(mid):
            lo = mid
        else:
            hi = mid
    return lo


def _significance(confidence: Any) -> float:
    return 1.0 - check_confidence(confidence)


def one_run_epsilon_lower(canaries: int, guesses: int, correct: int, delta: float, confidence: float = 0.95) -> float:
    """Steinke et al.'s lower bound: the largest epsilon whose p-value (:func:`one_run_p_value`) is below 1 - confidence.

    With probability at least ``confidence`` over the canaries' inclusion and
    the algorithm's randomness, the algorithm is not (eps, delta)-DP for any eps
    below the returned value (0 when nothing is rejected).
    """
    m, r, v = _game(canaries, guesses, correct)
    d = check_delta_scalar("delta", delta, allow_zero=True)
    alpha = _significance(confidence)
    if one_run_p_value(m, r, v, 0.0, 0.0) > alpha:  # not even eps = 0, delta = 0 is rejected
        return 0.0
    return _largest_rejected(lambda eps: one_run_p_value(m, r, v, eps, d) <= alpha)


def _gaussian_tradeoff_inverse(mu: float) -> Any:
    """``x -> Phi(Phi^-1(x) - mu)`` on [0, 1]; scalar (the recursion calls it once a step), with the stdlib's normal."""
    normal = NormalDist()

    def inverse(x: float) -> float:
        if x <= 0.0:
            return 0.0
        if x >= 1.0:
            return 1.0
        return normal.cdf(normal.inv_cdf(x) - mu)

    return inverse


def gaussian_fdp_rejects(canaries: int, guesses: int, correct: int, mu: float, confidence: float = 0.95) -> bool:
    """Whether ``correct`` right guesses out of ``guesses`` reject "the algorithm is mu-GDP" at ``confidence``.

    The reconstruction bound with a cap of Mahloujifar, Melis & Chaudhuri
    (2024), for the Gaussian trade-off function ``G_mu``: starting from the
    significance level spread over the right (``r``) and wrong (``h``) guesses,
    the recursion over ``i = v - 1, ..., 0`` raises ``h`` to
    ``Phi(Phi^-1(r) - mu)`` (what mu-GDP forces the wrong-guess mass to be,
    given the right-guess mass) and moves the increase to ``r`` in proportion
    ``i / (k - i)``; the claim is rejected when ``r + h`` exceeds ``k / m``.
    The recursion is sequential (each step depends on the last, and it stops
    as soon as ``h`` stops growing), so it is a loop over at most ``v`` steps;
    no vector form exists.
    """
    m, k, v = _game(canaries, guesses, correct)
    if not math.isfinite(mu) or mu < 0:
        raise InvalidParameterError(f"mu must be a finite number >= 0, got {mu!r}.")
    alpha = _significance(confidence)
    if k == 0:
        return False
    inverse = _gaussian_tradeoff_inverse(mu)
    r = alpha * v / m
    h = alpha * (k - v) / m
    for i in range(v - 1, -1, -1):
        h_new = max(h, inverse(r))
        if h_new == h:
            break
        r = min(r + (i / (k - i)) * (h_new - h), 1.0)
        h = h_new
    return r + h - k / m > 0


def gaussian_fdp_epsilon_lower(canaries: int, guesses: int, correct: int, delta: float, confidence: float = 0.95) -> float:
    """Largest epsilon such that "the algorithm is mu(eps, delta)-GDP" is rejected (:func:`gaussian_fdp_rejects`).

    ``mu(eps, delta)`` is the GDP parameter whose exact Gaussian privacy
    profile gives ``delta`` at ``eps`` (:func:`dpcl.accounting.gaussian.gdp_mu`).
    A lower bound on epsilon for algorithms whose certified claim is a
    Gaussian trade-off curve (full-batch DP-SGD, the Gaussian mechanism);
    see the module docstring.
    """
    m, r, v = _game(canaries, guesses, correct)
    d = check_delta_scalar("delta", delta, allow_zero=True)
    if d == 0.0:
        raise InvalidParameterError("the Gaussian f-DP analysis needs delta > 0 (a Gaussian mechanism is not pure DP).")
    check_confidence(confidence)

    def rejects(eps: float) -> bool:
        mu = 0.0 if eps == 0.0 else float(gdp_mu(eps, d))
        return gaussian_fdp_rejects(m, r, v, mu, confidence)

    return _largest_rejected(rejects)


def _scores_and_bits(scores: Any, included: Any) -> tuple[np.ndarray, np.ndarray]:
    """Finite 1-D float scores and boolean inclusion bits of one length, or a dpcl error saying which is wrong."""
    s = np.asarray(scores, dtype=np.float64)
    b = np.asarray(included)
    if s.ndim != 1 or b.shape != s.shape:
        raise InvalidParameterError(f"scores and included must be 1-D arrays of one length; got {s.shape} and {b.shape}.")
    if not np.all(np.isfinite(s)):
        raise InvalidParameterError("scores must be finite (a NaN or infinite score cannot be ranked or averaged).")
    if b.dtype != bool and not np.all((b == 0) | (b == 1)):
        raise InvalidParameterError("included must hold booleans (or 0/1): whether each canary was in the training data.")
    return s, b.astype(bool)


def _score_groups(scores: Any, included: Any) -> tuple[np.ndarray, np.ndarray]:
    s, b = _scores_and_bits(scores, included)
    s_in, s_out = s[b], s[~b]
    if min(s_in.size, s_out.size) < GAUSSIAN_VIEW_MIN_GROUP:
        raise InvalidParameterError(
            f"the Gaussian view needs at least {GAUSSIAN_VIEW_MIN_GROUP} included and {GAUSSIAN_VIEW_MIN_GROUP} excluded "
            f"canaries; got {s_in.size} and {s_out.size}: use more canaries."
        )
    return s_in, s_out


def gaussian_view_assumption_holds(scores: Any, included: Any, level: float = GAUSSIAN_VIEW_ASSUMPTION_LEVEL) -> tuple[bool, str]:
    """Whether the scores are consistent with :data:`GAUSSIAN_VIEW_ASSUMPTION`, and why not where they are not.

    Three tests at ``level`` each: D'Agostino and Pearson's normality test on
    the included and on the excluded scores, and the two-sided F test of equal
    variances. Not rejecting is not a proof; it screens out scores whose shape
    plainly breaks the assumption (heavy tails, a mixture, unequal spread), for
    which the Gaussian view's bound would mean nothing.
    """
    from scipy import stats  # noqa: PLC0415  (scipy.stats costs ~0.7 s at import; not at module import)

    s_in, s_out = _score_groups(scores, included)
    for name, group in (("included", s_in), ("excluded", s_out)):
        if float(np.std(group)) == 0.0:
            return False, f"the {name} canaries' scores are all equal (no Gaussian spread)"
        p = float(stats.normaltest(group).pvalue)
        if p < level:
            return False, f"the {name} canaries' scores are not Gaussian (normality test p = {p:.3g} < {level})"
    ratio = float(np.var(s_in, ddof=1) / np.var(s_out, ddof=1))
    cdf = float(stats.f.cdf(ratio, s_in.size - 1, s_out.size - 1))
    p = 2.0 * min(cdf, 1.0 - cdf)
    if p < level:
        return False, f"the included and excluded scores have different variances (F test p = {p:.3g} < {level})"
    return True, "not rejected"


def gaussian_view_mu_lower(scores: Any, included: Any, confidence: float = 0.95) -> float:
    """Lower confidence bound on the standardised mean shift ``mu`` between included and excluded scores.

    Under :data:`GAUSSIAN_VIEW_ASSUMPTION` the two-sample t statistic
    ``t = (mean_in - mean_out) / (s_pooled * sqrt(1/n_in + 1/n_out))`` follows
    a noncentral t distribution with ``n_in + n_out - 2`` degrees of freedom
    and noncentrality ``mu / sqrt(1/n_in + 1/n_out)``, whose survival function
    grows with the noncentrality; the bound is the noncentrality at which
    ``P[T >= t] = 1 - confidence`` (exact, found by Brent's method to 1e-12 and
    lowered by 1e-9 so that the root finder's error cannot raise it), and 0
    when even ``mu = 0`` is not rejected.
    """
    from scipy import optimize, stats  # noqa: PLC0415

    s_in, s_out = _score_groups(scores, included)
    alpha = _significance(confidence)
    n_in, n_out = s_in.size, s_out.size
    df = n_in + n_out - 2
    pooled = math.sqrt(((n_in - 1) * np.var(s_in, ddof=1) + (n_out - 1) * np.var(s_out, ddof=1)) / df)
    if pooled == 0.0:
        raise InvalidParameterError("the scores have no spread (every score equal within each group): no Gaussian view.")
    scale = math.sqrt(1.0 / n_in + 1.0 / n_out)
    t = float((np.mean(s_in) - np.mean(s_out)) / (pooled * scale))
    if float(stats.t.sf(t, df)) > alpha:  # mu = 0 is not rejected
        return 0.0

    def excess(ncp: float) -> float:
        return float(stats.nct.sf(t, df, ncp)) - alpha

    hi = max(t, 1.0)
    while excess(hi) < 0.0:
        hi *= 2.0
    root = optimize.brentq(excess, 0.0, hi, xtol=1e-12)
    return max(0.0, root * scale - 1e-9)


def gaussian_view_epsilon_lower(scores: Any, included: Any, delta: float, confidence: float = 0.95) -> tuple[float, float, str]:
    """``(epsilon_lower, mu_lower, assumption_check)``: the Gaussian view's lower bound on epsilon at ``delta``.

    ``eps_{G_mu}(delta)`` at ``mu = gaussian_view_mu_lower(...)``; 0 (with the
    reason) where :func:`gaussian_view_assumption_holds` rejects the
    assumption. Holds with probability ``confidence`` when the assumption does.
    """
    d = check_delta_scalar("delta", delta, allow_zero=True)
    if d == 0.0:
        raise InvalidParameterError("the Gaussian view needs delta > 0 (a Gaussian mechanism is not pure DP).")
    holds, why = gaussian_view_assumption_holds(scores, included)
    if not holds:
        return 0.0, 0.0, why
    mu = gaussian_view_mu_lower(scores, included, confidence)
    if mu == 0.0:
        return 0.0, 0.0, why
    return float(gdp_epsilon(mu, d)), mu, why


def guess_and_count(scores: Any, included: Any, guesses: int) -> tuple[int, int]:
    """The auditor's guesses: "included" for the ``ceil(guesses/2)`` highest scores, "excluded" for the rest lowest.

    Returns ``(r, v)``: the number of guesses made and how many were right.
    Ties are broken by position (a stable sort), which does not depend on the
    inclusion bits.
    """
    s, b = _scores_and_bits(scores, included)
    m = s.size
    k = check_integer_count("guesses", guesses, 0)
    if k > m:
        raise InvalidParameterError(f"guesses must be at most the number of canaries ({m}), got {k}.")
    order = np.argsort(-s, kind="stable")
    k_plus = (k + 1) // 2
    k_minus = k - k_plus
    right = int(np.count_nonzero(b[order[:k_plus]]))
    if k_minus:
        right += int(np.count_nonzero(~b[order[m - k_minus:]]))
    return k, right


@dataclass(frozen=True)
class OneRunAuditResult:
    """A one-run lower bound on epsilon at ``delta``, holding with probability ``confidence``.

    ``epsilon_lower`` is the largest bound over every (analysis, number of
    guesses) pair tried, each tried at ``(1 - confidence) / tests``
    (Bonferroni); ``guesses`` and ``correct`` are the pair that gave it.
    ``tests`` lists every pair with its bound.
    """

    epsilon_lower: float
    delta: float
    confidence: float
    canaries: int
    included: int
    guesses: int
    correct: int
    analysis: str
    tests: tuple[dict[str, Any], ...] = field(default_factory=tuple)

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["tests"] = [dict(t) for t in self.tests]
        return out


def _default_guess_counts(m: int) -> tuple[int, ...]:
    """Numbers of guesses tried: powers of two (and m), at least 2 — about log2(m) tests."""
    counts = {min(2 ** j, m) for j in range(1, max(1, int(math.log2(max(m, 2)))) + 1)}
    counts.add(m)
    return tuple(sorted(c for c in counts if c >= 1))


def audit_one_run(
    scores: Any,
    included: Any,
    delta: float,
    *,
    confidence: float = 0.95,
    guess_counts: Sequence[int] | None = None,
    gaussian_claim: bool = False,
    gaussian_view: bool = False,
) -> OneRunAuditResult:
    """Lower bound on epsilon at ``delta`` from one run's canary ``scores`` and their true inclusion bits.

    ``scores[i]`` is the auditor's belief that canary ``i`` was included
    (higher = more likely); ``included[i]`` whether it was. For every number of
    guesses in ``guess_counts`` (default: powers of two up to m) the auditor
    guesses as :func:`guess_and_count` does and Steinke et al.'s analysis is
    applied; with ``gaussian_claim=True`` (the certified mechanism is a
    Gaussian mechanism or a composition of them, as full-batch DP-SGD) the
    Gaussian f-DP analysis too; with ``gaussian_view=True`` (the scores are
    Gaussian by construction, as in full-batch DP-SGD with Dirac canaries) the
    Gaussian view as one more test, which uses every score rather than a
    number of guesses (its entry in ``tests`` records ``mu_lower`` and the
    assumption check). The confidence is split over all those tests.
    """
    b = np.asarray(included)
    s = np.asarray(scores, dtype=np.float64)
    m = int(s.size)
    if m < 1:
        raise InvalidParameterError("scores must hold at least one canary's score.")
    d = check_delta_scalar("delta", delta, allow_zero=True)
    conf = check_confidence(confidence)
    counts = _default_guess_counts(m) if guess_counts is None else tuple(check_integer_count("guess_counts", c, 1) for c in guess_counts)
    if not counts or max(counts) > m:
        raise InvalidParameterError(f"guess_counts must be non-empty integers in [1, {m}] (the number of canaries); got {guess_counts!r}.")
    analyses = ("steinke", "gaussian_fdp") if gaussian_claim else ("steinke",)
    if gaussian_claim and d == 0.0:
        raise InvalidParameterError("gaussian_claim needs delta > 0 (a Gaussian mechanism is not pure DP).")
    if gaussian_view and d == 0.0:
        raise InvalidParameterError("gaussian_view needs delta > 0 (a Gaussian mechanism is not pure DP).")
    n_tests = len(counts) * len(analyses) + int(gaussian_view)
    per_test_confidence = 1.0 - (1.0 - conf) / n_tests
    tests = []
    if gaussian_view:
        eps, mu, check = gaussian_view_epsilon_lower(s, b, d, per_test_confidence)
        r, v = guess_and_count(s, b, m)
        tests.append({"analysis": "gaussian_view", "guesses": r, "correct": v, "epsilon_lower": eps,
                      "mu_lower": mu, "assumption": GAUSSIAN_VIEW_ASSUMPTION, "assumption_check": check})
    for k in counts:
        r, v = guess_and_count(s, b, k)
        for analysis in analyses:
            if analysis == "steinke":
                eps = one_run_epsilon_lower(m, r, v, d, per_test_confidence)
            else:
                eps = gaussian_fdp_epsilon_lower(m, r, v, d, per_test_confidence)
            tests.append({"analysis": analysis, "guesses": r, "correct": v, "epsilon_lower": eps})
    best = max(tests, key=lambda t: t["epsilon_lower"])
    return OneRunAuditResult(
        epsilon_lower=float(best["epsilon_lower"]),
        delta=d,
        confidence=conf,
        canaries=m,
        included=int(np.count_nonzero(b.astype(bool))),
        guesses=int(best["guesses"]),
        correct=int(best["correct"]),
        analysis=str(best["analysis"]),
        tests=tuple(tests),
    )
