"""The accountant registry: the built-ins keep the Accountant protocol (supports agrees with what compute_epsilon
refuses, delta is an upper bound checked against dp-accounting), the names the config, the CLI and verification
accept come from it, and a package adds an accountant with one object and one registration -- through
register_accountant or an entry point -- that compute_epsilon and a certificate round trip then use."""

from __future__ import annotations

import importlib.metadata
import json
import math
import re
from dataclasses import dataclass

import numpy as np
import pytest
from dp_accounting.pld import privacy_loss_distribution as pld_lib

from dpcl.accounting import ACCOUNTANT_NAMES, Accountant, AccountantBase, Mechanisms, compute_epsilon
from dpcl.accounting.accountants import (
    accountant_names,
    get_accountant,
    register_accountant,
    registry,
    training_accountant_names,
    unregister_accountant,
)
from dpcl.accounting.dpsgd import dpsgd_events
from dpcl.accounting.events import EpsilonDeltaEvent, GaussianEvent, LaplaceEvent, RepeatedEvent
from dpcl.errors import ConfigError, InvalidParameterError, UnsupportedEventError
from dpcl.guarantees.certificates import (
    RELATIVE_TOLERANCE,
    certificate_from_ledger,
    read_certificate,
    verify_certificate,
    write_certificate,
)
from dpcl.guarantees.config import parse_config
from dpcl.guarantees.ledger import TaskLedger
from dpcl.guarantees.method_schema import ReleaseCoverage

DELTA = 1e-5


@dataclass(frozen=True)
class PureLaplace(AccountantBase):
    """A toy accountant: pure-DP Laplace mechanisms composed by summing their epsilons (valid at any delta)."""

    name: str = "pure_laplace"
    tolerance: float = 1e-12
    for_training: bool = False

    def refusal(self, mech: Mechanisms) -> str | None:
        if mech.gauss_mus or mech.sampled or mech.eps_delta:
            return f"pure_laplace composes Laplace mechanisms only; these events are {mech.describe()}."
        return None

    def epsilon_of(self, mech: Mechanisms, delta: float) -> tuple[float, tuple[str, ...]]:
        return math.fsum(eps0 * count for eps0, count in mech.laplace), ("pure_laplace: epsilons add.",)


TOY = PureLaplace()


@pytest.fixture()
def toy():
    register_accountant(TOY)
    yield TOY
    unregister_accountant(TOY.name)


EVENTS = {
    "gaussians": [GaussianEvent(sigma=2.0), GaussianEvent(sigma=3.0, sensitivity=2.0)],
    "one laplace": [LaplaceEvent(scale=2.0)],
    "laplaces": [RepeatedEvent(LaplaceEvent(scale=4.0), 5)],
    "dpsgd": [dpsgd_events(1.1, 0.01, 500)],
    "dpsgd replace-one": [dpsgd_events(1.5, 0.02, 100, adjacency="replace_one")],
    "epsilon-delta": [EpsilonDeltaEvent(epsilon=0.3, delta=1e-7)],
    "nothing applies": [dpsgd_events(1.5, 0.02, 100, adjacency="replace_one"),
                        EpsilonDeltaEvent(epsilon=0.3, delta=1e-7, adjacency="replace_one")],
}


def test_builtins_are_registered_accountants_named_as_before():
    assert set(ACCOUNTANT_NAMES) == {"exact", "basic", "advanced", "rdp", "pld", "prv", "auto"}
    assert set(training_accountant_names()) == {"prv", "pld", "rdp", "auto"}
    for name in ACCOUNTANT_NAMES:
        accountant = get_accountant(name)
        assert isinstance(accountant, Accountant) and accountant.name == name
        assert RELATIVE_TOLERANCE[name] == accountant.tolerance  # verification reads the accountant's own
    assert RELATIVE_TOLERANCE["pld"] == RELATIVE_TOLERANCE["prv"] == 1e-6 and RELATIVE_TOLERANCE["rdp"] == 1e-9


@pytest.mark.parametrize("what", sorted(EVENTS))
@pytest.mark.parametrize("name", ["exact", "basic", "advanced", "rdp", "pld", "prv", "auto"])
def test_supports_says_what_compute_epsilon_refuses(name, what):
    events = EVENTS[what]
    accountant = get_accountant(name)
    if accountant.supports(events):
        result = compute_epsilon(events, DELTA, name)
        assert math.isfinite(result.epsilon) and result.epsilon >= 0
        assert accountant.cost(events) > 0
    else:
        with pytest.raises(UnsupportedEventError):
            compute_epsilon(events, DELTA, name)


def _dpa_pld_delta(events: list[GaussianEvent], epsilon: float, pessimistic: bool) -> float:
    """dp-accounting's PLD delta(epsilon) of the composed Gaussians: pessimistic (above the truth) or optimistic
    (below it)."""
    composed = None
    for event in events:
        step = pld_lib.from_gaussian_mechanism(event.sigma / event.sensitivity, pessimistic_estimate=pessimistic,
                                               value_discretization_interval=1e-4)
        composed = step if composed is None else composed.compose(step)
    return float(composed.get_delta_for_epsilon(epsilon))


@pytest.mark.parametrize("name", ["exact", "rdp", "pld", "basic", "advanced"])
def test_delta_is_an_upper_bound_at_its_epsilon(name):
    events = EVENTS["gaussians"]
    accountant = get_accountant(name)
    epsilon = compute_epsilon(events, DELTA, name).epsilon
    delta = accountant.delta(events, epsilon)
    # the epsilon of that delta is within the asked one: (epsilon, delta) is a valid statement of this accountant
    assert accountant.epsilon(events, delta)[0] <= epsilon * (1 + 1e-9)
    # and it is a bound on the true profile (dp-accounting's optimistic PLD is below it, up to discretisation)
    assert delta >= _dpa_pld_delta(events, epsilon, pessimistic=False) * (1 - 1e-6)
    if name == "exact":  # the true delta: between dp-accounting's optimistic and pessimistic PLDs
        assert delta <= _dpa_pld_delta(events, epsilon, pessimistic=True) * (1 + 1e-6)
        assert delta == pytest.approx(DELTA, rel=1e-6)


def test_a_registered_accountant_is_used_by_compute_epsilon_and_listed(toy):
    events = [RepeatedEvent(LaplaceEvent(scale=4.0), 5), LaplaceEvent(scale=2.0)]
    result = compute_epsilon(events, DELTA, "pure_laplace")
    assert result.accountant == "pure_laplace" and result.epsilon == pytest.approx(5 * 0.25 + 0.5, rel=1e-15)
    assert result.epsilon >= compute_epsilon(events, DELTA, "pld").epsilon  # basic composition is never tighter
    assert "pure_laplace" in accountant_names() and "pure_laplace" not in training_accountant_names()
    assert RELATIVE_TOLERANCE["pure_laplace"] == 1e-12
    with pytest.raises(UnsupportedEventError, match="Laplace mechanisms only"):
        compute_epsilon([GaussianEvent(sigma=1.0)], DELTA, "pure_laplace")
    assert TOY.delta(events, result.epsilon) == 1e-300  # epsilon holds at every delta: the search's floor
    with pytest.raises(InvalidParameterError, match="'pure_laplace' is already registered"):
        register_accountant(PureLaplace(tolerance=1e-9))
    with pytest.raises(InvalidParameterError, match="built-in"):
        register_accountant(PureLaplace(name="pld"))
    with pytest.raises(InvalidParameterError, match="lacks"):
        register_accountant(object())


def test_a_training_accountant_becomes_a_config_choice(toy):
    trainable = PureLaplace(name="pure_laplace_training", for_training=True)
    register_accountant(trainable)
    try:
        assert "pure_laplace_training" in training_accountant_names()
        assert "pure_laplace_training" in registry.TRAINING_CHOICES
        raw = {
            "privacy": {"epsilon": 1.0, "delta": 1e-5, "accountant": "pure_laplace_training"},
            "stream": {"dataset": "digits", "tasks": [[0, 1], [2, 3]], "label_space": "prior",
                       "prior_labels": [[0, 1], [2, 3]], "disjoint_units": True},
            "method": {"name": "peft_ensemble", "epochs": 1, "batch_size": 8, "max_grad_norm": 1.0},
        }
        parse_config(raw)  # accepted
        raw["privacy"]["accountant"] = "pure_laplace"  # registered, but not offered for training
        with pytest.raises(ConfigError, match=r"'prv', 'pld', 'rdp', 'auto', 'pure_laplace_training'; got 'pure_laplace'"):
            parse_config(raw)
    finally:
        unregister_accountant("pure_laplace_training")
    assert "pure_laplace_training" not in registry.TRAINING_CHOICES


def _certify(tmp_path, accountant: str):
    ledger = TaskLedger(delta=DELTA, across_tasks="sequential", accountant=accountant)
    checkpoint = tmp_path / "run" / "checkpoints" / "task0.pt"
    checkpoint.parent.mkdir(parents=True)
    checkpoint.write_bytes(np.random.default_rng(0).bytes(200))
    ledger.charge(0, RepeatedEvent(LaplaceEvent(scale=4.0), 3), label="task 0")
    from dpcl._io.atomic_io import sha256_file

    ledger.release(0, checkpoint_sha256=sha256_file(checkpoint))
    path = tmp_path / "run" / "certificates" / "task0.cert.json"
    coverage = ReleaseCoverage.post_processing("The checkpoint is a post-processing of the noisy releases.")
    write_certificate(path, certificate_from_ledger(ledger, checkpoint=checkpoint, release=coverage,
                                                     label_space="prior_const", method="cosine",
                                                     assumptions=["Labels are public."]))
    return path


def test_a_registered_accountant_certifies_and_verifies_and_an_unknown_one_is_named(toy, tmp_path):
    path = _certify(tmp_path, "pure_laplace")
    guarantee = read_certificate(path)["guarantee"]
    assert guarantee["accountant"] == "pure_laplace" and guarantee["epsilon"] == pytest.approx(0.75, rel=1e-15)
    report = verify_certificate(path)
    assert report.valid, [c for c in report.checks if not c.passed]
    unregister_accountant("pure_laplace")
    try:
        report = verify_certificate(path)
        failed = [c for c in report.checks if not c.passed]
        assert not report.valid and any("'pure_laplace', which is not registered" in c.detail for c in failed)
    finally:
        register_accountant(TOY)


def test_an_accountant_from_an_entry_point_is_found_by_name(monkeypatch):
    entry = importlib.metadata.EntryPoint(name="pure_laplace", value=f"{__name__}:TOY", group="dpcl.accountants")
    real = importlib.metadata.entry_points

    def entry_points(**selection):
        return [entry] if selection.get("group") == "dpcl.accountants" else real(**selection)

    monkeypatch.setattr(importlib.metadata, "entry_points", entry_points)
    registry.refresh()
    try:
        assert compute_epsilon([LaplaceEvent(scale=1.0)], DELTA, "pure_laplace").epsilon == 1.0
        assert "pure_laplace" in accountant_names()
    finally:
        unregister_accountant("pure_laplace")
        registry.refresh()


def test_an_entry_point_whose_name_disagrees_is_refused(monkeypatch):
    entry = importlib.metadata.EntryPoint(name="other", value=f"{__name__}:TOY", group="dpcl.accountants")
    monkeypatch.setattr(importlib.metadata, "entry_points", lambda **selection: [entry])
    registry.refresh()
    try:
        with pytest.raises(InvalidParameterError, match="'pure_laplace'; they must agree"):
            compute_epsilon([LaplaceEvent(scale=1.0)], DELTA, "other")
    finally:
        monkeypatch.undo()
        registry.refresh()


def test_the_memo_is_keyed_on_the_accountant_object(toy):
    events = [LaplaceEvent(scale=2.0)]
    first = compute_epsilon(events, DELTA, "pure_laplace")
    unregister_accountant("pure_laplace")
    register_accountant(PureLaplace(tolerance=1e-9))  # equal name, other parameters: not the memoised result's
    try:
        from dpcl.accounting.accountants import EPSILON_MEMO

        misses = EPSILON_MEMO.misses
        assert compute_epsilon(events, DELTA, "pure_laplace") == first
        assert EPSILON_MEMO.misses == misses + 1
    finally:
        unregister_accountant("pure_laplace")
        register_accountant(TOY)
    assert json.dumps(first.to_dict())  # the result stays plain data


def test_the_docs_example_of_adding_an_accountant_runs(capsys):
    from pathlib import Path

    doc = (Path(__file__).resolve().parents[2] / "docs" / "accounting.md").read_text(encoding="utf-8")
    section = doc.split("### Adding an accountant", 1)[1].split("\n### ", 1)[0]
    (block,) = re.findall(r"```python\n(.*?)```", section, flags=re.S)
    exec(compile(block, "docs/accounting.md", "exec"), {"__name__": __name__})
    assert capsys.readouterr().out.split() == ["pure_laplace", "1.25"]
    assert "pure_laplace" not in accountant_names()
