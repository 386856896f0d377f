"""DP-SGD accounting over a grid: is dpcl's ``auto`` the tightest sound bound, and how fast?

For every (q, T, z) of the grid (delta = 1e-5) this measures epsilon and wall time of

* dpcl: ``auto`` and each named accountant (``pld``, ``prv``, ``rdp``);
* dp-accounting's PLD (pessimistic, interval 1e-4) and RDP accountants;
* prv-accountant's upper bound (``eps_error`` 0.01, ``delta_error`` delta/1000, as opacus uses);
* opacus' RDP and PRV accountants (opacus' PRV reports prv-accountant's upper bound);

and, for calibration, the noise multiplier ``dpsgd_noise_multiplier`` (``auto``) returns for the
target epsilon = dp-accounting's fine PLD epsilon at z: the smallest multiplier meeting that target
under fine PLD is z itself, so z_auto / z - 1 is how far ``auto`` is from it.

The calls of one point run in one fresh subprocess (each warmed up on a one-step run before the
timed call) under a per-call wall-clock timeout (SIGALRM) and a 4 GB address-space limit; a call
that runs out of either is recorded as such. All the compared accountants report upper bounds; the "tightest sound peer" of a
point is the smallest epsilon among the peers (not dpcl) that finished there.

    .venv/bin/python benchmarks/bench_accounting_grid.py            # full grid -> benchmarks/GRID.md
    .venv/bin/python benchmarks/bench_accounting_grid.py --quick    # 4 points, printed only

Times are single runs; on a machine shared with other jobs they are slower and noisier (the report
states the load average at start and end).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
DELTA = 1e-5
GRID_Q = (1e-3, 1e-2, 0.1)
GRID_T = (100, 1_000, 10_000, 100_000, 1_000_000)
GRID_Z = (0.6, 1.0, 2.0)
QUICK_POINTS = ((1e-3, 100_000, 1.0), (1e-2, 10_000, 1.0), (0.1, 1_000, 2.0), (0.1, 100_000, 1.0))
DPCL_METHODS = ("dpcl auto", "dpcl pld", "dpcl prv", "dpcl rdp")
PEER_METHODS = ("dp-accounting PLD 1e-4", "dp-accounting RDP", "prv-accountant", "opacus RDP", "opacus PRV")
MEMORY_LIMIT_BYTES = 4 * 1024**3


# -- one call, in a worker process ----------------------------------------------------------------


def _epsilon(method: str, q: float, steps: int, z: float) -> float:
    if method == "dpcl auto calibration":
        from dpcl.accounting.dpsgd import dpsgd_noise_multiplier

        return float(dpsgd_noise_multiplier(z, DELTA, q, steps).noise_multiplier)  # z is the target epsilon here
    if method.startswith("dpcl "):
        from dpcl.accounting.dpsgd import dpsgd_epsilon

        return float(dpsgd_epsilon(z, q, steps, DELTA, accountant=method.split()[1]).epsilon)
    if method.startswith("dp-accounting"):
        import dp_accounting
        from dp_accounting.pld import pld_privacy_accountant
        from dp_accounting.rdp import rdp_privacy_accountant

        event = dp_accounting.SelfComposedDpEvent(dp_accounting.PoissonSampledDpEvent(q, dp_accounting.GaussianDpEvent(z)), steps)
        if "PLD" in method:
            return float(pld_privacy_accountant.PLDAccountant(value_discretization_interval=1e-4).compose(event).get_epsilon(DELTA))
        return float(rdp_privacy_accountant.RdpAccountant().compose(event).get_epsilon(DELTA))
    if method == "prv-accountant":
        from prv_accountant import PRVAccountant
        from prv_accountant.privacy_random_variables import PoissonSubsampledGaussianMechanism

        accountant = PRVAccountant(
            prvs=PoissonSubsampledGaussianMechanism(noise_multiplier=z, sampling_probability=q),
            max_self_compositions=steps, eps_error=0.01, delta_error=DELTA / 1000,
        )
        return float(accountant.compute_epsilon(DELTA, [steps])[2])
    if method.startswith("opacus"):
        from opacus.accountants import PRVAccountant as OpacusPRV
        from opacus.accountants import RDPAccountant as OpacusRDP

        accountant = OpacusRDP() if method.endswith("RDP") else OpacusPRV()
        accountant.history = [(z, q, steps)]
        return float(accountant.get_epsilon(DELTA))
    raise ValueError(method)


class _CallTimeout(Exception):
    pass


def _worker(methods: list[str], q: float, steps: int, z: float, timeout: float) -> None:
    """Run ``methods`` at one point in this process, each under ``timeout`` s (SIGALRM), one RESULT line each."""
    import logging
    import resource
    import signal
    import warnings

    resource.setrlimit(resource.RLIMIT_AS, (MEMORY_LIMIT_BYTES, MEMORY_LIMIT_BYTES))
    warnings.simplefilter("ignore")
    logging.getLogger("absl").setLevel(logging.ERROR)
    logging.getLogger().setLevel(logging.ERROR)

    def on_alarm(signum: int, frame: Any) -> None:
        raise _CallTimeout()

    signal.signal(signal.SIGALRM, on_alarm)
    for method in methods:
        out: dict[str, Any]
        name, _, target = method.partition("@")
        try:
            if name == "dpcl auto calibration":
                _epsilon("dpcl auto", q, 1, 1.0)  # imports warmed up
            else:
                _epsilon(name, q, 1, z)
            signal.alarm(int(timeout))
            start = time.perf_counter()
            value = _epsilon(name, q, steps, float(target) if target else z)
            seconds = time.perf_counter() - start
            signal.alarm(0)
            out = {"value": value, "seconds": seconds}
        except _CallTimeout:
            out = {"error": f"timed out (> {timeout:g} s)"}
        except MemoryError:
            signal.alarm(0)
            out = {"error": "out of memory (4 GB limit)"}
        except Exception as exc:  # noqa: BLE001 - recorded, not hidden
            signal.alarm(0)
            out = {"error": f"{type(exc).__name__}: {str(exc).splitlines()[0][:160] if str(exc) else ''}"}
        print("RESULT " + json.dumps({"method": name, **out}), flush=True)


def run_calls(methods: list[str], q: float, steps: int, z: float, timeout: float) -> dict[str, dict[str, Any]]:
    """Run ``methods`` at one point in one fresh process; returns method -> value/seconds or error."""
    cmd = [sys.executable, str(Path(__file__).resolve()), "--worker", json.dumps([methods, q, steps, z, timeout])]
    results: dict[str, dict[str, Any]] = {}
    try:
        proc = subprocess.run(
            cmd, capture_output=True, text=True, timeout=timeout * len(methods) + 120, cwd=HERE.parent,
        )
        stdout, tail = proc.stdout, f"exit {proc.returncode}: " + (proc.stderr.strip().splitlines() or ["no output"])[-1][:160]
    except subprocess.TimeoutExpired as exc:
        stdout = exc.stdout.decode() if isinstance(exc.stdout, bytes) else (exc.stdout or "")
        tail = "timed out"
    for line in stdout.splitlines():
        if line.startswith("RESULT "):
            result = json.loads(line[7:])
            results[result.pop("method")] = result
    for method in methods:
        results.setdefault(method.partition("@")[0], {"error": tail})
    return results


# -- the grid -------------------------------------------------------------------------------------


def measure_point(q: float, steps: int, z: float, timeout: float, calibrate: bool) -> dict[str, Any]:
    row: dict[str, Any] = {"q": q, "T": steps, "z": z}
    row.update(run_calls([*DPCL_METHODS, *PEER_METHODS], q, steps, z, timeout))
    fine = row["dp-accounting PLD 1e-4"]
    if calibrate and "value" in fine:
        cal = run_calls([f"dpcl auto calibration@{fine['value']!r}"], q, steps, z, timeout)["dpcl auto calibration"]
        if "value" in cal:
            cal["ratio"] = cal["value"] / z
        row["calibration"] = cal
    return row


def summarise(rows: list[dict[str, Any]]) -> dict[str, Any]:
    worst_eps = (0.0, None)
    worst_time = (0.0, None)
    worst_cal = (0.0, None)
    missing = []
    for row in rows:
        auto = row["dpcl auto"]
        peers = [(m, row[m]) for m in PEER_METHODS if "value" in row[m]]
        if "value" not in auto:
            missing.append(row)
            continue
        if peers:
            name, best = min(peers, key=lambda p: p[1]["value"])
            ratio = auto["value"] / best["value"]
            row["tightest peer"] = name
            row["auto / tightest"] = ratio
            row["time ratio"] = auto["seconds"] / best["seconds"]
            if ratio > worst_eps[0]:
                worst_eps = (ratio, row)
            if row["time ratio"] > worst_time[0]:
                worst_time = (row["time ratio"], row)
        cal = row.get("calibration", {})
        if "ratio" in cal and cal["ratio"] > worst_cal[0]:
            worst_cal = (cal["ratio"], row)
    return {"worst_eps": worst_eps, "worst_time": worst_time, "worst_cal": worst_cal, "auto_failed": missing}


def machine_info() -> dict[str, str]:
    import importlib.metadata as md

    info = {
        "cpu": platform.processor() or platform.machine(),
        "cores": str(os.cpu_count()),
        "python": platform.python_version(),
        "os": platform.platform(),
    }
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                info["cpu"] = line.split(":", 1)[1].strip()
                break
        mem = next(x for x in Path("/proc/meminfo").read_text().splitlines() if x.startswith("MemTotal"))
        info["memory"] = f"{int(mem.split()[1]) / 1024**2:.1f} GiB"
    except (OSError, StopIteration):
        pass
    for pkg in ("dp-accounting", "prv-accountant", "opacus", "numpy", "scipy"):
        try:
            info[pkg] = md.version(pkg)
        except md.PackageNotFoundError:
            info[pkg] = "not installed"
    return info


def _cell(result: dict[str, Any]) -> str:
    if "value" in result:
        return f"{result['value']:.6g} ({result['seconds']:.2f} s)"
    return result["error"].replace("|", "/")


def report(rows: list[dict[str, Any]], info: dict[str, str], load: tuple[str, str], wall: float, timeout: float) -> str:
    s = summarise(rows)
    lines = ["# DP-SGD accounting over a grid (`benchmarks/bench_accounting_grid.py`)", ""]
    lines += [
        f"delta = {DELTA:g}; q in {list(GRID_Q)}, T in {list(GRID_T)}, z in {list(GRID_Z)}. Each cell: epsilon "
        f"(wall time of the call, one run after a one-step warm-up; the calls of a point share one fresh process). Every call is capped at {timeout:g} s "
        f"and {MEMORY_LIMIT_BYTES / 1024**3:g} GB of address space; a call that hit a cap says so.",
        "",
        "**Measured on a 2-core machine shared with other engineers' jobs (loaded): times are slower and noisier "
        "than on an idle machine; the epsilons are unaffected.**",
        "",
        "| machine | |",
        "| --- | --- |",
    ]
    lines += [f"| {k} | {v} |" for k, v in info.items()]
    lines += [f"| load average at start / end | {load[0]} / {load[1]} |", f"| run time | {wall / 60:.1f} min |", ""]
    lines += ["## Summary", ""]
    ratio, row = s["worst_eps"]
    if row is not None:
        lines.append(
            f"* worst `auto` / tightest sound peer: **{ratio:.4f}** at q = {row['q']:g}, T = {row['T']:g}, "
            f"z = {row['z']:g} (peer: {row['tightest peer']})."
        )
    ratio, row = s["worst_time"]
    if row is not None:
        lines.append(
            f"* worst time of `auto` / time of that peer: **{ratio:.2f}** at q = {row['q']:g}, T = {row['T']:g}, "
            f"z = {row['z']:g} (peer: {row['tightest peer']})."
        )
    ratio, row = s["worst_cal"]
    if row is not None:
        lines.append(
            f"* calibration: largest z_auto / z_fine-PLD (above 1: more noise than needed) = **{ratio:.5f}** at q = {row['q']:g}, T = {row['T']:g}, "
            f"z = {row['z']:g}."
        )
    for row in s["auto_failed"]:
        lines.append(f"* `auto` did not answer at q = {row['q']:g}, T = {row['T']:g}, z = {row['z']:g}: {row['dpcl auto']['error']}")
    lines += ["", "## Epsilon and time per point", ""]
    header = ["q", "T", "z", *DPCL_METHODS, *PEER_METHODS, "auto / tightest", "time ratio", "z_auto / z"]
    lines += ["| " + " | ".join(header) + " |", "|" + " --- |" * len(header)]
    for r in rows:
        cal = r.get("calibration", {})
        cells = [f"{r['q']:g}", f"{r['T']:g}", f"{r['z']:g}", *(_cell(r[m]) for m in (*DPCL_METHODS, *PEER_METHODS))]
        cells.append(f"{r['auto / tightest']:.4f} ({r['tightest peer']})" if "auto / tightest" in r else "-")
        cells.append(f"{r['time ratio']:.2f}" if "time ratio" in r else "-")
        cells.append(f"{cal['ratio']:.5f}" if "ratio" in cal else (cal.get("error", "-") if cal else "-"))
        lines.append("| " + " | ".join(cells) + " |")
    lines.append("")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="four points, printed only")
    parser.add_argument("--timeout", type=float, default=None, help="seconds per call (default 120; quick 60)")
    parser.add_argument("--no-calibration", action="store_true", help="skip the calibration column")
    parser.add_argument("--out", default=str(HERE / "GRID.md"), help="report path (full grid only)")
    parser.add_argument("--from-log", help="write the report from the JSON rows a run printed (one per line)")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        methods, q, steps, z, timeout = json.loads(args.worker)
        _worker(methods, q, steps, z, timeout)
        return 0
    timeout = args.timeout or (60.0 if args.quick else 120.0)
    points = QUICK_POINTS if args.quick else [(q, t, z) for t in GRID_T for q in GRID_Q for z in GRID_Z]
    if args.from_log:
        rows = [json.loads(line) for line in Path(args.from_log).read_text().splitlines() if line.startswith("{")]
        text = report(rows, machine_info(), ("see log", " ".join(f"{x:.1f}" for x in os.getloadavg())), 0.0, timeout)
        text = text.replace("| run time | 0.0 min |", f"| run time | partial: {len(rows)} of {len(points)} points, from {args.from_log} |")
        from dpcl.guarantees.atomic_io import write_text_atomic

        write_text_atomic(Path(args.out), text)
        print(text)
        return 0
    load_start = " ".join(f"{x:.1f}" for x in os.getloadavg())
    start = time.perf_counter()
    rows = []
    for q, steps, z in points:
        row = measure_point(q, steps, z, timeout, calibrate=not args.no_calibration)
        rows.append(row)
        print(json.dumps(row), flush=True)
    load_end = " ".join(f"{x:.1f}" for x in os.getloadavg())
    text = report(rows, machine_info(), (load_start, load_end), time.perf_counter() - start, timeout)
    if args.quick:
        print(text)
        return 0
    from dpcl.guarantees.atomic_io import write_text_atomic

    write_text_atomic(Path(args.out), text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
