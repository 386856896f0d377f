"""torch's CPU threads: at most the cores this process may run on, and idle threads that sleep.

dpcl's default, where a run starts (``dpcl run``, ``python -m dpcl run``, ``dpcl demo``,
``dpcl audit-run`` and :func:`dpcl.runner.run_training`):

* **threads**: torch's intra-op pool is lowered to :func:`usable_cores` (the process's CPU
  affinity mask: ``taskset``, cgroup cpusets, a batch system's core allocation), never raised.
  torch alone sizes it from the machine's physical cores, so a process allowed on 2 of 64
  cores would start 64 threads fighting over 2 cores;
* **waiting**: idle OpenMP worker threads sleep (``OMP_WAIT_POLICY=PASSIVE``) instead of
  spinning for about 300,000 iterations after every parallel operation (GNU OpenMP's default).
  Spinning threads take processor time from every other job on a shared machine, and from
  the run's own thread that still has work: a short ``dpcl run`` of Split Fashion-MNIST on
  a loaded 2-core machine took 1.8 to 4.4 times as long with 2 spinning threads as with 1
  thread, and 0.84 to 1.11 times with 2 sleeping ones (1.1 to 1.2 times against jobs that
  never sleep; ``benchmarks/THREADS.md``, ``benchmarks/README.md``); on 2 idle cores a DP-SGD loop of the same shapes ran 1.4 to 1.5
  times faster with 2 threads than with 1.
  OpenMP reads this setting once, when torch loads it, so :func:`prefer_sleeping_threads` sets
  it only before torch is first imported (:func:`dpcl.cli.main`, and the first stage of
  :func:`dpcl.runner.run_training`, which ``dpcl audit-run`` shares, call it first thing).

The user's choice is kept: ``OMP_NUM_THREADS`` (or ``MKL_NUM_THREADS``) in the environment, or a
lower count set with ``torch.set_num_threads`` before the run, fixes the thread count;
``OMP_WAIT_POLICY``, ``GOMP_SPINCOUNT`` or ``KMP_BLOCKTIME`` fixes the waiting.

The thread count is fixed per process by the affinity mask and the user's settings, never by
the machine's load: torch splits a large reduction into one part per thread, so the count can
change the last bits of a float result (a sum of 10⁷ float32 numbers differs between 1 and 2
threads), and a count chosen from the load would make numbers depend on the load. A run's
floats can therefore differ in their last bits between processes allowed on different numbers
of cores (as between CPUs whose BLAS takes other code paths); the load alone changes nothing.
The seeded ``fmnist_naive.toml`` checkpoints were the same bytes with 1 and 2 threads. How idle threads wait changes no result. Even sleeping, 2 threads are at best about as fast as 1 on a
machine whose cores are busy with other jobs (slower in some measurements), since every
parallel operation waits until both of its threads have been scheduled: there
``OMP_NUM_THREADS=1`` is the safe choice.

A training loop of one's own that uses dpcl's library API (:class:`dpcl.Certifier`, the opacus
accountant, :mod:`dpcl.methods`) gets torch's own defaults: dpcl changes neither threads nor
waiting there. Call :func:`prefer_sleeping_threads` before ``import torch`` and
:func:`use_usable_cores` after it for dpcl's default, or set the environment variables above.

This module imports torch only inside :func:`use_usable_cores`.
"""

from __future__ import annotations

import os

# the torch-free half lives in dpcl._threads, which the command line imports before anything else
from dpcl._threads import THREAD_ENV_VARS, WAIT_ENV_VARS, prefer_sleeping_threads, usable_cores

__all__ = ["THREAD_ENV_VARS", "WAIT_ENV_VARS", "prefer_sleeping_threads", "usable_cores", "use_usable_cores"]


def use_usable_cores() -> int:
    """Cap torch's intra-op threads at :func:`usable_cores` unless the user chose a count; the count in effect."""
    import torch  # noqa: PLC0415 - only where torch work starts

    if any(os.environ.get(name, "").strip() for name in THREAD_ENV_VARS):
        return torch.get_num_threads()
    cores = usable_cores()
    if torch.get_num_threads() > cores:
        torch.set_num_threads(cores)
    return torch.get_num_threads()
