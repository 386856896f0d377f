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

Data-parallel DP-SGD (``dpcl run --nproc N`` or ``torchrun``; the process
group is set up by :mod:`dpcl.runner.distributed`): when a ``torch.distributed``
process group of more than one rank is initialised, :func:`train_classifier`
runs :func:`_train_data_parallel`. Rank 0 draws every Poisson mask from the
privacy generator exactly as the single-process loop does and broadcasts it;
each rank takes its shard (every ``world``-th sampled example) of the global
batch, computes and clips its per-example gradients, and opacus'
:class:`~opacus.optimizers.DistributedDPOptimizer` sums the clipped gradients
over the ranks (``all_reduce``) with the Gaussian noise added **once, on rank 0
only** (its ``add_noise``; the other ranks add none), then divides by the
expected batch size ``q n`` of the global batch. The released update is the
single-process one: the same Poisson-subsampled Gaussian mechanism, so the
ledger charges the same events. With ``reproducible_noise`` rank 0's generator
draws the same masks and noise as a single-process run on that device, and the
weights differ from it only by the float rounding of the cross-rank sum.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable, Mapping

import torch
from torch import nn

from dpcl.errors import DistributedRunError, InvalidParameterError
from dpcl.guarantees.method_schema import TaskPlan
from dpcl.methods.base import ProgressCallback
from dpcl.methods.dpsgd_engine import (
    DpSgdEngine,
    ProjectGradient,
    StepHook,
    backward_quietly,
    cross_entropy_sum,
    flat_grad,
    poisson_sample,
)


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


def _dp_optimizer(
    model: nn.Module,
    params: list[nn.Parameter],
    schedule: SgdSchedule,
    n: int,
    *,
    learning_rate: float,
    generator: torch.Generator | None,
    world: int = 1,
    weight_decay: float = 0.0,
    optimizer_name: str = "adam",
) -> tuple[nn.Module, torch.optim.Optimizer]:
    """``(model to run, optimizer)`` for one training run: Adam over ``params`` and, for a private schedule,
    opacus' per-example gradients (:class:`opacus.GradSampleModule`, hooks mode, summed loss) with its
    DP optimiser around Adam.

    One process (``world = 1``): :class:`~opacus.optimizers.DPOptimizer` clips every per-example gradient
    to ``max_grad_norm``, adds ``N(0, (noise_multiplier * max_grad_norm)^2 I)`` drawn from ``generator``
    and divides by the expected batch size ``q n``. ``world`` ranks (:func:`_train_data_parallel`):
    :class:`~opacus.optimizers.DistributedDPOptimizer` with ``q n / world`` per rank and the noise added
    by the rank whose ``generator`` is given (rank 0; the others pass None). A non-private schedule
    gets plain Adam and ``model`` itself. ``weight_decay`` is Adam's L2 penalty: it adds ``weight_decay * p``
    to the gradient after clipping and noise, a function of the parameters alone (post-processing).
    ``optimizer_name = "sgd"`` uses plain SGD instead of Adam (A-GEM's projection bounds the change of the memory
    loss for the SGD step it projects; Adam's per-coordinate scaling turns the direction away).
    """
    optimizer: torch.optim.Optimizer
    if optimizer_name == "sgd":
        optimizer = torch.optim.SGD(params, lr=learning_rate, weight_decay=weight_decay)
    elif optimizer_name == "adam":
        optimizer = torch.optim.Adam(params, lr=learning_rate, weight_decay=weight_decay)
    else:
        raise InvalidParameterError(f"optimizer must be 'adam' or 'sgd', got {optimizer_name!r}.")
    if not schedule.private:
        return model, optimizer
    from opacus import GradSampleModule
    from opacus.optimizers import DistributedDPOptimizer, DPOptimizer

    train_model = GradSampleModule(model, loss_reduction="sum")
    expected_batch_size = max(1, round(schedule.sample_rate * n))
    optimizer_class = DPOptimizer if world == 1 else DistributedDPOptimizer
    dp_optimizer = optimizer_class(
        optimizer,
        noise_multiplier=float(schedule.noise_multiplier),
        max_grad_norm=float(schedule.max_grad_norm),
        expected_batch_size=expected_batch_size if world == 1 else expected_batch_size / world,  # type: ignore[arg-type]
        loss_reduction="mean",
        generator=generator,
    )
    return train_model, dp_optimizer


@dataclass(frozen=True)
class ReferenceGradient:
    """A second Poisson sample drawn at every step, e.g. A-GEM's episodic memory (Chaudhry et al. 2019, Sec. 4).

    At each step :func:`train_classifier` takes a Poisson sample of ``inputs`` at
    rate ``sample_rate`` and computes its gradient exactly as the step's own:
    private schedules clip every per-example gradient to the same
    ``max_grad_norm``, add the same ``N(0, (noise_multiplier * max_grad_norm)^2 I)``
    and divide by the expected size ``sample_rate * len(targets)``. Then
    ``combine(g, g_ref)`` (flat tensors) gives the update direction; it sees only
    the two released (noisy) gradients, so it is post-processing. An example
    that is never in both sampled sets at one step (the step's data and the
    reference data hold different units) then takes one Poisson-subsampled
    Gaussian per step, at its own set's rate.
    """

    inputs: "torch.Tensor | tuple[torch.Tensor, ...]"
    targets: torch.Tensor
    sample_rate: float
    combine: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


def _classifier_backward(train_model: nn.Module, inputs: tuple[torch.Tensor, ...], targets: torch.Tensor,
                         private: bool) -> Callable[[torch.Tensor], None]:
    """The backward pass of a batch: the summed cross-entropy (its per-example gradients, for a private step),
    or the batch mean (a non-private step)."""

    def backward(indices: torch.Tensor) -> None:
        loss = cross_entropy_sum(train_model, inputs, targets, indices)
        backward_quietly(loss if private else loss / max(indices.numel(), 1))

    return backward


def _reference_projection(reference: ReferenceGradient, backward: Callable[[torch.Tensor], None],
                          generator: torch.Generator, device: torch.device) -> ProjectGradient:
    """A-GEM's hook: after the step's gradient ``g`` is released, release ``g_ref`` on a Poisson sample of the
    reference data by the same query (clipping, noise) and update along ``reference.combine(g, g_ref)``."""
    n_ref = int(reference.targets.shape[0])

    def project(gradient: torch.Tensor, step: int, engine: DpSgdEngine) -> torch.Tensor:
        batch = poisson_sample(n_ref, reference.sample_rate, generator, device)
        released = engine.release(batch, backward, int(batch.numel()), reference.sample_rate * n_ref)
        return reference.combine(gradient, flat_grad(engine.params) if released else torch.zeros_like(gradient))

    return ProjectGradient(project)


def train_classifier(
    model: nn.Module,
    features: "torch.Tensor | tuple[torch.Tensor, ...]",
    targets: torch.Tensor,
    schedule: SgdSchedule,
    *,
    learning_rate: float,
    generator: torch.Generator,
    progress: ProgressCallback | None = None,
    weight_decay: float = 0.0,
    reference: ReferenceGradient | None = None,
    optimizer_name: str = "adam",
) -> None:
    """Train ``model`` in place with cross-entropy for ``schedule.steps`` Poisson-sampled steps.

    ``features`` is one tensor [n, ...] or a tuple of them (e.g. token ids and
    attention mask), indexed by example and passed to ``model`` positionally.
    Private schedules use opacus per-example gradients, clipping and Gaussian
    noise; non-private ones plain Adam on the same batches. ``generator`` draws
    both the Poisson masks and the noise: pass a privacy generator
    (:meth:`~dpcl.methods.base.ContinualMethod.noise_generator`, OS entropy by
    default), never one seeded from a published seed. ``reference``: a second
    sample per step whose released gradient is combined with the step's
    (:class:`ReferenceGradient`; single process only). ``optimizer_name``: "adam" (default) or "sgd".
    """
    inputs = features if isinstance(features, tuple) else (features,)
    ranks = data_parallel_world()
    if ranks is not None:
        if reference is not None:
            raise DistributedRunError(
                "a reference gradient (A-GEM's episodic memory) is computed in one process only; run this method "
                "without --nproc / torchrun."
            )
        _train_data_parallel(model, inputs, targets, schedule, learning_rate=learning_rate, generator=generator,
                             progress=progress, rank=ranks[0], world=ranks[1], weight_decay=weight_decay)
        return
    n = int(inputs[0].shape[0])
    device = inputs[0].device
    params = [p for p in model.parameters() if p.requires_grad]
    train_model, optimizer = _dp_optimizer(model, params, schedule, n, learning_rate=learning_rate, generator=generator,
                                           weight_decay=weight_decay, optimizer_name=optimizer_name)
    hooks: list[ProjectGradient] = []
    if reference is not None and int(reference.targets.shape[0]):
        ref_inputs = reference.inputs if isinstance(reference.inputs, tuple) else (reference.inputs,)
        hooks.append(_reference_projection(
            reference, _classifier_backward(train_model, ref_inputs, reference.targets, schedule.private), generator,
            device))

    def sample(step: int) -> tuple[torch.Tensor, int]:
        batch = poisson_sample(n, schedule.sample_rate, generator, device)
        return batch, int(batch.numel())

    backward = _classifier_backward(train_model, inputs, targets, schedule.private)
    engine = DpSgdEngine(params, optimizer, schedule.private, sample, lambda step, batch: backward(batch), hooks,
                         expected_batch_size=schedule.sample_rate * n, progress=progress)
    train_model.train()
    engine.run(schedule.steps)
    if schedule.private:
        train_model.remove_hooks()  # ``model`` keeps the trained weights, without opacus hooks
        train_model._close()
    model.eval()


# ---------------------------------------------------------------------------------------------------------------
# data-parallel DP-SGD (torch.distributed)
# ---------------------------------------------------------------------------------------------------------------
#: Control words of the header rank 0 broadcasts before every data-parallel training call and when the run ends.
_TRAIN, _END_OK, _END_FAILED = 1, 2, 3


class DataParallelStop(Exception):
    """Rank 0 ended the run (``failed``: with an error) while this rank waited for its next training call."""

    def __init__(self, failed: bool) -> None:
        super().__init__("rank 0 ended the run" + (" with an error" if failed else ""))
        self.failed = failed


def data_parallel_world() -> tuple[int, int] | None:
    """``(rank, world_size)`` of the initialised ``torch.distributed`` process group, or None (single process)."""
    import torch.distributed as dist

    if not dist.is_available() or not dist.is_initialized() or dist.get_world_size() < 2:
        return None
    return dist.get_rank(), dist.get_world_size()


def _header(words: list[int], device: torch.device) -> torch.Tensor:
    """Rank 0's ``words`` on every rank (the others pass zeros).

    An ``all_reduce`` rather than a broadcast: it returns on no rank before every rank has joined, so rank 0
    never runs ahead of a rank that has not yet read the resume point (:mod:`dpcl.runner.distributed`).
    """
    import torch.distributed as dist

    header = torch.tensor(words, dtype=torch.long, device=device)
    dist.all_reduce(header, op=dist.ReduceOp.SUM)
    return header


def end_data_parallel_run(ok: bool, device: "torch.device | str") -> None:
    """Rank 0: tell the other ranks that the run ended (``ok``: finished; else failed) so they stop waiting."""
    _header([_END_OK if ok else _END_FAILED, 0, 0, 0], torch.device(device))


def wait_for_end_of_run(device: "torch.device | str") -> bool:
    """Ranks > 0, after their last task: wait for rank 0's end of run; True when rank 0 finished without error."""
    header = _header([0, 0, 0, 0], torch.device(device))
    word = int(header[0])
    if word not in (_END_OK, _END_FAILED):
        raise DistributedRunError(
            "rank 0 started another training call after this rank's last task: the ranks disagree on the number of "
            "tasks (were they started with the same config, --seed and data?)."
        )
    return word == _END_OK


class _ReduceAcrossRanks(StepHook):
    """Data-parallel ranks sum their released gradients. Private: opacus' ``DistributedDPOptimizer`` all-reduces
    the clipped (rank 0: noisy) sums, each divided by ``q n / world``. Non-private: the summed gradients
    all-reduced and divided by the size of the global sample (the single-process mean)."""

    def __init__(self, optimizer: torch.optim.Optimizer, private: bool, sizes: list[int]) -> None:
        self.optimizer, self.private, self.sizes = optimizer, private, sizes

    def after_release(self, step: int, engine: DpSgdEngine) -> None:
        import torch.distributed as dist

        if self.private:
            self.optimizer.reduce_gradients()  # type: ignore[attr-defined]
            return
        for p in engine.params:
            grad = p.grad if p.grad is not None else torch.zeros_like(p)
            dist.all_reduce(grad, op=dist.ReduceOp.SUM)
            p.grad = grad / self.sizes[0]


def _train_data_parallel(
    model: nn.Module,
    inputs: tuple[torch.Tensor, ...],
    targets: torch.Tensor,
    schedule: SgdSchedule,
    *,
    learning_rate: float,
    generator: torch.Generator,
    progress: ProgressCallback | None,
    rank: int,
    world: int,
    weight_decay: float = 0.0,
) -> None:
    """:func:`train_classifier` on ``world`` ranks: rank 0's Poisson masks, every rank a shard, noise once (rank 0).

    Every rank holds the whole task (``inputs``, ``targets``) and the same
    model; :class:`opacus.distributed.DifferentiallyPrivateDistributedDataParallel`
    broadcasts rank 0's weights first (a resumed rank 0 holds the restored
    ones). Private steps go through :class:`~opacus.optimizers.DistributedDPOptimizer`
    with ``expected_batch_size = q n / world`` per rank: each rank divides its
    (rank 0: noisy) clipped sum by ``q n / world``, the ``all_reduce`` sums and
    divides by ``world``, which gives ``(sum of all clipped gradients + noise) / (q n)``,
    the single-process update. Non-private steps all-reduce the summed gradients
    and divide by the size of the global batch (the single-process mean). The
    weights are broadcast from rank 0 at the end, so every rank releases the
    same model.
    """
    import torch.distributed as dist
    from opacus.distributed import DifferentiallyPrivateDistributedDataParallel

    n = int(inputs[0].shape[0])
    device = inputs[0].device
    mine = [_TRAIN, n, int(schedule.steps), int(schedule.private)]
    header = _header(mine if rank == 0 else [0, 0, 0, 0], device)
    if rank != 0:
        word = int(header[0])
        if word in (_END_OK, _END_FAILED):
            raise DataParallelStop(failed=word == _END_FAILED)
        if header.tolist() != mine:
            raise DistributedRunError(
                f"rank {rank} would train {n} examples for {schedule.steps} steps (private: {schedule.private}) but "
                f"rank 0 trains {int(header[1])} for {int(header[2])} (private: {bool(header[3])}): the ranks must "
                "run the same config, --seed and data."
            )
    wrapped = DifferentiallyPrivateDistributedDataParallel(model)  # broadcasts rank 0's weights
    params = [p for p in model.parameters() if p.requires_grad]
    train_model, optimizer = _dp_optimizer(
        wrapped, params, schedule, n, learning_rate=learning_rate,
        generator=generator if rank == 0 else None,  # only rank 0 adds noise
        world=world, weight_decay=weight_decay,
    )
    mask = torch.zeros(n, dtype=torch.uint8, device=device)
    sizes = [0]

    def sample(step: int) -> tuple[torch.Tensor, int]:
        """Rank 0's Poisson mask, broadcast; this rank computes every ``world``-th sampled example."""
        nonlocal mask
        if rank == 0 and n:
            mask = (torch.rand(n, generator=generator, device=device) < schedule.sample_rate).to(torch.uint8)
        if n:
            dist.broadcast(mask, src=0)
        batch = torch.nonzero(mask, as_tuple=False).squeeze(1)
        sizes[0] = int(batch.numel())
        return batch[rank::world], sizes[0]

    def backward(step: int, shard: torch.Tensor) -> None:
        backward_quietly(cross_entropy_sum(train_model, inputs, targets, shard))

    engine = DpSgdEngine(params, optimizer, schedule.private, sample, backward,
                         [_ReduceAcrossRanks(optimizer, schedule.private, sizes)], progress=progress)
    train_model.train()
    engine.run(schedule.steps)
    if schedule.private:
        train_model.remove_hooks()
        train_model._close()
    with torch.no_grad():
        for p in model.parameters():
            dist.broadcast(p.data, src=0)
    model.eval()
