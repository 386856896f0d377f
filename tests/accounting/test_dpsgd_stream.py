"""One noise multiplier for several composed DP-SGD runs (dpsgd_stream_noise_multiplier), checked against
dp-accounting's PLD and opacus' RDP accountant built directly on the same runs."""

from __future__ import annotations

import math

import pytest

from dpcl.accounting.accountants import compute_epsilon
from dpcl.accounting.dpsgd import (
    StreamNoiseCalibration,
    dpsgd_noise_multiplier,
    dpsgd_stream_events,
    dpsgd_stream_noise_multiplier,
)
from dpcl.errors import InvalidParameterError

DELTA = 1e-6
#: ER on the like-for-like stream: 96 own fortunes + 16 buffered per earlier task, batch 32, 3 epochs
ER_RUNS = [(32 / n, 3 * math.ceil(n / 32)) for n in (96, 112, 128, 144, 160)]


def _reference_pld(z: float, runs: list[tuple[float, int]], delta: float) -> float:
    """dp-accounting's PLD on the composed runs, built without dpcl (fine interval)."""
    import dp_accounting
    from dp_accounting.pld import pld_privacy_accountant

    event = dp_accounting.ComposedDpEvent([
        dp_accounting.SelfComposedDpEvent(dp_accounting.PoissonSampledDpEvent(q, dp_accounting.GaussianDpEvent(z)), t)
        for q, t in runs
    ])
    accountant = pld_privacy_accountant.PLDAccountant(value_discretization_interval=1e-4)
    return accountant.compose(event).get_epsilon(delta)


@pytest.mark.parametrize("target", [1.0, 8.0])
def test_stream_multiplier_meets_the_target_tightly_on_the_composition(target: float) -> None:
    cal = dpsgd_stream_noise_multiplier(target, DELTA, ER_RUNS)
    assert isinstance(cal, StreamNoiseCalibration) and cal.runs == tuple(ER_RUNS)
    assert cal.to_dict()["runs"][0] == {"sample_rate": ER_RUNS[0][0], "steps": ER_RUNS[0][1]}
    assert cal.epsilon <= target and cal.epsilon == pytest.approx(target, rel=5e-3)
    # what a ledger computes on the same events
    assert compute_epsilon(dpsgd_stream_events(cal.noise_multiplier, ER_RUNS), DELTA).epsilon == cal.epsilon
    # independent reference: meets the target at z (to its own discretisation), misses it with 1 % less noise
    assert _reference_pld(cal.noise_multiplier, ER_RUNS, DELTA) <= target * (1 + 1e-3)
    assert _reference_pld(cal.noise_multiplier * 0.99, ER_RUNS, DELTA) > target
    # more noise than any single run needs: composing runs never lowers epsilon
    single = max(dpsgd_noise_multiplier(target, DELTA, q, t).noise_multiplier for q, t in ER_RUNS)
    assert cal.noise_multiplier > single


def test_stream_multiplier_is_above_opacus_rdp_answer_never_below() -> None:
    """RDP is looser than PLD: opacus' RDP accountant at our multiplier states at least our epsilon."""
    from opacus.accountants import RDPAccountant

    cal = dpsgd_stream_noise_multiplier(1.0, DELTA, ER_RUNS)
    rdp = RDPAccountant()
    rdp.history = [(cal.noise_multiplier, q, t) for q, t in ER_RUNS]
    assert rdp.get_epsilon(DELTA) >= cal.epsilon


def test_one_run_is_the_single_run_calibration() -> None:
    one = dpsgd_stream_noise_multiplier(1.0, DELTA, [(0.25, 12)])
    single = dpsgd_noise_multiplier(1.0, DELTA, 0.25, 12)
    assert one.noise_multiplier == pytest.approx(single.noise_multiplier, rel=2e-3)
    assert one.epsilon <= 1.0


@pytest.mark.parametrize(
    "runs,match",
    [
        ([], "non-empty list"),
        ("abc", "non-empty list"),
        ([(0.1,)], r"runs\[0\] must be a \(sample_rate, steps\) pair"),
        ([(0.1, 10), (0.0, 10)], r"runs\[1\] sample_rate"),
        ([(1.5, 10)], "sample_rate"),
        ([(0.1, 0)], "steps"),
        ([(0.1, 2.5)], "steps"),
    ],
)
def test_invalid_runs_are_refused(runs, match: str) -> None:
    with pytest.raises(InvalidParameterError, match=match):
        dpsgd_stream_noise_multiplier(1.0, DELTA, runs)


@pytest.mark.parametrize(
    "kwargs,match",
    [(dict(target_epsilon=0.0), "target_epsilon"), (dict(delta=1.0), "delta"), (dict(accountant="x"), "accountant"),
     (dict(rtol=0.5), "rtol")],
)
def test_invalid_settings_are_refused(kwargs: dict, match: str) -> None:
    args = dict(target_epsilon=1.0, delta=DELTA, runs=[(0.1, 10)])
    args.update(kwargs)
    with pytest.raises(InvalidParameterError, match=match):
        dpsgd_stream_noise_multiplier(**args)


def test_a_stream_calibration_runs_under_the_calibration_time_budget(monkeypatch):
    """Issue 18: like a single run's, the stream's search refuses once its processor-time budget is spent."""
    from dpcl.accounting import work
    from dpcl.errors import WorkLimitError

    monkeypatch.setattr(work, "CALIBRATION_TIME_BUDGET_S", 0.0)
    with pytest.raises(WorkLimitError, match=r"calibrating accountant 'rdp'.*2 composed DP-SGD runs.*larger target_epsilon"):
        dpsgd_stream_noise_multiplier(3.21, 1e-5, [(0.013, 77), (0.021, 55)], accountant="rdp")
