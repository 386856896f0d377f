"""Black-box auditor: a high-confidence lower bound on epsilon from output samples.

Hypothesis-testing view of DP (Kairouz, Oh & Viswanath 2015, Thm 2.1; Wasserman
& Zhou 2010): a mechanism ``M`` is (epsilon, delta)-DP for the neighbouring pair
``(D, D')`` only if every measurable set ``S`` satisfies

    P[M(D) in S]  <= e^epsilon P[M(D') in S]  + delta     and
    P[M(D') in S] <= e^epsilon P[M(D) in S]   + delta.

For a distinguishing test "say D' when score(output) > t" with false-positive
rate ``FPR = P[score(M(D)) > t]`` and false-negative rate
``FNR = P[score(M(D')) <= t]``, applying the two inequalities to the sets
``{score <= t}`` and ``{score > t}`` gives ``FPR + e^eps FNR >= 1 - delta`` and
``FNR + e^eps FPR >= 1 - delta``, hence

    epsilon >= max(log((1 - delta - FPR) / FNR), log((1 - delta - FNR) / FPR)).

The auditor evaluates the four inequalities "P_x(S) <= e^eps P_y(S) + delta" for
``S`` in ``{score > t}``, ``{score <= t}`` and ``(x, y)`` in ``{(D, D'), (D', D)}``
(so a score that points the "wrong way" still works), replaces each probability
by a one-sided Clopper–Pearson bound in the conservative direction (lower bound
on ``P_x(S)``, upper bound on ``P_y(S)``) and reports
``log((P_x(S)_lb - delta) / P_y(S)_ub)``, floored at 0 (epsilon >= 0 always).

Two ways to choose the threshold, both sound (the statement holds with
probability >= 1 - alpha over the samples):

* ``selection="split"`` (default): the samples of each input are split in two
  independent halves. The threshold and the inequality are chosen on the first
  half (maximising the same Clopper–Pearson bound), and the bound is computed
  only on the second half, where the choice is a fixed, data-independent test.
  Two one-sided bounds are used, each at level ``alpha / 2`` (Bonferroni).
* ``thresholds=<array>`` (a grid fixed *before* seeing the samples): all samples
  are used for every threshold; each of the ``4 K`` one-sided bounds (lower and
  upper for ``P[M(D) in {score > t}]`` and ``P[M(D') in {score > t}]`` at ``K``
  thresholds) is taken at level ``alpha / (4 K)``, so all hold simultaneously
  and the maximum over the grid is a valid lower bound.

Counting is vectorised: scores are sorted once and the counts at every
candidate threshold come from :func:`numpy.searchsorted`.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any, Callable, Protocol

import numpy as np

from dpcl.audit.clopper_pearson import clopper_pearson_lower, clopper_pearson_upper
from dpcl.errors import InvalidParameterError

#: Largest number of trials per input accepted by the sampler audits (a time limit more than a memory one).
MAX_TRIALS = 100_000_000

#: Most outputs per input held in memory to choose the threshold (about 80 MB each as float64).
MAX_SELECTION_TRIALS = 10_000_000

#: The threshold is chosen with Clopper-Pearson bounds at ``alpha * SELECTION_LEVEL_FACTOR``
#: (more conservative than the final bound; any choice on the selection half is sound).
SELECTION_LEVEL_FACTOR = 0.01

#: Names of the four tested inequalities ``P_x(S) <= e^eps P_y(S) + delta``.
INEQUALITIES = ("D>t vs D'", "D'>t vs D", "D<=t vs D'", "D'<=t vs D")


class Sampler(Protocol):
    """Draws ``size`` independent outputs of a mechanism on a fixed input."""

    def __call__(self, size: int, rng: np.random.Generator) -> np.ndarray: ...


ScoreFunction = Callable[[np.ndarray], np.ndarray]


@dataclass(frozen=True)
class AuditResult:
    """A lower bound ``epsilon_lower_bound`` on epsilon at ``delta``, valid with probability ``confidence``.

    ``threshold`` and ``inequality`` describe the test that achieved it (one of
    :data:`INEQUALITIES`); ``set_probability_lower`` and ``set_probability_upper``
    are the Clopper–Pearson bounds that entered ``log((lower - delta) / upper)``.
    ``trials`` is the number of outputs drawn *per input*; ``bound_trials`` of
    them (per input) were used for the bound.
    """

    epsilon_lower_bound: float
    delta: float
    confidence: float
    selection: str
    threshold: float
    inequality: str
    set_probability_lower: float
    set_probability_upper: float
    false_positive_rate: float
    false_negative_rate: float
    trials: int
    bound_trials: int

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def check_unit_interval(name: str, value: Any, *, zero_allowed: bool = False, example: str | None = None) -> float:
    """``value`` as a float in (0, 1) (``[0, 1)`` with ``zero_allowed``). A boolean, a non-number, NaN/inf or a
    number outside raises :class:`InvalidParameterError` naming ``name`` and the interval (and ``example``, where
    given, for a value that is not a number in it)."""
    interval = "[0, 1)" if zero_allowed else "(0, 1)"
    try:
        x = float(value)
    except (TypeError, ValueError):
        raise InvalidParameterError(f"{name} must be a number in {interval}, got {value!r}.") from None
    inside = (0.0 <= x if zero_allowed else 0.0 < x) and x < 1.0
    if isinstance(value, bool) or not math.isfinite(x) or not inside:
        hint = f", e.g. {example};" if example else ","
        raise InvalidParameterError(f"{name} must be a number in {interval}{hint} got {value!r}.")
    return x


def check_audit_delta(delta: Any) -> float:
    """The delta at which an audit bounds epsilon, in [0, 1) (0: pure DP); returns it as a float."""
    return check_unit_interval("delta", delta, zero_allowed=True)


def check_confidence(confidence: Any) -> float:
    """Confidence level in (0, 1); returns it as a float."""
    return check_unit_interval("confidence", confidence, example="0.95")


def check_trials(trials: Any, *, minimum: int = 4) -> int:
    """Number of outputs per input: an integer in [minimum, MAX_TRIALS]."""
    if isinstance(trials, bool) or not isinstance(trials, (int, np.integer)):
        raise InvalidParameterError(f"trials must be an integer in [{minimum}, {MAX_TRIALS}], got {trials!r}.")
    t = int(trials)
    if not minimum <= t <= MAX_TRIALS:
        raise InvalidParameterError(
            f"trials must be an integer in [{minimum}, {MAX_TRIALS}] (outputs drawn per input; "
            f"the upper limit bounds the run time), got {t}."
        )
    return t


def check_seed(seed: Any, *, allow_none: bool = False) -> int | None:
    """Seed of the random draws: a non-negative integer (or ``None`` where fresh entropy is allowed)."""
    if seed is None and allow_none:
        return None
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
        allowed = "a non-negative integer" + (" or None" if allow_none else "")
        raise InvalidParameterError(f"seed must be {allowed}, got {seed!r}.")
    return int(seed)


def epsilon_from_error_rates(false_positive_rate: Any, false_negative_rate: Any, delta: float) -> float | np.ndarray:
    """``max(log((1 - delta - FPR) / FNR), log((1 - delta - FNR) / FPR), 0)`` (Kairouz et al. 2015, Thm 2.1).

    With *upper* confidence bounds on FPR and FNR that hold jointly with
    probability 1 - alpha, the result is a lower bound on epsilon at ``delta``
    with the same probability. Vectorised over the rates.
    """
    fpr = np.asarray(false_positive_rate, dtype=np.float64)
    fnr = np.asarray(false_negative_rate, dtype=np.float64)
    d = check_audit_delta(delta)
    if np.any(~np.isfinite(fpr)) or np.any(~np.isfinite(fnr)) or np.any((fpr < 0) | (fpr > 1) | (fnr < 0) | (fnr > 1)):
        raise InvalidParameterError("false_positive_rate and false_negative_rate must lie in [0, 1].")
    with np.errstate(divide="ignore", invalid="ignore"):
        a = np.where(1 - d - fpr > 0, np.log(np.maximum(1 - d - fpr, 1e-300)) - np.log(fnr), -np.inf)
        b = np.where(1 - d - fnr > 0, np.log(np.maximum(1 - d - fnr, 1e-300)) - np.log(fpr), -np.inf)
    out = np.maximum(np.maximum(a, b), 0.0)
    return float(out) if out.ndim == 0 else out


def _inequality_bounds(
    above_d: np.ndarray, n_d: int, above_dp: np.ndarray, n_dp: int, delta: float, alpha: float
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """epsilon lower bounds of shape (4, K) for counts of scores above each of K thresholds.

    Returns (epsilons, lower bounds on P_x(S), upper bounds on P_y(S)), each (4, K),
    rows ordered as :data:`INEQUALITIES`.
    """
    below_d = n_d - above_d
    below_dp = n_dp - above_dp
    # (count of P_x(S), n_x, count of P_y(S), n_y) for the four inequalities
    kx = np.stack([above_d, above_dp, below_d, below_dp]).astype(np.float64)
    nx = np.array([n_d, n_dp, n_d, n_dp], dtype=np.float64)[:, None]
    ky = np.stack([above_dp, above_d, below_dp, below_d]).astype(np.float64)
    ny = np.array([n_dp, n_d, n_dp, n_d], dtype=np.float64)[:, None]
    lower = clopper_pearson_lower(kx, np.broadcast_to(nx, kx.shape), alpha)
    upper = clopper_pearson_upper(ky, np.broadcast_to(ny, ky.shape), alpha)
    with np.errstate(divide="ignore"):
        eps = np.where(lower > delta, np.log(np.maximum(lower - delta, 1e-300)) - np.log(upper), -np.inf)
    return eps, lower, upper


def _candidate_thresholds(sorted_pooled: np.ndarray, max_candidates: int = 2000) -> np.ndarray:
    """Thresholds at pooled-score ranks: a linear grid plus geometric grids towards both tails."""
    m = sorted_pooled.size
    half = max_candidates // 4
    linear = np.linspace(0, m - 1, num=min(m, max_candidates // 2))
    geometric = np.geomspace(1, max(m / 2, 1), num=half)
    ranks = np.concatenate([linear, geometric - 1, m - geometric])
    ranks = np.unique(np.clip(np.round(ranks), 0, m - 1).astype(np.int64))
    return np.unique(sorted_pooled[ranks])


def _as_scores(name: str, values: Any, score: ScoreFunction | None) -> np.ndarray:
    array = np.asarray(values)
    if score is not None:
        array = np.asarray(score(array))
    elif array.ndim > 1 and int(np.prod(array.shape[1:])) != 1:
        raise InvalidParameterError(
            f"{name} has shape {array.shape}: vector outputs need a score function mapping each output "
            "to one number (e.g. dpcl.audit.blackbox.linear_score(direction))."
        )
    if array.dtype == bool or not np.issubdtype(array.dtype, np.number):
        raise InvalidParameterError(
            f"scores of {name} must be numbers, got dtype {array.dtype}; return numeric outputs "
            "(e.g. outputs.astype(float)) or pass a score function that does."
        )
    scores = np.asarray(array, dtype=np.float64).reshape(array.shape[0] if array.ndim else 1, -1)
    if scores.shape[1] != 1:
        raise InvalidParameterError(f"the score function must return one number per output, got shape {array.shape}.")
    scores = scores[:, 0]
    if not np.all(np.isfinite(scores)):
        raise InvalidParameterError(f"scores of {name} contain NaN or inf; the score function must return finite numbers.")
    return scores


def linear_score(direction: Any) -> ScoreFunction:
    """Score ``<output, direction>`` for vector outputs (the likelihood-ratio test for additive Gaussian noise)."""
    v = np.asarray(direction, dtype=np.float64).ravel()
    if v.size == 0 or not np.all(np.isfinite(v)) or not np.any(v != 0):
        raise InvalidParameterError("direction must be a finite, non-zero vector.")

    def score(outputs: np.ndarray) -> np.ndarray:
        out = np.asarray(outputs, dtype=np.float64)
        return out.reshape(out.shape[0], -1) @ v

    return score


def _select(
    sel_d: np.ndarray, sel_dp: np.ndarray, n_bound_d: int, n_bound_dp: int, delta: float, alpha: float
) -> tuple[float, int]:
    """Choose (threshold, inequality index) on the selection half, maximising the bound the other half would give."""
    sd = np.sort(sel_d)
    sdp = np.sort(sel_dp)
    thresholds = _candidate_thresholds(np.sort(np.concatenate([sd, sdp])))
    above_d = sd.size - np.searchsorted(sd, thresholds, side="right")
    above_dp = sdp.size - np.searchsorted(sdp, thresholds, side="right")
    # Rates estimated on the selection half, scaled to the bound half's sample sizes, scored with a
    # 100x stricter level than the final bound: this penalises tail thresholds whose small counts look
    # good by chance (winner's curse), which made the bound on the other half unstable across seeds.
    k_d = np.round(above_d / sd.size * n_bound_d)
    k_dp = np.round(above_dp / sdp.size * n_bound_dp)
    eps, _, _ = _inequality_bounds(k_d, n_bound_d, k_dp, n_bound_dp, delta, alpha * SELECTION_LEVEL_FACTOR)
    row, col = np.unravel_index(int(np.argmax(eps)), eps.shape)
    return float(thresholds[col]), int(row)


def _rates(threshold: float, scores_d: np.ndarray, scores_dp: np.ndarray) -> tuple[int, int]:
    return int(np.count_nonzero(scores_d > threshold)), int(np.count_nonzero(scores_dp > threshold))


def _result(
    above_d: int, n_d: int, above_dp: int, n_dp: int, threshold: float, row: int,
    delta: float, confidence: float, alpha: float, selection: str, trials: int,
) -> AuditResult:
    eps, lower, upper = _inequality_bounds(
        np.array([above_d]), n_d, np.array([above_dp]), n_dp, delta, alpha
    )
    return AuditResult(
        epsilon_lower_bound=float(max(eps[row, 0], 0.0)),
        delta=delta,
        confidence=confidence,
        selection=selection,
        threshold=threshold,
        inequality=INEQUALITIES[row],
        set_probability_lower=float(lower[row, 0]),
        set_probability_upper=float(upper[row, 0]),
        false_positive_rate=above_d / n_d,
        false_negative_rate=(n_dp - above_dp) / n_dp,
        trials=trials,
        bound_trials=min(n_d, n_dp),
    )


def audit_scores(
    scores_d: Any,
    scores_d_prime: Any,
    delta: float,
    *,
    confidence: float = 0.95,
    thresholds: Any = None,
    seed: int | None = 0,
) -> AuditResult:
    """Lower bound on epsilon at ``delta`` from scalar scores of outputs of M(D) and M(D').

    The scores of each input must be independent draws of the mechanism (the
    Clopper–Pearson bounds assume i.i.d. Bernoulli indicators); their order
    does not matter, since the split into halves is a seeded random permutation.
    Without ``thresholds`` the samples of each input are randomly split (seeded
    by ``seed``) into a selection half and a bounding half (see module
    docstring). With ``thresholds`` (fixed before looking at the scores) every
    sample is used and the confidence is Bonferroni-corrected over the grid.
    """
    d = check_audit_delta(delta)
    conf = check_confidence(confidence)
    alpha = 1.0 - conf
    s_d = _as_scores("scores_d", scores_d, None)
    s_dp = _as_scores("scores_d_prime", scores_d_prime, None)
    if min(s_d.size, s_dp.size) < 4:
        raise InvalidParameterError("need at least 4 scores per input to audit.")
    seed = check_seed(seed, allow_none=True)
    trials = min(s_d.size, s_dp.size)
    if thresholds is not None:
        grid = np.unique(np.asarray(thresholds, dtype=np.float64).ravel())
        if grid.size == 0 or not np.all(np.isfinite(grid)):
            raise InvalidParameterError("thresholds must be a non-empty array of finite numbers.")
        a = alpha / (4 * grid.size)
        sd, sdp = np.sort(s_d), np.sort(s_dp)
        above_d = sd.size - np.searchsorted(sd, grid, side="right")
        above_dp = sdp.size - np.searchsorted(sdp, grid, side="right")
        eps, _, _ = _inequality_bounds(above_d, sd.size, above_dp, sdp.size, d, a)
        row, col = np.unravel_index(int(np.argmax(eps)), eps.shape)
        return _result(
            int(above_d[col]), sd.size, int(above_dp[col]), sdp.size, float(grid[col]), int(row),
            d, conf, a, f"fixed grid of {grid.size} thresholds (Bonferroni)", trials,
        )
    rng = np.random.default_rng(seed)
    perm_d = rng.permutation(s_d.size)
    perm_dp = rng.permutation(s_dp.size)
    h_d, h_dp = s_d.size // 2, s_dp.size // 2
    sel_d, bnd_d = s_d[perm_d[:h_d]], s_d[perm_d[h_d:]]
    sel_dp, bnd_dp = s_dp[perm_dp[:h_dp]], s_dp[perm_dp[h_dp:]]
    a = alpha / 2
    threshold, row = _select(sel_d, sel_dp, bnd_d.size, bnd_dp.size, d, a)
    above_d, above_dp = _rates(threshold, bnd_d, bnd_dp)
    return _result(above_d, bnd_d.size, above_dp, bnd_dp.size, threshold, row, d, conf, a, "split", trials)


def audit_outputs(
    outputs_d: Any,
    outputs_d_prime: Any,
    delta: float,
    *,
    score: ScoreFunction | None = None,
    confidence: float = 0.95,
    thresholds: Any = None,
    seed: int | None = 0,
) -> AuditResult:
    """:func:`audit_scores` on raw outputs; vector outputs need ``score`` (one number per output)."""
    return audit_scores(
        _as_scores("outputs_d", outputs_d, score),
        _as_scores("outputs_d_prime", outputs_d_prime, score),
        delta,
        confidence=confidence,
        thresholds=thresholds,
        seed=seed,
    )


def audit_sampler(
    sample_d: Sampler,
    sample_d_prime: Sampler,
    trials: int,
    delta: float,
    *,
    score: ScoreFunction | None = None,
    confidence: float = 0.95,
    seed: int = 0,
    chunk_size: int = 1_000_000,
    progress: Callable[[int], None] | None = None,
) -> AuditResult:
    """Draw ``trials`` outputs of M(D) and of M(D') and audit them (split selection).

    ``progress``, if given, is called with the number of outputs per input drawn since its last
    call (the selection part, then each chunk), so that the calls add up to ``trials``.

    The selection half and the bounding half are drawn by separate calls from
    independent streams (``numpy.random.SeedSequence(seed).spawn``), so they are
    independent by construction; the bounding half is drawn in chunks of
    ``chunk_size`` outputs and only counted, never stored. The selection part
    holds ``min(trials // 2, MAX_SELECTION_TRIALS)`` outputs per input (memory);
    any further trials go to the bounding part.
    """
    n = check_trials(trials)
    d = check_audit_delta(delta)
    conf = check_confidence(confidence)
    seed = check_seed(seed)
    if isinstance(chunk_size, bool) or not isinstance(chunk_size, (int, np.integer)) or chunk_size < 1:
        raise InvalidParameterError(f"chunk_size must be an integer >= 1 (outputs drawn per call), got {chunk_size!r}.")
    chunk_size = int(chunk_size)
    alpha = 1.0 - conf
    a = alpha / 2
    rng_sel_d, rng_sel_dp, rng_bnd_d, rng_bnd_dp = (
        np.random.default_rng(s) for s in np.random.SeedSequence(seed).spawn(4)
    )
    h = min(n // 2, MAX_SELECTION_TRIALS)
    sel_d = _as_scores("M(D) outputs", sample_d(h, rng_sel_d), score)
    sel_dp = _as_scores("M(D') outputs", sample_d_prime(h, rng_sel_dp), score)
    if sel_d.size != h or sel_dp.size != h:
        raise InvalidParameterError(f"a sampler asked for {h} outputs returned {sel_d.size} and {sel_dp.size}.")
    if progress is not None:
        progress(h)
    n_bound = n - h
    threshold, row = _select(sel_d, sel_dp, n_bound, n_bound, d, a)
    del sel_d, sel_dp
    above_d = above_dp = 0
    done = 0
    while done < n_bound:  # chunks of outputs, not examples: bounds memory for 10^8 trials
        size = min(chunk_size, n_bound - done)
        c_d = _as_scores("M(D) outputs", sample_d(size, rng_bnd_d), score)
        c_dp = _as_scores("M(D') outputs", sample_d_prime(size, rng_bnd_dp), score)
        if c_d.size != size or c_dp.size != size:
            raise InvalidParameterError(f"a sampler asked for {size} outputs returned {c_d.size} and {c_dp.size}.")
        k_d, k_dp = _rates(threshold, c_d, c_dp)
        above_d += k_d
        above_dp += k_dp
        done += size
        if progress is not None:
            progress(size)
    return _result(above_d, n_bound, above_dp, n_bound, threshold, row, d, conf, a, "split", n)
