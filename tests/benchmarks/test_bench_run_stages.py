"""bench_run_stages: how a profile is split into accounting, training and the rest."""

from __future__ import annotations

import sys
from pathlib import Path
from types import SimpleNamespace

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

import bench_run_stages as stages  # noqa: E402

RUNNER = ("/x/dpcl/runner/run.py", 1, "run_training")
AUDIT = ("/x/dpcl/audit_config.py", 1, "audit_config")
PLD = ("/x/site-packages/dp_accounting/pld/common.py", 1, "self_convolve")
NUMPY = ("/x/site-packages/numpy/fft.py", 1, "fft")
FIT = ("/x/dpcl/methods/baselines.py", 1, "fit_task")
LEDGER = ("/x/dpcl/guarantees/ledger.py", 1, "charge")
IMPORT = ("/x/dpcl/accounting/accountants.py", 1, "<module>")
EXEC = ("~", 0, "<built-in method builtins.exec>")


def _stats() -> SimpleNamespace:
    # (cc, nc, tottime, cumtime, {caller: (cc, nc, tottime, cumtime)})
    return SimpleNamespace(stats={
        RUNNER: (1, 1, 0.1, 20.0, {}),
        AUDIT: (1, 1, 0.1, 5.0, {RUNNER: (1, 1, 0.1, 5.0)}),
        PLD: (3, 3, 1.0, 4.0, {AUDIT: (2, 2, 0.5, 3.0), NUMPY: (1, 1, 0.5, 1.0)}),  # the numpy re-entry is nested
        NUMPY: (4, 4, 2.0, 2.0, {PLD: (3, 3, 1.5, 1.5), FIT: (1, 1, 0.5, 0.5)}),
        FIT: (1, 1, 5.0, 10.0, {RUNNER: (1, 1, 5.0, 10.0)}),
        LEDGER: (1, 1, 0.2, 0.7, {FIT: (1, 1, 0.2, 0.7)}),
        IMPORT: (1, 1, 0.3, 0.3, {EXEC: (1, 1, 0.3, 0.3)}),
    })


def test_accounting_is_the_time_entering_its_modules_from_outside() -> None:
    stats = _stats()
    # audit from the runner (5.0), the ledger from training (0.7), the PLD re-entered from numpy (1.0);
    # the PLD called by the audit is inside it; a module body is an import ("other")
    assert stages.inclusive_seconds(stats, stages._ACCOUNTING_PARTS) == 5.0 + 0.7 + 1.0
    assert stages.inclusive_seconds(stats, stages._TRAINING_PARTS) == 10.0
    assert stages.inclusive_seconds(stats, stages._TRAINING_PARTS, stages._RUNNER_PARTS) == 10.0  # not numpy's 0.5
    assert stages.nested_seconds(stats, stages._TRAINING_PARTS, stages._ACCOUNTING_PARTS) == 0.7


def test_report_names_the_goal_and_failed_runs() -> None:
    rows = [
        {"config": "naive", "wall": 30.0, "profiled": 28.0, "accounting": 2.8, "training": 20.0, "other": 5.2,
         "share": 0.1},
        {"config": "pecl", "wall": 50.0, "profiled": 48.0, "accounting": 14.4, "training": 30.0, "other": 3.6,
         "share": 0.3},
        {"config": "cosine", "error": "boom"},
    ]
    text = stages.report(rows, "1.0, 1.0, 1.0", "2.0, 2.0, 2.0")
    assert "| naive | 30.0 | 28.0 | 20.0 | 2.8 | 5.2 | 10.0 % | met |" in text
    assert "| pecl | 50.0 | 48.0 | 30.0 | 14.4 | 3.6 | 30.0 % | not met |" in text
    assert "| cosine | failed: boom |" in text and "load average" in text
