"""``dpcl demo``: a certified continual-learning run on real data, then a worked accounting example.

Part 1 is a certified training run (:mod:`dpcl.runner.demo`): the DP Cosine
Classifier of Tobaben et al. (Alg. 1) on split digits, five tasks at epsilon = 1
per task, delta = 1e-5, with the bundled config written next to the run. It
prints a table (task, accuracy, cumulative epsilon), where the certificates
are, and verifies the last certificate. ``--out DIR`` keeps the run there
(default: a new temporary directory).

Part 2, the accounting walkthrough (:func:`accounting_walkthrough`), has three parts:

1. Gaussian calibration at delta = 1e-5: the analytic sigma (Balle & Wang 2018,
   Thm 8 and Alg. 1) next to the classic sigma = sqrt(2 ln(1.25/delta)) / epsilon
   (Dwork & Roth 2014, Thm A.1, proved for epsilon < 1 only), with the epsilon
   the classic sigma truly gives -- above the target once epsilon is large.
2. One DP-SGD run accounted by each accountant side by side (RDP, PLD, PRV's
   upper bound, and ``auto``), with the time each took.
3. Analytic calibration of a million per-token budgets in one vectorised call.

``dpcl demo --json`` prints the same numbers as one JSON object: the walkthrough's
keys plus ``run`` (the certified run).
"""

from __future__ import annotations

import argparse
import time
from typing import Any

import numpy as np

from dpcl.accounting.accountants.registry import TRAINING_CHOICES
from dpcl.accounting.dpsgd import dpsgd_epsilon
from dpcl.accounting.gaussian import classic_gaussian_sigma, gaussian_delta, gaussian_epsilon, gaussian_sigma
from dpcl.cli.output import add_json_flag, print_json
from dpcl.cli.run import quiet_accounting_logs

#: Targets of the calibration table; the classic formula is a theorem only for the first (epsilon < 1).
DEMO_EPSILONS = (0.5, 1.0, 2.0, 4.0, 8.0, 16.0, 32.0)
DEMO_DELTA = 1e-5
#: The DP-SGD run of part 2: 10 epochs of batches of 1% of the data, noise multiplier 1.
DEMO_DPSGD = {"noise_multiplier": 1.0, "sample_rate": 0.01, "steps": 1000, "delta": 1e-5}
#: The accountants part 2 compares: the registered accountants offered for training.
DEMO_ACCOUNTANTS = TRAINING_CHOICES
DEMO_TOKENS = 1_000_000


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "demo",
        help="a certified training run on digits, then a worked accounting example",
        description=(
            "A certified continual-learning run (DP Cosine Classifier on split digits, epsilon 1 per task, every "
            "release certified and the last certificate verified), then a worked accounting example: analytic vs "
            "classic Gaussian calibration (and where the classic formula goes wrong), one DP-SGD run under each "
            "accountant, a million per-token calibrations."
        ),
    )
    parser.add_argument("--out", metavar="DIR", default=None,
                        help="directory for the demo run (default: a new temporary directory)")
    parser.add_argument(
        "--seed", type=int, default=0,
        help="seed of the demo run's stream order (default 0); the privacy noise comes from OS entropy",
    )
    add_json_flag(parser)
    parser.set_defaults(handler=run_demo)


def _gaussian_rows() -> list[dict[str, Any]]:
    epsilons = np.asarray(DEMO_EPSILONS, dtype=np.float64)
    analytic = np.asarray(gaussian_sigma(epsilons, DEMO_DELTA), dtype=np.float64)
    classic = classic_gaussian_sigma(epsilons, DEMO_DELTA)
    classic_sigma = np.asarray(classic.sigma, dtype=np.float64)
    classic_valid = np.broadcast_to(np.asarray(classic.valid, dtype=bool), epsilons.shape)
    classic_actual = np.asarray(gaussian_epsilon(classic_sigma, DEMO_DELTA), dtype=np.float64)
    return [
        {
            "epsilon": float(e),
            "analytic_sigma": float(a),
            "classic_sigma": float(c),
            "classic_valid": bool(v),
            "classic_actual_epsilon": float(x),
            "classic_breaks_target": bool(x > e * (1 + 1e-9)),
        }
        for e, a, c, v, x in zip(epsilons, analytic, classic_sigma, classic_valid, classic_actual)
    ]


def _dpsgd_rows() -> list[dict[str, Any]]:
    import dp_accounting  # noqa: F401  -- imported before timing, so the times below are accounting only
    import prv_accountant  # noqa: F401

    rows = []
    for accountant in DEMO_ACCOUNTANTS:
        start = time.perf_counter()
        result = dpsgd_epsilon(
            DEMO_DPSGD["noise_multiplier"],
            DEMO_DPSGD["sample_rate"],
            DEMO_DPSGD["steps"],
            DEMO_DPSGD["delta"],
            accountant=accountant,
        )
        seconds = time.perf_counter() - start
        rows.append(
            {
                "requested": accountant,
                "accountant": str(result.accountant),
                "epsilon": float(result.epsilon),
                "seconds": seconds,
                "adjacency": getattr(result.adjacency, "value", result.adjacency),
                "unit": str(result.unit),
            }
        )
    return rows


def _token_calibration() -> dict[str, Any]:
    budgets = np.random.default_rng(0).uniform(0.5, 8.0, DEMO_TOKENS)
    start = time.perf_counter()
    sigmas = np.asarray(gaussian_sigma(budgets, DEMO_DELTA), dtype=np.float64)
    seconds = time.perf_counter() - start
    worst_delta = float(np.max(gaussian_delta(budgets, sigmas)))
    return {
        "tokens": DEMO_TOKENS,
        "epsilon_range": [0.5, 8.0],
        "delta": DEMO_DELTA,
        "seconds": seconds,
        "sigma_min": float(sigmas.min()),
        "sigma_max": float(sigmas.max()),
        "max_achieved_delta": worst_delta,
    }


def accounting_walkthrough(console: Any | None = None) -> dict[str, Any]:
    """Compute the walkthrough and, if ``console`` (a rich Console) is given, print it as tables.

    Returns the numbers as a JSON-able dict with keys ``gaussian_calibration``,
    ``dpsgd`` and ``token_calibration``.
    """
    gaussian_rows = _gaussian_rows()
    dpsgd_rows = _dpsgd_rows()
    tokens = _token_calibration()
    result = {
        "gaussian_calibration": {"delta": DEMO_DELTA, "sensitivity": 1.0, "rows": gaussian_rows},
        "dpsgd": {**DEMO_DPSGD, "rows": dpsgd_rows},
        "token_calibration": tokens,
    }
    if console is not None:
        _print_walkthrough(console, result)
    return result


def _print_walkthrough(console: Any, result: dict[str, Any]) -> None:
    from rich.table import Table

    console.rule("[bold]1. Calibrating a Gaussian mechanism (sensitivity 1, delta = 1e-5)")
    table = Table(show_header=True, header_style="bold")
    for column in ("target ε", "analytic σ", "classic σ", "classic valid?", "true ε of classic σ"):
        table.add_column(column, justify="right")
    for row in result["gaussian_calibration"]["rows"]:
        actual = f"{row['classic_actual_epsilon']:.4g}"
        if row["classic_breaks_target"]:
            actual = f"[bold red]{actual}  (> target)[/]"
        table.add_row(
            f"{row['epsilon']:g}",
            f"{row['analytic_sigma']:.4f}",
            f"{row['classic_sigma']:.4f}",
            "yes" if row["classic_valid"] else "[yellow]no (ε ≥ 1)[/]",
            actual,
        )
    console.print(table)
    console.print(
        "The analytic σ is the smallest noise whose exact privacy profile gives δ(ε) ≤ δ (Balle & Wang 2018, "
        "Thm 8). The classic formula σ = √(2 ln(1.25/δ))/ε is a theorem only for ε < 1: below 1 it wastes noise, "
        "at large ε it adds too little and the real ε exceeds the target."
    )

    d = result["dpsgd"]
    console.rule(
        f"[bold]2. One DP-SGD run (z = {d['noise_multiplier']:g}, q = {d['sample_rate']:g}, "
        f"T = {d['steps']}, δ = {d['delta']:g})"
    )
    table = Table(show_header=True, header_style="bold")
    for column, justify in (("accountant", "left"), ("ε (upper bound)", "right"), ("time", "right")):
        table.add_column(column, justify=justify)
    for row in d["rows"]:
        name = row["requested"] if row["requested"] == row["accountant"] else f"{row['requested']} → {row['accountant']}"
        table.add_row(name, f"{row['epsilon']:.4f}", f"{row['seconds'] * 1000:.0f} ms")
    console.print(table)
    console.print(
        "All four are sound upper bounds (add/remove adjacency, one example as privacy unit). RDP is loose; PLD "
        "and PRV (its upper bound, not its estimate) are tight; auto reports the tightest of the accountants it "
        "runs and names it (its PLD uses a coarser, faster discretisation than the pld row, so the two can differ "
        "in the last digits; both are upper bounds)."
    )

    t = result["token_calibration"]
    console.rule("[bold]3. Per-token budgets")
    console.print(
        f"Calibrated {t['tokens']:,} per-token budgets ε ∈ [{t['epsilon_range'][0]:g}, {t['epsilon_range'][1]:g}] in "
        f"one vectorised call: {t['seconds'] * 1000:.0f} ms; σ from {t['sigma_min']:.3f} to {t['sigma_max']:.3f}; "
        f"largest achieved δ {t['max_achieved_delta']:.10g} (≤ {t['delta']:g})."
    )


def run_demo(args: argparse.Namespace) -> int:
    # lazy import: keeps CLI start-up fast (only this command needs it)
    from dpcl.runner.demo import certified_demo_run, print_demo_run

    quiet_accounting_logs()
    run = certified_demo_run(getattr(args, "out", None), seed=getattr(args, "seed", 0))
    if getattr(args, "json", False):
        print_json({**accounting_walkthrough(None), "run": run})
        return 0
    from rich.console import Console

    console = Console()
    print_demo_run(console, run)
    accounting_walkthrough(console)
    return 0
