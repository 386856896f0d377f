"""PEFT Ensemble (Alg. 2) with its aggregation rules, and the Naive / Non-CL baselines (Alg. A2 / A3)."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from dpcl.errors import ConfigError, InvalidParameterError  # noqa: E402
from dpcl.methods.base import TrainingData, method_class  # noqa: E402
from dpcl.methods.naive.method import NaiveFineTuning  # noqa: E402
from dpcl.methods.non_cl.method import NonContinualTraining  # noqa: E402
from dpcl.methods.peft_ensemble.method import PeftEnsemble, aggregate  # noqa: E402
from tobaben_helpers import TASK_LABELS, digits_split, dpsgd_plan, setup_for, task_data  # noqa: E402

METHOD = {"epochs": 3, "batch_size": 32, "max_grad_norm": 1.0, "learning_rate": 0.02, "adapter_dim": 0,
          "normalize_features": True}
#: the residual adapter (trained per member on precomputed features): still trains, round-trips and predicts
ADAPTER = {**METHOD, "adapter_dim": 16}

# two models over labels {0, 1, 2}: model 0 predicts {0, 1}, model 1 predicts {1, 2}; one example.
LOGITS = np.array([[[2.0, 1.0, 0.0]], [[0.0, 1.5, 3.0]]])
MASKS = np.array([[True, True, False], [False, True, True]])
RELEASED = np.array([True, True, True])


def test_registry_names_match_the_classes():
    assert method_class("peft_ensemble") is PeftEnsemble
    assert method_class("naive") is NaiveFineTuning
    assert method_class("non_cl") is NonContinualTraining


def test_argmax_rule_takes_the_largest_logit_of_any_model():
    scores = aggregate(LOGITS, MASKS, RELEASED, "argmax")
    np.testing.assert_allclose(scores, [[2.0, 1.5, 3.0]])


def test_median_rule_subtracts_each_models_median_over_its_labels():
    # model 0: median(2, 1) = 1.5 -> (0.5, -0.5); model 1: median(1.5, 3) = 2.25 -> (-0.75, 0.75)
    scores = aggregate(LOGITS, MASKS, RELEASED, "median")
    np.testing.assert_allclose(scores, [[0.5, -0.5, 0.75]])


def test_entropy_rule_weights_each_models_logits_by_its_confidence():
    """Zhao et al. (SAFE) eq. 11: w = softmax(-gamma H(p)) over models, score = sum of w_l times model l's logits."""
    p0 = np.exp([2.0, 1.0]) / np.exp([2.0, 1.0]).sum()
    p1 = np.exp([1.5, 3.0]) / np.exp([1.5, 3.0]).sum()
    h0, h1 = -(p0 * np.log(p0)).sum(), -(p1 * np.log(p1)).sum()
    w0, w1 = np.exp(-h0) / (np.exp(-h0) + np.exp(-h1)), np.exp(-h1) / (np.exp(-h0) + np.exp(-h1))
    expected = [w0 * 2.0, w0 * 1.0 + w1 * 1.5, w1 * 3.0]
    np.testing.assert_allclose(aggregate(LOGITS, MASKS, RELEASED, "entropy"), [expected])


def test_unknown_rule_is_refused_by_name():
    with pytest.raises(ConfigError, match="aggregation"):
        aggregate(LOGITS, MASKS, RELEASED, "vote")
    with pytest.raises(ConfigError, match="aggregation"):
        PeftEnsemble(setup_for({**METHOD, "aggregation": "vote"}))


def _run(method_name, noise_multiplier, *, aggregation="argmax", tasks=TASK_LABELS, seed=0, method=METHOD):
    x_train, y_train, x_test, y_test = digits_split()
    model = method_class(method_name)(setup_for({**method, "aggregation": aggregation}, seed=seed))
    seen: list[int] = []
    for t, labels in enumerate(tasks):
        seen.extend(labels)
        train_labels = tuple(seen) if method_name == "non_cl" else labels
        data = task_data(x_train, y_train, train_labels)
        steps = METHOD["epochs"] * int(np.ceil(len(data) / METHOD["batch_size"]))
        plan = dpsgd_plan(noise_multiplier, METHOD["batch_size"] / len(data), steps)
        model.fit_task(t, data, tuple(train_labels), plan)
    test = np.isin(y_test, seen)
    return model, model.accuracy(x_test[test], y_test[test])


@pytest.mark.parametrize("aggregation", ["argmax", "median", "entropy"])
def test_private_ensemble_on_three_digit_tasks_beats_chance_widely(aggregation):
    model, accuracy = _run("peft_ensemble", 1.0, aggregation=aggregation, tasks=TASK_LABELS[:3])
    assert len(model.models) == 3
    assert accuracy > 0.45  # chance is 1/6


def test_non_cl_learns_the_union_and_naive_forgets():
    _, non_cl = _run("non_cl", 1.0, tasks=TASK_LABELS[:3])
    naive, _ = _run("naive", 1.0, tasks=TASK_LABELS[:3])
    _, _, x_test, y_test = digits_split()
    first = np.isin(y_test, TASK_LABELS[0])
    assert non_cl > 0.6
    # Alg. A2 has nothing against forgetting: the first task is mostly lost after two more tasks
    assert naive.accuracy(x_test[first], y_test[first]) < 0.5


def test_ensemble_member_with_task_head_predicts_only_its_task_labels():
    model, _ = _run("peft_ensemble", None, tasks=TASK_LABELS[:2], method={**METHOD, "head": "task"})
    _, masks = model.member_logits(np.zeros((1, 64), np.float32))
    assert masks.sum(axis=1).tolist() == [2, 2]
    assert np.flatnonzero(masks[1]).tolist() == [2, 3]


def test_label_space_head_spans_every_public_label_but_predicts_only_released_ones():
    """head = "label_space" (S_prior^const): each member's head covers all ten public labels; eq. 10 still takes
    the largest logit over the labels released so far only."""
    model, _ = _run("peft_ensemble", None, tasks=TASK_LABELS[:2])
    logits, masks = model.member_logits(np.zeros((1, 64), np.float32))
    assert masks.all() and logits.shape == (2, 1, 10)
    assert all(m.head.weight.shape == (10, 64) for m in model.models)
    _, _, x_test, _ = digits_split()
    assert set(np.unique(model.predict(x_test))) <= {0, 1, 2, 3}


def test_not_private_ensemble_learns_every_task_and_the_aggregate_beats_chance():
    """Regression: members trained alone on their task must stay comparable under eq. 10.

    With a head over the task's two labels alone, every member's two logits are (z, -z) (the cross-entropy
    gradients of the two rows cancel from a zero head), so eq. 10 picks the most confident member whatever its
    task, and a new member could take every example (a task at 0 right after its own training). A head over all
    public labels gives the rows of the labels a task lacks as negatives, so a member's logits also say how much an
    input resembles its task. Class-incremental, as dpcl's accuracy matrix records it: after task t the ensemble
    predicts among all labels released so far (chance 1 / (2 (t + 1)) on task t).
    """
    x_train, y_train, x_test, y_test = digits_split()
    model = PeftEnsemble(setup_for({**METHOD, "weight_decay": 0.01}))
    for t, labels in enumerate(TASK_LABELS):
        data = task_data(x_train, y_train, labels)
        steps = METHOD["epochs"] * int(np.ceil(len(data) / METHOD["batch_size"]))
        model.fit_task(t, data, labels, dpsgd_plan(None, METHOD["batch_size"] / len(data), steps))
        this = np.isin(y_test, labels)
        chance = 1 / (2 * (t + 1))  # among the labels released so far
        # 0.25 above chance: the last task (labels 8, 9) ranged 0.44-0.76 over 8 runs (Poisson batches from OS entropy)
        assert model.accuracy(x_test[this], y_test[this]) > chance + 0.25, f"task {t} right after its training"
    logits, _ = model.member_logits(x_test)
    for t, labels in enumerate(TASK_LABELS):  # every member alone separates its own two classes
        this = np.isin(y_test, labels)
        own = np.asarray(labels)[np.argmax(logits[t][this][:, list(labels)], axis=1)]
        assert np.mean(own == y_test[this]) > 0.8, f"member {t} on its own labels"
    final = [model.accuracy(x_test[np.isin(y_test, l)], y_test[np.isin(y_test, l)]) for l in TASK_LABELS]
    assert np.mean(final) > 0.5  # final average accuracy; chance is 0.1


def test_empty_task_trains_a_proper_noise_only_member():
    model = PeftEnsemble(setup_for(METHOD))
    empty = TrainingData(np.zeros((0, 64), np.float32), np.zeros(0, np.int64), np.zeros(0, np.int64))
    model.fit_task(0, empty, (3, 4), dpsgd_plan(1.0, 0.1, 5))
    assert set(np.unique(model.predict(np.random.default_rng(0).random((20, 64), dtype=np.float32)))) <= {3, 4}


@pytest.mark.parametrize("name,method", [("peft_ensemble", METHOD), ("peft_ensemble", ADAPTER), ("naive", METHOD),
                                         ("non_cl", METHOD)])
def test_state_round_trip_predicts_identically(name, method):
    model, _ = _run(name, 1.0, tasks=TASK_LABELS[:2], method=method)
    restored = method_class(name)(setup_for(method, seed=42))
    restored.load_state_dict(model.state_dict())
    _, _, x_test, _ = digits_split()
    np.testing.assert_array_equal(restored.predict(x_test), model.predict(x_test))
    # the initialisation generator is a CPU generator on every device, so its state restores on any device
    # and the next model is initialised as in the uninterrupted run
    assert model.generator.device.type == "cpu"
    assert torch.equal(restored.generator.get_state(), model.generator.get_state())


def test_labels_outside_the_task_are_refused():
    x_train, y_train, _, _ = digits_split()
    model = PeftEnsemble(setup_for(METHOD))
    with pytest.raises(InvalidParameterError, match="label-space filter"):
        model.fit_task(0, task_data(x_train, y_train, (0, 1, 2)), (0, 1), dpsgd_plan(1.0, 0.1, 2))


def test_empty_task_under_the_specs_plan_releases_the_initialisation():
    """The plan the runner uses for an empty task has no events and no steps: the member is its initialisation."""
    from dpcl.methods.peft_ensemble.spec import PEFT_ENSEMBLE

    plan = PEFT_ENSEMBLE.plan_task(METHOD, {"epsilon": 1.0, "delta": 1e-5}, 0, 0)
    assert plan.events == () and plan.noise["steps"] == 0
    model = PeftEnsemble(setup_for(METHOD))
    empty = TrainingData(np.zeros((0, 64), np.float32), np.zeros(0, np.int64), np.zeros(0, np.int64))
    model.fit_task(0, empty, (3, 4), plan)
    (member,) = model.models
    assert torch.count_nonzero(member.head.weight) == 0 and torch.count_nonzero(member.head.bias) == 0
    assert set(np.unique(model.predict(np.random.default_rng(0).random((20, 64), dtype=np.float32)))) <= {3, 4}


def test_unknown_head_is_refused_by_name():
    with pytest.raises(ConfigError, match=r"\[method\] head must be one of 'label_space', 'task'"):
        PeftEnsemble(setup_for({**METHOD, "head": "all"}))


@pytest.mark.parametrize("noise_multiplier", [None, 1.0])
def test_weight_decay_shrinks_the_members_weights_private_or_not(noise_multiplier):
    """Adam's L2 penalty acts after clipping and noise (a function of the parameters alone), in both paths."""
    x_train, y_train, _, _ = digits_split()
    data = task_data(x_train, y_train, TASK_LABELS[0])
    norms = []
    for decay in (0.0, 1.0):
        model = PeftEnsemble(setup_for({**METHOD, "weight_decay": decay}))
        model.fit_task(0, data, TASK_LABELS[0], dpsgd_plan(noise_multiplier, 32 / len(data), 30))
        norms.append(float(torch.linalg.norm(model.models[0].head.weight.detach())))
    assert norms[1] < 0.5 * norms[0]


def test_centred_members_ignore_each_examples_brightness_and_contrast():
    """center_features: each feature vector minus its own mean, then l2-normalised, is a fixed per-example map, so
    an example and any brightness shift plus positive contrast of it (a x + c) get the same member logits and the
    same prediction; the centred ensemble still learns (train and test as in the other tests, digits)."""
    model, accuracy = _run("peft_ensemble", 1.0, aggregation="median", tasks=TASK_LABELS[:3],
                           method={**METHOD, "center_features": True, "weight_decay": 0.03})
    assert accuracy > 0.45  # chance is 1/6
    _, _, x_test, _ = digits_split()
    rng = np.random.default_rng(0)
    shifted = (rng.uniform(0.5, 3.0, (len(x_test), 1)) * x_test + rng.uniform(-5.0, 5.0, (len(x_test), 1)))
    before, _ = model.member_logits(x_test)
    after, _ = model.member_logits(shifted.astype(np.float32))
    np.testing.assert_allclose(after, before, atol=1e-4)
    np.testing.assert_array_equal(model.predict(shifted.astype(np.float32)), model.predict(x_test))
    # without centring the shift changes what the members read
    plain, _ = _run("peft_ensemble", 1.0, tasks=TASK_LABELS[:3], method={**METHOD, "weight_decay": 0.03})
    assert not np.allclose(plain.member_logits(shifted.astype(np.float32))[0], plain.member_logits(x_test)[0],
                           atol=1e-4)


def test_center_features_is_refused_where_members_read_no_feature_vectors():
    """Raw-text members (LoRA on MiniLM, input_dim 0) read texts, not feature vectors: the option is refused by
    name rather than ignored."""
    with pytest.raises(ConfigError, match=r"center_features .* raw texts"):
        PeftEnsemble(setup_for({**METHOD, "adapter_dim": 4, "center_features": True}, input_dim=0))
    PeftEnsemble(setup_for({**METHOD, "adapter_dim": 4}, input_dim=0))  # the same ensemble without it is accepted
