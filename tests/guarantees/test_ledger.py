"""TaskLedger: parallel / sequential composition over tasks, disjointness, persistence, resume."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dpcl.accounting.events import EpsilonDeltaEvent, GaussianEvent
from dpcl.errors import (
    BudgetExceededError,
    ConfigError,
    DisjointnessViolationError,
    InvalidParameterError,
    LedgerCorruptError,
    PrivacyViolationError,
)
from dpcl.guarantees import stream_composition as composition_module
from dpcl.guarantees.ledger import Charge, TaskLedger, compose_stream

from .reference import gaussian_profile_epsilon, reference_compute

DELTA = 1e-5
sigmas_st = st.lists(st.floats(min_value=0.3, max_value=20.0), min_size=1, max_size=6)


@pytest.fixture(autouse=True)
def reference_accountant(monkeypatch):
    """Account with the independent closed form of tests/guarantees/reference.py."""
    monkeypatch.setattr(composition_module, "_compute", reference_compute)


def _gauss(sigma: float) -> GaussianEvent:
    return GaussianEvent(sigma=sigma, sensitivity=1.0)


def _ledger(across: str, **kw) -> TaskLedger:
    return TaskLedger(delta=DELTA, across_tasks=across, **kw)


@given(sigmas_st)
def test_parallel_equals_worst_task(sigmas):
    ledger = _ledger("parallel")
    for t, s in enumerate(sigmas):
        ledger.charge(t, _gauss(s))
    worst = max(gaussian_profile_epsilon(1.0 / s, DELTA) for s in sigmas)
    assert ledger.guarantee().epsilon == pytest.approx(worst, rel=1e-12)


@given(sigmas_st)
def test_sequential_between_worst_and_sum(sigmas):
    ledger = _ledger("sequential")
    for t, s in enumerate(sigmas):
        ledger.charge(t, _gauss(s))
    per_task = [gaussian_profile_epsilon(1.0 / s, DELTA) for s in sigmas]
    eps = ledger.guarantee().epsilon
    assert max(per_task) * (1 - 1e-12) <= eps
    # Sum bound: basic composition of (eps_t, delta) releases; our delta is DELTA (< T*DELTA), so compare with
    # the sum at delta/T per task, which is a valid (sum eps, delta) guarantee (Dwork & Roth, Thm 3.16).
    per_task_split = [gaussian_profile_epsilon(1.0 / s, DELTA / len(sigmas)) for s in sigmas]
    assert eps <= sum(per_task_split) * (1 + 1e-12)


@given(sigmas_st, st.floats(min_value=0.3, max_value=20.0), st.sampled_from(["parallel", "sequential"]))
def test_adding_a_task_never_lowers_epsilon(sigmas, extra, across):
    ledger = _ledger(across)
    for t, s in enumerate(sigmas):
        ledger.charge(t, _gauss(s))
    before = ledger.guarantee().epsilon
    ledger.charge(len(sigmas), _gauss(extra))
    assert ledger.guarantee().epsilon >= before * (1 - 1e-12)


@settings(max_examples=25)
@given(sigmas_st, st.sampled_from(["parallel", "sequential"]))
def test_save_load_round_trip(tmp_path_factory, sigmas, across):
    path = tmp_path_factory.mktemp("ledger") / "ledger.json"
    ledger = _ledger(across, path=path, metadata={"config": {"method": {"name": "cosine"}}})
    for t, s in enumerate(sigmas):
        ledger.charge(t, _gauss(s), unit_ids=np.arange(10 * t, 10 * t + 10), label=f"task {t}")
        ledger.release(t, checkpoint_sha256="ab" * 32)
    again = TaskLedger.load(path)
    assert again.to_dict() == ledger.to_dict()
    assert again.charges == ledger.charges
    assert [r.guarantee for r in again.releases] == [r.guarantee for r in ledger.releases]
    assert again.guarantee().epsilon == pytest.approx(ledger.guarantee().epsilon, rel=1e-12)


def test_release_reports_cumulative_guarantee_per_release():
    ledger = _ledger("sequential")
    sigmas = [2.0, 3.0, 4.0]
    for t, s in enumerate(sigmas):
        ledger.charge(t, _gauss(s))
        ledger.release(t)
    for t, record in enumerate(ledger.releases):
        mu = np.sqrt(sum(1 / s**2 for s in sigmas[: t + 1]))
        assert record.guarantee.epsilon == pytest.approx(gaussian_profile_epsilon(mu, DELTA), rel=1e-12)
        assert record.guarantee.across_tasks == "sequential"


def test_union_training_groups_under_parallel():
    """A release trained on D_1 u D_2 (non-CL) is charged to both tasks; task 1's units see every release."""
    ledger = _ledger("parallel")
    ledger.charge([0], _gauss(3.0))
    ledger.charge([0, 1], _gauss(3.0))
    ledger.charge([0, 1, 2], _gauss(3.0))
    g = ledger.guarantee()
    assert len(g.groups) == 1 and g.groups[0].tasks == (0, 1, 2)
    assert g.epsilon == pytest.approx(gaussian_profile_epsilon(np.sqrt(3) / 3.0, DELTA), rel=1e-12)


def test_union_training_refused_under_sequential():
    ledger = _ledger("sequential")
    with pytest.raises(PrivacyViolationError, match="group privacy"):
        ledger.charge([0, 1], _gauss(3.0))
    assert ledger.charges == []


def test_disjointness_checked_and_shared_unit_named():
    ledger = _ledger("parallel")
    ledger.charge(0, _gauss(2.0), unit_ids=np.array([1, 2, 3, 4]))
    with pytest.raises(DisjointnessViolationError, match="^task 1 and task 0 are declared .* share unit '3'"):
        ledger.charge(1, _gauss(2.0), unit_ids=np.array([7, 3, 9]))
    assert len(ledger.charges) == 1  # refused charge is not recorded
    ledger.charge(1, _gauss(2.0), unit_ids=np.array([7, 8, 9]))
    assert ledger.unit_ids(1) == ["7", "8", "9"]


def test_register_units_for_union_charges(tmp_path):
    ledger = _ledger("parallel", path=tmp_path / "l.json")
    ledger.register_units(0, ["a", "b"])
    ledger.register_units(1, ["c"])
    with pytest.raises(DisjointnessViolationError, match="'b'"):
        ledger.register_units(2, ["b", "d"])
    assert TaskLedger.load(tmp_path / "l.json").unit_ids(1) == ["c"]
    # a charge reading several tasks (non-CL) gives the ids of their union; a later task sharing one is refused
    ledger.charge([0, 1], _gauss(2.0), unit_ids=["a", "b", "c"])
    with pytest.raises(DisjointnessViolationError, match="'c'"):
        ledger.charge(3, _gauss(2.0), unit_ids=["c", "e"])


def test_sequential_accepts_shared_units():
    ledger = _ledger("sequential")
    ledger.charge(0, _gauss(2.0), unit_ids=["alice", "bob"])
    ledger.charge(1, _gauss(2.0), unit_ids=["bob", "carol"])
    assert len(ledger.charges) == 2


def test_events_must_match_ledger_relation():
    ledger = _ledger("parallel", adjacency="replace_one")
    with pytest.raises(InvalidParameterError, match="replace_one"):
        ledger.charge(0, _gauss(2.0))


def test_invalid_settings():
    with pytest.raises(InvalidParameterError, match="across_tasks"):
        TaskLedger(delta=DELTA, across_tasks="auto")
    with pytest.raises(InvalidParameterError, match="delta"):
        TaskLedger(delta=1.5, across_tasks="parallel")
    with pytest.raises(InvalidParameterError, match="no charge"):
        _ledger("parallel").guarantee()
    with pytest.raises(InvalidParameterError, match="before any task"):
        _ledger("parallel").release(0)


def test_corrupt_or_truncated_file_refused_not_replaced(tmp_path):
    path = tmp_path / "ledger.json"
    ledger = _ledger("sequential", path=path)
    ledger.charge(0, _gauss(2.0))
    ledger.release(0)
    good = path.read_text()

    path.write_text(good[: len(good) // 2])
    with pytest.raises(LedgerCorruptError, match="truncated"):
        TaskLedger.open(path, delta=DELTA, across_tasks="sequential")
    assert path.read_text() == good[: len(good) // 2]  # never silently replaced

    edited = json.loads(good)
    edited["charges"][0]["events"][0]["sigma"] = 200.0  # lower the spent budget by hand
    path.write_text(json.dumps(edited))
    with pytest.raises(LedgerCorruptError, match="integrity"):
        TaskLedger.load(path)

    path.write_text("[]")
    with pytest.raises(LedgerCorruptError, match="not a dpcl task ledger"):
        TaskLedger.load(path)


def test_open_refuses_different_settings(tmp_path):
    path = tmp_path / "ledger.json"
    TaskLedger.open(path, delta=DELTA, across_tasks="sequential").charge(0, _gauss(2.0))
    with pytest.raises(ConfigError, match="across_tasks"):
        TaskLedger.open(path, delta=DELTA, across_tasks="parallel")
    resumed = TaskLedger.open(path, delta=DELTA, across_tasks="sequential")
    assert len(resumed.charges) == 1


def test_compose_stream_validates():
    with pytest.raises(InvalidParameterError, match="across_tasks"):
        compose_stream([Charge((0,), (_gauss(1.0),))], "both", DELTA)


_WORKER = textwrap.dedent(
    """
    import sys, time
    sys.path.insert(0, {tests_dir!r})
    from reference import reference_compute
    from dpcl.accounting.events import EpsilonDeltaEvent, GaussianEvent
    from dpcl.guarantees import ledger as ledger_module, stream_composition
    stream_composition._compute = reference_compute
    ledger = ledger_module.TaskLedger.open({path!r}, delta={delta!r}, across_tasks="sequential")
    done = set(ledger.released_tasks())
    for t in range(4):
        if t in done:
            continue
        ledger.charge(t, GaussianEvent(sigma=2.0 + t))   # charged before training
        ledger.release(t)
        print("released", t, flush=True)
        time.sleep(30 if t == 1 else 0)                  # killed here on the first run
    print("finished", flush=True)
    """
)


def test_killed_run_resumes_without_losing_budget(tmp_path):
    path = tmp_path / "ledger.json"
    script = _WORKER.format(tests_dir=str(Path(__file__).parent), path=str(path), delta=DELTA)
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True, env=env)
    lines = []
    for line in proc.stdout:
        lines.append(line.strip())
        if line.strip() == "released 1":
            proc.send_signal(signal.SIGKILL)
            break
    proc.wait(timeout=60)
    proc.stdout.close()
    assert proc.returncode == -signal.SIGKILL
    assert lines[-1] == "released 1"

    after_kill = TaskLedger.load(path)
    assert after_kill.released_tasks() == [0, 1]
    spent = after_kill.guarantee().epsilon
    assert spent == pytest.approx(gaussian_profile_epsilon(np.sqrt(1 / 4 + 1 / 9), DELTA), rel=1e-12)

    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["released", "2", "released", "3", "finished"]
    final = TaskLedger.load(path)
    assert final.released_tasks() == [0, 1, 2, 3]
    mu = np.sqrt(sum(1 / (2.0 + t) ** 2 for t in range(4)))
    assert final.guarantee().epsilon == pytest.approx(gaussian_profile_epsilon(mu, DELTA), rel=1e-12)
    assert final.guarantee().epsilon > spent


@settings(max_examples=30)
@given(
    st.lists(st.floats(min_value=0.5, max_value=10.0), min_size=1, max_size=12),
    st.floats(min_value=0.3, max_value=5.0),
)
def test_gdp_filter_never_admits_an_overspend(sigmas, budget):
    ledger = _ledger("sequential", total_epsilon=budget)
    for t, s in enumerate(sigmas):
        try:
            ledger.charge(t, _gauss(s))
        except BudgetExceededError:
            break
    if ledger.charges:
        # exact composition of what was admitted (independent closed form) stays within the budget
        assert ledger.guarantee().epsilon <= budget * (1 + 1e-9)
        assert ledger.filter_state()["stream"]["spent"]["epsilon"] <= budget * (1 + 1e-9)
    else:  # the first charge was refused: it created no filter
        assert ledger.filter_state() == {}


@settings(max_examples=30)
@given(st.lists(st.floats(min_value=0.01, max_value=2.0), min_size=1, max_size=12), st.floats(0.1, 5.0))
def test_basic_filter_never_admits_an_overspend(epsilons, budget):
    ledger = _ledger("sequential", total_epsilon=budget)
    admitted = []
    for t, e in enumerate(epsilons):
        try:
            ledger.charge(t, EpsilonDeltaEvent(epsilon=e, delta=0.0))
        except BudgetExceededError:
            continue  # a refused task is not recorded; smaller later ones may still fit
        admitted.append(e)
    assert sum(admitted) <= budget * (1 + 1e-12)
    assert len(ledger.charges) == len(admitted)
    if not admitted:  # every charge was refused: none created a filter
        assert ledger.filter_state() == {}
        return
    state = ledger.filter_state()["stream"]
    assert state["rule"] == "basic" and state["spent"]["delta"] < DELTA
    assert state["spent"]["epsilon"] == pytest.approx(sum(admitted), rel=1e-12)


def test_filter_state_survives_reload(tmp_path):
    path = tmp_path / "ledger.json"
    ledger = _ledger("sequential", total_epsilon=1.5, path=path)
    ledger.charge(0, _gauss(4.0))
    ledger.charge(1, _gauss(4.0))
    again = TaskLedger.load(path)
    assert again.filter_state() == ledger.filter_state()
    with pytest.raises(BudgetExceededError, match="refused"):
        again.charge(2, _gauss(1.0))
    assert len(TaskLedger.load(path).charges) == 2


_WRITER = textwrap.dedent(
    """
    import sys
    import numpy as np
    sys.path.insert(0, {tests_dir!r})
    from dpcl.accounting.events import GaussianEvent
    from dpcl.guarantees.ledger import TaskLedger
    ledger = TaskLedger.open({path!r}, delta=1e-5, across_tasks="parallel")
    start = len(ledger.charges)
    for t in range(start, start + 1000):
        ledger.charge(t, GaussianEvent(sigma=3.0), unit_ids=np.arange(t * 5000, (t + 1) * 5000))
        print("charged", t, flush=True)
    """
)


@pytest.mark.parametrize("kill_after", [2, 5])
def test_kill_during_writes_never_leaves_a_torn_ledger(tmp_path, kill_after):
    """SIGKILL at an arbitrary point of a stream of large writes (journal lines of 5000 unit ids each): the ledger
    and its journal on disk always load to at least every charge reported done, and the run resumes from them."""
    path = tmp_path / "ledger.json"
    script = _WRITER.format(tests_dir=str(Path(__file__).parent), path=str(path))
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True, env=env)
    done = -1
    for line in proc.stdout:
        done = int(line.split()[1])
        if done >= kill_after:
            proc.send_signal(signal.SIGKILL)  # most likely in the middle of the next charge's write
            break
    proc.wait(timeout=60)
    proc.stdout.close()
    ledger = TaskLedger.load(path)  # never LedgerCorruptError (a torn last journal line is dropped)
    assert len(ledger.charges) >= done + 1
    assert not [p for p in os.listdir(tmp_path) if p != "ledger.json" and not p.endswith((".tmp", ".journal"))]
    resumed = TaskLedger.open(path, delta=1e-5, across_tasks="parallel")
    assert not [p for p in os.listdir(tmp_path) if p.endswith(".journal")]  # folded into the ledger on resume
    n = len(resumed.charges)
    with pytest.raises(DisjointnessViolationError):
        resumed.charge(n, GaussianEvent(sigma=3.0), unit_ids=[0])  # unit 0 already belongs to task 0
    assert len(TaskLedger.load(path).charges) == n


def test_gaussian_type_events_pick_the_gdp_filter():
    from dpcl.accounting.events import PoissonSampledGaussianEvent, RepeatedEvent
    from dpcl.guarantees.ledger import event_is_gaussian_type

    full_batch = RepeatedEvent(PoissonSampledGaussianEvent(noise_multiplier=2.0, sample_rate=1.0), 5)
    sampled = RepeatedEvent(PoissonSampledGaussianEvent(noise_multiplier=2.0, sample_rate=0.1), 5)
    assert event_is_gaussian_type(_gauss(1.0)) and event_is_gaussian_type(full_batch)
    assert not event_is_gaussian_type(sampled)
    assert not event_is_gaussian_type(EpsilonDeltaEvent(epsilon=1.0))


def _reseal(data: dict) -> dict:
    """Recompute a hand-edited ledger's content hash, as a deliberate editor would."""
    import hashlib

    body = {k: v for k, v in data.items() if k != "sha256"}
    data["sha256"] = hashlib.sha256(
        json.dumps(body, sort_keys=True, separators=(",", ":"), allow_nan=False).encode()
    ).hexdigest()
    return data


@pytest.mark.parametrize(
    "edit, message",
    [
        (lambda d: d["charges"][0]["events"][0].__setitem__("adjacency", "replace_one"), "holds an event under"),
        (lambda d: d["charges"][1]["events"][0].__setitem__("unit", "user"), "holds an event under"),
        (lambda d: d["charges"][1].__setitem__("tasks", [0, 1]), "reads the data of several tasks"),
        (lambda d: d["charges"][1].__setitem__("events", []), "at least one event"),
        (lambda d: d["releases"][1].__setitem__("n_charges", 5), "non-decreasing number of charges"),
        (lambda d: d["releases"][0].__setitem__("n_charges", 0), "non-decreasing number of charges"),
        (lambda d: d["releases"][1]["guarantee"].__setitem__("delta", 1e-3), "ledger's settings"),
        (lambda d: d["releases"][0]["guarantee"].__setitem__("across_tasks", "parallel"), "ledger's settings"),
    ],
)
def test_edited_ledger_with_a_recomputed_hash_is_refused_when_inconsistent(tmp_path, edit, message):
    path = tmp_path / "ledger.json"
    ledger = _ledger("sequential", path=path)
    for t in range(2):
        ledger.charge(t, _gauss(2.0 + t))
        ledger.release(t)
    ledger.compact()  # one file holding everything (later saves went to its journal)
    data = json.loads(path.read_text())
    edit(data)
    path.write_text(json.dumps(_reseal(data)))
    with pytest.raises(LedgerCorruptError, match=message):
        TaskLedger.open(path, delta=DELTA, across_tasks="sequential")


def test_resealed_ledger_whose_charges_overspend_its_filter_is_refused(tmp_path):
    path = tmp_path / "ledger.json"
    ledger = _ledger("sequential", path=path, total_epsilon=5.0)
    ledger.charge(0, _gauss(2.0))
    ledger.charge(1, _gauss(2.0))
    ledger.compact()
    data = json.loads(path.read_text())
    data["settings"]["total_epsilon"] = 1.0  # the recorded charges no longer fit the filter
    path.write_text(json.dumps(_reseal(data)))
    with pytest.raises(LedgerCorruptError, match="inconsistent"):
        TaskLedger.load(path)


def test_open_must_exist_refuses_to_reset_a_resumed_run(tmp_path):
    path = tmp_path / "ledger.json"
    with pytest.raises(LedgerCorruptError, match="missing"):
        TaskLedger.open(path, must_exist=True, delta=DELTA, across_tasks="sequential")
    assert not path.exists()  # nothing created
    TaskLedger.open(path, delta=DELTA, across_tasks="sequential").charge(0, _gauss(2.0))
    resumed = TaskLedger.open(path, must_exist=True, delta=DELTA, across_tasks="sequential")
    assert len(resumed.charges) == 1


def test_refused_first_charge_creates_no_filter(tmp_path):
    """A refusal changes no filter and creates none: the live state equals the state rebuilt on reload, and
    the next task's filter takes its rule from the first charge it admits."""
    path = tmp_path / "ledger.json"
    ledger = _ledger("parallel", path=path, total_epsilon=1.0)
    with pytest.raises(BudgetExceededError):
        ledger.charge(0, _gauss(0.1))  # far over budget: refused
    assert ledger.filter_state() == {} and ledger.charges == []
    ledger.charge(0, EpsilonDeltaEvent(epsilon=0.5, delta=0.0))  # a non-Gaussian event: the basic rule
    assert ledger.filter_state()["task0"]["rule"] == "basic"
    assert TaskLedger.load(path).filter_state() == ledger.filter_state()
