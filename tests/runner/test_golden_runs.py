"""``dpcl run`` rebuilt on :class:`dpcl.Certifier` gives the bundled configs the same files, epsilons and checks.

The goldens in ``tests/runner/data/golden_runs_{reduced,full}.json`` were recorded by
``tests/runner/golden_runs.py`` from the runner *before* it was rebuilt as stages on the Certifier (one
480-line ``run_training``). For every bundled config they hold the files a run writes, and per certificate
its headline (private, epsilon, delta, unit, adjacency, accountant, composition), its scoped guarantees,
the outcome of every ``dpcl verify`` check and the meaning of its charged events (tasks, event types,
counts, noise), not their JSON layout (the ledger may compress repeated events).

Tolerances: epsilons relative 1e-6. Noise multipliers relative 1e-3: the DP-SGD noise multipliers are
calibrated by a root-finder whose tolerance and algorithm may change (memoised or faster calibration), which
moves the calibrated value (and the epsilon it gives, which stays at its target) slightly; a noise
multiplier within 1e-3 of the golden one is the same plan.

The CI test runs a reduced version of the expensive configs (two tasks, one epoch, a small PeCL model:
:func:`golden_runs.reduced_config`); the thorough one runs every bundled config as shipped.
"""

from __future__ import annotations

import json

import pytest

pytest.importorskip("torch")

from golden_runs import DATA_DIR, REDUCED_CONFIGS, bundled_configs, compare, missing_data, run_config  # noqa: E402


def _golden(mode: str) -> dict:
    return json.loads((DATA_DIR / f"golden_runs_{mode}.json").read_text(encoding="utf-8"))


def test_goldens_cover_the_bundled_configs():
    assert sorted(_golden("full")) == bundled_configs()
    assert sorted(_golden("reduced")) == sorted(REDUCED_CONFIGS)


def test_compare_catches_a_changed_epsilon_and_tolerates_a_recalibrated_noise_multiplier():
    golden = {"headline": {"epsilon": 1.0}, "charges": [{"events": [{"noise": [2.0]}]}]}
    assert compare(golden, {"headline": {"epsilon": 1.0 + 1e-9}, "charges": [{"events": [{"noise": [2.0005]}]}]}) == []
    assert compare(golden, {"headline": {"epsilon": 1.00001}, "charges": [{"events": [{"noise": [2.0]}]}]})
    assert compare(golden, {"headline": {"epsilon": 1.0}, "charges": [{"events": [{"noise": [2.01]}]}]})


@pytest.mark.parametrize("name", ["cosine", "naive", "pecl_paper"])
def test_reduced_bundled_config_matches_the_golden_run(name, tmp_path):
    golden = _golden("reduced")[name]
    problems = compare(golden, run_config(name, "reduced", tmp_path))
    assert not problems, "\n".join(problems)


@pytest.mark.thorough
@pytest.mark.parametrize("name", [n for n in REDUCED_CONFIGS if n not in ("cosine", "naive", "pecl_paper")])
def test_other_reduced_bundled_configs_match_their_golden_runs(name, tmp_path):
    golden = _golden("reduced")[name]
    problems = compare(golden, run_config(name, "reduced", tmp_path))
    assert not problems, "\n".join(problems)


@pytest.mark.thorough
@pytest.mark.parametrize("name", bundled_configs())
def test_bundled_config_matches_the_golden_run(name, tmp_path):
    if missing_data(name):
        pytest.skip(missing_data(name))
    golden = _golden("full")[name]
    problems = compare(golden, run_config(name, "full", tmp_path))
    assert not problems, "\n".join(problems)
    # issue 15's quality bar: every bundled config's certificates, as shipped, pass dpcl verify --cross-check
    from dpcl.cli import main

    certificates = sorted(str(p) for p in (tmp_path / f"run_{name}" / "certificates").glob("*.cert.json"))
    assert certificates
    assert main(["verify", "--cross-check", *certificates]) == 0


def test_compare_reads_repeated_events_as_their_count():
    single = {"type": "laplace", "count": 1, "noise": [0.2]}
    golden = {"charges": [{"events": [single, single]}]}
    assert compare(golden, {"charges": [{"events": [{**single, "count": 2}]}]}) == []
    assert compare(golden, {"charges": [{"events": [{**single, "count": 3}]}]})
