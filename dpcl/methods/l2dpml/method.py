"""L2DP-ML (Lai et al., *Lifelong DP*, Alg. 1 / Alg. 2); its A-GEM baselines are :mod:`.baselines`.

Network (Sec. 4, Fig. 1): an auto-encoder layer ``h1 = theta1^T x`` stacked
with a network ``G`` whose last hidden layer ``h_pi`` feeds a linear output
layer ``W``. Training follows Alg. 2 with the soundness fixes derived in
:mod:`dpcl.guarantees.lifelong`:

* each task is split once into fixed disjoint batches
  (:func:`~dpcl.guarantees.lifelong.batch_partition`);
* **phase 1** (budget ``epsilon1``): for every batch the coefficients of the
  reconstruction polynomial (eq. 11, ``R(theta1) = <theta1 theta1^T, sym(A_B)>``)
  are computed once and perturbed once with Laplace noise of scale
  ``Delta_R / epsilon1``; ``theta1`` is trained by projected gradient descent on
  the noisy polynomials, its columns kept orthonormal (a retraction, i.e.
  post-processing), with the A-GEM projection against a memory batch;
* **phase 2** (budget ``epsilon2``): with the released ``theta1``, the features
  ``h_pi`` of each batch give the coefficients of the second-order Taylor
  polynomial of the logistic output loss (eq. 12, re-derived), perturbed once
  with Laplace noise of scale ``Delta_L / epsilon2``; the noisy quadratic term is
  projected to a PSD matrix plus a ridge (post-processing) and ``W`` is trained
  with A-GEM against memory batches;
* after the task, ``memory_batches_per_task`` of its batches (their *released*
  coefficients) enter the episodic memory; they are never recomputed, and the
  run checks (by digest) that they stay fixed and disjoint. A memory batch's
  output coefficients are a polynomial in the features of the ``theta1`` they
  were released under (``theta1_release``: the task whose auto-encoder release
  produced it); they are an A-GEM reference for ``W`` only while that ``theta1``
  is current (after a re-trained auto-encoder they describe features that no
  longer exist; projecting against them made new tasks collapse).

The released checkpoint (:meth:`L2DPMLMethod.state_dict`) holds the trained
weights and the memory's released coefficients; the privacy-unit ids of every
task and of every memory batch, and the memory digests (computed over those ids),
are curator state (:meth:`L2DPMLMethod.curator_state_dict`): the Laplace
releases do not cover them, and they are only needed for the disjointness and
fixed-memory checks of later tasks.

The hidden layers of ``G`` between ``h1`` and ``h_pi`` keep their seeded random
initialisation: training them on private data would read the data at every
step, which the two Laplace releases do not cover (the paper's Alg. 1 does
this; its proof does not cover it).

Baselines on the same streams (Sec. 6): :class:`AGEMClassifier` (non-private
A-GEM, Chaudhry et al. 2019) and :class:`DPSGDAGEMClassifier` ("NaiveGaussian":
DP-SGD through opacus for both the task gradient and the memory reference
gradient; its epsilon grows with the number of tasks and is computed by
:func:`dpcl.guarantees.lifelong.dpsgd_agem_epsilons`).
"""

from __future__ import annotations

import math
from typing import Any, Mapping

import numpy as np
import torch

from dpcl.errors import DisjointnessViolationError, InvalidParameterError, PrivacyViolationError
from dpcl.guarantees.lifelong import (
    INPUT_RANGES,
    Precondition,
    batch_partition,
    check_batch_partition,
    check_input_range,
    check_memory_fixed_disjoint,
    check_units,
    coefficient_digest,
    laplace_noise_scale,
    lifelong_bound,
    output_sensitivity,
    paper_output_sensitivity,
    paper_reconstruction_sensitivity,
    reconstruction_sensitivity,
)
from dpcl.methods.l2dpml.spec import L2DPML_KEYS
from dpcl.guarantees.method_schema import TaskPlan, method_value
from dpcl.methods.base import ContinualMethod, MethodSetup, ProgressCallback, TrainingData, TrainingTask
from dpcl.methods.gem import agem_project  # noqa: F401  (re-exported: A-GEM of Alg. 2 and the baselines)
from dpcl.methods.l2dpml.functional import (  # noqa: F401  (re-exported: the coefficient sums)
    _entry_digest,
    _orthonormal_columns,
    _psd_plus_ridge,
    _symmetric_laplace,
    output_coefficients,
    reconstruction_coefficients,
)

__all__ = [
    "L2DPMLMethod",
    "agem_project",
    "output_coefficients",
    "reconstruction_coefficients",
]

_DTYPE = torch.float64

#: ``plan.noise`` keys a private L2DP-ML plan must give (:meth:`L2DPMLSpec.plan_task`).
_PRIVATE_PLAN_KEYS = ("epsilon1", "epsilon2", "batch_size", "epochs", "memory_batches_per_task", "release_autoencoder")


# ---------------------------------------------------------------------------
# L2DP-ML
# ---------------------------------------------------------------------------
class L2DPMLMethod(ContinualMethod):
    """L2DP-ML with streaming fixed batches and A-GEM (Lai et al., Alg. 2), certified per release.

    ``setup.method`` holds the keys of :data:`dpcl.methods.l2dpml.spec.L2DPML_KEYS`;
    noise budgets come from the task's :class:`TaskPlan` (``epsilon1``,
    ``epsilon2``). Sensitivities ``Delta_R`` and ``Delta_L`` are computed by
    :mod:`dpcl.guarantees.lifelong` from the actual layer sizes.

    Computes in float64 on ``setup.device`` (any torch device). The seeded
    initialisation and the Laplace noise are drawn on the CPU and moved, so a
    run with reproducible noise draws the same initialisation and noise on
    every device (results then differ between devices only by float rounding
    of the linear algebra); checkpoints hold CPU tensors.
    """

    name = "l2dpml"

    def __init__(self, setup: MethodSetup) -> None:
        super().__init__(setup)
        self.require_encoder_features("encoder features in a declared box")
        m = dict(setup.method)
        self.hidden_sizes = [int(v) for v in m.get("hidden_sizes", [16, 16])]
        self.input_range = str(m.get("input_range", "unit"))
        if self.input_range not in INPUT_RANGES:
            raise InvalidParameterError(
                f"[method] input_range must be one of {', '.join(INPUT_RANGES)}, got {self.input_range!r}."
            )
        self.learning_rate = float(m.get("learning_rate", 0.5))
        self.ridge = float(m.get("ridge", 0.05))
        self.reference_gradient = str(m.get("reference_gradient", "memory_mean"))
        self.autoencoder_training = str(m.get("autoencoder_training", "every_task"))
        self.n_features = int(setup.input_dim)
        self.n_classes = len(self.label_space)
        self.device = torch.device(setup.device)
        gen = torch.Generator().manual_seed(int(setup.seed))  # on the CPU: the same initialisation on every device
        theta = torch.randn(self.n_features, self.hidden_sizes[0], generator=gen, dtype=_DTYPE)
        if self.hidden_sizes[0] > self.n_features:
            raise InvalidParameterError(
                f"[method] hidden_sizes[0] (|h1| = {self.hidden_sizes[0]}) must not exceed the input dimension "
                f"{self.n_features}: theta1 has orthonormal columns."
            )
        self.theta1 = _orthonormal_columns(theta).to(self.device)
        #: task whose auto-encoder release produced the current theta1 (-1: the seeded initialisation). The
        #: output coefficients of a memory batch are polynomials in the features of the theta1 they were
        #: computed with; they are valid A-GEM references only while that theta1 is the current one.
        self.theta1_release = -1
        #: Fixed random hidden layers of G (h1 -> ... -> h_pi); never trained on private data.
        self.hidden: list[tuple[torch.Tensor, torch.Tensor]] = []
        for fan_in, fan_out in zip(self.hidden_sizes[:-1], self.hidden_sizes[1:]):
            w = torch.randn(fan_in, fan_out, generator=gen, dtype=_DTYPE) * math.sqrt(2.0 / fan_in)
            b = (torch.rand(fan_out, generator=gen, dtype=_DTYPE) - 0.5) * 0.2
            self.hidden.append((w, b))
        self._hidden_digest = coefficient_digest(*[t.numpy() for layer in self.hidden for t in layer])
        self.hidden = [(w.to(self.device), b.to(self.device)) for w, b in self.hidden]
        self.n_head_features = self.hidden_sizes[-1] + 1  # + constant 1 (bias)
        self.W = torch.zeros(self.n_head_features, self.n_classes, dtype=_DTYPE, device=self.device)
        self.delta_r = reconstruction_sensitivity(self.n_features, self.input_range)
        self.delta_l = output_sensitivity(self.n_head_features, self.n_classes)
        self.memory: list[dict[str, Any]] = []
        #: privacy-unit ids of every task trained so far (curator state); None after a release-only restore
        self.seen_units: np.ndarray | None = np.zeros(0, dtype=np.int64)
        self.reports: dict[int, dict[str, Any]] = {}
        #: how tasks compose ("parallel" needs disjoint units across tasks); anything but an explicit
        #: "sequential" (e.g. an unresolved "auto") is held to the stricter parallel precondition
        self.across_tasks = "sequential" if setup.privacy.across_tasks == "sequential" else "parallel"

    # -- features --------------------------------------------------------
    def _head_features(self, x: torch.Tensor) -> torch.Tensor:
        """``[h_pi, 1]`` in ``[-1, 1]^(p+1)``: ``h1 = tanh(theta1^T x)`` then fixed tanh layers."""
        h = torch.tanh(x @ self.theta1)
        for w, b in self.hidden:
            h = torch.tanh(h @ w + b)
        return torch.cat([h, torch.ones(h.shape[0], 1, dtype=_DTYPE, device=h.device)], dim=1)

    def _hidden_digest_now(self) -> str:
        return coefficient_digest(*[t.detach().cpu().numpy() for layer in self.hidden for t in layer])

    def scores(self, features: np.ndarray) -> np.ndarray:
        x = torch.as_tensor(np.asarray(features, dtype=np.float64), device=self.device)
        return (self._head_features(x) @ self.W).cpu().numpy()

    # -- training ------------------------------------------------------
    def _rng(self, task_index: int, stream: int) -> np.random.Generator:
        """Seeded generator for the public choices (descent order, memory batches); never for noise."""
        return np.random.default_rng([int(self.setup.seed), int(task_index), stream])

    def _descend(self, param, grad_now, grad_memory, n_memory, order, rng, step_size, retract) -> torch.Tensor:
        """Projected gradient descent with the A-GEM projection (Alg. 2 lines 7-16).

        ``grad_memory(param, idx)`` returns the mean gradient over memory entries
        ``idx``: all of them (``reference_gradient = "memory_mean"``, A-GEM's
        reference on the whole episodic memory) or one random batch
        (``"random_batch"``, Alg. 2 line 11). Only released coefficients are read.
        """
        for i in order:
            g = grad_now(param, i)
            if n_memory:
                idx = (slice(None) if self.reference_gradient == "memory_mean"
                       else slice(j := int(rng.integers(n_memory)), j + 1))
                g = agem_project(g, grad_memory(param, idx))
            param = retract(param - step_size(i) * g)
        return param

    def _checked_task(self, task_index: int, data: TrainingData, batch_size: int
                      ) -> tuple[np.ndarray, tuple[np.ndarray, ...], list[Precondition]]:
        """A non-empty task's features, its fixed disjoint batches and the preconditions met (inputs inside the
        declared box, units disjoint as declared, the batches a partition); an unmet one raises."""
        n = len(data)
        x_np = np.asarray(data.features, dtype=np.float64)
        if x_np.shape[1] != self.n_features:
            raise InvalidParameterError(
                f"task {task_index} has {x_np.shape[1]} features but the method was built for {self.n_features}."
            )
        rng_check = check_input_range(x_np, self.input_range)
        if not rng_check.met:
            raise InvalidParameterError(
                f"task {task_index}: inputs must lie in the declared input_range {self.input_range!r} "
                f"{INPUT_RANGES[self.input_range]} ({rng_check.detail}); rescale the data, dpcl never clamps."
            )
        units = check_units(np.asarray(data.unit_ids), self.seen_units, across_tasks=self.across_tasks)
        if not units.met:
            raise DisjointnessViolationError(f"task {task_index}: {units.statement} is violated ({units.detail}).")
        batches = batch_partition(n, batch_size, seed=int(self.setup.seed) * 1000003 + task_index)
        partition = check_batch_partition(batches, n, batch_size)
        if not partition.met:  # pragma: no cover - batch_partition always yields a partition
            raise PrivacyViolationError(f"task {task_index}: {partition.detail}")
        return x_np, batches, [rng_check, units, partition]

    def learn_task(self, task: TrainingTask, progress: ProgressCallback | None = None) -> None:
        if self.seen_units is None:
            raise InvalidParameterError(
                "this l2dpml model was restored from a released checkpoint only: continuing the stream needs its "
                "curator state (privacy-unit ids of earlier tasks and memory batches); call "
                "load_curator_state_dict with the state curator_state_dict returned."
            )
        task_index, data = task.index, task.data
        noise = self._task_noise(task_index, task.plan)
        private = noise["epsilon1"] is not None
        n = len(data)
        batch_size = int(noise["batch_size"])
        epochs = int(noise["epochs"])
        preconditions: list[Precondition] = []
        if n:
            x_np, batches, preconditions = self._checked_task(task_index, data, batch_size)
            self._fit_batches(task_index, torch.as_tensor(x_np, device=self.device), data, batches, noise, epochs,
                              progress)
            self.seen_units = np.concatenate([self.seen_units, np.asarray(data.unit_ids, dtype=np.int64)])
        memory_check = check_memory_fixed_disjoint(
self.memory, [_entry_digest(e) for e in self.memory])
        if not memory_check.met:
            raise PrivacyViolationError(f"task {task_index}: {memory_check.statement} is violated ({memory_check.detail}).")
        hidden_fixed = self._hidden_digest_now() == self._hidden_digest
        preconditions += [
            memory_check,
            Precondition("fixed_hidden_layers", "hidden layers between h1 and h_pi are not trained on private data",
                         hidden_fixed, "parameter digest unchanged since initialisation"),
        ]
        if not private:
            self.reports[task_index] = {
                "private": False,
                "note": "[run] private = false: no Laplace noise was added; this release is not differentially "
                        "private and carries no Lifelong-DP bound.",
                "preconditions": [p.to_dict() for p in preconditions],
                "memory_batches": len(self.memory),
                "n_examples": n,
            }
            return
        theta_norm = float(self.theta1.abs().sum(dim=0).max())
        bound = lifelong_bound(
            float(noise["epsilon1"]), float(noise["epsilon2"]), n_features=self.n_features,
            hidden_size=self.hidden_sizes[0], batch_size=batch_size, theta1_norm=theta_norm,
        )
        self.reports[task_index] = {
            "lifelong_bound": bound.to_dict(),
            "preconditions": [p.to_dict() for p in preconditions],
            "preconditions_met": all(p.met for p in preconditions),
            "sensitivities": {
                "delta_R": self.delta_r, "delta_L": self.delta_l,
                "paper_delta_R": paper_reconstruction_sensitivity(self.n_features, self.hidden_sizes[0]),
                "paper_delta_L": paper_output_sensitivity(self.hidden_sizes[-1]),
                "layer_sizes": {"d": self.n_features, "h1": self.hidden_sizes[0], "h_pi": self.hidden_sizes[-1],
                                "K": self.n_classes},
            },
            "laplace_scales": {
                "reconstruction": laplace_noise_scale(float(noise["epsilon1"]), self.delta_r),
                "output": laplace_noise_scale(float(noise["epsilon2"]), self.delta_l),
            },
            "memory_batches": len(self.memory),
            "n_examples": n,
        }

    def _task_noise(self, task_index: int, plan: TaskPlan) -> Mapping[str, Any]:
        """The noise budgets and schedule of task ``task_index``.

        A private plan (from :data:`~dpcl.methods.l2dpml.spec.L2DPML_SPEC`; it has events, or gives
        ``epsilon1`` for an empty task) must give every key of :data:`_PRIVATE_PLAN_KEYS`. A plan without
        events and without budgets is a non-private run (``[run] private = false``): the same training on
        the exact coefficients, with the schedule read from the ``[method]`` section (``epsilon1`` None).
        """
        noise = plan.noise
        if plan.events or noise.get("epsilon1") is not None:
            missing = [key for key in _PRIVATE_PLAN_KEYS if noise.get(key) is None]
            if missing:
                raise InvalidParameterError(
                    f"a private l2dpml plan must give {', '.join(missing)} in its noise; got {dict(noise)!r}."
                )
            return noise
        if noise.get("epsilon2") is not None or noise.get("sigma") is not None:
            raise InvalidParameterError("a plan with noise but no privacy events is inconsistent; refusing to train.")
        v = {key: method_value(self.setup.method, L2DPML_KEYS, key, "l2dpml")
             for key in ("batch_size", "epochs", "memory_batches_per_task", "autoencoder_training")}
        return {
            "epsilon1": None,
            "epsilon2": None,
            "batch_size": int(v["batch_size"]),
            "epochs": int(v["epochs"]),
            "memory_batches_per_task": int(v["memory_batches_per_task"]),
            "release_autoencoder": v["autoencoder_training"] == "every_task" or task_index == 0,
        }

    def _fit_batches(self, task_index, x, data, batches, noise, epochs, progress) -> None:
        nb = len(batches)
        sizes = torch.as_tensor([len(b) for b in batches], dtype=_DTYPE, device=self.device)
        order_rng = self._rng(task_index, 2)
        ae = None
        if bool(noise["release_autoencoder"]):
            # Phase 1: one Laplace draw per batch on the reconstruction coefficients (epsilon1, Delta_R).
            noisy = reconstruction_coefficients(x, batches)
            if noise["epsilon1"] is not None:
                scale_r = laplace_noise_scale(float(noise["epsilon1"]), self.delta_r)
                noisy = noisy + _symmetric_laplace(self.noise_rng(task_index, 1), scale_r, nb, self.n_features,
                                                   self.device)
            ae = noisy / sizes[:, None, None]  # post-processing: per-example normalisation
            ae_norm = torch.linalg.matrix_norm(ae, ord=2).clamp(min=1e-12)
            mem = [e["ae"] for e in self.memory if e["ae"] is not None]
            mem_ae = torch.stack(mem) if mem else None
            order = np.concatenate([order_rng.permutation(nb) for _ in range(epochs)])
            self.theta1 = self._descend(
                self.theta1,
                lambda th, i: 2.0 * ae[i] @ th,
                lambda th, idx: 2.0 * (mem_ae[idx] @ th).mean(dim=0),
                0 if mem_ae is None else len(mem_ae), order, order_rng,
                lambda i: self.learning_rate / float(2.0 * ae_norm[i]),
                _orthonormal_columns,
            )
            self.theta1_release = int(task_index)
        if progress:
            progress(nb * epochs)
        # Phase 2: features from the released theta1; one Laplace draw per batch (epsilon2, Delta_L).
        h = self._head_features(x)
        y = torch.zeros(len(data), self.n_classes, dtype=_DTYPE, device=self.device)
        y[torch.arange(len(data), device=self.device),
          torch.as_tensor(self.label_positions(data.labels), device=self.device)] = 1.0
        b, q = output_coefficients(h, y, batches)
        if noise["epsilon2"] is not None:
            rng = self.noise_rng(task_index, 3)  # Laplace noise: OS entropy unless reproducible_noise
            scale_l = laplace_noise_scale(float(noise["epsilon2"]), self.delta_l)
            b = b + torch.as_tensor(rng.laplace(0.0, scale_l, size=tuple(b.shape)), dtype=_DTYPE, device=self.device)
            q = q + _symmetric_laplace(rng, scale_l, nb, self.n_head_features, self.device)
        # post-processing: PSD projection + ridge, per-example normalisation
        q_n = _psd_plus_ridge(q, self.ridge * sizes) / sizes[:, None, None]
        b_n = b / sizes[:, None, None]
        q_norm = torch.linalg.matrix_norm(q_n, ord=2).clamp(min=1e-12)
        # A-GEM reference of the output layer: only memory batches whose coefficients are polynomials in the
        # current features (released under the current theta1). After a new auto-encoder release the older
        # coefficients describe features that no longer exist; projecting against them is not A-GEM.
        valid = [e for e in self.memory if e.get("theta1_release", -1) == self.theta1_release]
        mem_b = torch.stack([e["b_n"] for e in valid]) if valid else None
        mem_q = torch.stack([e["q_n"] for e in valid]) if valid else None
        order = np.concatenate([order_rng.permutation(nb) for _ in range(epochs)])
        self.W = self._descend(
            self.W,
            lambda w, i: b_n[i] + q_n[i] @ w / 4.0,
            lambda w, idx: (mem_b[idx] + mem_q[idx] @ w / 4.0).mean(dim=0),
            len(valid), order, order_rng,
            lambda i: self.learning_rate / float(q_norm[i] / 4.0),
            lambda w: w,
        )
        if progress:
            progress(nb * epochs)
        # Episodic memory (Alg. 2 line 17): released coefficients of randomly chosen fixed batches.
        chosen = self._rng(task_index, 4).choice(nb, size=min(nb, int(noise["memory_batches_per_task"])),
                                                 replace=False)
        units = np.asarray(data.unit_ids)
        for i in np.sort(chosen):
            entry = {"task": task_index, "batch": int(i), "units": units[batches[i]].astype(np.int64),
                     "ae": None if ae is None else ae[i].clone(), "b_n": b_n[i].clone(), "q_n": q_n[i].clone(),
                     "theta1_release": self.theta1_release}
            entry["digest"] = _entry_digest(entry)
            self.memory.append(entry)

    def planned_work(self, plan: TaskPlan) -> int:
        return int(plan.noise.get("steps", 1))

    # -- certificates ----------------------------------------------------
    def certificate_extra(self, task_index: int) -> dict[str, Any]:
        """The Lifelong-DP bound of release ``task_index`` with its terms and checked preconditions."""
        if task_index not in self.reports:
            raise InvalidParameterError(f"task {task_index} has not been released by this l2dpml run.")
        return {"l2dpml": self.reports[task_index]}

    # -- state -----------------------------------------------------------
    #: memory-entry keys that are released (the rest, ``units`` and ``digest``, is curator state)
    _RELEASED_MEMORY_KEYS = ("task", "batch", "ae", "b_n", "q_n", "theta1_release")

    def state_dict(self) -> dict[str, Any]:
        """The release (CPU tensors): weights, the memory's released coefficients and the certified reports; no unit ids."""
        return {
            **self._base_state(),
            "theta1": self.theta1.cpu().clone(),
            "theta1_release": self.theta1_release,
            "hidden": [(w.cpu().clone(), b.cpu().clone()) for w, b in self.hidden],
            "W": self.W.cpu().clone(),
            "memory": [{k: (e[k].cpu().clone() if isinstance(e[k], torch.Tensor) else e[k])
                        for k in self._RELEASED_MEMORY_KEYS} for e in self.memory],
            "reports": dict(self.reports),
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore a release; continuing the stream also needs :meth:`load_curator_state_dict`."""
        self._load_base_state(state)
        self.theta1 = state["theta1"].to(self.device, copy=True)
        self.theta1_release = int(state.get("theta1_release", -1))
        self.hidden = [(w.to(self.device, copy=True), b.to(self.device, copy=True)) for w, b in state["hidden"]]
        if self._hidden_digest_now() != self._hidden_digest:
            raise InvalidParameterError("checkpoint hidden layers differ from this run's seeded initialisation.")
        self.W = state["W"].to(self.device, copy=True)
        self.memory = [{k: (e[k].to(self.device) if isinstance(e[k], torch.Tensor) else e[k])
                        for k in self._RELEASED_MEMORY_KEYS if k in e} for e in state["memory"]]
        self.seen_units = None  # until load_curator_state_dict
        self.reports = dict(state["reports"])

    def curator_state_dict(self) -> dict[str, Any]:
        """Privacy-unit ids (every task's, each memory batch's) and the memory digests: private, never released."""
        if self.seen_units is None:
            raise InvalidParameterError(
                "this l2dpml model has no curator state: load_curator_state_dict was not called."
            )
        return {
            "seen_units": torch.as_tensor(self.seen_units, dtype=torch.int64).clone(),
            "memory_units": [torch.as_tensor(np.asarray(e["units"], dtype=np.int64)) for e in self.memory],
            "memory_digests": [str(e["digest"]) for e in self.memory],
        }

    def load_curator_state_dict(self, state: Mapping[str, Any]) -> None:
        """Attach the unit ids and digests to the restored memory; they must match its released coefficients."""
        units = [np.asarray(torch.as_tensor(u), dtype=np.int64) for u in state["memory_units"]]
        digests = [str(d) for d in state["memory_digests"]]
        if len(units) != len(self.memory) or len(digests) != len(self.memory):
            raise InvalidParameterError(
                f"the curator state lists {len(units)} memory batches but the checkpoint holds {len(self.memory)}: "
                "it belongs to another release."
            )
        entries = [{**e, "units": u, "digest": d} for e, u, d in zip(self.memory, units, digests)]
        changed = [i for i, e in enumerate(entries) if _entry_digest(e) != e["digest"]]
        if changed:
            raise InvalidParameterError(
                f"memory batch(es) {changed} of the checkpoint do not match the curator state's digests: "
                "the curator state belongs to another release."
            )
        self.memory = entries
        self.seen_units = np.asarray(torch.as_tensor(state["seen_units"]), dtype=np.int64).copy()
