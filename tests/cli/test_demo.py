"""``dpcl demo``: the accounting walkthrough, checked against independent references."""

from __future__ import annotations

import io
import json
import subprocess
import sys
from pathlib import Path

import pytest
from rich.console import Console

from cli_reference import dpsgd_reference, profile_delta

from dpcl.cli import main
from dpcl.cli.demo import DEMO_DPSGD, DEMO_EPSILONS, accounting_walkthrough

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def demo_json(tmp_path_factory) -> dict:
    """``dpcl demo --json`` run as a user runs it, in a fresh interpreter (its run kept in a pytest temp dir)."""
    out_dir = tmp_path_factory.mktemp("demo") / "run"
    proc = subprocess.run(
        [sys.executable, "-m", "dpcl", "demo", "--json", "--out", str(out_dir)],
        capture_output=True, text=True, cwd=REPO, timeout=600,
    )
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def test_demo_json_gaussian_calibration(demo_json):
    part = demo_json["gaussian_calibration"]
    delta = part["delta"]
    rows = part["rows"]
    assert [row["epsilon"] for row in rows] == list(DEMO_EPSILONS)
    for row in rows:
        eps = row["epsilon"]
        assert profile_delta(eps, row["analytic_sigma"]) <= delta * (1 + 1e-9)
        assert profile_delta(eps, row["analytic_sigma"] * (1 - 1e-6)) > delta
        assert row["classic_valid"] is (eps < 1)
        # Where the classic formula breaks is decided here from the exact profile, not taken from the demo.
        breaks = profile_delta(eps, row["classic_sigma"]) > delta
        assert row["classic_breaks_target"] is breaks
    by_eps = {row["epsilon"]: row for row in rows}
    assert by_eps[32.0]["classic_breaks_target"] and by_eps[16.0]["classic_breaks_target"]
    assert not by_eps[0.5]["classic_breaks_target"]


def test_demo_json_dpsgd_accountants_side_by_side(demo_json):
    part = demo_json["dpsgd"]
    z, q, steps, delta = (part[k] for k in ("noise_multiplier", "sample_rate", "steps", "delta"))
    assert (z, q, steps, delta) == tuple(DEMO_DPSGD[k] for k in ("noise_multiplier", "sample_rate", "steps", "delta"))
    rows = {row["requested"]: row for row in part["rows"]}
    assert set(rows) == {"rdp", "pld", "prv", "auto"}
    for name in ("rdp", "pld", "prv"):
        assert rows[name]["accountant"] == name
        assert rows[name]["seconds"] >= 0
    assert all(row["adjacency"] == "add_remove" and row["unit"] == "example" for row in rows.values())
    assert rows["pld"]["epsilon"] == pytest.approx(dpsgd_reference("pld", z, q, steps, delta), rel=1e-2)
    assert rows["rdp"]["epsilon"] == pytest.approx(dpsgd_reference("rdp", z, q, steps, delta), rel=1e-2)
    assert rows["rdp"]["epsilon"] >= rows["pld"]["epsilon"]
    assert rows["auto"]["epsilon"] <= rows["rdp"]["epsilon"]
    assert rows["auto"]["epsilon"] == pytest.approx(rows["pld"]["epsilon"], rel=1e-2)


def test_demo_json_token_calibration_is_sound(demo_json):
    part = demo_json["token_calibration"]
    assert part["tokens"] == 1_000_000
    assert part["max_achieved_delta"] <= part["delta"]
    assert 0 < part["sigma_min"] < part["sigma_max"]


def test_demo_table_output_tells_the_story(capsys, tmp_path):
    code = main(["demo", "--out", str(tmp_path / "run")])
    out, err = capsys.readouterr()
    assert code == 0 and err == ""
    for text in ("Calibrating a Gaussian", "analytic σ", "classic σ", "> target", "DP-SGD", "rdp", "pld", "prv", "auto", "Per-token"):
        assert text in out, text


def test_walkthrough_prints_to_a_given_console_and_returns_the_json_numbers(demo_json):
    buffer = io.StringIO()
    result = accounting_walkthrough(Console(file=buffer, width=120))
    assert set(result) == {"gaussian_calibration", "dpsgd", "token_calibration"}
    assert "Calibrating a Gaussian" in buffer.getvalue()
    assert result["gaussian_calibration"] == demo_json["gaussian_calibration"]
