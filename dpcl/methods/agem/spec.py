"""DP-SGD A-GEM's plan, torch-free: ``[method] name = "agem"``.

DP-SGD A-GEM (Chaudhry et al. 2019, A-GEM, eq. 11, with DP-SGD as in Lai et al., Sec. 6 "NaiveGaussian"): one
model fine-tuned as Naive; after task t a uniform sample of ``memory_per_task`` of its examples (indices drawn
with public randomness) joins an episodic memory. At every step of task t >= 1 the update direction is the
A-GEM projection of the step's DP-SGD gradient (Poisson sample of D_t at rate q_t = batch_size / n_t) against a
reference gradient: a Poisson sample of the memory at rate q_mem (``memory_sample_rate``, default q_t), clipped
to the same C and noised with the same sigma. The tasks hold disjoint units, so an example is in at most one of
the two sampled sets: per step every unit takes one subsampled Gaussian at rate max(q_t, q_mem) (its own set's
rate is no larger), and the projection is post-processing. One DP-SGD event of T_t steps at that rate per
task, calibrated to the per-task epsilon. A memory unit of task k is read again by every release t > k, so the
tasks are not independent releases: the spec refuses parallel composition (``across_tasks`` must be
``"sequential"``), and the stream's epsilon composes every task's steps.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Mapping

from dpcl.accounting.dpsgd import dpsgd_events
from dpcl.errors import ConfigError, UnsupportedEventError
from dpcl.guarantees.method_schema import MethodKey, TaskPlan, one_of, positive, positive_int
from dpcl.guarantees.schedules import (
    DPSGD_KEYS,
    DpSgdSpec,
    accountant_advice,
    calibrate_dpsgd,
    calibration_accountant_for,
    require_budget,
)
from dpcl.guarantees.settings import PrivacySettings, privacy_settings

__all__ = ["AGEM", "AGEM_KEYS", "AGemSpec"]


AGEM_KEYS: tuple[MethodKey, ...] = DPSGD_KEYS + (
    MethodKey("memory_per_task", int, 256, "examples of each task kept in the episodic memory after it is trained "
              "(a uniform sample, drawn with the public seed)", positive_int),
    MethodKey("memory_sample_rate", float, None, "Poisson sampling rate of the memory's reference batch at each step "
              "(default: the task's rate batch_size / n_t); the accounting charges max(task rate, memory rate) "
              "per step", positive),
    MethodKey("optimizer", str, "sgd", "'sgd' (A-GEM's projected SGD step, Chaudhry et al. 2019) or 'adam' (its "
              "per-coordinate scaling turns the projected direction; post-processing either way)", one_of("sgd", "adam")),
)


AGEM_ASSUMPTION = (
    "DP-SGD A-GEM keeps examples of earlier tasks in an episodic memory and reads them again at every later "
    "release, so every task's DP-SGD steps are composed for every unit (sequential composition over tasks). "
    "Tasks hold disjoint units, so at each step an example is in at most one of the two Poisson samples (the task's "
    "and the memory's); the A-GEM projection of the two noisy gradients is post-processing."
)


@dataclass(frozen=True)
class AGemSpec(DpSgdSpec):
    """DP-SGD A-GEM's plan: per task one DP-SGD event of ``T_t`` steps at rate ``max(q_t, q_mem)``, calibrated to
    the per-task epsilon; parallel composition over tasks is refused (memory units are read by later tasks)."""

    def memory_rate(self, method: Mapping[str, Any], q_task: float) -> float:
        """The memory's Poisson rate ``q_mem`` (``memory_sample_rate``, default the task's rate ``q_task``)."""
        rate = method.get("memory_sample_rate")
        if rate is None:
            return q_task
        rate = float(rate)
        if not 0 < rate <= 1:
            raise ConfigError(f"[method] memory_sample_rate must lie in (0, 1], got {rate!r}.")
        return rate

    def plan_task(
        self, method: Mapping[str, Any], privacy: "PrivacySettings | Mapping[str, Any]", n_examples: int,
        task_index: int,
    ) -> TaskPlan:
        across = privacy_settings(privacy).across_tasks
        if across != "sequential":
            raise ConfigError(
                f"[method] name = 'agem' reads the examples of its episodic memory again at every later task, so a "
                f"unit of task k is used by every release from k on and the tasks are not independent releases: "
                f"parallel composition over tasks (Tobaben et al., Thm 4.4) would understate epsilon. Set [privacy] "
                f"across_tasks = 'sequential' (got {across!r}); keep [stream] disjoint_units = true, which the "
                "per-step accounting needs (an example in at most one of the task's and the memory's samples)."
            )
        plan = super().plan_task(method, privacy, n_examples, task_index)
        if not plan.events:  # an empty task: nothing trained, nothing charged
            return plan
        eps, delta, adjacency, accountant = require_budget(privacy)
        q_task, steps = float(plan.noise["sample_rate"]), int(plan.noise["steps"])
        q_mem = self.memory_rate(method, q_task)
        if task_index == 0 or q_mem <= q_task:  # no memory yet, or the memory is read at most at the task's rate
            q_acc, calibration, event = q_task, None, plan.events[0]
        else:
            q_acc = q_mem
            try:
                calibration = calibrate_dpsgd(eps, delta, q_acc, steps,
                                               calibration_accountant_for(accountant, adjacency), adjacency.value)
            except UnsupportedEventError as exc:
                raise ConfigError(
                    f"[privacy] accountant = {accountant!r} cannot account task {task_index}'s DP-SGD A-GEM run "
                    f"(rate {q_acc:.6g}, {steps} steps): {exc} " + accountant_advice(accountant, adjacency)
                ) from None
            event = dpsgd_events(calibration.noise_multiplier, q_acc, steps, adjacency=adjacency.value, unit="example")
        noise = dict(plan.noise)
        if calibration is not None:
            noise.update(noise_multiplier=float(calibration.noise_multiplier), task_epsilon=float(calibration.epsilon),
                         calibration_accountant=calibration.accountant)
        noise.update(memory_sample_rate=q_mem if task_index > 0 else 0.0, accounted_sample_rate=q_acc)
        return dataclasses.replace(
            plan,
            events=(event,),
            noise=noise,
            notes=(
                *plan.notes,
                f"task {task_index}: DP-SGD A-GEM reference batches from the episodic memory at rate "
                f"{q_mem if task_index else 0.0:.6g}; every step is accounted at rate {q_acc:.6g} "
                f"(noise multiplier {noise['noise_multiplier']:.6g}).",
            ),
        )


#: ``[method] name = "agem"``
AGEM = AGemSpec("agem", AGEM_KEYS, False, AGEM_ASSUMPTION, method_class="dpcl.methods.agem.method:AGemFineTuning",
                cost_estimator="dpcl.runner.method_costs:agem_cost",
                summary="DP-SGD A-GEM: naive fine-tuning whose steps are projected against a noisy gradient of an "
                "episodic memory (Chaudhry et al. 2019)")
