"""Privacy noise is not reproducible from the published seed unless a run opts in (dpcl.methods.noise_source)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

torch = pytest.importorskip("torch")
torch.set_num_threads(1)

from dpcl.errors import InvalidParameterError  # noqa: E402
from dpcl.methods.naive.method import NaiveFineTuning  # noqa: E402
from dpcl.methods.base import MethodSetup, TrainingData  # noqa: E402
from dpcl.methods.cosine.method import CosineClassifier  # noqa: E402
from dpcl.methods.noise_source import (  # noqa: E402
    FLOATING_POINT_ASSUMPTION,
    OS_ENTROPY_ASSUMPTION,
    REPRODUCIBLE_NOISE_ASSUMPTION,
    noise_assumptions,
    noise_rng,
    noise_seed,
)
from tobaben_helpers import dpsgd_plan, gaussian_plan, setup_for  # noqa: E402


def _zero_task(dim: int = 400) -> TrainingData:
    """An empty task: the release is pure noise, so two releases differ exactly by their noise."""
    return TrainingData(np.zeros((0, dim), np.float32), np.zeros(0, np.int64), np.zeros(0, np.int64))


def _cosine_noise(seed: int, reproducible: bool, sigma: float = 2.0) -> np.ndarray:
    model = CosineClassifier(setup_for({}, seed=seed, input_dim=400, reproducible_noise=reproducible))
    model.fit_task(0, _zero_task(), (0, 1), gaussian_plan(sigma))
    return model.class_sums[:2].cpu().numpy()


def test_default_noise_differs_between_runs_with_the_same_seed():
    """Same --seed, default noise source: the two noise draws are independent N(0, sigma^2) vectors.

    Their difference has variance 2 sigma^2 per coordinate; over 800 coordinates the sample variance lies
    within 6 standard errors (sd of a sample variance of n normals: var * sqrt(2 / (n - 1))).
    """
    sigma = 2.0
    a, b = _cosine_noise(7, False, sigma), _cosine_noise(7, False, sigma)
    diff = (a - b).ravel()
    expected = 2 * sigma**2
    assert abs(diff.var(ddof=1) - expected) < 6 * expected * np.sqrt(2 / (diff.size - 1))
    # and the correlation of the two draws is near 0 (|r| < 6 / sqrt(n)), not 1
    assert abs(np.corrcoef(a.ravel(), b.ravel())[0, 1]) < 6 / np.sqrt(a.size)


def test_reproducible_noise_is_a_function_of_the_seed():
    np.testing.assert_array_equal(_cosine_noise(7, True), _cosine_noise(7, True))
    assert not np.array_equal(_cosine_noise(7, True), _cosine_noise(8, True))


def test_cosine_checkpoint_holds_no_generator_state():
    model = CosineClassifier(setup_for({}, seed=1, input_dim=400))
    model.fit_task(0, _zero_task(), (0, 1), gaussian_plan(1.0))
    assert not any("generator" in key for key in model.state_dict())


def _naive_weights(reproducible: bool) -> np.ndarray:
    """One DP-SGD step of last-layer training with a noise multiplier large enough that noise dominates."""
    method = {"name": "naive", "epochs": 1, "batch_size": 8, "max_grad_norm": 1.0, "adapter_dim": 0,
              "learning_rate": 0.1}
    model = NaiveFineTuning(setup_for(method, seed=3, input_dim=6, label_space=(0, 1),
                                      reproducible_noise=reproducible))
    rng = np.random.default_rng(0)
    data = TrainingData(rng.normal(size=(16, 6)).astype(np.float32), np.tile([0, 1], 8).astype(np.int64),
                        np.arange(16))
    model.fit_task(0, data, (0, 1), dpsgd_plan(5.0, sample_rate=0.5, steps=2))
    return model.model.head.weight.detach().numpy().copy()


def test_dpsgd_noise_and_sampling_follow_the_noise_source():
    np.testing.assert_array_equal(_naive_weights(True), _naive_weights(True))
    assert not np.array_equal(_naive_weights(False), _naive_weights(False))


def test_l2dpml_laplace_noise_is_fresh_by_default():
    from dpcl.data.digits import load_digits
    from dpcl.data.streams import permuted_stream
    from dpcl.methods.l2dpml.spec import L2DPML_SPEC
    from dpcl.methods.l2dpml.method import L2DPMLMethod

    method = {"hidden_sizes": [8, 4], "batch_size": 100, "epochs": 2, "memory_batches_per_task": 1}
    privacy = {"epsilon": 2.0, "delta": 1e-5, "adjacency": "replace_one"}
    task = permuted_stream(load_digits(), 3, seed=0).tasks[0]
    data = TrainingData(task.train.features, task.train.labels, task.train.unit_ids)

    def weights(reproducible: bool) -> np.ndarray:
        m = L2DPMLMethod(MethodSetup(method=method, privacy=privacy, label_space=tuple(range(10)), input_dim=64,
                                     seed=0, reproducible_noise=reproducible))
        m.fit_task(0, data, task.labels, L2DPML_SPEC.plan_task(method, privacy, len(data), 0))
        return m.W.numpy().copy()

    np.testing.assert_array_equal(weights(True), weights(True))
    assert not np.array_equal(weights(False), weights(False))


@settings(max_examples=30, deadline=None)
@given(seed=st.integers(0, 2**63), task=st.integers(0, 10**6), stream=st.integers(0, 8))
def test_reproducible_seeds_are_deterministic_64_bit_and_keyed(seed, task, stream):
    first = noise_seed(seed, True, task, stream)
    assert first == noise_seed(seed, True, task, stream)
    assert 0 <= first < 2**64
    assert first != noise_seed(seed, True, task, stream + 1)
    assert first != noise_seed(seed, True, task + 1, stream)


def test_os_entropy_seeds_do_not_depend_on_the_seed():
    draws = {noise_seed(5, False, 0, 0) for _ in range(50)}
    assert len(draws) == 50  # 64 fresh bits each: a repeat has probability < 50^2 / 2^65
    assert noise_rng(5, False, 0).integers(2**62) != noise_rng(5, False, 0).integers(2**62)


@pytest.mark.parametrize("bad", [-1, 1.5, True, "3"])
def test_bad_seed_is_refused_by_name(bad):
    with pytest.raises(InvalidParameterError, match="seed"):
        noise_seed(bad, True, 0)


def test_reproducible_noise_must_be_a_bool():
    with pytest.raises(InvalidParameterError, match="reproducible_noise"):
        MethodSetup(method={}, privacy={}, label_space=(0,), input_dim=1, seed=0, reproducible_noise="yes")


def test_assumption_sentences_name_the_noise_source():
    assert noise_assumptions(False) == (OS_ENTROPY_ASSUMPTION, FLOATING_POINT_ASSUMPTION)
    assert noise_assumptions(True) == (REPRODUCIBLE_NOISE_ASSUMPTION, FLOATING_POINT_ASSUMPTION)
    assert "Mironov 2012" in FLOATING_POINT_ASSUMPTION
    assert "does not know the seed" in REPRODUCIBLE_NOISE_ASSUMPTION
