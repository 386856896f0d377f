"""The plan of the DP PeCL (``[method] training = "dp_sgd"``): the checkpoint's guarantee is DP-SGD per example.

The calibrated epsilon is cross-checked against dp-accounting's PLD and RDP accountants called directly (not
through dpcl's accounting core).
"""

from __future__ import annotations

import math

import dp_accounting
import pytest
from dp_accounting.pld import pld_privacy_accountant
from dp_accounting.rdp import rdp_privacy_accountant

from dpcl.errors import ConfigError
from dpcl.guarantees import per_token as pt
import dpcl.methods.pecl.spec as pecl_spec  # noqa: E402
from dpcl.guarantees.method_schema import get_method_spec

PRIVACY = {"epsilon": 1.0, "delta": 1e-6, "adjacency": "add_remove", "accountant": "auto"}
METHOD = {"epochs": 3, "batch_size": 32, "max_grad_norm": 0.5, "max_seq_len": 32}


def _dp_accounting_epsilon(noise_multiplier: float, q: float, steps: int, delta: float, accountant: str,
                           replace: bool = False) -> float:
    """epsilon of ``steps`` Poisson-sampled Gaussian steps, from dp-accounting directly."""
    event = dp_accounting.SelfComposedDpEvent(
        dp_accounting.PoissonSampledDpEvent(q, dp_accounting.GaussianDpEvent(noise_multiplier)), steps
    )
    if accountant == "pld":
        neighbors = (dp_accounting.NeighboringRelation.REPLACE_ONE if replace
                     else dp_accounting.NeighboringRelation.ADD_OR_REMOVE_ONE)
        acc = pld_privacy_accountant.PLDAccountant(neighbors, value_discretization_interval=1e-4)
    else:
        acc = rdp_privacy_accountant.RdpAccountant()
    return float(acc.compose(event).get_epsilon(delta))


def test_default_training_is_dp_sgd_and_the_checkpoint_is_covered_per_example():
    plan = get_method_spec("pecl").plan_task(METHOD, PRIVACY, 200, 0)
    assert plan.noise["training"] == "dp_sgd"
    (event,) = plan.events
    assert event.unit == "example" and event.adjacency.value == "add_remove"
    assert event.count == plan.noise["steps"] == 3 * math.ceil(200 / 32)
    assert event.event.sample_rate == pytest.approx(32 / 200) == plan.noise["sample_rate"]
    assert event.event.noise_multiplier == plan.noise["noise_multiplier"]
    assert plan.noise["max_grad_norm"] == 0.5
    assert plan.release is not None and plan.release.covered and plan.release == pecl_spec.DPSGD_PECL_RELEASE
    assert "post-processing of the charged DP-SGD runs" in plan.release.basis
    # the per-token TDP statement is scoped to the input embeddings, never the headline
    (scoped,) = plan.scoped
    assert scoped.name == pt.INPUT_EMBEDDINGS_SCOPE_NAME and scoped.scope == pecl_spec.DPSGD_INPUT_EMBEDDINGS_SCOPE
    assert all(e.unit == "token" and e.adjacency.value == "replace_one" for e in scoped.events)
    assert scoped.events[0].count == 3  # one perturbation per epoch
    assert "does not apply" in scoped.scope and "same sigma" in scoped.scope and "public" in scoped.scope
    # what is public is said; the paper's data-dependence caveat is not in a DP PeCL plan
    assert pecl_spec.PUBLIC_STATE_ASSUMPTION in plan.assumptions and pecl_spec.PECL_DPSGD_ASSUMPTION in plan.assumptions
    assert pt.DATA_DEPENDENCE_ASSUMPTION not in plan.assumptions
    assert "public" in pecl_spec.PUBLIC_STATE_ASSUMPTION and "Omega_k" in pecl_spec.PUBLIC_STATE_ASSUMPTION


@pytest.mark.parametrize("epsilon", [1.0, 8.0])
def test_calibrated_epsilon_agrees_with_dp_accounting(epsilon):
    plan = pecl_spec.PECL_SPEC.plan_task(METHOD, {**PRIVACY, "epsilon": epsilon}, 200, 0)
    z, q, steps = plan.noise["noise_multiplier"], plan.noise["sample_rate"], plan.noise["steps"]
    pld = _dp_accounting_epsilon(z, q, steps, 1e-6, "pld")
    rdp = _dp_accounting_epsilon(z, q, steps, 1e-6, "rdp")
    # the budget is met (PLD within its discretisation), and the calibration is not loose
    assert pld <= epsilon * (1 + 1e-3)
    assert pld >= 0.97 * epsilon
    assert rdp >= pld * (1 - 1e-3)  # RDP is the looser sound bound
    # a little less noise would break the budget
    assert _dp_accounting_epsilon(0.95 * z, q, steps, 1e-6, "pld") > epsilon


def test_replace_one_adjacency_is_taken_from_privacy():
    plan = pecl_spec.PECL_SPEC.plan_task(METHOD, {**PRIVACY, "adjacency": "replace_one", "epsilon": 2.0}, 200, 1)
    (event,) = plan.events
    assert event.adjacency.value == "replace_one" and event.unit == "example"
    pld = _dp_accounting_epsilon(event.event.noise_multiplier, event.event.sample_rate, event.count, 1e-6, "pld",
                                 replace=True)
    assert 0.97 * 2.0 <= pld <= 2.0 * (1 + 1e-3)


def test_the_token_budget_is_not_the_checkpoint_budget():
    """Under dp_sgd, [privacy] epsilon is the DP-SGD budget; eps_upper = 10 is the scoped token statement's."""
    plan = pecl_spec.PECL_SPEC.plan_task({**METHOD, "epsilon_upper": 10.0}, {**PRIVACY, "epsilon": 1.0}, 200, 0)
    assert plan.noise["task_epsilon"] <= 1.0 + 1e-9
    assert plan.noise["per_token"]["epsilon"] == pytest.approx(10.0, rel=1e-6)
    # the paper's training still refuses eps_upper above [privacy] epsilon (its only statement is per token)
    with pytest.raises(ConfigError, match="epsilon_upper"):
        pecl_spec.PECL_SPEC.plan_task({**METHOD, "training": "paper"}, {**PRIVACY, "epsilon": 8.0}, 200, 0)


def test_empty_task_charges_nothing_and_batch_larger_than_task_is_refused():
    empty = pecl_spec.PECL_SPEC.plan_task(METHOD, PRIVACY, 0, 2)
    assert empty.events == () and empty.release.covered and empty.noise["steps"] == 0
    with pytest.raises(ConfigError, match="batch_size"):
        pecl_spec.PECL_SPEC.plan_task(METHOD, PRIVACY, 10, 0)
    keys = {k.name: k for k in pecl_spec.PECL_KEYS}
    assert keys["training"].check("dp") is not None and keys["training"].check("paper") is None
    assert keys["max_grad_norm"].check(0.0) is not None


def test_paper_training_keeps_its_plan():
    paper = pecl_spec.PECL_SPEC.plan_task({**METHOD, "training": "paper"}, {**PRIVACY, "epsilon": 10.0}, 200, 0)
    assert not paper.release.covered and paper.events == () and paper.scoped[0].events[0].unit == "token"
    assert pt.DATA_DEPENDENCE_ASSUMPTION in paper.assumptions
