"""DP-SGD on a small model, exactly as a :class:`~dpcl.guarantees.method_schema.TaskPlan` says.

DP-SGD is Alg. A1 of Tobaben et al. (Abadi et al. 2016): each step takes a
Poisson sample of the examples at rate ``q``, clips every per-example gradient
to norm ``C`` and adds ``N(0, (noise_multiplier * C)^2 I)`` to their sum,
divided by the expected batch size ``q n``. Per-example gradients, clipping and
noise come from opacus (:class:`opacus.GradSampleModule`,
:class:`opacus.optimizers.DPOptimizer`).

Why not ``PrivacyEngine.make_private``: its data loader samples at rate
``1 / len(loader)``, which is not the plan's ``q = batch_size / n`` in general,
and it chooses the number of steps from epochs. The plan fixes ``q`` and the
number of steps ``T`` (those are what the ledger charged), so the loop below
draws its own Poisson masks (one vectorised ``rand(n) < q`` per step) and runs
exactly ``T`` steps. Empty Poisson samples are kept: the step still adds noise
(empty per-example gradients, then opacus' noise), as the accounting assumes.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass
from typing import Any, Mapping

import torch
from torch import nn

from dpcl.errors import InvalidParameterError
from dpcl.guarantees.method_schema import TaskPlan
from dpcl.methods.base import ProgressCallback


@dataclass(frozen=True)
class SgdSchedule:
    """Sampling, length and noise of one training run (``noise_multiplier`` None: not private)."""

    sample_rate: float
    steps: int
    noise_multiplier: float | None
    max_grad_norm: float | None

    @property
    def private(self) -> bool:
        return self.noise_multiplier is not None


def _positive(name: str, value: Any) -> float:
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise InvalidParameterError(f"{name} must be a number, got {value!r}.") from None
    if not math.isfinite(number) or number <= 0:
        raise InvalidParameterError(f"{name} must be > 0 and finite, got {value!r}.")
    return number


def schedule_from_plan(plan: TaskPlan, method: Mapping[str, Any], n_examples: int) -> SgdSchedule:
    """The DP-SGD schedule a plan prescribes.

    A plan with privacy events must give ``noise_multiplier``, ``sample_rate``
    and ``steps``; the clipping norm is the ``[method] max_grad_norm`` the plan
    was computed for. A plan without events and ``steps = 0`` is an empty task:
    the initialisation is released untouched. Any other plan without events is a
    non-private run: it trains
    ``epochs * ceil(n / batch_size)`` steps at rate ``batch_size / n`` (or the
    plan's own ``sample_rate`` / ``steps`` when given), without clipping or noise.
    """
    noise = plan.noise
    if plan.events:
        missing = [key for key in ("noise_multiplier", "sample_rate", "steps") if noise.get(key) is None]
        if missing:
            raise InvalidParameterError(
                f"a private DP-SGD plan must give {', '.join(missing)} in its noise; got {dict(noise)!r}."
            )
        q = _positive("sample_rate", noise["sample_rate"])
        if q > 1:
            raise InvalidParameterError(f"sample_rate must lie in (0, 1], got {q!r}.")
        steps = int(noise["steps"])
        if steps < 1 or steps != noise["steps"]:
            raise InvalidParameterError(f"steps must be an integer >= 1, got {noise['steps']!r}.")
        return SgdSchedule(
            sample_rate=q,
            steps=steps,
            noise_multiplier=_positive("noise_multiplier", noise["noise_multiplier"]),
            max_grad_norm=_positive("max_grad_norm", noise.get("max_grad_norm", method.get("max_grad_norm"))),
        )
    if noise.get("noise_multiplier") is not None or noise.get("sigma") is not None:
        raise InvalidParameterError("a plan with noise but no privacy events is inconsistent; refusing to train.")
    if noise.get("steps") == 0:
        # an empty task: the plan releases the data-independent initialisation (Prop. F.1), no step is taken
        return SgdSchedule(1.0, 0, None, None)
    batch_size = int(method["batch_size"])
    epochs = int(method["epochs"])
    if noise.get("sample_rate") is not None and noise.get("steps") is not None:
        return SgdSchedule(float(noise["sample_rate"]), int(noise["steps"]), None, None)
    n = max(int(n_examples), 1)
    return SgdSchedule(min(1.0, batch_size / n), epochs * math.ceil(n / batch_size), None, None)


class AdapterClassifier(nn.Module):
    """A residual bottleneck adapter on frozen encoder features, then a linear head.

    ``h = v + U relu(D v)``, ``logits = W h + b`` (Houlsby et al. 2019 adapter
    applied to the encoder's output features). The head starts at zero, as the
    paper's last layer (Tobaben et al., App. H); ``U`` starts at zero so the
    adapter starts as the identity. ``adapter_dim = 0`` gives the head alone
    (last-layer fine-tuning).
    """

    def __init__(self, input_dim: int, n_outputs: int, adapter_dim: int) -> None:
        super().__init__()
        self.adapter_down = nn.Linear(input_dim, adapter_dim) if adapter_dim > 0 else None
        self.adapter_up = nn.Linear(adapter_dim, input_dim) if adapter_dim > 0 else None
        self.head = nn.Linear(input_dim, n_outputs)
        nn.init.zeros_(self.head.weight)
        nn.init.zeros_(self.head.bias)
        if self.adapter_up is not None:
            nn.init.zeros_(self.adapter_up.weight)
            nn.init.zeros_(self.adapter_up.bias)

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        hidden = features
        if self.adapter_down is not None and self.adapter_up is not None:
            hidden = features + self.adapter_up(torch.relu(self.adapter_down(features)))
        return self.head(hidden)


def seeded_adapter(
    input_dim: int, n_outputs: int, adapter_dim: int, generator: torch.Generator, device: torch.device
) -> AdapterClassifier:
    """A fresh :class:`AdapterClassifier` whose initialisation is drawn from ``generator`` (global RNG untouched)."""
    seed = int(torch.randint(0, 2**31 - 1, (1,), generator=generator, device=generator.device))
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = AdapterClassifier(input_dim, n_outputs, adapter_dim)
    return model.to(device)


def train_classifier(
    model: nn.Module,
    features: "torch.Tensor | tuple[torch.Tensor, ...]",
    targets: torch.Tensor,
    schedule: SgdSchedule,
    *,
    learning_rate: float,
    generator: torch.Generator,
    progress: ProgressCallback | None = None,
) -> None:
    """Train ``model`` in place with cross-entropy for ``schedule.steps`` Poisson-sampled steps.

    ``features`` is one tensor [n, ...] or a tuple of them (e.g. token ids and
    attention mask), indexed by example and passed to ``model`` positionally.
    Private schedules use opacus per-example gradients, clipping and Gaussian
    noise; non-private ones plain Adam on the same batches. ``generator`` draws
    both the Poisson masks and the noise: pass a privacy generator
    (:meth:`~dpcl.methods.base.ContinualMethod.noise_generator`, OS entropy by
    default), never one seeded from a published seed.
    """
    inputs = features if isinstance(features, tuple) else (features,)
    n = int(inputs[0].shape[0])
    device = inputs[0].device
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer: torch.optim.Optimizer = torch.optim.Adam(params, lr=learning_rate)
    train_model: nn.Module = model
    if schedule.private:
        from opacus import GradSampleModule
        from opacus.optimizers import DPOptimizer

        train_model = GradSampleModule(model, loss_reduction="sum")
        optimizer = DPOptimizer(
            optimizer,
            noise_multiplier=float(schedule.noise_multiplier),
            max_grad_norm=float(schedule.max_grad_norm),
            expected_batch_size=max(1, round(schedule.sample_rate * n)),
            loss_reduction="mean",
            generator=generator,
        )
    loss_fn = nn.CrossEntropyLoss(reduction="sum")
    train_model.train()
    for _ in range(schedule.steps):
        if n:
            mask = torch.rand(n, generator=generator, device=device) < schedule.sample_rate
            batch = torch.nonzero(mask, as_tuple=False).squeeze(1)
        else:
            batch = torch.zeros(0, dtype=torch.long, device=device)
        optimizer.zero_grad(set_to_none=True)
        if schedule.private and not batch.numel():
            # An empty Poisson sample: no forward pass (a text encoder cannot run on zero sequences), the
            # step releases noise alone, as the accounting assumes: empty per-example gradients, then noise.
            for p in params:
                p.grad_sample = torch.zeros((0, *p.shape), dtype=p.dtype, device=p.device)
            optimizer.step()
        elif batch.numel():
            logits = train_model(*(x[batch] for x in inputs))
            loss = loss_fn(logits, targets[batch])
            if not schedule.private:
                loss = loss / max(batch.numel(), 1)
            with warnings.catch_warnings():
                # opacus' backward hooks fire on module outputs because the frozen inputs need no grad.
                warnings.filterwarnings("ignore", message="Full backward hook is firing")
                loss.backward()
            optimizer.step()
        if progress is not None:
            progress(1)
    if schedule.private:
        train_model.remove_hooks()  # ``model`` keeps the trained weights, without opacus hooks
        train_model._close()
    model.eval()
