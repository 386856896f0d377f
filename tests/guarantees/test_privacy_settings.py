"""PrivacySettings: parsed once from [privacy] and the label-space keys, taken by the Certifier, the specs and the
audit; and `dpcl audit` is a dry run of the Certifier that charges the same events as `dpcl run`."""

from __future__ import annotations

import ast
import dataclasses
import json
from pathlib import Path
from types import SimpleNamespace

import pytest

import dpcl
from dpcl.certifier import Certifier
from dpcl.errors import ConfigError, InvalidParameterError, PrivacyViolationError
from dpcl.audit_config import audit_config
from dpcl.guarantees.config import load_config, parse_config
from dpcl.guarantees.ledger import TaskLedger
from dpcl.guarantees.method_schema import ReleaseCoverage
from dpcl.guarantees.settings import PRIVACY_KEYS, PrivacySettings, privacy_settings

PACKAGE = Path(dpcl.__file__).parent
CONFIGS = sorted((PACKAGE / "configs").glob("*.toml"))
#: The parser: the only modules that may read [privacy] keys (and the label-space keys of [stream]) by name.
PARSER = {"guarantees/settings.py", "guarantees/config.py"}
LABEL_SPACE_KEYS = {"label_space", "prior_labels", "disjoint_units"}

COSINE = {
    "privacy": {"epsilon": 1.0, "delta": 1e-5, "total_epsilon": 3.0},
    "stream": {"dataset": "digits", "tasks": [[0, 1], [2, 3]], "task_sizes": [40, 40], "label_space": "prior",
               "prior_labels": [[0, 1], [2, 3]], "disjoint_units": True},
    "method": {"name": "cosine"},
}


def _string_key_reads(tree: ast.AST) -> list[tuple[int, str, str]]:
    """``privacy[KEY]``, ``privacy.get(KEY)``, ``KEY in privacy`` (and ``stream[...]`` of the label-space keys),
    whatever expression ends in ``privacy`` / ``stream``."""
    found = []
    for node in ast.walk(tree):
        target = key = None
        if isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Constant):
            target, key = node.value, node.slice.value
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.args
              and node.func.attr in ("get", "pop", "setdefault") and isinstance(node.args[0], ast.Constant)):
            target, key = node.func.value, node.args[0].value
        elif (isinstance(node, ast.Compare) and isinstance(node.left, ast.Constant) and len(node.ops) == 1
              and isinstance(node.ops[0], (ast.In, ast.NotIn))):
            target, key = node.comparators[0], node.left.value
        if target is None or not isinstance(key, str):
            continue
        name = ast.unparse(target).split(".")[-1]
        if (name == "privacy" and key in {*PRIVACY_KEYS, "unit"}) or (name == "stream" and key in LABEL_SPACE_KEYS):
            found.append((node.lineno, ast.unparse(target), key))
    return found


def test_no_module_outside_the_parser_reads_privacy_keys_by_string():
    reads = []
    for path in sorted(PACKAGE.rglob("*.py")):
        relative = path.relative_to(PACKAGE).as_posix()
        if relative in PARSER:
            continue
        reads += [f"dpcl/{relative}:{line} {target}[{key!r}]"
                  for line, target, key in _string_key_reads(ast.parse(path.read_text()))]
    assert not reads, "read them from PrivacySettings instead:\n" + "\n".join(reads)


def test_the_scan_finds_string_reads():
    code = 'a = config.privacy["delta"]\nb = privacy.get("accountant", "auto")\nc = "epsilon" in privacy\n' \
           'd = run.config.stream["disjoint_units"]\ne = result["privacy"]\nf = stream["dataset"]\n'
    assert [key for _, _, key in _string_key_reads(ast.parse(code))] == [
        "delta", "accountant", "epsilon", "disjoint_units"]


def test_settings_are_parsed_once_frozen_and_complete():
    config = parse_config(COSINE)
    settings = config.settings
    assert isinstance(settings, PrivacySettings)
    assert (settings.epsilon, settings.delta, settings.adjacency, settings.accountant, settings.across_tasks) == (
        1.0, 1e-5, "add_remove", "auto", "auto")
    assert (settings.total_epsilon, settings.total_delta) == (3.0, None)
    assert (settings.label_space, settings.prior_labels, settings.disjoint_units) == (
        "prior", [[0, 1], [2, 3]], True)
    assert settings.unit == "example"
    with pytest.raises(dataclasses.FrozenInstanceError):
        settings.delta = 0.5  # type: ignore[misc]
    # the certificate's config section of a run is the config as read
    assert settings.to_dict() == config.to_dict()
    assert settings.replace(adjacency="replace_one").to_dict() == config.to_dict()


@pytest.mark.parametrize(("section", "message"), [
    ({"epsilon": 1.0, "delta": 2.0}, r"\[privacy\] delta must lie in \(0, 1\)"),
    ({"epsilon": 1.0, "delta": 1e-5, "accountant": "best"}, r"\[privacy\] accountant must be one of"),
    ({"epsilon": 1.0, "delta": 1e-5, "total_delta": 1e-6}, r"total_delta is only allowed together"),
    ({"epsilon": 1.0, "delta": 1e-5, "epsilon_total": 2.0}, r"unknown \[privacy\] key\(s\) epsilon_total"),
    ({"epsilon": 1.0, "delta": 1e-5, "unit": ""}, r"\[privacy\] unit must be a non-empty name"),
])
def test_a_privacy_mapping_is_validated_by_the_same_parser(section, message):
    with pytest.raises(ConfigError, match=message):
        privacy_settings(section)
    if "unit" not in section:
        with pytest.raises(ConfigError, match=message):
            parse_config({**COSINE, "privacy": section})


def test_direct_construction_is_validated():
    with pytest.raises(InvalidParameterError, match="across_tasks must be one of"):
        PrivacySettings(delta=1e-5, across_tasks="both")
    with pytest.raises(InvalidParameterError, match="adjacency must be one of"):
        PrivacySettings(delta=1e-5, adjacency="swap")
    with pytest.raises(InvalidParameterError, match="total_delta is only meaningful together with total_epsilon"):
        PrivacySettings(delta=1e-5, total_delta=1e-6)
    with pytest.raises(InvalidParameterError, match="delta"):
        PrivacySettings(delta=1.5)


def _certify_one(run_dir: Path, **arguments) -> dict:
    certifier = Certifier(run_dir, method="mine", **arguments)
    from dpcl.accounting.events import GaussianEvent

    certifier.charge(0, GaussianEvent(sigma=4.0, sensitivity=1.0))
    released = certifier.release(0, b"weights", coverage=ReleaseCoverage.post_processing("noisy sums"),
                                 assumptions=["public features"])
    return json.loads(released.certificate.read_text())


def test_certifier_takes_settings_or_the_same_keywords(tmp_path):
    keywords = dict(delta=1e-5, label_space="prior_const", prior_labels=[0, 1, 2], disjoint_units=True,
                    total_epsilon=4.0, accountant="rdp", task_sizes=[10])
    by_keywords = _certify_one(tmp_path / "a", **keywords)
    by_settings = _certify_one(tmp_path / "b", settings=PrivacySettings(**keywords))
    assert by_settings["config"] == by_keywords["config"]
    assert by_keywords["config"]["privacy"] == {"delta": 1e-5, "adjacency": "add_remove", "accountant": "rdp",
                                                "across_tasks": "auto", "total_epsilon": 4.0, "total_delta": 1e-5}
    assert by_settings["guarantee"] == by_keywords["guarantee"]
    with pytest.raises(InvalidParameterError, match="not both"):
        Certifier(tmp_path / "c", settings=PrivacySettings(**keywords), delta=1e-6)
    with pytest.raises(InvalidParameterError, match="delta is required"):
        Certifier(tmp_path / "d", label_space="prior_const", prior_labels=[0])


def test_a_dry_run_writes_nothing_and_releases_nothing(tmp_path, monkeypatch):
    from dpcl.accounting.events import GaussianEvent

    monkeypatch.chdir(tmp_path)
    dry = Certifier.dry_run(PrivacySettings(delta=1e-5, label_space="prior_const", prior_labels=[0, 1],
                                            disjoint_units=True, total_epsilon=1.5), method="mine")
    assert dry.is_dry_run and dry.ledger.path is None
    dry.charge(0, GaussianEvent(sigma=4.0, sensitivity=1.0))
    record = dry.commit(0, checkpoint_sha256=None)
    assert record.guarantee.epsilon == pytest.approx(dry.task_epsilon(0))
    with pytest.raises(Exception, match="privacy filter|exceed|budget"):
        dry.charge(0, GaussianEvent(sigma=0.5, sensitivity=1.0))  # the same filter as a run's
    with pytest.raises(InvalidParameterError, match="dry run"):
        dry.release(0, b"weights", coverage=ReleaseCoverage.post_processing("x"), assumptions=["y"])
    assert list(tmp_path.iterdir()) == []


# -- the audit is a dry run of the Certifier: the same events as dpcl run, for every bundled config ---------------
def _run_charges(config, report, sizes: list[int], run_dir: Path) -> Certifier:
    """Charge every task as `dpcl run` does (the runner's plan, charge and commit stages on a Certifier opened as
    `open_certifier` opens it), without training."""
    from dpcl.runner.run import charge_task, open_certifier
    from dpcl.runner.tasks import task_plan, trains_plan

    loaded = SimpleNamespace(out=run_dir, config=config, method_name=config.method["name"], sign_key=None,
                             private=config.private, seed=0, reproducible=False, resume=False)
    certifier = open_certifier(loaded, report, resume=False)
    run = SimpleNamespace(loaded=loaded, certifier=certifier)
    reuses = config.spec.reuses_past_tasks
    for t in range(len(sizes)):
        tasks_read = list(range(t + 1)) if reuses else [t]
        plan = task_plan(config, t, sum(sizes[i] for i in tasks_read),
                         trains_plan=trains_plan(config.private, report.covered))
        charge_task(run, t, plan, SimpleNamespace(unit_ids=None), tasks_read)
        if config.private:
            certifier.commit(t, checkpoint_sha256="0" * 64, empty_task=not plan.events)
        for scoped in plan.scoped:
            certifier.release_scoped(scoped.name, t)
    return certifier


def _charges(ledger: TaskLedger) -> list[tuple]:
    return [(c.tasks, c.events, c.label) for c in ledger.charges]


@pytest.mark.parametrize("path", CONFIGS, ids=[p.stem for p in CONFIGS])
def test_audit_and_run_charge_the_same_events(path, tmp_path):
    from dpcl.cli.audit import stream_task_sizes
    from dpcl.data import STREAM_KEYS

    config = load_config(path, data_stream_keys=STREAM_KEYS)
    sizes, reports, _ = stream_task_sizes(config)
    report = audit_config(config, sizes, filter_reports=reports)
    if not report.sound:  # dpcl run refuses it before charging anything (stage "audit")
        assert report.exit_code == PrivacyViolationError.exit_code
        return
    audited = report.dry_run
    assert audited.is_dry_run
    run = _run_charges(config, report, sizes, tmp_path / "run")
    assert _charges(TaskLedger.load(run.ledger_path)) == _charges(audited.ledger) != []
    assert [r.guarantee.epsilon for r in run.ledger.releases] == [r.guarantee.epsilon
                                                                  for r in audited.ledger.releases]
    assert report.epsilon == run.guarantee().epsilon
    scoped_run, scoped_audit = run.scoped_statements(), audited.scoped_statements()
    assert list(scoped_run) == list(scoped_audit) == [g["name"] for g in report.scoped_guarantees]
    for name, (scope, ledger) in scoped_audit.items():
        assert scoped_run[name][0] == scope
        assert _charges(TaskLedger.load(run.scoped_dir / f"{name}.ledger.json")) == _charges(ledger)
