import json
import subprocess
import sys
from pathlib import Path

import pytest
from audit_reference import gaussian_epsilon_closed_form, gaussian_sigma_closed_form

from dpcl.cli import main


def _run(capsys, *argv):
    code = main(["audit-mechanism", *argv])
    out, err = capsys.readouterr()
    return code, out, err


def test_calibrated_gaussian_is_consistent(capsys):
    sigma = gaussian_sigma_closed_form(2.0, 1e-5)
    code, out, err = _run(
        capsys, "gaussian", "--sigma", repr(sigma), "--sensitivity", "1", "--claimed-epsilon", "2",
        "--delta", "1e-5", "--trials", "200000", "--seed", "7", "--confidence", "0.95", "--json",
    )
    assert code == 0, err
    payload = json.loads(out)
    assert {"epsilon_lower_bound", "claimed_epsilon", "trials", "confidence", "verdict"} <= set(payload)
    assert payload["verdict"] == "consistent"
    assert payload["claimed_epsilon"] == 2.0 and payload["trials"] == 200000 and payload["confidence"] == 0.95
    assert 0 < payload["epsilon_lower_bound"] <= 2.0
    assert payload["mechanism_epsilon"] == pytest.approx(gaussian_epsilon_closed_form(sigma, 1e-5), rel=1e-6)


def test_half_sensitivity_gaussian_is_violated_with_exit_3(capsys):
    sigma = gaussian_sigma_closed_form(1.0, 1e-5, sensitivity=0.5)
    code, out, _ = _run(
        capsys, "gaussian", "--sigma", repr(sigma), "--sensitivity", "1", "--claimed-epsilon", "1",
        "--delta", "1e-5", "--trials", "1000000", "--seed", "0", "--json",
    )
    assert code == 3
    payload = json.loads(out)
    assert payload["verdict"] == "violated" and payload["epsilon_lower_bound"] > 1.0


def test_laplace_pure_dp(capsys):
    code, out, _ = _run(
        capsys, "laplace", "--scale", "0.5", "--claimed-epsilon", "2", "--delta", "0", "--trials", "100000", "--json"
    )
    assert code == 0
    assert 1.0 < json.loads(out)["epsilon_lower_bound"] <= 2.0
    code, out, _ = _run(
        capsys, "laplace", "--scale", "0.5", "--claimed-epsilon", "1", "--delta", "0", "--trials", "100000", "--json"
    )
    assert code == 3 and json.loads(out)["verdict"] == "violated"


def test_laplace_mechanism_epsilon_is_the_exact_epsilon_at_the_stated_delta(capsys):
    """At delta > 0 Laplace noise is (eps0 + 2 ln(1 - delta), delta)-DP, below its pure eps0 = sensitivity/scale:
    delta(eps) = 1 - exp((eps - eps0)/2) is the total-variation-type tail of the privacy loss. The reported
    mechanism_epsilon is that number (closed form here), and the audit's lower bound stays below it."""
    import math

    scale, sensitivity, delta = 0.8, 2.0, 0.1
    code, out, err = _run(
        capsys, "laplace", "--scale", str(scale), "--sensitivity", str(sensitivity), "--claimed-epsilon", "3",
        "--delta", str(delta), "--trials", "400000", "--seed", "3", "--json",
    )
    assert code == 0, err
    payload = json.loads(out)
    exact = sensitivity / scale + 2 * math.log(1 - delta)  # 2.5 - 0.2107 = 2.289
    assert payload["mechanism_epsilon"] == pytest.approx(exact, rel=1e-12)
    assert 0.8 * exact < payload["epsilon_lower_bound"] <= exact
    code, out, _ = _run(capsys, "laplace", "--scale", "0.5", "--claimed-epsilon", "3", "--delta", "0",
                        "--trials", "1000", "--json")
    assert code == 0 and json.loads(out)["mechanism_epsilon"] == 2.0


def test_table_output(capsys):
    code, out, _ = _run(capsys, "gaussian", "--sigma", "2", "--claimed-epsilon", "5", "--delta", "1e-5", "--trials", "10000")
    assert code == 0
    assert "epsilon_lower_bound" in out and "consistent" in out


@pytest.mark.parametrize(
    "argv, word",
    [
        (["gaussian", "--sigma", "0", "--claimed-epsilon", "1", "--delta", "1e-5"], "--sigma"),
        (["gaussian", "--sigma", "nan", "--claimed-epsilon", "1", "--delta", "1e-5"], "--sigma"),
        (["gaussian", "--sigma", "1", "--claimed-epsilon", "-1", "--delta", "1e-5"], "--claimed-epsilon"),
        (["gaussian", "--sigma", "1", "--claimed-epsilon", "1", "--delta", "1"], "--delta"),
        (["gaussian", "--sigma", "1", "--claimed-epsilon", "1", "--delta", "abc"], "--delta"),
        (["gaussian", "--sigma", "1", "--claimed-epsilon", "1", "--delta", "1e-5", "--trials", "2"], "--trials"),
        (["gaussian", "--sigma", "1", "--claimed-epsilon", "1", "--delta", "1e-5", "--trials", "1.5"], "--trials"),
        (["gaussian", "--sigma", "1", "--claimed-epsilon", "1", "--delta", "1e-5", "--seed", "-3"], "--seed"),
        (["gaussian", "--sigma", "1", "--claimed-epsilon", "1", "--delta", "1e-5", "--confidence", "1"], "--confidence"),
        (["gaussian", "--sigma", "1", "--claimed-epsilon", "1", "--delta", "1e-5", "--sensitivity", "inf"], "--sensitivity"),
    ],
)
def test_bad_values_exit_2_with_one_line_naming_the_option(capsys, argv, word):
    code, out, err = _run(capsys, *argv)
    assert code == 2
    assert out == ""
    assert word in err and err.count("\n") == 1


@pytest.mark.parametrize(
    "argv",
    [
        ["laplace", "--sigma", "1", "--claimed-epsilon", "1", "--delta", "0"],  # wrong noise option
        ["gaussian", "--claimed-epsilon", "1", "--delta", "1e-5"],  # missing --sigma
        ["uniform", "--scale", "1", "--claimed-epsilon", "1", "--delta", "0"],
    ],
)
def test_usage_errors_exit_2(capsys, argv):
    with pytest.raises(SystemExit) as info:
        main(["audit-mechanism", *argv])
    assert info.value.code == 2
    assert capsys.readouterr().err.count("\n") == 1


def test_installed_command_runs_as_a_user_would():
    proc = subprocess.run(
        [str(Path(sys.executable).parent / "dpcl"), "audit-mechanism", "laplace", "--scale", "1", "--sensitivity", "1",
         "--claimed-epsilon", "0.5", "--delta", "0", "--trials", "200000", "--seed", "1", "--json"],
        capture_output=True, text=True, check=False,
    )
    assert proc.returncode == 3, proc.stderr
    assert json.loads(proc.stdout)["verdict"] == "violated"


def test_progress_bar_on_stderr_unless_json_or_quiet(capsys):
    argv = ["gaussian", "--sigma", "2", "--claimed-epsilon", "5", "--delta", "1e-5", "--trials", "30000"]
    code, out, err = _run(capsys, *argv)
    assert code == 0 and "audit:" in err and "trial" in err
    for flag in ("--json", "--quiet"):
        code, out, err = _run(capsys, *argv, flag)
        assert code == 0 and err == ""


def test_mechanism_epsilon_is_never_nan(capsys):
    # sensitivity / sigma overflows a float: the exact epsilon is reported as inf (an upper bound), never NaN
    code, out, _ = _run(
        capsys, "gaussian", "--sigma", "1e-300", "--sensitivity", "1e300", "--claimed-epsilon", "1",
        "--delta", "0.5", "--trials", "100", "--json",
    )
    assert code == 3
    answer = json.loads(out)
    assert answer["mechanism_epsilon"] is None and answer["non_finite"] == {"mechanism_epsilon": "inf"}


@pytest.mark.filterwarnings("error::RuntimeWarning")
@pytest.mark.parametrize("delta", ["0", "0.5"])
def test_laplace_overflowing_epsilon_is_inf_without_warnings(capsys, delta):
    code, out, err = _run(
        capsys, "laplace", "--scale", "1e-310", "--sensitivity", "1e10", "--claimed-epsilon", "1",
        "--delta", delta, "--trials", "1000", "--json",
    )
    assert code == 3 and "Warning" not in err
    answer = json.loads(out)
    assert answer["mechanism_epsilon"] is None and answer["non_finite"] == {"mechanism_epsilon": "inf"}
