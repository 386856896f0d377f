"""Lifelong DP of L2DP-ML (Lai et al., *Lifelong DP*, paper 004): sensitivities, noise, bound, plan.

L2DP-ML stacks an auto-encoder (parameters ``theta1``, hidden layer ``h1``)
under a multi-layer network whose output layer (``h_pi`` -> class scores) is
trained on a perturbed objective. Both objectives are replaced by Taylor
polynomials (eq. 11, 12) whose data-dependent coefficients are perturbed once
with Laplace noise (the functional mechanism, Zhang et al. 2012) at budgets
``epsilon1`` and ``epsilon2`` (Alg. 1 line 1). Each task is split into fixed,
disjoint batches (Alg. 2 line 4); one batch per task is kept in the episodic
memory and re-used, unchanged, for the A-GEM reference gradient.

What the paper states and what holds (derived here; see ``docs/l2dpml.md``):

1. **Coefficients and sensitivity of the reconstruction objective.** Eq. 11 is
   ``R(theta1) = sum_r sum_s theta1_s (1/2 - x_rs) h_r`` with ``h_r = theta1^T x_r``.
   Its coefficients are not ``x`` and ``h`` (``h`` depends on ``theta1``): with
   ``G = theta1 theta1^T`` it is ``R = <G, A>``, ``A_sj = sum_r x_rj (1/2 - x_rs)``,
   and only the symmetric part of ``A`` matters. The released coefficients are
   the upper triangle of ``sym(A)``: diagonal ``u/2 - u^2``, off-diagonal
   ``(u + v)/4 - u v`` per example. Their l1 sensitivity under replace-one is
   the sum of the ranges of these per-example terms over the input box
   (:func:`reconstruction_sensitivity`); for inputs in ``[0, 1]^d`` it is
   ``9d/16 + 3d(d-1)/8``, for ``[-1, 1]^d`` ``25d/16 + 5d(d-1)/4``. The paper's
   ``d(|h1| + 2)`` (:func:`paper_reconstruction_sensitivity`) bounds a
   different, theta-dependent quantity; it is reported, never used.
2. **Output objective.** The second-order Taylor polynomial of the logistic
   loss, ``sum_k W_k^T b_k + (1/8) W_k^T Q W_k`` with ``b_k = sum_r (1/2 - y_rk)
   h_r`` and ``Q = sum_r h_r h_r^T`` (features ``h in [-1, 1]^p`` incl. a
   constant 1), has l1 sensitivity ``K p + p^2`` (:func:`output_sensitivity`),
   not the paper's ``2|h_pi|`` (which ignores the K classes and the quadratic
   coefficients).
3. **One noise draw per batch, independent across batches.** Alg. 2 uses one
   draw of noise for *all* batches. Then the difference of two batches' noisy
   coefficients is noise-free and reveals the difference of their exact
   statistics, so no epsilon holds. dpcl draws independent noise for every
   fixed batch; batches are disjoint, so by parallel composition the release of
   all batches' coefficients of a task is ``epsilon1`` (resp. ``epsilon2``)-DP.
4. **The terms epsilon1/gamma_x and epsilon1/gamma.** They charge the release
   of the noisy inputs ``x_bar`` and noisy hidden features ``h_bar`` (Lemma 2,
   3 of Phan et al. 2020) with ``gamma_x = Delta_R / |B|`` and ``gamma = 2
   Delta_R / (|B| ||theta1||_{1,1})``. dpcl never releases either: the inputs
   and features enter only through the coefficient sums, whose sensitivity
   covers every input in the declared box. Those two terms are therefore 0 in
   the certified bound; their paper values are reported
   (:func:`lifelong_bound`). Had the noisy inputs been released with
   independent per-example noise, their true cost would be ``d w epsilon1 /
   gamma_x`` (w = width of the input range), not ``epsilon1 / gamma_x``
   (:func:`noisy_input_epsilon`); with the paper's shared noise vector it is
   unbounded.
5. **Composition.** The head's coefficients are computed with the feature map of
   the already released ``theta1`` (adaptive sequential composition: ``epsilon1 +
   epsilon2`` per task). Training epochs, the A-GEM projection and every later
   re-use of a memory batch are post-processing of released coefficients.
   Tasks hold disjoint examples, so across tasks the composition is parallel:
   every release ``theta^1..theta^m`` together is ``(epsilon1 + epsilon2)``-DP for
   each example, whatever ``m`` (the Lifelong-DP claim of Thm 2, soundly).

Preconditions that the run must meet (checked at run time by
:mod:`dpcl.methods.l2dpml.method` with the functions here; the method's plan is
:data:`dpcl.methods.l2dpml.spec.L2DPML_SPEC`): inputs inside the declared
box (never clamped), batches a fixed partition of the task, memory batches
fixed (same indices, same noisy coefficients) and disjoint, one example per
privacy unit, tasks holding disjoint units, hidden layers between ``h1`` and
``h_pi`` not trained on private data.

This module is numpy only (no torch).
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

import numpy as np

from dpcl.accounting.accountants import compute_epsilon
from dpcl.accounting.events import Adjacency, ComposedEvent, PoissonSampledGaussianEvent, RepeatedEvent
from dpcl.accounting.validation import check_count, check_positive
from dpcl.errors import InvalidParameterError

__all__ = [
    "INPUT_RANGES",
    "LifelongBound",
    "Precondition",
    "batch_partition",
    "check_batch_partition",
    "check_input_range",
    "check_memory_fixed_disjoint",
    "check_units",
    "coefficient_digest",
    "dpsgd_agem_epsilons",
    "dpsgd_agem_unit_events",
    "laplace_noise_scale",
    "lifelong_bound",
    "noisy_input_epsilon",
    "output_sensitivity",
    "paper_output_sensitivity",
    "paper_reconstruction_sensitivity",
    "reconstruction_coefficient_ranges",
    "reconstruction_sensitivity",
]

#: Declared input boxes: name -> (low, high) of every feature.
INPUT_RANGES: dict[str, tuple[float, float]] = {"unit": (0.0, 1.0), "symmetric": (-1.0, 1.0)}

SOURCE = "Lai et al., Lifelong DP, Thm 2 / Alg. 2 (functional mechanism; sensitivities re-derived in dpcl)"


def _input_box(input_range: str) -> tuple[float, float]:
    if input_range not in INPUT_RANGES:
        raise InvalidParameterError(
            f"input_range must be one of {', '.join(repr(k) for k in INPUT_RANGES)}, got {input_range!r}."
        )
    return INPUT_RANGES[input_range]


# ---------------------------------------------------------------------------
# sensitivities
# ---------------------------------------------------------------------------
def reconstruction_coefficient_ranges(input_range: str = "unit") -> tuple[float, float]:
    """Widths (max - min) of one example's coefficient terms of eq. 11 over the input box.

    Diagonal term ``g(u) = u/2 - u^2`` (concave: maximum at ``u = 1/4`` when it
    lies in the box, minimum at an end point); off-diagonal term
    ``f(u, v) = (u + v)/4 - u v`` (bilinear: extremes at the box corners).
    Returns ``(diagonal width, off-diagonal width)``.
    """
    lo, hi = _input_box(input_range)
    g = lambda u: u / 2.0 - u * u  # noqa: E731
    diag_values = [g(lo), g(hi)] + ([g(0.25)] if lo <= 0.25 <= hi else [])
    corners = [(a, b) for a in (lo, hi) for b in (lo, hi)]
    off_values = [(a + b) / 4.0 - a * b for a, b in corners]
    return max(diag_values) - min(diag_values), max(off_values) - min(off_values)


def reconstruction_sensitivity(n_features: int, input_range: str = "unit") -> float:
    """l1 sensitivity Delta_R of the released coefficients of eq. 11 (replace-one).

    The coefficients are the ``d (d + 1) / 2`` upper-triangle entries of
    ``sym(A)``, ``A_sj = sum_r x_rj (1/2 - x_rs)`` (derivation in the module
    docstring). Replacing one example changes each entry by at most the width of
    its per-example term, so ``Delta_R = d w_diag + d (d - 1)/2 w_off``.
    It does not depend on ``|h1|``: the coefficients are data statistics only.
    """
    d = check_count("n_features", n_features)
    w_diag, w_off = reconstruction_coefficient_ranges(input_range)
    return d * w_diag + d * (d - 1) / 2.0 * w_off


def output_sensitivity(n_features: int, n_classes: int) -> float:
    """l1 sensitivity Delta_L of the released coefficients of the output objective (replace-one).

    ``n_features`` is ``p``, the width of ``h_pi`` *including* the constant-1
    bias feature; every feature lies in ``[-1, 1]`` (tanh / scaled). Linear
    coefficients ``b_k = sum_r (1/2 - y_rk) h_r``: each of the ``K p`` entries
    changes by at most ``1/2 + 1/2 = 1``. Quadratic coefficients, upper triangle
    of ``Q = sum_r h_r h_r^T``: diagonal ``h_i^2 in [0, 1]`` (width 1), off-diagonal
    ``h_i h_j in [-1, 1]`` (width 2). Total ``K p + p + p (p - 1) = K p + p^2``.
    """
    p = check_count("n_features", n_features)
    k = check_count("n_classes", n_classes)
    return float(k * p + p * p)


def paper_reconstruction_sensitivity(n_features: int, hidden_size: int) -> float:
    """The paper's stated bound ``Delta_R <= d (|h1| + 2)`` (Sec. 4, after eq. 12). Reported, not used."""
    return float(check_count("n_features", n_features) * (check_count("hidden_size", hidden_size) + 2))


def paper_output_sensitivity(last_hidden_size: int) -> float:
    """The paper's stated bound ``Delta_L <= 2 |h_pi|`` (Sec. 4). Reported, not used."""
    return float(2 * check_count("last_hidden_size", last_hidden_size))


def laplace_noise_scale(epsilon: float, sensitivity: float) -> float:
    """Laplace scale ``b = Delta / epsilon`` giving epsilon-DP (Dwork & Roth 2014, Thm 3.6).

    Written out because it is one division; the events carry (scale,
    sensitivity) so any accountant recomputes epsilon independently.
    """
    return float(check_positive("sensitivity", sensitivity)) / float(check_positive("epsilon", epsilon))


def noisy_input_epsilon(
    n_features: int, input_range: str, batch_size: int, epsilon1: float, sensitivity: float
) -> float:
    """True epsilon of releasing ``x_bar = x + Lap(Delta/(epsilon1 |B|))^d`` with *independent* noise per example.

    Replacing one example moves its vector by at most ``d w`` in l1 (w = range
    width), so the Laplace mechanism gives ``d w epsilon1 |B| / Delta = d w
    epsilon1 / gamma_x`` -- ``d w`` times the paper's ``epsilon1 / gamma_x``. dpcl
    does not release ``x_bar``; this shows what the paper's term would have to be.
    """
    lo, hi = _input_box(input_range)
    d = check_count("n_features", n_features)
    lam = check_count("batch_size", batch_size)
    return d * (hi - lo) * float(check_positive("epsilon1", epsilon1)) * lam / float(
        check_positive("sensitivity", sensitivity)
    )


# ---------------------------------------------------------------------------
# the bound of Thm 2
# ---------------------------------------------------------------------------
@dataclass(frozen=True)
class LifelongBound:
    """The Lifelong-DP bound ``epsilon1 + epsilon1/gamma_x + epsilon1/gamma + epsilon2`` (Thm 2) of one release.

    ``paper_terms`` are the four terms as the paper defines them (its
    sensitivities, its gamma_x and gamma, with the released ``||theta1||_{1,1}``);
    ``certified_terms`` are the terms of the mechanism dpcl runs, whose sum
    ``epsilon`` is the certified pure-DP guarantee (delta = 0, replace-one,
    per example, for all releases of the stream together).
    """

    epsilon1: float
    epsilon2: float
    gamma_x: float
    gamma: float | None
    paper_terms: Mapping[str, float | None]
    certified_terms: Mapping[str, float]
    epsilon: float
    paper_epsilon: float | None
    notes: tuple[str, ...] = field(default_factory=tuple)

    def to_dict(self) -> dict[str, Any]:
        return {
            "bound": "epsilon1 + epsilon1/gamma_x + epsilon1/gamma + epsilon2 (Lai et al., Thm 2)",
            "epsilon": self.epsilon,
            "delta": 0.0,
            "adjacency": Adjacency.REPLACE_ONE.value,
            "certified_terms": dict(self.certified_terms),
            "paper_terms": dict(self.paper_terms),
            "paper_epsilon": self.paper_epsilon,
            "gamma_x": self.gamma_x,
            "gamma": self.gamma,
            "notes": list(self.notes),
        }


def lifelong_bound(
    epsilon1: float,
    epsilon2: float,
    *,
    n_features: int,
    hidden_size: int,
    batch_size: int,
    theta1_norm: float | None = None,
) -> LifelongBound:
    """Terms of Thm 2 for one release.

    Paper terms (Sec. 4, Alg. 2 with |D_tau| replaced by the batch size lambda):
    ``gamma_x = Delta_R / lambda``, ``gamma = 2 Delta_R / (lambda ||theta1||_{1,1})``
    with the paper's ``Delta_R = d (|h1| + 2)``. ``theta1_norm`` is the
    released ``||theta1||_{1,1}`` (max column l1 norm); None before training.

    Certified terms: ``epsilon1`` (auto-encoder coefficients), 0 for the two
    gamma terms (nothing of the kind is released, see the module docstring, item
    4), ``epsilon2`` (output coefficients).
    """
    e1 = float(check_positive("epsilon1", epsilon1))
    e2 = float(check_positive("epsilon2", epsilon2))
    lam = check_count("batch_size", batch_size)
    delta_r = paper_reconstruction_sensitivity(n_features, hidden_size)
    gamma_x = delta_r / lam
    gamma = None
    e1_gamma = None
    if theta1_norm is not None:
        norm = float(check_positive("theta1_norm", theta1_norm))
        gamma = 2.0 * delta_r / (lam * norm)
        e1_gamma = e1 / gamma
    paper_terms = {
        "epsilon1": e1,
        "epsilon1_over_gamma_x": e1 / gamma_x,
        "epsilon1_over_gamma": e1_gamma,
        "epsilon2": e2,
    }
    certified = {"epsilon1": e1, "epsilon1_over_gamma_x": 0.0, "epsilon1_over_gamma": 0.0, "epsilon2": e2}
    paper_total = None if e1_gamma is None else e1 + e1 / gamma_x + e1_gamma + e2
    notes = (
        "certified: epsilon1 (Laplace on the auto-encoder's polynomial coefficients) + epsilon2 (Laplace on the "
        "output layer's coefficients), sequential composition within a task, parallel across disjoint batches "
        "and disjoint tasks; epochs and memory re-use are post-processing.",
        "epsilon1/gamma_x and epsilon1/gamma are 0 in the certified bound: noisy inputs and noisy hidden features "
        "are never released, they enter only through coefficient sums covered by the derived sensitivity.",
        "paper_terms use the paper's Delta_R = d(|h1|+2), which is not the sensitivity of eq. 11's coefficients; "
        "they are shown for comparison only.",
    )
    return LifelongBound(
        epsilon1=e1,
        epsilon2=e2,
        gamma_x=gamma_x,
        gamma=gamma,
        paper_terms=paper_terms,
        certified_terms=certified,
        epsilon=e1 + e2,
        paper_epsilon=paper_total,
        notes=notes,
    )


# ---------------------------------------------------------------------------
# preconditions, checked at run time
# ---------------------------------------------------------------------------
@dataclass(frozen=True)
class Precondition:
    """One precondition of the bound: what it says, whether the run met it, and the evidence."""

    name: str
    statement: str
    met: bool
    detail: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "statement": self.statement, "met": bool(self.met), "detail": self.detail}


def check_input_range(features: np.ndarray, input_range: str) -> Precondition:
    """Every feature lies in the declared box (the sensitivities assume it; nothing is clamped).

    A met precondition goes into checkpoints and certificates, so its detail
    never carries the observed extremes (a non-private statistic of the
    inputs); only a failed check, which stops the run before any release,
    names the observed range for the curator.
    """
    lo, hi = _input_box(input_range)
    x = np.asarray(features, dtype=np.float64)
    finite = bool(np.all(np.isfinite(x)))
    inside = finite and (x.size == 0 or (float(x.min()) >= lo and float(x.max()) <= hi))
    if x.size == 0:
        detail = "no examples"
    elif inside:
        detail = f"all {x.size} input values checked inside the box; the observed extremes are private and not reported"
    else:
        detail = f"observed range [{np.nanmin(x):.6g}, {np.nanmax(x):.6g}]"
    return Precondition("input_range", f"every input feature lies in [{lo:g}, {hi:g}]", inside, detail)


def batch_partition(n_examples: int, batch_size: int, seed: int) -> tuple[np.ndarray, ...]:
    """Fixed, disjoint batches (Alg. 2 line 4): a seeded permutation of ``range(n)`` cut into near-equal parts.

    The partition depends only on ``n``, ``batch_size`` and the seed (public), so
    replacing one example changes exactly one batch.
    """
    n = check_count("n_examples", n_examples, minimum=0)
    lam = check_count("batch_size", batch_size)
    if n == 0:
        return ()
    n_batches = math.ceil(n / lam)
    order = np.random.default_rng(seed).permutation(n)
    return tuple(np.sort(part) for part in np.array_split(order, n_batches))


def check_batch_partition(batches: Sequence[np.ndarray], n_examples: int, batch_size: int) -> Precondition:
    """The batches are pairwise disjoint, cover the task exactly once and none exceeds ``batch_size``."""
    sizes = np.array([len(b) for b in batches], dtype=np.int64)
    flat = np.concatenate([np.asarray(b, dtype=np.int64) for b in batches]) if batches else np.zeros(0, np.int64)
    counts = np.bincount(flat, minlength=n_examples) if flat.size else np.zeros(n_examples, np.int64)
    in_range = flat.size == 0 or (flat.min() >= 0 and flat.max() < n_examples)
    met = bool(in_range and counts.size == n_examples and np.all(counts == 1) and np.all(sizes <= batch_size))
    detail = f"{len(batches)} batches, sizes {sizes.min() if sizes.size else 0}..{sizes.max() if sizes.size else 0}"
    if not met:
        detail += f"; {int(np.sum(counts != 1))} examples not in exactly one batch"
    return Precondition(
        "fixed_disjoint_batches", "each task is split once into fixed, disjoint batches of size <= batch_size",
        met, detail,
    )


def coefficient_digest(*arrays: np.ndarray) -> str:
    """SHA-256 of the bytes of ``arrays`` (shape and dtype included): identifies one noisy coefficient release."""
    h = hashlib.sha256()
    for a in arrays:
        a = np.ascontiguousarray(a)
        h.update(str((a.shape, a.dtype.str)).encode())
        h.update(a.tobytes())
    return h.hexdigest()


def check_memory_fixed_disjoint(
    entries: Sequence[Mapping[str, Any]], current_digests: Sequence[str]
) -> Precondition:
    """Memory batches are fixed (digest at insertion == digest now) and pairwise disjoint.

    ``entries`` hold ``task`` (int), ``units`` (array of unit ids) and
    ``digest`` (at insertion); ``current_digests`` the digests recomputed from
    the coefficients used now.
    """
    if len(entries) != len(current_digests):
        return Precondition("memory_fixed_disjoint", _MEMORY_STATEMENT, False, "memory entries and digests differ in number")
    changed = [i for i, (e, d) in enumerate(zip(entries, current_digests)) if e["digest"] != d]
    units = [np.asarray(e["units"]) for e in entries]
    flat = np.concatenate(units) if units else np.zeros(0)
    overlap = int(flat.size - np.unique(flat).size)
    met = not changed and overlap == 0
    detail = f"{len(entries)} memory batches; {len(changed)} changed since insertion; {overlap} shared units"
    return Precondition("memory_fixed_disjoint", _MEMORY_STATEMENT, met, detail)


_MEMORY_STATEMENT = (
    "episodic-memory batches are fixed (same examples, same single noise draw) and pairwise disjoint"
)


def check_units(task_units: np.ndarray, earlier_units: np.ndarray, *, across_tasks: str = "parallel") -> Precondition:
    """One example per privacy unit within the task; under parallel composition no unit shared with an earlier task.

    The Laplace sensitivities (Lai et al., Lemmas 1-2, re-derived) are per
    example, so a unit holding two examples of one task is always refused.
    Across tasks, parallel composition (Tobaben et al., Thm 4.4) needs
    disjoint units; under ``across_tasks = "sequential"`` the ledger composes
    every task's releases, so a unit may return in a later task.
    """
    if across_tasks not in ("parallel", "sequential"):
        raise InvalidParameterError(f"across_tasks must be 'parallel' or 'sequential', got {across_tasks!r}.")
    task_units = np.asarray(task_units)
    dup = int(task_units.size - np.unique(task_units).size)
    shared = int(np.intersect1d(task_units, np.asarray(earlier_units)).size)
    if across_tasks == "parallel":
        return Precondition(
            "disjoint_units",
            "each privacy unit holds one example and tasks hold disjoint units (parallel composition across tasks)",
            dup == 0 and shared == 0,
            f"{dup} repeated units in the task, {shared} units seen in earlier tasks",
        )
    return Precondition(
        "one_example_per_unit",
        "each privacy unit holds one example within a task (units may return in later tasks: sequential "
        "composition across tasks)",
        dup == 0,
        f"{dup} repeated units in the task, {shared} units seen in earlier tasks (allowed)",
    )


# ---------------------------------------------------------------------------
# the DP-SGD A-GEM baseline ("NaiveGaussian"): epsilon grows with tasks
# ---------------------------------------------------------------------------
def dpsgd_agem_unit_events(
    noise_multiplier: float,
    task_sample_rates: Sequence[float],
    task_steps: Sequence[int],
    memory_sample_rates: Sequence[float],
    first_task: int,
    last_task: int,
) -> ComposedEvent:
    """Events charged to one example of task ``first_task`` kept in the episodic memory, up to ``last_task``.

    DP-SGD A-GEM reads raw memory examples at every step of every later task
    (Lai et al., Sec. 3, "A Naive Mechanism"): task ``j`` trains with
    ``task_steps[j]`` Poisson-subsampled Gaussian steps at rate
    ``task_sample_rates[j]``; at each step of task ``t > j`` the reference gradient
    is another subsampled Gaussian on the memory at rate ``memory_sample_rates[t]``.
    A memory example of the first task is the worst case: it meets every event.
    """
    z = float(check_positive("noise_multiplier", noise_multiplier))
    if not 0 <= first_task <= last_task < len(task_steps):
        raise InvalidParameterError(
            f"need 0 <= first_task <= last_task < {len(task_steps)}, got {first_task}, {last_task}."
        )
    events: list[Any] = [
        RepeatedEvent(PoissonSampledGaussianEvent(noise_multiplier=z, sample_rate=task_sample_rates[first_task]),
                      task_steps[first_task])
    ]
    for t in range(first_task + 1, last_task + 1):
        events.append(
            RepeatedEvent(PoissonSampledGaussianEvent(noise_multiplier=z, sample_rate=memory_sample_rates[t]),
                          task_steps[t])
        )
    return ComposedEvent(events)


def dpsgd_agem_epsilons(
    noise_multiplier: float,
    task_sample_rates: Sequence[float],
    task_steps: Sequence[int],
    memory_sample_rates: Sequence[float],
    delta: float,
    accountant: str = "rdp",
) -> np.ndarray:
    """Epsilon after each task of DP-SGD A-GEM: the worst example over the tasks seen so far.

    After task ``t`` the worst example is a memory example of some task ``j <= t``;
    its events are :func:`dpsgd_agem_unit_events`. Accounted by
    :func:`dpcl.accounting.accountants.compute_epsilon`.
    """
    n_tasks = len(task_steps)
    out = np.empty(n_tasks)
    for t in range(n_tasks):  # one accounting per (task, first task): tasks are few
        out[t] = max(
            compute_epsilon(
                dpsgd_agem_unit_events(noise_multiplier, task_sample_rates, task_steps, memory_sample_rates, j, t),
                delta,
                accountant,
            ).epsilon
            for j in range(t + 1)
        )
    return out
