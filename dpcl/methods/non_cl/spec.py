"""Non-continual training's plan (Tobaben et al., Alg. A3), torch-free: ``[method] name = "non_cl"``.

At every release t a fresh model is trained with DP-SGD on the union D_1 u ... u D_t, so ``n_examples`` is the
size of that union and the release is charged to every task 1..t (``reuses_past_tasks``). A unit of D_1 is read
by all T releases: with disjoint units the stream's guarantee is the composition of every release's DP-SGD run
(the ledger groups the charges per task); with shared units the union can hold one unit several times and a
per-example accountant does not apply, so the ledger refuses it.
"""

from __future__ import annotations

from dpcl.guarantees.schedules import DPSGD_KEYS, DpSgdSpec

__all__ = ["NON_CL"]


NON_CL_ASSUMPTION = (
    "Non-CL retrains on the union of all tasks seen so far at every release; every release is charged to "
    "every task it read."
)


#: ``[method] name = "non_cl"``
NON_CL = DpSgdSpec("non_cl", DPSGD_KEYS, True, NON_CL_ASSUMPTION,
                   method_class="dpcl.methods.non_cl.method:NonContinualTraining", data_parallel=True,
                   cost_estimator="dpcl.runner.method_costs:single_adapter_cost",
                   summary="a fresh DP-SGD model on the union of the tasks so far at each release (Alg. A3)")
