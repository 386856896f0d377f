"""The one registry of training methods: built-in ones and plugins installed through entry points.

Every lookup of a ``[method] name`` -- its :class:`~dpcl.guarantees.method_schema.MethodSpec`
(:func:`~dpcl.guarantees.method_schema.get_method_spec`, used by ``dpcl audit``
and the config parser) and its :class:`~dpcl.methods.base.ContinualMethod`
class (:func:`~dpcl.methods.base.method_class`, used by ``dpcl run``) -- goes
through :data:`REGISTRY`. ``METHOD_SPECS`` and ``METHOD_CLASSES`` are read-only
views of it (name -> ``"module:attribute"``).

Plugins. A third-party package registers a method with an entry point in the
group ``dpcl.methods`` whose name is the ``[method] name`` and whose value
names the method's *spec* object (``"package.spec:SPEC"``), e.g. in its
``pyproject.toml``::

    [project.entry-points."dpcl.methods"]
    noisy_centroid = "dpcl_example_method.spec:NOISY_CENTROID"

The spec carries ``name``, ``keys``, ``reuses_past_tasks``, ``plan_task`` and
``method_class = "package.method:Class"`` (the ``ContinualMethod`` subclass,
named as a string), as every built-in spec does. Why the spec and not the
class: the spec is what ``dpcl audit`` and ``dpcl methods`` need, and it can
live in a module that does not import torch; the class (which usually does) is
imported only by ``dpcl run``.

Built-in methods are registered the same way, by dpcl's own ``pyproject.toml``
(``cosine = "dpcl.methods.cosine.spec:COSINE"``, ...): an entry point of the
distribution ``dpcl`` is a built-in, any other a plugin. Listing methods or
auditing a config never imports torch. A source tree that was never installed
has no such metadata: the registry then raises
:class:`~dpcl.errors.IncompleteInstallError` saying to run ``pip install -e .``.

A plugin can never replace a built-in method, nor share its name with another
plugin: discovery raises :class:`~dpcl.errors.MethodPluginError` naming the
distributions and what to change. A plugin whose spec is malformed (missing
attribute, a name that differs from its entry point) raises the same
error when it is looked up. Like a built-in's, a plugin's plans must declare
their release coverage (``TaskPlan.release``): a plan without it can be trained
but never certified.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import re
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Mapping

from dpcl.errors import ConfigError, IncompleteInstallError, MethodPluginError

__all__ = [
    "BUILTIN_DISTRIBUTION",
    "ENTRY_POINT_GROUP",
    "MethodEntry",
    "MethodKey",
    "MethodRegistry",
    "REGISTRY",
    "RegistryView",
]


@dataclass(frozen=True)
class MethodKey:
    """One documented key of a method's config section (a spec's ``keys``; re-exported by
    :mod:`dpcl.guarantees.method_schema`, where specs are written). It lives here, below the schema, because
    the registry checks a plugin spec's keys.

    ``check`` returns an error message (what is allowed) for a bad value, or None.
    """

    name: str
    type: type | tuple[type, ...]
    default: Any
    help: str
    check: Callable[[Any], str | None] | None = None


#: Entry-point group third-party methods register in.
ENTRY_POINT_GROUP = "dpcl.methods"

#: The distribution whose entry points are the built-in methods.
BUILTIN_DISTRIBUTION = "dpcl"


@dataclass(frozen=True)
class MethodEntry:
    """One registered method: where its spec is, and who provides it.

    ``spec_path`` is ``"module:attribute"``; ``source`` is ``"built-in"`` (an entry point of dpcl itself) or
    ``"plugin"``; ``distribution`` names the installed package. Its class comes from its spec's
    ``method_class`` (:meth:`MethodRegistry.class_path`).
    """

    name: str
    spec_path: str
    source: str
    distribution: str = ""
    version: str = ""

    @property
    def is_plugin(self) -> bool:
        return self.source == "plugin"

    def describe(self) -> str:
        if not self.is_plugin:
            return "built-in"
        return f"plugin from {self.distribution or 'an unnamed distribution'}" + (
            f" {self.version}" if self.version else ""
        )


def _resolve(path: str) -> Any:
    module_name, _, attribute = path.partition(":")
    module = importlib.import_module(module_name)
    obj = module
    for part in attribute.split("."):
        obj = getattr(obj, part)
    return obj


def _canonical(name: str) -> str:
    """A distribution name as packaging compares them (PEP 503: case and ``-_.`` runs folded)."""
    return re.sub(r"[-_.]+", "-", name).lower()


def _discover(group: str, builtin_distribution: str) -> list[MethodEntry]:
    """Every entry point of ``group`` on ``sys.path``; those of ``builtin_distribution`` are the built-ins."""
    entries: list[MethodEntry] = []
    seen: set[tuple[str, str, str]] = set()
    for ep in importlib.metadata.entry_points(group=group):
        dist = getattr(ep, "dist", None)
        dist_name = dist.metadata["Name"] if dist is not None else ""
        version = dist.version if dist is not None else ""
        key = (ep.name, ep.value, dist_name)
        if key in seen:  # the same distribution found twice on sys.path
            continue
        seen.add(key)
        source = "built-in" if _canonical(dist_name or "") == _canonical(builtin_distribution) else "plugin"
        entries.append(MethodEntry(ep.name, ep.value, source, dist_name, version))
    return entries


def _metadata_location(distribution: str) -> str:
    """`` (metadata read from PATH)`` for the metadata importlib finds first for ``distribution``, or ``""``.

    That first folder on ``sys.path`` wins: a ``dpcl.egg-info`` left in the working directory by an old
    install hides a newer installed one, which is why the error names the folder it read.
    """
    try:
        dist = importlib.metadata.distribution(distribution)
    except importlib.metadata.PackageNotFoundError:
        return " (no metadata found)"
    path = getattr(dist, "_path", None)  # PathDistribution's folder; other finders may not say
    return f" (metadata read from {path})" if path is not None else ""


class MethodRegistry:
    """The methods registered in one entry-point group, discovered once (see :meth:`refresh`): the entry points of
    ``builtin_distribution`` (dpcl itself) are the built-ins, every other distribution's are plugins."""

    def __init__(self, group: str = ENTRY_POINT_GROUP, builtin_distribution: str = BUILTIN_DISTRIBUTION) -> None:
        self.group = group
        self.builtin_distribution = builtin_distribution
        self._entries: dict[str, MethodEntry] | None = None
        self._builtin_names: tuple[str, ...] = ()
        self._specs: dict[str, Any] = {}

    # -- discovery -----------------------------------------------------------------------------------
    def refresh(self) -> None:
        """Forget discovered methods and loaded specs (after installing or removing a plugin in-process)."""
        self._entries = None
        self._builtin_names = ()
        self._specs = {}

    def _all(self) -> dict[str, MethodEntry]:
        if self._entries is None:
            found = _discover(self.group, self.builtin_distribution)
            builtins = {e.name: e for e in sorted(found, key=lambda e: e.name) if not e.is_plugin}
            if not builtins:
                raise IncompleteInstallError(
                    f"no built-in method is registered: the installed metadata of the {self.builtin_distribution!r} "
                    f"distribution{_metadata_location(self.builtin_distribution)} has no {self.group!r} entry points "
                    "(dpcl is used from a source tree that was never installed, or from an install older than its "
                    "pyproject.toml). Run `pip install -e .` in the dpcl source tree (or reinstall dpcl); if the "
                    "metadata named here is a stale dpcl.egg-info folder in the directory you run from, delete it."
                )
            entries = dict(builtins)
            for plugin in (e for e in found if e.is_plugin):
                if plugin.name in builtins:
                    raise MethodPluginError(
                        f"the installed distribution {plugin.distribution!r} registers a method named "
                        f"{plugin.name!r} (entry point group {self.group!r}, {plugin.spec_path}), which is a built-in "
                        f"method: a plugin cannot replace a built-in. Rename its entry point (e.g. "
                        f"'{plugin.distribution.replace('-', '_') or 'plugin'}_{plugin.name}') or uninstall "
                        f"{plugin.distribution or 'the plugin'}."
                    )
                if plugin.name in entries:
                    other = entries[plugin.name]
                    raise MethodPluginError(
                        f"two installed distributions register the method {plugin.name!r} (entry point group "
                        f"{self.group!r}): {other.distribution!r} ({other.spec_path}) and {plugin.distribution!r} "
                        f"({plugin.spec_path}). Uninstall one of them or rename an entry point."
                    )
                entries[plugin.name] = plugin
            self._entries = entries
            self._builtin_names = tuple(builtins)
        return self._entries

    def builtin_names(self) -> tuple[str, ...]:
        """The built-in methods, by name."""
        self._all()
        return self._builtin_names

    def names(self) -> tuple[str, ...]:
        """Built-in names first, then plugins, each by name (whatever order the installed metadata lists them in)."""
        entries = self._all()
        builtins = self._builtin_names
        return builtins + tuple(sorted(n for n in entries if n not in builtins))

    def entry(self, name: str) -> MethodEntry:
        entries = self._all()
        if not isinstance(name, str) or name not in entries:
            raise ConfigError(f"[method] name must be one of {', '.join(self.names())}; got {name!r}.")
        return entries[name]

    # -- specs and classes -----------------------------------------------------------------------------
    def spec(self, name: str) -> Any:
        """The MethodSpec of ``name`` (imported on first use); a malformed plugin spec raises MethodPluginError."""
        entry = self.entry(name)
        if name not in self._specs:
            if not entry.is_plugin:
                self._specs[name] = _resolve(entry.spec_path)
            else:
                self._specs[name] = self._load_plugin_spec(entry)
        return self._specs[name]

    def _load_plugin_spec(self, entry: MethodEntry) -> Any:
        where = f"plugin method {entry.name!r} ({entry.describe()}, entry point {entry.spec_path!r})"
        try:
            spec = _resolve(entry.spec_path)
        except ModuleNotFoundError as exc:
            raise MethodPluginError(f"{where} cannot be imported: {exc}. Reinstall the plugin.") from exc
        except (AttributeError, ImportError, ValueError) as exc:
            raise MethodPluginError(f"{where} does not name an importable object: {exc}.") from exc
        if isinstance(spec, type):
            raise MethodPluginError(
                f"{where} names the class {spec.__name__}; it must name a MethodSpec object (an instance with name, "
                "keys, reuses_past_tasks, plan_task and method_class), e.g. 'package.spec:SPEC'."
            )
        problems = []
        if getattr(spec, "name", None) != entry.name:
            problems.append(f"its name is {getattr(spec, 'name', None)!r}, but the entry point is {entry.name!r}")
        keys = getattr(spec, "keys", None)
        if not isinstance(keys, tuple) or not all(isinstance(k, MethodKey) for k in keys):
            problems.append("keys must be a tuple of dpcl.guarantees.method_schema.MethodKey")
        elif "name" in {k.name for k in keys}:
            problems.append("'name' is reserved for [method] name and cannot be a method key")
        if not isinstance(getattr(spec, "reuses_past_tasks", None), bool):
            problems.append("reuses_past_tasks must be true or false")
        if not callable(getattr(spec, "plan_task", None)):
            problems.append("plan_task(method, privacy, n_examples, task_index) is missing")
        class_path = getattr(spec, "method_class", None)
        if not (isinstance(class_path, str) and ":" in class_path) and not isinstance(class_path, type):
            problems.append("method_class must name its ContinualMethod subclass as 'module:Class'")
        if problems:
            raise MethodPluginError(f"{where} is not a valid MethodSpec: " + "; ".join(problems) + ".")
        return spec

    def class_path(self, name: str) -> "str | type":
        """``"module:Class"`` of the method's ContinualMethod, from its spec (a plugin may give the class itself)."""
        return self.spec(name).method_class

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())


#: The registry every lookup goes through.
REGISTRY = MethodRegistry()


class RegistryView(Mapping[str, str]):
    """Read-only ``name -> "module:attribute"`` view of :data:`REGISTRY` (``what``: ``"spec"`` or ``"class"``)."""

    def __init__(self, what: str, registry: MethodRegistry | None = None) -> None:
        self._what = what
        self._registry = registry

    @property
    def registry(self) -> MethodRegistry:
        return self._registry if self._registry is not None else REGISTRY

    def __getitem__(self, name: str) -> str:
        try:
            entry = self.registry.entry(name)
        except ConfigError:
            raise KeyError(name) from None
        if self._what == "spec":
            return entry.spec_path
        path = self.registry.class_path(name)
        return path if isinstance(path, str) else f"{path.__module__}:{path.__qualname__}"

    def __iter__(self) -> Iterator[str]:
        return iter(self.registry.names())

    def __len__(self) -> int:
        return len(self.registry.names())

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and name in self.registry.names()

    def __repr__(self) -> str:
        return f"RegistryView({self._what!r}, {dict(self)!r})"
