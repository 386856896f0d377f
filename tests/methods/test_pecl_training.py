"""PeCL and its baselines end to end on a tiny model (seconds on CPU), and the ``dpcl run`` adapter."""

from __future__ import annotations

import math

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from dpcl.errors import ConfigError, InvalidParameterError, PrivacyViolationError  # noqa: E402
from dpcl.guarantees import per_token as pt  # noqa: E402
import dpcl.methods.pecl.spec as pecl_spec  # noqa: E402
from dpcl.methods.pecl.learner import ContinualLM, learner_config  # noqa: E402

pytestmark = pytest.mark.torch

TINY = {"n_layer": 1, "n_embd": 16, "n_head": 1, "max_seq_len": 24, "pretrain_steps": 2, "batch_size": 8,
        "lora_rank": 2, "epochs": 2}
PUBLIC = [f"public sentence number {i} about nothing" for i in range(16)]


def _tasks():
    a = [f"apples and pears {i}" for i in range(8)] + [f"12 Main Street {i}" for i in range(8)]
    b = [f"zebra crossing {i}" for i in range(8)] + [f"call 555-01{i:02d}" for i in range(8)]
    return [(a, np.repeat([0, 1], 8)), (b, np.repeat([2, 3], 8))]


@pytest.mark.parametrize("calibration", ["analytic", "paper"])
def test_pecl_trains_and_records_true_per_token_guarantee(calibration):
    learner = ContinualLM(4, learner_config(**TINY, calibration=calibration), seed=0, public_texts=PUBLIC)
    records = [learner.fit_task(k, texts, labels) for k, (texts, labels) in enumerate(_tasks())]
    for r in records:
        g = r["guarantee"]
        assert g["unit"] == "token" and g["adjacency"] == "replace_one" and g["sensitivity"] == 2.0
        assert g["releases_per_token"] == 2
        true = pt.true_token_epsilons(g["sigma_min_used"], 1e-6, 1.0, releases=2)
        assert g["epsilon"] == pytest.approx(true)
        if calibration == "analytic":
            assert g["epsilon"] <= 10.0 * (1 + 1e-6)
        else:
            assert g["epsilon"] > g["claimed_epsilon_of_worst_token"]
        assert g["sequence"]["epsilon"] >= g["epsilon"] and g["sequence"]["longest_sequence_tokens"] <= 24
        assert 0.0 <= r["mean_score"] <= 1.0
        assert 1.0 <= r["lambda_dyn"] <= 10.0
    assert records[1]["omega_bar"] > 0  # memory regularisation active from the second task on
    assert learner.adapter == "task_1"
    ids, mask = learner._encode(_tasks()[0][0])
    scores = learner.token_scores(ids, mask)
    assert scores.shape == ids.shape and float(scores.min()) >= 0 and float(scores.max()) <= 1
    preds = learner.predict(_tasks()[0][0])
    assert set(preds.tolist()) <= {0, 1, 2, 3}
    nll = learner.sequence_nll(["abc", "abcdef"])
    assert nll.shape == (2,) and np.all(nll > 0)


@pytest.mark.parametrize(
    "strategy,privacy",
    [("seqft", "none"), ("er", "none"), ("ewc", "dpsgd"),
     pytest.param("er", "dpsgd", marks=pytest.mark.thorough), pytest.param("ewc", "none", marks=pytest.mark.thorough)],
)
def test_baselines_train(strategy, privacy):
    learner = ContinualLM(4, learner_config(**TINY, strategy=strategy, privacy=privacy), seed=0, public_texts=PUBLIC)
    records = [learner.fit_task(k, texts, labels) for k, (texts, labels) in enumerate(_tasks())]
    if privacy == "dpsgd":
        from dpcl.accounting.dpsgd import dpsgd_epsilon

        d = records[0]["dpsgd"]
        assert dpsgd_epsilon(d["noise_multiplier"], d["sample_rate"], d["steps"], 1e-6).epsilon <= 1.0 * 1.01
    if strategy == "er":
        assert records[1]["n_trained"] == 16 + learner.config.replay_per_task
    if strategy == "ewc":
        assert len(learner.ewc_terms) == 2
    acc = learner.accuracy(*_tasks()[1])
    assert 0.0 <= acc <= 1.0


def test_dpsgd_baseline_takes_a_noise_step_for_every_poisson_sample_even_an_empty_one(monkeypatch):
    """batch_size 1 on 16 texts: q = 1/16, 32 steps; with the reproducible opt-in the Poisson masks are
    recomputed here from the documented noise source, some are empty, and every step still reaches opacus."""
    from opacus.optimizers import DPOptimizer

    from dpcl.methods.noise_source import noise_torch_generator

    calls = []
    original = DPOptimizer.pre_step
    monkeypatch.setattr(DPOptimizer, "pre_step", lambda self, *a, **k: calls.append(1) or original(self, *a, **k))
    config = learner_config(**{**TINY, "batch_size": 1}, strategy="seqft", privacy="dpsgd")
    learner = ContinualLM(4, config, seed=3, public_texts=PUBLIC, reproducible_noise=True)
    texts, labels = _tasks()[0]
    record = learner.fit_task(0, texts, labels)
    steps, q = record["dpsgd"]["steps"], record["dpsgd"]["sample_rate"]
    assert (steps, q) == (32, 1 / 16)
    sampling = noise_torch_generator(3, True, 0, 1)
    empty = sum(int(not bool((torch.rand(16, generator=sampling) < q).any())) for _ in range(steps))
    assert empty >= 1 and len(calls) == steps


def test_learner_config_refuses_mismatched_privacy():
    with pytest.raises(InvalidParameterError, match="tdp"):
        learner_config(strategy="seqft", privacy="tdp")
    with pytest.raises(InvalidParameterError, match="unknown"):
        learner_config(colour="blue")


@pytest.mark.thorough
def test_pecl_learns_a_separable_task():
    learner = ContinualLM(4, learner_config(**{**TINY, "epochs": 15}, strategy="seqft", privacy="none",
                                            learning_rate=3e-3, head_learning_rate=1e-2), 0, PUBLIC)
    texts, labels = _tasks()[0]
    learner.fit_task(0, texts, labels)
    assert learner.accuracy(texts, labels) >= 0.9


# ---------------------------------------------------------------- dpcl run adapter
def _setup(**method):
    from dpcl.methods.base import MethodSetup

    keys = {"training": "paper", **TINY}  # PeCL as in the paper; the DP PeCL: test_pecl_dp_training.py
    keys.update(method)
    return MethodSetup(method={"name": "pecl", **keys}, privacy={"delta": 1e-6, "epsilon": 10.0},
                       label_space=(0, 1, 2, 3), input_dim=1, seed=0)


def _data(texts, labels, texts_given=True):
    from dpcl.methods.base import TrainingData

    n = len(texts)
    return TrainingData(features=np.zeros((n, 1), np.float32), labels=np.asarray(labels),
                        unit_ids=np.arange(n) + 10_000 * int(labels[0]), texts=tuple(texts) if texts_given else None)


def test_pecl_method_follows_the_plan_and_round_trips():
    from dpcl.methods.base import method_class

    cls = method_class("pecl")
    setup = _setup()
    method = cls(setup)
    plan = pecl_spec.PECL_SPEC.plan_task(setup.method, setup.privacy, 16, 0)
    texts, labels = _tasks()[0]
    method.fit_task(0, _data(texts, labels), (0, 1), plan)
    scores = method.scores(np.asarray(texts, dtype=object))
    assert scores.shape == (16, 4)
    assert set(method.predict(np.asarray(texts, dtype=object)).tolist()) <= {0, 1}
    state = method.state_dict()
    # the release holds no statistic of the private text: those are curator state
    assert not set(state) & {"token_counts", "omegas", "seen", "task_records"}
    curator = method.curator_state_dict()
    assert int(curator["token_counts"].sum()) == int(method.learner.token_stats.counts.sum()) > 0
    again = cls(setup)
    again.load_state_dict(state)
    assert np.allclose(again.scores(np.asarray(texts, dtype=object)), scores, atol=1e-5)
    # continuing from the release alone would score tokens without the earlier tasks' counts: refused
    texts1, labels1 = _tasks()[1]
    plan1 = pecl_spec.PECL_SPEC.plan_task(setup.method, setup.privacy, len(texts1), 1)
    with pytest.raises(InvalidParameterError, match="curator state"):
        again.fit_task(1, _data(texts1, labels1), (2, 3), plan1)
    again.load_curator_state_dict(curator)
    np.testing.assert_array_equal(again.learner.token_stats.counts, method.learner.token_stats.counts)
    assert again.learner.omegas == method.learner.omegas
    with pytest.raises(InvalidParameterError, match="raw texts"):
        method.scores(np.zeros((2, 3)))


def test_pecl_method_refuses_plan_mismatch_and_missing_texts():
    from dpcl.methods.base import method_class

    setup = _setup()
    method = method_class("pecl")(setup)
    texts, labels = _tasks()[0]
    other = pecl_spec.PECL_SPEC.plan_task({**setup.method, "clip_norm": 0.5}, setup.privacy, 16, 0)
    with pytest.raises(PrivacyViolationError, match="clip_norm"):
        method.fit_task(0, _data(texts, labels), (0, 1), other)
    plan = pecl_spec.PECL_SPEC.plan_task(setup.method, setup.privacy, 16, 0)
    with pytest.raises(ConfigError, match="texts"):
        method.fit_task(0, _data(texts, labels, texts_given=False), (0, 1), plan)
    assert math.isfinite(plan.noise["sigma_min"])


def test_task_importance_reads_only_non_padding_tokens_also_for_tasks_over_64_sequences():
    """Omega_k (eq. 8) averages the adapted layers' input norms over real tokens: trailing padding columns
    (which the causal, masked model never lets real tokens see) must not change it, whatever the task size."""
    learner = ContinualLM(4, learner_config(**TINY), seed=0, public_texts=PUBLIC)
    texts, labels = _tasks()[0]
    learner.fit_task(0, texts, labels)
    for n in (16, 70):
        many = [f"{texts[i % 16]} {i}" for i in range(n)]
        ids, mask = learner._encode(many)
        used = int(mask.sum(dim=1).max())
        assert used < TINY["max_seq_len"]  # there are padding columns to drop
        full = learner._task_importance(ids, mask)
        trimmed = learner._task_importance(ids[:, :used], mask[:, :used])
        assert full > 0
        assert full == pytest.approx(trimmed, rel=1e-5)


def test_ewc_fisher_is_that_of_the_task_loss_not_of_the_earlier_penalty(monkeypatch):
    """EWC's diagonal Fisher of task k comes from the gradients of task k's loss. Frozen weights (learning rate
    0) make two runs see the same batches; an EWC penalty with a large constant gradient in the second must not
    change the Fisher it stores for task 2."""
    from dpcl.methods.pecl import learner as learner_module
    from dpcl.methods.pecl.learner import ContinualLM as CLM

    config = learner_config(**TINY, strategy="ewc", privacy="none", learning_rate=0.0, head_learning_rate=0.0)
    fishers = []
    for steep in (False, True):
        learner_module._PRETRAINED.clear()  # a cache hit would skip the pre-training draws and change the batches
        torch.manual_seed(0)  # peft initialises LoRA from the global RNG
        learner = CLM(4, config, seed=0, public_texts=PUBLIC)
        if steep:
            monkeypatch.setattr(learner, "_ewc_penalty",
                                lambda: 1e3 * torch.stack([p.sum() for p in learner._trainable()]).sum())
        for k, (texts, labels) in enumerate(_tasks()):
            learner.fit_task(k, texts, labels)
        fishers.append([f.clone() for f in learner.ewc_terms[1][0]])
    assert any(float(f.abs().max()) > 0 for f in fishers[0])
    for a, b in zip(*fishers):
        assert torch.allclose(a, b, rtol=1e-5, atol=1e-12)


def test_dpsgd_clips_each_examples_own_gradient(monkeypatch):
    """What opacus clips must be each example's gradient, whatever the Poisson batch size: for the head's bias
    that is softmax(logits_i) - onehot(y_i) (the language-model loss does not reach the head)."""
    from opacus.optimizers import DPOptimizer

    config = learner_config(**TINY, strategy="seqft", privacy="dpsgd")
    learner = ContinualLM(4, config, seed=1, public_texts=PUBLIC, reproducible_noise=True)
    logits, checked = [], []
    learner.model.head.register_forward_hook(lambda _m, _i, out: logits.append(out.detach().clone()))
    original = DPOptimizer.pre_step

    def spy(self, *args, **kwargs):
        sample = learner.model.head.bias.grad_sample
        if sample is not None and sample.shape[0] > 0:
            probs = torch.softmax(logits[-1], dim=1)
            onehot = torch.nn.functional.one_hot(sample.argmin(dim=1), probs.shape[1]).to(probs.dtype)
            checked.append((sample.shape[0], float((sample - (probs - onehot)).abs().max())))
        return original(self, *args, **kwargs)

    monkeypatch.setattr(DPOptimizer, "pre_step", spy)
    texts, labels = _tasks()[0]
    learner.fit_task(0, texts, labels)
    assert any(n != TINY["batch_size"] for n, _ in checked)  # Poisson batches of other sizes than expected occur
    assert max(err for _, err in checked) < 1e-5


def test_pecl_takes_tdp_or_no_privacy_and_never_dpsgd():
    assert learner_config(strategy="pecl", privacy="none").privacy == "none"  # the 'w/o TDP' ablation
    with pytest.raises(InvalidParameterError, match="privacy='tdp'"):
        learner_config(strategy="pecl", privacy="dpsgd")
    with pytest.raises(InvalidParameterError, match="privacy='tdp'"):
        learner_config(strategy="er", privacy="tdp")


def test_seed_alone_sets_the_initial_adapters_and_head_and_the_global_rng_is_left_alone():
    """Two learners with one seed start from the same LoRA adapter and head whatever the global RNG state,
    and building one does not advance the caller's global RNG."""
    from dpcl.methods.pecl import learner as learner_module

    states = []
    for global_seed in (1, 2):
        learner_module._PRETRAINED.clear()
        torch.manual_seed(global_seed)
        before = torch.random.get_rng_state()
        learner = ContinualLM(4, learner_config(**TINY), seed=5, public_texts=PUBLIC)
        assert torch.equal(torch.random.get_rng_state(), before)
        states.append({k: v.clone() for k, v in learner.model.state_dict().items() if "lora_" in k or "head" in k})
    assert states[0].keys() == states[1].keys() and any("lora_A" in k for k in states[0])
    assert all(torch.equal(states[0][k], states[1][k]) for k in states[0])


@pytest.mark.parametrize(
    "bad,name",
    [({"batch_size": 0}, "batch_size"), ({"lora_rank": 0}, "lora_rank"), ({"epochs": True}, "epochs"),
     ({"replay_per_task": -1}, "replay_per_task"), ({"theta": 1.5}, "theta"), ({"theta": 1.0}, "theta"),
     ({"alpha": -0.1}, "alpha"), ({"tau": 0.0}, "tau"), ({"learning_rate": -1.0}, "learning_rate"),
     ({"lm_weight": float("nan")}, "lm_weight"), ({"delta": 0.0}, "delta"), ({"clip_norm": 0.0}, "clip_norm"),
     ({"lambda_min": 10.0, "lambda_max": 1.0}, "lambda_min"), ({"epsilon_lower": 5.0, "epsilon_upper": 2.0},
                                                               "epsilon_lower"),
     ({"dynamic_lambda": 1}, "dynamic_lambda"), ({"max_grad_norm": float("inf")}, "max_grad_norm"),
     ({"n_embd": 64, "n_head": 3}, "n_head")],
)
def test_learner_config_refuses_out_of_range_numbers_by_name(bad, name):
    with pytest.raises(InvalidParameterError, match=name):
        learner_config(**bad)


def test_learner_config_accepts_the_edges_of_its_ranges():
    config = learner_config(alpha=1.0, theta=0.0, lambda_min=0.0, lambda_max=0.0, learning_rate=0.0,
                            replay_per_task=0, lambda_unlearn=0.0, epsilon_lower=2.0, epsilon_upper=2.0)
    assert config.alpha == 1.0 and config.lambda_max == 0.0


def test_memory_regularisation_is_wired_as_eq_10_and_11(monkeypatch):
    """Task 2's L_reg acts on the task-2 adapter's LoRA parameters, pulls them to task 1's final adapter, with
    lambda_dyn = lambda_max (1 - s_bar) + lambda_min s_bar (s_bar: mean score of the task's real tokens after
    BOS) and Omega_bar = Omega_1 (the finished tasks)."""
    from dpcl.methods.pecl import strategies as learner_module  # the pecl strategy adds PeCL's loss terms

    calls, scores_seen = [], []
    original_reg = learner_module.memory_regularisation
    original_scores = ContinualLM.token_scores

    def reg_spy(current, previous, lambda_dyn, omega_bar):
        current = list(current)
        calls.append(([p for p in current], [p.clone() for p in previous], lambda_dyn, omega_bar))
        return original_reg(current, previous, lambda_dyn, omega_bar)

    def scores_spy(self, ids, mask, batch_size=64):
        out = original_scores(self, ids, mask, batch_size)
        scores_seen.append((out.clone(), mask.clone()))
        return out

    monkeypatch.setattr(learner_module, "memory_regularisation", reg_spy)
    monkeypatch.setattr(ContinualLM, "token_scores", scores_spy)
    learner = ContinualLM(4, learner_config(**TINY), seed=0, public_texts=PUBLIC)
    (a, la), (b, lb) = _tasks()
    first = learner.fit_task(0, a, la)
    assert calls == []  # no earlier task: no regulariser
    adapter_1 = [p.detach().clone() for p in learner._lora_parameters("task_0")]
    second = learner.fit_task(1, b, lb)
    assert len(calls) == TINY["epochs"] * 2
    current, previous, lam, omega_bar = calls[0]
    task_2 = learner._lora_parameters("task_1")
    assert len(current) == len(task_2) > 0 and all(c is p for c, p in zip(current, task_2))
    assert all(torch.equal(p, q) for p, q in zip(previous, adapter_1))
    scores, mask = scores_seen[1]
    real = mask.bool().clone()
    real[:, 0] = False
    s_bar = float(scores[real].double().mean())
    assert second["mean_score"] == pytest.approx(s_bar, rel=1e-6)
    assert lam == pytest.approx(10.0 * (1 - s_bar) + 1.0 * s_bar, rel=1e-6) == second["lambda_dyn"]
    assert omega_bar == first["omega"] == second["omega_bar"] > 0


@pytest.mark.parametrize("unlearning", [True, False])
def test_unlearning_term_uses_the_batchs_scores_and_token_losses(monkeypatch, unlearning):
    """eq. 12: the batch's own (fixed) scores, theta from the config, and the per-token LM losses of the forward
    pass being trained (they carry gradient); switched off, the term is never computed."""
    from dpcl.methods.pecl import strategies as learner_module  # the pecl strategy adds PeCL's loss terms

    calls, task_scores = [], []
    original = learner_module.unlearning_loss
    original_scores = ContinualLM.token_scores

    def spy(scores, token_loss, mask, theta):
        calls.append((scores.clone(), token_loss.requires_grad, tuple(token_loss.shape), mask.clone(), theta))
        return original(scores, token_loss, mask, theta)

    monkeypatch.setattr(learner_module, "unlearning_loss", spy)
    monkeypatch.setattr(ContinualLM, "token_scores",
                        lambda self, ids, mask, batch_size=64: task_scores.append(original_scores(self, ids, mask))
                        or task_scores[-1])
    learner = ContinualLM(2, learner_config(**TINY, theta=0.3, unlearning=unlearning), seed=0, public_texts=PUBLIC)
    texts, labels = _tasks()[0]
    learner.fit_task(0, texts, labels)
    if not unlearning:
        assert calls == []
        return
    assert len(calls) == TINY["epochs"] * 2
    _, all_mask = learner._encode(texts)
    seen_rows = 0
    for scores, grad, shape, mask, theta in calls:
        assert grad and shape == tuple(scores.shape) and theta == 0.3
        for row, m in zip(scores, mask):
            match = [i for i in range(16) if torch.equal(task_scores[0][i], row) and torch.equal(all_mask[i], m)]
            assert match
            seen_rows += 1
    assert seen_rows == TINY["epochs"] * 16


def test_cached_pretraining_leaves_the_batch_generator_as_a_fresh_pretraining_does():
    """A second learner in the same process reuses the pre-trained model; it must also train on the same batches
    (the pre-training draws advance the seeded batch generator), so a run does not depend on what ran before it."""
    from dpcl.methods.pecl import learner as learner_module

    learner_module._PRETRAINED.clear()
    fresh = ContinualLM(4, learner_config(**TINY), seed=5, public_texts=PUBLIC)
    cached = ContinualLM(4, learner_config(**TINY), seed=5, public_texts=PUBLIC)
    assert torch.equal(fresh.generator.get_state(), cached.generator.get_state())
    untouched = torch.Generator().manual_seed(5).get_state()
    assert not torch.equal(fresh.generator.get_state(), untouched)  # pre-training did draw from it
