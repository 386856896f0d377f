"""Naive fine-tuning's plan (Tobaben et al., Alg. A2), torch-free: ``[method] name = "naive"``.

One model trained further with DP-SGD on each task in turn. The model entering task t is a post-processing of
the releases of tasks < t, so D_t is read only by task t's DP-SGD: the same per-task event as PEFT Ensemble,
charged to task t alone. Across tasks its guarantee is therefore the same as PEFT Ensemble's (parallel: the
worst task; sequential: their composition) -- the carried-over weights add no privacy cost.
"""

from __future__ import annotations

from dpcl.guarantees.schedules import DPSGD_KEYS, DpSgdSpec

__all__ = ["NAIVE"]


NAIVE_ASSUMPTION = (
    "Naive fine-tuning starts task t from the previous release, a post-processing of earlier releases; "
    "task t's data is read only by task t's DP-SGD run."
)


#: ``[method] name = "naive"``
NAIVE = DpSgdSpec("naive", DPSGD_KEYS, False, NAIVE_ASSUMPTION, method_class="dpcl.methods.naive.method:NaiveFineTuning",
                  data_parallel=True, cost_estimator="dpcl.runner.method_costs:single_adapter_cost",
                  summary="one adapter and head fine-tuned with DP-SGD on each task in turn (Alg. A2)")
