"""Non-continual training (Tobaben et al., Alg. A3): at each release a fresh model trained with DP-SGD on the
union of all tasks seen so far.

This reuses past tasks' data (its spec says ``reuses_past_tasks``), so the runner hands it the union and the
ledger composes every release that touched a task's data. It is the upper reference, not a
continual-learning method. Its plan is :data:`dpcl.methods.non_cl.spec.NON_CL`.
"""

from __future__ import annotations

from dpcl.methods.single_model import SingleModelDPSGD

__all__ = ["NonContinualTraining"]


class NonContinualTraining(SingleModelDPSGD):
    """Alg. A3: a fresh model trained with DP-SGD on the union of the tasks seen so far, at every release."""

    name = "non_cl"
    restart_each_release = True
