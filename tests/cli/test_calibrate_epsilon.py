"""``dpcl calibrate`` and ``dpcl epsilon`` as a user runs them.

Reference values come from ``cli_reference.py``, independent of
dpcl.accounting: the Gaussian privacy profile of Balle & Wang (2018, Thm 8)
written out with scipy, epsilon by root finding on it, and dp-accounting /
prv-accountant / opacus for the subsampled Gaussian.
"""

from __future__ import annotations

import contextlib
import io
import json
import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from cli_reference import dpa_pld_epsilon, dpsgd_reference, gdp_reference_epsilon, profile_delta, profile_epsilon

from dpcl.cli import main
from dpcl.cli.numbers import parse_count, parse_delta, parse_positive, parse_sample_rate
from dpcl.errors import InvalidParameterError

REPO = Path(__file__).resolve().parents[2]


# -- running the CLI -------------------------------------------------------------------------


def run(argv: list[str]) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = main(argv)
        except SystemExit as exc:  # argparse usage errors
            code = int(exc.code)
    return code, out.getvalue(), err.getvalue()


def run_json(argv: list[str]) -> dict:
    code, out, err = run([*argv, "--json"])
    assert code == 0, err
    assert err == ""
    return json.loads(out)


def run_subprocess(*argv: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "dpcl", *argv], capture_output=True, text=True, cwd=REPO, timeout=300)


# -- calibrate gaussian ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("epsilon", "delta", "sensitivity"),
    [(0.5, 1e-5, 1.0), (0.9, 1e-6, 2.5), (1.0, 1e-5, 1.0), (8.0, 1e-5, 1.0), (32.0, 1e-3, 0.1)],
)
def test_calibrate_gaussian_is_the_smallest_sound_sigma(epsilon, delta, sensitivity):
    answer = run_json(
        ["calibrate", "gaussian", "--epsilon", str(epsilon), "--delta", str(delta), "--sensitivity", str(sensitivity)]
    )
    assert {"sigma", "epsilon", "delta", "sensitivity", "classic_sigma", "classic_valid"} <= answer.keys()
    assert (answer["epsilon"], answer["delta"], answer["sensitivity"]) == (epsilon, delta, sensitivity)
    sigma = answer["sigma"]
    assert profile_delta(epsilon, sigma, sensitivity) <= delta * (1 + 1e-9)  # sound
    assert profile_delta(epsilon, sigma * (1 - 1e-6), sensitivity) > delta  # and tight

    classic = sensitivity * math.sqrt(2 * math.log(1.25 / delta)) / epsilon
    assert answer["classic_sigma"] == pytest.approx(classic, rel=1e-12)
    assert answer["classic_valid"] is (epsilon < 1)
    assert answer["classic_actual_epsilon"] == pytest.approx(
        profile_epsilon(answer["classic_sigma"], delta, sensitivity), rel=1e-6
    )


def test_calibrate_gaussian_shows_where_the_classic_formula_breaks():
    answer = run_json(["calibrate", "gaussian", "--epsilon", "16", "--delta", "1e-5"])
    assert answer["classic_valid"] is False
    # Independently: the classic sigma's true delta at epsilon = 16 exceeds the target.
    assert profile_delta(16.0, answer["classic_sigma"]) > 1e-5
    assert answer["classic_actual_epsilon"] > 16
    assert any("NOT valid" in note for note in answer["notes"])

    code, out, err = run(["calibrate", "gaussian", "--epsilon", "16", "--delta", "1e-5"])
    assert code == 0 and err == ""
    assert "classic_sigma" in out and "NOT valid" in out and f"{answer['sigma']:.6g}" in out


def test_calibrate_gaussian_classic_valid_below_one_but_wasteful():
    answer = run_json(["calibrate", "gaussian", "--epsilon", "0.5", "--delta", "1e-5"])
    assert answer["classic_valid"] is True
    assert answer["classic_sigma"] > answer["sigma"]
    assert answer["classic_actual_epsilon"] < 0.5


# -- epsilon gaussian ------------------------------------------------------------------------


@pytest.mark.parametrize(("sigma", "delta", "sensitivity"), [(1.0, 1e-5, 1.0), (5.0, 1e-6, 2.0), (0.3, 1e-3, 1.0)])
def test_epsilon_gaussian_matches_root_finding_and_pld(sigma, delta, sensitivity):
    import dp_accounting

    answer = run_json(
        ["epsilon", "gaussian", "--sigma", str(sigma), "--delta", str(delta), "--sensitivity", str(sensitivity)]
    )
    reference = profile_epsilon(sigma, delta, sensitivity)
    assert answer["epsilon"] == pytest.approx(reference, rel=1e-6)
    assert answer["epsilon"] >= reference * (1 - 1e-9)  # never below the true epsilon
    pld = dpa_pld_epsilon([dp_accounting.GaussianDpEvent(sigma / sensitivity)], delta)
    assert answer["epsilon"] == pytest.approx(pld, rel=1e-3)


@given(
    epsilon=st.floats(0.05, 30.0),
    log10_delta=st.floats(-10.0, -1.5),
    sensitivity=st.floats(0.1, 10.0),
)
def test_calibrate_then_epsilon_round_trips(epsilon, log10_delta, sensitivity):
    delta = 10.0**log10_delta
    common = ["--delta", repr(delta), "--sensitivity", repr(sensitivity)]
    sigma = run_json(["calibrate", "gaussian", "--epsilon", repr(epsilon), *common])["sigma"]
    back = run_json(["epsilon", "gaussian", "--sigma", repr(sigma), *common])["epsilon"]
    assert back <= epsilon * (1 + 1e-12)
    assert back == pytest.approx(epsilon, rel=1e-6)


# -- DP-SGD ----------------------------------------------------------------------------------

DPSGD = {"q": 0.01, "steps": 200, "delta": 1e-5}


@pytest.mark.parametrize("accountant", ["pld", "rdp", "prv"])
def test_calibrate_dpsgd_reaches_the_target_with_near_minimal_noise(accountant):
    target = 2.0
    answer = run_json(
        [
            "calibrate", "dpsgd", "--epsilon", str(target), "--delta", str(DPSGD["delta"]),
            "--sample-rate", str(DPSGD["q"]), "--steps", str(DPSGD["steps"]), "--accountant", accountant,
        ]
    )
    assert {"noise_multiplier", "epsilon", "accountant"} <= answer.keys()
    assert answer["accountant"] == accountant
    assert answer["epsilon"] <= target
    z = answer["noise_multiplier"]
    # Independent accountant at the calibrated noise: within the target (up to discretisation) ...
    tolerance = 0.02 if accountant == "prv" else 1e-3
    assert dpsgd_reference(accountant, z, DPSGD["q"], DPSGD["steps"], DPSGD["delta"]) <= target * (1 + tolerance)
    # ... and 3% less noise would overshoot it: the search found (nearly) the smallest multiplier.
    assert dpsgd_reference(accountant, 0.97 * z, DPSGD["q"], DPSGD["steps"], DPSGD["delta"]) > target


def test_epsilon_dpsgd_each_accountant_against_references():
    z, q, steps, delta = 1.0, DPSGD["q"], DPSGD["steps"], DPSGD["delta"]
    common = ["epsilon", "dpsgd", "--noise-multiplier", str(z), "--sample-rate", str(q), "--steps", str(steps), "--delta", str(delta)]
    answers = {a: run_json([*common, "--accountant", a]) for a in ("pld", "rdp", "prv", "auto")}
    for name in ("pld", "rdp", "prv"):
        assert answers[name]["accountant"] == name
        assert answers[name]["adjacency"] == "add_remove"
        assert answers[name]["unit"] == "example"
    pld_reference = dpsgd_reference("pld", z, q, steps, delta)
    assert answers["pld"]["epsilon"] == pytest.approx(pld_reference, rel=1e-2)
    assert answers["rdp"]["epsilon"] == pytest.approx(dpsgd_reference("rdp", z, q, steps, delta), rel=1e-2)
    assert answers["rdp"]["epsilon"] == pytest.approx(dpsgd_reference("opacus_rdp", z, q, steps, delta), rel=5e-2)
    assert answers["prv"]["epsilon"] >= pld_reference * (1 - 2e-2)  # PRV's upper bound, not its estimate
    assert answers["rdp"]["epsilon"] >= answers["pld"]["epsilon"]
    auto = answers["auto"]
    assert auto["accountant"] in ("pld", "rdp", "prv", "exact", "basic", "advanced")
    # auto reports the smallest of the bounds it computed, names it, and is as tight as PLD up to discretisation.
    assert auto["epsilon"] == min(auto["candidates"].values())
    assert auto["candidates"][auto["accountant"]] == auto["epsilon"]
    assert auto["epsilon"] <= answers["rdp"]["epsilon"]
    assert auto["epsilon"] == pytest.approx(pld_reference, rel=1e-2)


def test_calibrate_dpsgd_default_is_auto_and_says_so_in_help():
    answer = run_json(DPSGD_CAL)
    explicit = run_json(_with(DPSGD_CAL, "--accountant", "auto"))
    assert answer["noise_multiplier"] == explicit["noise_multiplier"]
    assert answer["accountant"] in ("pld", "rdp", "prv", "exact", "basic", "advanced")
    for command in (["calibrate", "dpsgd"], ["epsilon", "dpsgd"]):
        code, out, _ = run([*command, "--help"])
        assert code == 0 and "default auto" in " ".join(out.split())


def test_epsilon_dpsgd_default_is_auto_and_steps_accept_exponent_notation():
    answer = run_json(["epsilon", "dpsgd", "--noise-multiplier", "1", "--sample-rate", "0.01", "--steps", "2e2", "--delta", "1e-5"])
    assert answer["steps"] == 200
    explicit = run_json(
        ["epsilon", "dpsgd", "--noise-multiplier", "1", "--sample-rate", "0.01", "--steps", "200", "--delta", "1e-5", "--accountant", "auto"]
    )
    assert answer["epsilon"] == explicit["epsilon"] and answer["accountant"] == explicit["accountant"]
    code, out, err = run(["epsilon", "dpsgd", "--noise-multiplier", "1", "--sample-rate", "0.01", "--steps", "200", "--delta", "1e-5"])
    assert code == 0 and err == ""
    assert f"{answer['epsilon']:.6g}" in out and "candidates" in out and f"rdp: {answer['candidates']['rdp']:.6g}" in out


# -- compose-gaussians -----------------------------------------------------------------------


def test_compose_gaussians_text_file_matches_gdp_and_pld(tmp_path):
    import dp_accounting

    sigmas = np.array([3.0, 5.0, 2.5, 10.0, 4.0])
    path = tmp_path / "sigmas.txt"
    path.write_text("# noise per release\n3\n5.0\n\n 2.5 \n1e1\n# last one\n4\n\n")
    answer = run_json(["epsilon", "compose-gaussians", "--sigmas", str(path), "--delta", "1e-5"])
    assert answer["count"] == 5
    reference = gdp_reference_epsilon(sigmas, 1e-5)
    assert answer["epsilon"] == pytest.approx(reference, rel=1e-6)
    pld = dpa_pld_epsilon([dp_accounting.GaussianDpEvent(s) for s in sigmas], 1e-5)
    assert answer["epsilon"] == pytest.approx(pld, rel=1e-3)


def test_compose_gaussians_npy_equals_text_and_sensitivity_scales(tmp_path):
    sigmas = np.random.default_rng(3).uniform(20.0, 200.0, 10_000)
    np.save(tmp_path / "s.npy", sigmas)
    np.savetxt(tmp_path / "s.txt", sigmas, fmt="%.17g")
    from_npy = run_json(["epsilon", "compose-gaussians", "--sigmas", str(tmp_path / "s.npy"), "--delta", "1e-6"])
    from_txt = run_json(["epsilon", "compose-gaussians", "--sigmas", str(tmp_path / "s.txt"), "--delta", "1e-6"])
    assert from_npy["count"] == from_txt["count"] == 10_000
    assert from_npy["epsilon"] == pytest.approx(from_txt["epsilon"], rel=1e-12)
    assert from_npy["epsilon"] == pytest.approx(gdp_reference_epsilon(sigmas, 1e-6), rel=1e-6)
    doubled = run_json(
        ["epsilon", "compose-gaussians", "--sigmas", str(tmp_path / "s.npy"), "--delta", "1e-6", "--sensitivity", "2"]
    )
    assert doubled["epsilon"] == pytest.approx(gdp_reference_epsilon(sigmas, 1e-6, 2.0), rel=1e-6)
    assert doubled["epsilon"] > from_npy["epsilon"]


# -- bad input -------------------------------------------------------------------------------

GAUSS = ["calibrate", "gaussian", "--epsilon", "1", "--delta", "1e-5"]
DPSGD_CAL = ["calibrate", "dpsgd", "--epsilon", "1", "--delta", "1e-5", "--sample-rate", "0.01", "--steps", "100"]
EPS_GAUSS = ["epsilon", "gaussian", "--sigma", "1", "--delta", "1e-5"]
EPS_DPSGD = ["epsilon", "dpsgd", "--noise-multiplier", "1", "--sample-rate", "0.01", "--steps", "100", "--delta", "1e-5"]


def _with(argv: list[str], option: str, value: str) -> list[str]:
    argv = list(argv)
    if option in argv:
        argv[argv.index(option) + 1] = value
        return argv
    return [*argv, option, value]


BAD_VALUES = [
    *[(GAUSS, "--epsilon", v) for v in ("nan", "inf", "-1", "0", "abc", "")],
    *[(GAUSS, "--delta", v) for v in ("0", "1", "1.5", "-0.1", "nan", "x")],
    *[(GAUSS, "--sensitivity", v) for v in ("0", "-2", "inf")],
    *[(DPSGD_CAL, "--epsilon", v) for v in ("nan", "-1")],
    *[(DPSGD_CAL, "--sample-rate", v) for v in ("0", "1.5", "nan", "-0.5")],
    *[(DPSGD_CAL, "--steps", v) for v in ("0", "-3", "2.5", "abc", "inf")],
    *[(EPS_GAUSS, "--sigma", v) for v in ("0", "-1", "nan", "abc")],
    *[(EPS_GAUSS, "--delta", v) for v in ("1", "0")],
    *[(EPS_DPSGD, "--noise-multiplier", v) for v in ("0", "inf")],
    *[(EPS_DPSGD, "--sample-rate", v) for v in ("0", "2")],
    *[(EPS_DPSGD, "--steps", v) for v in ("0", "1.5")],
    *[(EPS_DPSGD, "--delta", v) for v in ("1", "nan")],
]


@pytest.mark.parametrize(("argv", "option", "value"), BAD_VALUES)
def test_bad_number_exits_2_with_one_line_naming_the_option(argv, option, value):
    code, out, err = run(_with(argv, option, value))
    assert code == 2
    assert out == ""
    assert err.count("\n") == 1 and err.endswith("\n")
    assert option in err
    assert "Traceback" not in err


@pytest.mark.parametrize(
    "argv",
    [
        ["calibrate"],
        ["epsilon"],
        ["calibrate", "laplace", "--epsilon", "1"],
        ["calibrate", "gaussian", "--delta", "1e-5"],
        _with(DPSGD_CAL, "--accountant", "moments"),
        _with(EPS_DPSGD, "--accountant", "moments"),
        ["epsilon", "compose-gaussians", "--delta", "1e-5"],
    ],
)
def test_usage_errors_exit_2_with_one_line(argv):
    code, out, err = run(argv)
    assert code == 2
    assert out == ""
    assert err.count("\n") == 1 and "error" in err


def _sigma_file_cases(tmp: Path) -> list[tuple[Path, str]]:
    cases = []

    def text(name: str, content: str | bytes, expect: str) -> None:
        path = tmp / name
        path.write_bytes(content if isinstance(content, bytes) else content.encode())
        cases.append((path, expect))

    text("empty.txt", "", "no sigma")
    text("blank.txt", "\n  \n# only a comment\n", "no sigma")
    text("word.txt", "1.0\n2.0\n\nthree\n", "line 4")
    text("two.txt", "1.0\n2.0 3.0\n", "line 2")
    text("negative.txt", "1\n2\n-1\n", "line 3")
    text("zero.txt", "0\n", "line 1")
    text("nan.txt", "1\nnan\n", "line 2")
    text("inf.txt", "1\n\ninf\n", "line 3")
    text("binary.txt", b"\xff\xfe\x00\x81", "UTF-8")
    np.save(tmp / "empty.npy", np.array([], dtype=float))
    cases.append((tmp / "empty.npy", "empty"))
    np.save(tmp / "negative.npy", np.array([1.0, 2.0, -3.0]))
    cases.append((tmp / "negative.npy", "entry 2"))
    np.save(tmp / "strings.npy", np.array(["a", "b"]))
    cases.append((tmp / "strings.npy", "numeric"))
    (tmp / "corrupt.npy").write_bytes(b"not a numpy file")
    cases.append((tmp / "corrupt.npy", "cannot read"))
    cases.append((tmp / "missing.txt", "cannot read"))
    cases.append((tmp, "cannot read"))  # a directory
    return cases


def test_bad_sigma_files_exit_2_with_one_line(tmp_path):
    for path, expect in _sigma_file_cases(tmp_path):
        code, out, err = run(["epsilon", "compose-gaussians", "--sigmas", str(path), "--delta", "1e-5"])
        assert code == 2, path
        assert out == "", path
        assert err.count("\n") == 1 and "--sigmas" in err, err
        assert expect in err, (path, err)


# -- the number parsers themselves -----------------------------------------------------------


@given(st.text(max_size=12))
def test_number_parsers_return_valid_values_or_raise_typed_errors(text):
    for parse, ok in (
        (parse_positive, lambda v: math.isfinite(v) and v > 0),
        (parse_delta, lambda v: 0 < v < 1),
        (parse_sample_rate, lambda v: 0 < v <= 1),
        (parse_count, lambda v: isinstance(v, int) and v >= 1),
    ):
        try:
            value = parse("--x", text)
        except InvalidParameterError as exc:
            assert "--x" in str(exc)
        else:
            assert ok(value), (parse.__name__, text, value)


# -- as a new user runs them -----------------------------------------------------------------


def test_subprocess_calibrate_and_epsilon_round_trip():
    calibrated = run_subprocess("calibrate", "gaussian", "--epsilon", "2", "--delta", "1e-6", "--json")
    assert calibrated.returncode == 0, calibrated.stderr
    sigma = json.loads(calibrated.stdout)["sigma"]
    back = run_subprocess("epsilon", "gaussian", "--sigma", repr(sigma), "--delta", "1e-6", "--json")
    assert back.returncode == 0, back.stderr
    assert json.loads(back.stdout)["epsilon"] == pytest.approx(2.0, rel=1e-6)


def test_subprocess_bad_inputs_give_one_line_and_exit_2(tmp_path):
    bad = tmp_path / "sigmas.txt"
    bad.write_text("1.5\n2.5\noops\n")
    for argv, needle in (
        (["epsilon", "gaussian", "--sigma", "nan", "--delta", "1e-5"], "--sigma"),
        (["calibrate", "dpsgd", "--epsilon", "1", "--delta", "1e-5", "--sample-rate", "1.5", "--steps", "10"], "--sample-rate"),
        (["epsilon", "compose-gaussians", "--sigmas", str(bad), "--delta", "1e-5"], "line 3"),
    ):
        proc = run_subprocess(*argv)
        assert proc.returncode == 2
        assert proc.stdout == ""
        assert proc.stderr.count("\n") == 1 and needle in proc.stderr, proc.stderr


# -- extreme but valid input: a number or a one-line error, never NaN ------------------------

_POSITIVE = st.floats(min_value=1e-300, max_value=1e300, allow_nan=False, allow_infinity=False)
_DELTA = st.floats(min_value=1e-300, max_value=0.999999, allow_nan=False)


def _number_or_one_line_error(argv: list[str]) -> None:
    code, out, err = run([*argv, "--json"])
    assert code in (0, 2), err
    if code == 0:
        assert "nan" not in out.lower()
        assert err == ""  # no RuntimeWarning noise either
        json.loads(out)
    else:  # under --json the refusal is also one JSON object, with no number in it but the exit code
        assert set(json.loads(out)) == {"error", "exit_code"} and err.count("\n") == 1


@given(epsilon=_POSITIVE, delta=_DELTA, sensitivity=_POSITIVE)
def test_calibrate_gaussian_extreme_inputs_never_print_nan(epsilon, delta, sensitivity):
    _number_or_one_line_error(
        ["calibrate", "gaussian", "--epsilon", repr(epsilon), "--delta", repr(delta), "--sensitivity", repr(sensitivity)]
    )


@given(sigma=_POSITIVE, delta=_DELTA, sensitivity=_POSITIVE)
def test_epsilon_gaussian_extreme_inputs_never_print_nan(sigma, delta, sensitivity):
    _number_or_one_line_error(
        ["epsilon", "gaussian", "--sigma", repr(sigma), "--delta", repr(delta), "--sensitivity", repr(sensitivity)]
    )


def test_overflowing_calibration_is_refused_not_printed_as_nan():
    code, out, err = run(["calibrate", "gaussian", "--epsilon", "1e308", "--delta", "0.5", "--json"])
    if code == 0:  # a finite answer must then be a sound one
        answer = json.loads(out)
        assert profile_delta(1e308, answer["sigma"]) <= 0.5
    else:
        assert code == 2 and set(json.loads(out)) == {"error", "exit_code"} and err.count("\n") == 1
        assert "--epsilon" in err
