"""Cross-check of stated epsilons against dp-accounting (dpcl.guarantees.cross_check).

References: the Gaussian closed form (Balle & Wang 2018, Thm 8, by brentq here),
the pure-DP Laplace epsilon, and prv-accountant's bounds for DP-SGD -- never
dpcl's own accountants.
"""

from __future__ import annotations

import copy
import math

import pytest
from prv_accountant import PRVAccountant
from prv_accountant.privacy_random_variables import PoissonSubsampledGaussianMechanism
from scipy.optimize import brentq
from scipy.stats import norm

from dpcl.accounting.events import (
    EpsilonDeltaEvent,
    GaussianEvent,
    LaplaceEvent,
    PoissonSampledGaussianEvent,
    RepeatedEvent,
)
from dpcl.errors import MalformedCertificateError
from dpcl.guarantees.cross_check import cross_check_certificate, independent_epsilon
from dpcl.guarantees.ledger import TaskLedger

DELTA = 1e-5


def _gdp_epsilon(mu: float, delta: float) -> float:
    d = lambda e: norm.cdf(-e / mu + mu / 2) - math.exp(e) * norm.cdf(-e / mu - mu / 2)  # noqa: E731
    return brentq(lambda e: d(e) - delta, 0.0, 100.0, xtol=1e-13)


# -- independent bounds bracket the true epsilon ----------------------------------------------------------
@pytest.mark.parametrize("adjacency", ["add_remove", "replace_one"])
def test_gaussian_bounds_bracket_the_closed_form(adjacency):
    events = [GaussianEvent(sigma=2.0, sensitivity=1.0, adjacency=adjacency),
              RepeatedEvent(GaussianEvent(sigma=6.0, sensitivity=2.0, adjacency=adjacency), 5)]
    truth = _gdp_epsilon(math.sqrt(0.25 + 5 / 9), DELTA)
    bounds = independent_epsilon(events, DELTA)
    assert bounds.lower <= truth <= bounds.upper
    assert bounds.discretisation_error < 1e-3 and bounds.relation == adjacency


def test_replace_one_laplace_is_restated_under_add_remove_and_gives_the_pure_dp_epsilon():
    events = [LaplaceEvent(scale=0.4, sensitivity=1.0, adjacency="replace_one") for _ in range(2)]
    bounds = independent_epsilon(events, 1e-12)
    assert bounds.relation == "add_remove" and "restated under add/remove" in bounds.notes[0]
    assert bounds.lower <= 5.0 <= bounds.upper + 1e-9 and bounds.upper <= 5.0 + 1e-3


def test_dpsgd_bounds_agree_with_prv_accountant():
    z, q, steps = 1.1, 0.05, 200
    bounds = independent_epsilon(
        RepeatedEvent(PoissonSampledGaussianEvent(noise_multiplier=z, sample_rate=q), steps), DELTA
    )
    prv = PRVAccountant(prvs=PoissonSubsampledGaussianMechanism(noise_multiplier=z, sampling_probability=q),
                        max_self_compositions=steps, eps_error=0.01, delta_error=DELTA / 1000)
    prv_lower, _, prv_upper = prv.compute_epsilon(delta=DELTA, num_self_compositions=steps)
    assert bounds.lower <= prv_upper and prv_lower <= bounds.upper
    assert bounds.lower <= bounds.upper <= bounds.lower + 0.05


# -- certificates ---------------------------------------------------------------------------------------
def _certificate(across_tasks: str = "parallel", accountant: str = "auto") -> dict:
    """Headline of the last release of a 3-task ledger, in the shape certificates store it."""
    ledger = TaskLedger(delta=DELTA, across_tasks=across_tasks, accountant=accountant)
    for t, sigma in enumerate((3.0, 4.0, 5.0)):
        ledger.charge(t, [RepeatedEvent(PoissonSampledGaussianEvent(noise_multiplier=sigma / 3, sample_rate=0.1), 20)])
        record = ledger.release(t)
    return {"guarantee": record.guarantee.to_dict(), "events": [c.to_dict() for c in ledger.charges]}


@pytest.mark.parametrize("across_tasks", ["parallel", "sequential"])
def test_an_honest_certificate_passes_with_both_numbers(across_tasks):
    cert = _certificate(across_tasks)
    report = cross_check_certificate(cert, interval=1e-3)
    assert report.passed and len(report.statements) == 1
    (statement,) = report.statements
    assert statement.name == "checkpoint" and not statement.skipped
    assert len(statement.groups) == (3 if across_tasks == "parallel" else 1)
    # dpcl's stated number and dp-accounting's agree to the discretisation error
    assert statement.lower_epsilon <= cert["guarantee"]["epsilon"]
    assert abs(statement.independent_epsilon - cert["guarantee"]["epsilon"]) <= statement.discretisation_error + 1e-3
    if across_tasks == "parallel":  # the stream is the worst group
        assert statement.independent_epsilon == max(g.independent_epsilon for g in statement.groups)
    payload = report.to_dict()
    assert payload["passed"] and payload["statements"][0]["independent_epsilon"] == statement.independent_epsilon


def test_an_understated_epsilon_fails_and_one_within_the_discretisation_error_passes():
    cert = _certificate()
    (statement,) = cross_check_certificate(cert, interval=1e-3).statements
    low = copy.deepcopy(cert)
    low["guarantee"]["epsilon"] = statement.lower_epsilon * 0.99
    failed = cross_check_certificate(low, interval=1e-3)
    assert not failed.passed and "below the independent one" in failed.statements[0].detail
    within = copy.deepcopy(cert)
    within["guarantee"]["epsilon"] = statement.lower_epsilon
    assert cross_check_certificate(within, interval=1e-3).passed
    group = copy.deepcopy(cert)  # a group's own stated epsilon is checked too
    group["guarantee"]["groups"][0]["epsilon"] = 0.1
    report = cross_check_certificate(group, interval=1e-3)
    assert not report.passed and "tasks [0]: stated 0.1" in report.statements[0].detail


def test_events_without_a_dp_accounting_counterpart_are_reported_not_cross_checked():
    ledger = TaskLedger(delta=DELTA, across_tasks="sequential", accountant="basic")
    ledger.charge(0, [EpsilonDeltaEvent(epsilon=1.0, source="a theorem")])
    record = ledger.release(0)
    report = cross_check_certificate({"guarantee": record.guarantee.to_dict(),
                                      "events": [c.to_dict() for c in ledger.charges]})
    (statement,) = report.statements
    assert report.passed and statement.independent_epsilon is None
    assert statement.detail.startswith("not cross-checked: ") and "epsilon_delta" in statement.detail


def test_version_2_non_private_checkpoint_cross_checks_only_its_scoped_statements():
    scoped = _certificate()
    cert = {
        "guarantee": {"private": False, "epsilon": None, "reasons": ["clean private targets"]},
        "events": [],
        "scoped_guarantees": [{"name": "input_release", "scope": "the noisy inputs only",
                               **scoped["guarantee"], "events": scoped["events"]}],
    }
    report = cross_check_certificate(cert, interval=1e-3)
    assert report.passed and [s.name for s in report.statements] == ["scoped input_release"]
    assert "not private" in report.message and "scoped" in report.message
    bare = {"guarantee": {"private": False, "epsilon": None}, "events": [], "scoped_guarantees": []}
    report = cross_check_certificate(bare, interval=1e-3)
    assert report.passed and report.statements == () and "no epsilon to cross-check" in report.message


def test_malformed_input_is_a_typed_error(tmp_path):
    with pytest.raises(MalformedCertificateError, match="does not exist"):
        cross_check_certificate(tmp_path / "missing.json")
    with pytest.raises(MalformedCertificateError, match="no guarantee"):
        cross_check_certificate({"events": []})
    cert = _certificate()
    cert["events"] = [{"kind": "nothing"}]
    with pytest.raises(MalformedCertificateError, match="malformed"):
        cross_check_certificate(cert, interval=1e-3)


def test_groups_dp_accounting_cannot_bound_here_are_refused_before_anything_large_is_allocated():
    """Found by the CLI fuzz test (thorough, 2026-11-27): a count whose PLD needs more than 2 GiB, and a delta
    below what dp-accounting's discretisation resolves (its bounds came out inf and NaN), are not cross-checked."""
    from dpcl.errors import UnsupportedEventError

    step = PoissonSampledGaussianEvent(noise_multiplier=1.0, sample_rate=0.01)
    with pytest.raises(UnsupportedEventError, match="grid points"):  # sized, not built (a build needed > 2 GiB)
        independent_epsilon(RepeatedEvent(step, 22_686_937), 1e-5)
    with pytest.raises(UnsupportedEventError, match="no finite epsilon"):
        independent_epsilon(RepeatedEvent(GaussianEvent(sigma=2.0, sensitivity=1.0), 2), 2.6761198581319977e-288)
