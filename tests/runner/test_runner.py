"""Certified runs end to end on digits (CPU, a few seconds each): certificates, audit gate, resume, metrics."""

from __future__ import annotations

import json

import numpy as np
import pytest

torch = pytest.importorskip("torch")
torch.set_num_threads(1)  # 2 xdist workers share 2 cores

from dpcl.errors import (  # noqa: E402
    ConfigError,
    InvalidParameterError,
    LabelSpaceViolationError,
    PrivacyViolationError,
    VerificationError,
)
from dpcl.guarantees.certificates import read_certificate, verify_certificate  # noqa: E402
from dpcl.guarantees.ledger import TaskLedger  # noqa: E402
from dpcl.runner import run_training  # noqa: E402
from dpcl.runner.run import NON_PRIVATE_STATEMENT  # noqa: E402
from run_helpers import write_config  # noqa: E402


def _verified(result):
    reports = [verify_certificate(result.out_dir / r.certificate) for r in result.releases]
    return all(r.valid for r in reports)


def test_cosine_run_writes_and_verifies_one_certificate_per_release(tmp_path):
    config = write_config(tmp_path, "cosine", epsilon=2.0)
    result = run_training(config, tmp_path / "out", quiet=True)
    out = result.out_dir
    assert result.complete and len(result.releases) == 5
    assert sorted(p.name for p in (out / "certificates").iterdir()) == [f"task{t:03d}.cert.json" for t in range(1, 6)]
    assert len(list((out / "checkpoints").glob("*.pt"))) == 5
    assert (out / "accuracy.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert _verified(result)
    metrics = json.loads((out / "metrics.json").read_text())
    # 10 classes: chance is 0.1
    assert metrics["average_accuracy"] > 0.6
    assert len(metrics["accuracy_matrix"]) == 5 and metrics["accuracy_matrix"][0][1] is None
    for key in ("average_forgetting", "backward_transfer", "last", "avg", "average_accuracy_curve"):
        assert key in metrics
    # disjoint tasks, one Gaussian release each: parallel composition, the stream costs one task's epsilon
    assert metrics["across_tasks"] == "parallel"
    assert all(eps <= 2.0 * (1 + 1e-9) for eps in metrics["cumulative_epsilon"])
    cert = read_certificate(out / "certificates" / "task005.cert.json")
    assert cert["guarantee"]["adjacency"] == "add_remove" and cert["guarantee"]["unit"] == "example"
    assert any("prior" in a for a in cert["assumptions"])
    ledger = TaskLedger.load(out / "ledger.json")
    assert len(ledger.charges) == 5 and ledger.released_tasks() == [0, 1, 2, 3, 4]


def test_certified_noise_is_what_the_model_used(tmp_path):
    """The certificate's Gaussian sigma reproduces its epsilon with dp-accounting's PLD (independent reference)."""
    from dp_accounting import dp_event
    from dp_accounting.pld import pld_privacy_accountant

    config = write_config(tmp_path, "cosine", epsilon=1.0)
    result = run_training(config, tmp_path / "out", quiet=True)
    cert = read_certificate(result.last_certificate)
    sigma = cert["events"][0]["events"][0]["sigma"]
    accountant = pld_privacy_accountant.PLDAccountant(value_discretization_interval=1e-4)
    accountant.compose(dp_event.GaussianDpEvent(noise_multiplier=sigma))
    assert accountant.get_epsilon(1e-5) == pytest.approx(1.0, abs=2e-3)
    assert cert["guarantee"]["epsilon"] == pytest.approx(1.0, abs=1e-6)


def test_interrupted_run_resumes_after_the_last_certified_task(tmp_path):
    config = write_config(tmp_path, "cosine", epsilon=1.0)
    # bit-for-bit comparison with the uninterrupted run needs the reproducible-noise opt-in
    whole = run_training(config, tmp_path / "whole", seed=3, quiet=True, reproducible_noise=True)
    first = run_training(config, tmp_path / "split", seed=3, quiet=True, stop_after_task=1, reproducible_noise=True)
    assert not first.complete and [r.task_index for r in first.releases] == [0, 1]
    assert len(TaskLedger.load(tmp_path / "split" / "ledger.json").charges) == 2
    second = run_training(config, tmp_path / "split", seed=3, quiet=True, reproducible_noise=True, resume=True)
    assert second.resumed_after == 1 and second.complete
    assert _verified(second)
    assert len(TaskLedger.load(tmp_path / "split" / "ledger.json").charges) == 5
    # per-task noise generators derived from (seed, task): resuming reproduces the uninterrupted run
    assert second.metrics["accuracy_matrix"] == whole.metrics["accuracy_matrix"]
    # a finished run rerun does nothing new
    third = run_training(config, tmp_path / "split", seed=3, quiet=True, reproducible_noise=True, resume=True)
    assert third.resumed_after == 4 and len(TaskLedger.load(tmp_path / "split" / "ledger.json").charges) == 5


def test_crash_after_the_ledger_commits_a_release_finishes_it_without_retraining_or_charging_again(
    tmp_path, monkeypatch
):
    """The ledger's release record is the commit point: a crash after it (here while writing the certificate)
    is resumed by finishing that release from its committed checkpoint, never by retraining the task."""
    import dpcl.certification.releases as certificates  # the run writes its certificates through the Certifier

    config = write_config(tmp_path, "cosine", epsilon=1.0, tasks="[[0, 1], [2, 3], [4, 5]]")
    real_write = certificates.write_certificate
    calls = []

    def crash_on_second(path, cert):
        calls.append(path)
        if len(calls) == 2:
            raise RuntimeError("power cut")
        return real_write(path, cert)

    monkeypatch.setattr(certificates, "write_certificate", crash_on_second)
    with pytest.raises(RuntimeError, match="power cut"):
        run_training(config, tmp_path / "out", quiet=True)
    committed = TaskLedger.load(tmp_path / "out" / "ledger.json")
    assert committed.released_tasks() == [0, 1]
    monkeypatch.setattr(certificates, "write_certificate", real_write)
    result = run_training(config, tmp_path / "out", quiet=True, resume=True)
    assert result.resumed_after == 0 and result.complete and _verified(result)
    ledger = TaskLedger.load(tmp_path / "out" / "ledger.json")
    assert [c.tasks for c in ledger.charges] == [(0,), (1,), (2,)]  # task 2 charged once
    cert = read_certificate(tmp_path / "out" / "certificates" / "task002.cert.json")
    assert cert["checkpoint"]["sha256"] == committed.releases[1].checkpoint_sha256  # not retrained
    assert result.metrics["final_epsilon"] == pytest.approx(1.0, rel=1e-6)  # parallel, calibrated to 1 per task


def test_crash_before_the_commit_reuses_the_charge_and_removes_the_attempts_files(tmp_path, monkeypatch):
    """A crash while training task 2: its charge is recorded, nothing was released. The rerun removes the
    attempt's files and retrains the task under the same charge (the attempt released nothing)."""
    from dpcl.methods.cosine.method import CosineClassifier

    config = write_config(tmp_path, "cosine", epsilon=1.0, tasks="[[0, 1], [2, 3], [4, 5]]")
    real_fit = CosineClassifier.fit_task

    def crash_in_task_1(self, t, *args, **kwargs):
        if t == 1:
            raise RuntimeError("power cut")
        return real_fit(self, t, *args, **kwargs)

    monkeypatch.setattr(CosineClassifier, "fit_task", crash_in_task_1)
    with pytest.raises(RuntimeError, match="power cut"):
        run_training(config, tmp_path / "out", quiet=True)
    stale = tmp_path / "out" / "checkpoints" / "task002.pt.pending"
    stale.write_bytes(b"an attempt that never committed")
    monkeypatch.setattr(CosineClassifier, "fit_task", real_fit)
    result = run_training(config, tmp_path / "out", quiet=True, resume=True)
    assert result.resumed_after == 0 and result.complete and _verified(result)
    assert [c.tasks for c in TaskLedger.load(tmp_path / "out" / "ledger.json").charges] == [(0,), (1,), (2,)]
    assert not list((tmp_path / "out").rglob("*.pending"))


def test_resume_refuses_a_missing_or_older_ledger(tmp_path):
    """Sequential composition: losing the ledger of a run that released tasks 1-2 and resuming certified
    epsilon 1.835 after task 5 instead of the 2.442 all five charges cost. The run now refuses to resume
    without its own, up-to-date ledger; with it restored the full cost is certified."""
    import shutil

    from dpcl.errors import LedgerCorruptError

    config = write_config(tmp_path, "cosine", epsilon=1.0, across_tasks="sequential", disjoint_units=False)
    out = tmp_path / "out"
    run_training(config, out, quiet=True, stop_after_task=0)
    shutil.copy(out / "ledger.json", tmp_path / "ledger_after_task1.json")
    run_training(config, out, quiet=True, stop_after_task=1, resume=True)
    shutil.copy(out / "ledger.json", tmp_path / "ledger_after_task2.json")
    (out / "ledger.json").unlink()
    with pytest.raises(LedgerCorruptError, match="missing"):
        run_training(config, out, quiet=True, resume=True)
    shutil.copy(tmp_path / "ledger_after_task1.json", out / "ledger.json")
    with pytest.raises(LedgerCorruptError, match="no record of the release\\(s\\) of task\\(s\\) 2"):
        run_training(config, out, quiet=True, resume=True)
    shutil.copy(tmp_path / "ledger_after_task2.json", out / "ledger.json")
    resumed = run_training(config, out, quiet=True, resume=True)
    whole = run_training(config, tmp_path / "whole", quiet=True)
    assert len(TaskLedger.load(out / "ledger.json").charges) == 5
    assert resumed.metrics["final_epsilon"] == pytest.approx(whole.metrics["final_epsilon"], rel=1e-9)
    assert resumed.metrics["final_epsilon"] > 2.0  # five sequential releases, each at epsilon 1


def test_resume_refuses_a_modified_checkpoint(tmp_path):
    config = write_config(tmp_path, "cosine")
    run_training(config, tmp_path / "out", quiet=True, stop_after_task=0)
    checkpoint = tmp_path / "out" / "checkpoints" / "task001.pt"
    checkpoint.write_bytes(checkpoint.read_bytes() + b"tampered")
    with pytest.raises(VerificationError, match="modified after release"):
        run_training(config, tmp_path / "out", quiet=True, resume=True)


def test_resume_refuses_another_config_or_seed(tmp_path):
    config = write_config(tmp_path, "cosine", epsilon=1.0)
    run_training(config, tmp_path / "out", quiet=True, stop_after_task=0)
    with pytest.raises(ConfigError, match="seed"):
        run_training(config, tmp_path / "out", seed=1, quiet=True, resume=True)
    other = write_config(tmp_path, "cosine", epsilon=4.0, name="other.toml")
    with pytest.raises(ConfigError, match="config"):
        run_training(other, tmp_path / "out", quiet=True, resume=True)


def test_refused_config_is_not_trained(tmp_path):
    """label_space = 'data' breaks DP (Prop. 4.6): exit-3 error before any checkpoint exists."""
    config = write_config(tmp_path, "cosine", label_space="data")
    with pytest.raises(PrivacyViolationError, match="Prop. 4.6"):
        run_training(config, tmp_path / "out", quiet=True)
    assert not (tmp_path / "out" / "checkpoints").exists()


def test_parallel_composition_over_shared_units_is_refused(tmp_path):
    config = write_config(tmp_path, "cosine", disjoint_units=False, across_tasks="parallel")
    with pytest.raises(PrivacyViolationError, match="disjoint"):
        run_training(config, tmp_path / "out", quiet=True)


def test_unknown_run_key_is_refused_by_name(tmp_path):
    config = write_config(tmp_path, "cosine", extra="\n[run]\nprivat = false\n")
    with pytest.raises(ConfigError, match="privat"):
        run_training(config, tmp_path / "out", quiet=True)


def test_non_private_run_says_it_is_not_private(tmp_path):
    config = write_config(tmp_path, "cosine", extra="\n[run]\nprivate = false\n")
    result = run_training(config, tmp_path / "out", quiet=True)
    assert not result.private and result.metrics["epsilon_per_task"] == "inf"
    assert not (tmp_path / "out" / "ledger.json").exists()
    assert not (tmp_path / "out" / "scoped").exists()
    for release in result.releases:  # a v2 certificate that says, verified, that the checkpoint is NOT private
        assert release.certificate.endswith(".cert.json") and release.cumulative_epsilon is None
        cert = read_certificate(tmp_path / "out" / release.certificate)
        assert cert["version"] == 2 and cert["guarantee"]["private"] is False and cert["guarantee"]["epsilon"] is None
        assert cert["guarantee"]["reasons"] == [NON_PRIVATE_STATEMENT] and cert["scoped_guarantees"] == []
        assert cert["events"] == []
        report = verify_certificate(tmp_path / "out" / release.certificate).raise_if_invalid()
        assert report.private is False
    assert result.metrics["average_accuracy"] > 0.8


@pytest.mark.parametrize("method", ["peft_ensemble", "naive", "non_cl"])
def test_dpsgd_methods_run_and_certify(tmp_path, method):
    config = write_config(tmp_path, method, epsilon=4.0, label_space="prior", tasks="[[0, 1], [2, 3], [4, 5]]")
    result = run_training(config, tmp_path / "out", quiet=True)
    assert result.complete and _verified(result)
    eps = result.metrics["cumulative_epsilon"]
    if method == "non_cl":
        # every release retrains on tasks 0..t: task 0's data is read by all of them, epsilon grows
        assert all(b > a for a, b in zip(eps, eps[1:]))
    else:
        assert max(eps) <= 4.0 * (1 + 1e-6)
    if method in ("peft_ensemble", "non_cl"):
        assert result.metrics["average_accuracy"] > 0.4  # chance over the 6 labels released at the end: 1/6


def test_task_sizes_that_disagree_with_the_data_are_refused(tmp_path):
    config = write_config(tmp_path, "cosine", method_extra="")
    text = config.read_text().replace("disjoint_units = true", "disjoint_units = true\ntask_sizes = [1, 1, 1, 1, 1]")
    config.write_text(text)
    with pytest.raises(ConfigError, match="task_sizes"):
        run_training(config, tmp_path / "out", quiet=True)


def test_cuda_without_a_gpu_is_a_clear_error(tmp_path):
    if torch.cuda.is_available():
        pytest.skip("a GPU is present: the CPU-only error path cannot occur here")
    config = write_config(tmp_path, "cosine")
    with pytest.raises(InvalidParameterError, match="--device cuda was asked for"):
        run_training(config, tmp_path / "out", device="cuda", quiet=True)
    in_config = write_config(tmp_path, "cosine", method_extra='device = "cuda"\n', name="cuda.toml")
    with pytest.raises(InvalidParameterError, match=r"\[method\] device cuda was asked for.*device = \"cpu\" in \[method\]"):
        run_training(in_config, tmp_path / "out2", quiet=True)


def test_audit_and_run_agree_on_sizes_and_epsilon(tmp_path):
    """What is audited is what is trained: `dpcl audit`'s plan equals the run's ledger."""
    from dpcl.cli.audit import stream_task_sizes
    from dpcl.data import STREAM_KEYS
    from dpcl.audit_config import audit_config
    from dpcl.guarantees.config import load_config

    config_path = write_config(tmp_path, "peft_ensemble", epsilon=3.0, label_space="prior",
                               tasks="[[0, 1], [2, 3], [8, 9]]", prior_labels="[[0, 1], [2, 3, 4], [9]]")
    config = load_config(config_path, data_stream_keys=STREAM_KEYS)
    sizes, reports, _ = stream_task_sizes(config)
    audited = audit_config(config, sizes, filter_reports=reports)
    result = run_training(config_path, tmp_path / "out", quiet=True)
    assert [r.examples for r in result.releases] == sizes
    assert result.releases[-1].filtered_out == reports[-1].filtered > 0
    assert result.metrics["final_epsilon"] == pytest.approx(audited.epsilon, rel=1e-9)


def test_empty_task_after_filtering_still_releases_a_classifier(tmp_path):
    """Task 2's public labels miss its data entirely: noise-only sums are released and certified (Prop. F.1)."""
    config = write_config(tmp_path, "cosine", label_space="prior", tasks="[[0, 1], [2, 3]]",
                          prior_labels="[[0, 1], [7, 8]]")
    result = run_training(config, tmp_path / "out", quiet=True)
    assert result.releases[1].examples == 0 and _verified(result)
    assert np.isfinite(result.metrics["average_accuracy"])


def test_label_space_data_error_is_a_label_space_violation_type(tmp_path):
    config = write_config(tmp_path, "cosine", label_space="data")
    with pytest.raises(PrivacyViolationError) as info:
        run_training(config, tmp_path / "out", quiet=True)
    assert not isinstance(info.value, LabelSpaceViolationError) or info.value.exit_code == 3


@pytest.mark.thorough
def test_raw_text_stream_trains_lora_members_and_certifies(tmp_path):
    """fortunes_texts (no features): PEFT Ensemble members are LoRA adapters on MiniLM; certificates verify."""
    config = write_config(tmp_path, "peft_ensemble", epsilon=8.0, label_space="prior", tasks="[[0, 1], [2, 3]]")
    text = config.read_text().replace(
        'dataset = "digits"',
        'dataset = "fortunes_texts"\ndataset_options = {categories = ["food", "law", "science", "work"], '
        "max_per_class = 20}",
    ).replace("batch_size = 64", "batch_size = 8")
    config.write_text(text)
    result = run_training(config, tmp_path / "out", quiet=True)
    assert result.complete and _verified(result)
    assert np.isfinite(result.metrics["average_accuracy"])
