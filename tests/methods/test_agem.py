"""DP-SGD A-GEM (``[method] name = "agem"``): its plan, its refusals, the projection and that it learns."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from dpcl.errors import ConfigError, PrivacyViolationError  # noqa: E402
from dpcl.audit_config import audit_config  # noqa: E402
from dpcl.guarantees.config import parse_config  # noqa: E402
from dpcl.methods.agem.spec import AGEM  # noqa: E402
from dpcl.methods.base import MethodSetup, TrainingData  # noqa: E402
from dpcl.methods.agem.method import AGemFineTuning  # noqa: E402
from dpcl.methods.dpsgd_training import ReferenceGradient, SgdSchedule, train_classifier  # noqa: E402
from dpcl.methods.gem import agem_project  # noqa: E402

METHOD = {"epochs": 2, "batch_size": 20, "max_grad_norm": 1.0, "adapter_dim": 0, "learning_rate": 0.1}
PRIVACY = {"epsilon": 2.0, "delta": 1e-5, "adjacency": "add_remove", "accountant": "auto",
           "across_tasks": "sequential"}


def _config(across: str = "sequential", **method):
    return parse_config({
        "privacy": {**PRIVACY, "across_tasks": across},
        "stream": {"dataset": "digits", "tasks": [[0, 1], [2, 3], [4, 5]], "label_space": "prior_const",
                   "prior_labels": [0, 1, 2, 3, 4, 5], "disjoint_units": True},
        "method": {"name": "agem", **METHOD, **method},
    })


def _reference_epsilon(steps_and_rates, delta):
    """dp-accounting's PLD (add/remove) of the DP-SGD steps of every task, composed: the sequential bound."""
    from dp_accounting import dp_event
    from dp_accounting.pld import pld_privacy_accountant

    accountant = pld_privacy_accountant.PLDAccountant(value_discretization_interval=1e-4)
    for sigma, rate, steps in steps_and_rates:
        accountant.compose(dp_event.PoissonSampledDpEvent(rate, dp_event.GaussianDpEvent(sigma)), steps)
    return accountant.get_epsilon(delta)


@pytest.mark.parametrize("memory_rate", [None, 0.5])
def test_plan_charges_every_task_at_the_larger_rate_and_composes_all_tasks(memory_rate):
    extra = {} if memory_rate is None else {"memory_sample_rate": memory_rate}
    sizes = [100, 200, 80]
    report = audit_config(_config(**extra), sizes)
    assert report.sound
    plans = [AGEM.plan_task({**METHOD, **extra}, PRIVACY, n, t) for t, n in enumerate(sizes)]
    charged = []
    for t, (plan, n) in enumerate(zip(plans, sizes)):
        (event,) = plan.events
        q_task = METHOD["batch_size"] / n
        expected_rate = q_task if (t == 0 or memory_rate is None) else max(q_task, memory_rate)
        assert event.event.sample_rate == pytest.approx(expected_rate)
        assert event.count == METHOD["epochs"] * int(np.ceil(n / METHOD["batch_size"]))
        assert plan.noise["sample_rate"] == pytest.approx(q_task)  # the task's own Poisson rate in training
        assert plan.noise["noise_multiplier"] == event.event.noise_multiplier
        charged.append((event.event.noise_multiplier, event.event.sample_rate, event.count))
        assert plan.noise["task_epsilon"] <= PRIVACY["epsilon"] * (1 + 1e-9)
    reference = _reference_epsilon(charged, PRIVACY["delta"])
    # sequential over every task's steps: an upper bound of the composed PLD, well above one task's budget
    assert report.epsilon >= reference - 1e-3
    assert report.epsilon <= reference * 1.02
    assert report.epsilon > 1.5 * PRIVACY["epsilon"]


@pytest.mark.parametrize("across", ["auto", "parallel"])
def test_parallel_composition_is_refused_with_what_to_change(across):
    with pytest.raises(ConfigError, match="across_tasks = 'sequential'"):
        audit_config(_config(across), [100, 100, 100])


def test_cli_audit_refuses_parallel_composition(tmp_path):
    import subprocess
    import sys

    config = tmp_path / "agem.toml"
    config.write_text(
        '[privacy]\nepsilon = 1.0\ndelta = 1e-5\naccountant = "auto"\n'
        '[stream]\ndataset = "digits"\ntasks = [[0, 1], [2, 3]]\nlabel_space = "prior_const"\n'
        'prior_labels = [0, 1, 2, 3]\ndisjoint_units = true\n'
        '[method]\nname = "agem"\nepochs = 1\nbatch_size = 16\nmax_grad_norm = 1.0\n'
    )
    done = subprocess.run([sys.executable, "-m", "dpcl", "audit", str(config)], capture_output=True, text=True)
    assert done.returncode == 2
    assert "across_tasks = 'sequential'" in done.stderr and "Traceback" not in done.stderr


def test_agem_projection_removes_the_conflicting_component_only():
    gen = torch.Generator().manual_seed(0)
    for _ in range(20):
        g, g_ref = torch.randn(50, generator=gen), torch.randn(50, generator=gen)
        out = agem_project(g, g_ref)
        if torch.dot(g, g_ref) >= 0:
            assert torch.equal(out, g)
        else:
            assert abs(float(torch.dot(out, g_ref))) < 1e-4 * float(g.norm() * g_ref.norm())
            # the change is along g_ref only
            diff = g - out
            assert torch.allclose(diff, diff.dot(g_ref) / g_ref.dot(g_ref) * g_ref, atol=1e-5)
    g = torch.randn(5, generator=gen)
    assert torch.equal(agem_project(g, torch.zeros(5)), g)


def test_reference_gradient_is_noised_like_the_step_and_combine_gives_the_update():
    """Private steps: combine sees two noisy gradients of the planned scale; a zero direction leaves the model."""
    seen = []

    def keep_still(g, g_ref):
        seen.append((g.clone(), g_ref.clone()))
        return torch.zeros_like(g)

    from dpcl.methods.dpsgd_training import AdapterClassifier

    model = AdapterClassifier(4, 3, 0)
    before = [p.detach().clone() for p in model.parameters()]
    features = torch.zeros(50, 4)
    targets = torch.zeros(50, dtype=torch.long)
    memory = ReferenceGradient(torch.zeros(40, 4), torch.zeros(40, dtype=torch.long), 0.5, keep_still)
    schedule = SgdSchedule(sample_rate=0.2, steps=30, noise_multiplier=2.0, max_grad_norm=1.0)
    train_classifier(model, features, targets, schedule, learning_rate=0.5, generator=torch.Generator().manual_seed(1),
                     reference=memory, optimizer_name="sgd")
    assert len(seen) == 30
    for p, q in zip(before, model.parameters()):
        assert torch.equal(p, q)
    # zero features: the only non-zero per-example gradients are the bias's, so the noise dominates; its scale is
    # noise_multiplier * C / (expected batch): 2 / 10 for the task, 2 / 20 for the memory
    task_sd = torch.stack([g for g, _ in seen])[:, :12].std().item()
    ref_sd = torch.stack([r for _, r in seen])[:, :12].std().item()
    assert 0.13 < task_sd < 0.3
    assert 0.065 < ref_sd < 0.15


def _blobs(labels, n_per_class, gen, dim=8):
    centres = torch.eye(10, dim, dtype=torch.float32)[:, :dim] * 3.0
    y = torch.tensor(labels).repeat_interleave(n_per_class)
    x = centres[y] + 0.5 * torch.randn(len(y), dim, generator=gen)
    return x.numpy(), y.numpy()


def test_tiny_private_run_learns_every_task_above_chance():
    gen = torch.Generator().manual_seed(0)
    tasks = [(0, 1), (2, 3), (4, 5)]
    method = {**METHOD, "memory_per_task": 100, "learning_rate": 0.5, "optimizer": "sgd"}
    setup = MethodSetup(method=method, privacy=PRIVACY, label_space=tuple(range(6)), input_dim=8, seed=0)
    agem = AGemFineTuning(setup)
    offset = 0
    test_sets = []
    for t, labels in enumerate(tasks):
        x, y = _blobs(labels, 300, gen)
        data = TrainingData(x, y, np.arange(offset, offset + len(y)))
        offset += len(y)
        plan = AGEM.plan_task({**METHOD, **method}, {**PRIVACY, "epsilon": 8.0}, len(y), t)
        agem.fit_task(t, data, labels, plan)
        test_sets.append(_blobs(labels, 100, gen))
    accuracies = [agem.accuracy(x, y) for x, y in test_sets]
    chance = 1 / 6
    assert np.mean(accuracies) > chance + 0.25, accuracies
    assert accuracies[-1] > 0.5, accuracies
    # the release holds no memory; the curator state does
    assert not any("memory" in key for key in agem.state_dict())
    assert agem.curator_state_dict()["memory_features"].shape == (200 + 100, 8)


def _after_one_task(gen):
    """(setup, an A-GEM model trained on a first task of 40 examples with units 0..39)."""
    setup = MethodSetup(method={**METHOD, "memory_per_task": 10}, privacy=PRIVACY, label_space=(0, 1, 2, 3),
                        input_dim=8, seed=0)
    agem = AGemFineTuning(setup)
    x, y = _blobs((0, 1), 20, gen)
    agem.fit_task(0, TrainingData(x, y, np.arange(40)), (0, 1), AGEM.plan_task(METHOD, PRIVACY, 40, 0))
    return setup, agem


def test_memory_units_in_a_later_task_are_refused():
    gen = torch.Generator().manual_seed(0)
    _, agem = _after_one_task(gen)
    x, y = _blobs((2, 3), 20, gen)
    with pytest.raises(PrivacyViolationError, match="disjoint units"):
        agem.fit_task(1, TrainingData(x, y, np.arange(40)), (2, 3), AGEM.plan_task(METHOD, PRIVACY, 40, 1))


def test_resume_needs_the_memory_from_the_curator_state():
    gen = torch.Generator().manual_seed(0)
    setup, first = _after_one_task(gen)
    second = AGemFineTuning(setup)
    second.load_state_dict(first.state_dict())
    x, y = _blobs((2, 3), 20, gen)
    data, plan = TrainingData(x, y, np.arange(40, 80)), AGEM.plan_task(METHOD, PRIVACY, 40, 1)
    with pytest.raises(Exception, match="curator"):
        second.fit_task(1, data, (2, 3), plan)
    second.load_curator_state_dict(first.curator_state_dict())
    second.fit_task(1, data, (2, 3), plan)
    assert second.tasks_fitted == 2


@pytest.mark.thorough
def test_dpcl_run_certifies_every_release_and_keeps_the_memory_private(tmp_path):
    """End to end through the runner: sequential ε over the tasks, certificates verify, memory only in curator/."""
    import json
    import subprocess
    import sys

    config = tmp_path / "agem.toml"
    config.write_text(
        '[privacy]\nepsilon = 4.0\ndelta = 1e-5\naccountant = "auto"\nacross_tasks = "sequential"\n'
        '[stream]\ndataset = "digits"\ntasks = [[0, 1], [2, 3]]\nlabel_space = "prior_const"\n'
        'prior_labels = [0, 1, 2, 3]\ndisjoint_units = true\n'
        '[method]\nname = "agem"\nepochs = 1\nbatch_size = 32\nmax_grad_norm = 1.0\nadapter_dim = 0\n'
        'learning_rate = 0.5\nmemory_per_task = 40\n'
    )
    out = tmp_path / "run"
    run = subprocess.run([sys.executable, "-m", "dpcl", "run", str(config), "--out", str(out), "--quiet"],
                         capture_output=True, text=True)
    assert run.returncode == 0, run.stderr[-2000:]
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["across_tasks"] == "sequential"
    assert metrics["cumulative_epsilon"][1] > metrics["cumulative_epsilon"][0] > 0
    verify = subprocess.run([sys.executable, "-m", "dpcl", "verify", str(out), "--cross-check"],
                            capture_output=True, text=True)
    assert verify.returncode == 0, verify.stdout[-2000:]
    release = torch.load(out / "checkpoints" / "task002.pt", map_location="cpu", weights_only=True)
    assert "memory" not in json.dumps(list(release)) and "memory" not in json.dumps(list(release["state"]))
    curator = torch.load(out / "curator" / "task002.state.pt", map_location="cpu", weights_only=True)
    assert curator["state"]["memory_features"].shape[0] == 80
