"""L2DP-ML training (Alg. 2): fixed disjoint memory, run-time preconditions, certificates; A-GEM baselines."""

from __future__ import annotations

import json

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

torch = pytest.importorskip("torch")

from dpcl.data.digits import load_digits  # noqa: E402
from dpcl.data.streams import permuted_stream  # noqa: E402
from dpcl.errors import DisjointnessViolationError, InvalidParameterError, PrivacyViolationError  # noqa: E402
from dpcl.methods.l2dpml.spec import L2DPML_SPEC  # noqa: E402
from dpcl.guarantees.lifelong import output_sensitivity, reconstruction_sensitivity  # noqa: E402
from dpcl.guarantees.method_schema import TaskPlan  # noqa: E402
from dpcl.methods.base import MethodSetup, TrainingData, method_class  # noqa: E402
from dpcl.methods.l2dpml.baselines import AGEMClassifier, DPSGDAGEMClassifier  # noqa: E402
from dpcl.methods.l2dpml.method import (  # noqa: E402
    L2DPMLMethod,
    agem_project,
    output_coefficients,
    reconstruction_coefficients,
)

PRIVACY = {"epsilon": 10.0, "delta": 1e-5, "adjacency": "replace_one"}
METHOD = {"hidden_sizes": [8, 4], "batch_size": 100, "epochs": 5, "memory_batches_per_task": 1}


@pytest.fixture(scope="module")
def stream():
    return permuted_stream(load_digits(), 3, seed=0)


def _data(task) -> TrainingData:
    return TrainingData(task.train.features, task.train.labels, task.train.unit_ids)


def _method(method=METHOD, privacy=PRIVACY, seed=0, reproducible_noise=False) -> L2DPMLMethod:
    return L2DPMLMethod(MethodSetup(method=method, privacy=privacy, label_space=tuple(range(10)), input_dim=64,
                                    seed=seed, reproducible_noise=reproducible_noise))


def _fit(m: L2DPMLMethod, task, method=METHOD, privacy=PRIVACY) -> TaskPlan:
    plan = L2DPML_SPEC.plan_task(method, privacy, len(task.train.labels), task.index)
    m.fit_task(task.index, _data(task), task.labels, plan)
    return plan


def test_registered_under_its_config_name():
    assert method_class("l2dpml") is L2DPMLMethod


def test_coefficients_match_a_per_example_sum():
    rng = np.random.default_rng(1)
    x = rng.random((7, 4))
    batches = (np.array([0, 2, 5]), np.array([1, 3, 4, 6]))
    got = reconstruction_coefficients(torch.as_tensor(x), batches).numpy()
    for k, idx in enumerate(batches):
        a = sum(np.outer(0.5 - r, r) for r in x[idx])  # a[s, j] = x_j (1/2 - x_s)
        np.testing.assert_allclose(got[k], (a + a.T) / 2, atol=1e-12)
    h = rng.uniform(-1, 1, size=(7, 3))
    y = np.eye(5)[rng.integers(0, 5, size=7)]
    b, q = output_coefficients(torch.as_tensor(h), torch.as_tensor(y), batches)
    for k, idx in enumerate(batches):
        np.testing.assert_allclose(b[k].numpy(), h[idx].T @ (0.5 - y[idx]), atol=1e-12)
        np.testing.assert_allclose(q[k].numpy(), h[idx].T @ h[idx], atol=1e-12)


def test_sensitivities_come_from_the_layer_sizes():
    m = _method()
    assert m.delta_r == reconstruction_sensitivity(64, "unit")
    assert m.delta_l == output_sensitivity(4 + 1, 10)


def test_stream_keeps_memory_fixed_and_disjoint_and_reports_the_bound(stream):
    m = _method()
    _fit(m, stream.tasks[0])
    snapshot = [{k: (v.clone() if isinstance(v, torch.Tensor) else v) for k, v in e.items()} for e in m.memory]
    for task in stream.tasks[1:]:
        _fit(m, task)
    # one fixed batch per task entered the memory, and earlier entries never changed
    assert [e["task"] for e in m.memory] == [0, 1, 2]
    for old, now in zip(snapshot, m.memory):
        assert old["digest"] == now["digest"]
        assert torch.equal(old["ae"], now["ae"]) and torch.equal(old["b_n"], now["b_n"])
        np.testing.assert_array_equal(old["units"], now["units"])
    units = np.concatenate([e["units"] for e in m.memory])
    assert units.size == np.unique(units).size
    for t in range(3):
        report = m.certificate_extra(t)["l2dpml"]
        assert report["preconditions_met"]
        names = {p["name"] for p in report["preconditions"]}
        assert names == {"input_range", "disjoint_units", "fixed_disjoint_batches", "memory_fixed_disjoint",
                         "fixed_hidden_layers"}
        bound = report["lifelong_bound"]
        assert bound["epsilon"] == pytest.approx(10.0)
        assert set(bound["certified_terms"]) == {"epsilon1", "epsilon1_over_gamma_x", "epsilon1_over_gamma",
                                                 "epsilon2"}
        assert bound["paper_epsilon"] >= bound["epsilon"]
        assert report["laplace_scales"]["output"] == pytest.approx(m.delta_l / 5.0)
    preds = m.predict(stream.tasks[0].test.features)
    assert preds.shape == stream.tasks[0].test.labels.shape
    with pytest.raises(InvalidParameterError, match="not been released"):
        m.certificate_extra(5)


def test_tampered_memory_is_refused(stream):
    m = _method()
    _fit(m, stream.tasks[0])
    m.memory[0]["b_n"] = m.memory[0]["b_n"] + 1.0
    with pytest.raises(PrivacyViolationError, match="fixed"):
        _fit(m, stream.tasks[1])


def test_inputs_outside_the_declared_box_are_refused_not_clamped(stream):
    task = stream.tasks[0]
    m = _method()
    bad = TrainingData(task.train.features * 2.0, task.train.labels, task.train.unit_ids)
    plan = L2DPML_SPEC.plan_task(METHOD, PRIVACY, len(bad), 0)
    with pytest.raises(InvalidParameterError, match="input_range"):
        m.fit_task(0, bad, task.labels, plan)
    assert m.tasks_fitted == 0 and not m.memory


def test_units_shared_between_tasks_are_refused(stream):
    m = _method()
    _fit(m, stream.tasks[0])
    t1 = stream.tasks[1]
    overlapping = TrainingData(t1.train.features, t1.train.labels, stream.tasks[0].train.unit_ids[: len(t1.train.labels)])
    plan = L2DPML_SPEC.plan_task(METHOD, PRIVACY, len(overlapping), 1)
    with pytest.raises(DisjointnessViolationError):
        m.fit_task(1, overlapping, t1.labels, plan)


def test_empty_task_still_releases_a_classifier(stream):
    m = _method()
    empty = TrainingData(np.zeros((0, 64), np.float32), np.zeros(0, np.int64), np.zeros(0, np.int64))
    plan = L2DPML_SPEC.plan_task(METHOD, PRIVACY, 0, 0)
    before = m.theta1.clone()
    m.fit_task(0, empty, tuple(range(10)), plan)
    assert torch.equal(before, m.theta1) and not m.memory
    assert m.predict(stream.tasks[0].test.features).shape == stream.tasks[0].test.labels.shape


def test_first_task_autoencoder_is_frozen_afterwards(stream):
    method = {**METHOD, "autoencoder_training": "first_task"}
    m = _method(method)
    _fit(m, stream.tasks[0], method)
    theta = m.theta1.clone()
    _fit(m, stream.tasks[1], method)
    assert torch.equal(theta, m.theta1)
    assert m.memory[1]["ae"] is None


def test_learns_with_little_noise_and_not_with_a_tiny_budget(stream):
    task = stream.tasks[0]
    method = {"hidden_sizes": [16], "batch_size": 512, "epochs": 200}
    accurate = _method(method, {**PRIVACY, "epsilon": 1e6})
    _fit(accurate, task, method, {**PRIVACY, "epsilon": 1e6})
    assert accurate.accuracy(task.test.features, task.test.labels) > 0.6
    noisy = _method(method, {**PRIVACY, "epsilon": 0.1})
    _fit(noisy, task, method, {**PRIVACY, "epsilon": 0.1})
    assert noisy.accuracy(task.test.features, task.test.labels) < 0.4


def test_state_dict_round_trip(stream):
    # continuing both copies on the same noise needs the reproducible-noise opt-in; continuing needs the
    # curator state (unit ids for the disjointness and fixed-memory checks) besides the release
    m = _method(reproducible_noise=True)
    _fit(m, stream.tasks[0])
    m2 = _method(reproducible_noise=True)
    m2.load_state_dict(m.state_dict())
    x = stream.tasks[0].test.features
    np.testing.assert_array_equal(m.scores(x), m2.scores(x))
    m2.load_curator_state_dict(m.curator_state_dict())
    _fit(m, stream.tasks[1])
    _fit(m2, stream.tasks[1])
    np.testing.assert_array_equal(m.scores(x), m2.scores(x))
    # the restored curator state still catches a unit shared with an earlier task
    task = stream.tasks[2]
    reused = np.asarray(task.train.unit_ids).copy()
    reused[0] = stream.tasks[0].train.unit_ids[0]
    plan = L2DPML_SPEC.plan_task(METHOD, PRIVACY, len(task.train.labels), task.index)
    with pytest.raises(DisjointnessViolationError, match="earlier tasks"):
        m2.fit_task(task.index, TrainingData(task.train.features, task.train.labels, reused), task.labels, plan)


def test_release_holds_no_unit_ids_and_continuing_needs_the_curator_state(stream):
    """The checkpoint is the Laplace release: unit ids (and digests over them) stay with the curator."""
    m = _method()
    for task in stream.tasks[:2]:
        _fit(m, task)
    release = m.state_dict()
    assert "seen_units" not in release
    assert all(set(e) == {"task", "batch", "ae", "b_n", "q_n", "theta1_release"} for e in release["memory"])
    units = [np.asarray(t.train.unit_ids) for t in stream.tasks[:2]]
    for value in _leaves(release):
        array = np.asarray(value.numpy() if isinstance(value, torch.Tensor) else value)
        if array.dtype.kind in "iu" and array.size > 1:
            assert not any(np.isin(array.ravel(), u).all() for u in units)
    curator = m.curator_state_dict()
    np.testing.assert_array_equal(curator["seen_units"].numpy(), np.concatenate(units))
    restored = _method()
    restored.load_state_dict(release)
    with pytest.raises(InvalidParameterError, match="curator state"):
        _fit(restored, stream.tasks[2])
    bad = dict(curator, memory_units=[u + 1 for u in curator["memory_units"]])
    with pytest.raises(InvalidParameterError, match="digests"):
        restored.load_curator_state_dict(bad)
    with pytest.raises(InvalidParameterError, match="memory batches"):
        restored.load_curator_state_dict(dict(curator, memory_units=curator["memory_units"][:1]))


def _leaves(value):
    if isinstance(value, dict):
        return [leaf for v in value.values() for leaf in _leaves(v)]
    if isinstance(value, (list, tuple)):
        return [leaf for v in value for leaf in _leaves(v)]
    return [value]


vectors = st.lists(st.floats(-10, 10, allow_nan=False), min_size=4, max_size=4)


@given(vectors, vectors)
def test_agem_projection_never_increases_the_memory_loss_to_first_order(g, g_ref):
    g, g_ref = torch.tensor(g, dtype=torch.float64), torch.tensor(g_ref, dtype=torch.float64)
    out = agem_project(g, g_ref)
    assert float(out @ g_ref) >= -1e-9 * (1 + float(g.norm() * g_ref.norm()))
    if float(g @ g_ref) >= 0:
        assert torch.equal(out, g)


def _baseline(cls, **extra):
    method = {"hidden_sizes": [16], "batch_size": 64, "epochs": 1, "learning_rate": 0.1, "memory_per_task": 32,
              **extra}
    return cls(MethodSetup(method=method, privacy={}, label_space=tuple(range(10)), input_dim=64, seed=0))


def test_agem_baselines_train_on_the_same_stream(stream):
    agem = _baseline(AGEMClassifier)
    dp = _baseline(DPSGDAGEMClassifier, clip_norm=1.0)
    sizes = [len(t.train.labels) for t in stream.tasks[:2]]
    schedule = dp.schedule(sizes)
    assert schedule["task_steps"] == [dp.steps(n) for n in sizes]
    assert schedule["memory_sample_rates"][1] == pytest.approx(1.0)  # memory of 32 < memory batch of 64
    for task in stream.tasks[:2]:
        agem.fit_task(task.index, _data(task), task.labels, TaskPlan((), {}))
        dp.fit_task(task.index, _data(task), task.labels, TaskPlan((), {"noise_multiplier": 1.0}))
    assert len(agem.mem_y) == 64 and len(dp.mem_y) == 64
    for model in (agem, dp):
        acc = model.accuracy(stream.tasks[1].test.features, stream.tasks[1].test.labels)
        assert 0.0 <= acc <= 1.0


def test_agem_release_holds_no_replay_memory(stream):
    """The replay memory is raw training examples: curator state, not part of the released model."""
    dp = _baseline(DPSGDAGEMClassifier, clip_norm=1.0)
    task = stream.tasks[0]
    dp.fit_task(task.index, _data(task), task.labels, TaskPlan((), {"noise_multiplier": 1.0}))
    release = dp.state_dict()
    assert set(release) == {"seen_labels", "tasks_fitted", "model"}
    rows = torch.as_tensor(np.asarray(task.train.features, dtype=np.float64))
    curator = dp.curator_state_dict()
    assert len(curator["mem_y"]) == 32 and torch.isin(curator["mem_x"][:, 0], rows[:, 0]).all()
    restored = _baseline(DPSGDAGEMClassifier, clip_norm=1.0)
    restored.load_state_dict(release)
    x = stream.tasks[1].test.features
    np.testing.assert_array_equal(restored.scores(x), dp.scores(x))
    with pytest.raises(InvalidParameterError, match="episodic memory"):
        restored.fit_task(1, _data(stream.tasks[1]), stream.tasks[1].labels, TaskPlan((), {"noise_multiplier": 1.0}))
    restored.load_curator_state_dict(curator)
    assert torch.equal(restored.mem_x, dp.mem_x) and torch.equal(restored.mem_y, dp.mem_y)


def test_dpcl_run_certifies_every_release_and_verify_accepts(tmp_path):
    from dpcl.cli import main

    config = tmp_path / "l2dpml.toml"
    config.write_text(
        '[privacy]\nepsilon = 4.0\ndelta = 1e-5\nadjacency = "replace_one"\naccountant = "auto"\n'
        '[stream]\ndataset = "digits"\nkind = "permuted"\nn_tasks = 2\nlabel_space = "prior_const"\n'
        "prior_labels = [0, 1, 2, 3, 4, 5, 6, 7, 8, 9]\ndisjoint_units = true\n"
        '[method]\nname = "l2dpml"\nhidden_sizes = [8, 4]\nbatch_size = 200\nepochs = 3\n'
    )
    assert main(["run", str(config), "--out", str(tmp_path / "run"), "--quiet"]) == 0
    certs = sorted((tmp_path / "run" / "certificates").glob("*.cert.json"))
    assert len(certs) == 2
    for cert in certs:
        assert main(["verify", str(cert)]) == 0
    import json

    last = json.loads(certs[-1].read_text())
    assert last["guarantee"]["epsilon"] <= 4.0 + 1e-9  # parallel over disjoint tasks: the budget is not exceeded
    assert any("Lifelong DP" in note for note in last["extra"]["plan_notes"])


def test_noise_is_laplace_at_the_stated_scale_and_independent_across_batches():
    from dpcl.methods.l2dpml.method import _symmetric_laplace

    scale = 3.0
    draws = _symmetric_laplace(np.random.default_rng(0), scale, 4000, 3).numpy()
    upper = draws[:, np.triu_indices(3)[0], np.triu_indices(3)[1]]  # [batches, 6]
    np.testing.assert_allclose(draws, np.transpose(draws, (0, 2, 1)))  # symmetric: one draw per released entry
    # Laplace(b): E|X| = b, Var = 2 b^2 (4000 x 6 draws: relative standard error < 1%)
    assert np.mean(np.abs(upper)) == pytest.approx(scale, rel=0.03)
    assert np.var(upper) == pytest.approx(2 * scale**2, rel=0.06)
    # batches get independent draws (Alg. 2's single shared draw would give correlation 1)
    corr = np.corrcoef(upper[0::2, 0], upper[1::2, 0])[0, 1]
    assert abs(corr) < 0.06


def test_heterogeneous_task_sizes_get_their_own_fixed_batches(stream):
    m = _method({**METHOD, "memory_batches_per_task": 2})
    sizes = [50, 288, 120]
    for t, (task, n) in enumerate(zip(stream.tasks, sizes)):
        data = TrainingData(task.train.features[:n], task.train.labels[:n], task.train.unit_ids[:n])
        plan = L2DPML_SPEC.plan_task({**METHOD, "memory_batches_per_task": 2}, PRIVACY, n, t)
        assert plan.noise["n_batches"] == -(-n // METHOD["batch_size"])
        m.fit_task(t, data, task.labels, plan)
        partition = next(p for p in m.certificate_extra(t)["l2dpml"]["preconditions"]
                         if p["name"] == "fixed_disjoint_batches")
        assert partition["met"]
    # 1 batch from the 50-example task, 2 from each larger one
    assert [e["task"] for e in m.memory] == [0, 1, 1, 2, 2]
    assert all(len(e["units"]) <= METHOD["batch_size"] for e in m.memory)


def test_fit_task_adds_laplace_noise_at_the_derived_scales(stream):
    """The noise inside the released coefficients has the scales Delta/epsilon of the certificate.

    Closed forms written here: inputs in [0, 1]^d give Delta_R = 9d/16 + 3d(d-1)/8 (diagonal u/2 - u^2 has
    width 9/16, off-diagonal (u+v)/4 - uv width 3/4); p features in [-1, 1] (constant 1 included) and K
    classes give Delta_L = K p + p^2. The released coefficients minus the exact ones (recomputed from the data
    and the released theta1) are the noise; for Laplace(b), E|X| = b.
    """
    task = stream.tasks[0]
    method = {"hidden_sizes": [8, 4], "batch_size": 400, "epochs": 1, "memory_batches_per_task": 1}
    m = _method(method)
    plan = _fit(m, task, method)
    e1, e2 = plan.noise["epsilon1"], plan.noise["epsilon2"]
    d, p, k = 64, 4 + 1, 10
    scale_r = (9 * d / 16 + 3 * d * (d - 1) / 8) / e1
    scale_l = (k * p + p * p) / e2
    (entry,) = m.memory  # one of the task's fixed batches, as released
    rows = np.flatnonzero(np.isin(task.train.unit_ids, entry["units"]))
    assert rows.size == len(entry["units"]) > 0
    x = task.train.features[rows].astype(np.float64)
    exact_r = (x.sum(0)[:, None] + x.sum(0)[None, :]) / 4.0 - x.T @ x
    noise_r = entry["ae"].numpy() * rows.size - exact_r
    upper = noise_r[np.triu_indices(d)]  # 2080 independent entries: relative standard error of E|X| is 2.2 %
    np.testing.assert_allclose(noise_r, noise_r.T, atol=1e-6 * scale_r)
    assert np.mean(np.abs(upper)) == pytest.approx(scale_r, rel=0.12)
    h = m._head_features(torch.as_tensor(x)).numpy()
    y = np.eye(k)[task.train.labels[rows]]
    noise_b = entry["b_n"].numpy() * rows.size - h.T @ (0.5 - y)  # 50 entries: relative standard error 14 %
    assert np.mean(np.abs(noise_b)) == pytest.approx(scale_l, rel=0.6)
    assert np.mean(np.abs(noise_b)) > 10 * np.mean(np.abs(h.T @ (0.5 - y))) / rows.size


def test_non_private_plan_trains_on_exact_coefficients(stream):
    """[run] private = false hands an empty plan: no noise is drawn (two runs agree bit for bit, though the
    default noise source is fresh OS entropy), the schedule comes from [method], and no bound is reported."""
    task = stream.tasks[0]
    empty_plan = TaskPlan(events=(), noise={})

    def weights():
        m = _method()
        m.fit_task(0, _data(task), task.labels, empty_plan)
        return m

    a, b = weights(), weights()
    np.testing.assert_array_equal(a.W.numpy(), b.W.numpy())
    np.testing.assert_array_equal(a.theta1.numpy(), b.theta1.numpy())
    (entry,) = a.memory[:1]
    rows = np.flatnonzero(np.isin(task.train.unit_ids, entry["units"]))
    x = task.train.features[rows].astype(np.float64)
    exact = (x.sum(0)[:, None] + x.sum(0)[None, :]) / 4.0 - x.T @ x
    np.testing.assert_allclose(entry["ae"].numpy() * rows.size, exact, atol=1e-9)
    report = a.certificate_extra(0)["l2dpml"]
    assert report["private"] is False and "lifelong_bound" not in report
    assert len(a.memory) == METHOD["memory_batches_per_task"]


@pytest.mark.parametrize("drop", ["epsilon1", "epsilon2", "batch_size", "release_autoencoder"])
def test_private_plan_missing_a_key_is_refused_by_name(stream, drop):
    task = stream.tasks[0]
    plan = L2DPML_SPEC.plan_task(METHOD, PRIVACY, len(task.train.labels), 0)
    broken = TaskPlan(events=plan.events, noise={k: v for k, v in plan.noise.items() if k != drop})
    with pytest.raises(InvalidParameterError, match=drop):
        _method().fit_task(0, _data(task), task.labels, broken)


def test_noise_without_events_is_refused(stream):
    task = stream.tasks[0]
    with pytest.raises(InvalidParameterError, match="inconsistent"):
        _method().fit_task(0, _data(task), task.labels, TaskPlan(events=(), noise={"epsilon2": 1.0}))


def test_dpcl_run_non_private_l2dpml_writes_not_private_certificates(tmp_path):
    from dpcl.cli import main

    config = tmp_path / "l2dpml.toml"
    config.write_text(
        '[privacy]\nepsilon = 4.0\ndelta = 1e-5\nadjacency = "replace_one"\n'
        '[stream]\ndataset = "digits"\nkind = "permuted"\nn_tasks = 2\nlabel_space = "prior_const"\n'
        "prior_labels = [0, 1, 2, 3, 4, 5, 6, 7, 8, 9]\ndisjoint_units = true\n"
        '[method]\nname = "l2dpml"\nhidden_sizes = [8, 4]\nbatch_size = 200\nepochs = 3\n'
        "[run]\nprivate = false\n"
    )
    assert main(["run", str(config), "--out", str(tmp_path / "run"), "--quiet"]) == 0
    certificates = sorted((tmp_path / "run" / "certificates").glob("*.cert.json"))
    assert len(certificates) == 2
    assert main(["verify", *map(str, certificates), "--json"]) == 0
    assert all(json.loads(c.read_text())["guarantee"]["private"] is False for c in certificates)


def test_raw_text_streams_are_refused_by_name():
    from dpcl.errors import ConfigError

    with pytest.raises(ConfigError, match="fortunes_texts"):
        L2DPMLMethod(MethodSetup(method=METHOD, privacy=PRIVACY, label_space=tuple(range(10)), input_dim=0, seed=0))


def test_report_does_not_publish_the_observed_input_extremes(stream):
    """The report is in the checkpoint and the certificate; the min / max of private inputs is not DP."""
    task = stream.tasks[0]
    x = task.train.features * 0.9 + 0.01  # extremes 0.01 and 0.91 (not the box ends 0 and 1)
    m = _method()
    plan = L2DPML_SPEC.plan_task(METHOD, PRIVACY, len(task.train.labels), 0)
    m.fit_task(0, TrainingData(x, task.train.labels, task.train.unit_ids), task.labels, plan)
    (check,) = [p for p in m.certificate_extra(0)["l2dpml"]["preconditions"] if p["name"] == "input_range"]
    assert check["met"]
    text = str(m.certificate_extra(0))
    for value in (x.min(), x.max()):
        assert f"{value:.6g}" not in text and f"{value:.4g}" not in text


def test_sequential_composition_lets_a_unit_return_in_a_later_task(stream):
    """Across tasks only parallel composition needs disjoint units; within a task each unit holds one example."""
    task0, task1 = stream.tasks[0], stream.tasks[1]
    returning = np.asarray(task1.train.unit_ids).copy()
    returning[0] = task0.train.unit_ids[0]
    data1 = TrainingData(task1.train.features, task1.train.labels, returning)
    plan1 = L2DPML_SPEC.plan_task(METHOD, PRIVACY, len(task1.train.labels), task1.index)
    sequential = _method(privacy={**PRIVACY, "across_tasks": "sequential"})
    _fit(sequential, task0)
    sequential.fit_task(task1.index, data1, task1.labels, plan1)
    units = [p for p in sequential.reports[task1.index]["preconditions"] if p["name"] == "one_example_per_unit"]
    assert units and units[0]["met"] and "1 units seen in earlier tasks (allowed)" in units[0]["detail"]
    twice = returning.copy()
    twice[1] = twice[0]
    with pytest.raises(DisjointnessViolationError, match="1 repeated units in the task"):
        _method(privacy={**PRIVACY, "across_tasks": "sequential"}).fit_task(
            task1.index, TrainingData(task1.train.features, task1.train.labels, twice), task1.labels, plan1)
    for across in ("parallel", "auto", None):  # anything but an explicit "sequential" keeps the strict check
        privacy = PRIVACY if across is None else {**PRIVACY, "across_tasks": across}
        strict = _method(privacy=privacy)
        _fit(strict, task0)
        with pytest.raises(DisjointnessViolationError, match="earlier tasks"):
            strict.fit_task(task1.index, data1, task1.labels, plan1)


def test_l2dpml_computes_on_the_setup_device_and_reports_it():
    """L2DP-ML's tensors live on ``setup.device`` (the meta device stands in for a GPU on a CPU-only machine)."""
    on_meta = L2DPMLMethod(MethodSetup(method=METHOD, privacy=PRIVACY, label_space=tuple(range(10)),
                                       input_dim=64, seed=0, device="meta"))
    assert on_meta.compute_device == "meta"
    assert {t.device.type for t in (on_meta.theta1, on_meta.W, *on_meta.hidden[0])} == {"meta"}
    other = method_class("cosine")(MethodSetup(method={}, privacy=PRIVACY, label_space=(0, 1), input_dim=4, seed=0))
    assert other.compute_device == "cpu"  # the default: setup.device


def _diagonal(m: L2DPMLMethod, stream) -> list[float]:
    """Accuracy on task t right after training on it (class-incremental evaluation over all 10 outputs)."""
    acc = []
    for task in stream.tasks:
        m.fit_task(task.index, _data(task), task.labels, TaskPlan(events=(), noise={}))
        acc.append(m.accuracy(task.test.features, task.test.labels))
    return acc


@pytest.mark.parametrize("method", [
    # the bundled digits schedule: one fixed batch per task, the auto-encoder re-trained on every task
    {"hidden_sizes": [16, 8], "batch_size": 512, "epochs": 200, "autoencoder_training": "every_task"},
    {"hidden_sizes": [32, 64], "batch_size": 64, "epochs": 30, "autoencoder_training": "first_task"},
], ids=["every_task", "first_task"])
def test_non_private_run_learns_every_task_right_after_training_it(method):
    """Regression: with a re-trained auto-encoder the output layer's A-GEM reference used the memory's output
    coefficients of an older theta1 (polynomials in features that no longer exist), and task 2 of split digits
    collapsed to 0.04 right after its training. Every task must now be learned far above chance (0.1)."""
    from dpcl.data.streams import class_incremental_stream

    split = class_incremental_stream(load_digits(), [[0, 1], [2, 3], [4, 5], [6, 7], [8, 9]], seed=0)
    acc = _diagonal(_method({**method, "memory_batches_per_task": 1}, privacy={}), split)
    assert min(acc) > 0.6, acc


def test_output_memory_of_an_older_autoencoder_is_not_an_agem_reference(stream):
    """Memory entries record the theta1 release their output coefficients were computed under; a new
    auto-encoder release makes them invalid references for the output layer (its auto-encoder polynomials,
    in input space, stay valid)."""
    every = {**METHOD, "autoencoder_training": "every_task"}
    m = _method(every, privacy={})
    _diagonal(m, stream)
    assert [e["theta1_release"] for e in m.memory] == [0, 1, 2]
    assert m.theta1_release == 2
    frozen = _method({**METHOD, "autoencoder_training": "first_task"}, privacy={})
    _diagonal(frozen, stream)
    assert [e["theta1_release"] for e in frozen.memory] == [0, 0, 0] and frozen.theta1_release == 0
    restored = _method(every, privacy={})
    restored.load_state_dict(m.state_dict())
    assert restored.theta1_release == 2 and [e["theta1_release"] for e in restored.memory] == [0, 1, 2]


@pytest.mark.parametrize("stream_kind", ["split", "permuted"])
def test_fmnist_configs_calibrate_the_laplace_noise_to_the_derived_sensitivities(stream_kind):
    """The bundled Fashion-MNIST configs (d = 784, |h_pi| = 16, K = 10) at epsilon = 10: the plan charges
    epsilon1 + epsilon2 = 10 per example and a release adds Laplace noise of scale Delta / epsilon with the closed
    forms Delta_R = 9d/16 + 3d(d-1)/8 ([0, 1] inputs) and Delta_L = K p + p^2 (p = |h_pi| + 1). No data needed:
    a small task of random images in [0, 1]^784 exercises the release."""
    import tomllib
    from pathlib import Path

    import dpcl

    config = tomllib.loads((Path(dpcl.__file__).parent / "configs" / f"fmnist_l2dpml_{stream_kind}.toml").read_text())
    method, privacy = config["method"], config["privacy"]
    d, p, k = 784, method["hidden_sizes"][-1] + 1, 10
    plan = L2DPML_SPEC.plan_task(method, privacy, 40, 0)
    e1, e2 = plan.noise["epsilon1"], plan.noise["epsilon2"]
    assert e1 + e2 == pytest.approx(privacy["epsilon"]) == pytest.approx(10.0)
    m = L2DPMLMethod(MethodSetup(method=method, privacy=privacy, label_space=tuple(range(k)), input_dim=d, seed=0))
    rng = np.random.default_rng(0)
    data = TrainingData(rng.random((40, d)), rng.integers(0, k, 40), np.arange(40))
    m.fit_task(0, data, tuple(range(k)), plan)
    report = m.certificate_extra(0)["l2dpml"]
    delta_r, delta_l = 9 * d / 16 + 3 * d * (d - 1) / 8, k * p + p * p
    assert report["sensitivities"]["delta_R"] == pytest.approx(delta_r)
    assert report["sensitivities"]["delta_L"] == pytest.approx(delta_l)
    assert report["laplace_scales"] == pytest.approx({"reconstruction": delta_r / e1, "output": delta_l / e2})
    assert report["lifelong_bound"]["epsilon"] == pytest.approx(10.0)


def test_non_private_run_learns_every_permuted_task_with_a_wide_feature_layer():
    """Permuted digits, the auto-encoder re-trained on every task (Alg. 2), 128 fixed random features: each task
    is learned right after its training (10 classes, chance 0.1); the bundled |h_pi| = 8 reaches only about 0.6."""
    permuted = permuted_stream(load_digits(), 5, seed=0)
    method = {"hidden_sizes": [32, 128], "batch_size": 128, "epochs": 50, "memory_batches_per_task": 1,
              "autoencoder_training": "every_task"}
    acc = _diagonal(_method(method, privacy={}), permuted)
    assert min(acc) > 0.75, acc
