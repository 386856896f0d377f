"""``auto``'s epsilon is a function of the events, delta and its settings alone, never of how fast the machine is.

Its PLD refinement stops on a work budget in grid points (``AUTO_PLD_WORK_BUDGET_POINTS``), not on seconds. Before,
it stopped when the next interval would pass 8 s of ``time.perf_counter``: Laplace(scale 1e3) x 10^6 at delta = 1e-5
gave 4.377243 normally and 4.397364 under a clock running 10x faster (the same as a 10x slower or loaded machine),
and a certificate made on a fast machine failed ``dpcl verify`` on a slow one.

A clock made 10x faster (or slower) by monkeypatching every clock of :mod:`time` must leave each epsilon unchanged.
The processor-time limits of :mod:`dpcl.accounting.work` may refuse under the fast clock (a WorkLimitError): a time
limit only refuses, it never changes a number that is returned.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

import dpcl.accounting.accountants as accountants
from dpcl.accounting.accountants import collect
from dpcl.accounting.accountants.auto import _auto_pld_start, _pld_refined
from dpcl.accounting import LaplaceEvent, RepeatedEvent, compute_epsilon, dpsgd_events
from dpcl.accounting import dpsgd as dpsgd_module
from dpcl.accounting import filter as filter_module
from dpcl.errors import WorkLimitError

CONFIGS = sorted((Path(__file__).resolve().parents[2] / "dpcl" / "configs").glob("*.toml"))
#: auto's former clock and every other wall clock; :func:`time.thread_time` (the work limits' clock) apart.
WALL_CLOCKS = ("perf_counter", "process_time", "monotonic", "time")
ALL_CLOCKS = (*WALL_CLOCKS, "thread_time")


def _scaled_clocks(monkeypatch: pytest.MonkeyPatch, factor: float, names=WALL_CLOCKS) -> None:
    """Make the clocks ``names`` of :mod:`time` run ``factor`` times as fast from now on (also their ``_ns`` forms)."""
    for name in names:
        real = getattr(time, name)
        origin = real()

        def scaled(real=real, origin=origin):
            return origin + factor * (real() - origin)

        monkeypatch.setattr(time, name, scaled)
        real_ns = getattr(time, f"{name}_ns")
        origin_ns = real_ns()
        monkeypatch.setattr(time, f"{name}_ns", lambda real_ns=real_ns, origin_ns=origin_ns:
                            origin_ns + int(factor * (real_ns() - origin_ns)))


def _forget() -> None:
    """Clear every memo of the accounting layer, so that the next call computes again."""
    accountants.clear_memo()
    dpsgd_module.CALIBRATION_MEMO.clear()
    filter_module._auto_epsilon_of.cache_clear()


LAPLACE = RepeatedEvent(LaplaceEvent(scale=1e3, sensitivity=1.0), 10**6)


def _epsilon(events, delta=1e-5):
    _forget()
    result = compute_epsilon(events, delta)
    return result.epsilon, result.accountant


@pytest.fixture(scope="module")
def laplace_normal():
    """The Laplace example's (epsilon, accountant) under the real clock (4.377243 by a converged PLD)."""
    return _epsilon(LAPLACE)


def test_laplace_example_is_the_same_under_a_clock_ten_times_faster(monkeypatch, laplace_normal):
    _scaled_clocks(monkeypatch, 10.0)
    assert _epsilon(LAPLACE) == laplace_normal


def test_laplace_example_never_returns_another_number_when_every_clock_runs_fast(monkeypatch, laplace_normal):
    normal = laplace_normal
    _scaled_clocks(monkeypatch, 10.0, ALL_CLOCKS)
    try:
        fast = _epsilon(LAPLACE)
    except WorkLimitError:
        return  # the processor-time limit refused: allowed, a refusal is not another number
    assert fast == normal


def test_refinement_reports_its_work_and_stops_on_it_alone(monkeypatch):
    """The steps carry grid points, not seconds; a smaller work budget stops earlier, whatever the clock."""
    mech = collect(dpsgd_events(2.0, 0.001, 10**5))
    start = _auto_pld_start(mech, None)
    eps, _, info = _pld_refined(mech, 1e-5, start)
    assert info.stopped.startswith("converged") and len(info.steps) >= 2
    assert all(points > 0 and float(points).is_integer() for _, _, points in info.steps)
    first = info.steps[0][2]
    _scaled_clocks(monkeypatch, 0.1)
    small, _, stopped = _pld_refined(mech, 1e-5, start, budget_points=first * 2)
    assert "work budget" in stopped.stopped and len(stopped.steps) == 1
    assert small == info.steps[0][1] >= eps  # the coarser PLD: still an upper bound, only looser


def test_dpsgd_epsilon_and_calibration_are_the_same_under_fast_and_slow_clocks(monkeypatch):
    from dpcl.accounting import dpsgd_noise_multiplier

    events = dpsgd_events(1.0, 0.01, 10**4)
    normal = _epsilon(events)
    _forget()
    z = dpsgd_noise_multiplier(2.0, 1e-5, 0.01, 10**4).noise_multiplier
    for factor in (10.0, 0.1):
        with monkeypatch.context() as m:
            _scaled_clocks(m, factor)
            assert _epsilon(events) == normal
            _forget()
            assert dpsgd_noise_multiplier(2.0, 1e-5, 0.01, 10**4).noise_multiplier == z


def _audit(path: Path):
    from dpcl.cli.audit import _data_stream_keys, stream_task_sizes
    from dpcl.audit_config import audit_config
    from dpcl.guarantees.config import load_config

    config = load_config(path, data_stream_keys=_data_stream_keys())
    sizes, _, _ = stream_task_sizes(config)
    _forget()
    report = audit_config(config, sizes)
    return (report.epsilon, report.total_epsilon, report.accountant, [dict(t) for t in report.per_task],
            [dict(g) for g in report.scoped_guarantees])


@pytest.mark.parametrize("config", CONFIGS, ids=[p.stem for p in CONFIGS])
def test_every_bundled_configs_audit_is_the_same_under_a_clock_ten_times_faster(config, monkeypatch):
    pytest.importorskip("torch")  # the data layer reads the datasets' labels
    normal = _audit(config)
    _scaled_clocks(monkeypatch, 10.0)
    assert _audit(config) == normal


def test_a_certificate_written_under_a_fast_clock_verifies_under_a_slow_one(tmp_path, monkeypatch):
    from dpcl.guarantees.certificates import verify_certificate
    from dpcl.guarantees.ledger import TaskLedger

    import importlib.util

    spec = importlib.util.spec_from_file_location("certified_runs", Path(__file__).parents[1] / "guarantees" / "certified_runs.py")
    certified_runs = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(certified_runs)

    with monkeypatch.context() as m:
        _scaled_clocks(m, 10.0)
        _forget()
        ledger = TaskLedger(delta=1e-5, across_tasks="sequential", accountant="auto")
        path, _ = certified_runs.certify(tmp_path, ledger, 0, LAPLACE, name="task001", checkpoint_bytes=b"weights",
                                               method="cosine", assumptions=["Public features."])
    _scaled_clocks(monkeypatch, 0.1)
    _forget()
    report = verify_certificate(path)
    assert report.valid, [c for c in report.checks if not c.passed]
