"""Start-up time of the command line next to the imports it cannot avoid.

``dpcl calibrate gaussian`` needs numpy and scipy.special (the analytic Gaussian calibration);
everything else -- dp-accounting, prv-accountant, scipy.stats (the auditor), torch -- is imported
only by the commands that use it. This script times, side by side and interleaved (so that load
on the machine hits every command alike), the median wall time of

* ``python -c "import scipy.special, numpy"`` (the floor),
* ``python -m dpcl calibrate gaussian --epsilon 1 --delta 1e-5``,
* ``python -m dpcl --help``,

and prints each as a ratio to the floor. Target: calibrate gaussian at most 1.5x the floor.

Every command runs as an installed package does: with its modules' bytecode. pip byte-compiles a
wheel's modules when it installs them (numpy and scipy here), and an editable checkout writes
``__pycache__`` at its first import; ``PYTHONDONTWRITEBYTECODE`` (set on some machines, e.g. the one
these numbers come from) would make dpcl alone compile its sources at every start (~0.1 s), so it is
removed from the commands' environment and a first untimed run of each writes the bytecode.

    .venv/bin/python benchmarks/bench_cli_startup.py [--repeats 7] [--write]   # --write: CLI_STARTUP.md
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from dpcl.progress import progress  # noqa: E402
COMMANDS = {
    "import scipy.special, numpy": [sys.executable, "-c", "import scipy.special, numpy"],
    "dpcl calibrate gaussian": [sys.executable, "-m", "dpcl", "calibrate", "gaussian", "--epsilon", "1", "--delta", "1e-5"],
    "dpcl --help": [sys.executable, "-m", "dpcl", "--help"],
}


REPORT = Path(__file__).resolve().parent / "CLI_STARTUP.md"
TARGET = 1.5


def _environment() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}


def measure(repeats: int) -> dict[str, float]:
    times: dict[str, list[float]] = {name: [] for name in COMMANDS}
    env = _environment()
    for name, cmd in COMMANDS.items():  # warm the file cache and write the bytecode once
        subprocess.run(cmd, capture_output=True, cwd=ROOT, check=True, env=env)
    for _ in progress(range(repeats), desc="bench_cli_startup repeats", unit="repeat"):
        for name, cmd in COMMANDS.items():
            start = time.perf_counter()
            subprocess.run(cmd, capture_output=True, cwd=ROOT, check=True, env=env)
            times[name].append(time.perf_counter() - start)
    return {name: statistics.median(values) for name, values in times.items()}


def write_report(medians: dict[str, float], repeats: int, load: str) -> None:
    import datetime as _dt
    import platform

    floor = medians["import scipy.special, numpy"]
    ratio = medians["dpcl calibrate gaussian"] / floor
    lines = [
        "# Start-up time of the command line (`benchmarks/bench_cli_startup.py`)",
        "",
        f"Measured on {_dt.datetime.now(_dt.timezone.utc):%Y-%m-%d %H:%M} UTC, {platform.machine()} with "
        f"{os.cpu_count()} CPU(s), Python {platform.python_version()}; load average (1, 5, 15 min) at start {load}. "
        f"Median wall time of {repeats} interleaved runs of each command (a fresh interpreter each; bytecode written "
        "by a first untimed run, as an installed package has it).",
        "",
        "| command | median s | × floor |",
        "| --- | --- | --- |",
    ]
    for name, seconds in medians.items():
        lines.append(f"| `{name}` | {seconds:.3f} | {seconds / floor:.2f} |")
    verdict = "met" if ratio <= TARGET else "missed"
    lines += ["", f"`dpcl calibrate gaussian` / floor = **{ratio:.2f}** (goal ≤ {TARGET:g}: {verdict}).", ""]
    tmp = REPORT.with_suffix(".md.tmp")
    tmp.write_text("\n".join(lines), encoding="utf-8")
    os.replace(tmp, REPORT)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--write", action="store_true", help=f"write {REPORT.name}")
    args = parser.parse_args(argv)
    load = " ".join(f"{x:.1f}" for x in os.getloadavg())
    medians = measure(args.repeats)
    floor = medians["import scipy.special, numpy"]
    print(f"median of {args.repeats} interleaved runs (load average at start {load}):")
    for name, seconds in medians.items():
        print(f"  {name:32s} {seconds:6.3f} s   x {seconds / floor:.2f}")
    ratio = medians["dpcl calibrate gaussian"] / floor
    print(f"calibrate gaussian / floor = {ratio:.2f} (target <= {TARGET:g})")
    if args.write:
        write_report(medians, args.repeats, load)
        print(f"wrote {REPORT.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
