"""The torch-free half of :mod:`dpcl.runner.threads`: the usable cores and how idle OpenMP threads wait.

It imports nothing but the standard library, so that :func:`dpcl.cli.main` can call
:func:`prefer_sleeping_threads` before any command imports torch without slowing the start of
the commands that never do.
"""

from __future__ import annotations

import os
import sys

__all__ = ["THREAD_ENV_VARS", "WAIT_ENV_VARS", "prefer_sleeping_threads", "usable_cores"]

#: Environment variables through which a user chooses the thread count; when one is set, dpcl leaves it.
THREAD_ENV_VARS = ("OMP_NUM_THREADS", "MKL_NUM_THREADS")

#: Environment variables through which a user chooses how idle OpenMP threads wait; when one is set, dpcl leaves it.
WAIT_ENV_VARS = ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT", "KMP_BLOCKTIME")


def usable_cores() -> int:
    """CPU cores this process may run on (its affinity mask where the OS has one, else ``os.cpu_count()``)."""
    try:
        return len(os.sched_getaffinity(0)) or 1
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def prefer_sleeping_threads() -> bool:
    """Set ``OMP_WAIT_POLICY=PASSIVE`` (idle OpenMP threads sleep) unless the user chose how they wait or torch is
    already imported (its OpenMP runtime has then read the environment); whether it was set. Child processes
    (``dpcl run --nproc``) inherit it."""
    if any(os.environ.get(name, "").strip() for name in WAIT_ENV_VARS) or "torch" in sys.modules:
        return False
    os.environ["OMP_WAIT_POLICY"] = "PASSIVE"
    return True
