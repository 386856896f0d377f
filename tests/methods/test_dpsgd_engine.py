"""The one DP-SGD step engine: every planned step runs, an empty Poisson sample still releases noise, the
released gradient is the clipped sum plus Gaussian noise over the expected batch size, and hooks act only on
the released gradient (A-GEM/GEM projections, penalties added after the noise, EWC's Fisher)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from opacus import GradSampleModule  # noqa: E402
from opacus.optimizers import DPOptimizer  # noqa: E402
from torch import nn  # noqa: E402

from dpcl.methods.dpsgd_engine import (  # noqa: E402
    AccumulateSquaredGradient,
    AddPenaltyGradient,
    DpSgdEngine,
    ProjectGradient,
    StepHook,
    backward_quietly,
    cross_entropy_sum,
    poisson_sample,
)

pytestmark = pytest.mark.torch


def _setup(n=64, sigma=1.0, clip=0.5, rate=0.25, seed=0):
    torch.manual_seed(seed)
    model = nn.Linear(4, 3)
    x, y = torch.randn(n, 4), torch.randint(0, 3, (n,))
    gsm = GradSampleModule(model, loss_reduction="sum")
    params = [p for p in model.parameters()]
    generator = torch.Generator().manual_seed(seed + 1)
    optimizer = DPOptimizer(torch.optim.SGD(params, lr=0.1), noise_multiplier=sigma, max_grad_norm=clip,
                            expected_batch_size=max(1, round(rate * n)), loss_reduction="mean", generator=generator)
    return model, gsm, params, x, y, generator, optimizer


def test_every_step_runs_and_an_empty_sample_releases_noise_only():
    model, gsm, params, x, y, generator, optimizer = _setup(n=8, rate=0.02)
    before = [p.detach().clone() for p in params]

    sizes = []

    def sample(step):
        batch = poisson_sample(8, 0.02, generator, "cpu")
        sizes.append(int(batch.numel()))
        return batch, sizes[-1]

    engine = DpSgdEngine(params, optimizer, True, sample,
                         lambda step, idx: backward_quietly(cross_entropy_sum(gsm, (x,), y, idx)))
    counts = engine.run(30)
    assert counts["steps_run"] == 30  # no step is skipped, empty or not
    assert counts["empty_steps"] > 15  # q = 0.02 on 8 examples: most samples are empty
    assert counts["examples_sampled"] == sum(sizes) and counts["empty_steps"] == sizes.count(0)
    assert any(not torch.equal(a, b.detach()) for a, b in zip(before, params))  # noise moved the weights


def test_a_non_private_empty_sample_releases_nothing():
    model = nn.Linear(4, 3)
    params = list(model.parameters())
    optimizer = torch.optim.SGD(params, lr=0.1)
    before = [p.detach().clone() for p in params]
    engine = DpSgdEngine(params, optimizer, False, lambda step: (torch.zeros(0, dtype=torch.long), 0),
                         lambda step, idx: None)
    assert engine.run(5) == {"steps_run": 0, "empty_steps": 5, "examples_sampled": 0}
    assert all(torch.equal(a, b.detach()) for a, b in zip(before, params))


def test_the_released_gradient_is_the_clipped_sum_plus_noise_over_the_expected_batch():
    """One step by hand: per-example gradients clipped to C, summed, N(0, (sigma C)^2) from the same generator
    state, divided by the expected batch size q n; the hook sees exactly that."""
    n, sigma, clip, rate = 32, 0.7, 0.3, 0.25
    model, gsm, params, x, y, generator, optimizer = _setup(n=n, sigma=sigma, clip=clip, rate=rate)
    batch = torch.arange(0, n, 3)
    seen = {}

    class Record(StepHook):
        def after_release(self, step, engine):
            seen["grad"] = [p.grad.detach().clone() for p in engine.params]

    # the expected release, from the per-example gradients and a copy of the generator's state
    state = generator.get_state()
    per_example = []
    for i in batch.tolist():
        model.zero_grad()
        backward_quietly(nn.functional.cross_entropy(model(x[i:i + 1]), y[i:i + 1], reduction="sum"))
        per_example.append([p.grad.detach().clone() for p in params])
    norms = torch.stack([torch.sqrt(sum((g ** 2).sum() for g in grads)) for grads in per_example])
    factors = (clip / (norms + 1e-6)).clamp(max=1.0)
    clipped = [sum(f * grads[j] for f, grads in zip(factors, per_example)) for j in range(len(params))]
    check = torch.Generator().manual_seed(0)
    check.set_state(state)
    noise = [torch.normal(0, sigma * clip, p.shape, generator=check) for p in params]
    expected = [(c + z) / round(rate * n) for c, z in zip(clipped, noise)]
    model.zero_grad()
    generator.set_state(state)

    engine = DpSgdEngine(params, optimizer, True, lambda step: (batch, int(batch.numel())),
                         lambda step, idx: backward_quietly(cross_entropy_sum(gsm, (x,), y, idx)), [Record()],
                         expected_batch_size=rate * n)
    engine.run(1)
    for got, want in zip(seen["grad"], expected):
        assert torch.allclose(got, want, atol=1e-5)


def test_hooks_act_on_the_released_gradient_in_order():
    model, gsm, params, x, y, generator, optimizer = _setup()
    sample = lambda step: (torch.arange(0, 64, 2), 32)  # noqa: E731
    backward = lambda step, idx: backward_quietly(cross_entropy_sum(gsm, (x,), y, idx))  # noqa: E731
    fisher = [torch.zeros_like(p) for p in params]
    projected = []

    def zero_out(gradient, step, engine):
        projected.append(gradient.clone())
        return torch.zeros_like(gradient)

    penalty = AddPenaltyGradient(lambda: sum((p ** 2).sum() for p in params))
    project = ProjectGradient(zero_out)
    before = [p.detach().clone() for p in params]
    engine = DpSgdEngine(params, optimizer, True, sample, backward,
                         [AccumulateSquaredGradient(fisher, 2.0), project, penalty])
    engine.run(1)
    assert project.projections == 1 and len(projected) == 1
    # the Fisher saw the released gradient (before the projection zeroed it)
    released = torch.cat([f.reshape(-1) for f in fisher])
    assert torch.allclose(released, projected[0] ** 2 / 2.0)
    # after the projection only the penalty's gradient 2 p remains: SGD moves p to p - 0.1 * 2 p
    for a, b in zip(before, params):
        assert torch.allclose(b.detach(), a * 0.8, atol=1e-6)
