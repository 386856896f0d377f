"""The Certifier's driver API (what ``dpcl run`` is built on): two-phase releases, scoped statements,
non-private runs, resume semantics. Epsilons are checked against the closed-form Gaussian privacy profile."""

from __future__ import annotations

import hashlib
import json
import math
import os

import pytest
from scipy.optimize import brentq
from scipy.stats import norm

from dpcl import Certifier, ReleaseCoverage
from dpcl.accounting.events import Adjacency, GaussianEvent
from dpcl.errors import ConfigError, InvalidParameterError, LedgerCorruptError, PrivacyViolationError
from dpcl.guarantees.certificates import read_certificate, verify_certificate

COVERED = ReleaseCoverage.post_processing("the weights are the noisy release of the charged Gaussian mechanism")
PRIOR = [[0, 1], [2, 3], [4, 5]]
SCOPE = "the noisy input embeddings only (per token), not the checkpoint"


def _gaussian_epsilon(mu: float, delta: float) -> float:
    """Closed-form Gaussian privacy profile (Balle & Wang 2018, Thm 8), inverted with brentq."""
    def profile(eps: float) -> float:
        return float(norm.cdf(-eps / mu + mu / 2) - math.exp(eps) * norm.cdf(-eps / mu - mu / 2))

    return float(brentq(lambda e: profile(e) - 1e-5, 0.0, 64.0, xtol=1e-14, rtol=1e-14))


def _certifier(run_dir, **overrides) -> Certifier:
    settings = dict(delta=1e-5, label_space="prior", prior_labels=PRIOR, disjoint_units=True, accountant="exact")
    settings.update(overrides)
    return Certifier(run_dir, **settings)


def _pending_checkpoint(run_dir, t: int, payload: bytes):
    final = run_dir / "checkpoints" / f"task{t + 1:03d}.bin"
    pending = final.with_name(final.name + ".pending")
    pending.write_bytes(payload)
    return pending, final, hashlib.sha256(payload).hexdigest()


def test_commit_then_certify_is_a_release_whose_certificate_states_the_committed_checkpoint(tmp_path):
    certifier = _certifier(tmp_path / "run")
    certifier.charge(0, GaussianEvent(sigma=2.0))
    pending, final, sha = _pending_checkpoint(certifier.run_dir, 0, b"weights after task 1")
    record = certifier.commit(0, checkpoint_sha256=sha, curator_sha256="c" * 64)
    assert record.guarantee.epsilon == pytest.approx(_gaussian_epsilon(0.5, 1e-5), rel=1e-6)
    assert certifier.committed_tasks() == [0]
    committed = certifier.committed(0)
    assert (committed.checkpoint_sha256, committed.curator_sha256) == (sha, "c" * 64)
    os.replace(pending, final)
    released = certifier.certify(0, final, coverage=COVERED, assumptions=["Noise from OS entropy."])
    assert released.private and released.epsilon == pytest.approx(record.guarantee.epsilon, rel=1e-12)
    cert = read_certificate(released.certificate)
    assert cert["checkpoint"]["sha256"] == sha
    assert verify_certificate(released.certificate).valid


def test_certify_refuses_a_release_that_was_not_committed_or_a_different_checkpoint(tmp_path):
    certifier = _certifier(tmp_path / "run")
    certifier.charge(0, GaussianEvent(sigma=2.0))
    other = tmp_path / "run" / "checkpoints" / "other.bin"
    other.write_bytes(b"something else")
    with pytest.raises(InvalidParameterError, match="not committed"):
        certifier.certify(0, other, coverage=COVERED, assumptions=["a"])
    certifier.commit(0, checkpoint_sha256=hashlib.sha256(b"weights").hexdigest())
    with pytest.raises(InvalidParameterError, match="does not hash"):
        certifier.certify(0, other, coverage=COVERED, assumptions=["a"])
    with pytest.raises(InvalidParameterError, match="64 lowercase hex"):
        certifier.commit(0, checkpoint_sha256="abc")
    with pytest.raises(PrivacyViolationError, match="no charged event"):
        certifier.commit(1, checkpoint_sha256="0" * 64)


def test_an_uncommitted_charge_is_reused_after_a_crash_and_a_committed_one_never(tmp_path):
    event = GaussianEvent(sigma=2.0)
    first = _certifier(tmp_path / "run")
    first.charge(0, event)
    resumed = _certifier(tmp_path / "run", resume=True)  # the process died before the commit: the charge is on disk
    resumed.charge(0, event, reuse_uncommitted=True)
    assert len(resumed.ledger.charges) == 1
    resumed.commit(0, checkpoint_sha256="0" * 64)
    resumed.charge(0, event, reuse_uncommitted=True)  # committed: a new charge
    assert len(resumed.ledger.charges) == 2
    resumed.charge(0, GaussianEvent(sigma=3.0), reuse_uncommitted=True)  # other events: charged
    assert len(resumed.ledger.charges) == 3


def test_scoped_statements_compose_in_their_own_ledger_and_are_stated_beside_the_headline(tmp_path):
    certifier = _certifier(tmp_path / "run")
    token = GaussianEvent(sigma=1.0, adjacency=Adjacency.REPLACE_ONE, unit="token", sensitivity=2.0)
    for t in (0, 1):
        certifier.charge(t, GaussianEvent(sigma=2.0))
        certifier.charge_scoped("input_embeddings", SCOPE, t, token)
        pending, final, sha = _pending_checkpoint(certifier.run_dir, t, f"weights {t}".encode())
        certifier.commit(t, checkpoint_sha256=sha)
        os.replace(pending, final)
        assert certifier.release_scoped("input_embeddings", t, checkpoint_sha256=sha)
        assert not certifier.release_scoped("input_embeddings", t, checkpoint_sha256=sha)  # idempotent
        released = certifier.certify(t, final, coverage=COVERED, assumptions=["a"], scoped={"input_embeddings": SCOPE})
    cert = read_certificate(released.certificate)
    (scoped,) = cert["scoped_guarantees"]
    assert scoped["name"] == "input_embeddings" and scoped["scope"] == SCOPE and scoped["unit"] == "token"
    # parallel over tasks: the worst task's one Gaussian release at sensitivity 2, sigma 1 (mu = 2)
    assert scoped["epsilon"] == pytest.approx(_gaussian_epsilon(2.0, 1e-5), rel=1e-6)
    assert cert["guarantee"]["epsilon"] == pytest.approx(_gaussian_epsilon(0.5, 1e-5), rel=1e-6)
    assert (certifier.scoped_dir / "input_embeddings.ledger.json").is_file()
    assert verify_certificate(released.certificate).valid
    with pytest.raises(InvalidParameterError, match="letters, digits"):
        certifier.charge_scoped("../escape", SCOPE, 2, token)


def test_a_non_private_certifier_keeps_no_headline_ledger_and_states_scoped_statements(tmp_path):
    run_dir = tmp_path / "run"
    certifier = _certifier(run_dir, private=False, adjacency="replace_one", unit="token")
    with pytest.raises(InvalidParameterError, match="private=False"):
        certifier.charge(0, GaussianEvent(sigma=2.0, adjacency=Adjacency.REPLACE_ONE, unit="token"))
    certifier.charge_scoped("input_embeddings", SCOPE, 0,
                            GaussianEvent(sigma=1.0, adjacency=Adjacency.REPLACE_ONE, unit="token", sensitivity=2.0))
    checkpoint = run_dir / "checkpoints" / "task001.bin"
    checkpoint.write_bytes(b"clean weights")
    assert certifier.commit(0, checkpoint_sha256=hashlib.sha256(b"clean weights").hexdigest()) is None
    certifier.release_scoped("input_embeddings", 0)
    with pytest.raises(InvalidParameterError, match="not covered"):
        certifier.certify(0, checkpoint, coverage=COVERED, assumptions=["a"])
    reason = "The weights were fit on the clean private targets."
    released = certifier.certify(0, checkpoint, coverage=ReleaseCoverage.not_covered(reason), assumptions=["a"],
                                 scoped={"input_embeddings": SCOPE})
    assert not released.private and released.epsilon is None
    cert = read_certificate(released.certificate)
    assert cert["guarantee"]["private"] is False and cert["guarantee"]["reasons"] == [reason]
    assert [s["name"] for s in cert["scoped_guarantees"]] == ["input_embeddings"]
    assert not (run_dir / "ledger.json").exists()
    report = verify_certificate(released.certificate)
    assert report.valid and not report.private


def test_a_driver_s_run_state_and_its_resume_checks(tmp_path):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "run.json").write_text(json.dumps({"format": "dpcl-run"}))
    with pytest.raises(ConfigError, match="dpcl run"):
        _certifier(run_dir)
    certifier = _certifier(run_dir, driver="dpcl run", config={"privacy": {"delta": 1e-5}}, metadata={"seed": 3})
    assert certifier.ledger.metadata["seed"] == 3
    certifier.charge(0, GaussianEvent(sigma=2.0))
    certifier.commit(0, checkpoint_sha256="0" * 64)
    certifier.require_released([0])
    with pytest.raises(LedgerCorruptError, match="task\\(s\\) 2"):
        certifier.require_released([0, 1], listed_by="run.json")
    with pytest.raises(LedgerCorruptError, match="missing"):
        _certifier(tmp_path / "elsewhere", expect_ledger=True)
    with pytest.raises(InvalidParameterError, match="private must be"):
        _certifier(tmp_path / "x", private="no")
    with pytest.raises(InvalidParameterError, match="driver must be"):
        _certifier(tmp_path / "x", driver=" ")


def test_an_empty_task_s_release_is_committed_only_when_declared_and_covered_by_earlier_charges(tmp_path):
    certifier = _certifier(tmp_path / "run")
    with pytest.raises(PrivacyViolationError, match="no charged event"):
        certifier.commit(0, checkpoint_sha256="0" * 64, empty_task=True)  # nothing charged at all
    certifier.charge(0, GaussianEvent(sigma=2.0))
    certifier.commit(0, checkpoint_sha256="0" * 64)
    with pytest.raises(PrivacyViolationError, match="no charged event"):
        certifier.commit(1, checkpoint_sha256="1" * 64)
    record = certifier.commit(1, checkpoint_sha256="1" * 64, empty_task=True)  # Prop. F.1: the previous release
    assert record.guarantee.epsilon == pytest.approx(_gaussian_epsilon(0.5, 1e-5), rel=1e-6)
