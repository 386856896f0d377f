"""Re-measure every ratio of the README's benchmark table in one run, with the load average; write JSON.

Usage (from the repository root)::

    .venv/bin/python benchmarks/readme_ratios.py --out benchmarks/readme_ratios/run1.json
    .venv/bin/python benchmarks/readme_ratios.py --sections dpsgd cli --out /tmp/x.json   # some rows only
    .venv/bin/python benchmarks/readme_ratios.py --summarise benchmarks/readme_ratios/run*.json

Each section measures the ratios of one README row with the settings of the benchmark the row cites, in a
child process of its own (a fresh interpreter: no section warms or pollutes another's caches), and records
the 1-minute load average before and after it, its wall and CPU seconds. Sections:

* ``dpsgd``: ``bench_accounting.bench_dpsgd``: dpcl ``auto`` against dp-accounting's PLD (ε and time),
  prv-accountant's time against PLD's, opacus RDP's ε against PLD's.
* ``composition``: ``bench_accounting.bench_composition``: exact composition of 10⁶ heterogeneous Gaussians
  against dp-accounting PLD on 100 σ-groups (time), and 10³ events against dp-accounting RDP (time, ε).
* ``calibration``: 10⁶ vectorised calibrations (``bench_accounting.CALIBRATION_SETTING``) against
  dp-accounting's one call per token (CPU time, extrapolated from 200 calls), the CPU time of one
  ``scipy.special.log_ndtr`` pass over 10⁶ elements (single thread and the library's threads), and one
  scalar ``gaussian_sigma`` call against autodp's ``ana_gaussian_mech`` (CPU µs per call).
* ``auditor``: ``bench_audit``'s rows that the README's auditor row quotes, with fewer seeds
  (``AUDITOR_SEEDS``): sampler throughput (10⁶ trials per input, median of 5); ε lower bound / true ε of
  calibrated Gaussians at 10⁷ trials per input; false alarms of those and of the calibrated Laplace rows
  (seeded: not load dependent).
* ``one_run_audit``: ``bench_one_run_audit.measure(50000)``: white-box lower bound / certified ε, with the
  Gaussian view and without it (nonparametric), as the README's row quotes them (seeded).
* ``training``: ``bench_training.measure()``: examples/s of each method against cosine; PeCL's TDP step
  against a clean step.
* ``cli``: ``bench_cli_startup.measure(11)``: ``dpcl calibrate`` and ``dpcl --help`` against the imports.
* ``run_stages``: ``bench_run_stages``: accounting share of ``dpcl run`` per bundled DP-SGD config.
* ``grid``: ``bench_accounting_grid.run_cell``: ``auto`` against dp-accounting's single PLD at q = 0.001,
  z = 2 for every T of the grid, and against opacus RDP at q = 0.1, T = 10⁶, z = 0.6 (the cells the
  README's ratio names).
* ``bookkeeping``: ``bench_bookkeeping`` journal stage (300 tasks of the 10⁴-task config): bytes per
  release appending to the ledger's journal against rewriting it (deterministic).

``--summarise`` prints, for each ratio, the range over the given run files and the load averages seen.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(ROOT))


def _cpu_children_and_self() -> float:
    own, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime


# -- sections: each returns {ratio name: value} plus the numbers behind them ----------------------------
def section_dpsgd() -> dict[str, Any]:
    import bench_accounting as bench

    m = {x.name: x for x in bench.bench_dpsgd(repeats=3)}
    pld, auto = m["dp-accounting PLD"], m["dpcl auto"]
    return {
        "ratios": {
            "auto ε / PLD ε": auto.value / pld.value,
            "auto time / PLD time": auto.seconds / pld.seconds,
            "prv-accountant time / PLD time": m["prv-accountant"].seconds / pld.seconds,
            "opacus RDP ε / PLD ε": m["opacus RDP"].value / pld.value,
        },
        "seconds": {k: v.seconds for k, v in m.items()},
        "epsilon": {k: v.value for k, v in m.items()},
    }


def section_composition() -> dict[str, Any]:
    import bench_accounting as bench

    c = bench.bench_composition(
        repeats=5, pld_sizes=(10,), rdp_sizes=(1000,), prv_sizes=(10,), exact_sizes=(1000,)
    )
    exact, grouped = c["exact"], c["grouped_pld"]
    rdp = next(r for r in c["curves"]["dp-accounting RDP"] if r["n"] == 1000)
    ex = next(r for r in c["curves"]["dpcl exact"] if r["n"] == 1000)
    return {
        "ratios": {
            "10⁶ Gaussians: grouped PLD time / exact time": grouped.seconds / exact.seconds,
            "10³ Gaussians: RDP time / exact time": rdp["seconds"] / ex["seconds"],
            "10³ Gaussians: RDP ε / exact ε": rdp["epsilon"] / ex["epsilon"],
        },
        "seconds": {"exact 1e6": exact.seconds, "grouped PLD 1e6": grouped.seconds, "exact 1e3": ex["seconds"],
                    "RDP 1e3": rdp["seconds"]},
    }


def _cpu_time(fn: Callable[[], Any], repeats: int) -> float:
    best = float("inf")
    for _ in range(repeats):
        start = time.process_time()
        fn()
        best = min(best, time.process_time() - start)
    return best


def section_calibration() -> dict[str, Any]:
    import numpy as np
    from scipy.special import log_ndtr

    import bench_accounting as bench
    import bench_calibration_stream as stream
    import dpcl.accounting.gaussian as gauss

    s = bench.CALIBRATION_SETTING
    budgets = np.random.default_rng(s["seed"]).uniform(s["epsilon_low"], s["epsilon_high"], s["count"])
    out = np.empty_like(budgets)
    gauss.gaussian_sigma(budgets[:1000], s["delta"])  # warm-up
    threads = gauss._WORKERS
    cpu = _cpu_time(lambda: gauss.gaussian_sigma(budgets, s["delta"], out=out), 3)
    start = time.perf_counter()
    gauss.gaussian_sigma(budgets, s["delta"], out=out)
    wall = time.perf_counter() - start
    gauss._WORKERS = 1
    cpu_one_thread = _cpu_time(lambda: gauss.gaussian_sigma(budgets, s["delta"], out=out), 3)
    start = time.perf_counter()
    gauss.gaussian_sigma(budgets, s["delta"], out=out)
    wall_one_thread = time.perf_counter() - start
    gauss._WORKERS = threads
    argument = -3.0 - budgets / 2.0
    log_ndtr_cpu = _cpu_time(lambda: log_ndtr(argument), 5)
    start = time.perf_counter()
    log_ndtr(argument)
    log_ndtr_wall = time.perf_counter() - start
    peers = stream._peers()
    dpa = peers["dp-accounting GaussianPrivacyLoss.from_privacy_guarantee"]
    sample = [float(e) for e in budgets[:200]]
    dpa_cpu = _cpu_time(lambda: [dpa(e) for e in sample], 1) / len(sample)  # type: ignore[operator]
    scalar = {r["name"]: r for r in stream.scalar_calls(100, repeats=5)}
    ours = scalar["dpcl gaussian_sigma (scalar)"]
    autodp = scalar.get("autodp ana_gaussian_mech", {})
    ratios = {
        "10⁶ calibrations: dp-accounting per-token CPU (extrapolated) / dpcl CPU": dpa_cpu * s["count"] / cpu,
        "10⁶ calibrations: dpcl CPU / one log_ndtr pass CPU (library threads)": cpu / log_ndtr_cpu,
        "10⁶ calibrations: dpcl CPU / one log_ndtr pass CPU (one thread)": cpu_one_thread / log_ndtr_cpu,
        "10⁶ calibrations: dpcl wall / one log_ndtr pass wall (library threads)": wall / log_ndtr_wall,
        "10⁶ calibrations: dpcl wall / one log_ndtr pass wall (one thread)": wall_one_thread / log_ndtr_wall,
    }
    if "cpu_us_per_call" in autodp:
        ratios["scalar call: dpcl CPU / autodp CPU"] = ours["cpu_us_per_call"] / autodp["cpu_us_per_call"]
    return {
        "ratios": ratios,
        "seconds": {"dpcl 1e6 cpu": cpu, "dpcl 1e6 cpu one thread": cpu_one_thread, "dpcl 1e6 wall": wall,
                    "dpcl 1e6 wall one thread": wall_one_thread,
                    "log_ndtr 1e6 cpu": log_ndtr_cpu, "log_ndtr 1e6 wall": log_ndtr_wall,
                    "dp-accounting per call cpu": dpa_cpu},
        "scalar": {k: {f: v.get(f) for f in ("cpu_us_per_call", "us_per_call", "over_delta", "skipped")} for k, v in scalar.items()},
        "threads": threads,
    }


#: The auditor section's size: the README row's ratios only (calibrated Gaussians at 10^7 trials per input, the
#: calibrated Laplace rows at 10^6, AUDITOR_SEEDS seeds each), not ``bench_audit``'s whole run (10 seeds, the
#: 10^6-trial Gaussian rows, the mis-calibrated rows and 20,000-run canary audits: 2.9 minutes on the idle machine,
#: which at a load average of 14 on 2 cores ran past the section's time limit). 44 to 104 s in the README's runs.
AUDITOR_SEEDS = 3


def section_auditor() -> dict[str, Any]:
    import bench_audit
    from dpcl.audit.blackbox import audit_sampler
    from dpcl.audit.mechanisms import GaussianMechanism, LaplaceMechanism

    sample_0 = lambda n, rng: rng.normal(0.0, 1.0, n)  # noqa: E731
    sample_1 = lambda n, rng: rng.normal(1.0, 1.0, n)  # noqa: E731
    seconds = bench_audit._median_time(lambda: audit_sampler(sample_0, sample_1, 10**6, 1e-5), 5)
    rows = []
    for eps, delta in ((0.5, 1e-5), (1.0, 1e-5), (2.0, 1e-5), (4.0, 1e-5), (1.0, 1e-2)):
        m = GaussianMechanism.calibrated(eps, delta)
        rows.append(bench_audit._power_row(f"Gaussian, analytic sigma for ({eps:g}, {delta:g})", m, eps, delta,
                                           m.epsilon(delta), 10**7, AUDITOR_SEEDS))
    for eps in (0.5, 1.0, 3.0):
        m = LaplaceMechanism.calibrated(eps)
        rows.append(bench_audit._power_row(f"Laplace, scale 1/{eps:g} (pure eps, audited at delta = 0)", m, eps, 0.0,
                                           eps, 10**6, AUDITOR_SEEDS))
    gaussian = [r["fraction"] for r in rows if r["setting"].startswith("Gaussian")]
    flagged, runs = sum(r["flagged"] for r in rows), sum(r["seeds"] for r in rows)
    return {
        "ratios": {
            "auditor: ε lower bound / true ε at 10⁷ trials (min)": min(gaussian),
            "auditor: ε lower bound / true ε at 10⁷ trials (max)": max(gaussian),
            "auditor: false alarms / runs": flagged / runs,
        },
        "sampler_outputs_per_second": 2 * 10**6 / seconds,
        "false_alarms": [flagged, runs],
        "power": rows,
    }


def section_one_run_audit() -> dict[str, Any]:
    import bench_one_run_audit

    rows = bench_one_run_audit.measure(50_000)
    ratios = {}
    for r in rows:  # the README row quotes both: the Gaussian view, and the bound that assumes nothing of the scores
        ratios[f"one-run audit: white-box lower bound (Gaussian view) / certified ε at ε {r['target']:g}"] = (
            r["white_view"] / r["certified"])
        ratios[f"one-run audit: white-box lower bound (nonparametric) / certified ε at ε {r['target']:g}"] = (
            r["white_np"] / r["certified"])
    return {
        "ratios": ratios,
        "seconds": {f"ε {r['target']:g}": r["seconds"] for r in rows},
    }


def section_training() -> dict[str, Any]:
    import bench_training

    t = bench_training.summary(bench_training.measure())
    eps = t["examples_per_second"]
    ratios = {f"training: {m} examples/s / cosine": v / eps["cosine"] for m, v in eps.items() if m != "cosine"}
    ratios.update({
        "PeCL TDP step / clean step (amortised)": t["tdp_amortised_ratio"],
        "PeCL noise-only step / clean step": t["tdp_noise_ratio"],
        "PeCL scoring + noise step / clean step": t["tdp_scoring_noise_ratio"],
    })
    return {"ratios": ratios, "examples_per_second": eps, "not_run": t["not_run"]}


def section_cli() -> dict[str, Any]:
    import bench_cli_startup

    medians = bench_cli_startup.measure(11)
    names = list(medians)
    base = next(n for n in names if "import" in n or "python" in n)
    return {
        "ratios": {f"CLI: {n} / {base}": medians[n] / medians[base] for n in names if n != base},
        "seconds": medians,
    }


def section_run_stages() -> dict[str, Any]:
    import bench_run_stages

    rows = []
    with tempfile.TemporaryDirectory(prefix="dpcl-run-stages-") as tmp:
        for config in bench_run_stages.DPSGD_CONFIGS:
            rows.append(bench_run_stages.profile_run(config, Path(tmp), 900.0))
    return {
        "ratios": {f"accounting share of dpcl run: {r['config']}": r["share"] for r in rows if "share" in r},
        "errors": {r["config"]: r["error"] for r in rows if "error" in r},
    }


def section_grid() -> dict[str, Any]:
    import bench_accounting_grid as grid

    cells: dict[str, Any] = {}
    ratios: dict[str, float] = {}
    for steps in (10**2, 10**3, 10**4, 10**5, 10**6):
        auto = grid.run_cell("dpcl auto", 0.001, steps, 2.0, 600.0, 4.0)
        pld = grid.run_cell("dp-accounting PLD 1e-4", 0.001, steps, 2.0, 600.0, 4.0)
        cells[f"q=0.001 T={steps} z=2"] = {"auto": auto, "dp-accounting PLD 1e-4": pld}
        if "seconds" in auto and "seconds" in pld:
            ratios[f"grid q=0.001 z=2 T={steps}: auto time / dp-accounting PLD time"] = auto["seconds"] / pld["seconds"]
    auto = grid.run_cell("dpcl auto", 0.1, 10**6, 0.6, 600.0, 4.0)
    rdp = grid.run_cell("opacus RDP", 0.1, 10**6, 0.6, 600.0, 4.0)
    cells["q=0.1 T=1e6 z=0.6"] = {"auto": auto, "opacus RDP": rdp}
    if "seconds" in auto and "seconds" in rdp:
        ratios["grid q=0.1 T=1e6 z=0.6: auto time / opacus RDP time"] = auto["seconds"] / rdp["seconds"]
    return {"ratios": ratios, "cells": cells}


def section_bookkeeping() -> dict[str, Any]:
    import bench_bookkeeping as book

    with tempfile.TemporaryDirectory(prefix="dpcl-bookkeeping-") as tmp:
        workdir = Path(tmp)
        (workdir / "config.toml").write_text(book.config_text(10_000))
        journal = {mode: book._stage(workdir, "journal", "300", mode) for mode in ("append", "rewrite")}
    append, rewrite = journal["append"], journal["rewrite"]
    ratios = {}
    if append.get("tail_bytes_per_release") and rewrite.get("tail_bytes_per_release"):
        ratios["journal bytes per release: append / rewrite"] = (
            append["tail_bytes_per_release"] / rewrite["tail_bytes_per_release"])
    return {"ratios": ratios, "journal": journal}


SECTIONS: dict[str, Callable[[], dict[str, Any]]] = {
    "dpsgd": section_dpsgd,
    "composition": section_composition,
    "calibration": section_calibration,
    "cli": section_cli,
    "grid": section_grid,
    "training": section_training,
    "run_stages": section_run_stages,
    "bookkeeping": section_bookkeeping,
    "auditor": section_auditor,
    "one_run_audit": section_one_run_audit,
}


def run_section(name: str, timeout: float) -> dict[str, Any]:
    """One section in a fresh interpreter; its JSON, load average, wall and CPU seconds."""
    load_before = os.getloadavg()
    start, cpu = time.perf_counter(), _cpu_children_and_self()
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    try:
        done = subprocess.run([sys.executable, str(Path(__file__).resolve()), "--child", name], cwd=ROOT, env=env,
                              capture_output=True, text=True, timeout=timeout)
        lines = done.stdout.strip().splitlines()
        if done.returncode == 0 and lines:
            result = json.loads(lines[-1])
        else:
            result = {"error": f"exit {done.returncode}: {(done.stderr.strip().splitlines() or ['no output'])[-1][:300]}"}
    except subprocess.TimeoutExpired:
        result = {"error": f"did not finish within {timeout:g} s"}
    result.update({
        "load_before": load_before, "load_after": os.getloadavg(),
        "wall_seconds": time.perf_counter() - start, "cpu_seconds": _cpu_children_and_self() - cpu,
    })
    return result


def _commit() -> str:
    """The measured code's commit, with "+ uncommitted changes" when the library or a benchmark script differs from it."""
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True,
                              check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no", "--", "dpcl", "benchmarks/*.py"],
                               cwd=ROOT, capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown (no git)"
    return head + (" + uncommitted changes" if dirty else "")


def fmt(value: float, precise: bool = False) -> str:
    """A ratio as the README writes it: thousands separators from 100, 2 decimals below (4 for ``precise``
    ratios near 1, such as one epsilon over another)."""
    if value >= 100:
        return f"{value:,.0f}"
    if value >= 10:
        return f"{value:.1f}"
    if precise and 0.95 <= value < 1.2:
        return f"{value:.4f}"
    if value >= 0.1:
        return f"{value:.2f}"
    return f"{value:.2g}"


def summarise(paths: list[Path]) -> str:
    """Markdown: each ratio's range over the runs, with the load averages seen while its section ran."""
    runs = [json.loads(p.read_text()) for p in paths]
    names: dict[str, list[float]] = {}
    loads: dict[str, list[float]] = {}
    errors: list[str] = []
    for run in runs:
        for section, result in run["sections"].items():
            loads.setdefault(section, []).extend([result["load_before"][0], result["load_after"][0]])
            if "error" in result:
                errors.append(f"{run['started']}, {section}: {result['error']}")
            for ratio, value in result.get("ratios", {}).items():
                names.setdefault(f"{section} | {ratio}", []).append(value)
    every = [x for v in loads.values() for x in v]
    started = [r["started"] + (f" (commit {r['commit']})" if "commit" in r else "") for r in runs]
    lines = [
        "# The README's benchmark ratios, re-measured",
        "",
        f"`benchmarks/readme_ratios.py`, {len(runs)} runs started {', '.join(started)}, on "
        f"{runs[0]['cpus']} CPUs shared with other work: load average (1 min) {min(every):.1f} to {max(every):.1f} "
        "during the sections, so wall-clock ratios between libraries are only as steady as the load; each "
        "section's load range is in its row. "
        + ("Not every section ran in every run (the runs column counts those that finished); sections that ran "
           "past their time limit are listed at the end." if errors else "Every section finished in every run."),
        "",
        "| section | ratio | min | max | runs | load average (1 min) |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for key, values in names.items():
        section, ratio = key.split(" | ", 1)
        lo, hi = min(loads[section]), max(loads[section])
        lines.append(f"| {section} | {ratio} | {fmt(min(values), 'ε' in ratio)} | {fmt(max(values), 'ε' in ratio)} | {len(values)} | "
                     f"{lo:.1f} to {hi:.1f} |")
    if errors:
        lines += ["", "Sections that did not finish:", ""] + [f"* {e}" for e in errors]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--sections", nargs="+", choices=list(SECTIONS), default=list(SECTIONS))
    parser.add_argument("--out", type=Path, help="write the run's JSON here (atomically)")
    parser.add_argument("--timeout", type=float, default=900.0, help="seconds per section")
    parser.add_argument("--summarise", nargs="+", type=Path, metavar="RUN_JSON", help="ranges over earlier runs")
    parser.add_argument("--write", type=Path, help="with --summarise: write the markdown here")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        print(json.dumps(SECTIONS[args.child](), default=str))
        return 0
    if args.summarise:
        text = summarise(args.summarise)
        if args.write is not None:
            from dpcl._io.atomic_io import write_text_atomic

            write_text_atomic(args.write, text)
        print(text)
        return 0
    run: dict[str, Any] = {"started": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "cpus": os.cpu_count(),
                           "commit": _commit(), "sections": {}}
    for name in args.sections:
        run["sections"][name] = run_section(name, args.timeout)
        r = run["sections"][name]
        print(f"{name}: {r.get('error') or r.get('ratios')} (load {r['load_before'][0]:.1f}-{r['load_after'][0]:.1f}, "
              f"{r['wall_seconds']:.0f} s)", file=sys.stderr, flush=True)
        if args.out is not None:  # written after each section, so a stopped run keeps what it measured
            from dpcl._io.atomic_io import write_text_atomic

            args.out.parent.mkdir(parents=True, exist_ok=True)
            write_text_atomic(args.out, json.dumps(run, indent=1, default=str) + "\n")
    if args.out is None:
        print(json.dumps(run, indent=1, default=str))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
