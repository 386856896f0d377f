"""Start-up time of the command line next to the imports it cannot avoid.

``dpcl calibrate gaussian`` needs numpy and scipy.special (the analytic Gaussian calibration);
everything else -- dp-accounting, prv-accountant, scipy.stats (the auditor), torch -- is imported
only by the commands that use it. This script times, side by side and interleaved (so that load
on the machine hits every command alike), the median wall time of

* ``python -c "import scipy.special, numpy"`` (the floor),
* ``python -m dpcl calibrate gaussian --epsilon 1 --delta 1e-5``,
* ``python -m dpcl --help``,

and prints each as a ratio to the floor. Target: calibrate gaussian at most 1.5x the floor.

    .venv/bin/python benchmarks/bench_cli_startup.py [--repeats 7]
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
COMMANDS = {
    "import scipy.special, numpy": [sys.executable, "-c", "import scipy.special, numpy"],
    "dpcl calibrate gaussian": [sys.executable, "-m", "dpcl", "calibrate", "gaussian", "--epsilon", "1", "--delta", "1e-5"],
    "dpcl --help": [sys.executable, "-m", "dpcl", "--help"],
}


def measure(repeats: int) -> dict[str, float]:
    times: dict[str, list[float]] = {name: [] for name in COMMANDS}
    for name, cmd in COMMANDS.items():  # warm the file cache once
        subprocess.run(cmd, capture_output=True, cwd=ROOT, check=True)
    for _ in range(repeats):
        for name, cmd in COMMANDS.items():
            start = time.perf_counter()
            subprocess.run(cmd, capture_output=True, cwd=ROOT, check=True)
            times[name].append(time.perf_counter() - start)
    return {name: statistics.median(values) for name, values in times.items()}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args(argv)
    load = " ".join(f"{x:.1f}" for x in os.getloadavg())
    medians = measure(args.repeats)
    floor = medians["import scipy.special, numpy"]
    print(f"median of {args.repeats} interleaved runs (load average at start {load}):")
    for name, seconds in medians.items():
        print(f"  {name:32s} {seconds:6.3f} s   x {seconds / floor:.2f}")
    ratio = medians["dpcl calibrate gaussian"] / floor
    print(f"calibrate gaussian / floor = {ratio:.2f} (target <= 1.5)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
