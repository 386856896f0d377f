"""dpcl.Certifier: the ledger, filter, label-space policy and certificates around any training loop."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest
from scipy.optimize import brentq
from scipy.stats import norm

from dpcl import Certifier, ReleaseCoverage
from dpcl.accounting.events import GaussianEvent, LaplaceEvent
from dpcl.certifier import UnchargedStepError
from dpcl.errors import (
    BudgetExceededError,
    ConfigError,
    DisjointnessViolationError,
    InvalidParameterError,
    LabelSpaceViolationError,
    LedgerCorruptError,
    PrivacyViolationError,
)
from dpcl.guarantees.ledger import TaskLedger

COVERED = ReleaseCoverage.post_processing("the weights are the noisy release of the charged Gaussian mechanism")
ASSUMPTIONS = ["Noise is drawn from OS entropy."]
PRIOR = [[0, 1], [2, 3], [4, 5]]


def _gaussian_epsilon(mu: float, delta: float) -> float:
    """Closed-form Gaussian privacy profile (Balle & Wang 2018, Thm 8), inverted with brentq."""
    def profile(eps: float) -> float:
        return float(norm.cdf(-eps / mu + mu / 2) - math.exp(eps) * norm.cdf(-eps / mu - mu / 2))

    hi = 1.0
    while profile(hi) > delta:
        hi *= 2
    return float(brentq(lambda e: profile(e) - delta, 0.0, hi, xtol=1e-14, rtol=1e-14))


def _certifier(run_dir: Path, **overrides) -> Certifier:
    settings = dict(delta=1e-5, label_space="prior", prior_labels=PRIOR, disjoint_units=True)
    settings.update(overrides)
    return Certifier(run_dir, **settings)


def _verify_cli(*paths: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "dpcl", "verify", *map(str, paths)],
                          capture_output=True, text=True, timeout=120)


def test_certifier_imports_without_torch(tmp_path):
    code = (
        "import sys\n"
        "sys.modules['torch'] = None  # any import of torch now fails\n"
        "from dpcl import Certifier, ReleaseCoverage\n"
        "from dpcl.accounting.events import GaussianEvent\n"
        f"c = Certifier({str(tmp_path / 'run')!r}, delta=1e-5, label_space='prior_const', prior_labels=[0, 1],\n"
        "              across_tasks='sequential')\n"
        "c.charge(0, GaussianEvent(sigma=3.0))\n"
        "c.release(0, b'w', coverage=ReleaseCoverage.post_processing('noisy sums'), assumptions=['OS noise'])\n"
        "assert not [m for m, v in sys.modules.items() if v is not None and (m == 'torch' or m.startswith('torch.'))]\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr


def test_release_writes_a_certificate_that_dpcl_verify_accepts(tmp_path):
    c = _certifier(tmp_path / "run")
    c.charge(0, GaussianEvent(sigma=2.0), unit_ids=[0, 1, 2])
    first = c.release(0, b"weights after task 0", coverage=COVERED, assumptions=ASSUMPTIONS, filename="task001.npz")
    c.charge(1, GaussianEvent(sigma=1.0), unit_ids=[3, 4])
    second = c.task(1).release(b"weights after task 1", coverage=COVERED, assumptions=ASSUMPTIONS)
    assert first.checkpoint == tmp_path / "run" / "checkpoints" / "task001.npz"
    assert first.checkpoint.read_bytes() == b"weights after task 0"
    assert [p.name for p in c.certificates] == ["task001.cert.json", "task002.cert.json"]
    # parallel composition (Thm 4.4): the stream costs its worst task, here mu = 1
    assert first.epsilon == pytest.approx(_gaussian_epsilon(0.5, 1e-5), rel=1e-9)
    assert second.epsilon == pytest.approx(_gaussian_epsilon(1.0, 1e-5), rel=1e-9)
    done = _verify_cli(*c.certificates)
    assert done.returncode == 0, done.stdout + done.stderr
    cert = json.loads(second.certificate.read_text())
    assert cert["checkpoint"]["path"] == "../checkpoints/task002.ckpt"
    assert cert["guarantee"]["across_tasks"] == "parallel"
    assert cert["guarantee"]["private"] is True and cert["guarantee"]["basis"] == COVERED.basis
    assert cert["guarantee"]["epsilon"] == second.epsilon
    assert ASSUMPTIONS[0] in cert["assumptions"]
    # a swapped checkpoint fails verification (exit 3)
    second.checkpoint.write_bytes(b"other weights")
    assert _verify_cli(second.certificate).returncode == 3


def test_sequential_composition_composes_every_task(tmp_path):
    c = _certifier(tmp_path / "run", disjoint_units=False)
    assert c.across_tasks == "sequential"
    c.charge(0, GaussianEvent(sigma=2.0))
    c.charge(1, GaussianEvent(sigma=2.0))
    release = c.release(1, b"w", coverage=COVERED, assumptions=ASSUMPTIONS)
    assert release.epsilon == pytest.approx(_gaussian_epsilon(math.sqrt(0.5), 1e-5), rel=1e-9)


def test_charges_are_on_disk_before_training_and_survive_a_crash(tmp_path):
    run = tmp_path / "run"
    c = _certifier(run)
    c.charge(0, GaussianEvent(sigma=2.0))
    c.release(0, b"w0", coverage=COVERED, assumptions=ASSUMPTIONS)
    c.charge(1, GaussianEvent(sigma=1.0))
    assert len(TaskLedger.load(run / "ledger.json").charges) == 2  # written before the task is trained
    del c  # the process dies while training task 1

    resumed = _certifier(run, resume=True)
    assert len(resumed.ledger.charges) == 2 and len(resumed.ledger.releases) == 1
    resumed.charge(1, GaussianEvent(sigma=1.0))  # task 1 is trained again, and charged again (conservative)
    release = resumed.release(1, b"w1", coverage=COVERED, assumptions=ASSUMPTIONS)
    # task 1 composes both attempts: mu = sqrt(2); nothing lost, nothing counted twice
    assert release.epsilon == pytest.approx(_gaussian_epsilon(math.sqrt(2.0), 1e-5), rel=1e-9)
    assert len(resumed.ledger.charges) == 3
    assert _verify_cli(*resumed.certificates).returncode == 0


@pytest.mark.parametrize(
    "change",
    [dict(delta=1e-6), dict(prior_labels=[[0, 1], [2, 3], [4, 6]]), dict(disjoint_units=False),
     dict(label_space="prior_const", prior_labels=[0, 1, 2, 3, 4, 5]), dict(method="other"),
     dict(total_epsilon=5.0), dict(adjacency="replace_one")],
)
def test_resuming_with_other_settings_is_refused(tmp_path, change):
    _certifier(tmp_path / "run").charge(0, GaussianEvent(sigma=2.0))
    with pytest.raises(ConfigError, match="settings"):
        _certifier(tmp_path / "run", resume=True, **change)


def test_a_missing_ledger_next_to_certificates_is_refused(tmp_path):
    c = _certifier(tmp_path / "run")
    c.charge(0, GaussianEvent(sigma=2.0))
    c.release(0, b"w", coverage=COVERED, assumptions=ASSUMPTIONS)
    (tmp_path / "run" / "ledger.json").unlink()
    with pytest.raises(LedgerCorruptError, match="missing"):
        _certifier(tmp_path / "run", resume=True)


def test_the_privacy_filter_refuses_an_overspend_before_anything_is_recorded(tmp_path):
    c = _certifier(tmp_path / "run", across_tasks="sequential", disjoint_units=None, total_epsilon=2.0)
    c.charge(0, GaussianEvent(sigma=3.0))
    c.release(0, b"w0", coverage=COVERED, assumptions=ASSUMPTIONS)
    before = (tmp_path / "run" / "ledger.json").read_bytes()
    with pytest.raises(BudgetExceededError):
        c.charge(1, GaussianEvent(sigma=0.5))
    assert (tmp_path / "run" / "ledger.json").read_bytes() == before
    assert len(c.ledger.charges) == 1
    with pytest.raises(PrivacyViolationError, match="no charged event"):
        c.release(1, b"w1", coverage=COVERED, assumptions=ASSUMPTIONS)
    assert not (tmp_path / "run" / "checkpoints" / "task002.ckpt").exists()


def test_unit_ids_shared_between_tasks_are_refused_under_parallel_composition(tmp_path):
    c = _certifier(tmp_path / "run")
    c.charge(0, GaussianEvent(sigma=2.0), unit_ids=["alice", "bob"])
    with pytest.raises(DisjointnessViolationError, match="bob"):
        c.charge(1, GaussianEvent(sigma=2.0), unit_ids=["carol", "bob"])
    assert len(c.ledger.charges) == 1


def test_invalid_settings_are_refused_with_what_to_change(tmp_path):
    with pytest.raises(LabelSpaceViolationError, match="Prop. 4.6"):
        _certifier(tmp_path / "a", label_space="data")
    with pytest.raises(InvalidParameterError, match="^prior_labels must be a list of per-task label lists"):
        _certifier(tmp_path / "e", prior_labels=[0, 1, 2])
    with pytest.raises(InvalidParameterError, match="disjoint_units"):
        _certifier(tmp_path / "b", disjoint_units=None)
    with pytest.raises(PrivacyViolationError, match="disjoint"):
        _certifier(tmp_path / "c", across_tasks="parallel", disjoint_units=False)
    c = _certifier(tmp_path / "d")
    with pytest.raises(InvalidParameterError, match="outside the stream"):
        c.charge(3, GaussianEvent(sigma=1.0))
    with pytest.raises(InvalidParameterError, match="adjacency"):
        c.charge(0, GaussianEvent(sigma=1.0, adjacency="replace_one"))


def test_release_requires_coverage_assumptions_and_a_public_checkpoint(tmp_path):
    c = _certifier(tmp_path / "run")
    c.charge(0, LaplaceEvent(scale=1.0))
    with pytest.raises(InvalidParameterError, match="ReleaseCoverage"):
        c.release(0, b"w", coverage="covered", assumptions=ASSUMPTIONS)
    with pytest.raises(InvalidParameterError, match="assumption"):
        c.release(0, b"w", coverage=COVERED, assumptions=[])
    c.curator_dir.mkdir()
    (c.curator_dir / "state.bin").write_bytes(b"private")
    with pytest.raises(InvalidParameterError, match="curator"):
        c.release(0, c.curator_dir / "state.bin", coverage=COVERED, assumptions=ASSUMPTIONS)
    assert not c.ledger.releases  # nothing was released by the refused calls
    outside = tmp_path / "model.bin"
    outside.write_bytes(b"weights")
    release = c.release(0, outside, coverage=COVERED, assumptions=ASSUMPTIONS)
    # a file from outside the run directory is released as a copy under checkpoints/ (certificates name files
    # inside their run directory only)
    assert release.checkpoint == c.checkpoints_dir / "model.bin" and release.checkpoint.read_bytes() == b"weights"
    # Laplace profile delta(eps) = 1 - exp((eps - eps0) / 2) for eps < eps0 = sensitivity / scale = 1
    assert release.epsilon == pytest.approx(1.0 + 2.0 * math.log1p(-1e-5), rel=1e-9)
    again = c.release(0, b"again", coverage=COVERED, assumptions=ASSUMPTIONS)  # a second release of task 0
    assert again.certificate.name == "task001.r2.cert.json" and again.checkpoint.name == "task001.ckpt"
    with pytest.raises(InvalidParameterError, match="never overwritten"):
        c.release(0, b"third", coverage=COVERED, assumptions=ASSUMPTIONS, filename="task001.ckpt")
    assert _verify_cli(*c.certificates).returncode == 0


def test_label_filtering_uses_the_public_sets_and_is_stated(tmp_path):
    c = _certifier(tmp_path / "run")
    mask = c.task(1).filter_labels([2, 3, 0, 3, 9])
    assert mask.tolist() == [True, True, False, True, False]
    assert c.labels(1) == (2, 3)
    c.charge(1, GaussianEvent(sigma=1.0))
    cert = json.loads(c.release(1, b"w", coverage=COVERED, assumptions=ASSUMPTIONS).certificate.read_text())
    assert cert["label_space"] == {"policy": "prior", "filtered": [{"task": 1, "kept": 3, "filtered": 2}]}
    assert any("public" in a and "count" in a for a in cert["assumptions"])


def test_dpsgd_steps_beyond_the_charged_plan_are_refused(tmp_path):
    c = _certifier(tmp_path / "run")
    task = c.task(0)
    with pytest.raises(UnchargedStepError, match="plan_dpsgd"):
        task.record_dpsgd_steps(noise_multiplier=1.0, sample_rate=0.1)
    task.plan_dpsgd(noise_multiplier=1.0, sample_rate=0.1, steps=50)
    task.record_dpsgd_steps(noise_multiplier=1.0, sample_rate=0.1, count=30)
    task.record_dpsgd_steps(noise_multiplier=1.5, sample_rate=0.05, count=10)  # dominated: covered
    with pytest.raises(UnchargedStepError, match="exceed"):
        task.record_dpsgd_steps(noise_multiplier=0.9, sample_rate=0.1)  # less noise than charged
    with pytest.raises(UnchargedStepError, match="40 of 50"):
        task.record_dpsgd_steps(noise_multiplier=1.0, sample_rate=0.1, count=11)
    assert task.planned_steps[0].recorded == 40  # refused calls recorded nothing
    release = task.release(b"w", coverage=COVERED, assumptions=ASSUMPTIONS)
    cert = json.loads(release.certificate.read_text())
    assert cert["extra"]["certifier"]["dpsgd_steps"] == {"recorded": 40, "charged": 50}
    assert _verify_cli(release.certificate).returncode == 0


def test_a_checkpoint_that_is_not_covered_gets_a_certificate_that_says_not_private(tmp_path):
    c = _certifier(tmp_path / "run")
    c.charge(0, GaussianEvent(sigma=2.0))
    reason = "the classification head is fit on the clean private labels"
    release = c.release(0, b"w", coverage=ReleaseCoverage.not_covered(reason), assumptions=ASSUMPTIONS)
    assert release.private is False and release.epsilon is None and release.reasons == (reason,)
    cert = json.loads(release.certificate.read_text())
    assert cert["guarantee"]["private"] is False and cert["guarantee"]["epsilon"] is None
    assert cert["guarantee"]["reasons"] == [reason]
    done = subprocess.run([sys.executable, "-m", "dpcl", "verify", "--json", str(release.certificate)],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr  # the statement "not private" is true and checked
    assert "NOT PRIVATE" in _verify_cli(release.certificate).stdout


def test_sign_key_signs_every_certificate_and_verify_checks_the_issuer(tmp_path):
    from dpcl.guarantees.signing import KeyFileError, generate_key_pair

    keys = generate_key_pair(tmp_path / "issuer.key")
    other = generate_key_pair(tmp_path / "other.key")
    with pytest.raises(KeyFileError):  # the key is loaded up front, before anything is charged
        _certifier(tmp_path / "bad", sign_key=tmp_path / "missing.key")
    c = _certifier(tmp_path / "run", sign_key=keys.private_key)
    c.charge(0, GaussianEvent(sigma=2.0))
    release = c.release(0, b"weights", coverage=COVERED, assumptions=ASSUMPTIONS)
    assert release.signed_by == keys.fingerprint
    signed = subprocess.run([sys.executable, "-m", "dpcl", "verify", str(release.certificate),
                             "--public-key", str(keys.public_key)], capture_output=True, text=True, timeout=120)
    assert signed.returncode == 0, signed.stderr
    wrong = subprocess.run([sys.executable, "-m", "dpcl", "verify", str(release.certificate),
                            "--public-key", str(other.public_key)], capture_output=True, text=True, timeout=120)
    assert wrong.returncode == 3 and "signature" in wrong.stderr + wrong.stdout


def test_noise_generators_are_recorded_and_stated(tmp_path):
    """dpcl's noise generators: OS entropy by default (two draws differ), reproducible only when asked, stated."""
    import numpy as np

    certifier = _certifier(tmp_path / "run")
    first = certifier.numpy_noise_generator(0).normal(size=4)
    second = certifier.numpy_noise_generator(0).normal(size=4)
    assert not np.array_equal(first, second)
    same = [certifier.numpy_noise_generator(1, reproducible_seed=7).normal(size=4) for _ in range(2)]
    assert np.array_equal(*same)
    with pytest.raises(InvalidParameterError, match="reproducible_seed"):
        certifier.numpy_noise_generator(1, reproducible_seed=-1)
    assert certifier.noise_sources() == {0: "os_entropy", 1: "reproducible_seed"}
    certifier.charge(0, GaussianEvent(sigma=4.0, sensitivity=1.0))
    certifier.release(0, b"t1", coverage=COVERED, assumptions=["Rows have norm at most 1."])
    certifier.charge(1, GaussianEvent(sigma=4.0, sensitivity=1.0))
    certifier.charge(2, GaussianEvent(sigma=4.0, sensitivity=1.0))
    release = certifier.release(2, b"t3", coverage=COVERED, assumptions=["Rows have norm at most 1."])
    data = json.loads(release.certificate.read_text())
    text = " ".join(data["assumptions"])
    assert "of task 1 was drawn from generators dpcl seeded from OS entropy" in text
    assert "of task 2 was drawn from generators seeded with a seed the caller chose" in text
    assert "dpcl did not draw the noise of task 3" in text
    assert data["extra"]["certifier"]["noise_sources"] == {"1": "os_entropy", "2": "reproducible_seed"}
    assert _verify_cli(release.certificate).returncode == 0


def test_a_directory_that_holds_a_run_is_refused_unless_resume(tmp_path):
    from dpcl.errors import ExistingRunError

    certifier = _certifier(tmp_path / "run")
    certifier.charge(0, GaussianEvent(sigma=4.0, sensitivity=1.0))
    certifier.release(0, b"t1", coverage=COVERED, assumptions=ASSUMPTIONS)
    before = {p: p.read_bytes() for p in (tmp_path / "run").rglob("*") if p.is_file()}
    with pytest.raises(ExistingRunError, match="ledger.json.*certificates/ \\(1 file: task001.cert.json\\)") as refused:
        _certifier(tmp_path / "run")
    assert "resume=True" in str(refused.value) and refused.value.exit_code == 2
    assert {p: p.read_bytes() for p in (tmp_path / "run").rglob("*") if p.is_file()} == before
    resumed = _certifier(tmp_path / "run", resume=True)
    assert resumed.ledger.released_tasks() == [0] and len(resumed.ledger.charges) == 1
    fresh = _certifier(tmp_path / "new", resume=True)  # resume on an empty directory starts a run
    assert fresh.ledger.charges == []


def test_certificates_state_whether_parameters_may_be_chosen_adaptively(tmp_path):
    from dpcl.certifier import FIXED_PARAMETERS_ASSUMPTION

    fixed = _certifier(tmp_path / "fixed")
    fixed.charge(0, GaussianEvent(sigma=4.0, sensitivity=1.0))
    stated = json.loads(fixed.release(0, b"a", coverage=COVERED, assumptions=ASSUMPTIONS).certificate.read_text())
    assert FIXED_PARAMETERS_ASSUMPTION in stated["assumptions"]
    assert not any("Privacy filter" in a for a in stated["assumptions"])

    filtered = _certifier(tmp_path / "filtered", across_tasks="sequential", disjoint_units=None, total_epsilon=2.0)
    filtered.charge(0, GaussianEvent(sigma=4.0, sensitivity=1.0))
    release = filtered.release(0, b"b", coverage=COVERED, assumptions=ASSUMPTIONS)
    stated = json.loads(release.certificate.read_text())["assumptions"]
    assert FIXED_PARAMETERS_ASSUMPTION not in stated
    (sentence,) = [a for a in stated if a.startswith("Privacy filter over the whole stream")]
    assert "total_epsilon = 2" in sentence and "chosen after seeing earlier releases" in sentence
    assert _verify_cli(release.certificate).returncode == 0
