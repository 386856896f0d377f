"""``dpcl audit-run --in-stream``: canaries mixed into a real certified run, audited black box from its releases."""

from __future__ import annotations

import json
import subprocess
import sys
from types import SimpleNamespace

import numpy as np
import pytest

pytest.importorskip("torch")

from dpcl.errors import ConfigError  # noqa: E402
from dpcl.runner.canary_run import add_canaries, run_with_canaries  # noqa: E402


def _task(index, n, labels, start_id):
    rng = np.random.default_rng(index)
    return SimpleNamespace(
        index=index, features=rng.random((n, 4)).astype(np.float32) * 3 - 1,
        labels=rng.choice(labels, n).astype(np.int64), unit_ids=np.arange(start_id, start_id + n),
        output_labels=tuple(labels), texts=None,
    )


def test_add_canaries_appends_the_included_ones_as_new_units_inside_the_public_label_set():
    import dataclasses

    @dataclasses.dataclass(frozen=True)
    class Task:
        index: int
        features: np.ndarray
        labels: np.ndarray
        unit_ids: np.ndarray
        output_labels: tuple
        texts: object

    tasks = [Task(**vars(_task(0, 50, (0, 1), 0))), Task(**vars(_task(1, 40, (2, 3), 50)))]
    out, sets = add_canaries(tasks, 300, np.random.default_rng(0))
    seen_ids = set()
    for task, new, canaries in zip(tasks, out, sets):
        k = int(canaries.included.sum())
        assert 100 < k < 200  # each included with probability 1/2
        assert len(new.labels) == len(task.labels) + k
        np.testing.assert_array_equal(new.features[len(task.labels):], canaries.features[canaries.included])
        assert set(np.unique(canaries.labels)) <= set(task.output_labels)
        low, high = task.features.min(0), task.features.max(0)
        assert np.all(canaries.features >= low - 1e-6) and np.all(canaries.features <= high + 1e-6)
        ids = set(new.unit_ids.tolist())
        assert len(ids) == len(new.unit_ids) and not ids & seen_ids  # fresh, unique unit ids
        seen_ids |= ids


def test_default_audit_run_certifies_a_canary_run_and_audits_it_beside_the_harness(tmp_path):
    out = tmp_path / "run"
    proc = subprocess.run(
        [sys.executable, "-m", "dpcl", "audit-run", "dpcl/configs/naive.toml", "--out", str(out),
         "--canaries", "100", "--json"],
        capture_output=True, text=True, timeout=600,
    )
    assert proc.returncode == 0, proc.stderr
    payload = json.loads((out / "audit" / "audit.json").read_text())
    assert payload["mode"] == "both" and payload["verdict"] == "consistent"
    assert payload["harness"]["mode"] == "harness" and len(payload["harness"]["tasks"]) == 5
    assert len(payload["tasks"]) == 5
    for t in payload["tasks"]:
        assert 0 <= t["empirical_epsilon_lower"] <= t["certified_epsilon"]
        assert 0 <= t["harness_empirical_epsilon_lower"] <= t["harness_certified_epsilon"]
        assert t["examples"] > t["black_box"]["included"] > 0  # the included canaries were trained on
        assert "epsilon_lower" in t["white_box"]
    text = (out / "audit" / "audit.md").read_text()
    assert "not a model to deploy" in text and "The DP-SGD harness" in text
    verify = subprocess.run([sys.executable, "-m", "dpcl", "verify", str(out)], capture_output=True, text=True, timeout=300)
    assert verify.returncode == 0, verify.stdout + verify.stderr  # the run's certificates are true for what it trained
    report = subprocess.run([sys.executable, "-m", "dpcl", "report", str(out), "--out", str(tmp_path / "r.html")],
                            capture_output=True, text=True, timeout=300)
    assert report.returncode == 0, report.stderr
    assert "One-run empirical audit" in (tmp_path / "r.html").read_text()


def test_in_stream_audit_flags_a_method_that_leaks_its_training_examples(tmp_path, monkeypatch):
    # a deliberately broken implementation: it remembers its training inputs and, at prediction, favours the
    # remembered label of any input it has seen, while its charges still claim DP-SGD's epsilon
    from dpcl.methods.naive.method import NaiveFineTuning

    fit, scores = NaiveFineTuning.fit_task, NaiveFineTuning.scores
    memory: dict[bytes, int] = {}

    def leaky_fit(self, t, data, outputs, plan, progress=None):
        memory.update({row.tobytes(): int(label) for row, label in zip(np.asarray(data.features), data.labels)})
        return fit(self, t, data, outputs, plan, progress=progress)

    def leaky_scores(self, features):
        s = np.array(scores(self, features), dtype=np.float64)
        for i, row in enumerate(np.asarray(features, dtype=np.float32)):
            label = memory.get(row.tobytes())
            if label is not None:
                s[i, self.label_positions([label])[0]] += 100.0
        return s

    monkeypatch.setattr(NaiveFineTuning, "fit_task", leaky_fit)
    monkeypatch.setattr(NaiveFineTuning, "scores", leaky_scores)
    payload = run_with_canaries("dpcl/configs/naive.toml", tmp_path / "run", canaries=200, confidence=0.95)
    assert payload["verdict"] == "violated"
    assert payload["empirical_epsilon_lower"] > payload["tasks"][0]["certified_epsilon"]


def test_in_stream_refuses_replace_one_configs_and_harness_options(tmp_path):
    with pytest.raises(ConfigError, match="add/remove"):
        run_with_canaries("dpcl/configs/l2dpml_split_digits.toml", tmp_path / "a", canaries=50, confidence=0.95)
    proc = subprocess.run(
        [sys.executable, "-m", "dpcl", "audit-run", "dpcl/configs/naive.toml", "--out", str(tmp_path / "b"),
         "--mode", "stream", "--canary-kind", "input"],
        capture_output=True, text=True, timeout=300,
    )
    assert proc.returncode == 2 and "--mode" in proc.stderr and "Traceback" not in proc.stderr


def test_stream_mode_audits_a_method_without_dpsgd(tmp_path):
    out = tmp_path / "run"
    proc = subprocess.run(
        [sys.executable, "-m", "dpcl", "audit-run", "dpcl/configs/cosine.toml", "--out", str(out), "--canaries", "100",
         "--json"],
        capture_output=True, text=True, timeout=600,
    )
    assert proc.returncode == 0, proc.stderr
    payload = json.loads((out / "audit" / "audit.json").read_text())
    assert payload["method"] == "cosine" and payload["harness"].startswith("not run")
    assert 0 <= payload["empirical_epsilon_lower"] <= payload["certified_epsilon"]


class _ScoringMethod:
    """A released model as canary_margins sees it: scores over label positions, the labels released so far."""

    def __init__(self, scores, seen):
        self._scores, self.seen_labels = np.asarray(scores, dtype=np.float64), np.asarray(seen, dtype=bool)

    def scores(self, features):
        return self._scores

    def label_positions(self, labels):
        return np.asarray(labels, dtype=np.int64)


def _canaries(labels):
    from dpcl.runner.canary_run import CanarySet

    n = len(labels)
    return CanarySet(task=0, features=np.zeros((n, 2), np.float32), labels=np.asarray(labels),
                     included=np.zeros(n, bool), unit_ids=np.arange(n))


def test_canary_margins_are_the_own_label_score_over_the_best_other_released_label():
    from dpcl.runner.canary_run import canary_margins

    method = _ScoringMethod([[2.0, 0.5, 9.0], [1.0, 3.0, 9.0]], seen=[True, True, False])  # label 2 not released
    np.testing.assert_array_equal(canary_margins(method, _canaries([0, 0])), [1.5, -2.0])


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
@pytest.mark.parametrize("column", [0, 1])
def test_a_non_finite_score_of_a_released_label_is_refused_not_replaced(bad, column):
    from dpcl.errors import InvalidParameterError
    from dpcl.runner.canary_run import canary_margins

    scores = [[2.0, 0.5, 9.0], [1.0, 3.0, 9.0]]
    scores[1][column] = bad
    with pytest.raises(InvalidParameterError, match="non-finite score"):
        canary_margins(_ScoringMethod(scores, seen=[True, True, False]), _canaries([0, 0]))
    # a label not released yet may score anything: it is never compared
    scores[1][column], scores[1][2] = 1.0, bad
    assert np.isfinite(canary_margins(_ScoringMethod(scores, seen=[True, True, False]), _canaries([0, 0]))).all()
