"""dpcl.integrations.opacus: opacus' own PrivacyEngine with the dpcl accountant, certified by a Certifier."""

from __future__ import annotations

import io
import json
import subprocess
import sys
import warnings

import pytest
import torch
from opacus import PrivacyEngine
from opacus.accountants import PRVAccountant, RDPAccountant, create_accountant
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import dpcl.integrations.opacus as dpcl_opacus
from dpcl import Certifier, ReleaseCoverage
from dpcl.accounting.dpsgd import dpsgd_noise_multiplier
from dpcl.certifier import UnchargedStepError
from dpcl.errors import InvalidParameterError
from dpcl.guarantees.ledger import TaskLedger

pytestmark = pytest.mark.torch

DELTA = 1e-5
COVERED = ReleaseCoverage.post_processing("the weights are updated only by the charged DP-SGD steps")
ASSUMPTIONS = ["DP-SGD noise and Poisson sampling come from torch's default generator, never seeded by the test."]
DPCL = [sys.executable, "-m", "dpcl"]


@pytest.fixture(autouse=True)
def _quiet_opacus():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # secure-RNG advice and opacus' own deprecation notices
        yield


def _loader(task: int, n: int = 64, batch: int = 16) -> DataLoader:
    generator = torch.Generator().manual_seed(task)
    x = torch.randn(n, 4, generator=generator)
    y = torch.randint(2 * task, 2 * task + 2, (n,), generator=generator)
    return DataLoader(TensorDataset(x, y), batch_size=batch)


def _train(model, optimizer, loader, epochs: int) -> None:
    for _ in range(epochs):
        for x, y in loader:
            optimizer.zero_grad()
            nn.functional.cross_entropy(model(x), y).backward()
            optimizer.step()


def _checkpoint(model: nn.Module) -> bytes:
    buffer = io.BytesIO()
    torch.save(model.state_dict(), buffer)
    return buffer.getvalue()


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([*DPCL, *args], capture_output=True, text=True, timeout=120)


def _one_task_stream(tmp_path) -> tuple[Certifier, PrivacyEngine, nn.Module]:
    """A Certifier of a one-task stream (public labels 0 and 1), opacus' engine with the dpcl accountant, a model."""
    certifier = Certifier(tmp_path / "run", delta=DELTA, label_space="prior_const", prior_labels=[0, 1],
                          across_tasks="sequential")
    return certifier, PrivacyEngine(accountant="dpcl"), nn.Linear(4, 2)


def _make_private(engine: PrivacyEngine, model: nn.Module, **options):
    """``engine.make_private`` of ``model`` with SGD on task 0's loader, noise multiplier 1 and clipping norm 1."""
    return engine.make_private(module=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.1),
                               data_loader=_loader(0), noise_multiplier=1.0, max_grad_norm=1.0, **options)


def test_the_dpcl_accountant_is_registered_with_opacus():
    assert isinstance(create_accountant("dpcl"), dpcl_opacus.DpclAccountant)
    engine = PrivacyEngine(accountant="dpcl")
    assert isinstance(engine.accountant, dpcl_opacus.DpclAccountant) and engine.accountant.mechanism() == "dpcl"
    import importlib

    importlib.reload(dpcl_opacus)  # importing again keeps one registration and one wrapper
    assert type(create_accountant("dpcl")).__module__ == "dpcl.integrations.opacus"


def test_two_tasks_with_opacus_are_certified_and_match_dpcl_epsilon_dpsgd(tmp_path):
    certifier = Certifier(tmp_path / "run", delta=DELTA, label_space="prior", prior_labels=[[0, 1], [2, 3]],
                          disjoint_units=True, method="opacus DP-SGD, linear model")
    torch.manual_seed(0)
    model = nn.Linear(4, 4)
    schedules = []
    for task in range(2):
        engine = PrivacyEngine(accountant="dpcl")
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        private, optimizer, loader = engine.make_private(
            module=model, optimizer=optimizer, data_loader=_loader(task), noise_multiplier=1.0 + task,
            max_grad_norm=1.0,
        )
        charge = dpcl_opacus.attach(engine, certifier.task(task), optimizer=optimizer, data_loader=loader, epochs=2)
        # the whole schedule is on disk before the first step, as one compressed event
        on_disk = TaskLedger.load(tmp_path / "run" / "ledger.json").charges[-1]
        assert on_disk == charge and len(on_disk.events) == 1 and on_disk.events[0].count == 8
        _train(private, optimizer, loader, epochs=2)
        model = private.to_standard_module()
        assert engine.accountant.history == [(1.0 + task, 0.25, 8)]  # 8 steps, one compressed entry
        release = certifier.release(task, _checkpoint(model), coverage=COVERED, assumptions=ASSUMPTIONS,
                                    filename=f"task{task + 1:03d}.pt")
        reference = json.loads(_cli("epsilon", "dpsgd", "--noise-multiplier", str(1.0 + task), "--sample-rate",
                                    "0.25", "--steps", "8", "--delta", str(DELTA), "--json").stdout)
        assert engine.get_epsilon(DELTA) == pytest.approx(reference["epsilon"], rel=1e-9)
        schedules.append(reference["epsilon"])
        # parallel composition over disjoint tasks: the stream costs its worst task so far
        assert release.epsilon == pytest.approx(max(schedules), rel=1e-6)
        cert = json.loads(release.certificate.read_text())
        assert cert["extra"]["certifier"]["dpsgd_steps"] == {"recorded": 8, "charged": 8}
    done = _cli("verify", *map(str, certifier.certificates))
    assert done.returncode == 0, done.stdout + done.stderr


def test_dpcl_epsilon_is_tighter_than_opacus_rdp_and_close_to_opacus_prv():
    accountant = dpcl_opacus.DpclAccountant()
    for _ in range(200):
        accountant.step(noise_multiplier=1.1, sample_rate=0.02)
    accountant.step(noise_multiplier=2.0, sample_rate=0.02)
    assert accountant.history == [(1.1, 0.02, 200), (2.0, 0.02, 1)] and len(accountant) == 201
    rdp, prv = RDPAccountant(), PRVAccountant()
    rdp.history = prv.history = [(1.1, 0.02, 200), (2.0, 0.02, 1)]
    ours = accountant.get_epsilon(DELTA)
    assert ours <= rdp.get_epsilon(DELTA)
    assert ours == pytest.approx(prv.get_epsilon(DELTA), rel=0.03)
    state = accountant.state_dict()
    again = dpcl_opacus.DpclAccountant()
    again.load_state_dict(state)
    assert again.history == accountant.history and again.get_epsilon(DELTA) == ours


def test_make_private_with_epsilon_calibrates_through_dpcl(tmp_path, monkeypatch):
    calls = []

    def spy(*args, **kwargs):
        calls.append((args, kwargs))
        result = dpsgd_noise_multiplier(*args, **kwargs)
        calls.append(result)
        return result

    monkeypatch.setattr(dpcl_opacus, "dpsgd_noise_multiplier", spy)
    monkeypatch.setattr(dpcl_opacus, "_CALIBRATIONS", {})
    certifier, engine, model = _one_task_stream(tmp_path)
    private, optimizer, loader = engine.make_private_with_epsilon(
        module=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.1), data_loader=_loader(0),
        target_epsilon=2.0, target_delta=DELTA, epochs=2, max_grad_norm=1.0,
    )
    assert calls[0] == ((2.0, DELTA, 0.25, 8), {"accountant": "auto"})  # 2 epochs of 4 batches
    expected = calls[1]
    assert optimizer.noise_multiplier == expected.noise_multiplier
    dpcl_opacus.attach(engine, certifier.task(0), optimizer=optimizer, data_loader=loader, epochs=2)
    _train(private, optimizer, loader, epochs=2)
    assert engine.get_epsilon(DELTA) == pytest.approx(expected.epsilon, rel=1e-9) and expected.epsilon <= 2.0
    # other mechanisms still calibrate with opacus' own function
    from opacus.accountants.utils import get_noise_multiplier

    assert get_noise_multiplier.__wrapped__(target_epsilon=2.0, target_delta=DELTA, sample_rate=0.25, epochs=2,
                                            accountant="rdp") == get_noise_multiplier(
        target_epsilon=2.0, target_delta=DELTA, sample_rate=0.25, epochs=2, accountant="rdp")


def test_a_step_beyond_the_charged_schedule_is_refused_before_the_update(tmp_path):
    certifier, engine, model = _one_task_stream(tmp_path)
    private, optimizer, loader = _make_private(engine, model)
    dpcl_opacus.attach(engine, certifier.task(0), optimizer=optimizer, data_loader=loader, steps=3)
    batches = iter(loader)
    for _ in range(3):
        x, y = next(batches)
        optimizer.zero_grad()
        nn.functional.cross_entropy(private(x), y).backward()
        optimizer.step()
    before = [p.detach().clone() for p in model.parameters()]
    x, y = next(batches)
    optimizer.zero_grad()
    nn.functional.cross_entropy(private(x), y).backward()
    with pytest.raises(UnchargedStepError, match="3 of 3"):
        optimizer.step()
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters()))  # the refused step changed nothing
    assert len(engine.accountant) == 3
    release = certifier.release(0, _checkpoint(model), coverage=COVERED, assumptions=ASSUMPTIONS)
    assert _cli("verify", str(release.certificate)).returncode == 0


def test_steps_taken_before_attaching_are_refused(tmp_path):
    certifier, engine, model = _one_task_stream(tmp_path)
    private, optimizer, loader = _make_private(engine, model)
    _train(private, optimizer, loader, epochs=1)
    with pytest.raises(UnchargedStepError, match="before the accountant was attached"):
        dpcl_opacus.attach(engine, certifier.task(0), optimizer=optimizer, data_loader=loader, epochs=1)
    assert not certifier.ledger.charges
    with pytest.raises(Exception, match="dpcl accountant"):
        dpcl_opacus.attach(PrivacyEngine(accountant="rdp"), certifier.task(0), optimizer=optimizer,
                           data_loader=loader, epochs=1)


def test_attach_refuses_a_loader_without_poisson_sampling(tmp_path):
    certifier, engine, model = _one_task_stream(tmp_path)
    _, optimizer, loader = _make_private(engine, model, poisson_sampling=False)
    with pytest.raises(InvalidParameterError, match="Poisson"):
        dpcl_opacus.attach(engine, certifier.task(0), optimizer=optimizer, data_loader=loader, epochs=1)
    assert not certifier.ledger.charges


def test_attach_gives_opacus_dpcl_noise_whatever_the_seed(tmp_path):
    """attach replaces the generators torch.manual_seed (or make_private's noise_generator) fixed; only
    reproducible_seed makes two runs equal, and the certificate states which source was used."""
    def run(name: str, **attach_options) -> tuple[bytes, dict]:
        torch.manual_seed(0)
        certifier = Certifier(tmp_path / name, delta=DELTA, label_space="prior_const", prior_labels=[0, 1],
                              across_tasks="sequential")
        engine, model = PrivacyEngine(accountant="dpcl"), nn.Linear(4, 2)
        private, optimizer, loader = _make_private(engine, model, noise_generator=torch.Generator().manual_seed(1))
        dpcl_opacus.attach(engine, certifier.task(0), optimizer=optimizer, data_loader=loader, epochs=2,
                           **attach_options)
        assert optimizer.generator is not None and loader.batch_sampler.generator is not None
        _train(private, optimizer, loader, 2)
        release = certifier.release(0, _checkpoint(private.to_standard_module()), coverage=COVERED,
                                    assumptions=["The 64 examples are the only private data."])
        return release.checkpoint.read_bytes(), json.loads(release.certificate.read_text())

    (a, cert_a), (b, _) = run("a"), run("b")
    assert a != b and cert_a["extra"]["certifier"]["noise_sources"] == {"1": "os_entropy"}
    (c, cert_c), (d, _) = run("c", reproducible_seed=5), run("d", reproducible_seed=5)
    assert c == d and cert_c["extra"]["certifier"]["noise_sources"] == {"1": "reproducible_seed"}
    assert any("does not know that seed" in s for s in cert_c["assumptions"])
