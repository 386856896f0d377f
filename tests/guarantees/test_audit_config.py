"""audit_config: stream guarantee of a config and its privacy violations (Gaussian paths, reference accountant)."""

from __future__ import annotations

import copy

import numpy as np
import pytest

from dpcl.accounting.gaussian import gaussian_sigma
from dpcl.errors import ConfigError
from dpcl.guarantees import stream_composition as composition_module
from dpcl.audit_config import audit_config, resolve_across_tasks
from dpcl.guarantees.config import parse_config
from dpcl.guarantees.label_space import FilterReport
from dpcl.guarantees.method_schema import ReleaseCoverage
from dpcl.guarantees.method_schema import MethodKey, TaskPlan

from .reference import gaussian_profile_epsilon, reference_compute

COSINE_RAW = {
    "privacy": {"epsilon": 1.0, "delta": 1e-5},
    "stream": {
        "dataset": "mine",
        "tasks": [[0, 1], [2, 3], [4, 5]],
        "label_space": "prior",
        "prior_labels": [[0, 1], [2, 3], [4, 5]],
        "disjoint_units": True,
    },
    "method": {"name": "cosine"},
}
SIZES = [100, 120, 90]


@pytest.fixture(autouse=True)
def reference_accountant(monkeypatch):
    monkeypatch.setattr(composition_module, "_compute", reference_compute)


def _cfg(**changes):
    raw = copy.deepcopy(COSINE_RAW)
    for dotted, value in changes.items():
        section, key = dotted.split("__")
        raw[section][key] = value
    return parse_config(raw)


def test_parallel_stream_is_one_task():
    report = audit_config(_cfg(), SIZES, filter_reports=[FilterReport(1, 120, 7)])
    assert report.sound and report.exit_code == 0
    assert report.across_tasks == "parallel"
    assert report.epsilon == pytest.approx(1.0, rel=1e-8)
    assert [p["cumulative_epsilon"] for p in report.per_task] == pytest.approx([1.0] * 3, rel=1e-8)
    assert report.per_task[1]["filtered_out"] == 7
    payload = report.to_dict()
    for key in ("epsilon", "delta", "across_tasks", "per_task", "accountant", "assumptions", "violations"):
        assert key in payload
    assert any("Thm 4.4" in a for a in payload["assumptions"])


def test_sequential_stream_composes_every_release():
    report = audit_config(_cfg(stream__disjoint_units=False), SIZES)
    sigma = gaussian_sigma(1.0, 1e-5)
    expected = [gaussian_profile_epsilon(np.sqrt(k) / sigma, 1e-5) for k in (1, 2, 3)]
    assert report.sound and report.across_tasks == "sequential"
    assert [p["cumulative_epsilon"] for p in report.per_task] == pytest.approx(expected, rel=1e-9)
    assert report.epsilon == pytest.approx(expected[-1], rel=1e-9)
    assert 1.0 < report.epsilon < 3.0


def test_replace_one_doubles_cosine_sensitivity():
    report = audit_config(_cfg(privacy__adjacency="replace_one"), SIZES)
    assert report.adjacency == "replace_one" and report.per_task[0]["noise"]["sensitivity"] == 2.0
    assert report.epsilon == pytest.approx(1.0, rel=1e-8)


def test_label_space_from_data_is_a_violation():
    report = audit_config(_cfg(stream__label_space="data"), SIZES)
    assert not report.sound and report.exit_code == 3
    assert "Prop. 4.6" in report.violations[0]
    # not DP for any epsilon: no number is stated, for the stream or any release
    assert report.epsilon is None and report.to_dict()["epsilon"] is None
    for entry in report.per_task:
        assert "epsilon" not in entry and "cumulative_epsilon" not in entry
        assert entry["status"].startswith("not DP")


def test_parallel_without_disjoint_units_is_a_violation_and_accounted_sequentially():
    report = audit_config(_cfg(privacy__across_tasks="parallel", stream__disjoint_units=False), SIZES)
    assert not report.sound and "disjoint_units = false" in report.violations[0]
    assert report.across_tasks == "sequential" and report.epsilon > 1.5
    assert resolve_across_tasks("auto", True) == ("parallel", [])
    assert resolve_across_tasks("sequential", True) == ("sequential", [])


def test_total_epsilon_filter_refuses_the_overspending_task():
    # gdp filter (Gaussian events): budget (1.5, 1e-5); two tasks at eps=1 compose to ~1.39, three to ~1.73.
    report = audit_config(_cfg(stream__disjoint_units=False, privacy__total_epsilon=1.5), SIZES)
    assert not report.sound and report.exit_code == 3
    assert "refused by the privacy filter (total_epsilon)" in report.violations[0]
    assert [p.get("status") for p in report.per_task] == [None, None, "refused by the privacy filter"]
    sigma = gaussian_sigma(1.0, 1e-5)
    assert report.epsilon == pytest.approx(gaussian_profile_epsilon(np.sqrt(2) / sigma, 1e-5), rel=1e-9)
    assert report.filter["stream"]["rule"] == "gdp" and report.filter["stream"]["admitted"] == 2
    ok = audit_config(_cfg(stream__disjoint_units=False, privacy__total_epsilon=2.0), SIZES)
    assert ok.sound and ok.filter["stream"]["admitted"] == 3


def test_filter_refusing_the_first_task_releases_nothing_so_epsilon_is_zero():
    # total_epsilon below one task's cost: nothing is trained or released, so 0 is a sound bound (not "none")
    report = audit_config(_cfg(stream__disjoint_units=False, privacy__total_epsilon=0.5), SIZES)
    assert not report.sound and "refused by the privacy filter" in report.violations[0]
    assert report.per_task[0]["status"] == "refused by the privacy filter"
    assert report.epsilon == 0.0


def test_total_epsilon_with_parallel_guards_each_task():
    report = audit_config(_cfg(privacy__total_epsilon=1.2), SIZES)
    assert report.sound and set(report.filter) == {"task0", "task1", "task2"}


def test_empty_task_keeps_cosine_releasing():
    report = audit_config(_cfg(), [100, 0, 90])
    assert report.sound
    assert report.per_task[1]["status"].startswith("empty task: noise-only")
    assert report.per_task[1]["epsilon"] == pytest.approx(1.0, rel=1e-8)  # the noise-only release is charged


class _SilentSpec:
    """A method that releases nothing on an empty task (refused, Prop. F.1)."""

    name = "silent"
    keys: tuple[MethodKey, ...] = ()
    reuses_past_tasks = False

    def plan_task(self, method, privacy, n_examples, task_index):
        from dpcl.accounting.events import GaussianEvent

        covered = ReleaseCoverage.post_processing("The weights are a post-processing of the noisy release.")
        if n_examples == 0:
            return TaskPlan(events=(), noise={"empty_task_release": "nothing"}, release=covered)
        return TaskPlan(events=(GaussianEvent(sigma=5.0),), noise={"sigma": 5.0}, release=covered)


def test_method_releasing_nothing_on_empty_task_is_a_violation():
    cfg = _cfg()
    cfg = type(cfg)(settings=cfg.settings, stream=cfg.stream, method={"name": "silent"}, spec=_SilentSpec(), raw={})
    report = audit_config(cfg, [100, 0, 90])
    assert not report.sound and "Prop. F.1" in report.violations[0] and "task 1" in report.violations[0]
    # task 0's release was DP; from the silent task on, no epsilon bounds the stream
    assert report.epsilon is None
    assert report.per_task[0]["cumulative_epsilon"] > 0
    assert all("cumulative_epsilon" not in entry for entry in report.per_task[1:])


def test_unit_ids_checked_when_declared_disjoint():
    disjoint = [np.arange(0, 100), np.arange(100, 220), np.arange(220, 310)]
    report = audit_config(_cfg(), SIZES, unit_ids=disjoint)
    assert report.sound and report.across_tasks == "parallel"
    shared = [np.arange(0, 100), np.arange(99, 219), np.arange(220, 310)]
    report = audit_config(_cfg(), SIZES, unit_ids=shared)
    assert not report.sound and report.across_tasks == "sequential"
    assert "share unit '99'" in report.violations[0]
    assert report.epsilon > 1.5  # accounted sequentially: sound for the shared unit
    with pytest.raises(ConfigError, match="unit ids were given for 2 tasks"):
        audit_config(_cfg(), SIZES, unit_ids=disjoint[:2])


def test_task_sizes_checked():
    with pytest.raises(ConfigError, match="2 task sizes were given for 3 tasks"):
        audit_config(_cfg(), [1, 2])
    with pytest.raises(ConfigError, match="integers >= 0"):
        audit_config(_cfg(), [1, 2, -3])


def test_bad_prior_labels_refused_by_the_audit_as_by_the_run():
    """dpcl run filters each task with output_label_sets; the audit must refuse what the run refuses (before,
    a config whose sizes came from task_sizes audited as sound and then failed in the run)."""
    import dataclasses

    raw = copy.deepcopy(COSINE_RAW)
    del raw["stream"]["tasks"]
    raw["stream"]["task_sizes"] = SIZES
    raw["stream"]["prior_labels"] = [[0, 1], [2, 3]]  # 2 lists for 3 tasks
    with pytest.raises(ConfigError, match=r"one label list per task \(3 tasks\)"):
        parse_config(raw)
    # a TrainingConfig built or changed without parse_config is checked by the audit itself
    config = parse_config(COSINE_RAW)
    for bad, message in (([[0, 1], [2, 3]], r"one label list per task \(3 tasks\)"),
                         ([[0, "x"], [2, 3], [4, 5]], r"prior_labels\[0\] must contain integer labels")):
        changed = dataclasses.replace(config, settings=config.settings.replace(prior_labels=bad))
        with pytest.raises(ConfigError, match=message):
            audit_config(changed, SIZES)


def test_exact_task_counts_are_stated_as_public():
    """The report (and every certificate of the run) states exact per-task counts; epsilon does not cover them,
    so the guarantee must say they are treated as public."""
    from dpcl.audit_config import COUNTS_ASSUMPTION

    report = audit_config(_cfg(), SIZES, filter_reports=[FilterReport(t, n, 1) for t, n in enumerate(SIZES)])
    assert COUNTS_ASSUMPTION in report.assumptions
    assert [p["examples"] for p in report.per_task] == SIZES and all(p["filtered_out"] == 1 for p in report.per_task)
