"""The benchmark report's logic on hand-made measurements: milestone extrapolation, summary ratios, sections.

Nothing here measures speed; the inputs are synthetic so that every expected
number is computed in the test from the inputs.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"
# opacus installs a top-level package named ``benchmarks``; import the scripts as modules of the folder.
sys.path.insert(0, str(BENCHMARKS))

import bench_accounting  # noqa: E402
import bench_training  # noqa: E402
import run_all  # noqa: E402

M = bench_accounting.Measurement


def _curves() -> dict[str, list[dict[str, float]]]:
    return {
        "dpcl exact": [
            {"n": n, "epsilon": 7.0, "seconds": 1e-3} for n in (10, 1_000, 100_000, 1_000_000)
        ],
        "dp-accounting PLD": [
            {"n": 10, "epsilon": 7.0, "seconds": 0.5, "exact_epsilon": 7.0},
            {"n": 1_000, "epsilon": 7.0, "seconds": 20.0, "exact_epsilon": 7.0},
        ],
        "dp-accounting RDP": [
            {"n": 1_000, "epsilon": 7.7, "seconds": 0.2, "exact_epsilon": 7.0},
            {"n": 100_000, "epsilon": 7.7, "seconds": 15.0, "exact_epsilon": 7.0},
        ],
        "prv-accountant": [{"n": 300, "epsilon": 7.01, "seconds": 30.0, "exact_epsilon": 7.0}],
    }


def test_milestones_measured_where_run_and_linearly_extrapolated_elsewhere() -> None:
    milestones = bench_accounting.composition_milestones(_curves())
    assert [row["n"] for row in milestones["dpcl exact"]] == list(bench_accounting.MILESTONES)
    assert all(row["measured"] for row in milestones["dpcl exact"])

    pld = {row["n"]: row for row in milestones["dp-accounting PLD"]}
    assert pld[1_000]["measured"] and pld[1_000]["seconds"] == 20.0
    assert not pld[100_000]["measured"] and pld[100_000]["seconds"] == pytest.approx(20.0 / 1_000 * 100_000)
    assert not pld[1_000_000]["measured"] and pld[1_000_000]["seconds"] == pytest.approx(20.0 * 1_000)
    assert "extrapolated from n = 1,000" in pld[100_000]["reason"]

    rdp = {row["n"]: row for row in milestones["dp-accounting RDP"]}
    assert rdp[100_000]["measured"]
    assert rdp[1_000_000]["seconds"] == pytest.approx(15.0 * 10)

    prv = {row["n"]: row for row in milestones["prv-accountant"]}
    assert not prv[1_000]["measured"] and prv[1_000]["seconds"] == pytest.approx(30.0 / 300 * 1_000)


def _results() -> dict:
    curves = _curves()
    dpsgd = [
        M("dpcl auto", 6.2, 0.05, 3),
        M("dpcl pld", 6.0, 0.5, 3),
        M("dpcl prv", 6.1, 0.6, 3),
        M("dpcl rdp", 6.6, 0.02, 3),
        M("dp-accounting PLD", 6.0, 0.4, 3),
        M("dp-accounting RDP", 6.6, 0.03, 3),
        M("prv-accountant", 6.1, 4.0, 3),
        M("opacus RDP", 6.6, 0.01, 3),
        M("opacus PRV", 6.1, 0.3, 3),
    ]
    composition = {
        "count": 1_000_000,
        "delta": 1e-5,
        "exact": M("dpcl exact (mu-GDP)", 7.0, 0.002, 5),
        "grouped_pld": M("dp-accounting PLD, grouped", 7.07, 4.0, 1, note="100 non-empty groups"),
        "pld_extrapolated_seconds": 20_000.0,
        "curves": curves,
        "milestones": bench_accounting.composition_milestones(curves),
        "groups": 100,
    }
    calibration = {
        "count": 1_000_000,
        "delta": 1e-5,
        "ours": M("dpcl gaussian_sigma (vectorised)", 1.0, 0.5, 5),
        "reference": M("dp-accounting per token", 1.0, 10_000.0, 1, note="extrapolated"),
        "max_achieved_delta": 9.9e-6,
        "max_relative_difference": 1e-7,
        "ours_vs_reference_mean_ratio": 1.0,
    }
    power_row = dict(claim=1.0, delta=1e-5, min=0.8, max=0.9, seeds=10)
    audit = {
        "speed": [("audit_sampler, 10^6", 2 * 10**6, 0.1), ("audit_scores, 10^6", 2 * 10**6, 0.2)],
        "power": [
            {**power_row, "setting": "Gaussian, analytic sigma for (1, 1e-05)", "true_eps": 1.0, "trials": 10**7,
             "mean": 0.85, "fraction": 0.85, "flagged": 0},
            {**power_row, "setting": "Gaussian, sigma for (1, 1e-05) at HALF the sensitivity", "true_eps": 2.0,
             "trials": 10**6, "mean": 1.5, "fraction": 0.75, "flagged": 9},
        ],
        "canary": [{"z": 1.0, "q": 1.0, "steps": 4, "delta": 1e-5, "runs": 100, "accountant": "exact", "eps": 10.0,
                    "loss": 4.0, "gradient": 4.0, "best": 4.0, "ratio": 0.4, "seconds": 1.0}],
    }
    training = {
        "methods": [
            bench_training.MethodThroughput("cosine", "c.toml", "digits", 5, 1000, 1, 0.0, 0.01),
            bench_training.MethodThroughput("pecl", "p.toml", "fortunes_texts", 5, 400, 4, 6.0, 2.0),
            bench_training.MethodThroughput("naive", "", "", 0, 0, 0, float("nan"), float("nan"), error="E: x"),
        ],
        "tdp": {"batch_size": 16, "tokens": 900, "max_seq_len": 64, "n_layer": 2, "n_embd": 64, "lora_rank": 8,
                "epochs": 4, "repeats": 10, "plain_s": 0.02, "noise_s": 0.021, "scoring_noise_s": 0.03,
                "amortised_s": 0.023},
        "info": {"torch threads": "1"},
        "when": "now",
        "repeats": 5,
    }
    return {"dpsgd": dpsgd, "composition": composition, "calibration": calibration, "audit": audit,
            "training": training, "durations": {"accounting": 60.0, "audit": 120.0, "training": 60.0}}


def test_report_has_summary_ratios_and_every_section() -> None:
    report = run_all.render(_results(), {"CPU": "test"})
    for heading in ("## Summary", "## 1. DP-SGD epsilon", "## 2. Composition", "## 3. Analytic calibration",
                    "## 4. Empirical privacy auditing", "## 5. Training throughput", "## 6. PeCL"):
        assert heading in report
    assert report.index("| CPU | test |") < report.index("## Summary") < report.index("## 1. DP-SGD")
    summary = report[report.index("## Summary"): report.index("## Targets")]
    assert f"ε × {6.2 / 6.0:.4f}, time × {0.05 / 0.4:.2f}" in summary
    assert f"{4.0 / 0.002:,.0f}× faster; PLD ε × {7.07 / 7.0:.4f}" in summary
    assert f"{2 * 10**6 / 0.1:,.0f} outputs/s" in summary
    assert "false alarms 0/10; violations caught 9/10" in summary
    assert f"× {(400 / 2.0) / (1000 / 0.01):.3g} of cosine" in summary
    assert "| training throughput, naive | not run |" in summary
    assert f"× {0.023 / 0.02:.2f} of a clean step" in summary
    assert "run time | 4.0 min" in report
    # the 10^3 / 10^5 / 10^6 table: PLD measured at 10^3, extrapolated beyond; exact measured everywhere
    assert "| dp-accounting PLD | 20.00 s | not run (≈ 33.3 min) | not run (≈ 5.6 h) |" in report
    assert "| dpcl exact | 1.0 ms | 1.0 ms | 1.0 ms |" in report


def test_plot_renders_png() -> None:
    png = run_all.plot(_results())
    assert png[:8] == b"\x89PNG\r\n\x1a\n"
