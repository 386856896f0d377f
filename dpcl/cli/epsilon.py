"""``dpcl epsilon``: the epsilon a mechanism gives at a stated delta.

``dpcl epsilon gaussian --sigma S --delta D [--sensitivity C]``
    Exact epsilon of one Gaussian mechanism (Balle & Wang 2018, Thm 8, solved
    for epsilon by root finding).

``dpcl epsilon dpsgd --noise-multiplier Z --sample-rate Q --steps T --delta D [--accountant auto|prv|pld|rdp]``
    Epsilon of T DP-SGD steps (Poisson sampling, add/remove adjacency, one
    example as privacy unit). ``prv`` reports prv-accountant's upper bound,
    ``auto`` the tightest sound bound among the applicable accountants.

``dpcl epsilon compose-gaussians --sigmas FILE --delta D [--sensitivity C]``
    Exact epsilon of the adaptive composition of Gaussian mechanisms, one sigma
    per line of FILE (blank and ``#`` lines ignored) or a ``.npy`` array: the
    composition is mu-GDP with mu = sqrt(sum (C / sigma_i)^2) (Dong, Roth & Su
    2022, Cor. 3.3), converted to epsilon exactly (their Cor. 2.13).
"""

from __future__ import annotations

import argparse
import math

import numpy as np

from dpcl.accounting.accountants.registry import TRAINING_CHOICES
from dpcl.accounting.composition import compose_gaussians_epsilon, gaussian_composition_mu
from dpcl.accounting.dpsgd import dpsgd_epsilon
from dpcl.accounting.gaussian import gaussian_epsilon
from dpcl.cli.numbers import (
    computed,
    parse_delta,
    parse_dpsgd_inputs,
    parse_noise_multiplier,
    parse_positive,
    read_sigmas,
)
from dpcl.cli.output import DELTA_OPTION, SAMPLE_RATE_OPTION, STEPS_OPTION, add_command, emit_lines
from dpcl.errors import InvalidParameterError


#: Accountants ``dpcl epsilon dpsgd`` offers: the registered accountants offered for training.
DPSGD_ACCOUNTANTS = TRAINING_CHOICES


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "epsilon",
        help="epsilon of a mechanism at a given delta",
        description="Epsilon (an upper bound) of a mechanism or a composition at a given delta.",
    )
    mechanisms = parser.add_subparsers(dest="mechanism", metavar="MECHANISM", required=True)
    add_command(
        mechanisms, "gaussian",
        help="exact epsilon of one Gaussian mechanism",
        description="Exact epsilon of one Gaussian mechanism at delta (Balle & Wang 2018, Thm 8).",
        options=[
            ("--sigma", {"required": True, "metavar": "S", "help": "noise standard deviation, > 0"}),
            DELTA_OPTION,
            ("--sensitivity", {"default": "1.0", "metavar": "C",
                               "help": "l2 sensitivity of the query under your neighbouring relation (default 1)"}),
        ],
        handler=run_epsilon_gaussian,
    )
    add_command(
        mechanisms, "dpsgd",
        help="epsilon of a DP-SGD run",
        description=(
            "Epsilon of T steps of DP-SGD: Poisson sampling at rate Q, clipped per-example gradients, "
            "Gaussian noise with the given multiplier; add/remove adjacency, privacy unit = one example."
        ),
        options=[
            ("--noise-multiplier", {"required": True, "metavar": "Z", "help": "sigma / clipping norm, > 0"}),
            SAMPLE_RATE_OPTION,
            STEPS_OPTION,
            DELTA_OPTION,
            ("--accountant", {"default": "auto", "choices": DPSGD_ACCOUNTANTS,
                              "help": "accountant (default auto: the tightest sound bound, named in the answer)"}),
        ],
        handler=run_epsilon_dpsgd,
        time_hint="try --accountant rdp (fastest, a looser bound) or pld, or a larger --noise-multiplier",
    )
    add_command(
        mechanisms, "compose-gaussians",
        help="exact epsilon of many composed Gaussian mechanisms",
        description=(
            "Exact epsilon of the adaptive composition of Gaussian mechanisms with the sigmas in FILE "
            "(one per line; blank lines and lines starting with '#' are ignored; or a .npy array)."
        ),
        options=[
            ("--sigmas", {"required": True, "metavar": "FILE", "help": "text file, one sigma per line, or .npy"}),
            DELTA_OPTION,
            ("--sensitivity", {"default": "1.0", "metavar": "C",
                               "help": "l2 sensitivity shared by every mechanism (default 1)"}),
        ],
        handler=run_epsilon_compose_gaussians,
        time_hint="split the sigmas into several files",
    )


def run_epsilon_gaussian(args: argparse.Namespace) -> int:
    sigma = parse_positive("--sigma", args.sigma)
    delta = parse_delta("--delta", args.delta)
    sensitivity = parse_positive("--sensitivity", args.sensitivity)

    inputs = f"--sigma {sigma!r}, --delta {delta!r}, --sensitivity {sensitivity!r}"
    with np.errstate(all="ignore"):  # extreme inputs: the result is checked instead of warned about
        epsilon = computed("epsilon", gaussian_epsilon(sigma, delta, sensitivity=sensitivity), inputs, allow_inf=True)
    payload = {
        "epsilon": epsilon,
        "delta": delta,
        "sigma": sigma,
        "sensitivity": sensitivity,
        "accountant": "exact",
    }
    emit_lines(args, "Gaussian mechanism", payload)
    return 0


def run_epsilon_dpsgd(args: argparse.Namespace) -> int:
    noise_multiplier = parse_noise_multiplier("--noise-multiplier", args.noise_multiplier)
    sample_rate, steps = parse_dpsgd_inputs(args)
    delta = parse_delta("--delta", args.delta)

    result = dpsgd_epsilon(noise_multiplier, sample_rate, steps, delta, accountant=args.accountant)
    inputs = f"--noise-multiplier {noise_multiplier!r}, --sample-rate {sample_rate!r}, --steps {steps}, --delta {delta!r}"
    payload = {
        "epsilon": computed("epsilon", result.epsilon, inputs, allow_inf=True),
        "accountant": str(result.accountant),
        "delta": float(result.delta),
        "noise_multiplier": noise_multiplier,
        "sample_rate": sample_rate,
        "steps": steps,
        "adjacency": getattr(result.adjacency, "value", result.adjacency),
        "unit": str(result.unit),
    }
    if result.candidates:
        payload["candidates"] = {str(k): float(v) for k, v in result.candidates.items()}
    if result.notes:
        payload["notes"] = list(result.notes)
    emit_lines(args, "DP-SGD privacy", payload)
    return 0


def run_epsilon_compose_gaussians(args: argparse.Namespace) -> int:
    delta = parse_delta("--delta", args.delta)
    sensitivity = parse_positive("--sensitivity", args.sensitivity)
    sigmas = read_sigmas("--sigmas", args.sigmas)

    inputs = f"{sigmas.size} sigmas from --sigmas, --delta {delta!r}, --sensitivity {sensitivity!r}"
    # (sensitivity / sigma)^2 summed over the file must be a finite float: each sigma at least this
    smallest_sigma = sensitivity * math.sqrt(sigmas.size) / 1e154
    if not np.all(sigmas >= smallest_sigma):
        raise InvalidParameterError(
            f"--sigmas: every sigma must be at least --sensitivity * sqrt(count) / 1e154 = {smallest_sigma:.3g} here "
            f"(got {float(sigmas.min()):.3g} among {sigmas.size}); below it the sum of (sensitivity / sigma)^2 overflows "
            "a float and epsilon is astronomically large: add noise or lower --sensitivity."
        )
    with np.errstate(all="ignore"):  # extreme inputs: the result is checked instead of warned about
        epsilon = computed("epsilon", compose_gaussians_epsilon(sigmas, delta, sensitivities=sensitivity), inputs, allow_inf=True)
        mu = computed("mu", gaussian_composition_mu(sigmas, sensitivities=sensitivity), inputs, allow_inf=True)
    payload = {
        "epsilon": epsilon,
        "count": int(sigmas.size),
        "delta": delta,
        "mu": mu,
        "sensitivity": sensitivity,
        "accountant": "exact",
    }
    emit_lines(args, "Composition of Gaussian mechanisms", payload)
    return 0
