"""Naive fine-tuning (Tobaben et al., Alg. A2): one model fine-tuned with DP-SGD on each task in turn.

Nothing counters forgetting (the lower reference). Each task's data is used only while that task is trained.
Its plan is :data:`dpcl.methods.naive.spec.NAIVE`.
"""

from __future__ import annotations

from dpcl.methods.single_model import SingleModelDPSGD

__all__ = ["NaiveFineTuning"]


class NaiveFineTuning(SingleModelDPSGD):
    """Alg. A2: keep fine-tuning one model with DP-SGD on each task in turn."""

    name = "naive"
    restart_each_release = False
