"""The TOML training config: loading and validation of ``[privacy]``, ``[stream]`` and ``[method]``.

Schema (every key is documented in ``docs/guarantees.md``)::

    [privacy]
    epsilon = 1.0              # per-task (per-release) budget, > 0
    delta = 1e-5               # in (0, 1)
    adjacency = "add_remove"   # or "replace_one"
    accountant = "prv"         # prv | pld | rdp | auto
    across_tasks = "auto"      # auto | parallel | sequential
    total_epsilon = 4.0        # optional: privacy filter over the whole stream
    total_delta = 1e-5         # optional (with total_epsilon): the filter's delta budget, default delta
    [stream]
    dataset = "digits"
    tasks = [[0, 1], [2, 3]]
    label_space = "prior_const"  # data | prior | prior_const
    prior_labels = [[0, 1], [2, 3]]
    disjoint_units = true
    task_sizes = [300, 290]    # optional: training examples per task after label filtering
    [method]
    name = "peft_ensemble"     # keys below come from the method's MethodSpec
    epochs = 2
    batch_size = 64
    max_grad_norm = 1.0
    [run]                      # optional, read by ``dpcl run`` (see RUN_KEYS)
    private = true
    reproducible_noise = false

The guarantees layer validates the privacy section, the guarantee keys of
``[stream]`` and the ``[method]`` section (keys come from
:func:`dpcl.guarantees.method_schema.get_method_spec`). The data keys of
``[stream]`` belong to the data layer; the caller passes their names
(``data_stream_keys``) so that unknown keys are still refused by name. The
``[run]`` section is read by ``dpcl run``; its keys (:data:`RUN_KEYS`) are
validated here too, so ``dpcl audit`` refuses a misspelt key and sees
``private = false`` (a run without any privacy guarantee).

Every problem raises :class:`~dpcl.errors.ConfigError` naming the key and what
is allowed. Privacy *violations* (``label_space = "data"``...) are not raised
here: they are reported by :mod:`dpcl.audit_config`.
"""

from __future__ import annotations

import math
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Mapping

from dpcl._io.atomic_io import FileTooLargeError, JsonLimitError, check_nesting, read_bytes_limited
from dpcl.accounting.accountants.registry import TRAINING_CHOICES
from dpcl.accounting.validation import describe_number, integer_beyond_float
from dpcl.errors import ConfigError, InvalidParameterError
from dpcl.guarantees.label_space import output_label_sets
from dpcl.guarantees.method_schema import METHOD_SPECS, REQUIRED, MethodSpec, get_method_spec
from dpcl.guarantees.settings import (
    ACROSS_TASKS_CHOICES,
    CONFIG_ACCOUNTANTS,
    PRIVACY_KEYS,
    PrivacySettings,
    choice as _choice,
    jsonable as _jsonable,
    number as _number,
    parse_privacy as _parse_privacy,
    privacy_settings,
    unknown_keys as _unknown,
)

__all__ = [
    "MAX_COMPOSED_TASKS",
    "MAX_TASKS",
    "PRIVACY_KEYS",
    "GUARANTEE_STREAM_KEYS",
    "CONFIG_ACCOUNTANTS",
    "ACROSS_TASKS_CHOICES",
    "RUNNER_SECTIONS",
    "RUN_KEYS",
    "PrivacySettings",
    "TrainingConfig",
    "load_config",
    "parse_config",
    "privacy_settings",
]

LABEL_SPACES = ("data", "prior", "prior_const")
#: Sections read by ``dpcl run`` rather than by the audit; their keys are validated here all the same.
RUNNER_SECTIONS = ("run",)

#: ``[run]`` keys: name -> (type, default, help). ``dpcl run`` reads them; ``dpcl audit`` reports
#: ``private = false`` as a run without any differential-privacy guarantee.
RUN_KEYS: dict[str, tuple[type, Any, str]] = {
    "private": (
        bool,
        True,
        "false trains a non-private reference model (no noise, no clipping); its releases carry a "
        "statement that they are NOT differentially private instead of a certificate",
    ),
    "reproducible_noise": (
        bool,
        False,
        "true draws the privacy noise and Poisson sampling from the recorded seed (research reproducibility; every "
        "certificate then says the release is private only against someone who does not know the seed); false "
        "(default) draws them from OS entropy that is recorded nowhere",
    ),
}

#: ``[stream]`` keys interpreted by the guarantees layer: name -> (default, help).
GUARANTEE_STREAM_KEYS: dict[str, tuple[Any, str]] = {
    "dataset": (REQUIRED, "dataset name (see docs/data.md), or any name when task_sizes is given"),
    "tasks": (None, "label groups, one list of integer labels per task"),
    "label_space": (REQUIRED, "output label space: 'prior' or 'prior_const' ('data' is not DP, Prop. 4.6)"),
    "prior_labels": (None, "public labels: one list per task ('prior') or one list / list of lists "
                           "('prior_const')"),
    "disjoint_units": (REQUIRED, "true when no privacy unit (person, document...) occurs in two tasks"),
    "task_sizes": (None, "optional training examples per task after label filtering, integers >= 0"),
}


@dataclass(frozen=True)
class TrainingConfig:
    """A validated config. ``method`` has every method key filled with its default, plus ``encoder`` (the
    ``[stream] encoder`` directory) when the stream names one, so that plans can name the public encoder.
    ``settings`` holds ``[privacy]`` and the label-space keys of ``[stream]`` (:class:`PrivacySettings`)."""

    settings: PrivacySettings
    stream: Mapping[str, Any]
    method: Mapping[str, Any]
    spec: MethodSpec
    source: str = "<config>"
    raw: Mapping[str, Any] = field(default_factory=dict)
    run: Mapping[str, Any] = field(default_factory=lambda: {k: v[1] for k, v in RUN_KEYS.items()})

    @property
    def private(self) -> bool:
        """False for ``[run] private = false``: the run adds no noise and has no DP guarantee."""
        return bool(self.run.get("private", True))

    @property
    def n_tasks(self) -> int:
        if self.stream.get("tasks") is not None:
            return len(self.stream["tasks"])
        if self.stream.get("task_sizes") is not None:
            return len(self.stream["task_sizes"])
        return int(self.stream.get("n_tasks", 0))

    def to_dict(self) -> dict[str, Any]:
        """The config as read (JSON-able), for certificates."""
        return _jsonable(self.raw)


def _raw_feature_dataset(dataset: Any) -> bool:
    """True for datasets whose features are raw pixels (digits, image folders, CIFAR, IDX files); the text datasets
    are MiniLM features or texts for a pre-trained model (dpcl.data.registry)."""
    return isinstance(dataset, str) and (
        dataset == "digits" or dataset.startswith(("image_folder:", "cifar:", "idx:"))
    )


def _refuse_integers_beyond_float(raw: Mapping[str, Any]) -> None:
    """Refuse (ConfigError naming the key) an integer of the config beyond float range (|n| > ~1.8e308)."""
    found = integer_beyond_float(dict(raw))
    if found is None:
        return
    path, value = found
    keys = [p for p in path if not isinstance(p, int)]
    where = (f"[{keys[0]}] " if len(keys) > 1 else "") + ".".join(str(k) for k in keys[1:] or keys)
    where += "".join(f"[{p}]" for p in path if isinstance(p, int))
    raise ConfigError(f"{where} must be a number within float range (~1.8e308), got {describe_number(value)}.")


def _table(raw: Mapping[str, Any], name: str) -> Mapping[str, Any]:
    if name not in raw:
        raise ConfigError(f"the config needs a [{name}] section.")
    section = raw[name]
    if not isinstance(section, Mapping):
        raise ConfigError(f"[{name}] must be a table, got {type(section).__name__}.")
    return section


def _int_list(where: str, value: Any, minimum: int) -> list[int]:
    if not isinstance(value, list):
        raise ConfigError(f"{where} must be a list of integers, got {value!r}.")
    for v in value:
        if isinstance(v, bool) or not isinstance(v, int) or v < minimum:
            raise ConfigError(f"{where} must contain integers >= {minimum}, got {v!r}.")
    return list(value)


def _parse_stream(section: Mapping[str, Any], data_stream_keys: Iterable[str] | None) -> dict[str, Any]:
    data_keys = [k for k in (data_stream_keys or ()) if k not in GUARANTEE_STREAM_KEYS]
    _unknown("stream", section, [*GUARANTEE_STREAM_KEYS, *data_keys])
    out: dict[str, Any] = {k: v for k, v in section.items() if k in data_keys}
    for key, (default, help_text) in GUARANTEE_STREAM_KEYS.items():
        if key not in section:
            if default is REQUIRED:
                raise ConfigError(f"[stream] {key} is required: {help_text}.")
            out[key] = default
    if not isinstance(section["dataset"], str) or not section["dataset"].strip():
        raise ConfigError(f"[stream] dataset must be a non-empty string, got {section['dataset']!r}.")
    out["dataset"] = section["dataset"]
    if "tasks" in section:
        tasks = section["tasks"]
        if not isinstance(tasks, list) or not tasks:
            raise ConfigError(f"[stream] tasks must be a non-empty list of label lists, got {tasks!r}.")
        out["tasks"] = [_int_list(f"[stream] tasks[{i}]", t, 0) for i, t in enumerate(tasks)]
    out["label_space"] = _choice("stream", "label_space", section["label_space"], LABEL_SPACES)
    if not isinstance(section["disjoint_units"], bool):
        raise ConfigError(f"[stream] disjoint_units must be true or false, got {section['disjoint_units']!r}.")
    out["disjoint_units"] = section["disjoint_units"]
    if "prior_labels" in section:
        prior = section["prior_labels"]
        if not isinstance(prior, list):
            raise ConfigError(f"[stream] prior_labels must be a list, got {prior!r}.")
        out["prior_labels"] = prior
    elif out["label_space"] != "data":
        raise ConfigError(
            f"[stream] prior_labels is required when label_space = {out['label_space']!r}: "
            + GUARANTEE_STREAM_KEYS["prior_labels"][1] + "."
        )
    if "task_sizes" in section:
        sizes = _int_list("[stream] task_sizes", section["task_sizes"], 0)
        if not sizes:
            raise ConfigError("[stream] task_sizes must give one size per task, got an empty list.")
        if out.get("tasks") is not None and len(sizes) != len(out["tasks"]):
            raise ConfigError(
                f"[stream] task_sizes gives {len(sizes)} sizes for {len(out['tasks'])} tasks; give one per task."
            )
        n_tasks = section.get("n_tasks")
        if isinstance(n_tasks, int) and not isinstance(n_tasks, bool) and n_tasks != len(sizes):
            # the audit plans one task per size: fewer sizes than tasks would leave tasks unaccounted
            raise ConfigError(
                f"[stream] task_sizes gives {len(sizes)} sizes but n_tasks = {n_tasks}; give one size per task."
            )
        out["task_sizes"] = sizes
    return out


def _parse_method(section: Mapping[str, Any]) -> tuple[dict[str, Any], MethodSpec]:
    if "name" not in section:
        raise ConfigError(f"[method] name is required: one of {', '.join(METHOD_SPECS)}.")
    name = section["name"]
    if not isinstance(name, str):
        raise ConfigError(f"[method] name must be one of {', '.join(METHOD_SPECS)}; got {name!r}.")
    spec = get_method_spec(name)
    keys = {k.name: k for k in spec.keys}
    _unknown("method", [k for k in section if k != "name"], keys)
    out: dict[str, Any] = {"name": name}
    for key_name, key in keys.items():
        if key_name not in section:
            if key.default is REQUIRED:
                raise ConfigError(f"[method] {key_name} is required for method {name!r}: {key.help}.")
            out[key_name] = key.default
            continue
        value = section[key_name]
        types = key.type if isinstance(key.type, tuple) else (key.type,)
        if float in types and isinstance(value, int) and not isinstance(value, bool):
            value = float(value)
        bool_ok = bool in types
        if (isinstance(value, bool) and not bool_ok) or not isinstance(value, types):
            expected = " or ".join(t.__name__ for t in types)
            raise ConfigError(f"[method] {key_name} must be {expected} for method {name!r} ({key.help}); got {value!r}.")
        if key.check is not None:
            problem = key.check(value)
            if problem:
                raise ConfigError(f"[method] {key_name} must be {problem} for method {name!r}; got {value!r}.")
        out[key_name] = value
    return out, spec


def _parse_run(section: Mapping[str, Any]) -> dict[str, Any]:
    """``[run]`` with every key of :data:`RUN_KEYS` filled in; unknown keys and wrong types raise ConfigError."""
    _unknown("run", section, RUN_KEYS)
    out: dict[str, Any] = {}
    for key, (kind, default, help_text) in RUN_KEYS.items():
        value = section.get(key, default)
        if not isinstance(value, kind):
            raise ConfigError(f"[run] {key} must be {kind.__name__} ({help_text}); got {value!r}.")
        out[key] = value
    return out


#: Most tasks a config may have when every release adds one task's composition (parallel composition over
#: disjoint units, each task trained on its own data). Equal-size tasks share one calibration and one
#: accounting, so ``dpcl audit`` of 10^4 DP-SGD tasks of 10^5 steps each answers in seconds
#: (``benchmarks/bench_bookkeeping.py``).
MAX_TASKS = 10_000
#: Most tasks when every release composes the events of all earlier tasks anew (sequential composition, or a
#: method that trains on the union of the tasks so far): the audit then runs the accountant once per release on
#: a growing composition, and a hundred DP-SGD tasks already take tens of seconds.
MAX_COMPOSED_TASKS = 100


def _check_task_count(stream: Mapping[str, Any], settings: PrivacySettings, spec: MethodSpec) -> None:
    """Refuse a stream of more tasks than :data:`MAX_TASKS` (:data:`MAX_COMPOSED_TASKS` when every release
    composes all earlier tasks) up front, naming the key that sets the count."""
    composed = (
        settings.across_tasks == "sequential"
        or not settings.disjoint_units
        or bool(getattr(spec, "reuses_past_tasks", False))
    )
    limit = MAX_COMPOSED_TASKS if composed else MAX_TASKS
    for key in ("tasks", "task_sizes", "n_tasks"):
        value = stream.get(key)
        count = len(value) if isinstance(value, list) else value
        if isinstance(count, int) and not isinstance(count, bool) and count > limit:
            if composed:
                why = (
                    f"at most {MAX_COMPOSED_TASKS} tasks when every release composes all earlier tasks (sequential "
                    "composition, disjoint_units = false, or a method that trains on the union of the tasks so far), "
                    "since each release is then accounted anew and a longer stream would not be audited in a minute"
                )
                hint = (
                    f"group the stream into at most {MAX_COMPOSED_TASKS} tasks (several classes or shards per task), "
                    f"or, if the tasks hold disjoint privacy units, set disjoint_units = true for parallel composition "
                    f"(up to {MAX_TASKS} tasks)"
                )
            else:
                why = f"at most {MAX_TASKS} tasks per config"
                hint = f"group the stream into at most {MAX_TASKS} tasks (several classes or shards per task)"
            raise ConfigError(f"[stream] {key} gives {count} tasks; dpcl audits and trains {why}. Hint: {hint}.")


def parse_config(
    raw: Mapping[str, Any],
    *,
    source: str = "<config>",
    data_stream_keys: Iterable[str] | None = None,
) -> TrainingConfig:
    """Validate a config already parsed from TOML (a dict)."""
    if not isinstance(raw, Mapping):
        raise ConfigError(f"{source}: a config must be a TOML table, got {type(raw).__name__}.")
    _refuse_integers_beyond_float(raw)
    sections = ("privacy", "stream", "method", *RUNNER_SECTIONS)
    unknown = sorted(set(raw) - set(sections))
    if unknown:
        raise ConfigError(
            f"unknown top-level section(s) or key(s) {', '.join(unknown)}; a config has the sections "
            f"{', '.join(f'[{name}]' for name in sections)}."
        )
    for name in RUNNER_SECTIONS:
        if name in raw and not isinstance(raw[name], Mapping):
            raise ConfigError(f"[{name}] must be a table, got {type(raw[name]).__name__}.")
    run = _parse_run(raw.get("run", {}))
    privacy = _parse_privacy(_table(raw, "privacy"))
    stream = _parse_stream(_table(raw, "stream"), data_stream_keys)
    settings = PrivacySettings(
        **privacy, label_space=stream["label_space"], prior_labels=stream.get("prior_labels"),
        disjoint_units=stream["disjoint_units"], recorded=dict(raw),
    )
    method, spec = _parse_method(_table(raw, "method"))
    if stream.get("tasks") is None and stream.get("task_sizes") is None and "n_tasks" not in stream:
        raise ConfigError("[stream] tasks is required (one list of labels per task), or give task_sizes.")
    _check_task_count(stream, settings, spec)
    if stream.get("encoder") is not None:
        # the plan names the public encoder it assumes (dpcl.guarantees.public_encoder), so audit and certificates
        # state which one; [method] cannot set this key itself (it is not a method key)
        method["encoder"] = stream["encoder"]
    elif _raw_feature_dataset(stream.get("dataset")):
        # no encoder at all: the plan must not claim a pre-trained one (dpcl.guarantees.public_encoder)
        method["raw_features"] = True
    config = TrainingConfig(
        settings=settings, stream=stream, method=method, spec=spec, source=source, raw=dict(raw), run=run
    )
    if settings.label_space != "data":
        # the public label sets the runner filters with: integer labels, one list per task under 'prior'
        try:
            n_tasks = config.n_tasks
        except (TypeError, ValueError):  # a malformed data-layer n_tasks is the data layer's to report
            n_tasks = 0
        if n_tasks > 0:
            output_label_sets(settings.label_space, settings.prior_labels, n_tasks)
    return config


#: Largest config file :func:`load_config` parses (a thousand-task config is a few tens of KiB).
MAX_CONFIG_BYTES = 1024 * 1024
#: Deepest nesting of tables and arrays in a config (dpcl's own configs nest at most 4 levels).
MAX_CONFIG_DEPTH = 16


def load_config(
    path: "str | Path", *, data_stream_keys: Iterable[str] | None = None
) -> TrainingConfig:
    """Read and validate a TOML config file; problems raise ConfigError (exit code 2).

    A file larger than :data:`MAX_CONFIG_BYTES` is refused before it is parsed, and one nesting tables or
    arrays deeper than :data:`MAX_CONFIG_DEPTH` levels while or after it is parsed, so a hostile config cannot
    exhaust memory or the stack.
    """
    p = Path(path)
    try:
        text = read_bytes_limited(p, MAX_CONFIG_BYTES, "config file").decode("utf-8")
    except FileNotFoundError:
        raise ConfigError(f"config file {str(p)!r} does not exist.") from None
    except FileTooLargeError as exc:
        raise ConfigError(f"{exc}.") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"config file {str(p)!r} cannot be read: {exc}.") from None
    text = text.removeprefix("\ufeff")  # a byte-order mark, as some editors write UTF-8 files
    try:
        raw = tomllib.loads(text)
        check_nesting(raw, MAX_CONFIG_DEPTH)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"config file {str(p)!r} is not valid TOML: {exc}.") from None
    except (RecursionError, JsonLimitError):
        raise ConfigError(
            f"config file {str(p)!r} nests tables or arrays deeper than {MAX_CONFIG_DEPTH} levels; a dpcl config "
            "nests at most 4 (see docs/guarantees.md)."
        ) from None
    try:
        return parse_config(raw, source=str(p), data_stream_keys=data_stream_keys)
    except ConfigError:
        raise
    except InvalidParameterError as exc:
        raise ConfigError(f"{p}: {exc}") from None
