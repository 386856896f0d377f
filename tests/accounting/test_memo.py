"""The in-process memo of epsilons and calibrations: a hit returns what a fresh computation returns, any
changed input misses, results cannot be changed through the memo, and calibrations still meet their target
under the accountant that certifies them (checked with dp-accounting directly, not with dpcl)."""

from __future__ import annotations

import math
import re

import pytest
from dp_accounting import dp_event
from dp_accounting.pld import pld_privacy_accountant
from dp_accounting.rdp import rdp_privacy_accountant

from dpcl.accounting import accountants, dpsgd
from dpcl.accounting.accountants import EPSILON_MEMO, clear_memo, compute_epsilon
from dpcl.accounting.dpsgd import CALIBRATION_MEMO, dpsgd_epsilon, dpsgd_events, dpsgd_noise_multiplier
from dpcl.accounting.events import ComposedEvent, GaussianEvent, HeterogeneousGaussianEvent, event_from_dict

DELTA = 1e-5


@pytest.fixture(autouse=True)
def fresh_memo():
    clear_memo()
    CALIBRATION_MEMO.clear()
    yield
    clear_memo()
    CALIBRATION_MEMO.clear()


def _fresh(events, delta, accountant):
    clear_memo()
    return compute_epsilon(events, delta, accountant)


def test_equal_events_in_any_form_hit_and_give_the_fresh_result() -> None:
    event = dpsgd_events(1.3, 0.02, 200)
    first = compute_epsilon(event, DELTA, "auto")
    misses = EPSILON_MEMO.misses
    for same in ([event], (event,), event_from_dict(event.to_dict()), [event_from_dict(event.to_dict())]):
        again = compute_epsilon(same, DELTA, "auto")
        assert again == first
    assert EPSILON_MEMO.misses == misses and EPSILON_MEMO.hits >= 4
    assert _fresh(event, DELTA, "auto") == first


def test_results_handed_out_cannot_change_the_memo() -> None:
    event = dpsgd_events(1.3, 0.02, 200)
    first = compute_epsilon(event, DELTA, "auto")
    first.candidates["pld"] = 0.0  # a caller scribbling on its copy
    again = compute_epsilon(event, DELTA, "auto")
    assert again.candidates["pld"] > 0 and again.candidates is not first.candidates
    with pytest.raises(AttributeError):
        again.epsilon = 0.0  # type: ignore[misc]


@pytest.mark.parametrize(
    "changed",
    [
        lambda: (dpsgd_events(math.nextafter(1.3, 2.0), 0.02, 200), DELTA, "auto"),
        lambda: (dpsgd_events(1.3, math.nextafter(0.02, 1.0), 200), DELTA, "auto"),
        lambda: (dpsgd_events(1.3, 0.02, 201), DELTA, "auto"),
        lambda: (dpsgd_events(1.3, 0.02, 200), math.nextafter(DELTA, 1.0), "auto"),
        lambda: (dpsgd_events(1.3, 0.02, 200), DELTA, "rdp"),
        lambda: (dpsgd_events(1.3, 0.02, 200, unit="user"), DELTA, "auto"),
        lambda: (dpsgd_events(1.3, 0.02, 200, adjacency="replace_one"), DELTA, "pld"),
        lambda: ([dpsgd_events(1.3, 0.02, 200), dpsgd_events(1.3, 0.02, 1)], DELTA, "auto"),
    ],
)
def test_any_changed_input_misses(changed) -> None:
    compute_epsilon(dpsgd_events(1.3, 0.02, 200), DELTA, "auto")
    events, delta, accountant = changed()
    misses = EPSILON_MEMO.misses
    result = compute_epsilon(events, delta, accountant)
    assert EPSILON_MEMO.misses == misses + 1
    assert result == _fresh(events, delta, accountant)


def test_gaussian_arrays_are_keyed_on_every_value() -> None:
    sigmas = [1.0 + i / 1000 for i in range(2000)]  # larger than the inline key: keyed by digest
    base = HeterogeneousGaussianEvent(sigmas=sigmas)
    first = compute_epsilon(base, DELTA, "exact")
    nudged = list(sigmas)
    nudged[1234] = math.nextafter(nudged[1234], 0.0)
    second = compute_epsilon(HeterogeneousGaussianEvent(sigmas=nudged), DELTA, "exact")
    assert EPSILON_MEMO.misses == 2 and second.epsilon >= first.epsilon
    small = ComposedEvent([GaussianEvent(sigma=2.0), GaussianEvent(sigma=3.0)])
    swapped = ComposedEvent([GaussianEvent(sigma=2.0), GaussianEvent(sigma=3.0, sensitivity=2.0)])
    assert compute_epsilon(small, DELTA, "exact").epsilon < compute_epsilon(swapped, DELTA, "exact").epsilon


def test_a_changed_module_setting_misses(monkeypatch) -> None:
    events = dpsgd_events(1.0, 0.01, 2000)
    compute_epsilon(events, DELTA, "pld")
    monkeypatch.setattr(accountants, "PLD_VALUE_DISCRETIZATION_INTERVAL", 1e-3)
    coarse = compute_epsilon(events, DELTA, "pld")
    assert EPSILON_MEMO.misses == 2
    assert coarse.epsilon == _fresh(events, DELTA, "pld").epsilon
    assert "1e-3" in " ".join(coarse.notes) or "0.001" in " ".join(coarse.notes)


def test_the_memo_is_bounded() -> None:
    old = EPSILON_MEMO.max_entries
    EPSILON_MEMO.max_entries = 3
    try:
        for sigma in (1.0, 2.0, 3.0, 4.0, 5.0):
            compute_epsilon(GaussianEvent(sigma=sigma), DELTA, "exact")
        assert len(EPSILON_MEMO) == 3
    finally:
        EPSILON_MEMO.max_entries = old


# -- calibration ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("accountant", ["auto", "pld", "rdp", "prv"])
def test_equal_calibrations_are_computed_once_under_every_accountant(accountant: str) -> None:
    first = dpsgd_noise_multiplier(1.0, DELTA, 32 / 288, 18, accountant=accountant)
    hits = CALIBRATION_MEMO.hits
    assert dpsgd_noise_multiplier(1.0, DELTA, 32 / 288, 18, accountant=accountant) is first
    assert CALIBRATION_MEMO.hits == hits + 1
    misses = CALIBRATION_MEMO.misses
    other = dpsgd_noise_multiplier(math.nextafter(1.0, 2.0), DELTA, 32 / 288, 18, accountant=accountant)
    assert CALIBRATION_MEMO.misses == misses + 1 and other is not first


def test_a_changed_calibration_setting_misses(monkeypatch) -> None:
    first = dpsgd_noise_multiplier(1.0, DELTA, 0.05, 100, accountant="rdp")
    monkeypatch.setattr(dpsgd, "MAX_NOISE_MULTIPLIER", 1e3)
    misses = CALIBRATION_MEMO.misses
    again = dpsgd_noise_multiplier(1.0, DELTA, 0.05, 100, accountant="rdp")
    assert CALIBRATION_MEMO.misses == misses + 1 and again == first  # recomputed (same answer: z << 1e3)


def test_calibration_feeds_the_ledgers_epsilon() -> None:
    cal = dpsgd_noise_multiplier(1.0, DELTA, 32 / 288, 18)
    misses = EPSILON_MEMO.misses
    ledger_view = compute_epsilon([dpsgd_events(cal.noise_multiplier, 32 / 288, 18)], DELTA, "auto")
    assert EPSILON_MEMO.misses == misses  # what the ledger asks for was computed by the calibration
    assert ledger_view.epsilon == cal.epsilon <= 1.0


def _dpa_pld(z: float, q: float, steps: int, interval: float) -> float:
    acc = pld_privacy_accountant.PLDAccountant(value_discretization_interval=interval)
    acc.compose(dp_event.PoissonSampledDpEvent(q, dp_event.GaussianDpEvent(z)), steps)
    return float(acc.get_epsilon(DELTA))


def _dpa_rdp(z: float, q: float, steps: int) -> float:
    acc = rdp_privacy_accountant.RdpAccountant()
    acc.compose(dp_event.PoissonSampledDpEvent(q, dp_event.GaussianDpEvent(z)), steps)
    return float(acc.get_epsilon(DELTA))


@pytest.mark.parametrize("target,q,steps", [(1.0, 32 / 288, 18), (0.5, 0.05, 300)])
def test_calibrated_noise_meets_the_target_under_dp_accounting_and_is_smallest(target, q, steps) -> None:
    auto = dpsgd_noise_multiplier(target, DELTA, q, steps)
    assert auto.accountant == "pld"
    note = " ".join(dpsgd_epsilon(auto.noise_multiplier, q, steps, DELTA).notes)
    interval = float(re.search(r"value discretisation interval ([0-9.e-]+)\.", note).group(1))
    # dp-accounting's own pessimistic PLD at the interval auto certifies with: the target is met ...
    assert _dpa_pld(auto.noise_multiplier, q, steps, interval) <= target
    # ... and 0.3 % less noise misses it even under dp-accounting's fine PLD (the multiplier is the smallest)
    assert _dpa_pld(auto.noise_multiplier / 1.003, q, steps, 1e-4) > target
    pld = dpsgd_noise_multiplier(target, DELTA, q, steps, accountant="pld")
    assert _dpa_pld(pld.noise_multiplier, q, steps, 1e-4) <= target < _dpa_pld(pld.noise_multiplier / 1.001, q, steps, 1e-4)
    rdp = dpsgd_noise_multiplier(target, DELTA, q, steps, accountant="rdp")
    assert _dpa_rdp(rdp.noise_multiplier, q, steps) <= target < _dpa_rdp(rdp.noise_multiplier / 1.001, q, steps)


def test_search_returns_an_evaluated_multiplier_with_a_bracket_of_width_rtol() -> None:
    calls: list[float] = []

    class Result:
        def __init__(self, epsilon: float) -> None:
            self.epsilon = epsilon

    def evaluate(z: float) -> Result:
        calls.append(z)
        return Result(3.0 / z**1.7)  # root at z = 3 ** (1 / 1.7)

    z, result, slope = dpsgd._search(evaluate, 1.0, DELTA, 0.01, 100, 1e-3, start=0.2)
    root = 3.0 ** (1 / 1.7)
    assert z in calls and result.epsilon <= 1.0
    assert root <= z <= root * 1.001
    assert any(root / 1.001 <= c < root for c in calls)  # the other end of the bracket was evaluated
    assert slope == pytest.approx(-1.7, rel=1e-6)
    assert len(calls) <= 8
