"""Torch threads side by side on a short ``dpcl run``: dpcl's default, ``OMP_NUM_THREADS=1``, spinning threads.

dpcl caps torch's intra-op threads at the cores the process may use (``os.sched_getaffinity``) unless
``OMP_NUM_THREADS`` is set, and makes idle OpenMP threads sleep (``OMP_WAIT_POLICY=PASSIVE``) unless
the user chose how they wait (:mod:`dpcl.runner.threads`). This script times the same short run
three ways, interleaved (so that load on the machine hits all alike), each in a fresh process with
its own fresh ``--out``:

* **dpcl default**: no thread variable set;
* **OMP_NUM_THREADS=1**: one thread;
* **spinning threads (before)**: the usable cores with GNU OpenMP's own waiting, idle threads
  spinning 300,000 times after every parallel operation (``GOMP_SPINCOUNT=300000``, its default),
  as dpcl ran before it chose sleeping threads.

It records the 1-minute load average before and after every run, and reports the median wall time
of each setting, the ratio to ``OMP_NUM_THREADS=1`` (goal: not above 1.05) and the processor time.

The run is the first ``--tasks`` tasks (default 2) of ``dpcl/configs/fmnist_naive.toml`` (DP-SGD on
Split Fashion-MNIST; needs the Debian package ``dataset-fashion-mnist``) unless ``--config`` names
another; ``--tasks 0`` keeps every task of the config.

``--workload loop`` times instead a bare DP-SGD loop of the same shapes (adapter 784-16-784 and head
784-10, Poisson batches of about 256, per-example gradients, clipping, Gaussian noise, Adam; then
five forward passes over 10,000 rows) on random data, ``--loop-steps`` steps, in a child that needs
torch alone, so that it runs on any machine with torch; there dpcl's default is written out as
``OMP_NUM_THREADS`` = the usable cores with ``OMP_WAIT_POLICY=PASSIVE`` (what dpcl sets where
torch's own count is not below the usable cores). Pin it to cores with ``taskset -c 0,1`` to
compare a quiet and a loaded machine of the same size.

    .venv/bin/python benchmarks/bench_threads.py [--repeats 3] [--config C.toml] [--tasks N] [--write]  # --write: THREADS.md
    taskset -c 0,1 python benchmarks/bench_threads.py --workload loop [--loop-steps 300]
"""

from __future__ import annotations

import argparse
import os
import platform
import re
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from dpcl._io.atomic_io import write_bytes_atomic  # noqa: E402
from dpcl.progress import progress  # noqa: E402
from dpcl._threads import THREAD_ENV_VARS, WAIT_ENV_VARS, usable_cores  # noqa: E402

REPORT = Path(__file__).resolve().parent / "THREADS.md"
DEFAULT = "dpcl default (usable cores, sleeping threads)"
SINGLE = "OMP_NUM_THREADS=1"
SPINNING = "usable cores, spinning threads (before; GOMP_SPINCOUNT=300000)"
SETTINGS = {DEFAULT: {}, SINGLE: {"OMP_NUM_THREADS": "1"}, SPINNING: {"GOMP_SPINCOUNT": "300000"}}
#: A ratio to ``OMP_NUM_THREADS=1`` up to this counts as "not slower" (run-to-run noise on a shared machine).
MARGIN = 1.05


@dataclass(frozen=True)
class Timing:
    """One run: wall and processor seconds (user + system, the child's), the 1-minute load before and after."""

    wall: float
    cpu: float
    load_before: float
    load_after: float


def _environment(extra: dict[str, str]) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in (*THREAD_ENV_VARS, *WAIT_ENV_VARS)}
    return {**env, "PYTHONPATH": str(ROOT), **extra}


def shortened_config(config: Path, tasks: int, directory: Path) -> Path:
    """``config`` with only its first ``tasks`` tasks (its ``tasks = [[...], ...]`` line rewritten); ``config``
    itself when ``tasks`` is 0."""
    if tasks == 0:
        return config
    text = config.read_text(encoding="utf-8")
    line = re.search(r"^tasks\s*=\s*(\[.*\])\s*(#.*)?$", text, flags=re.MULTILINE)
    if line is None:
        raise SystemExit(f"{config} has no one-line `tasks = [...]` to shorten; pass --tasks 0")
    groups = re.findall(r"\[[^\[\]]*\]", line.group(1))
    if len(groups) < tasks:
        raise SystemExit(f"{config} has {len(groups)} tasks, fewer than --tasks {tasks}")
    short = directory / config.name
    short.write_text(text[: line.start()] + f"tasks = [{', '.join(groups[:tasks])}]" + text[line.end():],
                     encoding="utf-8")
    return short


def dpsgd_loop(steps: int) -> None:
    """The ``--workload loop`` child: a DP-SGD loop shaped like ``fmnist_naive`` on random data (torch alone)."""
    import torch  # noqa: PLC0415 - the child's only heavy import, after its thread variables are in place

    g = torch.Generator().manual_seed(0)
    x_all, y_all = torch.randn(12000, 784, generator=g), torch.randint(0, 10, (12000,), generator=g)
    down, up, head = torch.nn.Linear(784, 16), torch.nn.Linear(16, 784), torch.nn.Linear(784, 10)
    params = [*down.parameters(), *up.parameters(), *head.parameters()]
    optimizer = torch.optim.Adam(params)
    for _ in range(steps):
        rows = torch.nonzero(torch.rand(12000, generator=g) < 256 / 12000).squeeze(1)
        x, y = x_all[rows], y_all[rows]
        pre = down(x)
        hidden = pre.relu()
        h = x + up(hidden)
        d_logits = torch.softmax(head(h), 1)
        d_logits[torch.arange(len(y)), y] -= 1  # cross-entropy's gradient per example
        d_h = d_logits @ head.weight
        d_pre = (d_h @ up.weight) * (pre > 0)
        per_example = [torch.einsum("bi,bj->bij", d_pre, x), d_pre, torch.einsum("bi,bj->bij", d_h, hidden), d_h,
                       torch.einsum("bi,bj->bij", d_logits, h), d_logits]
        norms = torch.sqrt(sum(q.flatten(1).pow(2).sum(1) for q in per_example))
        scale = (1 / (norms + 1e-6)).clamp(max=1)
        for p, q in zip(params, per_example):
            p.grad = (torch.einsum("b,b...->...", scale, q) + torch.randn(q.shape[1:], generator=g)) / 256
        optimizer.step()
    with torch.no_grad():
        test = torch.randn(10000, 784, generator=g)
        for _ in range(5):
            head(test + up(down(test).relu())).argmax(1)


def _loop_settings() -> dict[str, dict[str, str]]:
    """The three settings for ``--workload loop``, written out: the child is not started through dpcl."""
    cores = str(usable_cores())
    return {DEFAULT: {"OMP_NUM_THREADS": cores, "OMP_WAIT_POLICY": "PASSIVE"}, SINGLE: {"OMP_NUM_THREADS": "1"},
            SPINNING: {"OMP_NUM_THREADS": cores, "GOMP_SPINCOUNT": "300000"}}


def _child_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def measure(config: Path, repeats: int, tasks: int, loop_steps: int | None = None) -> dict[str, list[Timing]]:
    """Interleaved timings of every setting: ``dpcl run`` of ``config``, or the DP-SGD loop when ``loop_steps``."""
    settings = SETTINGS if loop_steps is None else _loop_settings()
    times: dict[str, list[Timing]] = {name: [] for name in settings}
    runs = [(r, name) for r in range(repeats) for name in settings]
    with tempfile.TemporaryDirectory() as tmp:
        path = shortened_config(config, tasks, Path(tmp)) if loop_steps is None else config
        for r, name in progress(runs, desc="bench_threads runs"):
            out = Path(tmp) / f"run{r}-{list(settings).index(name)}"
            command = ([sys.executable, "-m", "dpcl", "run", str(path), "--out", str(out), "--quiet",
                        "--reproducible-noise"] if loop_steps is None
                       else [sys.executable, str(Path(__file__).resolve()), "--child-loop", str(loop_steps)])
            load, cpu, start = os.getloadavg()[0], _child_cpu(), time.perf_counter()
            done = subprocess.run(command, capture_output=True, text=True, cwd=ROOT, env=_environment(settings[name]))
            wall = time.perf_counter() - start
            if done.returncode != 0:
                raise SystemExit(f"dpcl run failed ({name}):\n{done.stderr}")
            times[name].append(Timing(wall, _child_cpu() - cpu, load, os.getloadavg()[0]))
    return times


def report(config: Path, tasks: int, times: dict[str, list[Timing]], loop_steps: int | None = None) -> str:
    import torch  # noqa: PLC0415 - only for the machine line

    medians = {name: statistics.median(t.wall for t in runs) for name, runs in times.items()}
    loads = [load for runs in times.values() for t in runs for load in (t.load_before, t.load_after)]
    which = f"its first {tasks} tasks" if tasks else "every task"
    workload = (f"`dpcl run {config.relative_to(ROOT) if config.is_relative_to(ROOT) else config}` ({which}, "
                "`--reproducible-noise`, a fresh `--out` and a fresh process each time)" if loop_steps is None
                else f"The DP-SGD loop of `bench_threads.py --workload loop` ({loop_steps} steps, a fresh process "
                "each time)")
    lines = [
        "# torch threads: dpcl's default vs OMP_NUM_THREADS=1",
        "",
        f"{workload}, {len(times[SINGLE])} interleaved "
        f"repeats per setting, at niceness {os.nice(0)}. Machine: "
        f"{platform.machine()}, {usable_cores()} usable core(s) (affinity), os.cpu_count() = {os.cpu_count()}, "
        f"torch {torch.__version__}, Python {platform.python_version()}; 1-minute load average "
        f"{min(loads):.1f} to {max(loads):.1f} over the runs.",
        "",
        "| setting | median wall time (s) | / OMP_NUM_THREADS=1 | runs: wall s (CPU s, load before → after) |",
        "| --- | --- | --- | --- |",
    ]
    for name, runs in times.items():
        each = ", ".join(f"{t.wall:.1f} ({t.cpu:.1f}, {t.load_before:.1f} → {t.load_after:.1f})" for t in runs)
        lines.append(f"| {name} | {medians[name]:.1f} | {medians[name] / medians[SINGLE]:.2f} | {each} |")
    ratio = medians[DEFAULT] / medians[SINGLE]
    verdict = "not slower" if ratio <= MARGIN else "slower"
    lines += ["", f"dpcl's default / OMP_NUM_THREADS=1: **{ratio:.2f}** ({verdict}; goal: not slower, "
              f"{MARGIN - 1:.0%} measurement margin). Spinning threads (before) / OMP_NUM_THREADS=1: "
              f"**{medians[SPINNING] / medians[SINGLE]:.2f}**.",
              "", "Regenerate: `nice -n 10 .venv/bin/python benchmarks/bench_threads.py --write`"
              + ("." if loop_steps is None else f" (this table: `--workload loop --loop-steps {loop_steps}`)."), ""]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--config", type=Path, default=ROOT / "dpcl" / "configs" / "fmnist_naive.toml")
    parser.add_argument("--tasks", type=int, default=2, help="train the config's first N tasks only (0: all)")
    parser.add_argument("--workload", choices=("run", "loop"), default="run",
                        help="run: dpcl run of --config; loop: a bare DP-SGD loop of the same shapes (torch alone)")
    parser.add_argument("--loop-steps", type=int, default=300, help="steps of --workload loop")
    parser.add_argument("--child-loop", type=int, metavar="STEPS", help=argparse.SUPPRESS)  # the loop's child
    parser.add_argument("--write", action="store_true", help=f"write {REPORT.name} (atomically)")
    args = parser.parse_args(argv)
    if args.child_loop is not None:
        dpsgd_loop(args.child_loop)
        return 0
    if args.repeats < 1:
        parser.error("--repeats must be at least 1")
    if args.tasks < 0:
        parser.error("--tasks must be 0 (every task) or more")
    if args.loop_steps < 1:
        parser.error("--loop-steps must be at least 1")
    config = args.config.resolve()
    steps = args.loop_steps if args.workload == "loop" else None
    text = report(config, args.tasks, measure(config, args.repeats, args.tasks, steps), steps)
    print(text)
    if args.write:
        write_bytes_atomic(REPORT, text.encode("utf-8"))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
