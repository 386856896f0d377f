"""L2DP-ML's plan (Lai et al., Lifelong DP, Alg. 2), torch-free: ``[method] name = "l2dpml"``.

The Lifelong-DP theory it rests on (sensitivities, the Thm 2 bound, run-time precondition checks) is
:mod:`dpcl.guarantees.lifelong`; this module holds the method's ``[method]`` keys and its per-task plan.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Mapping

from dpcl.accounting.events import Adjacency, LaplaceEvent
from dpcl.accounting.validation import check_count
from dpcl.errors import ConfigError
from dpcl.guarantees.label_space import EMPTY_TASK_RELEASE_KEY
from dpcl.guarantees.lifelong import INPUT_RANGES
from dpcl.guarantees.method_schema import (
    TORCH_DEVICE_FORMS,
    MethodKey,
    ReleaseCoverage,
    TaskPlan,
    method_value,
    nonnegative,
    one_of,
    open_unit_interval,
    positive,
    positive_int,
    torch_device,
)
from dpcl.guarantees.public_encoder import public_encoder_assumption
from dpcl.guarantees.settings import PrivacySettings, privacy_settings

__all__ = ["AUTOENCODER_TRAINING", "L2DPML_KEYS", "L2DPML_SPEC", "L2DPMLSpec", "REFERENCE_GRADIENTS"]


def _hidden_sizes(value: Any) -> str | None:
    ok = isinstance(value, list) and value and all(isinstance(v, int) and not isinstance(v, bool) and v >= 1
                                                    for v in value)
    return None if ok else "a non-empty list of integers >= 1 ([|h1|, ..., |h_pi|])"


REFERENCE_GRADIENTS = ("memory_mean", "random_batch")


AUTOENCODER_TRAINING = ("every_task", "first_task")


L2DPML_KEYS: tuple[MethodKey, ...] = (
    MethodKey("epsilon1_fraction", float, 0.5,
              "share of [privacy] epsilon given to the auto-encoder objective (epsilon1); the rest is epsilon2 "
              "for the output-layer objective", open_unit_interval),
    MethodKey("hidden_sizes", list, [16, 16],
              "[|h1|, ..., |h_pi|]: auto-encoder width |h1| then the widths of the fixed random hidden layers of "
              "the stacked network; the last is |h_pi|", _hidden_sizes),
    MethodKey("input_range", str, "unit",
              "declared box of every input feature: 'unit' = [0, 1], 'symmetric' = [-1, 1]; inputs outside it "
              "are refused, never clamped", one_of(*INPUT_RANGES)),
    MethodKey("batch_size", int, 512, "lambda: size of the fixed disjoint batches (Alg. 2 line 4)", positive_int),
    MethodKey("memory_batches_per_task", int, 1,
              "fixed batches of each finished task kept in the episodic memory (Alg. 2 line 17)", positive_int),
    MethodKey("epochs", int, 20, "passes over the fixed batches per task and phase (post-processing)", positive_int),
    MethodKey("learning_rate", float, 0.5, "step size of the projected gradient descent", positive),
    MethodKey("reference_gradient", str, "memory_mean",
              "A-GEM reference gradient: 'memory_mean' = mean over all memory batches (A-GEM's gradient on the whole "
              "episodic memory), 'random_batch' = one random memory batch per step (Alg. 2 line 11)",
              one_of(*REFERENCE_GRADIENTS)),
    MethodKey("autoencoder_training", str, "every_task",
              "'every_task' (Alg. 2): the auto-encoder is re-trained on every task (epsilon1 charged per task); "
              "'first_task': trained on task 0 only and frozen, so the output layer's memory coefficients stay "
              "valid (later tasks are charged epsilon2 only)", one_of(*AUTOENCODER_TRAINING)),
    MethodKey("ridge", float, 0.05,
              "ridge added to the (PSD-projected) noisy quadratic coefficients of the output objective, per "
              "example of the batch (post-processing)", nonnegative),
    MethodKey("device", str, "cpu", "torch device of the coefficient fits and descent (the Laplace noise is drawn "
              "on the CPU, so reproducible runs draw the same noise on every device): " + TORCH_DEVICE_FORMS,
              torch_device),
)


def _privacy_epsilon(settings: PrivacySettings) -> float:
    if settings.epsilon is None:
        raise ConfigError("[privacy] epsilon is required for l2dpml (the per-example Lifelong-DP budget).")
    return settings.epsilon


def _privacy_adjacency(settings: PrivacySettings) -> Adjacency:
    adjacency = Adjacency.parse(settings.adjacency)
    if adjacency is not Adjacency.REPLACE_ONE:
        raise ConfigError(
            "[privacy] adjacency must be 'replace_one' for l2dpml: the fixed batches are a partition of the task's "
            "positions, so only replacing an example keeps the other batches unchanged; got "
            f"{adjacency.value!r}."
        )
    return adjacency


ASSUMPTIONS: tuple[str, ...] = (
    "every input feature lies in the declared input_range (checked, never clamped)",
    "each task is split once into fixed disjoint batches by a public seeded permutation; each batch's "
    "coefficients get one independent Laplace draw per objective",
    "episodic-memory batches are fixed and disjoint: re-using their released coefficients is post-processing",
    "each privacy unit holds one example within a task (the Laplace sensitivities are per example); whether "
    "tasks share units, and so how tasks compose, is stated by the stream's composition assumption",
    "hidden layers between h1 and h_pi are fixed at their seeded initialisation (not trained on private data)",
)


#: Why an L2DP-ML checkpoint is covered by its charged Laplace releases.
L2DPML_RELEASE = ReleaseCoverage.post_processing(
    "The checkpoint holds the auto-encoder and output-layer weights minimised on the Laplace-perturbed polynomial "
    "objectives (functional mechanism) of the charged releases, episodic-memory re-use of released coefficients, "
    "and hidden layers fixed at their seeded initialisation: a post-processing of the charged Laplace releases."
)


@dataclass(frozen=True)
class L2DPMLSpec:
    """MethodSpec of ``[method] name = "l2dpml"`` (see :mod:`dpcl.guarantees.method_schema`).

    A task's events are two Laplace releases on the unit-sensitivity-normalised
    coefficient queries (scale ``1/epsilon1`` and ``1/epsilon2``, sensitivity 1,
    replace-one): the method multiplies the scales by ``Delta_R`` and
    ``Delta_L`` computed from its actual layer sizes. With
    ``autoencoder_training = "first_task"`` tasks after the first read no data
    for the auto-encoder and are charged the ``epsilon2`` release only. Batches are disjoint
    (parallel), epochs and memory re-use are post-processing, so nothing else is
    charged. ``reuses_past_tasks`` is False: later tasks read only released
    coefficients of earlier tasks, never their data.
    """

    name: str = "l2dpml"
    keys: tuple[MethodKey, ...] = L2DPML_KEYS
    reuses_past_tasks: bool = False
    method_class: str = "dpcl.methods.l2dpml.method:L2DPMLMethod"
    summary: str = "L2DP-ML (Lai et al., Lifelong DP): Laplace functional mechanism with an episodic memory (A-GEM)"
    cost_estimator: str = "dpcl.runner.method_costs:l2dpml_cost"

    def plan_task(
        self, method: Mapping[str, Any], privacy: "PrivacySettings | Mapping[str, Any]", n_examples: int, task_index: int
    ) -> TaskPlan:
        n = check_count("n_examples", n_examples, minimum=0)
        check_count("task_index", task_index, minimum=0)
        settings = privacy_settings(privacy)
        epsilon = _privacy_epsilon(settings)
        adjacency = _privacy_adjacency(settings)
        unit = settings.unit
        v = {k.name: method_value(method, L2DPML_KEYS, k.name, "l2dpml") for k in L2DPML_KEYS}
        for key in L2DPML_KEYS:
            if key.check is not None and (msg := key.check(v[key.name])) is not None:
                raise ConfigError(f"[method] {key.name} {msg}; got {v[key.name]!r}.")
        e1 = epsilon * float(v["epsilon1_fraction"])
        e2 = epsilon - e1
        n_batches = math.ceil(n / v["batch_size"]) if n else 0
        release_autoencoder = v["autoencoder_training"] == "every_task" or task_index == 0
        events = (
            *((LaplaceEvent(scale=1.0 / e1, sensitivity=1.0, adjacency=adjacency, unit=unit),)
              if release_autoencoder else ()),
            LaplaceEvent(scale=1.0 / e2, sensitivity=1.0, adjacency=adjacency, unit=unit),
        )
        task_epsilon = (e1 if release_autoencoder else 0.0) + e2
        return TaskPlan(
            events=events if n else (),
            noise={
                "epsilon1": e1,
                "epsilon2": e2,
                "release_autoencoder": release_autoencoder,
                "batch_size": int(v["batch_size"]),
                "n_batches": n_batches,
                "epochs": int(v["epochs"]),
                "steps": 2 * n_batches * int(v["epochs"]),
                "memory_batches_per_task": int(v["memory_batches_per_task"]),
                "input_range": v["input_range"],
                "hidden_sizes": list(v["hidden_sizes"]),
                "task_epsilon": task_epsilon,
                "certified_epsilon": e1 + e2,
                # Prop. F.1: an empty task reads no data and still releases a classifier (the previous one, a
                # post-processing of earlier releases, with the task's public output labels)
                EMPTY_TASK_RELEASE_KEY: "previous release (post-processing; no data read)",
            },
            # features of a [stream] encoder: the plan names the public encoder it relies on
            assumptions=ASSUMPTIONS + (
                (public_encoder_assumption(method["encoder"]),) if method.get("encoder") is not None else ()
            ),
            release=L2DPML_RELEASE,
            notes=(
                f"Lifelong DP (Lai et al., Thm 2, re-derived): epsilon1 + epsilon2 = {e1:.6g} + {e2:.6g} "
                f"= {e1 + e2:.6g}, delta = 0, replace-one, per {unit}; this task's examples: {task_epsilon:.6g}. "
                "Under parallel composition (tasks hold disjoint units) that bounds all releases of the stream "
                "together, whatever their number; under sequential composition the ledger composes every "
                "task's releases and states the larger total.",
                f"Thm 2 terms as certified: epsilon1 = {e1:.6g}, epsilon1/gamma_x = 0 (noisy inputs are never "
                f"released), epsilon1/gamma = 0 (noisy hidden features are never released), epsilon2 = {e2:.6g}; "
                "the paper's values of the two gamma terms, the preconditions and whether this run met them are in "
                "the method's per-release report (checkpoint state 'reports').",
                *(() if n else ("empty task: no data is read, no event is charged (a proper classifier is still "
                               "released)",)),
            ),
        )


#: The spec ``dpcl.guarantees.method_schema.get_method_spec("l2dpml")`` returns.
L2DPML_SPEC = L2DPMLSpec()
