import math
import subprocess
import sys

import numpy as np
import pytest
from audit_reference import gaussian_epsilon_closed_form

torch = pytest.importorskip("torch")

from dpcl.audit.blackbox import audit_scores  # noqa: E402
from dpcl.audit.canary import (  # noqa: E402
    audit_dpsgd_canary,
    batched_dpsgd_step,
    canary_dataset,
    per_example_gradients,
    shadow_run_scores,
)
from dpcl.errors import InvalidParameterError  # noqa: E402


def test_importing_dpcl_audit_does_not_import_torch():
    code = "import sys, dpcl.audit, dpcl.audit.mechanisms, dpcl.audit.blackbox; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"


def test_per_example_gradients_match_autograd():
    from torch.func import grad, vmap

    def loss(w, x, y):
        return torch.nn.functional.binary_cross_entropy_with_logits(x @ w, y)

    gen = torch.Generator().manual_seed(0)
    w = torch.randn(7, 5, generator=gen, dtype=torch.float64)
    x = torch.randn(11, 5, generator=gen, dtype=torch.float64)
    y = (torch.rand(11, generator=gen) < 0.5).to(torch.float64)
    reference = vmap(vmap(grad(loss), in_dims=(None, 0, 0)), in_dims=(0, None, None))(w, x, y)
    torch.testing.assert_close(per_example_gradients(w, x, y), reference)


@pytest.mark.filterwarnings("ignore:Full backward hook is firing")
def test_one_batched_step_matches_opacus():
    from opacus import GradSampleModule
    from opacus.optimizers import DPOptimizer

    gen = torch.Generator().manual_seed(1)
    x, y, canary, canary_y = canary_dataset(12, 3, 4.0, gen)
    x = torch.cat([x, canary[None]])
    y = torch.cat([y, canary_y[None]])
    weights = 0.3 * torch.randn(4, 4, generator=gen, dtype=torch.float64)
    mask = (torch.rand(4, 13, generator=gen) < 0.6).to(torch.float64)
    clip, lr, ebs = 0.7, 0.5, 6.0
    ours, _, _ = batched_dpsgd_step(
        weights, x, y, mask, torch.zeros(4, 4, dtype=torch.float64), clip_norm=clip, learning_rate=lr,
        expected_batch_size=ebs,
    )
    for r in range(4):
        model = torch.nn.Linear(4, 1, bias=False).to(torch.float64)
        model.weight.data = weights[r : r + 1].clone()
        gsm = GradSampleModule(model)
        opt = DPOptimizer(
            torch.optim.SGD(gsm.parameters(), lr=lr), noise_multiplier=0.0, max_grad_norm=clip, expected_batch_size=ebs
        )
        chosen = mask[r].bool()
        opt.zero_grad()
        out = gsm(x[chosen]).squeeze(-1)
        torch.nn.functional.binary_cross_entropy_with_logits(out, y[chosen]).backward()
        opt.step()
        torch.testing.assert_close(model.weight.data[0], ours[r])


@pytest.mark.parametrize("noise_multiplier", [0.5, 1.0, 2.0])
def test_single_full_batch_step_is_a_gaussian_mechanism_and_the_bound_respects_it(noise_multiplier):
    # q = 1, T = 1: the canary's clipped gradient has norm C (it starts unfitted), so the white-box score
    # is a Gaussian mechanism with mu = 1 / noise_multiplier; its exact epsilon is the closed form.
    true_eps = gaussian_epsilon_closed_form(noise_multiplier, 1e-5)
    for seed in range(5):
        scores = shadow_run_scores(noise_multiplier=noise_multiplier, sample_rate=1.0, steps=1, shadow_runs=2000, seed=seed)
        out, inn = scores["gradient"]
        # the statistic is exactly Gaussian: N(-1/(2 z^2), 1/z^2) without the canary, mean +1/(2 z^2) with it
        assert np.mean(inn) - np.mean(out) == pytest.approx(1 / noise_multiplier**2, rel=0.25)
        bound = audit_scores(out, inn, 1e-5, seed=seed).epsilon_lower_bound
        assert 0 < bound <= true_eps


def test_canary_audit_reports_bound_below_the_accountant():
    r = audit_dpsgd_canary(noise_multiplier=0.8, sample_rate=0.5, steps=10, delta=1e-5, shadow_runs=600, seed=3)
    assert 0 < r.epsilon_lower_bound <= r.accountant_epsilon
    assert set(r.audits) == {"loss", "gradient"}
    assert r.audits["gradient"].confidence == pytest.approx(0.975)
    d = r.to_dict()
    assert d["adjacency"] == "add_remove" and d["unit"] == "example"
    assert d["accountant"] and math.isfinite(d["accountant_epsilon"]) and 0 < d["ratio"] <= 1


def test_scores_are_deterministic_given_the_seed():
    a = shadow_run_scores(noise_multiplier=1.0, sample_rate=0.3, steps=3, shadow_runs=64, seed=9)
    b = shadow_run_scores(noise_multiplier=1.0, sample_rate=0.3, steps=3, shadow_runs=64, seed=9)
    for k in a:
        np.testing.assert_array_equal(a[k][0], b[k][0])
        np.testing.assert_array_equal(a[k][1], b[k][1])


@pytest.mark.parametrize(
    "kwargs, word",
    [
        ({"noise_multiplier": 0.0}, "noise_multiplier"),
        ({"sample_rate": 1.5}, "sample_rate"),
        ({"steps": 0}, "steps"),
        ({"delta": 0.0}, "delta"),
        ({"shadow_runs": 4}, "shadow_runs"),
        ({"confidence": 1.2}, "confidence"),
        ({"clip_norm": float("nan")}, "clip_norm"),
    ],
)
def test_invalid_input_is_refused(kwargs, word):
    args = {"noise_multiplier": 1.0, "sample_rate": 0.5, "steps": 2, "delta": 1e-5, "shadow_runs": 32} | kwargs
    with pytest.raises(InvalidParameterError, match=word):
        audit_dpsgd_canary(**args)


@pytest.mark.thorough
@pytest.mark.parametrize(
    "noise_multiplier, sample_rate, steps",
    [(0.5, 1.0, 1), (1.0, 1.0, 4), (0.8, 0.5, 20), (1.0, 0.1, 50)],
)
def test_thorough_canary_audit_many_shadow_runs(noise_multiplier, sample_rate, steps):
    r = audit_dpsgd_canary(
        noise_multiplier=noise_multiplier, sample_rate=sample_rate, steps=steps, delta=1e-5, shadow_runs=20_000, seed=0
    )
    assert 0 < r.epsilon_lower_bound <= r.accountant_epsilon
