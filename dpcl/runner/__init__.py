"""Certified training runs: TOML config -> audit -> task stream -> method -> checkpoints, certificates, metrics.

:func:`run_training` is the engine of ``dpcl run`` (and ``dpcl demo``); see
:mod:`dpcl.runner.run` for the run directory layout and resume semantics.
Importing this package does not import torch.
"""

from dpcl.runner.run import RUN_KEYS, ReleaseSummary, RunResult, run_training

__all__ = ["RUN_KEYS", "ReleaseSummary", "RunResult", "run_training"]
