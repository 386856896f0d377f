"""GPU session check: every bundled config trains one task on CUDA and its certificate verifies; the TDP kernel checks.

``python scripts/check_gpu.py [--device cuda:N] [--out DIR]`` on a machine with
a CUDA device (and the ``fortunes`` texts for the PeCL configs). For every
``dpcl/configs/*.toml`` it runs the first task with ``--device`` (the Python API
:func:`dpcl.runner.run_training` with ``stop_after_task=0``, the noise from OS
entropy as in any real run), then checks the release with ``dpcl verify --json``
as a user would: exit 0, a valid certificate, and ``private`` true, except for
a config whose checkpoint is declared not private (``pecl_paper.toml``): its
private run must be refused before training (``dpcl run`` exits 3), and its run
with ``[run] private = false`` (a copy of the config) must give valid
certificates that say ``private: false``. Then it runs
``scripts/check_tdp_triton.py`` (kernel correctness and timing) and
``benchmarks/pecl_tdp.py --device cuda``.

Prints one JSON object (per config: seconds, epsilon, device, ``verify`` exit
code; the two TDP outputs) and exits 1 when a check fails. Without a CUDA
device it exits 2 at once, saying so (nothing is trained).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CONFIGS = ROOT / "dpcl" / "configs"
NOT_PRIVATE_CONFIGS = {"pecl_paper.toml"}  # checkpoints declared not DP: their valid certificates say private: false


def _cuda_device(requested: str) -> str | None:
    """The device to use, or None (with the reason printed) when there is no usable CUDA device."""
    import torch

    if not torch.cuda.is_available():
        print(
            "check_gpu.py: no CUDA device is present (torch.cuda.is_available() is False; torch "
            f"{torch.__version__}). Run it on a machine with an NVIDIA GPU and a CUDA build of torch.",
            file=sys.stderr,
        )
        return None
    from dpcl.errors import DpclError
    from dpcl.runner.run import resolve_device

    try:
        return resolve_device(requested, {})
    except DpclError as exc:
        print(f"check_gpu.py: {exc}", file=sys.stderr)
        return None


def _not_private_copy(config: Path, out: Path, device: str) -> tuple[Path, str | None]:
    """A config whose checkpoint is declared not private: check that its private run is refused before training
    (exit 3 of ``dpcl run``), then return a copy with ``[run] private = false``, the run a researcher makes."""
    from dpcl.errors import PrivacyViolationError
    from dpcl.runner import run_training

    try:
        run_training(config, out / "refused", device=device, quiet=True, stop_after_task=0)
    except PrivacyViolationError:
        refused = None
    except Exception as exc:  # noqa: BLE001 - reported with the config
        refused = f"the private run failed with {type(exc).__name__} instead of a privacy violation: {exc}"
    else:
        refused = "the private run of a config whose checkpoint is not private was trained, not refused"
    out.mkdir(parents=True, exist_ok=True)
    copy = out / f"{config.stem}_not_private.toml"
    copy.write_text(config.read_text(encoding="utf-8") + "\n[run]\nprivate = false\n", encoding="utf-8")
    return copy, refused


def _run_config(config: Path, out: Path, device: str) -> dict:
    from dpcl.runner import run_training

    refused, declared_not_private = None, config.name in NOT_PRIVATE_CONFIGS
    if declared_not_private:
        config, refused = _not_private_copy(config, out, device)
        out = out / "not_private"
    start = time.perf_counter()
    try:
        result = run_training(config, out, device=device, quiet=True, stop_after_task=0)
    except Exception as exc:  # noqa: BLE001 - reported per config, the others still run
        return {"ok": False, "error": f"{type(exc).__name__}: {exc}", "seconds": time.perf_counter() - start}
    seconds = time.perf_counter() - start
    certificate = out / result.releases[0].certificate
    verify = subprocess.run(
        [sys.executable, "-m", "dpcl", "verify", str(certificate), "--json"], capture_output=True, text=True
    )
    try:
        verified = json.loads(verify.stdout)
    except ValueError:
        verified = {}
    private_expected = not declared_not_private
    return {
        "ok": refused is None and verify.returncode == 0 and verified.get("valid") is True
        and result.private is private_expected and verified.get("private") is private_expected,
        "private_run_refused": refused is None if declared_not_private else None,
        "refusal_error": refused,
        "seconds": round(seconds, 2),
        "device": result.metrics.get("device"),
        "epsilon": result.releases[0].cumulative_epsilon,
        "accuracy_task1": result.releases[0].accuracies[0],
        "verify_exit": verify.returncode,
        "verify_private": verified.get("private"),
        "private_expected": private_expected,
        "verify_stderr": verify.stderr.strip()[-300:],
    }


def _missing_data(config: Path) -> str | None:
    """Why ``config`` cannot run on this machine (its path dataset is absent, e.g. the fmnist configs without
    the Debian package dataset-fashion-mnist), else None."""
    import tomllib

    from dpcl.data.registry import missing_dataset_folder

    return missing_dataset_folder(tomllib.loads(config.read_text(encoding="utf-8")).get("stream", {}).get("dataset"))


def _script(args: list[str]) -> dict:
    start = time.perf_counter()
    proc = subprocess.run([sys.executable, *args], capture_output=True, text=True, cwd=ROOT)
    return {
        "ok": proc.returncode == 0,
        "exit": proc.returncode,
        "seconds": round(time.perf_counter() - start, 2),
        "stdout": proc.stdout.strip()[-4000:],
        "stderr": proc.stderr.strip()[-1000:],
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cuda", help="cuda or cuda:N (default cuda)")
    parser.add_argument("--out", default=None, help="directory for the run directories (default: a temporary one)")
    parser.add_argument("--configs", nargs="*", default=None, help="config files (default: every bundled config)")
    args = parser.parse_args()
    device = _cuda_device(args.device)
    if device is None:
        return 2
    import torch

    configs = [Path(c) for c in args.configs] if args.configs else sorted(CONFIGS.glob("*.toml"))
    base = Path(args.out) if args.out else Path(tempfile.mkdtemp(prefix="dpcl-check-gpu-"))
    report: dict = {"device": device, "gpu": torch.cuda.get_device_name(torch.device(device)),
                    "torch": torch.__version__, "configs": {}}
    from dpcl.progress import progress

    for config in progress(configs, desc="check_gpu configs", unit="config"):
        missing = _missing_data(config)
        report["configs"][config.name] = (
            {"ok": True, "skipped": missing} if missing else _run_config(config, base / config.stem, device)
        )
    report["tdp_kernel_check"] = _script([str(ROOT / "scripts" / "check_tdp_triton.py")])
    report["tdp_benchmark"] = _script([str(ROOT / "benchmarks" / "pecl_tdp.py"), "--device", "cuda"])
    print(json.dumps(report, indent=1))
    ok = all(r["ok"] for r in report["configs"].values()) and report["tdp_kernel_check"]["ok"]
    ok = ok and report["tdp_benchmark"]["ok"]
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
