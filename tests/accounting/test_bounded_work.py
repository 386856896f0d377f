"""Every public accounting function answers within bounded memory and time, or refuses up front (issue 18).

The probe (thorough mode, ``DPCL_THOROUGH=1``) calls the public entry points of :mod:`dpcl.accounting` (epsilon
of DP-SGD, its calibration, epsilon of composed Gaussian, Laplace, subsampled-Gaussian and (epsilon, delta) events
under every accountant, and the closed forms) with extreme but well-formed inputs: noise multipliers at and near the
ends of their range, sample rates from 1e-12 to 1, up to 1e9 steps, deltas from 1e-300 to 0.999999, targets from
1e-6 to 1e6. Each call runs in a child of the CLI fuzz test's fork server (``tests/cli/fuzz_worker.py``) under a
2 GiB address-space limit and :data:`CPU_LIMIT` seconds of processor time, and must answer (a finite epsilon >= 0)
or refuse with a :class:`~dpcl.errors.DpclError` (exit code 2 or 3, the code the CLI would give), never crash,
run out of memory or time, or raise anything else. ``DPCL_PROBE_LOG=FILE`` appends every example's inputs, outcome,
processor seconds and peak memory to FILE (one JSON object a line); with ``DPCL_PROBE_KEEP_GOING=1`` a failure is
logged there instead of raised, so that one run lists every failing input.

The fast tests below (CI) are the regressions the probe found: each is refused up front, in milliseconds, with one
line naming the parameter, the largest value handled and what to do instead.
"""

from __future__ import annotations

import importlib.util
import json
import math
import os
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, Phase, example, given, settings
from hypothesis import strategies as st

from dpcl.accounting import ACCOUNTANT_NAMES

THOROUGH = os.environ.get("DPCL_THOROUGH") == "1"
MEMORY_LIMIT = 2 * 1024**3
#: Processor seconds a call may take (issue 18: an answer within 60 s on this machine, or a refusal).
CPU_LIMIT = 60
#: Wall-clock seconds after which a call is killed as hung (generous: the machine is shared).
WALL_LIMIT = 900.0
#: Probe examples per group in thorough mode (compositions of events are the cheapest to run and the most varied).
EXAMPLES = {"dpsgd": 150, "calibration": 80, "events": 1000, "closed_forms": 60}
PROBE_EXAMPLES = sum(EXAMPLES.values())


def _fuzz_worker():
    if "fuzz_worker" not in sys.modules:
        spec = importlib.util.spec_from_file_location("fuzz_worker", Path(__file__).parents[1] / "cli" / "fuzz_worker.py")
        module = importlib.util.module_from_spec(spec)
        sys.modules["fuzz_worker"] = module
        spec.loader.exec_module(module)
    return sys.modules["fuzz_worker"]


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1",
           "PYTHONWARNINGS": "ignore", "DPCL_FUZZ_PRELOAD_TORCH": "0"}
    fork_server = _fuzz_worker().ForkServer(tmp_path_factory.mktemp("probe"), env=env, memory=MEMORY_LIMIT,
                                            wall_limit=WALL_LIMIT)
    yield fork_server
    fork_server.close()


def probe_settings(group: str) -> settings:
    return settings(max_examples=EXAMPLES[group], deadline=None, database=None, suppress_health_check=list(HealthCheck),
                    phases=(Phase.explicit, Phase.generate))  # a failure is reported unshrunk (each call can take a minute)


def log_uniform(low: float, high: float) -> st.SearchStrategy[float]:
    return st.floats(math.log10(low), math.log10(high)).map(lambda e: min(max(10.0**e, low), high))


def extreme(values: list[float], low: float, high: float) -> st.SearchStrategy[float]:
    """The ends of a range and a few values near them, or any value in it (log-uniform)."""
    return st.one_of(st.sampled_from(values), log_uniform(low, high))


NOISE = extreme([1e-4, 1.0001e-4, 1e-3, 0.01, 0.1, 0.5, 1.0, 2.0, 10.0, 1e3, 1e5, 1e6], 1e-4, 1e6)
RATE = st.one_of(extreme([1e-12, 1e-9, 1e-6, 1e-3, 0.01, 0.1, 0.5, 0.99, 1 - 1e-9], 1e-12, 1.0), st.just(1.0))
STEPS = st.one_of(st.sampled_from([1, 2, 10, 1000, 10**4, 10**5, 10**6, 10**7, 10**8, 10**9]),
                  log_uniform(1.0, 1e9).map(int))
DELTA = extreme([1e-300, 1e-100, 1e-30, 1e-12, 1e-5, 0.1, 0.5, 0.9, 0.999999], 1e-300, 0.999999)
TARGET = extreme([1e-6, 1e-3, 0.1, 1.0, 10.0, 100.0, 1e4, 1e6], 1e-6, 1e6)
ACCOUNTANT = st.sampled_from(ACCOUNTANT_NAMES)
ADJACENCY = st.sampled_from(["add_remove", "add_remove", "replace_one"])


def check(result: dict) -> None:
    """An answer (a finite epsilon >= 0) or a refusal by a DpclError, within the limits (``DPCL_PROBE_KEEP_GOING=1``:
    a failure is only logged, so that one run finds every failing input)."""
    try:
        _check(result)
    except AssertionError as exc:
        if os.environ.get("DPCL_PROBE_KEEP_GOING") != "1":
            raise
        result["failure"] = str(exc)[:300]
    finally:
        _log(result)


def _log(result: dict) -> None:
    if os.environ.get("DPCL_PROBE_LOG"):
        with open(os.environ["DPCL_PROBE_LOG"], "a", encoding="utf-8") as log:
            log.write(json.dumps({
                "call": result["call"], "kwargs": result["kwargs"], "status": result["status"], "code": result["code"],
                "cpu_seconds": round(result.get("cpu_seconds", 0.0), 2), "seconds": round(result["seconds"], 2),
                "peak_rss_mib": round(result.get("peak_rss_bytes", 0) / 2**20), "died": result.get("died"),
                "stdout": result["stdout"]["text"][-300:], "stderr": result["stderr"]["text"][-600:],
                "failure": result.get("failure"),
            }) + "\n")


def _check(result: dict) -> None:
    where = f"{result['call']}(**{result['kwargs']})"
    err = result["stderr"]["text"]
    assert result["status"] != "timeout", f"{where}: hung ({result['seconds']:.0f} s of wall-clock time)"
    assert result["status"] != "cpu", f"{where}: still computing after {CPU_LIMIT} s of processor time"
    assert result["cpu_seconds"] < CPU_LIMIT, f"{where}: {result['cpu_seconds']:.1f} s of processor time"
    assert result["status"] != "memory", f"{where}: MemoryError under the {MEMORY_LIMIT >> 30} GiB limit"
    assert result["status"] != "crash", f"{where}: the process died ({result.get('died')})\n{err[-3000:]}"
    assert result["status"] == "ok", f"{where}: an exception that is not a DpclError\n{err[-3000:]}"
    assert result["code"] in (0, 2, 3), f"{where}: exit {result['code']}\n{err[-3000:]}"
    if result["code"] == 0:
        out = result["stdout"]["text"]
        if out.startswith("{"):
            epsilon = json.loads(out)["epsilon"]
            assert isinstance(epsilon, float) and math.isfinite(epsilon) and epsilon >= 0, f"{where}: {out[:300]}"
    else:
        assert err.strip().count("\n") == 0, f"{where}: a refusal of more than one line\n{err}"


def probe(server, target: str, **kwargs) -> None:
    check(server.call(target, kwargs, cpu=CPU_LIMIT))


@pytest.mark.thorough
@probe_settings("dpsgd")
@given(z=NOISE, q=RATE, steps=STEPS, delta=DELTA, accountant=ACCOUNTANT, adjacency=ADJACENCY)
@example(z=1e-3, q=1e-6, steps=10**4, delta=1e-5, accountant="auto", adjacency="add_remove")  # 214 s wall, 15 s cpu
@example(z=1.0, q=1e-6, steps=10**7, delta=1e-100, accountant="prv", adjacency="add_remove")  # was 3.3 GB
def test_probe_dpsgd_epsilon(server, z, q, steps, delta, accountant, adjacency):
    probe(server, "dpcl.accounting:dpsgd_epsilon", noise_multiplier=z, sample_rate=q, steps=steps, delta=delta,
          accountant=accountant, adjacency=adjacency)


@pytest.mark.thorough
@probe_settings("calibration")
@given(target=TARGET, q=RATE, steps=STEPS, delta=DELTA, accountant=ACCOUNTANT, adjacency=ADJACENCY)
@example(target=1e-3, q=1e-6, steps=10**4, delta=1e-5, accountant="auto", adjacency="add_remove")  # was 94 s cpu
def test_probe_dpsgd_noise_multiplier(server, target, q, steps, delta, accountant, adjacency):
    probe(server, "dpcl.accounting:dpsgd_noise_multiplier", target_epsilon=target, delta=delta, sample_rate=q,
          steps=steps, accountant=accountant, adjacency=adjacency)


def _event(kind: str, value: float, count: int, z: float, q: float, adjacency: str) -> dict:
    if kind == "gaussian":
        leaf = {"kind": "gaussian", "sigma": value, "sensitivity": 1.0}
    elif kind == "laplace":
        leaf = {"kind": "laplace", "scale": value, "sensitivity": 1.0}
    elif kind == "epsilon_delta":
        leaf = {"kind": "epsilon_delta", "epsilon": value, "delta": 1e-9, "source": "probe"}
    else:
        leaf = {"kind": "poisson_sampled_gaussian", "noise_multiplier": z, "sample_rate": q}
    leaf["adjacency"] = adjacency
    leaf["unit"] = "example"
    return {"kind": "repeated", "event": leaf, "count": count}


EVENT = st.builds(
    _event, st.sampled_from(["gaussian", "laplace", "epsilon_delta", "sampled", "sampled"]),
    extreme([1e-4, 1e-2, 1.0, 10.0, 1e4, 1e8], 1e-4, 1e8), STEPS, NOISE, RATE, st.just("add_remove"),
)


def _distinct_steps(n: int) -> list[dict]:
    return [_event("sampled", 1.0, 10**4, 1.0 + i / 1000, 1e-3, "add_remove") for i in range(n)]


@pytest.mark.thorough
@probe_settings("events")
@given(events=st.lists(EVENT, min_size=1, max_size=4), delta=DELTA, accountant=ACCOUNTANT)
@example(events=_distinct_steps(32), delta=1e-5, accountant="auto")  # was 63 s cpu (300 of them: minutes)
@example(events=_distinct_steps(300), delta=1e-5, accountant="pld")
def test_probe_compute_epsilon(server, events, delta, accountant):
    composed = events[0] if len(events) == 1 else {"kind": "composed", "events": events}
    probe(server, "dpcl.accounting:compute_epsilon", events=composed, delta=delta, accountant=accountant)


POSITIVE = extreme([1e-300, 1e-12, 1e-4, 1.0, 1e4, 1e12, 1e300], 1e-300, 1e300)
CLOSED_FORMS = st.one_of(
    st.builds(lambda s, d: ("gaussian_epsilon", {"sigma": s, "delta": d}), POSITIVE, DELTA),
    st.builds(lambda e, d: ("gaussian_sigma", {"epsilon": e, "delta": d}), POSITIVE, DELTA),
    st.builds(lambda e, s: ("gaussian_delta", {"epsilon": e, "sigma": s}), POSITIVE, POSITIVE),
    st.builds(lambda m, d: ("gdp_epsilon", {"mu": m, "delta": d}), POSITIVE, DELTA),
    st.builds(lambda e, d: ("gdp_mu", {"epsilon": e, "delta": d}), POSITIVE, DELTA),
    st.builds(lambda e, d: ("classic_gaussian_sigma", {"epsilon": e, "delta": d}), POSITIVE, DELTA),
    st.builds(lambda b, d: ("laplace_epsilon_for_delta", {"scale": b, "delta": d}), POSITIVE, DELTA),
    st.builds(lambda e, b: ("laplace_delta", {"epsilon": e, "scale": b}), POSITIVE, POSITIVE),
    st.builds(lambda s, n, d: ("compose_gaussians_epsilon", {"sigmas": [s] * n, "delta": d}), POSITIVE,
              st.integers(1, 1000), DELTA),
    st.builds(lambda e, n, d: ("advanced_composition_for_delta", {"epsilons": [e] * n, "deltas": 0.0, "delta": d}),
              POSITIVE, st.integers(1, 1000), DELTA),
    st.builds(lambda e, n, d: ("basic_composition", {"epsilons": [e] * n, "deltas": d / n}), POSITIVE,
              st.integers(1, 1000), DELTA),
)


@pytest.mark.thorough
@probe_settings("closed_forms")
@given(case=CLOSED_FORMS)
def test_probe_closed_forms(server, case):
    name, kwargs = case
    probe(server, f"dpcl.accounting:{name}", **kwargs)


# -- regressions the probe found (fast, in CI) ------------------------------------------------------------------------
from dpcl.accounting import compute_epsilon, dpsgd_epsilon, dpsgd_events, dpsgd_noise_multiplier  # noqa: E402
from dpcl.accounting import work  # noqa: E402
from dpcl.accounting.accountants import PRV_MAX_GRID_POINTS  # noqa: E402
from dpcl.errors import UnsupportedEventError, WorkLimitError  # noqa: E402

#: Found by the probe: 94 s of processor time (each evaluation of ``auto`` fell back to an 8 s PRV grid).
SLOW_CALIBRATION = dict(target_epsilon=1e-3, delta=1e-5, sample_rate=1e-6, steps=10**4)


def test_a_calibration_past_its_processor_time_budget_is_refused_with_a_hint(monkeypatch):
    monkeypatch.setattr(work, "CALIBRATION_TIME_BUDGET_S", 0.0)  # the budget (20 s) spent at once
    with pytest.raises(WorkLimitError) as info:
        dpsgd_noise_multiplier(**SLOW_CALIBRATION)
    message = str(info.value)
    assert not isinstance(info.value, ValueError) and info.value.exit_code == 2
    assert "\n" not in message and "target_epsilon=0.001" in message and "sample_rate=1e-06" in message
    assert "0 s of processor time (the limit)" in message and "accountant='rdp'" in message


def test_the_hint_of_a_refused_calibration_answers_and_meets_the_target():
    calibration = dpsgd_noise_multiplier(**SLOW_CALIBRATION, accountant="rdp")
    z = calibration.noise_multiplier
    assert calibration.epsilon <= SLOW_CALIBRATION["target_epsilon"]
    again = dpsgd_epsilon(z, SLOW_CALIBRATION["sample_rate"], SLOW_CALIBRATION["steps"], SLOW_CALIBRATION["delta"], "rdp")
    assert again.epsilon <= SLOW_CALIBRATION["target_epsilon"]


def test_a_refused_calibration_is_refused_by_the_cli_with_exit_2(monkeypatch, capsys):
    from dpcl.cli import main

    monkeypatch.setattr(work, "CALIBRATION_TIME_BUDGET_S", 0.0)
    code = main(["calibrate", "dpsgd", "--epsilon", "1e-3", "--delta", "1e-5", "--sample-rate", "1e-6", "--steps", "1e4"])
    captured = capsys.readouterr()
    assert code == 2 and captured.out == ""
    assert captured.err.count("\n") == 1 and "target_epsilon=0.001" in captured.err and "accountant='rdp'" in captured.err


def test_many_distinct_mechanisms_past_the_epsilon_budget_are_refused_naming_the_events(monkeypatch):
    monkeypatch.setattr(work, "EPSILON_TIME_BUDGET_S", 0.0)
    events = [dpsgd_events(1.0 + i / 1000, 0.01, 1000) for i in range(3)]
    for accountant in ("auto", "pld", "rdp"):
        with pytest.raises(WorkLimitError) as info:
            compute_epsilon(events, 1e-5, accountant)
        message = str(info.value)
        assert message.startswith("events (3000 Poisson-subsampled Gaussian mechanism(s))") and "\n" not in message
        assert ("'advanced' or 'basic'" if accountant == "rdp" else "accountant='rdp'") in message
    # one group of equal steps has no per-mechanism loop to refuse in: the closed forms answer whatever the budget
    assert compute_epsilon(events, 1e-5, "basic").epsilon > 0


def test_a_prv_grid_beyond_memory_is_refused_before_it_is_allocated():
    """Found by the probe: prv-accountant grew to 3.3 GB (MemoryError under 2 GiB) at 9.7e6 points; now refused up
    front naming the limit, and auto answers from the other accountants."""
    with pytest.raises(UnsupportedEventError) as info:
        dpsgd_epsilon(1.0, 1e-6, 10**7, 1e-100, "prv")
    assert f"at most {PRV_MAX_GRID_POINTS:.2g}" in str(info.value) and "'rdp'" in str(info.value)
    result = dpsgd_epsilon(1.0, 1e-6, 10**7, 1e-100, "auto")
    assert result.epsilon <= result.candidates["rdp"] and "prv" not in result.candidates


def test_budgets_nest_keeping_the_earlier_deadline_and_end_with_their_block():
    work.checkpoint()  # outside any budget: nothing to refuse
    with work.time_budget(0.0, "outer question", "outer hint"):
        with work.time_budget(1e6, "inner question", "inner hint"):
            with pytest.raises(WorkLimitError, match="^outer question needs more than 0 s"):
                work.checkpoint()
    with work.time_budget(1e6, "generous", "none"):
        work.checkpoint()
    work.checkpoint()


def test_prv_on_many_distinct_mechanisms_is_refused_before_it_discretises_them_and_auto_answers():
    """Found by the probe: 32 distinct DP-SGD tasks took 63 s under ``auto``, 58 s of it prv-accountant discretising
    and composing each of them on a grid of 8.3e5 points; now refused up front, and auto answers from the rest."""
    from dpcl.accounting.accountants import clear_memo

    clear_memo()
    events = [dpsgd_events(1.0 + i / 1000, 1e-3, 10**4) for i in range(32)]
    with pytest.raises(UnsupportedEventError) as info:
        compute_epsilon(events, 1e-5, "prv")
    assert f"at most {work.PRV_MAX_POINT_MECHANISMS:.2g} points x mechanisms" in str(info.value)
    assert "32 distinct mechanisms" in str(info.value) and "'rdp'" in str(info.value)


def test_the_largest_self_composed_pld_answers_under_the_memory_limit(server):
    # q = 0.1, T = 1e6, z = 1 at interval 1e-4: one self-composition of ~2.6e7 points, above the 1.2e7 that
    # dp-accounting's own FFT fits in ~1.3 GB; dpcl's lean self-convolution answers under the 2 GiB limit
    from dpcl.accounting import accountants

    result = server.call("dpcl.accounting:dpsgd_epsilon", {
        "noise_multiplier": 1.0, "sample_rate": 0.1, "steps": 10**6, "delta": 1e-5, "accountant": "pld",
    }, cpu=CPU_LIMIT)
    check(result)
    assert result["code"] == 0, result["stderr"]["text"]
    assert result.get("peak_rss_bytes", 0) < MEMORY_LIMIT
    epsilon = json.loads(result["stdout"]["text"])["epsilon"]
    # dp-accounting's own PLD at 1e-4 (benchmarks/GRID.json; 13.4 s and 2.27 GB on an idle machine, 2026-11-27)
    assert epsilon == pytest.approx(7807.979199356103, rel=1e-9)
    assert accountants.PLD_MAX_SELF_COMPOSED_POINTS >= 2.6e7


def test_a_pld_that_dp_accounting_cannot_compose_is_refused_and_auto_answers():
    # found by the probe (2026-11-27): Laplace steps of epsilon 1e4 next to Gaussian and DP-SGD pieces; at the coarse
    # interval auto starts from, dp-accounting's compose truncated both tails of a PMF to an empty array (IndexError)
    from dpcl.accounting import compute_epsilon
    from dpcl.accounting.events import event_from_dict

    events = event_from_dict({"kind": "composed", "events": [
        {"kind": "repeated", "count": 66740, "event": {"kind": "gaussian", "sigma": 10.0, "sensitivity": 1.0,
                                                       "adjacency": "add_remove", "unit": "example"}},
        {"kind": "repeated", "count": 123256, "event": {"kind": "poisson_sampled_gaussian", "noise_multiplier": 10.0,
                                                        "sample_rate": 0.9977000638225533, "adjacency": "add_remove",
                                                        "unit": "example"}},
        {"kind": "repeated", "count": 10, "event": {"kind": "laplace", "scale": 0.0018608809314539026,
                                                    "sensitivity": 1.0, "adjacency": "add_remove", "unit": "example"}},
        {"kind": "repeated", "count": 100000, "event": {"kind": "laplace", "scale": 0.0001, "sensitivity": 1.0,
                                                        "adjacency": "add_remove", "unit": "example"}},
    ]})
    result = compute_epsilon(events, 1e-30, "auto")
    assert math.isfinite(result.epsilon) and result.epsilon > 0
    assert result.epsilon <= result.candidates["basic"]


def test_a_self_composition_past_its_sizing_estimate_is_refused_before_it_is_allocated(server):
    # found by the probe (2026-11-28): the coarse PLD of a calibration at q = 1e-9, T = 7.9e8 was sized below the limit
    # but its self-composition's truncation bounds asked for 4.8e9 points (a 35.6 GiB FFT): a bare MemoryError under
    # the 2 GiB limit. The self-composition now refuses a grid past the limit before allocating it.
    result = server.call("dpcl.accounting:dpsgd_noise_multiplier", {
        "target_epsilon": 1e-6, "delta": 0.5, "sample_rate": 1e-9, "steps": 787882382, "accountant": "prv",
        "adjacency": "add_remove",
    }, cpu=CPU_LIMIT)
    check(result)
    assert result["code"] in (0, 2), result["stderr"]["text"]
