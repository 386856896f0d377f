"""Measure a run's peak training memory in this (fresh) process: ``python memory_probe.py CONFIG OUT``.

Loads the config and its stream as ``dpcl run`` does, resets the kernel's resident-set high-water mark
(``/proc/self/clear_refs``), builds the method and trains every task, then prints one JSON object: the
estimate of :func:`dpcl.runner.cost.estimate_training_cost` and the measured peak above the resident set
before the method was built (``VmHWM`` after training minus ``VmRSS`` before). torch's CPU allocations are
seen by the resident set, not by ``tracemalloc``.
"""

from __future__ import annotations

import gc
import json
import sys


def _status(key: str) -> int:
    with open("/proc/self/status", encoding="ascii") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1]) * 1024
    raise KeyError(key)


def main(config: str, out: str) -> None:
    from dpcl.runner import run as runner
    from dpcl.runner.cost import estimate_training_cost

    loaded = runner.load_run(config, out, quiet=True)
    prepared = runner.prepare_stream(loaded)
    report = runner.audit_run(loaded, prepared)
    cost = estimate_training_cost(loaded.config, prepared.sizes, int(prepared.tasks[0].features.shape[1]), "cpu")
    gc.collect()
    with open("/proc/self/clear_refs", "w", encoding="ascii") as f:
        f.write("5")  # reset VmHWM to the current resident set
    before = _status("VmRSS")
    run = runner.open_run(loaded, prepared, report, runner.StageClock())
    for t in range(run.n_tasks):
        runner.run_task(run, t)
    peak = _status("VmHWM")
    print(json.dumps({"estimate": cost.peak_memory_bytes, "parts": dict(cost.memory_bytes),
                      "measured": peak - before, "rss_before": before, "peak": peak}))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
