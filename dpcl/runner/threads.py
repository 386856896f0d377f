"""torch's intra-op threads: at most the CPU cores this process may run on.

torch sizes its intra-op pool from the machine (its physical cores), not from
the process's CPU affinity mask (``taskset``, cgroup cpusets, a batch system's
core allocation). A process allowed on 2 of 64 cores would start 64 threads
fighting over 2 cores: DP-SGD's many small kernels then spend their time
waiting for each other. :func:`use_usable_cores` lowers the pool to
:func:`usable_cores` once, where a run starts torch work, and never raises it:

* ``OMP_NUM_THREADS`` (or ``MKL_NUM_THREADS``) set in the environment is the
  user's choice and is kept as it is;
* a count the caller already set with ``torch.set_num_threads`` that is not
  above the usable cores is kept (a test suite's workers sharing the cores set 1).

This module imports torch only inside :func:`use_usable_cores`.
"""

from __future__ import annotations

import os

__all__ = ["THREAD_ENV_VARS", "usable_cores", "use_usable_cores"]

#: Environment variables through which a user chooses the thread count; when one is set, dpcl leaves it.
THREAD_ENV_VARS = ("OMP_NUM_THREADS", "MKL_NUM_THREADS")


def usable_cores() -> int:
    """CPU cores this process may run on (its affinity mask where the OS has one, else ``os.cpu_count()``)."""
    try:
        return len(os.sched_getaffinity(0)) or 1
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def use_usable_cores() -> int:
    """Cap torch's intra-op threads at :func:`usable_cores` unless the user chose a count; the count in effect."""
    import torch  # noqa: PLC0415 - only where torch work starts

    if any(os.environ.get(name, "").strip() for name in THREAD_ENV_VARS):
        return torch.get_num_threads()
    cores = usable_cores()
    if torch.get_num_threads() > cores:
        torch.set_num_threads(cores)
    return torch.get_num_threads()
