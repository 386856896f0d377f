"""scripts/tobaben_suite.py (the README's results table): configs that parse, resumable records, merging machines."""

from __future__ import annotations

import argparse
import json
import sys
import tomllib
from pathlib import Path

import pytest

from dpcl.audit_config import audit_config
from dpcl.guarantees.config import parse_config as _parse_config

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))


def parse_config(raw, source="<config>"):
    from dpcl.data import STREAM_KEYS

    return _parse_config(raw, source=source, data_stream_keys=STREAM_KEYS)

import tobaben_suite  # noqa: E402


def test_every_setting_is_a_valid_config_with_its_privacy():
    settings = tobaben_suite.settings(["fmnist", "fortunes"])
    assert len(settings) == 2 * len(tobaben_suite.METHODS) * 3
    for s in settings:
        raw = tomllib.loads(s["config"])
        config = parse_config(raw, source=s["setting"])
        assert config.method["name"] == s["method"]
        private = raw.get("run", {}).get("private", True)
        assert private == (s["epsilon"] is not None)
        if s["epsilon"] is not None:
            assert config.settings.epsilon == s["epsilon"]
        if s["method"] == "agem":  # memory units are re-read: the plan refuses anything but sequential
            assert config.settings.across_tasks == "sequential"


def test_agem_setting_audits_to_a_composed_epsilon():
    (agem,) = [s for s in tobaben_suite.settings(["fortunes"]) if s["setting"] == "fortunes-agem-eps1"]
    report = audit_config(parse_config(tomllib.loads(agem["config"])), [224] * 5)
    assert report.sound and report.epsilon > 1.5


def _record(setting, seed, sha, **extra):
    return {"setting": setting, "dataset": setting.split("-")[0], "method": setting.split("-")[1], "seed": seed,
            "epsilon": 1.0, "config_sha256": sha, "verify_rc": 0, "average_accuracy": 0.5 + seed / 100,
            "average_forgetting": 0.1, "accuracy_after_task": [0.9] * 5, "final_epsilon": 1.0,
            "certificates_private": [True] * 5, "cpu_s": 1.0, "device": "cpu", **extra}


def _args(out, **kw):
    base = dict(out=str(out), datasets=["fortunes"], seeds=3, jobs=1, only="fortunes-cosine-eps1", device="cpu",
                runs_dir=None, merge=[], table_only=True, fmnist=tobaben_suite.FMNIST_DIR)
    return argparse.Namespace(**{**base, **kw})


def test_recorded_runs_are_skipped_and_machines_merge(tmp_path, capsys):
    (cosine,) = [s for s in tobaben_suite.settings(["fortunes"]) if s["setting"] == "fortunes-cosine-eps1"]
    sha = tobaben_suite._sha(cosine["config"])
    out = tmp_path / "here"
    out.mkdir()
    (out / "runs.json").write_text(json.dumps({
        "fortunes-cosine-eps1/seed0": _record("fortunes-cosine-eps1", 0, sha),
        "fortunes-cosine-eps1/seed1": _record("fortunes-cosine-eps1", 1, sha, verify_rc=3),
    }))
    other = tmp_path / "other.json"
    other.write_text(json.dumps({
        "fortunes-cosine-eps1/seed1": _record("fortunes-cosine-eps1", 1, sha),
        "fortunes-cosine-eps1/seed2": _record("fortunes-cosine-eps1", 2, sha, device="cuda"),
        "fortunes-cosine-eps1/seed0": _record("fortunes-cosine-eps1", 0, sha, error="RuntimeError: lost"),
    }))
    tobaben_suite.run_suite(_args(out))
    assert "2 runs to do, 1 already recorded" in capsys.readouterr().out  # seed 1 failed verification, seed 2 missing
    tobaben_suite.run_suite(_args(out, merge=[str(other)]))
    assert "0 runs to do, 3 already recorded" in capsys.readouterr().out
    runs = json.loads((out / "runs.json").read_text())
    assert "error" not in runs["fortunes-cosine-eps1/seed0"]  # a passing record is never replaced by a failed one
    assert runs["fortunes-cosine-eps1/seed1"]["verify_rc"] == 0
    table = (out / "table.md").read_text()
    assert "| Cosine Classifier | 0.510 ± 0.010 |" in table and "cpu, cuda" in table


def test_a_changed_config_is_run_again(tmp_path, capsys):
    out = tmp_path / "o"
    out.mkdir()
    (out / "runs.json").write_text(json.dumps(
        {"fortunes-cosine-eps1/seed0": _record("fortunes-cosine-eps1", 0, "an older config")}))
    tobaben_suite.run_suite(_args(out, seeds=1))
    assert "1 runs to do, 0 already recorded" in capsys.readouterr().out


@pytest.mark.parametrize("epsilon", [1.0, None])
def test_bundled_configs_keep_everything_but_epsilon(epsilon):
    text = tobaben_suite.config_text("fmnist", "l2dpml", epsilon)
    bundled = (tobaben_suite.CONFIGS / "fmnist_l2dpml_split.toml").read_text()
    raw, original = tomllib.loads(text), tomllib.loads(bundled)
    assert raw["stream"] == original["stream"] and raw["method"] == original["method"]
    assert raw["privacy"]["epsilon"] == (epsilon or 1.0)
    assert {k: v for k, v in raw["privacy"].items() if k != "epsilon"} == {
        k: v for k, v in original["privacy"].items() if k != "epsilon"}
