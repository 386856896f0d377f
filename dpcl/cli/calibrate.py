"""``dpcl calibrate``: the noise that reaches a target (epsilon, delta).

``dpcl calibrate gaussian --epsilon E --delta D [--sensitivity S]``
    Analytic Gaussian calibration (Balle & Wang 2018, Thm 8 and Alg. 1): the
    smallest sigma whose exact privacy profile satisfies delta(E) <= D. Also
    reports the classic sigma = S * sqrt(2 ln(1.25/D)) / E (Dwork & Roth 2014,
    Thm A.1), its validity flag (the theorem needs E < 1) and the epsilon that
    classic sigma truly gives at D.

``dpcl calibrate dpsgd --epsilon E --delta D --sample-rate Q --steps T [--accountant auto|prv|pld|rdp]``
    The smallest DP-SGD noise multiplier (Poisson sampling at rate Q, T steps,
    add/remove adjacency, one example as privacy unit) whose accounted epsilon
    at D does not exceed E; ``auto`` (default) is the tightest sound bound.

Every number is parsed by :mod:`dpcl.cli.numbers`, so bad values exit with code
2 and one line naming the option. The accounting modules are imported inside
the handlers: ``dpcl --help`` stays fast and does not load dp-accounting.
"""

from __future__ import annotations

import argparse
import math

import numpy as np

from dpcl.accounting.accountants.registry import TRAINING_CHOICES
from dpcl.accounting.dpsgd import dpsgd_noise_multiplier
from dpcl.accounting.gaussian import classic_gaussian_sigma, gaussian_epsilon, gaussian_sigma
from dpcl.cli.numbers import computed, parse_delta, parse_dpsgd_inputs, parse_positive
from dpcl.cli.output import DELTA_OPTION, SAMPLE_RATE_OPTION, STEPS_OPTION, add_command, emit_lines
from dpcl.errors import InvalidParameterError


#: Accountants that can calibrate DP-SGD noise (default ``auto``: the tightest sound bound): the registered
#: accountants offered for training.
DPSGD_CALIBRATION_ACCOUNTANTS = TRAINING_CHOICES


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "calibrate",
        help="noise needed for a target (epsilon, delta)",
        description="Calibrate noise to a target (epsilon, delta).",
    )
    mechanisms = parser.add_subparsers(dest="mechanism", metavar="MECHANISM", required=True)
    epsilon = ("--epsilon", {"required": True, "metavar": "E", "help": "target epsilon, > 0"})
    add_command(
        mechanisms, "gaussian",
        help="analytic Gaussian sigma (Balle & Wang 2018) and the classic formula",
        description=(
            "Smallest Gaussian sigma with delta(epsilon) <= delta under the exact privacy profile "
            "(Balle & Wang 2018, Thm 8), next to the classic formula and whether it is valid (epsilon < 1)."
        ),
        options=[
            epsilon,
            ("--delta", {"required": True, "metavar": "D", "help": "target delta, in (0, 1)"}),
            ("--sensitivity", {"default": "1.0", "metavar": "S",
                               "help": "l2 sensitivity of the query under your neighbouring relation (default 1)"}),
        ],
        handler=run_calibrate_gaussian,
    )
    add_command(
        mechanisms, "dpsgd",
        help="smallest DP-SGD noise multiplier for a target epsilon",
        description=(
            "Smallest DP-SGD noise multiplier (sigma / clipping norm) such that T steps of Poisson-subsampled "
            "Gaussian at rate Q stay within (epsilon, delta) under add/remove adjacency."
        ),
        options=[
            epsilon,
            DELTA_OPTION,
            SAMPLE_RATE_OPTION,
            STEPS_OPTION,
            ("--accountant", {"default": "auto", "choices": DPSGD_CALIBRATION_ACCOUNTANTS, "help": (
                "accountant used for the search (default auto: the tightest sound bound of dpcl's accountants; "
                "prv uses prv-accountant's upper bound)")}),
        ],
        handler=run_calibrate_dpsgd,
        time_hint=(
            "a calibration evaluates the accountant many times; try --accountant rdp (fastest, a looser bound), a "
            "larger --epsilon or --sample-rate, or fewer --steps"),
    )


def calibrate_gaussian_payload(epsilon: float, delta: float, sensitivity: float) -> dict:
    """The ``dpcl calibrate gaussian`` answer as a dict (keys documented in docs/cli.md)."""
    inputs = f"--epsilon {epsilon!r}, --delta {delta!r}, --sensitivity {sensitivity!r}"
    with np.errstate(all="ignore"):  # extreme inputs: the result is checked below instead of warned about
        try:
            raw_sigma = gaussian_sigma(epsilon, delta, sensitivity=sensitivity)
        except InvalidParameterError as exc:  # no finite sigma: say it with the command's option names
            raise InvalidParameterError(f"sigma cannot be computed for {inputs}: {exc}") from exc
        sigma = computed("sigma", raw_sigma, inputs)
        classic = classic_gaussian_sigma(epsilon, delta, sensitivity=sensitivity)
        # the classic sigma S sqrt(2 ln(1.25/D)) / E overflows for tiny E: infinite noise, epsilon 0
        classic_sigma = computed("classic_sigma", classic.sigma, inputs, allow_inf=True)
        classic_valid = bool(classic.valid)
        classic_actual = (
            computed(
                "classic_actual_epsilon", gaussian_epsilon(classic_sigma, delta, sensitivity=sensitivity), inputs,
                allow_inf=True,
            )
            if math.isfinite(classic_sigma)
            else 0.0
        )
    notes = [
        "sigma is the smallest noise with exact delta(epsilon) <= delta (Balle & Wang 2018, Thm 8).",
    ]
    if classic_valid:
        notes.append("classic formula valid (epsilon < 1) but looser: it adds more noise than needed.")
    else:
        notes.append(
            "classic formula NOT valid at epsilon >= 1 (Dwork & Roth 2014, Thm A.1 needs epsilon < 1): "
            f"its sigma truly gives epsilon = {classic_actual:.6g} at this delta."
            if classic_actual > epsilon
            else "classic formula outside its proven range (epsilon >= 1); do not rely on it."
        )
    return {
        "sigma": sigma,
        "epsilon": epsilon,
        "delta": delta,
        "sensitivity": sensitivity,
        "classic_sigma": classic_sigma,
        "classic_valid": classic_valid,
        "classic_actual_epsilon": classic_actual,
        "accountant": "exact",
        "notes": notes,
    }


def run_calibrate_gaussian(args: argparse.Namespace) -> int:
    epsilon = parse_positive("--epsilon", args.epsilon)
    delta = parse_delta("--delta", args.delta)
    sensitivity = parse_positive("--sensitivity", args.sensitivity)
    emit_lines(args, "Gaussian calibration", calibrate_gaussian_payload(epsilon, delta, sensitivity))
    return 0


def run_calibrate_dpsgd(args: argparse.Namespace) -> int:
    epsilon = parse_positive("--epsilon", args.epsilon)
    delta = parse_delta("--delta", args.delta)
    sample_rate, steps = parse_dpsgd_inputs(args)

    calibration = dpsgd_noise_multiplier(epsilon, delta, sample_rate, steps, accountant=args.accountant)
    inputs = f"--epsilon {epsilon!r}, --delta {delta!r}, --sample-rate {sample_rate!r}, --steps {steps}"
    payload = {
        "noise_multiplier": computed("noise_multiplier", calibration.noise_multiplier, inputs),
        "epsilon": computed("epsilon", calibration.epsilon, inputs),
        "accountant": str(calibration.accountant),
        "target_epsilon": epsilon,
        "delta": delta,
        "sample_rate": sample_rate,
        "steps": steps,
        "adjacency": "add_remove",
        "unit": "example",
    }
    emit_lines(args, "DP-SGD noise calibration", payload)
    return 0
