"""dpcl run: noise source (OS entropy vs the reproducible opt-in), --seed reaching the stream, method certificate
fields (L2DP-ML Thm 2 terms) and PeCL on raw texts, end to end on small configs."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
torch.set_num_threads(1)  # 2 xdist workers share 2 cores

from dpcl.errors import ConfigError  # noqa: E402
from dpcl.guarantees.certificates import read_certificate, verify_certificate  # noqa: E402
from dpcl.methods.noise_source import (  # noqa: E402
    FLOATING_POINT_ASSUMPTION,
    OS_ENTROPY_NO_SAMPLING_ASSUMPTION as OS_ENTROPY_ASSUMPTION,  # cosine and PeCL's per-token noise: no sampling
    REPRODUCIBLE_NOISE_NO_SAMPLING_ASSUMPTION as REPRODUCIBLE_NOISE_ASSUMPTION,
    noise_assumptions,
    poisson_subsampled,
)
from dpcl.runner import run_training  # noqa: E402
from dpcl.runner.checkpoints import load_checkpoint  # noqa: E402
from run_helpers import write_config, write_pecl_config  # noqa: E402

TWO_TASKS = "[[0, 1], [2, 3]]"


def _class_sums(result) -> torch.Tensor:
    return load_checkpoint(result.out_dir / result.releases[-1].checkpoint)["state"]["class_sums"]


def _all_verify(result) -> bool:
    return all(verify_certificate(result.out_dir / r.certificate).valid for r in result.releases)


def test_default_runs_with_the_same_seed_draw_different_noise_and_say_so(tmp_path):
    config = write_config(tmp_path, "cosine", epsilon=1.0, tasks=TWO_TASKS)
    a = run_training(config, tmp_path / "a", seed=4, quiet=True)
    b = run_training(config, tmp_path / "b", seed=4, quiet=True)
    assert not torch.equal(_class_sums(a), _class_sums(b))
    assert _all_verify(a)
    cert = read_certificate(a.last_certificate)
    assert OS_ENTROPY_ASSUMPTION in cert["assumptions"] and FLOATING_POINT_ASSUMPTION in cert["assumptions"]
    assert REPRODUCIBLE_NOISE_ASSUMPTION not in cert["assumptions"]
    assert not any("subsampl" in a for a in cert["assumptions"])  # cosine draws no Poisson sample
    from dpcl.certifier import FIXED_PARAMETERS_ASSUMPTION

    assert FIXED_PARAMETERS_ASSUMPTION in cert["assumptions"]  # no filter: the config fixed every parameter
    assert cert["extra"]["reproducible_noise"] is False
    assert a.metrics["reproducible_noise"] is False


@pytest.mark.parametrize("how", ["config", "argument"])
def test_reproducible_noise_opt_in_repeats_the_run_and_every_certificate_warns(tmp_path, how):
    extra = "\n[run]\nreproducible_noise = true\n" if how == "config" else ""
    config = write_config(tmp_path, "cosine", epsilon=1.0, tasks=TWO_TASKS, extra=extra)
    kwargs = {} if how == "config" else {"reproducible_noise": True}
    a = run_training(config, tmp_path / "a", seed=4, quiet=True, **kwargs)
    b = run_training(config, tmp_path / "b", seed=4, quiet=True, **kwargs)
    assert torch.equal(_class_sums(a), _class_sums(b))
    assert _all_verify(a)
    for release in a.releases:
        cert = read_certificate(a.out_dir / release.certificate)
        assert REPRODUCIBLE_NOISE_ASSUMPTION in cert["assumptions"]
        assert OS_ENTROPY_ASSUMPTION not in cert["assumptions"]
        assert cert["extra"]["reproducible_noise"] is True and cert["extra"]["seed"] == 4


def test_resume_refuses_to_switch_the_noise_source(tmp_path):
    config = write_config(tmp_path, "cosine", epsilon=1.0, tasks=TWO_TASKS)
    run_training(config, tmp_path / "out", quiet=True, stop_after_task=0)
    with pytest.raises(ConfigError, match="reproducible_noise"):
        run_training(config, tmp_path / "out", quiet=True, reproducible_noise=True, resume=True)


def test_noise_assumptions_claim_subsampling_only_for_subsampled_events():
    from dpcl.accounting.events import GaussianEvent, PoissonSampledGaussianEvent, RepeatedEvent

    step = PoissonSampledGaussianEvent(noise_multiplier=1.0, sample_rate=0.01)
    assert poisson_subsampled([GaussianEvent(sigma=1.0), RepeatedEvent(step, 10)])
    assert not poisson_subsampled([GaussianEvent(sigma=1.0), RepeatedEvent(GaussianEvent(sigma=2.0), 3)])
    for reproducible in (False, True):
        assert "Poisson subsampling" in noise_assumptions(reproducible, subsampled=True)[0]
        assert "subsampling" not in noise_assumptions(reproducible, subsampled=False)[0]


def test_reproducible_noise_must_be_a_boolean(tmp_path):
    config = write_config(tmp_path, "cosine", tasks=TWO_TASKS, extra='\n[run]\nreproducible_noise = "yes"\n')
    with pytest.raises(ConfigError, match="reproducible_noise"):
        run_training(config, tmp_path / "out", quiet=True)


def _captured_stream_options(monkeypatch) -> list[dict]:
    import dpcl.runner.tasks as tasks  # the runner builds its stream through tasks.build_run_stream

    seen: list[dict] = []
    original = tasks.build_stream

    def capture(options, **kwargs):  # kwargs: device, progress, encode (the run's device and --quiet)
        seen.append(dict(options))
        return original(options, **kwargs)

    monkeypatch.setattr(tasks, "build_stream", capture)
    return seen


def test_seed_sets_the_stream_seed_unless_the_config_does(tmp_path, monkeypatch):
    seen = _captured_stream_options(monkeypatch)
    config = write_config(tmp_path, "cosine", tasks=TWO_TASKS)
    result = run_training(config, tmp_path / "a", seed=9, quiet=True)
    assert seen[-1]["seed"] == 9 and "split_seed" not in seen[-1]  # the split keeps its fixed default
    assert result.metrics["stream_seed"] == 9

    explicit = write_config(tmp_path, "cosine", tasks=TWO_TASKS, name="explicit.toml")
    explicit.write_text(explicit.read_text().replace('dataset = "digits"\n', 'dataset = "digits"\nseed = 2\n'))
    result = run_training(explicit, tmp_path / "b", seed=9, quiet=True)
    assert seen[-1]["seed"] == 2 and result.metrics["stream_seed"] == 2


def test_seed_changes_the_example_order_of_the_stream(tmp_path):
    """Different --seed, same split: same examples per task, in another order (the stream's own seed)."""
    from dpcl.data import build_stream

    base = {"dataset": "digits", "tasks": [[0, 1], [2, 3]]}
    one, two = build_stream({**base, "seed": 1}), build_stream({**base, "seed": 2})
    for a, b in zip(one, two):
        assert sorted(a.train.unit_ids.tolist()) == sorted(b.train.unit_ids.tolist())
        assert a.train.unit_ids.tolist() != b.train.unit_ids.tolist()


L2DPML_METHOD = (
    'name = "l2dpml"\nhidden_sizes = [8, 4]\nbatch_size = 512\nmemory_batches_per_task = 1\nepochs = 5\n'
    'input_range = "unit"\nepsilon1_fraction = 0.5\n'
)


def test_l2dpml_certificates_carry_the_thm2_terms_and_preconditions(tmp_path):
    config = write_config(tmp_path, "cosine", epsilon=10.0, tasks=TWO_TASKS)
    text = config.read_text().replace('name = "cosine"\n', L2DPML_METHOD)
    text = text.replace("[privacy]\n", '[privacy]\nadjacency = "replace_one"\n')
    config.write_text(text)
    result = run_training(config, tmp_path / "out", quiet=True)
    assert result.complete and _all_verify(result)
    for release in result.releases:
        extra = read_certificate(result.out_dir / release.certificate)["extra"]["l2dpml"]
        assert extra["preconditions_met"] is True
        names = {p["name"] for p in extra["preconditions"]}
        assert {"fixed_hidden_layers"} <= names and len(names) >= 4
        bound = extra["lifelong_bound"]
        # Thm 2 terms by hand: epsilon1 = epsilon2 = 10 / 2; the paper's gamma_x = d (|h1| + 2) / lambda
        assert bound["certified_terms"] == pytest.approx(
            {"epsilon1": 5.0, "epsilon1_over_gamma_x": 0.0, "epsilon1_over_gamma": 0.0, "epsilon2": 5.0})
        assert bound["gamma_x"] == pytest.approx(64 * (8 + 2) / 512)
        assert bound["paper_terms"]["epsilon1_over_gamma_x"] == pytest.approx(5.0 / (64 * 10 / 512))
        assert bound["epsilon"] == pytest.approx(10.0)
        cert = read_certificate(result.out_dir / release.certificate)
        assert cert["guarantee"]["epsilon"] <= bound["epsilon"] * (1 + 1e-9)
        # Laplace scale of the output layer: Delta_L / epsilon2
        assert extra["laplace_scales"]["output"] == pytest.approx(extra["sensitivities"]["delta_L"] / 5.0)


def test_pecl_trains_on_raw_texts_through_dpcl_run_and_certifies(tmp_path):
    """PeCL as in the paper, [run] private = false: trained with the paper's noise; each certificate says the
    checkpoint is NOT private and states the per-token guarantee scoped to the input embeddings."""
    result = run_training(write_pecl_config(tmp_path), tmp_path / "out", quiet=True)
    assert result.complete and len(result.releases) == 2
    assert _all_verify(result)
    # evaluated on the test texts of every task seen so far
    assert [len(r.accuracies) for r in result.releases] == [1, 2]
    assert all(0.0 <= a <= 1.0 for r in result.releases for a in r.accuracies)
    cert = read_certificate(result.last_certificate)
    assert cert["release"]["method"] == "pecl" and cert["guarantee"]["private"] is False
    assert cert["guarantee"]["epsilon"] is None and cert["events"] == []
    assert any("clean private next-token targets" in r for r in cert["guarantee"]["reasons"])
    (scoped,) = cert["scoped_guarantees"]
    assert scoped["name"] == "input_embeddings" and scoped["adjacency"] == "replace_one" and scoped["unit"] == "token"
    assert [c["tasks"] for c in scoped["events"]] == [[0], [1]]  # composed across tasks, parallel
    assert scoped["across_tasks"] == "parallel" and 0 < scoped["epsilon"] <= 10.0 * (1 + 1e-6)
    assert (result.out_dir / "scoped" / "input_embeddings.ledger.json").is_file()
    assert not (result.out_dir / "ledger.json").exists()
    assert OS_ENTROPY_ASSUMPTION in cert["assumptions"]  # the paper's noise was drawn


def test_scoped_ledger_is_resumed_with_the_run_and_never_forgotten(tmp_path):
    """The scoped statement's ledger (scoped/NAME.ledger.json) is reopened on resume: the resumed run's last
    certificate composes both tasks' scoped events; a run whose scoped ledger went missing is refused."""
    import shutil

    from dpcl.errors import LedgerCorruptError

    config = write_pecl_config(tmp_path)
    first = run_training(config, tmp_path / "out", quiet=True, stop_after_task=0)
    assert not first.complete
    shutil.copytree(tmp_path / "out", tmp_path / "lost")
    second = run_training(config, tmp_path / "out", quiet=True, resume=True)
    assert second.resumed_after == 0 and second.complete and _all_verify(second)
    (scoped,) = read_certificate(second.last_certificate)["scoped_guarantees"]
    assert [c["tasks"] for c in scoped["events"]] == [[0], [1]]
    (earlier,) = read_certificate(second.out_dir / second.releases[0].certificate)["scoped_guarantees"]
    assert [c["tasks"] for c in earlier["events"]] == [[0]]
    (tmp_path / "lost" / "scoped" / "input_embeddings.ledger.json").unlink()
    with pytest.raises(LedgerCorruptError, match="input_embeddings.ledger.json"):
        run_training(config, tmp_path / "lost", quiet=True, resume=True)


def test_private_run_of_the_papers_pecl_is_refused_before_training(tmp_path):
    from dpcl.errors import PrivacyViolationError

    with pytest.raises(PrivacyViolationError, match="clean private next-token targets") as refused:
        run_training(write_pecl_config(tmp_path, private=True), tmp_path / "out", quiet=True)
    assert "sensitivity scores" in str(refused.value) and refused.value.exit_code == 3
    assert not (tmp_path / "out" / "checkpoints").exists()


def test_pecl_on_a_stream_without_texts_is_refused_by_name(tmp_path):
    path = write_pecl_config(tmp_path)
    text = path.read_text().replace('dataset = "fortunes_texts"', 'dataset = "digits"')
    text = "\n".join(line for line in text.splitlines() if not line.startswith("dataset_options"))
    path.write_text(text + "\n")
    with pytest.raises(ConfigError, match="trains on text"):
        run_training(path, tmp_path / "out", quiet=True)
    assert not (tmp_path / "out" / "checkpoints").exists()
