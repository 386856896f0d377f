"""The one DP-SGD step engine every DP-SGD method trains with: Poisson sampling, empty batches, clipping, noise.

A method describes *what* a step computes; :class:`DpSgdEngine` runs the steps the plan charged, the same way
for every method:

1. draw the step's Poisson sample (:func:`poisson_sample`, one vectorised draw from a privacy generator);
2. compute the per-example gradients of the sampled examples (the method's ``backward``), or, for an empty
   sample, none -- a private step still releases noise (``grad_sample`` of zero examples), since skipping it
   would reveal that the sample was empty, which the subsampled-Gaussian accounting does not cover;
3. release the step's gradient: for a private step opacus' :class:`~opacus.optimizers.DPOptimizer` clips every
   per-example gradient, adds ``N(0, (noise_multiplier * max_grad_norm)^2 I)`` and divides by the expected
   batch size (``pre_step``); a non-private step releases the batch's gradient, and nothing for an empty batch;
4. run the method's hooks on the released gradient (:class:`StepHook.after_release`; post-processing only:
   a projection against a reference gradient, a gradient added from a penalty of the parameters alone, an
   all-reduce across ranks, a statistic of the released gradients) and apply the optimiser's update.

The charging of the steps is the plan's: the engine runs exactly ``steps`` steps at the planned rate, and the
caller charges the plan's events before it trains (:class:`dpcl.Certifier`). Continual-learning strategies are
hooks on the engine, as Avalanche's strategy plugins are hooks on its training loop: A-GEM's and GEM's
projections (:class:`ProjectGradient`), EWC's Fisher statistic (:class:`AccumulateSquaredGradient`) and penalty
(:class:`AddPenaltyGradient`), O-LoRA's orthogonality penalty and PeCL's memory regulariser (the same hook);
a replay buffer (ER) changes the examples a task trains on, not the step.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass, field
from typing import Callable, Sequence

import torch
from torch import nn

from dpcl.methods.base import ProgressCallback

__all__ = [
    "AccumulateSquaredGradient",
    "AddPenaltyGradient",
    "DpSgdEngine",
    "ProjectGradient",
    "StepHook",
    "backward_quietly",
    "cross_entropy_sum",
    "flat_grad",
    "poisson_sample",
    "set_flat_grad",
]


def poisson_sample(
    n: int, rate: float, generator: torch.Generator, device: "torch.device | str",
    draw_device: "torch.device | str | None" = None,
) -> torch.Tensor:
    """Indices (on ``device``) of one Poisson sample of ``n`` examples at ``rate``: one vectorised draw of ``n``
    uniforms from ``generator`` on ``draw_device`` (default ``device``; a CPU generator draws on the CPU)."""
    if not n:
        return torch.zeros(0, dtype=torch.long, device=device)
    mask = torch.rand(n, generator=generator, device=draw_device if draw_device is not None else device) < rate
    return torch.nonzero(mask, as_tuple=False).squeeze(1).to(device)


def backward_quietly(loss: torch.Tensor) -> None:
    """``loss.backward()`` without opacus' warning that its backward hooks fire on module outputs (the frozen
    inputs need no gradient, which is how every dpcl method feeds its models)."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="Full backward hook is firing")
        loss.backward()


def flat_grad(params: Sequence[torch.Tensor]) -> torch.Tensor:
    """Every ``p.grad`` as one flat vector (zeros for a parameter without a gradient)."""
    return torch.cat([(p.grad if p.grad is not None else torch.zeros_like(p)).reshape(-1) for p in params])


def set_flat_grad(params: Sequence[torch.Tensor], flat: torch.Tensor) -> None:
    """Write the flat vector ``flat`` back into the ``p.grad`` of ``params`` (the inverse of :func:`flat_grad`)."""
    offset = 0
    for p in params:
        p.grad = flat[offset:offset + p.numel()].view_as(p).clone()
        offset += p.numel()


class StepHook:
    """A strategy's part in a DP-SGD step (Avalanche-style plugin); every method is a no-op by default."""

    def on_empty_sample(self, step: int, engine: "DpSgdEngine") -> None:
        """The step's Poisson sample is empty (before its noise-only gradient is released)."""

    def after_release(self, step: int, engine: "DpSgdEngine") -> None:
        """Every ``p.grad`` of ``engine.params`` holds the step's released gradient; the update follows."""


@dataclass
class DpSgdEngine:
    """Runs DP-SGD steps (see the module docstring).

    ``sample(step)`` returns the indices this process computes and the size of the step's whole Poisson sample
    (they differ only when data-parallel ranks share a sample); ``backward(step, indices)`` runs the forward
    and backward pass of a non-empty batch (per-example gradients for a private step). ``expected_batch_size``
    (private steps): set on the DP optimiser before every release, or None to keep the optimiser's own.
    ``set_to_none``: how gradients are cleared before each release.
    """

    params: list[torch.Tensor]
    optimizer: torch.optim.Optimizer
    private: bool
    sample: Callable[[int], tuple[torch.Tensor, int]]
    backward: Callable[[int, torch.Tensor], None]
    hooks: Sequence[StepHook] = ()
    expected_batch_size: float | None = None
    set_to_none: bool = True
    progress: ProgressCallback | None = None
    counts: dict[str, int] = field(default_factory=lambda: {"steps_run": 0, "empty_steps": 0, "examples_sampled": 0})

    def release(self, indices: torch.Tensor, backward: Callable[[torch.Tensor], None], size: int,
                expected_batch_size: float | None = None) -> bool:
        """Leave in every ``p.grad`` the gradient one query releases on ``indices``; False when it releases none.

        Private: per-example clipping, Gaussian noise and division by the expected batch size (opacus'
        ``DPOptimizer.pre_step``); an empty sample releases noise alone (no forward pass: a text encoder cannot
        run on zero sequences). Non-private: the batch's gradient as ``backward`` leaves it, none when the whole
        sample (``size``) is empty.
        """
        self.optimizer.zero_grad(set_to_none=self.set_to_none)
        if indices.numel():
            backward(indices)
        elif self.private:
            for p in self.params:
                p.grad_sample = torch.zeros((0, *p.shape), dtype=p.dtype, device=p.device)
        if not self.private:
            return size > 0
        if expected_batch_size is not None:
            self.optimizer.expected_batch_size = max(1, round(expected_batch_size))  # type: ignore[attr-defined]
        return bool(self.optimizer.pre_step())  # type: ignore[attr-defined]

    def run(self, steps: int) -> dict[str, int]:
        """Run ``steps`` steps; returns the counts of steps that updated, empty samples and examples sampled."""
        update = getattr(self.optimizer, "original_optimizer", self.optimizer)  # Adam/SGD inside opacus' wrapper
        for step in range(steps):
            indices, size = self.sample(step)
            if not indices.numel():
                self.counts["empty_steps"] += 1
                for hook in self.hooks:
                    hook.on_empty_sample(step, self)
            self.counts["examples_sampled"] += int(indices.numel())
            if self.release(indices, lambda idx: self.backward(step, idx), size, self.expected_batch_size):
                for hook in self.hooks:
                    hook.after_release(step, self)
                update.step()
                self.counts["steps_run"] += 1
            if self.progress is not None:
                self.progress(1)
        return dict(self.counts)


class ProjectGradient(StepHook):
    """Replace the released gradient ``g`` by ``project(g, step, engine)`` (A-GEM, GEM: a projection against
    released reference gradients, which ``project`` may release through ``engine.release``; post-processing).
    ``project`` returns ``g`` itself when it leaves it unchanged, which :attr:`projections` does not count."""

    def __init__(self, project: Callable[[torch.Tensor, int, "DpSgdEngine"], torch.Tensor]) -> None:
        self.project = project
        self.projections = 0

    def after_release(self, step: int, engine: DpSgdEngine) -> None:
        gradient = flat_grad(engine.params)
        projected = self.project(gradient, step, engine)
        self.projections += int(projected is not gradient)
        set_flat_grad(engine.params, projected)


class AccumulateSquaredGradient(StepHook):
    """EWC's diagonal Fisher estimate from the released gradients: ``fisher += grad**2 / divisor`` per step."""

    def __init__(self, fisher: list[torch.Tensor], divisor: float) -> None:
        self.fisher, self.divisor = fisher, divisor

    def after_release(self, step: int, engine: DpSgdEngine) -> None:
        for f, p in zip(self.fisher, engine.params):
            f += p.grad.detach() ** 2 / self.divisor


class AddPenaltyGradient(StepHook):
    """Add the gradient of ``penalty()``, a function of the parameters and earlier releases alone (EWC, O-LoRA,
    PeCL's memory regulariser), after the noise: post-processing, it reads no private example."""

    def __init__(self, penalty: Callable[[], torch.Tensor]) -> None:
        self.penalty = penalty

    def after_release(self, step: int, engine: DpSgdEngine) -> None:
        grads = torch.autograd.grad(self.penalty(), engine.params, allow_unused=True)
        for p, g in zip(engine.params, grads):
            if g is not None:
                p.grad = p.grad + g


def cross_entropy_sum(model: nn.Module, inputs: tuple[torch.Tensor, ...], targets: torch.Tensor,
                      indices: torch.Tensor) -> torch.Tensor:
    """The summed cross-entropy of ``model`` on the examples ``indices`` (per-example gradients sum to it)."""
    return nn.functional.cross_entropy(model(*(x[indices] for x in inputs)), targets[indices], reduction="sum")
