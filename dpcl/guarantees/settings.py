"""What the user asked for: :class:`PrivacySettings`, parsed once from ``[privacy]`` and the label-space keys.

The config parser (:func:`dpcl.guarantees.config.parse_config`) builds it from a TOML config; Python callers
build it directly or from a ``[privacy]`` mapping (:func:`privacy_settings`). The
:class:`~dpcl.Certifier`, the task ledger, the method specs and ``dpcl audit`` take it; no module outside this
one reads ``[privacy]`` keys by name (``tests/guarantees/test_privacy_settings.py`` checks that).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping, Sequence

from dpcl.accounting.accountants.registry import TRAINING_CHOICES
from dpcl.accounting.events import Adjacency
from dpcl.accounting.validation import check_delta, check_positive
from dpcl.errors import ConfigError, InvalidParameterError

__all__ = [
    "ACROSS_TASKS_CHOICES",
    "CONFIG_ACCOUNTANTS",
    "PRIVACY_KEYS",
    "PrivacySettings",
    "config_disagreements",
    "parse_privacy",
    "privacy_settings",
]

#: ``[privacy] accountant`` choices: the registered accountants offered for training.
CONFIG_ACCOUNTANTS = TRAINING_CHOICES
ACROSS_TASKS_CHOICES = ("auto", "parallel", "sequential")

#: ``[privacy]`` keys: name -> (default, help).
PRIVACY_KEYS: dict[str, tuple[Any, str]] = {
    "epsilon": (None, "per-task (per-release) epsilon budget, a finite number > 0"),
    "delta": (None, "delta of every guarantee, a number in (0, 1)"),
    "adjacency": ("add_remove", "neighbouring relation: 'add_remove' or 'replace_one'"),
    "accountant": ("auto", "accountant: 'prv', 'pld', 'rdp' or 'auto' (tightest sound bound)"),
    "across_tasks": ("auto", "composition over tasks: 'auto' (parallel iff disjoint_units), 'parallel' or "
                             "'sequential'"),
    "total_epsilon": (None, "optional epsilon budget of a privacy filter over the whole stream, > 0"),
    "total_delta": (None, "optional delta budget of that filter, in (0, 1); default: delta"),
}


def number(section: str, key: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(float(value)):
        raise ConfigError(f"[{section}] {key} must be a finite number, got {value!r}.")
    return float(value)


def choice(section: str, key: str, value: Any, allowed: Iterable[str]) -> str:
    allowed = tuple(allowed)
    if value not in allowed:
        raise ConfigError(f"[{section}] {key} must be one of {', '.join(repr(a) for a in allowed)}; got {value!r}.")
    return value


def unknown_keys(section: str, given: Iterable[str], allowed: Iterable[str]) -> None:
    allowed = list(allowed)
    unknown = sorted(set(given) - set(allowed))
    if unknown:
        raise ConfigError(f"unknown [{section}] key(s) {', '.join(unknown)}; allowed: {', '.join(allowed)}.")


def jsonable(value: Any) -> Any:
    if isinstance(value, Mapping):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [jsonable(v) for v in value]
    if hasattr(value, "isoformat"):
        return value.isoformat()
    return value


def parse_privacy(section: Mapping[str, Any], required: Iterable[str] = ("epsilon", "delta")) -> dict[str, Any]:
    """The keyword arguments of :class:`PrivacySettings` from a ``[privacy]`` section; ``required``: the keys that
    must be given (a config needs epsilon and delta; a Python caller of a spec may leave either out)."""
    unknown_keys("privacy", section, PRIVACY_KEYS)
    out: dict[str, Any] = {}
    required = tuple(required)
    for key, (default, help_text) in PRIVACY_KEYS.items():
        if key not in section:
            if key in required:
                raise ConfigError(f"[privacy] {key} is required: {help_text}.")
            out[key] = default
    choices = {"adjacency": ("add_remove", "replace_one"), "accountant": CONFIG_ACCOUNTANTS,
               "across_tasks": ACROSS_TASKS_CHOICES}
    for key in PRIVACY_KEYS:  # in the table's order, so the first problem named is the same every time
        if key not in section:
            continue
        value = section[key]
        if key in choices:
            out[key] = choice("privacy", key, value, choices[key])
            continue
        if key == "total_delta" and "total_epsilon" not in section:
            raise ConfigError("[privacy] total_delta is only allowed together with total_epsilon.")
        out[key] = number("privacy", key, value)
        if key.endswith("epsilon") and out[key] <= 0:
            raise ConfigError(f"[privacy] {key} must be > 0, got {value!r}.")
        if key.endswith("delta") and not 0 < out[key] < 1:
            raise ConfigError(f"[privacy] {key} must lie in (0, 1), got {value!r}.")
    return out


@dataclass(frozen=True)
class PrivacySettings:
    """What the user asked for: the ``[privacy]`` section and the label-space keys of ``[stream]``, validated once.

    :func:`dpcl.guarantees.config.parse_config` builds it from a config (``[privacy]`` problems raise :class:`~dpcl.errors.ConfigError`
    naming the key); :func:`privacy_settings` from a plain ``[privacy]`` mapping (Python callers, method specs
    called directly). The :class:`~dpcl.Certifier`, the task ledger, the method specs (``plan_task``) and
    ``dpcl audit`` take it; no other module reads ``[privacy]`` keys by name.

    ``epsilon`` is the per-task (per-release) budget the methods calibrate to (None when a Python caller gives
    none: the specs that need it say so); ``delta`` the delta of every guarantee (None only in a partial mapping
    given to a spec that needs no delta). ``across_tasks`` is the composition asked for (``auto`` resolves from
    ``disjoint_units``). ``total_epsilon`` / ``total_delta``: the optional privacy filter over the stream.
    ``unit`` is the privacy unit of the events (``example`` unless a method's events say otherwise).
    ``recorded``: the config as read, when the settings come from one; it is the certificate's config section
    (:meth:`to_dict`), so ``dpcl verify`` checks the guarantee against the whole file.
    """

    delta: float | None
    epsilon: float | None = None
    adjacency: str = "add_remove"
    accountant: str = "auto"
    across_tasks: str = "auto"
    total_epsilon: float | None = None
    total_delta: float | None = None
    label_space: str | None = None
    prior_labels: Any = None
    disjoint_units: bool | None = None
    unit: str = "example"
    task_sizes: tuple[int, ...] | None = None
    recorded: Mapping[str, Any] | None = field(default=None, compare=False, repr=False)

    def __post_init__(self) -> None:
        if self.delta is not None:
            object.__setattr__(self, "delta", float(check_delta("delta", self.delta)))
        if self.epsilon is not None:
            object.__setattr__(self, "epsilon", float(check_positive("epsilon", self.epsilon)))
        object.__setattr__(self, "adjacency", Adjacency.parse(self.adjacency).value)
        if self.across_tasks not in ACROSS_TASKS_CHOICES:
            raise InvalidParameterError(
                f"across_tasks must be one of {', '.join(ACROSS_TASKS_CHOICES)}, got {self.across_tasks!r}."
            )
        if self.total_epsilon is None and self.total_delta is not None:
            raise InvalidParameterError("total_delta is only meaningful together with total_epsilon.")
        if self.total_epsilon is not None:
            object.__setattr__(self, "total_epsilon", float(check_positive("total_epsilon", self.total_epsilon)))
        if self.total_delta is not None:
            object.__setattr__(self, "total_delta", float(check_delta("total_delta", self.total_delta)))
        if not isinstance(self.unit, str) or not self.unit.strip():
            raise InvalidParameterError(f"unit must be a non-empty name of the privacy unit, got {self.unit!r}.")
        if self.task_sizes is not None:
            object.__setattr__(self, "task_sizes", tuple(self.task_sizes))

    def replace(self, **changes: Any) -> "PrivacySettings":
        """A copy with ``changes`` (validated again), e.g. the adjacency and unit a method's events state."""
        return dataclasses.replace(self, **changes)

    def to_dict(self, *, method: str | None = None) -> dict[str, Any]:
        """The certificate's config section: the config as read when these settings come from one, otherwise
        the settings in ``dpcl run``'s layout (``[privacy]``, ``[stream]``, ``[method] name = method``, ``unit``),
        so that ``dpcl verify`` checks the guarantee against them."""
        if self.recorded is not None:
            return jsonable(self.recorded)
        privacy: dict[str, Any] = {
            "delta": self.delta,
            "adjacency": self.adjacency,
            "accountant": self.accountant,
            "across_tasks": self.across_tasks,
        }
        if self.total_epsilon is not None:
            privacy["total_epsilon"] = self.total_epsilon
            privacy["total_delta"] = self.delta if self.total_delta is None else self.total_delta
        stream: dict[str, Any] = {
            "label_space": self.label_space,
            "prior_labels": self.prior_labels,
            "disjoint_units": self.disjoint_units,
        }
        if self.task_sizes is not None:
            stream["task_sizes"] = list(self.task_sizes)
        return {"privacy": privacy, "stream": stream, "method": {"name": method}, "unit": self.unit}


def privacy_settings(privacy: "PrivacySettings | Mapping[str, Any] | None") -> PrivacySettings:
    """``privacy`` as :class:`PrivacySettings`: settings are returned as they are; a ``[privacy]`` mapping (the
    config's keys, plus ``unit``; ``epsilon`` and ``delta`` may be left out, for the specs that need neither) is
    validated as :func:`parse_config` validates the section (problems raise ConfigError naming the key)."""
    if isinstance(privacy, PrivacySettings):
        return privacy
    if privacy is None:
        privacy = {}
    if not isinstance(privacy, Mapping):
        raise ConfigError(f"[privacy] must be a table of settings, got {type(privacy).__name__}.")
    section = dict(privacy)
    unit = section.pop("unit", "example")
    if not isinstance(unit, str) or not unit.strip():
        raise ConfigError(f"[privacy] unit must be a non-empty name of the privacy unit, got {unit!r}.")
    return PrivacySettings(**parse_privacy(section, required=()), unit=unit)


def config_disagreements(
    config: Any, g: Any, group_accountants: Sequence[str], what: str = "guarantee"
) -> list[str]:
    """Disagreements between a stated guarantee (its ``delta`` and ``across_tasks``) and the privacy settings of the
    recorded config.

    Only keys the config states are compared; a config without ``[privacy]`` / ``[stream]`` (e.g. a
    certificate built from Python without one) has nothing to disagree with.
    """
    if not isinstance(config, Mapping):
        return [f"config must be an object, got {type(config).__name__}"]
    privacy = config.get("privacy") if isinstance(config.get("privacy"), Mapping) else {}
    stream = config.get("stream") if isinstance(config.get("stream"), Mapping) else {}
    problems: list[str] = []
    if "delta" in privacy and privacy["delta"] != g.delta:
        problems.append(f"config [privacy] delta = {privacy['delta']!r} but the {what} states delta {g.delta!r}")
    if g.across_tasks == "parallel":
        if stream.get("disjoint_units") is False:
            problems.append(
                f"the {what} states parallel composition (Thm 4.4) but the config says disjoint_units = false"
            )
        if privacy.get("across_tasks") == "sequential":
            problems.append(
                f"the {what} states parallel composition but the config asks across_tasks = 'sequential'"
            )
    if privacy:
        asked = privacy.get("accountant", "auto")
        other = sorted({a for a in group_accountants if a != asked})
        if other:
            problems.append(f"config [privacy] accountant = {asked!r} but the {what}'s groups were accounted with {other}")
    return problems
