"""O-LoRA and GEM baselines of the PeCL table: the projection, the orthogonality loss, and the learner's use of them
with and without DP-SGD (tiny model, a few seconds)."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

torch = pytest.importorskip("torch")

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))  # the PeCL tables live there

from dpcl.accounting.accountants import compute_epsilon  # noqa: E402
from dpcl.accounting.dpsgd import dpsgd_events  # noqa: E402
from dpcl.accounting.events import ComposedEvent  # noqa: E402
from dpcl.errors import InvalidParameterError  # noqa: E402
from dpcl.methods.gem import gem_project  # noqa: E402
from dpcl.methods.olora import orthogonality_loss  # noqa: E402
from pecl_experiment import METHODS, TextTask, run_method  # noqa: E402
from dpcl.methods.pecl.learner import ContinualLM, learner_config  # noqa: E402

pytestmark = pytest.mark.torch

TINY = {"n_layer": 1, "n_embd": 16, "n_head": 1, "max_seq_len": 24, "pretrain_steps": 2, "batch_size": 4,
        "lora_rank": 2, "epochs": 1}
PUBLIC = [f"public sentence number {i} about {w}" for i, w in enumerate(["tea", "rain", "maps", "owls"] * 4)]


def _task(k: int) -> TextTask:
    texts = [f"apples {i} and pears {k}" for i in range(8)] + [f"{i} Main Street {k}" for i in range(8)]
    labels = np.array([2 * k] * 8 + [2 * k + 1] * 8)
    return TextTask(tuple(texts), labels, tuple(texts[:3] + texts[8:11]), np.array([2 * k] * 3 + [2 * k + 1] * 3),
                    (2 * k, 2 * k + 1))


# ---------------------------------------------------------------- GEM's projection (eq. 10-11)
def _primal_reference(g: np.ndarray, memories: np.ndarray) -> np.ndarray:
    """eq. 10 solved directly in the primal by another solver (SLSQP): min 1/2 ||z - g||^2 s.t. G z >= 0."""
    from scipy.optimize import minimize

    result = minimize(lambda z: 0.5 * np.sum((z - g) ** 2), g, jac=lambda z: z - g, method="SLSQP",
                      constraints=[{"type": "ineq", "fun": lambda z: memories @ z, "jac": lambda z: memories}],
                      options={"ftol": 1e-12, "maxiter": 500})
    assert result.success, result.message
    return result.x


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 10_000), tasks=st.integers(1, 4), dim=st.integers(2, 12))
def test_gem_projection_is_the_closest_gradient_that_raises_no_memory_loss(seed, tasks, dim):
    rng = np.random.default_rng(seed)
    g, memories = rng.normal(size=dim), rng.normal(size=(tasks, dim))
    z = gem_project(torch.as_tensor(g), torch.as_tensor(memories)).numpy()
    assert (memories @ z >= -1e-8).all()
    if (memories @ g >= 0).all():
        np.testing.assert_array_equal(z, g)  # nothing violated: the gradient is used as it is
    else:
        np.testing.assert_allclose(z, _primal_reference(g, memories), atol=1e-5)


def test_gem_projection_refuses_mismatched_shapes():
    with pytest.raises(InvalidParameterError, match="memory gradients"):
        gem_project(torch.zeros(3), torch.zeros(2, 4))


# ---------------------------------------------------------------- O-LoRA's L_orth
def test_orthogonality_loss_is_the_squared_overlap_of_the_adapters_subspaces():
    rng = np.random.default_rng(1)
    new = [torch.as_tensor(rng.normal(size=(2, 5))) for _ in range(3)]
    old = [[torch.as_tensor(rng.normal(size=(2, 5))) for _ in range(3)] for _ in range(2)]
    expected = sum(float(np.sum((o.numpy() @ n.numpy().T) ** 2)) for task in old for o, n in zip(task, new))
    assert float(orthogonality_loss(new, old)) == pytest.approx(expected)
    basis = torch.eye(5, dtype=torch.float64)
    assert float(orthogonality_loss([basis[:2]], [[basis[2:4]]])) == 0.0  # orthogonal subspaces cost nothing
    with pytest.raises(InvalidParameterError):
        orthogonality_loss(new, [old[0][:2]])


@pytest.mark.parametrize("privacy", ["none", "dpsgd"])
def test_olora_trains_a_fresh_adapter_per_task_and_keeps_the_earlier_ones_frozen_and_summed(privacy):
    learner = ContinualLM(6, learner_config(**TINY, strategy="olora", privacy=privacy), 0, PUBLIC,
                          reproducible_noise=True)
    first = _task(0)
    learner.fit_task(0, list(first.train_texts), first.train_labels)
    after_first = [p.detach().clone() for p in learner._lora_parameters("task_0")]
    second = _task(1)
    learner.fit_task(1, list(second.train_texts), second.train_labels)
    assert learner.adapter == "task_1"
    for before, now in zip(after_first, learner._lora_parameters("task_0")):
        assert torch.equal(before, now) and not now.requires_grad
    assert all(p.requires_grad for p in learner._lora_parameters("task_1"))
    assert learner.model.lm.base_model.active_adapters == ["task_0", "task_1"]
    # the new adapter was trained (its B left zero) and both adapters' outputs are added
    assert any(float(b.detach().abs().sum()) > 0 for _, b in learner._lora_pairs("task_1"))
    scores = learner.class_scores(list(second.test_texts))
    learner.model.lm.base_model.set_adapter(["task_1"])
    assert not np.allclose(scores, learner.class_scores(list(second.test_texts)))


# ---------------------------------------------------------------- GEM in the learner
def test_gem_keeps_one_memory_per_task_and_projects_against_it():
    learner = ContinualLM(6, learner_config(**TINY, strategy="gem", privacy="none", replay_per_task=4), 0, PUBLIC)
    records = [learner.fit_task(k, list(_task(k).train_texts), _task(k).train_labels) for k in range(2)]
    assert [len(texts) for texts, _ in learner.memories] == [4, 4]
    assert all(t in _task(k).train_texts for k, (texts, _) in enumerate(learner.memories) for t in texts)
    assert "gem_projected" not in records[0]["last_losses"] and "gem_projected" in records[1]["last_losses"]


def test_dp_gem_reads_its_memories_only_through_clipped_noisy_queries_and_is_charged_for_them(monkeypatch):
    """Each DP-SGD step of a later task runs one opacus query per memory (per-example clipping, the task's noise
    multiplier, Poisson sampling); the worst memory example's epsilon composes its task and every later one."""
    from opacus.optimizers import DPOptimizer

    queries: list[tuple[float, float]] = []
    original_pre = DPOptimizer.pre_step

    def spy_pre(self, *args, **kwargs):
        queries.append((self.noise_multiplier, self.max_grad_norm))
        return original_pre(self, *args, **kwargs)

    monkeypatch.setattr(DPOptimizer, "pre_step", spy_pre)
    tasks = [_task(k) for k in range(3)]
    result = run_method("GEM+DPSGD", {**METHODS["GEM+DPSGD"], "replay_per_task": 4}, tasks, PUBLIC, 6, seed=0,
                        base=TINY, reproducible_noise=True)
    runs = [r["dpsgd"] for r in result["tasks"]]
    assert len(queries) == sum(r["steps"] * (1 + k) for k, r in enumerate(runs))  # task step + one per memory
    assert {q for q in queries} == {(runs[0]["noise_multiplier"], 1.0)}  # same size tasks: one noise level
    events = [dpsgd_events(r["noise_multiplier"], r["sample_rate"], r["steps"]) for r in runs]
    assert result["privacy"]["epsilon"] == pytest.approx(compute_epsilon(ComposedEvent(events), 1e-6).epsilon)
    assert result["privacy"]["epsilon"] > max(result["privacy"]["per_task"])
