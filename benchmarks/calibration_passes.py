"""Where the per-token calibration's time goes, in passes of ``scipy.special.log_ndtr``; prints one JSON object.

Usage (from the repository root)::

    .venv/bin/python benchmarks/calibration_passes.py            # 2^20 budgets, eps ~ U[0.5, 8], delta = 1e-5

Single thread (``_WORKERS = 1``), CPU time (``time.process_time``), so the load of a shared machine moves the
numbers less than wall time would. It reports, per budget:

* how many ``log_ndtr`` evaluations the calibration makes (counted by wrapping the function the module calls)
  and how many evaluations of the privacy profile (two ``log_ndtr`` each) the root finder and the
  verification make;
* the CPU time of the whole calibration, the part spent inside ``log_ndtr``, and one ``log_ndtr`` pass over
  the same number of elements: the ratio the issue's goal (≤ 10×) is stated in;
* the CPU time with the profile's trapezoid bound left out (an experiment, not a library option: the bound
  changes no sigma of these budgets, but it does for tiny epsilon, so the library keeps it), to show what the
  float-error bookkeeping costs;
* the same calibration with blocks of 2^11 to 2^15 budgets (the library uses 2^15).

The sigmas of every variant that the library could use are checked to be bit-identical to the library's.
"""

from __future__ import annotations

import inspect
import json
import os
import sys
import time
from pathlib import Path
from typing import Any, Callable

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np  # noqa: E402
from scipy.special import log_ndtr  # noqa: E402

import dpcl.accounting.gaussian as gauss  # noqa: E402
import dpcl.accounting.gaussian_profile as profile  # noqa: E402  (the profile and its log_ndtr calls)

N = 1 << 20
DELTA = 1e-5


def cpu_ns_per_budget(fn: Callable[[], Any], repeats: int = 3) -> float:
    best = float("inf")
    for _ in range(repeats):
        start = time.process_time()
        fn()
        best = min(best, time.process_time() - start)
    return best / N * 1e9


def main() -> None:
    eps = np.random.default_rng(29).uniform(0.5, 8.0, N)
    out = np.empty(N)
    gauss._WORKERS = 1
    reference = np.asarray(gauss.gaussian_sigma(eps, DELTA)).copy()
    calibrate = lambda: gauss.gaussian_sigma(eps, DELTA, out=out)  # noqa: E731
    load = [os.getloadavg()[0]]

    # count and time the log_ndtr evaluations
    counts = {"elements": 0, "calls": 0, "seconds": 0.0}
    original = profile.log_ndtr

    def counting(x: np.ndarray) -> np.ndarray:
        start = time.process_time()
        value = original(x)
        counts["seconds"] += time.process_time() - start
        counts["elements"] += np.size(x)
        counts["calls"] += 1
        return value

    profile.log_ndtr = counting
    calibrate()
    profile.log_ndtr = original
    total = cpu_ns_per_budget(calibrate)
    argument = -3.0 - eps / 2.0
    one_pass = cpu_ns_per_budget(lambda: log_ndtr(argument), 5)

    # the trapezoid bound left out (experiment)
    source = inspect.getsource(profile._log_delta_x1)
    cut = source[: source.index("        # (2): trapezoid")] + source[source.index("        # exact b < a"):]
    namespace = dict(vars(profile))
    exec(cut, namespace)  # noqa: S102 - the module's own function, one block removed
    kept = profile._log_delta_x1
    profile._log_delta_x1 = namespace["_log_delta_x1"]
    without_trapezoid = cpu_ns_per_budget(calibrate)
    same_without = bool(np.array_equal(out, reference))
    profile._log_delta_x1 = kept

    blocks = {}
    saved = gauss._BLOCK, gauss._MIN_BLOCK
    for exponent in (11, 12, 13, 14, 15):
        gauss._BLOCK = gauss._MIN_BLOCK = 1 << exponent
        blocks[f"2^{exponent}"] = cpu_ns_per_budget(calibrate, 2)
        assert np.array_equal(out, reference), "block size changed a sigma"
    gauss._BLOCK, gauss._MIN_BLOCK = saved
    load.append(os.getloadavg()[0])
    print(json.dumps({
        "budgets": N,
        "setting": "eps ~ U[0.5, 8] (seed 29), delta = 1e-5, one thread, CPU time",
        "log_ndtr_evaluations_per_budget": counts["elements"] / N,
        "profile_evaluations_per_budget": counts["elements"] / N / 2,
        "log_ndtr_calls": counts["calls"],
        "cpu_ns_per_budget": total,
        "cpu_ns_per_budget_in_log_ndtr": counts["seconds"] / N * 1e9,
        "one_log_ndtr_pass_ns_per_element": one_pass,
        "ratio_to_one_log_ndtr_pass": total / one_pass,
        "ratio_floor_from_log_ndtr_evaluations": counts["elements"] / N,
        "without_trapezoid_bound_ns_per_budget": without_trapezoid,
        "without_trapezoid_bound_ratio": without_trapezoid / one_pass,
        "without_trapezoid_bound_same_sigmas_here": same_without,
        "block_size_ns_per_budget": blocks,
        "load_average": load,
    }, indent=1))


if __name__ == "__main__":
    main()
