"""Audit benchmarks: speed of the black-box auditor, its power, and the DP-SGD canary audit.

Usage (from the repository root)::

    .venv/bin/python benchmarks/run_all.py                # the whole report, benchmarks/RESULTS.md (this is section 4)
    .venv/bin/python benchmarks/bench_audit.py            # this section alone (a few minutes on 2 cores); prints it
    .venv/bin/python benchmarks/bench_audit.py --quick    # smoke run: fewer trials and seeds; prints it

From Python (opacus installs a top-level package named ``benchmarks``, so import
this file as a module of the ``benchmarks/`` folder, as ``run_all.py`` does)::

    sys.path.insert(0, "benchmarks")
    import bench_audit
    results = bench_audit.measure(quick=False)
    markdown = bench_audit.render(results)

Measured here, nothing copied in by hand:

1. **Speed**: wall-clock of ``audit_sampler`` on a Gaussian with 10^6 and 10^7
   trials per input (sampling included) and of ``audit_scores`` on 10^6 ready
   scores; median of ``repeats`` runs after one warm-up. Throughput is the
   number of mechanism outputs audited (both neighbouring inputs) per second.
2. **Power / tightness**: the lower bound epsilon_hat reached as a fraction of
   the mechanism's true epsilon (exact Gaussian profile, Balle & Wang 2018
   Thm 8, via ``dpcl.accounting.gaussian``; Laplace: sensitivity / scale), for
   correctly calibrated mechanisms and for mis-calibrated ones (sigma computed
   at half the sensitivity; the classic formula outside eps < 1), with the
   verdict against the claim. Mean over ``seeds`` seeds at 95% confidence.
3. **DP-SGD canary audit**: epsilon_hat (loss and gradient scores) next to the
   accountant's epsilon for the same run.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import time
from pathlib import Path
from typing import Any, Callable

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from dpcl.accounting.gaussian import classic_gaussian_sigma, gaussian_sigma  # noqa: E402
from dpcl.audit.blackbox import audit_sampler, audit_scores  # noqa: E402
from dpcl.audit.mechanisms import GaussianMechanism, LaplaceMechanism, audit_mechanism  # noqa: E402
from dpcl.progress import progress  # noqa: E402



def _median_time(fn: Callable[[], Any], repeats: int) -> float:
    fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def bench_speed(quick: bool) -> list[tuple[str, int, float]]:
    """(what, mechanism outputs audited over both inputs, median seconds) per auditor call."""
    sample_0 = lambda n, rng: rng.normal(0.0, 1.0, n)  # noqa: E731
    sample_1 = lambda n, rng: rng.normal(1.0, 1.0, n)  # noqa: E731
    rng = np.random.default_rng(0)
    s0, s1 = rng.normal(0, 1, 10**6), rng.normal(1, 1, 10**6)
    rows = [
        ("audit_sampler, Gaussian, 10^6 trials per input (sampling included)", 2 * 10**6,
         _median_time(lambda: audit_sampler(sample_0, sample_1, 10**6, 1e-5), 1 if quick else 5)),
        ("audit_scores, 10^6 ready scores per input", 2 * 10**6,
         _median_time(lambda: audit_scores(s0, s1, 1e-5), 1 if quick else 5)),
    ]
    if not quick:
        rows.append(("audit_sampler, Gaussian, 10^7 trials per input (sampling included)", 2 * 10**7,
                     _median_time(lambda: audit_sampler(sample_0, sample_1, 10**7, 1e-5), 3)))
    return rows


def _power_row(label: str, mechanism: Any, claim: float, delta: float, true_eps: float, trials: int, seeds: int) -> dict:
    bounds = np.array([audit_mechanism(mechanism, delta, trials=trials, seed=s).epsilon_lower_bound for s in range(seeds)])
    return {
        "setting": label,
        "claim": claim,
        "delta": delta,
        "true_eps": true_eps,
        "trials": trials,
        "mean": float(bounds.mean()),
        "min": float(bounds.min()),
        "max": float(bounds.max()),
        "fraction": float(bounds.mean() / true_eps),
        "flagged": int(np.sum(bounds > claim)),
        "seeds": seeds,
    }


def bench_power(quick: bool) -> list[dict]:
    seeds = 2 if quick else 10
    big = 10**6 if quick else 10**7
    rows = []
    for eps, delta in ((0.5, 1e-5), (1.0, 1e-5), (2.0, 1e-5), (4.0, 1e-5), (1.0, 1e-2)):
        m = GaussianMechanism.calibrated(eps, delta)
        for trials in (10**6, big) if not quick else (10**6,):
            rows.append(_power_row(f"Gaussian, analytic sigma for ({eps:g}, {delta:g})", m, eps, delta,
                                   m.epsilon(delta), trials, seeds))
    for eps in (0.5, 1.0, 3.0):
        m = LaplaceMechanism.calibrated(eps)
        rows.append(_power_row(f"Laplace, scale 1/{eps:g} (pure eps, audited at delta = 0)", m, eps, 0.0, eps, 10**6, seeds))
    # mis-calibrated: sigma at half the sensitivity
    for eps, delta in ((1.0, 1e-5), (4.0, 1e-5)):
        m = GaussianMechanism(float(gaussian_sigma(eps, delta, 0.5)), 1.0)
        for trials in (10**5, 10**6):
            rows.append(_power_row(f"Gaussian, sigma for ({eps:g}, {delta:g}) at HALF the sensitivity", m, eps, delta,
                                   m.epsilon(delta), trials, seeds))
    # the classic formula outside eps < 1
    for eps, delta in ((8.0, 0.1), (8.0, 0.05), (8.0, 1e-5), (16.0, 1e-5)):
        m = GaussianMechanism(float(classic_gaussian_sigma(eps, delta).sigma), 1.0)
        rows.append(_power_row(f"Gaussian, CLASSIC sigma for ({eps:g}, {delta:g})", m, eps, delta,
                               m.epsilon(delta), big, seeds))
    return rows


def bench_canary(quick: bool) -> list[dict]:
    from dpcl.audit.canary import audit_dpsgd_canary

    runs = 1000 if quick else 20_000
    settings = [(0.5, 1.0, 1, 1e-5), (1.0, 1.0, 4, 1e-5), (1.0, 1.0, 4, 1e-2), (0.8, 0.5, 20, 1e-5), (1.0, 0.1, 50, 1e-5)]
    if quick:
        settings = settings[:2]
    rows = []
    for z, q, steps, delta in settings:
        start = time.perf_counter()
        r = audit_dpsgd_canary(noise_multiplier=z, sample_rate=q, steps=steps, delta=delta, shadow_runs=runs, seed=0)
        rows.append({
            "z": z, "q": q, "steps": steps, "delta": delta, "runs": r.shadow_runs,
            "accountant": r.accountant, "eps": r.accountant_epsilon,
            "loss": r.audits["loss"].epsilon_lower_bound, "gradient": r.audits["gradient"].epsilon_lower_bound,
            "best": r.epsilon_lower_bound, "ratio": r.ratio, "seconds": time.perf_counter() - start,
        })
    return rows


def measure(quick: bool = False) -> dict[str, Any]:
    """All three audit benchmarks: ``{"speed": [...], "power": [...], "canary": [...]}`` (see the module docstring)."""
    sections = {"speed": bench_speed, "power": bench_power, "canary": bench_canary}
    return {name: run(quick) for name, run in progress(sections.items(), desc="audit benchmarks", unit="section",
                                                       total=len(sections))}


def summary(results: dict[str, Any]) -> dict[str, Any]:
    """Headline numbers for the report's summary table, computed from :func:`measure`'s results."""
    name, outputs, seconds = results["speed"][0]
    calibrated = [r for r in results["power"] if r["setting"].startswith(("Gaussian, analytic", "Laplace"))]
    largest = max(r["trials"] for r in calibrated if r["setting"].startswith("Gaussian"))
    gaussian_big = [r for r in calibrated if r["setting"].startswith("Gaussian") and r["trials"] == largest]
    miscalibrated = [r for r in results["power"] if "HALF" in r["setting"] or "CLASSIC" in r["setting"]]
    violating = [r for r in miscalibrated if r["true_eps"] > r["claim"]]
    return {
        "sampler_outputs_per_second": outputs / seconds,
        "sampler_what": name,
        "calibrated_flagged": sum(r["flagged"] for r in calibrated),
        "calibrated_runs": sum(r["seeds"] for r in calibrated),
        "gaussian_trials": largest,
        "gaussian_fraction_min": min(r["fraction"] for r in gaussian_big),
        "gaussian_fraction_max": max(r["fraction"] for r in gaussian_big),
        "violating_flagged": sum(r["flagged"] for r in violating),
        "violating_runs": sum(r["seeds"] for r in violating),
        "canary_ratio_max": max((r["ratio"] for r in results["canary"]), default=float("nan")),
    }


def render(results: dict[str, Any], heading: str = "##", standalone: bool = True, number: int | None = None) -> str:
    """Markdown for the audit benchmarks.

    ``standalone`` adds a line naming the machine (the merged report has a table at its top); ``heading`` is
    the markdown level of the section title, ``number`` (if given) its number.
    """
    speed, power, canary = results["speed"], results["power"], results["canary"]
    sub = heading + "#"
    prefix = "" if number is None else f"{number}. "
    lines = [f"{heading} {prefix}Empirical privacy auditing (`dpcl.audit`)", ""]
    if standalone:
        lines += [
            f"Measured by `.venv/bin/python benchmarks/bench_audit.py` on {platform.machine()}, "
            f"{os.cpu_count()} CPU(s), Python {platform.python_version()}, numpy {np.__version__}"
            f" ({time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}).",
            "",
        ]
    lines += [
        f"{sub} Auditor throughput (median wall-clock)",
        "",
        "`outputs` counts the mechanism outputs audited over both neighbouring inputs.",
        "",
        "| what | outputs | seconds | outputs / s |",
        "| --- | ---: | ---: | ---: |",
    ]
    lines += [f"| {name} | {n:.0e} | {t:.3f} | {n / t:,.0f} |" for name, n, t in speed]
    lines += [
        "",
        f"{sub} Power: lower bound reached, as a fraction of the true epsilon",
        "",
        "`trials` are per neighbouring input (half select the threshold, half bound); confidence 0.95; "
        "mean/min/max over seeds. `true eps` is the mechanism's exact epsilon at delta (Balle & Wang 2018, "
        "Thm 8, through `dpcl.accounting.gaussian`; Laplace: sensitivity / scale). `flagged` counts seeds whose "
        "lower bound exceeds the claim (verdict `violated`).",
        "",
        "| setting | claim | delta | true eps | trials | eps_hat mean (min-max) | fraction of true | flagged |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for r in power:
        lines.append(
            f"| {r['setting']} | {r['claim']:g} | {r['delta']:g} | {r['true_eps']:.3f} | {r['trials']:.0e} | "
            f"{r['mean']:.3f} ({r['min']:.3f}-{r['max']:.3f}) | {r['fraction']:.0%} | {r['flagged']}/{r['seeds']} |"
        )
    lines += [
        "",
        f"{sub} DP-SGD canary audit (`dpcl.audit.canary`)",
        "",
        "Logistic regression on 32 points (4 features + the canary's own axis), clip 1, lr 0.05, canary norm 4; "
        "half the shadow runs contain the canary (add/remove, unit = example). `loss`: black-box score (final "
        "model's loss on the canary); `gradient`: white-box likelihood-ratio score over all noisy updates. Each "
        "score is audited at confidence 0.975 (Bonferroni), the larger bound holds at 0.95. `accountant eps` is "
        "`dpcl.accounting.dpsgd.dpsgd_epsilon(..., accountant='auto')` for the same run.",
        "",
        "| z | q | steps | delta | shadow runs | accountant eps | eps_hat loss | eps_hat gradient | ratio | seconds |",
        "| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for r in canary:
        lines.append(
            f"| {r['z']:g} | {r['q']:g} | {r['steps']} | {r['delta']:g} | {r['runs']} | {r['eps']:.3f} ({r['accountant']}) | "
            f"{r['loss']:.3f} | {r['gradient']:.3f} | {r['ratio']:.0%} | {r['seconds']:.1f} |"
        )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="smoke run: fewer trials and seeds")
    args = parser.parse_args(argv)
    print(render(measure(args.quick)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
