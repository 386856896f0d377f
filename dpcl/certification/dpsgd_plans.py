"""DP-SGD schedules of a Certifier: a plan is charged before the first step, and every step taken is checked
against it before its update is applied.

DP-SGD schedules (crash safety for step-wise training). :meth:`CertifierTask.plan_dpsgd`
charges a whole planned schedule (noise multiplier, sample rate, steps) before the
first step; :meth:`CertifierTask.record_dpsgd_steps` then checks every step taken
against that charge *before* the step's update is applied (the opacus accountant of
:mod:`dpcl.integrations.opacus` calls it from opacus' step hook). A step with less
noise or a higher sample rate than planned, or beyond the planned count, raises
:class:`UnchargedStepError` (nothing recorded). A release reports the recorded and
charged steps; the certificate accounts the full charge (conservative when training
stopped early). Steps are recorded in memory only: after a crash, rerun the task and
plan it again, which charges it again (conservative: the interrupted attempt may
have leaked).
"""

from __future__ import annotations

from typing import Any

from dpcl.accounting.events import PoissonSampledGaussianEvent, RepeatedEvent
from dpcl.accounting.validation import check_count, check_positive_scalar, check_sample_rate
from dpcl.guarantees.ledger import Charge
from dpcl.certification.arguments import _task_index
from dpcl.certification.records import PlannedSteps, UnchargedStepError


class DpsgdPlans:
    """The DP-SGD plans of :class:`~dpcl.certifier.Certifier` (a mixin)."""

    def plan_dpsgd(
        self,
        task: int,
        *,
        noise_multiplier: float,
        sample_rate: float,
        steps: int,
        unit_ids: Any = None,
    ) -> Charge:
        """Charge a DP-SGD schedule (``steps`` Poisson-subsampled Gaussian steps) to ``task`` before training.

        The steps then taken are checked against it by :meth:`record_dpsgd_steps`.
        """
        t = _task_index(task, self.n_tasks)
        z = check_positive_scalar("noise_multiplier", noise_multiplier)
        q = check_sample_rate("sample_rate", sample_rate)
        n = check_count("steps", steps)
        step = PoissonSampledGaussianEvent(
            noise_multiplier=z, sample_rate=q, adjacency=self.ledger.adjacency, unit=self.ledger.unit
        )
        charge = self.charge(t, RepeatedEvent(step, n), unit_ids=unit_ids,
                             label=f"{self.method} task {t}: DP-SGD plan, {n} steps")
        self._plans.setdefault(t, []).append(PlannedSteps(noise_multiplier=z, sample_rate=q, charged=n))
        return charge

    def record_dpsgd_steps(self, task: int, *, noise_multiplier: float, sample_rate: float, count: int = 1) -> None:
        """Record ``count`` DP-SGD steps of ``task`` taken at (``noise_multiplier``, ``sample_rate``).

        Call it before the steps' updates are applied. Every step must take a free slot of a plan charged
        with :meth:`plan_dpsgd` whose step it is dominated by (at least as much noise, at most the planned
        sample rate); otherwise :class:`UnchargedStepError` is raised and nothing is recorded. Matching each
        step to a distinct charged step that dominates it is sound: adaptive composition of dominated
        mechanisms is dominated by the composition of the dominating ones, whatever their order.
        """
        t = _task_index(task, self.n_tasks)
        z = check_positive_scalar("noise_multiplier", noise_multiplier)
        q = check_sample_rate("sample_rate", sample_rate)
        n = check_count("count", count)
        plans = self._plans.get(t, [])
        if not plans:
            raise UnchargedStepError(
                f"task {t} takes a DP-SGD step (noise multiplier {z:g}, sample rate {q:g}) but no schedule was "
                "charged for it in this process: call plan_dpsgd (or attach the opacus accountant with its "
                "epochs or steps) before training, so that the ledger holds the budget before it is spent."
            )
        remaining, take = n, []
        for i, plan in enumerate(plans):
            free = plan.charged - plan.recorded
            if free <= 0 or not plan.covers(z, q):
                continue
            used = min(free, remaining)
            take.append((i, used))
            remaining -= used
            if remaining == 0:
                break
        if remaining:
            charged = sum(p.charged for p in plans)
            recorded = sum(p.recorded for p in plans)
            raise UnchargedStepError(
                f"task {t}: {n} DP-SGD step(s) at noise multiplier {z:g} and sample rate {q:g} exceed the charged "
                f"schedule ({recorded} of {charged} charged steps recorded; plans: "
                + ", ".join(f"{p.charged} steps at z={p.noise_multiplier:g}, q={p.sample_rate:g}" for p in plans)
                + "). The step is refused before its update; charge more steps with plan_dpsgd first."
            )
        for i, used in take:
            plans[i].recorded += used

    def planned_steps(self, task: int) -> tuple[PlannedSteps, ...]:
        """The DP-SGD plans charged for ``task`` in this process, with the steps recorded against them."""
        return tuple(self._plans.get(_task_index(task, self.n_tasks), ()))
