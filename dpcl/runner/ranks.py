"""Which process of a ``torch.distributed`` process group may write a run directory (rank 0 only).

Below both :mod:`dpcl.runner.run` (which refuses to start on another rank) and :mod:`dpcl.runner.distributed`
(which runs :func:`~dpcl.runner.run.run_training` on rank 0), so neither imports the other in a circle.
"""

from __future__ import annotations

from dpcl.errors import InvalidParameterError

__all__ = ["refuse_on_other_ranks"]


def refuse_on_other_ranks() -> None:
    """Raise unless this process may write a run directory: no process group, or rank 0 of it.

    :func:`~dpcl.runner.run.run_training` calls it before anything is written, so a user script that calls it on
    every rank of a process group gets a clear error instead of several writers of one ledger.
    """
    try:
        import torch.distributed as dist
    except ModuleNotFoundError:  # no torch: run_training reports the missing training extra
        return
    if dist.is_available() and dist.is_initialized() and dist.get_rank() != 0:
        raise InvalidParameterError(
            f"run_training was called on rank {dist.get_rank()} of a torch.distributed process group: only rank 0 "
            "writes the ledger, checkpoints and certificates. Start the run with `dpcl run --nproc N` or `torchrun "
            "... -m dpcl run`, or call dpcl.runner.distributed.run_under_torchrun on every rank."
        )
