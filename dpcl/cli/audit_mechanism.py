"""``dpcl audit-mechanism``: empirical check that a mechanism does not leak more than claimed.

``dpcl audit-mechanism gaussian --sigma S [--sensitivity C] --claimed-epsilon E --delta D [--trials N] [--seed K] [--confidence 0.95] [--json]``
``dpcl audit-mechanism laplace --scale B [--sensitivity C] --claimed-epsilon E --delta D [--trials N] [--seed K] [--confidence 0.95] [--json]``

Draws ``N`` outputs of the mechanism on each of its worst-case neighbouring
inputs (query values 0 and the sensitivity), runs the black-box auditor
(:mod:`dpcl.audit.blackbox`: threshold tests, Clopper–Pearson bounds, threshold
chosen on one half of the samples and bounded on the other) and reports a lower
bound on epsilon at ``D`` that holds with the given confidence. The verdict is
``violated`` (exit 3) when that lower bound exceeds the claimed epsilon,
``consistent`` (exit 0) otherwise; bad input exits 2. ``consistent`` means no
leak above the claim was found with these trials, not that the claim is proven.
"""

from __future__ import annotations

import argparse
import math
import sys

import numpy as np

from dpcl.accounting.laplace import laplace_epsilon_for_delta
from dpcl.audit.blackbox import MAX_TRIALS
from dpcl.audit.mechanisms import GaussianMechanism, LaplaceMechanism, audit_mechanism
from dpcl.cli.numbers import parse_count, parse_delta, parse_positive
from dpcl.cli.output import add_json_flag, emit
from dpcl.errors import InvalidParameterError

#: Default number of outputs drawn per neighbouring input.
DEFAULT_TRIALS = 1_000_000


#: Largest noise scale or sensitivity audited: the mechanism's outputs (query value plus noise,
#: up to ~10 noise scales for 1e8 trials) and the auditor's thresholds between them stay finite.
MAX_AUDITED_SCALE = 1e300


def _parse_scale(option: str, text: str) -> float:
    value = parse_positive(option, text)
    if value > MAX_AUDITED_SCALE:
        raise InvalidParameterError(
            f"{option} must be at most {MAX_AUDITED_SCALE:g}, got {text!r}; the sampled outputs would overflow a "
            "float. Only the ratio sensitivity / noise scale matters: divide both by the same factor."
        )
    return value


def _add_common(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--sensitivity", default="1.0", metavar="C",
        help="sensitivity of the query (l2 for gaussian, l1 for laplace) under your neighbouring relation (default 1)",
    )
    parser.add_argument("--claimed-epsilon", required=True, metavar="E", help="the epsilon claimed for the mechanism, > 0")
    parser.add_argument("--delta", required=True, metavar="D", help="delta of the claim, in [0, 1)")
    parser.add_argument(
        "--trials", default=str(DEFAULT_TRIALS), metavar="N",
        help=f"outputs drawn per neighbouring input, integer in [4, {MAX_TRIALS}] (default {DEFAULT_TRIALS})",
    )
    parser.add_argument("--seed", default="0", metavar="K", help="seed of the random draws, integer >= 0 (default 0)")
    parser.add_argument(
        "--confidence", default="0.95", metavar="P",
        help="probability with which the lower bound holds, in (0, 1) (default 0.95)",
    )
    parser.add_argument("--quiet", action="store_true", help="no progress bar")
    add_json_flag(parser)


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "audit-mechanism",
        help="empirical lower bound on a mechanism's epsilon, checked against a claim",
        description=(
            "Sample the mechanism on its worst-case neighbouring inputs and compute a lower bound on epsilon "
            "at delta that holds with the given confidence. Exit 0 when the bound does not exceed the claimed "
            "epsilon (verdict 'consistent'), 3 when it does ('violated'), 2 for bad input."
        ),
    )
    mechanisms = parser.add_subparsers(dest="mechanism", metavar="MECHANISM", required=True)
    gaussian = mechanisms.add_parser(
        "gaussian", help="x + N(0, sigma^2)", description="Audit the Gaussian mechanism x + N(0, sigma^2)."
    )
    gaussian.add_argument("--sigma", required=True, metavar="S", help="noise standard deviation, > 0")
    _add_common(gaussian)
    gaussian.set_defaults(handler=run_audit_mechanism, time_hint="use fewer --trials")
    laplace = mechanisms.add_parser(
        "laplace", help="x + Lap(scale)", description="Audit the Laplace mechanism x + Lap(scale)."
    )
    laplace.add_argument("--scale", required=True, metavar="B", help="Laplace noise scale, > 0")
    _add_common(laplace)
    laplace.set_defaults(handler=run_audit_mechanism, time_hint="use fewer --trials")


def run_audit_mechanism(args: argparse.Namespace) -> int:
    sensitivity = _parse_scale("--sensitivity", args.sensitivity)
    claimed = parse_positive("--claimed-epsilon", args.claimed_epsilon)
    delta = parse_delta("--delta", args.delta, allow_zero=True)
    trials = parse_count("--trials", args.trials, 4, MAX_TRIALS)
    seed = parse_count("--seed", args.seed, 0)
    confidence = parse_delta("--confidence", args.confidence)
    payload: dict = {"mechanism": args.mechanism}
    if args.mechanism == "gaussian":
        mechanism = GaussianMechanism(_parse_scale("--sigma", args.sigma), sensitivity)
        payload["sigma"] = mechanism.sigma
        exact = mechanism.epsilon(delta) if delta > 0 else math.inf
        exact_note = "exact epsilon of this sigma at delta (Balle & Wang 2018, Thm 8)"
    else:
        mechanism = LaplaceMechanism(_parse_scale("--scale", args.scale), sensitivity)
        payload["scale"] = mechanism.scale
        with np.errstate(over="ignore", invalid="ignore"):  # sensitivity / scale may overflow: epsilon is then inf
            exact = mechanism.epsilon() if delta == 0 else float(laplace_epsilon_for_delta(mechanism.scale, delta, sensitivity))
        exact_note = (
            "exact epsilon of this Laplace noise at delta, max(0, sensitivity/scale + 2 ln(1 - delta)) "
            "(the pure epsilon sensitivity/scale at delta = 0)"
        )
    from tqdm.auto import tqdm

    with tqdm(total=trials, desc="audit", unit="trial", unit_scale=True, file=sys.stderr, leave=False,
              disable=args.quiet or args.json) as bar:
        result = audit_mechanism(mechanism, delta, trials=trials, confidence=confidence, seed=seed,
                                 progress=bar.update)
    violated = result.epsilon_lower_bound > claimed
    payload.update(
        {
            "sensitivity": sensitivity,
            "delta": delta,
            "epsilon_lower_bound": result.epsilon_lower_bound,
            "claimed_epsilon": claimed,
            "mechanism_epsilon": exact,
            "mechanism_epsilon_source": exact_note,
            "trials": trials,
            "confidence": confidence,
            "seed": seed,
            "verdict": "violated" if violated else "consistent",
            "test": f"{result.inequality} at threshold {result.threshold:.6g}",
            "threshold_selection": "threshold chosen on one half of the trials, bound computed on the other half",
        }
    )
    emit(args, f"audit-mechanism {args.mechanism}", payload)
    return 3 if violated else 0
