"""How a training method declares its config keys and its privacy plan.

A method never computes epsilon itself. Instead each method name in a config's
``[method] name = ...`` maps to a :class:`MethodSpec` that (a) lists the method
keys it accepts (so configs with unknown keys are refused by name) and (b) turns
a task's size into a :class:`TaskPlan`: the noise the method must use and the
privacy events that noise causes. ``dpcl audit`` and ``dpcl run`` call the same
plan, so what is audited is what is trained.

Specs are looked up lazily by name (:func:`get_method_spec`) through the method
registry (:mod:`dpcl.guarantees.method_registry`: built-in methods and plugins
installed through the ``dpcl.methods`` entry-point group), so the modules that
define them are imported only when needed.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Protocol

from dpcl.accounting.events import PrivacyEvent
from dpcl.errors import ConfigError, InvalidParameterError
from dpcl.guarantees.method_registry import REGISTRY, MethodKey, RegistryView  # MethodKey: public here too
from dpcl.guarantees.settings import PrivacySettings


class _Required:
    def __repr__(self) -> str:
        return "REQUIRED"


#: Default value of a key that must be given.
REQUIRED: Any = _Required()


@dataclass(frozen=True)
class ReleaseCoverage:
    """Whether the released checkpoint is a post-processing of the plan's charged events.

    A certificate's headline guarantee is the guarantee of the released
    checkpoint. It may state an epsilon only when everything the checkpoint
    holds was computed from the charged (noisy) releases, from public data and
    from configuration: then the checkpoint is a post-processing of the
    releases and inherits their guarantee. ``covered=True`` must say why in
    ``basis`` (one sentence); ``covered=False`` must list every reason in
    ``reasons`` (e.g. weights trained on clean private targets, noise scales
    computed from the private data). Build it with :meth:`post_processing` or
    :meth:`not_covered`.
    """

    covered: bool
    basis: str = ""
    reasons: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if not isinstance(self.covered, bool):
            raise InvalidParameterError(f"ReleaseCoverage.covered must be true or false, got {self.covered!r}.")
        reasons = tuple(str(r).strip() for r in self.reasons)
        object.__setattr__(self, "reasons", reasons)
        object.__setattr__(self, "basis", str(self.basis).strip())
        if self.covered and (not self.basis or reasons):
            raise InvalidParameterError(
                "a covered release must state its basis (why the checkpoint is a post-processing of the charged "
                "releases) and no reasons against it."
            )
        if not self.covered and (not reasons or not all(reasons)):
            raise InvalidParameterError(
                "a release that is not covered must list every reason why (non-empty sentences), so that "
                "certificates and audits can state them."
            )

    @classmethod
    def post_processing(cls, basis: str) -> "ReleaseCoverage":
        """The checkpoint is a post-processing of the charged releases, for the reason ``basis``."""
        return cls(covered=True, basis=basis)

    @classmethod
    def not_covered(cls, *reasons: str) -> "ReleaseCoverage":
        """The checkpoint is not a post-processing of the charged releases, for each of ``reasons``."""
        return cls(covered=False, reasons=tuple(reasons))

    def to_dict(self) -> dict[str, Any]:
        return {"covered": self.covered, "basis": self.basis, "reasons": list(self.reasons)}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "ReleaseCoverage":
        return cls(covered=data["covered"], basis=data.get("basis", ""), reasons=tuple(data.get("reasons", ())))


@dataclass(frozen=True)
class ScopedPlan:
    """Events whose guarantee covers something narrower than the checkpoint (e.g. one input release).

    ``name`` identifies the statement across tasks (its events are composed
    across tasks like the headline's, in a ledger of their own); ``scope`` is
    the sentence that says what the guarantee covers and what it does not.
    Such a statement never becomes a certificate's headline.
    """

    name: str
    scope: str
    events: tuple[PrivacyEvent, ...]

    def __post_init__(self) -> None:
        if not str(self.name).strip() or not str(self.scope).strip():
            raise InvalidParameterError("a scoped guarantee needs a name and a scope sentence saying what it covers.")
        events = tuple(self.events)
        if not events or not all(isinstance(e, PrivacyEvent) for e in events):
            raise InvalidParameterError(f"scoped guarantee {self.name!r} needs one or more PrivacyEvent objects.")
        object.__setattr__(self, "events", events)


@dataclass(frozen=True)
class TaskPlan:
    """What a method does to one task's data, privacy-wise.

    ``events`` are charged to the task's data in the ledger: they are what the
    released checkpoint's guarantee is computed from. ``noise`` holds the
    calibrated parameters the method must use (e.g. ``sigma`` or
    ``noise_multiplier``, ``sample_rate``, ``steps``); ``assumptions`` are plain
    sentences copied into certificates. ``release`` states whether the
    checkpoint is a post-processing of ``events`` (:class:`ReleaseCoverage`);
    a plan without it (``None``) can be trained but never certified.
    ``scoped`` holds statements about narrower releases (:class:`ScopedPlan`).
    """

    events: tuple[PrivacyEvent, ...]
    noise: Mapping[str, Any]
    assumptions: tuple[str, ...] = ()
    notes: tuple[str, ...] = field(default_factory=tuple)
    release: ReleaseCoverage | None = None
    scoped: tuple[ScopedPlan, ...] = ()

    def __post_init__(self) -> None:
        if self.release is not None and not isinstance(self.release, ReleaseCoverage):
            raise InvalidParameterError(f"TaskPlan.release must be a ReleaseCoverage or None, got {self.release!r}.")
        scoped = tuple(self.scoped)
        if not all(isinstance(s, ScopedPlan) for s in scoped):
            raise InvalidParameterError("TaskPlan.scoped must hold ScopedPlan objects.")
        names = [s.name for s in scoped]
        if len(set(names)) != len(names):
            raise InvalidParameterError(f"TaskPlan.scoped names must be distinct, got {names}.")
        object.__setattr__(self, "scoped", scoped)


class MethodSpec(Protocol):
    """What a method declares without importing torch (``dpcl/methods/<name>/spec.py`` for a built-in).

    Optional attributes a spec may carry:

    * ``summary``: one line for ``dpcl methods`` (else the first paragraph of its class docstring);
    * ``data_parallel``: True when ``dpcl run --nproc N`` may split its DP-SGD steps over N processes (default
      False);
    * ``trains_encoder(method) -> bool``: True when the method runs the stream's ``[stream] encoder`` itself, so
      the stream hands it the encoder's inputs (pixel rows, texts) instead of its features (default False);
    * ``cost_estimator``: ``"module:function"`` estimating the training cost ``dpcl audit`` reports
      (:func:`dpcl.runner.cost.estimate_training_cost` calls it; imported only then); without one the audit
      says the cost is unavailable and neither it nor ``dpcl run`` refuses the config for memory.
    """

    name: str
    keys: tuple[MethodKey, ...]
    #: True when the method trains on the union of all tasks seen so far (data reuse across tasks).
    reuses_past_tasks: bool
    #: ``"module:Class"`` of its ``ContinualMethod``, imported only by ``dpcl run``.
    method_class: str

    def plan_task(
        self, method: Mapping[str, Any], privacy: PrivacySettings, n_examples: int, task_index: int
    ) -> TaskPlan:
        """Plan task ``task_index`` (0-based) holding ``n_examples`` examples.

        ``method`` is the validated ``[method]`` section (defaults filled in),
        ``privacy`` the run's :class:`~dpcl.guarantees.settings.PrivacySettings` (read its attributes:
        ``privacy.epsilon``, ``privacy.delta``, ``privacy.adjacency``...).
        """
        ...


#: method name -> "module:attribute" of its MethodSpec: a read-only view of the method registry
#: (:mod:`dpcl.guarantees.method_registry`), built-in methods and installed plugins.
METHOD_SPECS: Mapping[str, str] = RegistryView("spec")


def spec_trains_encoder(spec: MethodSpec, method: Mapping[str, Any]) -> bool:
    """Whether the method of ``spec``, configured by ``method``, runs the stream's ``[stream] encoder`` itself (the
    spec's optional ``trains_encoder``; default False): its stream then gives the encoder's inputs, not features."""
    trains_encoder = getattr(spec, "trains_encoder", None)
    return bool(trains_encoder(method)) if trains_encoder is not None else False


def get_method_spec(name: str) -> MethodSpec:
    """The spec of method ``name`` (built-in or plugin); an unknown name raises ConfigError listing the known ones."""
    return REGISTRY.spec(name)


# -- reusable MethodKey checks ------------------------------------------------------------------------
# Each returns None for a good value, else what is allowed, phrased to follow "must be" in the
# config error ("[method] epochs must be an integer >= 1 for method 'naive'; got 0.").


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def positive(value: Any) -> str | None:
    return None if _is_number(value) and value > 0 else "a finite number > 0"


def nonnegative(value: Any) -> str | None:
    return None if _is_number(value) and value >= 0 else "a finite number >= 0"


def positive_int(value: Any) -> str | None:
    return None if isinstance(value, int) and not isinstance(value, bool) and value >= 1 else "an integer >= 1"


def nonnegative_int(value: Any) -> str | None:
    return None if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else "an integer >= 0"


def open_unit_interval(value: Any) -> str | None:
    return None if _is_number(value) and 0 < value < 1 else "a number in (0, 1)"


def unit_interval(*, closed_right: bool = True) -> Callable[[Any], str | None]:
    def check(value: Any) -> str | None:
        ok = _is_number(value) and (0 <= value <= 1 if closed_right else 0 <= value < 1)
        return None if ok else f"a number in [0, 1{']' if closed_right else ')'}"

    return check


def one_of(*allowed: str) -> Callable[[Any], str | None]:
    def check(value: Any) -> str | None:
        return None if value in allowed else "one of " + ", ".join(repr(a) for a in allowed)

    return check


def method_value(method: Mapping[str, Any], keys: tuple[MethodKey, ...], name: str, method_name: str) -> Any:
    """``method[name]``, or the key's default; a required key that is missing raises ConfigError."""
    if name in method:
        return method[name]
    for key in keys:
        if key.name == name:
            if key.default is REQUIRED:
                raise ConfigError(f"[method] {name} is required for {method_name}: {key.help}.")
            return key.default
    raise ConfigError(f"[method] {name} is not a {method_name} key.")


#: What ``[method] device`` / ``--device`` may say (the string form only; whether the device exists is checked at
#: run time by :func:`dpcl.runner.run.resolve_device`, since this layer never imports torch).
TORCH_DEVICE_FORMS = "'cpu', 'cuda' or 'cuda:N' (N = 0, 1, ...: the CUDA device index)"


def torch_device(value: Any) -> str | None:
    """``None`` when ``value`` is ``"cpu"``, ``"cuda"`` or ``"cuda:N"`` (N a decimal integer >= 0), else what it must be."""
    if isinstance(value, str):
        if value in ("cpu", "cuda"):
            return None
        prefix, _, index = value.partition(":")
        if prefix == "cuda" and index.isascii() and index.isdigit() and str(int(index)) == index:
            return None
    return TORCH_DEVICE_FORMS
