"""Method privacy plans (Tobaben et al., Alg. 1, 2, A2, A3)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from dpcl.errors import ConfigError, InvalidParameterError
from dpcl.guarantees.label_space import EMPTY_TASK_RELEASE_KEY, require_proper_release
from dpcl.guarantees.method_schema import get_method_spec
from dpcl.methods.cosine.spec import COSINE, cosine_sensitivity
from dpcl.methods.naive.spec import NAIVE
from dpcl.methods.non_cl.spec import NON_CL
from dpcl.methods.peft_ensemble.spec import PEFT_ENSEMBLE
from dpcl.guarantees.schedules import dpsgd_schedule

from .reference import gaussian_profile_delta

PRIVACY = {"epsilon": 1.0, "delta": 1e-5, "adjacency": "add_remove", "accountant": "auto"}


def test_specs_registered_by_name():
    for name, spec in [("cosine", COSINE), ("peft_ensemble", PEFT_ENSEMBLE), ("naive", NAIVE), ("non_cl", NON_CL)]:
        assert get_method_spec(name) is spec and spec.name == name
    assert NON_CL.reuses_past_tasks and not NAIVE.reuses_past_tasks and not PEFT_ENSEMBLE.reuses_past_tasks


@pytest.mark.parametrize(("adjacency", "sensitivity"), [("add_remove", 1.0), ("replace_one", 2.0)])
def test_cosine_plan_meets_budget_at_true_sensitivity(adjacency, sensitivity):
    plan = COSINE.plan_task({"device": "cpu"}, {**PRIVACY, "adjacency": adjacency}, 100, 0)
    (event,) = plan.events
    assert event.kind == "gaussian" and event.sensitivity == sensitivity and event.adjacency.value == adjacency
    sigma = plan.noise["sigma"]
    assert sigma == event.sigma
    # Balle & Wang profile at mu = sensitivity / sigma: within budget, and tight (a 1% smaller sigma is not).
    assert gaussian_profile_delta(1.0, sensitivity / sigma) <= 1e-5 * (1 + 1e-9)
    assert gaussian_profile_delta(1.0, sensitivity / (0.99 * sigma)) > 1e-5
    assert require_proper_release(COSINE.plan_task({}, PRIVACY, 0, 3).noise, "cosine", 3)


def test_cosine_sensitivity_is_the_worst_row_change():
    """Replace-one: same-class opposite unit vectors change the sum by 2; add/remove by 1."""
    rng = np.random.default_rng(0)
    u = rng.normal(size=8)
    u /= np.linalg.norm(u)
    assert np.linalg.norm(u - (-u)) == pytest.approx(cosine_sensitivity("replace_one"))
    assert np.linalg.norm(u) == pytest.approx(cosine_sensitivity("add_remove"))


def test_dpsgd_schedule_arithmetic():
    assert dpsgd_schedule(100, 32, 3, 0) == (0.32, 3 * math.ceil(100 / 32))
    assert dpsgd_schedule(64, 64, 1, 0) == (1.0, 1)
    with pytest.raises(ConfigError, match=r"batch_size = 65 exceeds the size of task 2 \(64 examples"):
        dpsgd_schedule(64, 65, 1, 2)


def test_dpsgd_empty_task_releases_initialisation():
    method = {"epochs": 1, "batch_size": 8, "max_grad_norm": 1.0}
    for spec in (PEFT_ENSEMBLE, NAIVE, NON_CL):
        plan = spec.plan_task(method, PRIVACY, 0, 1)
        assert plan.events == () and plan.noise[EMPTY_TASK_RELEASE_KEY] == "initialisation"


def test_invalid_inputs():
    with pytest.raises(InvalidParameterError, match="n_examples"):
        COSINE.plan_task({}, PRIVACY, -1, 0)
    with pytest.raises(ConfigError, match=r"\[privacy\] epsilon is required"):
        COSINE.plan_task({}, {"delta": 1e-5}, 10, 0)
    with pytest.raises(ConfigError, match=r"\[method\] epochs is required"):
        NAIVE.plan_task({"batch_size": 8, "max_grad_norm": 1.0}, PRIVACY, 10, 0)


def test_accountant_refusal_never_advises_the_accountant_that_failed():
    # PLD's grid-size guard refuses epsilon = 1e6 at q = 0.1, 50 steps; the old message ended in
    # "use accountant = 'pld' or 'auto'" although the config already said 'pld'.
    method = {"epochs": 5, "batch_size": 50, "max_grad_norm": 1.0}
    pld = {"epsilon": 1e6, "delta": 1e-5, "adjacency": "add_remove", "accountant": "pld"}
    with pytest.raises(ConfigError) as info:
        NAIVE.plan_task(method, pld, 500, 0)
    message = str(info.value)
    assert "accountant = 'pld'" in message and "task 0" in message
    assert "'pld' or 'auto'" not in message
    assert "accountant = 'auto'" in message
    # under replace-one only PLD has a sound analysis: rdp is told to switch to pld or auto
    rdp = {"epsilon": 1.0, "delta": 1e-5, "adjacency": "replace_one", "accountant": "rdp"}
    with pytest.raises(ConfigError, match=r"accountant = 'pld' or 'auto'\.$"):
        NAIVE.plan_task(method, rdp, 500, 0)
