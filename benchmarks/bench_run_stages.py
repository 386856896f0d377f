"""Where the time of ``dpcl run`` goes: accounting (plan, audit, ledger, certificates) vs training.

Usage (from the repository root)::

    .venv/bin/python benchmarks/bench_run_stages.py                    # every bundled config -> RUN_STAGES.md
    .venv/bin/python benchmarks/bench_run_stages.py --configs naive    # one config, report printed only

Each config runs ``python -m cProfile -m dpcl run CONFIG --out TMP --quiet`` in a fresh process (so the
in-process memo of epsilons and calibrations starts empty, as for a user), and its profile is split by
module. A module's *inclusive* time is the cumulative time of the calls that enter it from outside
(pstats' per-caller cumulative times at the boundary), so what accounting spends inside numpy, scipy or
its libraries counts as accounting:

* accounting: ``dpcl.accounting``, ``dpcl.guarantees`` audit_config / ledger / certificates / schedules /
  cross_check / lifelong, ``dp_accounting``, ``prv_accountant``;
* training: ``dpcl.methods`` (model fitting, entered from the runner), minus any accounting inside it;
* the rest: imports (module bodies, also those of the modules above), data loading, checkpoints, signing,
  metrics.

The goal (issue 15) is accounting <= 20 % of the run's time for every bundled DP-SGD config. The share is
measured under cProfile, whose per-call overhead weighs more on Python-heavy code (dp-accounting's PLD
construction is a Python loop) than on torch's kernels: the share without the profiler is lower.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import os
import platform
import pstats
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(ROOT))

REPORT = HERE / "RUN_STAGES.md"
#: Bundled configs whose methods train with DP-SGD (l2dpml: Laplace functional mechanism, run when asked).
DPSGD_CONFIGS = ("naive", "peft_ensemble", "non_cl", "pecl", "cosine")
OPTIONAL_CONFIGS = ("l2dpml_split_digits",)
GOAL_SHARE = 0.20

_ACCOUNTING_PARTS = (
    "/dpcl/accounting/",
    "/dpcl/audit_config.py",
    "/dpcl/guarantees/ledger.py",
    "/dpcl/guarantees/certificates.py",
    "/dpcl/guarantees/schedules.py",
    "/dpcl/guarantees/cross_check.py",
    "/dpcl/guarantees/lifelong.py",
    "/dp_accounting/",
    "/prv_accountant/",
)
_TRAINING_PARTS = ("/dpcl/methods/",)
#: Training is counted where the run hands over to a method (torch calls back into dpcl.methods from its
#: modules and hooks; counting those re-entries would count the same time twice).
_RUNNER_PARTS = ("/dpcl/runner/", "/dpcl/cli/", "/dpcl/certifier.py")


def _in(path: str, parts: tuple[str, ...]) -> bool:
    return any(p in path for p in parts)


def _counted(func: tuple[str, int, str], parts: tuple[str, ...]) -> bool:
    """A function of the modules ``parts``; module bodies (imports, nested in one another) count as "other"."""
    return func[2] != "<module>" and _in(func[0], parts)


def inclusive_seconds(stats: pstats.Stats, parts: tuple[str, ...], callers_in: tuple[str, ...] | None = None) -> float:
    """Cumulative time of the calls that enter the modules matching ``parts`` from outside them (from the
    modules ``callers_in`` only, when given)."""
    total = 0.0
    for func, (_, _, _, _, callers) in stats.stats.items():  # type: ignore[attr-defined]
        if not _counted(func, parts):
            continue
        for caller, timing in callers.items():
            if not _in(caller[0], parts) and (callers_in is None or _in(caller[0], callers_in)):
                total += timing[3]
    return total


def nested_seconds(stats: pstats.Stats, outer: tuple[str, ...], inner: tuple[str, ...]) -> float:
    """Cumulative time of calls into ``inner`` made directly from ``outer`` (accounting inside training)."""
    total = 0.0
    for func, (_, _, _, _, callers) in stats.stats.items():  # type: ignore[attr-defined]
        if not _counted(func, inner):
            continue
        for caller, timing in callers.items():
            if _in(caller[0], outer) and not _in(caller[0], inner):
                total += timing[3]
    return total


def profile_run(config: str, workdir: Path, timeout: float) -> dict[str, float | str]:
    """Run one bundled config under cProfile in a fresh process; seconds per category.

    The profile and the measured wall time stay in ``workdir`` (``CONFIG.prof``, ``CONFIG.wall.json``), so
    that the split can be recomputed from them (``--from-profiles``).
    """
    path = ROOT / "dpcl" / "configs" / f"{config}.toml"
    prof = workdir / f"{config}.prof"
    out = workdir / f"{config}_run"
    cmd = [sys.executable, "-m", "cProfile", "-o", str(prof), "-m", "dpcl", "run", str(path), "--out", str(out),
           "--quiet"]
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    start = time.perf_counter()
    done = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)
    wall = time.perf_counter() - start
    if done.returncode != 0:
        return {"config": config, "error": (done.stderr.strip().splitlines() or ["exit %d" % done.returncode])[-1]}
    (workdir / f"{config}.wall.json").write_text(json.dumps({"wall": wall}))
    return split_profile(config, prof, wall)


def split_profile(config: str, prof: Path, wall: float) -> dict[str, float | str]:
    """Seconds per category of one saved profile (see the module docstring)."""
    stats = pstats.Stats(str(prof))
    profiled = max(v[3] for v in stats.stats.values())  # type: ignore[attr-defined]
    accounting = inclusive_seconds(stats, _ACCOUNTING_PARTS)
    training = (inclusive_seconds(stats, _TRAINING_PARTS, _RUNNER_PARTS)
                - nested_seconds(stats, _TRAINING_PARTS, _ACCOUNTING_PARTS))
    return {
        "config": config, "wall": wall, "profiled": profiled, "accounting": accounting, "training": training,
        "other": max(profiled - accounting - training, 0.0), "share": accounting / profiled,
    }


def load_average() -> str:
    try:
        return ", ".join(f"{x:.1f}" for x in os.getloadavg())
    except OSError:  # pragma: no cover
        return "unknown"


def report(rows: list[dict[str, float | str]], load_before: str, load_after: str) -> str:
    lines = [
        "# Where `dpcl run` spends its time",
        "",
        f"Measured by `benchmarks/bench_run_stages.py` on {_dt.date.today().isoformat()}, {platform.machine()} "
        f"with {os.cpu_count()} CPU(s), Python {platform.python_version()}; load average (1, 5, 15 min) "
        + (f"{load_before} before and {load_after} after" if load_before == load_after == "" or "," in load_before
           else "not recorded with the saved profiles this report was recomputed from")
        + " (the machine is shared: other processes slow every stage, so compare shares rather than seconds).",
        "",
        "Each bundled config runs `dpcl run CONFIG --quiet` under cProfile in a fresh process. Accounting is the "
        "inclusive time in `dpcl.accounting`, the audit, ledger, certificates and plans of `dpcl.guarantees`, "
        "dp-accounting and prv-accountant; training is the inclusive time in `dpcl.methods` less the accounting it "
        "calls; the rest is imports, data, checkpoints, signing and metrics. cProfile's overhead weighs more on "
        "Python-heavy accounting than on torch kernels, so these shares are upper estimates.",
        "",
        "| config | wall s | profiled s | training s | accounting s | other s | accounting share | goal <= 20 % |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in rows:
        if "error" in r:
            lines.append(f"| {r['config']} | failed: {r['error']} | | | | | | |")
            continue
        met = "met" if float(r["share"]) <= GOAL_SHARE else "not met"
        lines.append(
            f"| {r['config']} | {r['wall']:.1f} | {r['profiled']:.1f} | {r['training']:.1f} | {r['accounting']:.1f} | "
            f"{r['other']:.1f} | {100 * float(r['share']):.1f} % | {met} |"
        )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--configs", nargs="+", default=list(DPSGD_CONFIGS),
                        choices=list(DPSGD_CONFIGS + OPTIONAL_CONFIGS), help="bundled configs to run")
    parser.add_argument("--timeout", type=float, default=900.0, help="seconds per run")
    parser.add_argument("--write", action="store_true", help=f"write {REPORT.name} (default when all DP-SGD configs run)")
    parser.add_argument("--keep", type=Path, help="keep the profiles and wall times in this folder")
    parser.add_argument("--from-profiles", type=Path, metavar="DIR",
                        help="recompute the split from the profiles a --keep run saved (runs nothing)")
    args = parser.parse_args(argv)
    load_before = load_average()
    rows = []
    if args.from_profiles is not None:
        for config in args.configs:
            wall = json.loads((args.from_profiles / f"{config}.wall.json").read_text())["wall"]
            rows.append(split_profile(config, args.from_profiles / f"{config}.prof", wall))
        load_before = load_after = "not recorded"
    else:
        with tempfile.TemporaryDirectory(prefix="dpcl-stages-") as tmp:
            workdir = args.keep if args.keep is not None else Path(tmp)
            workdir.mkdir(parents=True, exist_ok=True)
            for config in args.configs:
                row = profile_run(config, workdir, args.timeout)
                rows.append(row)
                print({k: (round(v, 3) if isinstance(v, float) else v) for k, v in row.items()}, flush=True)
        load_after = load_average()
    text = report(rows, load_before, load_after)
    if args.write or set(DPSGD_CONFIGS) <= set(args.configs):
        from dpcl._io.atomic_io import write_text_atomic

        write_text_atomic(REPORT, text)
        print(f"wrote {REPORT.relative_to(ROOT)}")
    else:
        print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
