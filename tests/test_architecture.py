"""The package's import structure (docs/architecture.md): layers, no import circles, lazy imports only with a reason.

The import graph is read from the source (AST), not from a running interpreter: every ``import`` and
``from ... import`` of a dpcl module counts, at module level, inside functions and under ``TYPE_CHECKING``
alike, so a circle cannot hide behind a function-local import. Lookups by name at run time (the method
registry's ``"module:attribute"`` strings, the CLI's command table, entry points) are not imports and are not
edges: they are how plugins and built-ins are found without importing them.
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "dpcl"

#: The layers, lowest first: a module imports only from its own layer or a lower one. The most specific prefix
#: decides a module's layer. ``dpcl`` itself (the lazy facade ``from dpcl import Certifier``) and ``dpcl.__main__``
#: sit on top.
LAYERS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("foundations", ("dpcl._io", "dpcl._threads", "dpcl._version", "dpcl.errors", "dpcl.progress")),
    ("accounting", ("dpcl.accounting",)),
    ("guarantees", ("dpcl.guarantees",)),
    ("audit", ("dpcl.audit",)),
    ("certifier", ("dpcl.certifier", "dpcl.certification", "dpcl.audit_config")),
    ("data", ("dpcl.data", "dpcl.metrics")),
    ("methods", ("dpcl.methods", "dpcl.integrations")),
    ("runner", ("dpcl.runner",)),
    ("cli", ("dpcl.cli",)),
    ("package", ("dpcl", "dpcl.__main__")),
)

#: Layers that never import torch (nor opacus, peft, transformers), at module level or inside a function.
TORCH_FREE_LAYERS = ("foundations", "accounting", "guarantees", "audit")
#: Modules that import torch only inside a method a torch caller uses (``Certifier.noise_generator``,
#: ``dpcl.methods.noise_source``): importing them loads no torch.
TORCH_FREE_AT_IMPORT = ("dpcl.certifier", "dpcl.methods")
#: The audits of a torch training step: in the audit layer, importing torch; nothing torch-free imports them.
TORCH_AUDITS = ("dpcl.audit.canary", "dpcl.audit.one_run_dpsgd")
TORCH_PACKAGES = ("torch", "opacus", "peft", "transformers")

#: What a function-local dpcl import must carry: a comment with this marker on its line, or on the line just
#: above its group of imports, saying why it is not at module top (CLI start-up, or keeping torch out).
LAZY_MARKER = "lazy import:"


@dataclass(frozen=True)
class Edge:
    source: str
    target: str
    line: int
    local: bool  # inside a function


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


@lru_cache(maxsize=None)
def _modules() -> dict[str, Path]:
    return {_module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def _resolve(name: str) -> str | None:
    """The dpcl module ``name`` denotes (``pkg.module.attribute`` -> ``pkg.module``)."""
    modules = _modules()
    parts = name.split(".")
    while parts:
        candidate = ".".join(parts)
        if candidate in modules:
            return candidate
        parts.pop()
    return None


def _parents(tree: ast.AST) -> dict[ast.AST, ast.AST]:
    return {child: node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}


def _inside_function(node: ast.AST, parents: dict[ast.AST, ast.AST]) -> bool:
    while node in parents:
        node = parents[node]
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            return True
    return False


def _imported(module: str, node: ast.Import | ast.ImportFrom) -> list[str]:
    """Full dotted names an import statement reads (``from a import b`` -> ``a.b``, which may be a module)."""
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    base = node.module or ""
    if node.level:
        package = module.split(".") if _modules()[module].name == "__init__.py" else module.split(".")[:-1]
        package = package[: len(package) - (node.level - 1)]
        base = ".".join(package + ([node.module] if node.module else []))
    return [f"{base}.{alias.name}" for alias in node.names]


@lru_cache(maxsize=None)
def _parsed(module: str) -> tuple[ast.Module, tuple[str, ...]]:
    text = _modules()[module].read_text(encoding="utf-8")
    return ast.parse(text), tuple(text.splitlines())


def _imports(module: str) -> list[tuple[ast.Import | ast.ImportFrom, bool]]:
    tree, _ = _parsed(module)
    parents = _parents(tree)
    return [
        (node, _inside_function(node, parents))
        for node in ast.walk(tree)
        if isinstance(node, (ast.Import, ast.ImportFrom))
    ]


@lru_cache(maxsize=None)
def import_graph() -> tuple[Edge, ...]:
    edges = []
    for module in _modules():
        for node, local in _imports(module):
            for name in _imported(module, node):
                if name.split(".")[0] != "dpcl":
                    continue
                target = _resolve(name)
                if target is not None and target != module:
                    edges.append(Edge(module, target, node.lineno, local))
    return tuple(edges)


def layer_of(module: str) -> int:
    best: tuple[int, int] | None = None
    for index, (_, prefixes) in enumerate(LAYERS):
        for prefix in prefixes:
            if (module == prefix or module.startswith(prefix + ".")) and (best is None or len(prefix) > best[1]):
                best = (index, len(prefix))
    assert best is not None, f"{module} is in no layer: add its package to LAYERS in {Path(__file__).name}"
    return best[0]


def import_cycles(edges) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan), each a set of modules in a circle."""
    graph: dict[str, set[str]] = {m: set() for m in _modules()}
    for edge in edges:
        graph[edge.source].add(edge.target)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    counter = 0

    def visit(start: str) -> None:  # iterative, so a deep graph cannot exhaust the recursion limit
        nonlocal counter
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = counter
        counter += 1
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is None:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.append(member)
                        if member == node:
                            break
                    if len(component) > 1:
                        found.append(sorted(component))
            elif child not in index:
                index[child] = low[child] = counter
                counter += 1
                stack.append(child)
                on_stack.add(child)
                work.append((child, iter(sorted(graph[child]))))
            elif child in on_stack:
                low[node] = min(low[node], index[child])

    for module in sorted(graph):
        if module not in index:
            visit(module)
    return found


def test_the_graph_sees_function_local_imports_and_circles():
    edges = import_graph()
    assert any(e.local for e in edges) and any(not e.local for e in edges)
    # the cycle finder finds a circle closed by a function-local import
    fake = [Edge("dpcl.guarantees.ledger", "dpcl.guarantees.certificates", 1, True)]
    cycles = import_cycles(list(edges) + fake)
    assert any({"dpcl.guarantees.certificates", "dpcl.guarantees.ledger"} <= set(c) for c in cycles), cycles


def test_no_import_circles():
    assert import_cycles(import_graph()) == []


def test_every_module_is_in_a_layer_and_imports_only_downward():
    upward = [
        f"{e.source} (layer {LAYERS[layer_of(e.source)][0]}) imports {e.target} (layer {LAYERS[layer_of(e.target)][0]}) "
        f"at line {e.line}"
        for e in import_graph()
        if layer_of(e.target) > layer_of(e.source)
    ]
    assert upward == []


def is_method_spec(module: str) -> bool:
    """A method package (``dpcl.methods.<name>``, its ``__init__``) or its spec (``dpcl.methods.<name>.spec``):
    in the methods layer, but what ``dpcl audit`` and ``dpcl methods`` load through the registry, so torch-free."""
    parts = module.split(".")
    if parts[:2] != ["dpcl", "methods"] or len(parts) not in (3, 4):
        return False
    return parts[3:] == ["spec"] if len(parts) == 4 else _modules()[module].name == "__init__.py"


def _torch_free(module: str) -> bool:
    if is_method_spec(module):
        return True
    return LAYERS[layer_of(module)][0] in TORCH_FREE_LAYERS and not module.startswith(TORCH_AUDITS)


def test_every_builtin_method_is_a_package_with_a_spec():
    packages = sorted(m for m in _modules() if is_method_spec(m) and not m.endswith(".spec"))
    assert packages and all(f"{m}.spec" in _modules() for m in packages), packages


def node_level(node: ast.Import | ast.ImportFrom) -> int:
    return getattr(node, "level", 0) or 0


def test_torch_free_layers_never_import_torch():
    offenders = []
    for module in filter(_torch_free, _modules()):
        for node, _ in _imports(module):
            names = _imported(module, node)
            roots = {n.split(".")[0] for n in names} if isinstance(node, ast.Import) else {(node.module or "").split(".")[0]}
            if node_level(node) == 0 and roots & set(TORCH_PACKAGES):
                offenders.append(f"{module}:{node.lineno} imports {sorted(roots & set(TORCH_PACKAGES))}")
            for name in names:
                target = _resolve(name) if name.startswith("dpcl.") else None
                if target is not None and target.startswith(TORCH_AUDITS):
                    offenders.append(f"{module}:{node.lineno} imports {target}, which imports torch")
    assert offenders == []


def test_importing_every_torch_free_module_loads_no_torch():
    modules = sorted(filter(_torch_free, _modules())) + list(TORCH_FREE_AT_IMPORT)
    code = (
        "import importlib, sys\n"
        f"for name in {modules!r}:\n"
        "    importlib.import_module(name)\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in {'torch', 'opacus', 'peft', 'transformers'}))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


def _has_reason(lines: tuple[str, ...], node: ast.stmt) -> bool:
    """A ``lazy import:`` comment on the statement's own lines, or on the line above its group of imports."""
    if any(LAZY_MARKER in line for line in lines[node.lineno - 1 : node.end_lineno]):
        return True
    above = node.lineno - 2
    while above >= 0:
        text = lines[above].strip()
        if LAZY_MARKER in text:
            return True
        if text.startswith(("from ", "import ")) or text == ")" or (text.endswith(",") and not text.startswith("#")):
            above -= 1  # another import of the same group (or the tail of a parenthesised one)
            continue
        return False
    return False


def test_every_function_local_dpcl_import_says_why():
    unexplained = []
    for module in _modules():
        _, lines = _parsed(module)
        for node, local in _imports(module):
            if local and any(n.split(".")[0] == "dpcl" for n in _imported(module, node)) and not _has_reason(lines, node):
                unexplained.append(f"{module}:{node.lineno}: {lines[node.lineno - 1].strip()}")
    assert unexplained == [], (
        f"a function-local import needs a '# {LAZY_MARKER} ...' comment saying why (CLI start-up, or keeping torch "
        "out of a torch-free layer); otherwise import at module top"
    )


@pytest.mark.parametrize("package", ["dpcl", "dpcl.accounting", "dpcl.guarantees", "dpcl.methods"])
def test_public_names_resolve(package):
    code = (
        "import importlib\n"
        f"module = importlib.import_module({package!r})\n"
        "names = module.__all__\n"
        "assert len(names) == len(set(names)), 'duplicate names in __all__'\n"
        "missing = [n for n in names if not hasattr(module, n)]\n"
        "assert not missing, missing\n"
        "import pkgutil\n"
        "submodules = {m.name for m in pkgutil.iter_modules(getattr(module, '__path__', []))}\n"
        "assert not set(names) & submodules, set(names) & submodules  # a submodule would shadow the name\n"
        "print(len(names))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert out.returncode == 0, out.stderr
    assert int(out.stdout) > 0


#: What a plugin may import from dpcl: these modules, and of the packages only the names in their ``__all__``.
PUBLIC_MODULES = ("dpcl", "dpcl.accounting", "dpcl.errors", "dpcl.guarantees", "dpcl.methods")
PLUGIN_FIXTURE = ROOT / "tests" / "fixtures" / "dpcl-example-method" / "src"


def test_the_plugin_fixture_imports_public_names_only():
    imports = []
    for path in sorted(PLUGIN_FIXTURE.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                imports += [(path.name, a.name, None) for a in node.names if a.name.split(".")[0] == "dpcl"]
            elif isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "dpcl":
                imports += [(path.name, node.module, a.name) for a in node.names]
    assert imports, "the fixture imports nothing from dpcl: the check would pass vacuously"
    private = [f"{file}: {module}" for file, module, _ in imports if module not in PUBLIC_MODULES]
    assert private == []
    code = (
        "import importlib, json, sys\n"
        "wanted = json.loads(sys.argv[1])\n"
        "bad = []\n"
        "for module, name in wanted:\n"
        "    m = importlib.import_module(module)\n"
        "    public = getattr(m, '__all__', None) or [n for n in vars(m) if not n.startswith('_')]\n"
        "    if name not in public or not hasattr(m, name):\n"
        "        bad.append(f'{module}.{name}')\n"
        "print(json.dumps(bad))\n"
    )
    wanted = json.dumps([[module, name] for _, module, name in imports if name is not None])
    out = subprocess.run([sys.executable, "-c", code, wanted], capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout) == []


def test_the_architecture_page_lists_the_layers_in_order():
    doc = (ROOT / "docs" / "architecture.md").read_text(encoding="utf-8")
    rows = [line.split("|")[2].strip() for line in doc.splitlines() if line.startswith("| ") and line[2:3].isdigit()]
    assert rows == [name for name, _ in LAYERS if name != "package"]
    assert "(docs/architecture.md)" in (ROOT / "README.md").read_text(encoding="utf-8")
