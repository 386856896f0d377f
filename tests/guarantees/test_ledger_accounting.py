"""The ledger and method plans on the real accounting core, checked against dp-accounting and prv-accountant
called directly (independent references), and certificates recomputed with PLD/PRV."""

from __future__ import annotations

import json

import dp_accounting
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from dp_accounting.pld import pld_privacy_accountant
from prv_accountant import PoissonSubsampledGaussianMechanism, PRVAccountant

from dpcl.accounting.dpsgd import dpsgd_events
from dpcl.guarantees.certificates import certificate_from_ledger, verify_certificate, write_certificate
from dpcl.guarantees.ledger import TaskLedger
from dpcl.guarantees.method_schema import ReleaseCoverage
from dpcl.methods.peft_ensemble.spec import PEFT_ENSEMBLE

DELTA = 1e-5
RUNS = [(2.0, 0.1, 8), (1.5, 0.2, 5), (2.5, 0.05, 10)]  # (noise multiplier, q, steps) per task

COVERED = ReleaseCoverage.post_processing("The checkpoint is a post-processing of the charged noisy releases.")


def _pld_epsilon(runs, delta=DELTA):
    acc = pld_privacy_accountant.PLDAccountant(value_discretization_interval=1e-4)
    for z, q, steps in runs:
        acc.compose(dp_accounting.PoissonSampledDpEvent(q, dp_accounting.GaussianDpEvent(z)), steps)
    return acc.get_epsilon(delta)


def _ledger(across, accountant="pld"):
    ledger = TaskLedger(delta=DELTA, across_tasks=across, accountant=accountant)
    for t, (z, q, steps) in enumerate(RUNS):
        ledger.charge(t, dpsgd_events(z, q, steps))
    return ledger


def test_parallel_is_worst_task_per_dp_accounting():
    g = _ledger("parallel").guarantee()
    per_task = [_pld_epsilon([r]) for r in RUNS]
    assert g.epsilon == pytest.approx(max(per_task), rel=1e-6)
    assert [grp.epsilon for grp in g.groups] == pytest.approx(per_task, rel=1e-6)


def test_sequential_is_pld_composition_per_dp_accounting():
    g = _ledger("sequential").guarantee()
    assert g.epsilon == pytest.approx(_pld_epsilon(RUNS), rel=1e-6)
    assert max(_pld_epsilon([r]) for r in RUNS) <= g.epsilon


def test_prv_ledger_brackets_prv_accountant():
    z, q, steps = RUNS[0]
    ledger = TaskLedger(delta=DELTA, across_tasks="parallel", accountant="prv")
    ledger.charge(0, dpsgd_events(z, q, steps))
    eps = ledger.guarantee().epsilon
    prv = PRVAccountant(
        prvs=[PoissonSubsampledGaussianMechanism(noise_multiplier=z, sampling_probability=q)],
        max_self_compositions=[steps],
        eps_error=0.01,
        delta_error=DELTA / 1000,
    )
    lower, _, _ = prv.compute_epsilon(delta=DELTA, num_self_compositions=[steps])
    assert eps >= lower  # an upper bound is never below the library's lower bound
    assert eps == pytest.approx(_pld_epsilon([RUNS[0]]), rel=0.05)


def test_peft_plan_meets_target_per_dp_accounting():
    method = {"epochs": 1, "batch_size": 25, "max_grad_norm": 1.0}
    plan = PEFT_ENSEMBLE.plan_task(method, {"epsilon": 2.0, "delta": DELTA, "accountant": "pld"}, 250, 0)
    noise = plan.noise
    assert noise["sample_rate"] == 0.1 and noise["steps"] == 10
    eps = _pld_epsilon([(noise["noise_multiplier"], 0.1, 10)])
    assert eps <= 2.0 * (1 + 1e-9)
    assert _pld_epsilon([(noise["noise_multiplier"] * 0.98, 0.1, 10)]) > 2.0  # calibrated tightly


@pytest.mark.parametrize("accountant", ["pld", "prv", "auto"])
def test_certificate_with_dpsgd_events_recomputes(tmp_path, accountant):
    ledger = _ledger("sequential", accountant)
    ckpt = tmp_path / "model.bin"
    ckpt.write_bytes(b"weights")
    ledger.release(2)
    cert = certificate_from_ledger(ledger, release=COVERED, method="peft_ensemble", label_space="prior", assumptions=["x."])
    path = write_certificate(tmp_path / "c.json", cert)
    report = verify_certificate(path)
    assert report.valid, report.failed
    assert report.relative_tolerance == 1e-6
    # recomputed deterministically (auto re-runs its own comparison with its own settings)
    assert report.recomputed_epsilon == report.stated_epsilon
    data = json.loads(path.read_text())
    data["events"][1]["events"][0]["event"]["noise_multiplier"] = 1.8  # was 1.5: less spent, epsilon drops
    path.write_text(json.dumps(data))
    assert "epsilon" in [c.name for c in verify_certificate(path).failed]


dpsgd_runs = st.lists(
    st.tuples(st.floats(1.0, 4.0), st.floats(0.01, 0.3), st.integers(1, 20)), min_size=1, max_size=4
)


@pytest.mark.thorough
@settings(max_examples=20, deadline=None)
@given(dpsgd_runs, st.sampled_from(["parallel", "sequential"]))
def test_real_accounting_properties(runs, across):
    """On DP-SGD tasks with auto accounting: parallel = worst task, sequential in [worst, sum at delta/T],
    and one more task never lowers epsilon."""
    ledger = TaskLedger(delta=DELTA, across_tasks=across, accountant="auto")
    previous = 0.0
    for t, (z, q, steps) in enumerate(runs):
        ledger.charge(t, dpsgd_events(z, q, steps))
        eps = ledger.guarantee().epsilon
        assert eps >= previous * (1 - 1e-9)
        previous = eps
    per_task = [ledger.task_guarantee(t) for t in range(len(runs))]
    if across == "parallel":
        assert previous == pytest.approx(max(per_task), rel=1e-12)
    else:
        assert previous >= max(per_task) * (1 - 1e-3)  # auto may pick different accountants per group
        split = [
            TaskLedger(delta=DELTA / len(runs), across_tasks="parallel", accountant="auto") for _ in runs
        ]
        for led, (z, q, steps) in zip(split, runs):
            led.charge(0, dpsgd_events(z, q, steps))
        assert previous <= sum(led.guarantee().epsilon for led in split) * (1 + 1e-9)
