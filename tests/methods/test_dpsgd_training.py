"""DP-SGD as a plan prescribes: schedule parsing, Poisson sampling rate, clipping + noise from opacus."""

from __future__ import annotations

import math

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from dpcl.errors import InvalidParameterError  # noqa: E402
from dpcl.guarantees.method_schema import TaskPlan  # noqa: E402
from dpcl.methods.dpsgd_training import (  # noqa: E402
    AdapterClassifier,
    SgdSchedule,
    schedule_from_plan,
    seeded_adapter,
    train_classifier,
)
from tobaben_helpers import dpsgd_plan  # noqa: E402


def test_private_plan_gives_its_exact_schedule():
    schedule = schedule_from_plan(dpsgd_plan(1.3, 0.05, 40, max_grad_norm=0.7), {"batch_size": 8, "epochs": 1}, 100)
    assert schedule == SgdSchedule(sample_rate=0.05, steps=40, noise_multiplier=1.3, max_grad_norm=0.7)
    assert schedule.private


def test_non_private_plan_derives_steps_from_epochs_and_batch_size():
    schedule = schedule_from_plan(TaskPlan(events=(), noise={}), {"batch_size": 32, "epochs": 3}, 100)
    assert schedule == SgdSchedule(sample_rate=0.32, steps=3 * math.ceil(100 / 32), noise_multiplier=None, max_grad_norm=None)


@pytest.mark.parametrize("drop", ["noise_multiplier", "sample_rate", "steps"])
def test_private_plan_missing_a_parameter_is_refused(drop):
    plan = dpsgd_plan(1.0, 0.1, 10)
    noise = {k: v for k, v in plan.noise.items() if k != drop}
    with pytest.raises(InvalidParameterError, match=drop):
        schedule_from_plan(TaskPlan(events=plan.events, noise=noise), {"batch_size": 8, "epochs": 1}, 100)


def test_noise_without_events_is_refused():
    with pytest.raises(InvalidParameterError, match="inconsistent"):
        schedule_from_plan(TaskPlan(events=(), noise={"noise_multiplier": 1.0}), {"batch_size": 8, "epochs": 1}, 100)


def _count_batches(schedule, n=400, seed=0):
    model = AdapterClassifier(5, 3, 0)
    sizes = []
    model.head.register_forward_hook(lambda module, inputs, output: sizes.append(inputs[0].shape[0]))
    features = torch.randn(n, 5, generator=torch.Generator().manual_seed(1))
    targets = torch.randint(0, 3, (n,), generator=torch.Generator().manual_seed(2))
    steps_done = []
    train_classifier(
        model, features, targets, schedule, learning_rate=1e-2,
        generator=torch.Generator().manual_seed(seed), progress=steps_done.append,
    )
    return np.array(sizes), sum(steps_done), model


def test_poisson_batches_have_the_planned_rate_and_every_step_runs():
    """Mean batch size over 200 steps is q n within 4 binomial standard errors; all T steps are taken."""
    q, n, steps = 0.05, 400, 200
    sizes, done, _ = _count_batches(SgdSchedule(q, steps, 1.0, 1.0), n=n)
    assert done == steps and sizes.size == steps
    standard_error = math.sqrt(n * q * (1 - q) / steps)
    assert abs(sizes.mean() - q * n) < 4 * standard_error
    assert sizes.std() > 0  # Poisson, not fixed-size batches


def test_private_training_is_reproducible_from_the_seed_and_noise_depends_on_it():
    _, _, a = _count_batches(SgdSchedule(0.1, 20, 1.0, 1.0), seed=5)
    _, _, b = _count_batches(SgdSchedule(0.1, 20, 1.0, 1.0), seed=5)
    _, _, c = _count_batches(SgdSchedule(0.1, 20, 1.0, 1.0), seed=6)
    assert torch.equal(a.head.weight, b.head.weight)
    assert not torch.equal(a.head.weight, c.head.weight)


@pytest.mark.filterwarnings("ignore:Full backward hook is firing")
def test_one_private_step_is_clipped_sum_plus_gaussian_noise():
    """q = 1, one SGD-like step checked against a hand-written DP-SGD update (Alg. A1).

    With Adam the first update is lr * sign-like; instead we read the privatised
    gradient opacus leaves in ``.grad`` before the optimizer step by using a
    zero learning rate and recomputing it by hand from the same noise draw.
    """
    from opacus import GradSampleModule
    from opacus.optimizers import DPOptimizer

    torch.manual_seed(0)
    model = torch.nn.Linear(4, 2, bias=False)
    x = torch.randn(6, 4)
    y = torch.tensor([0, 1, 0, 1, 1, 0])
    clip, sigma = 0.5, 0.8
    # by hand: per-example gradients of the summed cross-entropy, clipped to `clip`
    per_example = []
    for i in range(6):
        model.zero_grad()
        torch.nn.functional.cross_entropy(model(x[i : i + 1]), y[i : i + 1], reduction="sum").backward()
        g = model.weight.grad.clone()
        per_example.append(g * min(1.0, clip / (float(g.norm()) + 1e-6)))
    clipped_sum = torch.stack(per_example).sum(0)
    noise = torch.normal(0, sigma * clip, size=model.weight.shape, generator=torch.Generator().manual_seed(9))
    expected = (clipped_sum + noise) / 6
    gsm = GradSampleModule(model, loss_reduction="sum")
    opt = DPOptimizer(
        torch.optim.SGD(model.parameters(), lr=0.0), noise_multiplier=sigma, max_grad_norm=clip,
        expected_batch_size=6, loss_reduction="mean", generator=torch.Generator().manual_seed(9),
    )
    opt.zero_grad()
    torch.nn.functional.cross_entropy(gsm(x), y, reduction="sum").backward()
    opt.step()
    torch.testing.assert_close(model.weight.grad, expected, rtol=1e-4, atol=1e-5)


def test_empty_data_still_takes_noise_only_steps():
    model = AdapterClassifier(5, 2, 3)
    before = model.head.weight.clone()
    train_classifier(
        model, torch.zeros(0, 5), torch.zeros(0, dtype=torch.long), SgdSchedule(0.1, 5, 1.0, 1.0),
        learning_rate=0.1, generator=torch.Generator().manual_seed(0),
    )
    assert not torch.equal(model.head.weight, before)


class _NoEmptyForward(torch.nn.Module):
    """Like a text encoder: refuses a forward pass over zero examples."""

    def __init__(self) -> None:
        super().__init__()
        self.head = torch.nn.Linear(5, 2)
        self.forwards = 0

    def forward(self, x):
        if x.shape[0] == 0:
            raise RuntimeError("cannot run on zero examples")
        self.forwards += 1
        return self.head(x)


def test_empty_poisson_samples_take_a_noise_only_step_without_a_forward_pass():
    """Rate 1e-12 on 20 examples: every Poisson sample is empty, every step still adds noise."""
    model = _NoEmptyForward()
    before = model.head.weight.clone()
    train_classifier(
        model, torch.randn(20, 5), torch.zeros(20, dtype=torch.long), SgdSchedule(1e-12, 3, 1.0, 1.0),
        learning_rate=0.1, generator=torch.Generator().manual_seed(0),
    )
    assert model.forwards == 0
    assert not torch.equal(model.head.weight, before)


def test_seeded_adapter_does_not_touch_the_global_rng():
    torch.manual_seed(123)
    expected = torch.rand(3)
    torch.manual_seed(123)
    seeded_adapter(4, 2, 3, torch.Generator().manual_seed(0), torch.device("cpu"))
    assert torch.equal(torch.rand(3), expected)


def test_empty_task_plan_releases_the_initialisation_untouched():
    plan = TaskPlan(events=(), noise={"empty_task_release": "initialisation", "steps": 0, "max_grad_norm": 1.0})
    schedule = schedule_from_plan(plan, {"batch_size": 8, "epochs": 2}, 0)
    assert schedule.steps == 0 and not schedule.private
    model = AdapterClassifier(5, 2, 3)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    train_classifier(model, torch.zeros(0, 5), torch.zeros(0, dtype=torch.long), schedule,
                     learning_rate=0.1, generator=torch.Generator().manual_seed(0))
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())


@pytest.mark.filterwarnings("ignore:Full backward hook is firing")
def test_train_classifier_step_is_clipped_sum_plus_planned_noise_from_the_given_generator():
    """One step of *our* loop at q = 1, checked against Alg. A1 written out here.

    The generator first draws the Poisson mask (rand(n) < q: all examples at q = 1), then the noise
    N(0, (z C)^2) of every parameter in order; the privatised gradient is (sum of per-example gradients
    clipped to total norm C + noise) / (q n). A zero learning rate leaves the weights at their start, so the
    per-example gradients are recomputed here at the same point.
    """
    n, clip, z = 6, 0.3, 1.7
    x = torch.randn(n, 4, generator=torch.Generator().manual_seed(3))
    y = torch.tensor([0, 1, 2, 1, 0, 2])
    model = AdapterClassifier(4, 3, 0)
    with torch.no_grad():
        model.head.weight.copy_(torch.randn(3, 4, generator=torch.Generator().manual_seed(4)))
    params = [model.head.weight, model.head.bias]
    start = [p.detach().clone() for p in params]
    clipped = [torch.zeros_like(p) for p in params]
    for i in range(n):
        grads = torch.autograd.grad(
            torch.nn.functional.cross_entropy(model(x[i : i + 1]), y[i : i + 1], reduction="sum"), params
        )
        norm = math.sqrt(sum(float(g.pow(2).sum()) for g in grads))
        for acc, g in zip(clipped, grads):
            acc += g * min(1.0, clip / (norm + 1e-6))
    reference = torch.Generator().manual_seed(11)
    assert bool(torch.all(torch.rand(n, generator=reference) < 1.0))
    expected = [(c + torch.normal(0.0, z * clip, size=p.shape, generator=reference)) / n for c, p in zip(clipped, params)]
    train_classifier(model, x, y, SgdSchedule(1.0, 1, z, clip), learning_rate=0.0,
                     generator=torch.Generator().manual_seed(11))
    for p, before, want in zip(params, start, expected):
        assert torch.equal(p.detach(), before)
        torch.testing.assert_close(p.grad, want, rtol=1e-5, atol=1e-6)
