"""`dpcl verify --cross-check` on the certificates of bundled configs' runs (small, fast settings).

Each bundled config keeps its [privacy] section (accountant, composition, filter,
adjacency) as shipped; only the stream is cut to two tasks and training to one
epoch (L2DP-ML: three epochs of a small network) so the runs take seconds.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")

import dpcl  # noqa: E402
from dpcl.cli import main  # noqa: E402
from dpcl.guarantees import cross_check  # noqa: E402

CONFIGS = Path(dpcl.__file__).parent / "configs"
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
SMALL = {
    "cosine": {},
    "naive": {"epochs": "1", "batch_size": "64"},
    "peft_ensemble": {"epochs": "1", "batch_size": "64"},
    "l2dpml_split_digits": {"epochs": "3", "hidden_sizes": "[8, 4]"},
}


def dpcl_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "dpcl", *args], capture_output=True, text=True, env=ENV, timeout=600)


def small_config(name: str, directory: Path) -> Path:
    text = (CONFIGS / f"{name}.toml").read_text(encoding="utf-8")
    if name != "cosine":  # two tasks; the public prior keeps its shape (one set, or one set per task)
        text = re.sub(r"(?m)^tasks = .*$", "tasks = [[0, 1], [2, 3]]", text)
        text = re.sub(r"(?m)^prior_labels = \[\[.*$", "prior_labels = [[0, 1], [2, 3]]", text)
    for key, value in SMALL[name].items():
        text, n = re.subn(rf"(?m)^{key} = .*$", f"{key} = {value}", text)
        assert n == 1, key
    path = directory / f"{name}.toml"
    path.write_text(text, encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def run_of(tmp_path_factory):
    runs: dict[str, Path] = {}

    def get(name: str) -> Path:
        if name not in runs:
            directory = tmp_path_factory.mktemp(name)
            done = dpcl_cli("run", str(small_config(name, directory)), "--out", str(directory / "run"), "--quiet")
            assert done.returncode == 0, done.stderr
            runs[name] = directory / "run"
        return runs[name]

    return get


@pytest.mark.parametrize("name", list(SMALL))
def test_cross_check_passes_on_every_certificate_of_a_bundled_config_run(run_of, name):
    certificates = sorted(str(p) for p in (run_of(name) / "certificates").glob("*.json"))
    assert certificates
    done = dpcl_cli("verify", "--cross-check", "--json", *certificates)
    assert done.returncode == 0, done.stdout + done.stderr
    payload = json.loads(done.stdout)
    reports = payload["certificates"] if len(certificates) > 1 else [payload]
    for report in reports:
        assert report["valid"]
        check = report["cross_check"]
        assert check["passed"] and check["statements"]
        for statement in check["statements"]:
            assert statement["skipped"] is None
            # both numbers: dpcl's stated epsilon is at least dp-accounting's lower bound, and the two agree
            # to the discretisation error (plus dpcl's own, at most ~0.1% for auto's PLD)
            assert statement["lower_epsilon"] <= statement["stated_epsilon"]
            assert abs(statement["independent_epsilon"] - statement["stated_epsilon"]) <= (
                statement["discretisation_error"] + 2e-3 * statement["stated_epsilon"]
            )
    if name.startswith("l2dpml"):  # replace-one Laplace: pure DP, restated under add/remove for dp-accounting
        notes = reports[0]["cross_check"]["statements"][0]["notes"]
        assert any("restated under add/remove" in n for n in notes)


@pytest.mark.skipif(not Path("/usr/share/games/fortunes").is_dir(), reason="PeCL streams Debian fortunes")
def test_a_non_private_checkpoint_has_only_its_scoped_statements_cross_checked(tmp_path):
    # PeCL as in the paper (a [run] private = false research run): the checkpoint has no headline epsilon,
    # the per-token statement is scoped to the input-embedding release
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "runner"))
    from run_helpers import write_pecl_config

    done = dpcl_cli("run", str(write_pecl_config(tmp_path)), "--out", str(tmp_path / "run"), "--quiet")
    assert done.returncode == 0, done.stderr
    certificate = str(sorted((tmp_path / "run" / "certificates").glob("*.json"))[-1])
    verified = dpcl_cli("verify", "--cross-check", "--json", certificate)
    assert verified.returncode == 0, verified.stdout + verified.stderr
    report = json.loads(verified.stdout)
    assert report["valid"] and report["private"] is False
    check = report["cross_check"]
    assert check["passed"] and "only the scoped statements" in check["message"]
    (statement,) = check["statements"]
    assert statement["name"] == "scoped input_embeddings"
    assert statement["lower_epsilon"] <= statement["stated_epsilon"] <= statement["independent_epsilon"] + 1e-9


def test_cross_check_table_and_a_failed_cross_check_exits_3(run_of, capsys, monkeypatch):
    certificate = str(sorted((run_of("cosine") / "certificates").glob("*.json"))[-1])
    assert main(["verify", "--cross-check", certificate]) == 0
    out = capsys.readouterr().out
    assert "cross-check" in out and "dp-accounting PLD" in out
    # an accountant that reports more than the stated epsilon (as a wrong dpcl formula would) is caught
    real = cross_check.independent_epsilon

    def inflated(events, delta, interval=cross_check.CROSS_CHECK_INTERVAL):
        bounds = real(events, delta, interval)
        return cross_check.IndependentEpsilon(bounds.upper + 1.0, bounds.lower + 1.0, bounds.relation, interval)

    monkeypatch.setattr(cross_check, "independent_epsilon", inflated)
    assert main(["verify", "--cross-check", certificate]) == 3
    out, err = capsys.readouterr()
    assert "fails the cross-check" in err and "below the independent one" in err
    assert main(["verify", certificate]) == 0  # without the flag nothing changes
