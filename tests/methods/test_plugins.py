"""Method plugins: the example package of docs/plugins.md, installed as a user would, through dpcl's CLI.

The fixture package (tests/fixtures/dpcl-example-method) is installed with pip
into a temporary target directory of this test process (``--no-build-isolation
--no-deps --no-index``: offline, the shared venv is never modified; each
pytest-xdist worker builds its own copy), and the CLI runs in a subprocess
with that directory on PYTHONPATH: entry points are found through the
dist-info on sys.path. Registry errors (a plugin reusing a built-in name, two
plugins with one name, malformed specs) use hand-written dist-info directories.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from dpcl.errors import ConfigError, IncompleteInstallError, MethodPluginError
from dpcl.guarantees.method_registry import REGISTRY, MethodRegistry, RegistryView

#: The built-in methods, as dpcl's own entry points register them.
BUILTIN_METHODS = REGISTRY.builtin_names()

ROOT = Path(__file__).resolve().parents[2]
FIXTURE = ROOT / "tests" / "fixtures" / "dpcl-example-method"
CONFIG = """
[privacy]
epsilon = 1.0
delta = 1e-5
accountant = "auto"

[stream]
dataset = "digits"
tasks = [[0, 1], [2, 3], [4, 5]]
label_space = "prior_const"
prior_labels = [0, 1, 2, 3, 4, 5]
disjoint_units = true

[method]
name = "noisy_centroid"
clip_norm = 2.0
"""


@pytest.fixture(scope="session")
def plugin_path(tmp_path_factory) -> Path:
    """The example plugin installed (not editable) into a fresh target directory."""
    work = tmp_path_factory.mktemp("plugin")
    source = work / "src"
    shutil.copytree(FIXTURE, source, ignore=shutil.ignore_patterns("build", "*.egg-info", "__pycache__"))
    target = work / "site"
    done = subprocess.run(
        [sys.executable, "-m", "pip", "install", "--quiet", "--no-build-isolation", "--no-deps", "--no-index",
         "--target", str(target), str(source)],
        capture_output=True, text=True, timeout=300,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return target


def dpcl_with(path: Path | None, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    if path is not None:
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(path), env.get("PYTHONPATH", "")) if p)
    return subprocess.run([sys.executable, "-m", "dpcl", *args], capture_output=True, text=True, env=env,
                          timeout=600)


def test_methods_lists_builtins_and_the_installed_plugin_with_its_keys(plugin_path):
    done = dpcl_with(plugin_path, "methods", "--json")
    assert done.returncode == 0, done.stderr
    methods = {m["name"]: m for m in json.loads(done.stdout)["methods"]}
    assert list(methods)[: len(BUILTIN_METHODS)] == list(BUILTIN_METHODS)
    plugin = methods["noisy_centroid"]
    assert plugin["source"] == "plugin" and plugin["distribution"] == "dpcl-example-method"
    assert plugin["method_class"] == "dpcl_example_method.method:NoisyCentroid"
    assert plugin["keys"] == [{"name": "clip_norm", "type": "float", "required": False, "default": 1.0,
                               "help": "l2 norm each feature vector is clipped to before it joins its class sum"}]
    assert methods["peft_ensemble"]["source"] == "built-in"
    assert {"name": "epochs", "type": "int", "required": True, "default": None} .items() <= \
        next(k for k in methods["peft_ensemble"]["keys"] if k["name"] == "epochs").items()
    table = dpcl_with(plugin_path, "methods")
    assert table.returncode == 0 and "noisy_centroid (plugin dpcl-example-method 0.1.0" in table.stdout


def test_methods_and_audit_never_import_torch_or_the_plugin_class(plugin_path, tmp_path):
    config = tmp_path / "plugin.toml"
    config.write_text(CONFIG, encoding="utf-8")
    code = (
        "import sys; from dpcl.cli import main\n"
        f"assert main(['methods', '--json']) == 0\n"
        f"assert main(['audit', {str(config)!r}, '--json']) == 0\n"
        "bad = [m for m in ('torch', 'dpcl_example_method.method') if m in sys.modules]\n"
        "assert not bad, bad\n"
    )
    env = {**os.environ, "PYTHONPATH": str(plugin_path)}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stderr


def test_the_plugin_is_audited_trained_and_certified_like_a_builtin(plugin_path, tmp_path):
    pytest.importorskip("torch")  # dpcl run writes checkpoints with torch.save
    config = tmp_path / "plugin.toml"
    config.write_text(CONFIG, encoding="utf-8")
    audit = dpcl_with(plugin_path, "audit", str(config), "--json")
    assert audit.returncode == 0, audit.stderr
    report = json.loads(audit.stdout)
    assert report["sound"] and report["method"] == "noisy_centroid" and report["across_tasks"] == "parallel"
    assert report["epsilon"] == pytest.approx(1.0, rel=1e-6) and report["epsilon"] <= 1.0
    assert report["per_task"][0]["noise"]["clip_norm"] == 2.0
    run = dpcl_with(plugin_path, "run", str(config), "--out", str(tmp_path / "run"), "--json", "--quiet")
    assert run.returncode == 0, run.stderr
    payload = json.loads(run.stdout)
    assert payload["complete"] and len(payload["releases"]) == 3 and payload["average_accuracy"] > 0.5
    certificates = sorted(str(p) for p in (tmp_path / "run" / "certificates").glob("*.json"))
    verify = dpcl_with(plugin_path, "verify", "--cross-check", "--json", *certificates)
    assert verify.returncode == 0, verify.stdout + verify.stderr
    last = json.loads(verify.stdout)["certificates"][-1]
    assert last["valid"] and last["cross_check"]["passed"]
    certificate = json.loads(Path(certificates[-1]).read_text())
    assert certificate["release"]["method"] == "noisy_centroid"
    # a certificate carries its events: it verifies where the plugin is not installed
    assert dpcl_with(None, "verify", certificates[-1]).returncode == 0
    # without the plugin on the path the method is unknown: exit 2 naming the known methods
    missing = dpcl_with(None, "audit", str(config))
    assert missing.returncode == 2 and "noisy_centroid" in missing.stderr and "cosine" in missing.stderr


# -- registry errors, with hand-written dist-info directories ------------------------------------------------
def fake_distribution(root: Path, name: str, entry_points: dict[str, str], modules: dict[str, str] | None = None) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    info = root / f"{name.replace('-', '_')}-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: 1.0\n", encoding="utf-8")
    lines = "".join(f"{k} = {v}\n" for k, v in entry_points.items())
    (info / "entry_points.txt").write_text(f"[dpcl.methods]\n{lines}", encoding="utf-8")
    for module, text in (modules or {}).items():
        (root / f"{module}.py").write_text(textwrap.dedent(text), encoding="utf-8")
    return root


def test_a_plugin_cannot_shadow_a_builtin(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(fake_distribution(tmp_path / "a", "evil-cosine", {"cosine": "evil:SPEC"})))
    registry = MethodRegistry()
    with pytest.raises(MethodPluginError, match="'evil-cosine' registers a method named 'cosine'.*cannot replace"):
        registry.names()
    done = dpcl_with(tmp_path / "a", "methods")
    assert done.returncode == 2 and "cannot replace a built-in" in done.stderr and "Traceback" not in done.stderr


def test_two_plugins_with_one_name_are_refused(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(fake_distribution(tmp_path / "a", "first", {"twin": "one:SPEC"})))
    monkeypatch.syspath_prepend(str(fake_distribution(tmp_path / "b", "second", {"twin": "two:SPEC"})))
    with pytest.raises(MethodPluginError, match="two installed distributions register the method 'twin'"):
        MethodRegistry().entry("twin")


SPEC_MODULE = """
from dataclasses import dataclass
from dpcl.guarantees.method_schema import MethodKey

@dataclass(frozen=True)
class Spec:
    name: str = "good"
    keys: tuple = ()
    reuses_past_tasks: bool = False
    method_class: str = "plain:NotAMethod"

    def plan_task(self, method, privacy, n_examples, task_index):
        raise NotImplementedError

GOOD = Spec()
WRONG_NAME = Spec(name="other")
class NotAMethod:
    name = "good"
"""


def test_malformed_plugins_are_named_when_looked_up(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(fake_distribution(
        tmp_path / "a", "shapes",
        {"good": "plain:GOOD", "renamed": "plain:WRONG_NAME", "klass": "plain:Spec", "gone": "nowhere:SPEC"},
        {"plain": SPEC_MODULE},
    )))
    registry = MethodRegistry()
    assert registry.names()[-4:] == ("gone", "good", "klass", "renamed")
    assert registry.spec("good").name == "good" and registry.class_path("good") == "plain:NotAMethod"
    with pytest.raises(MethodPluginError, match="its name is 'other', but the entry point is 'renamed'"):
        registry.spec("renamed")
    with pytest.raises(MethodPluginError, match="names the class Spec; it must name a MethodSpec object"):
        registry.spec("klass")
    with pytest.raises(MethodPluginError, match="'gone'.*cannot be imported"):
        registry.spec("gone")
    with pytest.raises(ConfigError, match="must be one of agem, cosine, .*gone, good"):
        registry.entry("missing")
    # the class a spec names must be a ContinualMethod with the same name
    import dpcl.methods.base as base

    monkeypatch.setattr(base, "REGISTRY", registry)
    with pytest.raises(MethodPluginError, match="not a subclass of dpcl.methods.base.ContinualMethod"):
        base.method_class("good")


def test_specs_and_classes_views_go_through_one_registry(tmp_path, monkeypatch):
    from dpcl.guarantees.method_schema import METHOD_SPECS, get_method_spec
    from dpcl.methods.base import METHOD_CLASSES

    assert list(METHOD_SPECS) == list(METHOD_CLASSES) == list(BUILTIN_METHODS)
    assert METHOD_SPECS["cosine"] == "dpcl.methods.cosine.spec:COSINE"
    assert METHOD_CLASSES["cosine"] == "dpcl.methods.cosine.method:CosineClassifier"
    assert "nothing" not in METHOD_SPECS and get_method_spec("l2dpml").name == "l2dpml"
    monkeypatch.syspath_prepend(str(fake_distribution(tmp_path / "a", "shapes", {"good": "plain:GOOD"},
                                                      {"plain": SPEC_MODULE})))
    registry = MethodRegistry()
    specs, classes = RegistryView("spec", registry), RegistryView("class", registry)
    assert specs["good"] == "plain:GOOD" and classes["good"] == "plain:NotAMethod" and len(specs) == len(BUILTIN_METHODS) + 1


def test_builtins_are_dpcls_own_entry_points_each_a_package_with_a_spec():
    """Every built-in is an entry point of the distribution dpcl (pyproject.toml), named like its package
    dpcl/methods/<name>/ whose spec.py holds the spec and names the method.py class (that the specs import no
    torch is tests/test_architecture.py's check of the torch-free modules)."""
    import tomllib

    declared = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]["entry-points"]
    declared = declared["dpcl.methods"]
    assert sorted(declared) == list(BUILTIN_METHODS) == list(REGISTRY.names()[: len(declared)])
    for name, value in declared.items():
        entry = REGISTRY.entry(name)
        assert entry.source == "built-in" and entry.distribution == "dpcl" and entry.spec_path == value
        assert value.startswith(f"dpcl.methods.{name}.spec:")
        assert REGISTRY.class_path(name).startswith(f"dpcl.methods.{name}.method:")


def test_a_source_tree_without_dpcls_entry_points_is_refused_with_the_install_command():
    registry = MethodRegistry(builtin_distribution="no-such-distribution")
    with pytest.raises(IncompleteInstallError, match="pip install -e ."):
        registry.names()
    # the CLI prints it and exits 2, without a traceback
    code = (
        "import sys\n"
        "import dpcl.guarantees.method_registry as r\n"
        "r.REGISTRY.builtin_distribution = 'no-such-distribution'\n"
        "from dpcl.cli import main\n"
        "sys.exit(main(['methods']))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert done.returncode == 2 and "pip install -e ." in done.stderr and "Traceback" not in done.stderr


def test_the_plugins_doc_shows_the_fixture_package_as_it_is():
    doc = (ROOT / "docs" / "plugins.md").read_text(encoding="utf-8")
    pyproject = (FIXTURE / "pyproject.toml").read_text(encoding="utf-8")
    (entry,) = re.findall(r"```toml\n(.*?)```", doc, flags=re.S)
    assert entry in pyproject
    spec_source = (FIXTURE / "src" / "dpcl_example_method" / "spec.py").read_text(encoding="utf-8")
    for block in re.findall(r"```python\n(.*?)```", doc, flags=re.S):
        assert block in spec_source or block in (FIXTURE / "src" / "dpcl_example_method" / "method.py").read_text(
            encoding="utf-8"
        ), block[:80]
    assert "(docs/plugins.md)" in (ROOT / "README.md").read_text(encoding="utf-8")
