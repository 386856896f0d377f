"""Every method's privacy plan states whether its released checkpoint is covered by the charged events.

A certificate's headline is the guarantee of the checkpoint, so each plan must say whether the checkpoint is a
post-processing of the charged releases (and why), or list every reason it is not (issue: the headline is the
checkpoint).
"""

from __future__ import annotations

import pytest

from dpcl.accounting.events import GaussianEvent
from dpcl.errors import InvalidParameterError
from dpcl.guarantees.method_schema import ReleaseCoverage, ScopedPlan, TaskPlan, get_method_spec
from dpcl.guarantees.per_token import INPUT_EMBEDDINGS_SCOPE_NAME
from dpcl.methods.pecl.spec import PAPER_CLEAN_TARGETS_REASON, PAPER_SCORES_REASON, PAPER_SCULPTING_REASON

PRIVACY = {"epsilon": 1.0, "delta": 1e-5, "adjacency": "add_remove", "accountant": "auto"}
DPSGD_METHOD = {"epochs": 1, "batch_size": 10, "max_grad_norm": 1.0}


def _plan(name: str, method: dict, privacy: dict = PRIVACY, n: int = 100, task: int = 0) -> TaskPlan:
    return get_method_spec(name).plan_task(method, privacy, n, task)


def test_cosine_checkpoint_is_covered_by_its_noisy_sums():
    plan = _plan("cosine", {})
    assert plan.release.covered and "noisy per-class sums" in plan.release.basis and plan.events


@pytest.mark.parametrize("name", ["peft_ensemble", "naive", "non_cl"])
def test_dpsgd_checkpoints_are_covered(name):
    plan = _plan(name, DPSGD_METHOD)
    assert plan.release.covered and "DP-SGD" in plan.release.basis and plan.events
    empty = _plan(name, DPSGD_METHOD, n=0, task=1)
    assert empty.release.covered and empty.events == () and "initialisation" in empty.release.basis


def test_l2dpml_with_fixed_hidden_layers_is_covered():
    plan = _plan("l2dpml", {"hidden_sizes": [16, 8], "input_range": "unit"}, {**PRIVACY, "adjacency": "replace_one",
                                                                             "epsilon": 10.0})
    assert plan.release.covered and "hidden layers fixed" in plan.release.basis and plan.events


def test_pecl_as_in_the_paper_is_not_covered_and_says_why():
    plan = _plan("pecl", {"training": "paper"}, {**PRIVACY, "adjacency": "replace_one", "epsilon": 10.0})
    assert not plan.release.covered
    assert plan.release.reasons == (PAPER_CLEAN_TARGETS_REASON, PAPER_SCORES_REASON, PAPER_SCULPTING_REASON)
    assert "clean private next-token targets" in PAPER_CLEAN_TARGETS_REASON
    assert "lambda_dyn" in PAPER_SCULPTING_REASON and "Omega_k" in PAPER_SCULPTING_REASON
    (scoped,) = plan.scoped
    assert scoped.name == INPUT_EMBEDDINGS_SCOPE_NAME and "input embeddings" in scoped.scope
    assert all(e.unit == "token" for e in scoped.events)


def test_coverage_must_say_why():
    with pytest.raises(InvalidParameterError, match="basis"):
        ReleaseCoverage(covered=True)
    with pytest.raises(InvalidParameterError, match="every reason"):
        ReleaseCoverage.not_covered()
    with pytest.raises(InvalidParameterError, match="every reason"):
        ReleaseCoverage.not_covered("  ")
    with pytest.raises(InvalidParameterError, match="no reasons"):
        ReleaseCoverage(covered=True, basis="noisy sums", reasons=("but",))
    coverage = ReleaseCoverage.not_covered("a", "b")
    assert ReleaseCoverage.from_dict(coverage.to_dict()) == coverage


def test_scoped_plans_are_named_stated_and_distinct():
    event = GaussianEvent(sigma=1.0)
    with pytest.raises(InvalidParameterError, match="scope sentence"):
        ScopedPlan("x", "", (event,))
    with pytest.raises(InvalidParameterError, match="one or more"):
        ScopedPlan("x", "covers x", ())
    with pytest.raises(InvalidParameterError, match="distinct"):
        TaskPlan(events=(), noise={}, scoped=(ScopedPlan("x", "s", (event,)), ScopedPlan("x", "s", (event,))))
    with pytest.raises(InvalidParameterError, match="ReleaseCoverage"):
        TaskPlan(events=(), noise={}, release=True)  # type: ignore[arg-type]
