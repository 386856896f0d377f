"""DP-SGD baselines of the like-for-like PeCL table, certified: ER's buffered and GEM's memory examples are read in
every later task, so their noise is calibrated on the whole stream and the last certificate's worst-example epsilon
meets the row's target (tight), checked against dp-accounting on the charged runs (tiny model, seconds per run)."""

from __future__ import annotations

import sys
from pathlib import Path
import json

import pytest

torch = pytest.importorskip("torch")

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))  # the PeCL tables live there

from dpcl.accounting.accountants import compute_epsilon  # noqa: E402
from dpcl.accounting.dpsgd import dpsgd_events, dpsgd_noise_multiplier  # noqa: E402
from dpcl.errors import InvalidParameterError, PrivacyViolationError  # noqa: E402
from dpcl.guarantees.certificates import verify_certificate  # noqa: E402
from pecl_experiment import METHODS, baseline_dpsgd_plan, fortunes_text_stream, run_method  # noqa: E402
from dpcl.methods.pecl.learner import ContinualLM, baseline_task_reads, learner_config  # noqa: E402

pytestmark = pytest.mark.torch

#: the table's training settings (3 epochs, batch 32) on a tiny model and a small stream
TINY = {"n_layer": 1, "n_embd": 16, "n_head": 1, "max_seq_len": 24, "pretrain_steps": 2, "lora_rank": 2,
        "epochs": 3, "batch_size": 32, "learning_rate": 5e-4, "head_learning_rate": 5e-4}
PUBLIC = [f"public sentence number {i} about {w}" for i, w in enumerate(["tea", "rain", "maps", "owls"] * 4)]


@pytest.fixture(scope="module")
def stream():
    tasks, _, names = fortunes_text_stream(n_tasks=5, classes_per_task=2, max_per_class=30, seed=0)
    return tasks, len(names)


def _reference_epsilon(runs: list[dict], delta: float) -> float:
    """dp-accounting's PLD (fine interval) on every run's DP-SGD steps, composed: the first task's kept example."""
    import dp_accounting
    from dp_accounting.pld import pld_privacy_accountant

    event = dp_accounting.ComposedDpEvent([
        dp_accounting.SelfComposedDpEvent(
            dp_accounting.PoissonSampledDpEvent(r["sample_rate"], dp_accounting.GaussianDpEvent(r["noise_multiplier"])),
            r["steps"])
        for r in runs
    ])
    return pld_privacy_accountant.PLDAccountant(value_discretization_interval=1e-4).compose(event).get_epsilon(delta)


@pytest.mark.parametrize("row", ["ER+DPSGD", "ER+DPSGD (eps=8)", "GEM+DPSGD", "GEM+DPSGD (eps=8)"])
def test_replay_rows_meet_their_target_on_the_worst_example_and_every_certificate_verifies(row, stream, tmp_path):
    tasks, n_labels = stream
    options = METHODS[row]
    target = options.get("dpsgd_epsilon", 1.0)
    result = run_method(row, options, tasks, PUBLIC, n_labels, seed=0, base=TINY, reproducible_noise=True,
                        run_dir=tmp_path / "run")
    privacy = result["privacy"]
    certificates = privacy["certificates"]
    assert len(certificates) == len(tasks)
    for path in certificates:
        verify_certificate(path).raise_if_invalid()
    last = json.loads(open(certificates[-1]).read())["guarantee"]
    assert privacy["epsilon"] == last["epsilon"]
    # the worst example's epsilon over the whole stream: at most the target, within 1 % of it
    assert target * 0.99 <= last["epsilon"] <= target
    # earlier releases compose fewer runs: below the target, never decreasing
    epsilons = privacy["release_epsilons"]
    assert epsilons == sorted(epsilons) and epsilons[0] < target
    # one noise multiplier for the stream, more than a single task's calibration needs
    runs = [r["dpsgd"] for r in result["tasks"]]
    assert len({r["noise_multiplier"] for r in runs}) == 1
    assert runs[0]["noise_multiplier"] > dpsgd_noise_multiplier(target, 1e-6, runs[0]["sample_rate"],
                                                                runs[0]["steps"]).noise_multiplier
    assert all(r["steps_run"] == r["steps"] for r in runs)  # every planned (charged) step was taken
    # independent check of the stated number: dp-accounting on the runs that read the first task's kept example
    reference = _reference_epsilon(runs, 1e-6)
    assert reference <= last["epsilon"] * (1 + 1e-3)
    assert reference == pytest.approx(last["epsilon"], rel=0.01)
    # the certificate never states less than the composition of every charged run
    events = [dpsgd_events(r["noise_multiplier"], r["sample_rate"], r["steps"]) for r in runs]
    assert last["epsilon"] >= compute_epsilon(events, 1e-6, "pld").epsilon * (1 - 1e-9)


def test_er_task_reads_its_own_and_every_buffered_task_gem_queries_every_memory():
    er = learner_config(strategy="er", privacy="dpsgd", replay_per_task=16)
    assert baseline_task_reads(er, [96, 96, 10]) == [((0,), 96), ((0, 1), 112), ((0, 1, 2), 42)]
    gem = learner_config(strategy="gem", privacy="dpsgd", replay_per_task=16)
    assert baseline_task_reads(gem, [96, 96, 10]) == [((0,), 96), ((0, 1), 96), ((0, 1, 2), 10)]
    seq = learner_config(strategy="seqft", privacy="dpsgd")
    assert baseline_task_reads(seq, [96, 96]) == [((0,), 96), ((1,), 96)]
    none = learner_config(strategy="er", privacy="dpsgd", replay_per_task=0)
    assert baseline_task_reads(none, [96, 96]) == [((0,), 96), ((1,), 96)]


def test_tasks_that_read_only_their_own_examples_are_calibrated_alone():
    config = learner_config(strategy="seqft", privacy="dpsgd", dpsgd_epsilon=1.0, batch_size=32, epochs=3)
    plan = baseline_dpsgd_plan(config, [96, 96])
    single = dpsgd_noise_multiplier(1.0, 1e-6, 32 / 96, 9).noise_multiplier
    assert [p["noise_multiplier"] for p in plan] == [single, single]
    assert all(p["calibration"].startswith("task") for p in plan)


def test_a_plan_that_differs_from_the_training_is_refused():
    config = learner_config(**TINY, strategy="er", privacy="dpsgd")
    learner = ContinualLM(4, config, 0, PUBLIC)
    texts = [f"text {i}" for i in range(40)]
    labels = [i % 2 for i in range(40)]
    planned = {"noise_multiplier": 5.0, "sample_rate": 0.5, "steps": 6, "max_grad_norm": 1.0}
    with pytest.raises(PrivacyViolationError, match="sample_rate"):
        learner.fit_task(0, texts, labels, dpsgd=planned)
    plain = ContinualLM(4, learner_config(**TINY, strategy="er", privacy="none"), 0, PUBLIC)
    with pytest.raises(InvalidParameterError, match="privacy='dpsgd'"):
        plain.fit_task(0, texts, labels, dpsgd=planned)


def test_a_certified_run_refuses_a_used_directory(stream, tmp_path):
    tasks, n_labels = stream
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "ledger.json").write_text("{}")
    with pytest.raises(InvalidParameterError, match="not empty"):
        run_method("ER+DPSGD", METHODS["ER+DPSGD"], tasks, PUBLIC, n_labels, seed=0, base=TINY,
                   run_dir=tmp_path / "run")
    assert (tmp_path / "run" / "ledger.json").read_text() == "{}"  # nothing charged over an earlier ledger
