"""Per-token analytic Gaussian calibration on a GPU (torch) beside numpy on the CPU; prints one JSON object.

Usage (from the repository root)::

    python benchmarks/bench_calibration_gpu.py                          # CUDA: 1e6, 1e7 and 1e8 budgets
    python benchmarks/bench_calibration_gpu.py --device cpu --sizes 1e4 1e5 --mpmath 20   # CPU torch, a quick look

Budgets epsilon ~ U[0.5, 8] (seed 29, as ``bench_calibration_stream.py``), delta = 1e-5, sensitivity 1.
For each n:

* ``gpu_streamed``: ``gaussian_sigma_torch(eps, 1e-5, device=..., out=host_tensor)`` with ``eps`` a numpy
  array in host memory: blocks of ``--block`` budgets go to the device and their sigmas come back, so 10^8
  budgets need one block's working memory on the device. Wall time (synchronised), the whole round trip.
* ``gpu_resident``: the budgets and the output already on the device (skipped with ``--no-resident``).
* ``cpu_numpy``: ``dpcl.accounting.gaussian.gaussian_sigma(eps, 1e-5, out=...)`` on the CPU (its blocks and
  threads as the library sets them, or ``--cpu-workers``), wall and CPU time; for n above ``--cpu-max-n``
  only the agreement sample is computed on the CPU.
* one pass of ``scipy.special.log_ndtr`` over the same n on the CPU, and of ``torch.special.log_ndtr`` on
  the device: the ratios to them.
* ``agreement``: on ``--sample`` random indices, the largest relative difference between the device's and
  numpy's sigmas, and the share that are bit-identical (numpy's sigma of a budget does not depend on the
  other budgets of the call, so the sample is exact).
* ``mpmath``: at the largest n, ``--mpmath`` random device sigmas checked against the exact Thm 8 profile in
  mpmath; ``over_delta`` counts those giving more than delta (must be 0).

Everything is printed as one JSON object on stdout (``--out`` also writes it to a file).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

import numpy as np  # noqa: E402
import scipy  # noqa: E402
import torch  # noqa: E402
from scipy.special import log_ndtr  # noqa: E402

import dpcl.accounting.gaussian as gauss  # noqa: E402
from dpcl.accounting.gaussian import gaussian_sigma  # noqa: E402
from bench_calibration_stream import DELTA, SEED, mp_over_delta  # noqa: E402
from bench_calibration_stream import _budgets as budgets  # noqa: E402
from dpcl.methods.gaussian_torch import BLOCK, gaussian_sigma_torch  # noqa: E402

def cpu_seconds() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def timed(fn: Any, device: torch.device | None = None) -> tuple[float, float]:
    """(wall s, process CPU s) of ``fn()``."""
    if device is not None:
        sync(device)
    wall, cpu = time.perf_counter(), cpu_seconds()
    fn()
    if device is not None:
        sync(device)
    return time.perf_counter() - wall, cpu_seconds() - cpu


def measure(n: int, args: argparse.Namespace, device: torch.device) -> dict[str, Any]:
    row: dict[str, Any] = {"n": n, "load_before": os.getloadavg()[0]}
    eps = budgets(n)
    # one log_ndtr pass over n elements on each side (best of 3), the reference the ratios use
    arg = -3.0 - eps / 2.0  # arguments of the size the calibration sees
    row["cpu_log_ndtr_seconds"], row["cpu_log_ndtr_cpu_seconds"] = min(timed(lambda: log_ndtr(arg)) for _ in range(3))
    del arg
    host_out = torch.empty(n, dtype=torch.float64)
    wall, cpu = timed(lambda: gaussian_sigma_torch(eps, DELTA, device=device, out=host_out, block=args.block), device)
    row["gpu_streamed_seconds"], row["gpu_streamed_cpu_seconds"] = wall, cpu
    if not args.no_resident:
        eps_dev = torch.from_numpy(eps).to(device)
        dev_out = torch.empty(n, dtype=torch.float64, device=device)
        wall, _ = timed(lambda: gaussian_sigma_torch(eps_dev, DELTA, out=dev_out, block=args.block), device)
        row["gpu_resident_seconds"] = wall
        t = -3.0 - eps_dev / 2.0
        row["device_log_ndtr_seconds"] = min(timed(lambda: torch.special.log_ndtr(t), device)[0] for _ in range(3))
        row["gpu_resident_over_device_log_ndtr"] = row["gpu_resident_seconds"] / row["device_log_ndtr_seconds"]
        same = bool(torch.equal(dev_out.cpu(), host_out))
        row["resident_equals_streamed"] = same
        del eps_dev, dev_out, t
        if device.type == "cuda":
            torch.cuda.empty_cache()
    sigma_dev = host_out.numpy()
    rng = np.random.default_rng(SEED + 1)
    sample = np.sort(rng.choice(n, size=min(args.sample, n), replace=False))
    if n <= args.cpu_max_n:
        cpu_out = np.empty(n)
        wall, cpu = timed(lambda: gaussian_sigma(eps, DELTA, out=cpu_out))
        row["cpu_numpy_seconds"], row["cpu_numpy_cpu_seconds"] = wall, cpu
        row["cpu_numpy_over_cpu_log_ndtr"] = wall / row["cpu_log_ndtr_seconds"]
        row["gpu_streamed_speedup_over_cpu_numpy"] = wall / row["gpu_streamed_seconds"]
        if "gpu_resident_seconds" in row:
            row["gpu_resident_speedup_over_cpu_numpy"] = wall / row["gpu_resident_seconds"]
        reference = cpu_out[sample]
        row["full_agreement_max_relative_difference"] = float(np.max(np.abs(sigma_dev / cpu_out - 1.0)))
        row["full_bit_identical_share"] = float(np.mean(sigma_dev == cpu_out))
        del cpu_out
    else:
        reference = gaussian_sigma(eps[sample], DELTA)
    got = sigma_dev[sample]
    row["agreement"] = {
        "sample": int(sample.size),
        "max_relative_difference": float(np.max(np.abs(got / reference - 1.0))),
        "bit_identical_share": float(np.mean(got == reference)),
    }
    row["all_finite_positive"] = bool(np.all(np.isfinite(sigma_dev) & (sigma_dev > 0)))
    if n == max(args.sizes) and args.mpmath > 0:
        idx = rng.choice(n, size=min(args.mpmath, n), replace=False)
        row["mpmath"] = {"sample": int(idx.size), "over_delta": int(sum(mp_over_delta(float(eps[i]), float(sigma_dev[i])) for i in idx))}
    row["load_after"] = os.getloadavg()[0]
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--device", default="cuda", help="torch device for the calibration (default cuda)")
    parser.add_argument("--sizes", type=float, nargs="+", default=[1e6, 1e7, 1e8])
    parser.add_argument("--block", type=int, default=BLOCK, help=f"budgets per device block (default {BLOCK})")
    parser.add_argument("--cpu-max-n", type=float, default=1e8, help="largest n also calibrated whole by numpy on the CPU")
    parser.add_argument("--cpu-workers", type=int, default=None, help="threads of the numpy calibration (default: the library's)")
    parser.add_argument("--sample", type=int, default=100_000, help="budgets compared with numpy at each n")
    parser.add_argument("--mpmath", type=int, default=200, help="device sigmas checked in mpmath at the largest n")
    parser.add_argument("--no-resident", action="store_true", help="skip the run with budgets already on the device")
    parser.add_argument("--out", type=Path, default=None, help="also write the JSON here")
    args = parser.parse_args()
    args.sizes = [int(s) for s in args.sizes]
    args.cpu_max_n = int(args.cpu_max_n)
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        parser.error("no CUDA device; use --device cpu")
    if args.cpu_workers is not None:
        gauss._WORKERS = args.cpu_workers
    started = time.perf_counter()
    # warm-up: CUDA context, kernels, the numpy calibration's first call
    gaussian_sigma_torch(budgets(1000), DELTA, device=device)
    gaussian_sigma(budgets(1000), DELTA)
    result: dict[str, Any] = {
        "benchmark": "bench_calibration_gpu",
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else f"cpu ({platform.processor() or platform.machine()})",
        "cpus": os.cpu_count(),
        "cpu_workers": gauss._WORKERS,
        "python": platform.python_version(),
        "torch": torch.__version__,
        "numpy": np.__version__,
        "scipy": scipy.__version__,
        "budgets": "epsilon ~ U[0.5, 8] (seed 29), delta = 1e-5, sensitivity 1",
        "block": args.block,
        "rows": [measure(n, args, device) for n in args.sizes],
    }
    if device.type == "cuda":
        result["device_peak_memory_mib"] = torch.cuda.max_memory_allocated(device) / 2**20
    result["total_seconds"] = time.perf_counter() - started
    text = json.dumps(result)
    print(text, flush=True)
    if args.out is not None:
        args.out.write_text(text + "\n")


if __name__ == "__main__":
    main()
