"""Every accounting command answers in bounded time and memory or refuses up front (exit 2, one line).

Regressions found by a red team: a calibration at 1e12 steps that grew to 23 GB, tracebacks
(OverflowError, ZeroDivisionError, a ValueError from dp-accounting's PLD) for extreme noise
multipliers, sample rates and steps, messages that did not name the parameter, and an infinite
epsilon printed in JSON as the string "inf".
"""

from __future__ import annotations

import contextlib
import io
import json
import math

import numpy as np
import pytest
from scipy.stats import norm

from dpcl.accounting import compute_epsilon, dpsgd_epsilon, dpsgd_noise_multiplier
from dpcl.accounting.events import PoissonSampledGaussianEvent, RepeatedEvent
from dpcl.cli import main
from dpcl.cli import numbers
from dpcl.errors import InvalidParameterError

DPSGD = ["epsilon", "dpsgd", "--noise-multiplier", "1", "--sample-rate", "0.01", "--steps", "100", "--delta", "1e-5"]
CAL = ["calibrate", "dpsgd", "--epsilon", "1", "--delta", "1e-5", "--sample-rate", "0.01", "--steps", "100"]


def run(argv: list[str]) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = main(argv)
        except SystemExit as exc:
            code = int(exc.code)
    return code, out.getvalue(), err.getvalue()


def with_option(argv: list[str], option: str, value: str) -> list[str]:
    argv = list(argv)
    if option in argv:
        argv[argv.index(option) + 1] = value
    else:
        argv += [option, value]
    return argv


@pytest.mark.filterwarnings("error::RuntimeWarning")
@pytest.mark.parametrize(
    ("argv", "option", "limit"),
    [
        (with_option(CAL, "--steps", "1e12"), "--steps", "1e+09"),
        (with_option(CAL, "--steps", "1e308"), "--steps", "1e+09"),
        (with_option(DPSGD, "--steps", "1e308"), "--steps", "1e+09"),
        (with_option(DPSGD, "--noise-multiplier", "1e308"), "--noise-multiplier", "1e+06"),
        (with_option(DPSGD, "--noise-multiplier", "5e-324"), "--noise-multiplier", "0.0001"),
        (with_option(DPSGD, "--sample-rate", "5e-324"), "--sample-rate", "1e-12"),
        (with_option(CAL, "--sample-rate", "1e-300"), "--sample-rate", "1e-12"),
        (
            ["audit-mechanism", "gaussian", "--sigma", "1e308", "--claimed-epsilon", "1", "--delta", "1e-5", "--trials", "100"],
            "--sigma", "1e+300",
        ),
        (
            ["audit-mechanism", "laplace", "--scale", "1e308", "--claimed-epsilon", "1", "--delta", "1e-5", "--trials", "100"],
            "--scale", "1e+300",
        ),
    ],
)
def test_out_of_range_inputs_are_refused_up_front_with_the_limit(argv, option, limit):
    code, out, err = run(argv)
    assert code == 2 and out == ""
    assert err.count("\n") == 1 and "Traceback" not in err and "Warning" not in err
    assert option in err and limit in err


@pytest.mark.filterwarnings("error::RuntimeWarning")
@pytest.mark.parametrize("sigmas", [[5e-324], [1e-300, 1e-300], [1e-160] * 3])
def test_compose_gaussians_with_overflowing_sigmas_names_the_option(tmp_path, sigmas):
    path = tmp_path / "sigmas.txt"
    path.write_text("\n".join(repr(s) for s in sigmas) + "\n")
    code, out, err = run(["epsilon", "compose-gaussians", "--sigmas", str(path), "--delta", "1e-5"])
    assert code == 2 and out == "" and err.count("\n") == 1
    assert "--sigmas" in err and "at least" in err


def test_compose_gaussians_reads_a_long_file_and_refuses_a_too_large_one(tmp_path, monkeypatch):
    rng = np.random.default_rng(0)
    sigmas = rng.uniform(200.0, 2000.0, 200_000)
    path = tmp_path / "long.txt"
    np.savetxt(path, sigmas)
    code, out, err = run(["epsilon", "compose-gaussians", "--sigmas", str(path), "--delta", "1e-5", "--json"])
    assert code == 0, err
    mu = math.sqrt(float(np.sum(1.0 / sigmas**2)))
    # Balle & Wang (2018) Thm 8 for mu-GDP at the reported epsilon: delta matches
    eps = json.loads(out)["epsilon"]
    delta = norm.cdf(mu / 2 - eps / mu) - math.exp(eps) * norm.cdf(-mu / 2 - eps / mu)
    assert delta == pytest.approx(1e-5, rel=1e-6)
    # the limits, scaled down: a file or array larger than the limit is refused before it is read
    monkeypatch.setattr(numbers, "MAX_SIGMAS_TEXT_BYTES", 1024)
    code, _, err = run(["epsilon", "compose-gaussians", "--sigmas", str(path), "--delta", "1e-5"])
    assert code == 2 and "--sigmas" in err and ".npy" in err
    np.save(tmp_path / "long.npy", sigmas)
    monkeypatch.setattr(numbers, "MAX_SIGMAS_ENTRIES", 1000)
    code, _, err = run(["epsilon", "compose-gaussians", "--sigmas", str(tmp_path / "long.npy"), "--delta", "1e-5"])
    assert code == 2 and "--sigmas" in err and "at most" in err


@pytest.mark.filterwarnings("error::RuntimeWarning")
def test_infinite_epsilon_is_json_null_with_the_non_finite_field():
    code, out, err = run(["epsilon", "gaussian", "--sigma", "1e-300", "--delta", "1e-5", "--json"])
    assert code == 0 and err == ""
    answer = json.loads(out)  # strict JSON: no Infinity token, no "inf" string
    assert answer["epsilon"] is None and answer["non_finite"] == {"epsilon": "inf"}
    code, out, _ = run(["epsilon", "gaussian", "--sigma", "1", "--delta", "1e-5", "--json"])
    assert "non_finite" not in json.loads(out)


@pytest.mark.filterwarnings("error::RuntimeWarning")
def test_calibrate_gaussian_at_a_tiny_epsilon_answers():
    code, out, err = run(["calibrate", "gaussian", "--epsilon", "5e-324", "--delta", "1e-5", "--json"])
    assert code == 0, err
    answer = json.loads(out)
    # the total-variation limit sigma = 1 / (2 sqrt(2) erfinv(delta)) as epsilon -> 0
    from scipy.special import erfinv

    assert answer["sigma"] == pytest.approx(1.0 / (2.0 * math.sqrt(2.0) * erfinv(1e-5)), rel=1e-6)
    assert answer["classic_sigma"] is None and answer["non_finite"] == {"classic_sigma": "inf"}


@pytest.mark.parametrize(
    ("call", "name"),
    [
        (lambda: dpsgd_epsilon(1e308, 0.01, 100, 1e-5), "noise_multiplier"),
        (lambda: dpsgd_epsilon(5e-324, 0.01, 100, 1e-5), "noise_multiplier"),
        (lambda: dpsgd_epsilon(1.0, 5e-324, 100, 1e-5), "sample_rate"),
        (lambda: dpsgd_epsilon(1.0, 0.01, 10**12, 1e-5), "steps"),
        (lambda: dpsgd_noise_multiplier(1.0, 1e-5, 0.01, 10**12), "steps"),
        (lambda: dpsgd_noise_multiplier(1.0, 1e-5, 1e-300, 100), "sample_rate"),
        (
            lambda: compute_epsilon(RepeatedEvent(PoissonSampledGaussianEvent(noise_multiplier=1.0, sample_rate=0.01), 10**10), 1e-5),
            "steps",
        ),
        (
            lambda: compute_epsilon(
                RepeatedEvent(RepeatedEvent(PoissonSampledGaussianEvent(noise_multiplier=1.0, sample_rate=1.0), 10**9), 10**9), 1e-5
            ),
            "count",
        ),
    ],
)
def test_library_refuses_out_of_range_inputs_by_name(call, name):
    with pytest.raises(InvalidParameterError, match=name):
        call()


def test_largest_steps_answer_with_every_accountant_that_applies():
    # at the limit (1e9 steps) auto answers; pld and prv refuse (their grids would not fit), naming what to use
    result = dpsgd_epsilon(1.0, 0.01, 10**9, 1e-5)
    assert math.isfinite(result.epsilon) and result.epsilon == min(result.candidates.values())
    for name in ("pld", "prv"):
        with pytest.raises(InvalidParameterError, match="grid points.*'auto'"):
            dpsgd_epsilon(1.0, 0.01, 10**9, 1e-5, name)
