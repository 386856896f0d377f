"""DP-SGD plans shared by the methods that train with DP-SGD, and the schedule helpers their specs use.

:class:`DpSgdSpec` is the :class:`~dpcl.guarantees.method_schema.MethodSpec` of a method that trains with
DP-SGD on each release's data (Naive, Non-CL; PEFT Ensemble and A-GEM extend it): Poisson sampling rate
q = batch_size / n_t, T = epochs * ceil(n_t / batch_size) steps, noise multiplier calibrated so that the
T-fold subsampled Gaussian meets the per-task epsilon (:func:`calibrated_dpsgd_task`). An empty task releases
the data-independent initialisation (or a post-processing of earlier releases) and is charged nothing.

Each method's own spec lives with the method, in ``dpcl/methods/<name>/spec.py`` (torch-free), and states
the event structure derived from its algorithm there. ``dpcl audit`` and ``dpcl run`` call the same plan.

Task sizes enter the plan through q and T; like every DP-SGD accountant (opacus included) the plan treats
them as public (:data:`TASK_SIZE_ASSUMPTION`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Mapping

from dpcl.accounting.dpsgd import dpsgd_events, dpsgd_noise_multiplier
from dpcl.accounting.events import Adjacency
from dpcl.errors import ConfigError, InvalidParameterError, UnsupportedEventError
from dpcl.guarantees.label_space import EMPTY_TASK_RELEASE_KEY
from dpcl.guarantees.public_encoder import public_encoder_assumption
from dpcl.guarantees.method_schema import (
    REQUIRED,
    TORCH_DEVICE_FORMS,
    MethodKey,
    ReleaseCoverage,
    TaskPlan,
    method_value,
    nonnegative_int,
    positive,
    positive_int,
    torch_device,
)
from dpcl.guarantees.settings import PrivacySettings, privacy_settings

__all__ = [
    "DEVICE_KEY",
    "DPSGD_ASSUMPTION",
    "DPSGD_KEYS",
    "DPSGD_RELEASE",
    "DpSgdSpec",
    "EMPTY_DPSGD_RELEASE",
    "TASK_SIZE_ASSUMPTION",
    "accountant_advice",
    "calibrate_dpsgd",
    "calibrated_dpsgd_task",
    "calibration_accountant_for",
    "check_task_size",
    "dpsgd_noise_record",
    "dpsgd_schedule",
    "require_budget",
]

TASK_SIZE_ASSUMPTION = (
    "Task sizes after label filtering are treated as public: they set the DP-SGD sampling rate "
    "q = batch_size / n_t and the number of steps, as in standard DP-SGD accounting."
)
DPSGD_ASSUMPTION = (
    "DP-SGD uses Poisson sampling at the planned rate, per-example clipping to max_grad_norm and Gaussian "
    "noise of standard deviation noise_multiplier * max_grad_norm on every step, including empty batches."
)
#: Why a checkpoint trained by DP-SGD is covered by its charged DP-SGD runs.
DPSGD_RELEASE = ReleaseCoverage.post_processing(
    "Every parameter in the checkpoint that saw private data was updated only by the charged DP-SGD steps (per-example "
    "clipped gradients plus Gaussian noise), starting from a data-independent initialisation or an earlier release: "
    "a post-processing of the charged DP-SGD runs."
)
#: An empty task's DP-SGD release: nothing is read, the initialisation (or the previous release) is released.
EMPTY_DPSGD_RELEASE = ReleaseCoverage.post_processing(
    "The task is empty after label filtering: the checkpoint is the data-independent initialisation or a "
    "post-processing of earlier releases; no private data of this task is read."
)


# -- key checks -------------------------------------------------------------------------------------------


DEVICE_KEY = MethodKey("device", str, "cpu", "torch device for training: " + TORCH_DEVICE_FORMS, torch_device)

DPSGD_KEYS: tuple[MethodKey, ...] = (
    MethodKey("epochs", int, REQUIRED, "passes over each task's data; steps = epochs * ceil(n / batch_size)",
              positive_int),
    MethodKey("batch_size", int, REQUIRED, "expected batch size; Poisson sampling rate q = batch_size / n",
              positive_int),
    MethodKey("max_grad_norm", float, REQUIRED, "per-example gradient clipping norm C of DP-SGD",
              positive),
    MethodKey("adapter_dim", int, 64, "bottleneck width of the residual adapter (0: train the head only)",
              nonnegative_int),
    MethodKey("learning_rate", float, 1e-3, "optimiser learning rate", positive),
    DEVICE_KEY,
)


def require_budget(privacy: "PrivacySettings | Mapping[str, Any]") -> tuple[float, float, Adjacency, str]:
    settings = privacy_settings(privacy)
    for name, value in (("epsilon", settings.epsilon), ("delta", settings.delta)):
        if value is None:
            raise ConfigError(f"[privacy] {name} is required.")
    return settings.epsilon, settings.delta, Adjacency.parse(settings.adjacency), settings.accountant


def check_task_size(n_examples: Any) -> int:
    if isinstance(n_examples, bool) or not isinstance(n_examples, int) or n_examples < 0:
        raise InvalidParameterError(f"n_examples must be an integer >= 0, got {n_examples!r}.")
    return n_examples


def dpsgd_schedule(n_examples: int, batch_size: int, epochs: int, task_index: int) -> tuple[float, int]:
    """Sampling rate q = batch_size / n and steps T = epochs * ceil(n / batch_size) of one task."""
    if batch_size > n_examples:
        raise ConfigError(
            f"[method] batch_size = {batch_size} exceeds the size of task {task_index} "
            f"({n_examples} examples after label filtering): the Poisson sampling rate batch_size / n must be "
            f"<= 1. Use batch_size <= {n_examples}."
        )
    return batch_size / n_examples, epochs * math.ceil(n_examples / batch_size)


def calibrate_dpsgd(eps: float, delta: float, q: float, steps: int, accountant: str, adjacency: str):
    """DP-SGD calibration; tasks of equal size share one calibration through
    :data:`dpcl.accounting.dpsgd.CALIBRATION_MEMO` (keyed on every input, under every accountant)."""
    return dpsgd_noise_multiplier(eps, delta, q, steps, accountant=accountant, adjacency=adjacency)


def calibration_accountant_for(accountant: str, adjacency: Adjacency) -> str:
    """Accountant used to calibrate DP-SGD noise: the configured one (``auto``: the tightest sound bound of
    :func:`dpcl.accounting.accountants.compute_epsilon`, which under replace-one is PLD, the only accountant
    with a sound replace-one analysis of Poisson subsampling)."""
    return accountant


def accountant_advice(accountant: str, adjacency: Adjacency) -> str:
    """What to change when the configured accountant cannot calibrate a task's DP-SGD run.

    Never suggests the accountant that just failed: under replace-one only PLD applies (so
    'pld'/'auto'); under add/remove 'auto' tries every sound accountant and keeps the tightest.
    """
    if accountant == "auto" or (accountant == "pld" and adjacency is Adjacency.REPLACE_ONE):
        return "Change the budget (epsilon, delta) or the schedule (epochs, batch_size)."
    if adjacency is Adjacency.REPLACE_ONE:
        return "Set [privacy] accountant = 'pld' or 'auto'."
    return (
        "Set [privacy] accountant = 'auto' (it uses the tightest accountant that applies), "
        "or change the budget (epsilon, delta) or the schedule (epochs, batch_size)."
    )


def dpsgd_noise_record(
    calibration: Any, q: float, steps: int, max_grad_norm: float, *, empty_task_release: str
) -> dict[str, Any]:
    """A calibrated DP-SGD task's ``noise`` record in its plan (what training reads and the certificate states);
    ``empty_task_release`` is what an empty task of this method releases instead (Prop. F.1)."""
    return {
        "noise_multiplier": float(calibration.noise_multiplier),
        "sample_rate": q,
        "steps": steps,
        "max_grad_norm": max_grad_norm,
        "task_epsilon": float(calibration.epsilon),
        "calibration_accountant": calibration.accountant,
        EMPTY_TASK_RELEASE_KEY: empty_task_release,
    }


def calibrated_dpsgd_task(
    n: int, batch_size: int, epochs: int, task_index: int, eps: float, delta: float, adjacency: Adjacency,
    accountant: str,
) -> tuple[float, int, Any, Any]:
    """One task's DP-SGD run, calibrated to (eps, delta): sampling rate q, steps, the calibration and its event.

    An accountant that cannot account the run raises :class:`ConfigError` naming the task and what to change.
    """
    q, steps = dpsgd_schedule(n, batch_size, epochs, task_index)
    try:
        calibration = calibrate_dpsgd(eps, delta, q, steps, calibration_accountant_for(accountant, adjacency),
                                       adjacency.value)
    except UnsupportedEventError as exc:
        raise ConfigError(
            f"[privacy] accountant = {accountant!r} cannot account task {task_index}'s DP-SGD run "
            f"(q={q:.6g}, {steps} steps, {adjacency.value!r} adjacency, epsilon={eps:g}, delta={delta:g}): {exc} "
            + accountant_advice(accountant, adjacency)
        ) from None
    event = dpsgd_events(calibration.noise_multiplier, q, steps, adjacency=adjacency.value, unit="example")
    return q, steps, calibration, event


@dataclass(frozen=True)
class DpSgdSpec:
    """A method that trains with DP-SGD on each release's data (PEFT Ensemble, Naive, Non-CL, A-GEM).

    ``method_class`` names the method's ``ContinualMethod`` (``"module:Class"``, imported only by ``dpcl run``);
    ``data_parallel`` says whether ``dpcl run --nproc N`` may split its DP-SGD steps over N processes (the
    method trains one model whose per-task state is the plan's DP-SGD run alone).
    """

    name: str
    keys: tuple[MethodKey, ...]
    reuses_past_tasks: bool
    assumption: str
    method_class: str = ""
    data_parallel: bool = False
    #: one line on what the method does (``dpcl methods``)
    summary: str = ""
    #: ``"module:function"`` of its training-cost estimate (``dpcl audit``); empty: none
    cost_estimator: str = ""

    def plan_task(
        self, method: Mapping[str, Any], privacy: "PrivacySettings | Mapping[str, Any]", n_examples: int, task_index: int
    ) -> TaskPlan:
        n = check_task_size(n_examples)
        eps, delta, adjacency, accountant = require_budget(privacy)
        epochs = int(method_value(method, self.keys, "epochs", self.name))
        batch_size = int(method_value(method, self.keys, "batch_size", self.name))
        max_grad_norm = float(method_value(method, self.keys, "max_grad_norm", self.name))
        encoder = public_encoder_assumption(method.get("encoder"), raw_features=bool(method.get("raw_features")))
        assumptions = (encoder, DPSGD_ASSUMPTION, TASK_SIZE_ASSUMPTION,
                       self.assumption)
        if n == 0:
            return TaskPlan(
                events=(),
                noise={EMPTY_TASK_RELEASE_KEY: "initialisation", "steps": 0, "max_grad_norm": max_grad_norm},
                assumptions=assumptions,
                notes=(f"task {task_index} is empty after label filtering: the data-independent initialisation "
                       "is released (Prop. F.1) and nothing is charged.",),
                release=EMPTY_DPSGD_RELEASE,
            )
        q, steps, calibration, event = calibrated_dpsgd_task(
            n, batch_size, epochs, task_index, eps, delta, adjacency, accountant
        )
        return TaskPlan(
            events=(event,),
            noise=dpsgd_noise_record(calibration, q, steps, max_grad_norm, empty_task_release="initialisation"),
            assumptions=assumptions,
            release=DPSGD_RELEASE,
            notes=(
                f"task {task_index}: DP-SGD on {n} examples, q={q:.6g}, {steps} steps, noise multiplier "
                f"{calibration.noise_multiplier:.6g} -> epsilon={calibration.epsilon:.6g} at delta={delta:.3g} "
                f"({calibration.accountant}).",
            ),
        )
