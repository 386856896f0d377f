"""DP-SGD accounting: epsilon of a run, and the smallest noise multiplier for a target epsilon.

A DP-SGD run with noise multiplier z (noise std / clipping norm), Poisson
sampling rate q and T steps is T adaptive compositions of the Poisson-subsampled
Gaussian mechanism (Abadi et al. 2016, Alg. 1). Its epsilon comes from the
accountants of :mod:`dpcl.accounting.accountants` (dp-accounting PLD/RDP,
prv-accountant); the tests cross-check them with opacus' own accountants.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, Callable, Sequence

from dpcl.accounting.accountants import AccountingResult, compute_epsilon, get_accountant, settings_key
from dpcl.accounting.accountants.auto import _auto_pld_start, _pld_refined
from dpcl.accounting.accountants.base import collect
from dpcl.accounting.accountants.compute import _auto_epsilon, _check_accountant
from dpcl.accounting.accountants.memo import _Memo
from dpcl.accounting.accountants.pld import _pld
from dpcl.accounting.events import (
    MAX_SAMPLED_STEPS,
    STEPS_HINT,
    Adjacency,
    ComposedEvent,
    PoissonSampledGaussianEvent,
    RepeatedEvent,
)
from dpcl.accounting.noise_search import search_noise_multiplier
from dpcl.accounting.validation import check_count, check_delta_scalar, check_positive_scalar, check_sample_rate
from dpcl.accounting import work as _work
from dpcl.errors import InvalidParameterError, UnsupportedEventError

__all__ = [
    "NoiseCalibration",
    "StreamNoiseCalibration",
    "dpsgd_epsilon",
    "dpsgd_events",
    "dpsgd_noise_multiplier",
    "dpsgd_stream_events",
    "dpsgd_stream_noise_multiplier",
]

#: Noise multipliers searched by :func:`dpsgd_noise_multiplier`.
MIN_NOISE_MULTIPLIER = 1e-3
MAX_NOISE_MULTIPLIER = 1e4


def dpsgd_events(
    noise_multiplier: float,
    sample_rate: float,
    steps: int,
    adjacency: Adjacency | str = "add_remove",
    unit: str = "example",
) -> RepeatedEvent:
    """The events of a DP-SGD run: ``steps`` repetitions of one Poisson-subsampled Gaussian step."""
    step = PoissonSampledGaussianEvent(
        noise_multiplier=noise_multiplier, sample_rate=sample_rate, adjacency=adjacency, unit=unit
    )
    return RepeatedEvent(step, _check_steps(steps))


def _check_steps(steps: Any) -> int:
    return check_count("steps", steps, maximum=MAX_SAMPLED_STEPS, hint=STEPS_HINT)


def dpsgd_epsilon(
    noise_multiplier: float,
    sample_rate: float,
    steps: int,
    delta: float,
    accountant: str = "auto",
    adjacency: Adjacency | str = "add_remove",
    unit: str = "example",
) -> AccountingResult:
    """Upper bound on epsilon of a DP-SGD run at ``delta`` (see :func:`compute_epsilon`)."""
    return compute_epsilon(dpsgd_events(noise_multiplier, sample_rate, steps, adjacency, unit), delta, accountant)


@dataclass(frozen=True)
class NoiseCalibration:
    """Result of :func:`dpsgd_noise_multiplier`: the noise multiplier, the epsilon it achieves, the accountant."""

    noise_multiplier: float
    epsilon: float
    accountant: str
    delta: float = 0.0
    sample_rate: float = 1.0
    steps: int = 1

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def dpsgd_noise_multiplier(
    target_epsilon: float,
    delta: float,
    sample_rate: float,
    steps: int,
    accountant: str = "auto",
    adjacency: Adjacency | str = "add_remove",
    rtol: float = 1e-3,
) -> NoiseCalibration:
    """Smallest noise multiplier (to ``rtol`` relative) whose DP-SGD run is (target_epsilon, delta)-DP.

    The returned multiplier z is one whose epsilon was computed by ``accountant`` (``auto``: the plain
    ``compute_epsilon(events, delta, "auto")`` every ledger computes) and is <= ``target_epsilon``; that
    epsilon is returned. A multiplier at most ``rtol`` smaller was evaluated and misses the target (the
    search keeps the root bracketed), except where the search ends at its limits: it covers
    [MIN_NOISE_MULTIPLIER, MAX_NOISE_MULTIPLIER]; a target that needs more noise is refused; one met with
    less stops at the last multiplier tried, which meets it but is not the smallest.

    Search (:func:`_search`): a safeguarded secant on (log z, log epsilon - log target), which is close
    to linear, that aims a quarter of the tolerance beyond each predicted root so that the bracket
    closes in few evaluations. It starts from the root of a coarse pessimistic PLD (interval
    :func:`_coarse_interval`, cheap) and its slope. With ``accountant="auto"`` the search evaluates
    only dp-accounting's pessimistic PLD at the interval auto's refinement reaches at the starting
    point (to a :data:`CALIBRATION_PLD_TOLERANCE` change); then plain ``auto`` is evaluated at the
    result and the search continues on it until it meets the target. Where another of auto's
    candidates (RDP, advanced, basic, PRV) could be tighter at the result, or the PLD is refused or
    does not converge, every step evaluates ``auto`` in full instead (:func:`_calibrate_auto_full`).

    Calibrations are memoised in this process (:data:`CALIBRATION_MEMO`), keyed on every argument and
    every module setting: tasks of equal size are calibrated once, whichever accountant.

    A search that has spent :data:`~dpcl.accounting.work.CALIBRATION_TIME_BUDGET_S` seconds of processor time is
    refused with :class:`~dpcl.errors.WorkLimitError` (exit code 2 in the CLI) naming the inputs and suggesting
    ``accountant='rdp'`` (see :mod:`dpcl.accounting.work`).
    """
    target = check_positive_scalar("target_epsilon", target_epsilon)
    delta = check_delta_scalar("delta", delta)
    q = check_sample_rate("sample_rate", sample_rate)
    steps = _check_steps(steps)
    PoissonSampledGaussianEvent(noise_multiplier=1.0, sample_rate=q)  # the same limits as the events searched
    name = _check_accountant(accountant)
    rtol = check_positive_scalar("rtol", rtol)
    if rtol >= 0.5:
        raise InvalidParameterError(f"rtol must be < 0.5, got {rtol!r}.")
    relation = Adjacency.parse(adjacency)
    key = (target, delta, q, steps, name, get_accountant(name), relation.value, rtol, _calibration_settings())
    cached = CALIBRATION_MEMO.get(key)
    if cached is not None:
        return cached
    with _calibration_budget(name, target, delta, f"sample_rate={q!r}, steps={steps}"):
        # the coarse start pays off where each evaluation builds a PLD or PRV grid; the closed forms and RDP
        # (and auto at q = 1, where exact accounting applies) start at z = 1
        costly = name in ("auto", "pld", "prv") and not (name == "auto" and q == 1.0)
        start, slope = _coarse_guess(target, delta, q, steps, relation) if costly else (1.0, -1.0)
        if name == "auto":
            z, result = _calibrate_auto(target, delta, q, steps, relation, rtol, start, slope)
        else:
            def evaluate(z: float) -> AccountingResult:
                return compute_epsilon(dpsgd_events(z, q, steps, relation), delta, name)

            z, result, _ = _search(evaluate, target, delta, q, steps, rtol, start=start, slope=slope)
    calibration = _calibration(z, result, q, steps)
    CALIBRATION_MEMO.put(key, calibration)
    return calibration


def _calibration_budget(name: str, target: float, delta: float, inputs: str) -> Any:
    """The processor-time budget of a calibration's search (issue 18: an answer within 60 s, or a refusal with
    :class:`~dpcl.errors.WorkLimitError` naming the inputs; :mod:`dpcl.accounting.work`)."""
    question = f"calibrating accountant {name!r} to target_epsilon={target!r} (delta={delta!r}, {inputs})"
    hint = (
        "use accountant='rdp' (a calibration of about a second, a little more noise), or a larger target_epsilon"
        if name != "rdp" else "use a larger target_epsilon or fewer steps"
    )
    return _work.time_budget(_work.CALIBRATION_TIME_BUDGET_S, question, hint)


@dataclass(frozen=True)
class StreamNoiseCalibration:
    """Result of :func:`dpsgd_stream_noise_multiplier`: one noise multiplier for several composed DP-SGD runs."""

    noise_multiplier: float
    epsilon: float
    accountant: str
    delta: float
    #: the (sample_rate, steps) of every run composed, in order
    runs: tuple[tuple[float, int], ...]

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "runs": [{"sample_rate": q, "steps": t} for q, t in self.runs]}


def dpsgd_stream_events(
    noise_multiplier: float,
    runs: Sequence[tuple[float, int]],
    adjacency: Adjacency | str = "add_remove",
    unit: str = "example",
) -> ComposedEvent:
    """The events of several DP-SGD runs at one noise multiplier, composed: ``runs`` holds (sample_rate, steps)."""
    return ComposedEvent([dpsgd_events(noise_multiplier, q, t, adjacency, unit) for q, t in runs])


def dpsgd_stream_noise_multiplier(
    target_epsilon: float,
    delta: float,
    runs: Sequence[tuple[float, int]],
    accountant: str = "auto",
    adjacency: Adjacency | str = "add_remove",
    rtol: float = 1e-3,
) -> StreamNoiseCalibration:
    """Smallest noise multiplier (to ``rtol`` relative) at which the DP-SGD ``runs``, composed, are (target, delta)-DP.

    ``runs`` lists the (sample_rate, steps) of every DP-SGD run that reads one privacy unit, e.g. an
    example kept in a replay buffer or an episodic memory, which its own task's run and every later
    task's run read (each with that task's sampling rate and steps). Every run uses the returned
    multiplier; the epsilon returned is ``compute_epsilon(dpsgd_stream_events(z, runs), delta,
    accountant)`` -- what a ledger charging those runs to that unit computes -- and is <= the target. A
    multiplier at most ``rtol`` smaller was evaluated and misses it. One run is
    :func:`dpsgd_noise_multiplier`'s question (same search, :func:`_search`, here on the composed
    events); the search starts from that answer for the run with the largest single-run epsilon (a lower
    bound: composing more runs never lowers epsilon). Memoised in :data:`CALIBRATION_MEMO`. Like any
    calibration, it refuses with :class:`~dpcl.errors.WorkLimitError` after
    :data:`~dpcl.accounting.work.CALIBRATION_TIME_BUDGET_S` seconds of processor time.
    """
    target = check_positive_scalar("target_epsilon", target_epsilon)
    delta = check_delta_scalar("delta", delta)
    if isinstance(runs, (str, bytes)) or not isinstance(runs, Sequence) or not runs:
        raise InvalidParameterError(
            f"runs must be a non-empty list of (sample_rate, steps) pairs, one per DP-SGD run, got {runs!r}."
        )
    checked = []
    for i, run in enumerate(runs):
        if not isinstance(run, Sequence) or isinstance(run, (str, bytes)) or len(run) != 2:
            raise InvalidParameterError(f"runs[{i}] must be a (sample_rate, steps) pair, got {run!r}.")
        checked.append((check_sample_rate(f"runs[{i}] sample_rate", run[0]), _check_steps(run[1])))
    name = _check_accountant(accountant)
    rtol = check_positive_scalar("rtol", rtol)
    if rtol >= 0.5:
        raise InvalidParameterError(f"rtol must be < 0.5, got {rtol!r}.")
    relation = Adjacency.parse(adjacency)
    plan = tuple(checked)
    key = ("stream", target, delta, plan, name, get_accountant(name), relation.value, rtol, _calibration_settings())
    cached = CALIBRATION_MEMO.get(key)
    if cached is not None:
        return cached
    with _calibration_budget(name, target, delta, f"{len(plan)} composed DP-SGD runs, (sample_rate, steps) {plan!r:.200}"):
        # the heaviest single run's multiplier: the composition needs at least that much noise
        single = max(
            (dpsgd_noise_multiplier(target, delta, q, t, name, relation, rtol) for q, t in dict.fromkeys(plan)),
            key=lambda c: c.noise_multiplier,
        )

        def evaluate(z: float) -> AccountingResult:
            return compute_epsilon(dpsgd_stream_events(z, plan, relation), delta, name)

        q_max, total_steps = max(q for q, _ in plan), sum(t for _, t in plan)
        z, result, _ = _search(evaluate, target, delta, q_max, total_steps, rtol, start=single.noise_multiplier)
    calibration = StreamNoiseCalibration(
        noise_multiplier=z, epsilon=result.epsilon, accountant=result.accountant, delta=result.delta, runs=plan
    )
    CALIBRATION_MEMO.put(key, calibration)
    return calibration


#: ``auto`` calibration refines its PLD until one refinement changes epsilon by at most this.
CALIBRATION_PLD_TOLERANCE = 0.002
#: The coarse PLD that gives the search its start: interval target / this, clipped to the range below.
COARSE_PLD_RESOLUTION = 100.0
COARSE_PLD_INTERVAL_RANGE = (1e-3, 1e-2)
#: ... or finer, where the discretisation error predicted from the events (``_auto_pld_start``) exceeds about this.
COARSE_PLD_TOLERANCE = 0.02
#: Memo of :func:`dpsgd_noise_multiplier` (in this process only; values are frozen ``NoiseCalibration``).
CALIBRATION_MEMO = _Memo(1024)


def _calibration_settings() -> tuple[Any, ...]:
    """Every module setting (and search function) a calibration depends on, for its memo key."""
    return (
        MIN_NOISE_MULTIPLIER, MAX_NOISE_MULTIPLIER, CALIBRATION_PLD_TOLERANCE, COARSE_PLD_RESOLUTION,
        COARSE_PLD_INTERVAL_RANGE, COARSE_PLD_TOLERANCE, _search, _coarse_guess, _calibrate_auto, _calibrate_auto_full, settings_key(),
    )


@dataclass(frozen=True)
class _Epsilon:
    """A bare epsilon in the shape of an :class:`AccountingResult` (search-internal evaluations)."""

    epsilon: float


def _mechanisms(z: float, q: float, steps: int, relation: Adjacency) -> Any:
    return collect(dpsgd_events(z, q, steps, relation))


def _coarse_interval(target: float) -> float:
    lo, hi = COARSE_PLD_INTERVAL_RANGE
    return min(max(target / COARSE_PLD_RESOLUTION, lo), hi)


def _coarse_guess(target: float, delta: float, q: float, steps: int, relation: Adjacency) -> tuple[float, float]:
    """Start and slope d log(eps) / d log(z) for the search: the root of a coarse pessimistic PLD (to 2 %).

    Only a starting point: every multiplier returned is evaluated by the accountant asked for. Where the
    coarse PLD cannot be evaluated (refused grid, floating point), the search starts at z = 1, slope -1.
    """
    interval = _coarse_interval(target)

    def coarse(z: float) -> _Epsilon:
        mech = _mechanisms(z, q, steps, relation)
        # at small sampling rates the coarse interval is far too coarse (q = 0.001: ~30 % at 1e-3, where the
        # root came out at z = 28 instead of 2): finer where the error predicted from the events asks for it
        return _Epsilon(_pld(mech, delta, _auto_pld_start(mech, None, COARSE_PLD_TOLERANCE, interval))[0])

    try:
        z, _, slope = _search(coarse, target, delta, q, steps, 0.02)
    except (UnsupportedEventError, InvalidParameterError):
        return 1.0, -1.0
    return z, slope


def _calibrate_auto(
    target: float, delta: float, q: float, steps: int, relation: Adjacency, rtol: float, start: float, slope: float,
) -> tuple[float, AccountingResult]:
    """``auto`` calibration on PLD evaluations only, finished on plain ``auto`` (see :func:`dpsgd_noise_multiplier`)."""
    mech = _mechanisms(start, q, steps, relation)
    first = _auto_pld_start(mech, target, CALIBRATION_PLD_TOLERANCE)
    try:
        _, _, info = _pld_refined(mech, delta, first, tolerance=CALIBRATION_PLD_TOLERANCE)
    except UnsupportedEventError:
        return _calibrate_auto_full(target, delta, q, steps, relation, rtol, start, slope)
    if not info.stopped.startswith("converged"):
        return _calibrate_auto_full(target, delta, q, steps, relation, rtol, start, slope)
    interval = info.interval
    seed = {start: _Epsilon(next(e for h, e, _ in info.steps if h == interval))}

    def pld_at_interval(z: float) -> _Epsilon:
        return _Epsilon(_pld(_mechanisms(z, q, steps, relation), delta, interval)[0])

    try:
        z, _, slope = _search(pld_at_interval, target, delta, q, steps, rtol, start=start, slope=slope, seed=seed)
    except UnsupportedEventError:
        return _calibrate_auto_full(target, delta, q, steps, relation, rtol, start, slope)
    plain = dpsgd_epsilon(z, q, steps, delta, "auto", relation)
    others = [v for k, v in plain.candidates.items() if k != "pld"]
    if "pld" not in plain.candidates or (others and min(others) < target):
        # another candidate may meet the target with less noise: search on auto itself
        return _calibrate_auto_full(target, delta, q, steps, relation, rtol, z, slope)
    return _finish_on_plain_auto(z, plain, target, delta, q, steps, relation, rtol, slope)


def _finish_on_plain_auto(
    z: float, plain: AccountingResult, target: float, delta: float, q: float, steps: int, relation: Adjacency,
    rtol: float, slope: float,
) -> tuple[float, AccountingResult]:
    """Plain ``auto`` must meet the target at the multiplier returned; where it (its own PLD refinement) is a
    little above the target, the search continues on plain ``auto`` itself, starting from ``z``."""
    if plain.epsilon <= target:
        return z, plain

    def plain_auto(z: float) -> AccountingResult:
        return dpsgd_epsilon(z, q, steps, delta, "auto", relation)

    z, result, _ = _search(plain_auto, target, delta, q, steps, rtol, start=z, slope=slope, seed={z: plain})
    return z, result


def _calibrate_auto_full(
    target: float, delta: float, q: float, steps: int, relation: Adjacency, rtol: float, start: float, slope: float,
) -> tuple[float, AccountingResult]:
    """``auto`` calibration evaluating ``auto`` in full at every step.

    Its PLD interval is refined once at ``start`` (to a :data:`CALIBRATION_PLD_TOLERANCE` change) and
    then held fixed during the search (a fixed pessimistic interval is still an upper bound); at the
    multiplier found the refinement is repeated, and the search is redone at the finer interval if it
    asks for one. Finally plain ``auto`` must meet the target at the multiplier returned.
    """
    _, pld_interval = _auto_epsilon(dpsgd_events(start, q, steps, relation), delta, tolerance=CALIBRATION_PLD_TOLERANCE)

    def evaluate(z: float) -> AccountingResult:
        events = dpsgd_events(z, q, steps, relation)
        if pld_interval is None:
            return _auto_epsilon(events, delta, tolerance=CALIBRATION_PLD_TOLERANCE)[0]
        return _auto_epsilon(events, delta, pld_interval=pld_interval)[0]

    z, result, slope = _search(evaluate, target, delta, q, steps, rtol, start=start, slope=slope)
    if pld_interval is not None:
        refined, finer = _auto_epsilon(dpsgd_events(z, q, steps, relation), delta, tolerance=CALIBRATION_PLD_TOLERANCE)
        if finer is not None and finer < pld_interval / 1.9:
            pld_interval = finer
            z, result, slope = _search(evaluate, target, delta, q, steps, rtol, start=z, slope=slope)
    plain = dpsgd_epsilon(z, q, steps, delta, "auto", relation)
    return _finish_on_plain_auto(z, plain, target, delta, q, steps, relation, rtol, slope)


def _search(
    evaluate: Callable[[float], Any], target: float, delta: float, q: float, steps: int, rtol: float,
    start: float = 1.0, slope: float = -1.0, seed: dict[float, Any] | None = None,
) -> tuple[float, Any, float]:
    """:func:`~dpcl.accounting.noise_search.search_noise_multiplier` between :data:`MIN_NOISE_MULTIPLIER` and
    :data:`MAX_NOISE_MULTIPLIER`: (z, its evaluation, the last slope estimate)."""
    return search_noise_multiplier(evaluate, target, delta, q, steps, rtol, start=start, slope=slope, seed=seed,
                                   z_range=(MIN_NOISE_MULTIPLIER, MAX_NOISE_MULTIPLIER))


def _calibration(z: float, result: AccountingResult, q: float, steps: int) -> NoiseCalibration:
    return NoiseCalibration(
        noise_multiplier=z, epsilon=result.epsilon, accountant=result.accountant,
        delta=result.delta, sample_rate=q, steps=steps,
    )
