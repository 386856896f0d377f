"""torch's default thread count next to ``OMP_NUM_THREADS=1``, side by side, on a short ``dpcl run``.

dpcl caps torch's intra-op threads at the cores the process may use (``os.sched_getaffinity``;
:mod:`dpcl.runner.threads`) unless ``OMP_NUM_THREADS`` is set. This script times the same short
run both ways, interleaved (so that load on the machine hits both alike), and reports the median
wall time of each and their ratio. Goal: the default is not slower than ``OMP_NUM_THREADS=1``.

The run is ``dpcl/configs/naive.toml`` (DP-SGD on split digits, 5 tasks) unless ``--config``
names another; each run gets its own fresh ``--out``.

    .venv/bin/python benchmarks/bench_threads.py [--repeats 3] [--config C.toml] [--write]  # --write: THREADS.md
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from dpcl._io.atomic_io import write_bytes_atomic  # noqa: E402
from dpcl.progress import progress  # noqa: E402
from dpcl.runner.threads import THREAD_ENV_VARS, usable_cores  # noqa: E402

REPORT = Path(__file__).resolve().parent / "THREADS.md"
SETTINGS = {"default (dpcl: usable cores)": {}, "OMP_NUM_THREADS=1": {"OMP_NUM_THREADS": "1"},
            "usable cores, OMP_WAIT_POLICY=PASSIVE": {"OMP_WAIT_POLICY": "PASSIVE"}}


def _environment(extra: dict[str, str]) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in (*THREAD_ENV_VARS, "OMP_WAIT_POLICY")}
    return {**env, "PYTHONPATH": str(ROOT), **extra}


def measure(config: Path, repeats: int) -> dict[str, list[float]]:
    times: dict[str, list[float]] = {name: [] for name in SETTINGS}
    runs = [(r, name) for r in range(repeats) for name in SETTINGS]
    with tempfile.TemporaryDirectory() as tmp:
        for r, name in progress(runs, desc="bench_threads runs"):
            out = Path(tmp) / f"run{r}-{len(times[name])}-{name.split()[0]}"
            start = time.perf_counter()
            subprocess.run([sys.executable, "-m", "dpcl", "run", str(config), "--out", str(out), "--quiet"],
                           capture_output=True, cwd=ROOT, check=True, env=_environment(SETTINGS[name]))
            times[name].append(time.perf_counter() - start)
    return times


def report(config: Path, times: dict[str, list[float]], load: tuple[float, float]) -> str:
    import torch  # noqa: PLC0415 - only for the machine line

    medians = {name: statistics.median(values) for name, values in times.items()}
    default, single = medians["default (dpcl: usable cores)"], medians["OMP_NUM_THREADS=1"]
    lines = [
        "# torch threads: dpcl's default vs OMP_NUM_THREADS=1",
        "",
        f"`dpcl run {config.relative_to(ROOT)}` (fresh `--out` each time), {len(next(iter(times.values())))} "
        f"interleaved repeats per setting. Machine: {platform.machine()}, {usable_cores()} usable core(s) "
        f"(affinity), os.cpu_count() = {os.cpu_count()}, torch {torch.__version__} (its own default "
        f"{torch.get_num_threads()} thread(s) in this process), Python {platform.python_version()}; load average "
        f"(1 min) {load[0]:.1f} at start, {load[1]:.1f} at end.",
        "",
        "| setting | median wall time (s) | all runs (s) |",
        "| --- | --- | --- |",
    ]
    for name, values in times.items():
        lines.append(f"| {name} | {medians[name]:.1f} | {', '.join(f'{v:.1f}' for v in values)} |")
    lines += ["", f"Ratio default / OMP_NUM_THREADS=1: **{default / single:.2f}** "
              f"({'not slower' if default <= single * 1.05 else 'slower'}; goal: not slower, 5% measurement margin).",
              "", "Regenerate: `.venv/bin/python benchmarks/bench_threads.py --write`.", ""]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--config", type=Path, default=ROOT / "dpcl" / "configs" / "naive.toml")
    parser.add_argument("--write", action="store_true", help=f"write {REPORT.name} (atomically)")
    args = parser.parse_args(argv)
    if args.repeats < 1:
        parser.error("--repeats must be at least 1")
    start_load = os.getloadavg()[0]
    times = measure(args.config.resolve(), args.repeats)
    text = report(args.config.resolve(), times, (start_load, os.getloadavg()[0]))
    print(text)
    if args.write:
        write_bytes_atomic(REPORT, text.encode("utf-8"))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
