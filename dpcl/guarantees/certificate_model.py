"""The certificate as typed data: versioned frozen dataclasses with one ``from_json`` and one ``to_json``.

A certificate file (docs/guarantees.md, "Certificates") is read into a :class:`Certificate`:

* :class:`Release` -- which task's release and which method;
* :class:`Guarantee` -- the headline, the guarantee of the released checkpoint (``private`` true with ``basis``,
  or false with ``reasons``);
* :class:`ScopedGuarantee` -- a statement about something narrower than the checkpoint, with its own events;
* :class:`CompositionGroup` -- one composition group of a stated guarantee (tasks, charges, epsilon, accountant);
* :class:`LabelSpace` and :class:`CheckpointRef` -- the label-space policy and the hash of the checkpoint;
* the charged events (``events``) as written, parsed once into ledger charges (:meth:`Certificate.charges`).

Each attribute is declared once with :func:`json_field`: the JSON key, how its value is validated (a
:class:`~dpcl.errors.MalformedCertificateError` naming the field), whether older files may lack it, and
optionally the verification rule that checks it (see :meth:`JsonModel.field_rules`). :meth:`JsonModel.from_json`
and :meth:`JsonModel.to_json` walk these declarations, so the JSON keys keep their declared order and a
certificate written by :func:`dpcl.guarantees.certificates.write_certificate` is unchanged byte for byte.

Versions. This dpcl writes version 2, or version 3 when a list of charges stores a run of equal charges once
(``"repeat"``). Older versions are brought to the current layout by :data:`MIGRATIONS` before validation;
:attr:`Certificate.version` stays the version the file states (verification reports it), and the content
hash of a certificate read from a file is always taken over the file's own content (:attr:`Certificate.source`).

Adding a field: one :func:`json_field` attribute (``optional=True``: certificates written before it lack it)
with its ``verify`` rule; docs/guarantees.md, "Adding a certificate field", shows it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, fields
from typing import Any, Callable, ClassVar, Iterable, Iterator, Mapping

from dpcl.accounting.validation import FLOAT_MAX_INTEGER
from dpcl.errors import InvalidParameterError, MalformedCertificateError
from dpcl.guarantees.ledger import ACROSS_TASKS, Charge, charges_from_list, check_indices, expand_indices

__all__ = [
    "CERTIFICATE_FORMAT", "CERTIFICATE_VERSION", "REPEATED_CHARGES_VERSION", "READABLE_VERSIONS", "MIGRATIONS",
    "Reading", "JsonModel", "json_field", "Release", "LabelSpace", "CheckpointRef", "CompositionGroup",
    "Guarantee", "ScopedGuarantee", "Certificate", "accepting", "number", "string", "sentence", "nullable",
]

CERTIFICATE_FORMAT = "dpcl-certificate"
#: Version this dpcl writes: 2 (headline = the checkpoint, ``private``, ``reasons``, ``scoped_guarantees``).
CERTIFICATE_VERSION = 2
#: Version written instead when a list of charges holds a run of equal consecutive charges stored once with
#: ``"repeat": n`` (otherwise the same as version 2), so that a dpcl which would not expand it refuses the file.
REPEATED_CHARGES_VERSION = 3
#: Versions this dpcl reads and verifies (1: headline always private, no scoped statements).
READABLE_VERSIONS = (1, 2, 3)


def _v1_to_v2(data: dict[str, Any]) -> dict[str, Any]:
    """Version 1 had no ``private`` (every headline was private), no ``basis`` and no ``scoped_guarantees``."""
    out = dict(data)
    if isinstance(out.get("guarantee"), dict):
        out["guarantee"] = {"private": True, **{k: v for k, v in out["guarantee"].items() if k != "private"}}
    out.setdefault("scoped_guarantees", [])
    return out


#: Migration table: ``version -> (next layout version, function)`` bringing a certificate (a JSON object) of
#: that version to the layout of the next; applied in turn until the current layout (versions 2 and 3 share
#: it: 3 only adds ``"repeat"``). The stated ``version`` is kept, so version-dependent rules still apply.
MIGRATIONS: dict[int, tuple[int, Callable[[dict[str, Any]], dict[str, Any]]]] = {1: (2, _v1_to_v2)}


@dataclass(frozen=True)
class Reading:
    """What parsing one file needs to know: the version the file states (version-dependent rules)."""

    version: int = CERTIFICATE_VERSION


def _malformed(where: str, what: str) -> MalformedCertificateError:
    return MalformedCertificateError(f"certificate {where} {what}.")


def _at(where: str, key: str | int) -> str:
    if isinstance(key, int):
        return f"{where}[{key}]"
    return f"{where}.{key}" if where else key


# -- value parsers: (value, where, reading) -> value, raising MalformedCertificateError naming ``where`` ----------
def is_json_number(value: Any) -> bool:
    """A finite JSON number that a float holds (an integer beyond float range is not one)."""
    return (isinstance(value, (int, float)) and not isinstance(value, bool)
            and (isinstance(value, float) or abs(value) <= FLOAT_MAX_INTEGER) and math.isfinite(value))


Parser = Callable[[Any, str, Reading], Any]


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else f"{text[:77]}..."


def accepting(test: Callable[[Any], bool], what: str, convert: Callable[[Any], Any] = lambda v: v) -> Parser:
    """A parser that keeps (``convert``-ed) a value for which ``test`` holds and refuses any other as not ``what``."""
    def parse(value: Any, where: str, reading: Reading) -> Any:
        if not test(value):
            raise _malformed(where, f"must be {what}, got {_short(value)}")
        return convert(value)

    return parse


def _is_sentence(value: Any) -> bool:
    return isinstance(value, str) and bool(value.strip())


any_json = accepting(lambda v: True, "any JSON value")
number = accepting(is_json_number, "a finite number")
integer = accepting(lambda v: isinstance(v, int) and not isinstance(v, bool), "an integer")
string = accepting(lambda v: isinstance(v, str), "a string")
boolean = accepting(lambda v: isinstance(v, bool), "true or false")
sentence = accepting(_is_sentence, "a non-empty sentence")
scope_sentence = accepting(_is_sentence, "a scope sentence saying what the statement covers (and what it does not)")
sentences = accepting(lambda v: isinstance(v, list) and all(isinstance(a, str) for a in v), "a list of sentences",
                      tuple)
json_object = accepting(lambda v: isinstance(v, dict), "an object")
objects = accepting(lambda v: isinstance(v, list) and all(isinstance(x, dict) for x in v), "a list of objects",
                    tuple)


def nullable(parse: Callable[[Any, str, Reading], Any]) -> Callable[[Any, str, Reading], Any]:
    """``parse``, or None for a JSON null."""
    def parse_or_null(value: Any, where: str, reading: Reading) -> Any:
        return None if value is None else parse(value, where, reading)

    return parse_or_null


def models(cls: "type[JsonModel]") -> Callable[[Any, str, Reading], tuple[Any, ...]]:
    """A list of ``cls`` objects."""
    def parse_models(value: Any, where: str, reading: Reading) -> tuple[Any, ...]:
        if not isinstance(value, list):
            raise _malformed(where, "must be a list of objects")
        return tuple(cls.from_json(x, _at(where, i), reading) for i, x in enumerate(value))

    return parse_models


def model(cls: "type[JsonModel]") -> Callable[[Any, str, Reading], Any]:
    return lambda value, where, reading: cls.from_json(value, where, reading)


def index_list(value: Any, where: str, reading: Reading) -> Any:
    """Increasing indices, plain or compacted (:func:`~dpcl.guarantees.ledger.compact_indices`)."""
    try:
        check_indices(value, where)
    except (InvalidParameterError, TypeError, ValueError) as exc:
        raise _malformed(where, f"must be a list of indices: {exc}") from None
    return value


#: Rule of one field: ``rule(owner, context)`` returns the verification checks of the field; ``owner`` is the
#: object holding it, ``context`` the state of the verification (:class:`dpcl.guarantees.certificates.Verifying`).
FieldRule = Callable[[Any, Any], Iterable[Any]]


def json_field(
    parse: Callable[[Any, str, Reading], Any],
    *,
    key: str | None = None,
    optional: bool = False,
    default: Any = None,
    verify: FieldRule | None = None,
) -> Any:
    """Declare a certificate attribute: ``parse`` validates its JSON value (and returns the typed value), ``key``
    names it in JSON (default: the attribute's name). ``optional``: files may lack it (then it is ``default``
    and :meth:`JsonModel.to_json` leaves out a None); a field added to the format is optional, so certificates
    written before it still read. ``verify`` is its verification rule, run by ``dpcl verify``."""
    metadata = {"parse": parse, "key": key, "optional": optional, "verify": verify}
    if optional:
        return field(default=default, metadata=metadata)
    return field(metadata=metadata)


def _dump(value: Any) -> Any:
    if isinstance(value, JsonModel):
        return value.to_json()
    if isinstance(value, tuple):
        return [_dump(x) for x in value]
    if isinstance(value, dict):
        return dict(value)
    if isinstance(value, list):
        return list(value)
    return value


_DECLARED: dict[type, tuple[Any, ...]] = {}


class JsonModel:
    """Base of the certificate dataclasses: JSON in and out through the :func:`json_field` declarations.

    ``json_order`` lists keys that come first in JSON, in that order; the other fields follow in declaration
    order (so a subclass's new field comes last)."""

    json_order: ClassVar[tuple[str, ...]] = ()

    @classmethod
    def _declared(cls) -> tuple[Any, ...]:
        """The :func:`json_field` fields in JSON order (computed once per class)."""
        cached = _DECLARED.get(cls)
        if cached is None:
            declared = [f for f in fields(cls) if "parse" in f.metadata]  # type: ignore[arg-type]
            first = {name: i for i, name in enumerate(cls.json_order)}
            cached = _DECLARED[cls] = tuple(sorted(declared, key=lambda f: first.get(f.name, len(first))))
        return cached

    @staticmethod
    def _key(f: Any) -> str:
        return f.metadata["key"] or f.name

    @classmethod
    def from_json(cls, data: Any, where: str = "", reading: Reading | None = None) -> Any:
        """Validate ``data`` (a JSON object) and build the typed object; malformed input raises
        :class:`~dpcl.errors.MalformedCertificateError` naming the field (``where`` is the path to ``data``)."""
        reading = reading or Reading()
        if not isinstance(data, dict):
            raise _malformed(where or "", f"must be an object, got {type(data).__name__}")
        declared = cls._declared()
        missing = [cls._key(f) for f in declared if not f.metadata["optional"] and cls._key(f) not in data]
        if missing:
            raise MalformedCertificateError(
                f"certificate {where + ' ' if where else ''}lacks required field(s): {', '.join(missing)}."
            )
        values = {
            f.name: f.metadata["parse"](data[cls._key(f)], _at(where, cls._key(f)), reading)
            for f in declared
            if cls._key(f) in data
        }
        made = cls(**values)
        made.check(where, reading)
        return made

    def check(self, where: str, reading: Reading) -> None:
        """Rules between fields (after each field's own parse); raise MalformedCertificateError."""

    def to_json(self) -> dict[str, Any]:
        """The JSON object (keys in their declared order; an optional field that is None is left out)."""
        out: dict[str, Any] = {}
        for f in self._declared():
            value = getattr(self, f.name)
            if value is None and f.metadata["optional"]:
                continue
            out[self._key(f)] = _dump(value)
        return out

    def field_rules(self) -> Iterator[tuple[Any, FieldRule]]:
        """``(owner, rule)`` for every field with a ``verify`` rule, here and in the objects held (depth first)."""
        for f in self._declared():
            if f.metadata["verify"] is not None:
                yield self, f.metadata["verify"]
            value = getattr(self, f.name)
            for item in value if isinstance(value, tuple) else (value,):
                if isinstance(item, JsonModel):
                    yield from item.field_rules()


@dataclass(frozen=True, kw_only=True)
class Release(JsonModel):
    """Which release the certificate is about: the task after which it was released, and the method."""

    task_index: int = json_field(integer)
    method: str = json_field(string)


@dataclass(frozen=True, kw_only=True)
class LabelSpace(JsonModel):
    """The label-space policy (Tobaben et al., Prop. 4.6/4.7) and the public filter counts of each task."""

    policy: str = json_field(string)
    filtered: tuple[dict[str, Any], ...] = json_field(objects)


@dataclass(frozen=True, kw_only=True)
class CheckpointRef(JsonModel):
    """The released checkpoint: its path (relative to the certificate once written) and SHA-256."""

    path: Any = json_field(any_json)
    sha256: Any = json_field(any_json)


@dataclass(frozen=True, kw_only=True)
class CompositionGroup(JsonModel):
    """One composition group of a stated guarantee: its tasks, charges, epsilon and accountant.

    ``tasks`` and ``charges`` are kept as written (plain lists, or compact runs in version 3)."""

    tasks: Any = json_field(index_list)
    charges: Any = json_field(index_list, optional=True)
    epsilon: float = json_field(number)
    accountant: str = json_field(string)
    requested_accountant: str | None = json_field(string, optional=True)

    json_order = ("tasks", "charges", "epsilon", "accountant", "requested_accountant")

    @property
    def task_indices(self) -> tuple[int, ...]:
        return expand_indices(self.tasks, "group tasks")

    @property
    def asked_accountant(self) -> str:
        """The accountant the group asked for (``auto`` re-runs its own comparison when recomputed)."""
        return self.accountant if self.requested_accountant is None else self.requested_accountant


#: Keys of a stated guarantee, shared by the headline and the scoped statements.
STATEMENT_KEYS = ("epsilon", "delta", "adjacency", "unit", "accountant", "across_tasks", "composition", "groups",
                  "notes")


@dataclass(frozen=True, kw_only=True)
class _Statement(JsonModel):
    """Epsilon, delta, relation, unit, accountant, composition across tasks and groups of a stated guarantee."""

    epsilon: float | None = json_field(nullable(number))
    delta: float | None = json_field(nullable(number))
    adjacency: str | None = json_field(nullable(string))
    unit: str | None = json_field(nullable(string))
    accountant: str | None = json_field(nullable(string))
    across_tasks: str | None = json_field(nullable(string))
    composition: str | None = json_field(nullable(string))
    groups: tuple[CompositionGroup, ...] = json_field(models(CompositionGroup))
    notes: tuple[str, ...] = json_field(sentences)

    def _check_stated(self, where: str) -> None:
        """A stated (private) guarantee: a finite epsilon, delta in (0, 1), a known composition across tasks."""
        absent = [k for k in ("epsilon", "delta", "adjacency", "unit", "accountant", "across_tasks")
                  if getattr(self, k) is None]
        if absent:
            raise _malformed(where, f"must state {', '.join(absent)} (a private guarantee states epsilon, delta, "
                             "adjacency, unit, accountant, across_tasks and groups)")
        if self.across_tasks not in ACROSS_TASKS:
            raise _malformed(_at(where, "across_tasks"),
                             f"must be one of {', '.join(ACROSS_TASKS)}, got {self.across_tasks!r}")
        if not 0 < self.delta < 1:  # type: ignore[operator]
            raise _malformed(_at(where, "delta"), f"must be a number in (0, 1), got {self.delta!r}")


@dataclass(frozen=True, kw_only=True)
class Guarantee(_Statement):
    """The headline: the guarantee of the released checkpoint.

    ``private`` true: the checkpoint is a post-processing of the charged events (``basis`` says why; version 1
    did not state it) and the statement fields are set. ``private`` false: no epsilon bounds the checkpoint,
    the statement fields are null, ``groups`` empty, and ``reasons`` say why."""

    private: bool = json_field(boolean)
    basis: str | None = json_field(sentence, optional=True)
    reasons: tuple[str, ...] | None = json_field(sentences, optional=True)

    json_order = ("private", "basis", *STATEMENT_KEYS, "reasons")

    def check(self, where: str, reading: Reading) -> None:
        if self.private:
            self._check_stated(where)
            if reading.version >= 2 and self.basis is None:
                raise _malformed(_at(where, "basis"), "is missing: a private certificate must state its coverage "
                                 "basis (why the checkpoint is a post-processing of the charged events)")
            return
        if self.epsilon is not None:
            raise _malformed(_at(where, "epsilon"),
                             f"must be null: a certificate whose checkpoint is not private states epsilon null, "
                             f"got {self.epsilon!r}")
        if not self.reasons or not all(r.strip() for r in self.reasons):
            raise _malformed(_at(where, "reasons"), "must be a non-empty list of sentences (why the checkpoint is "
                             "not private)")
        if self.groups:
            raise _malformed(_at(where, "groups"), "must be empty: a certificate whose checkpoint is not private "
                             "states no headline groups (statements about narrower releases belong in "
                             "scoped_guarantees)")


def _parse_charges(value: Any, where: str, reading: Reading) -> tuple[dict[str, Any], ...]:
    """A list of charges as :func:`~dpcl.guarantees.ledger.charges_to_list` wrote it; ``"repeat"`` from version 3."""
    entries = objects(value, where, reading)
    if reading.version < REPEATED_CHARGES_VERSION and any("repeat" in c for c in entries):
        raise _malformed(where, f"use 'repeat', which only certificate version {REPEATED_CHARGES_VERSION} may use "
                         f"(this one states version {reading.version})")
    return entries


class _HasCharges:
    """An object whose ``events`` field holds charges; :meth:`charges` parses them once."""

    events: tuple[dict[str, Any], ...]

    def charges(self, what: str = "events") -> list[Charge]:
        cached = self.__dict__.get("_charges")
        if cached is None:
            try:
                cached = charges_from_list(list(self.events), what)
            except (KeyError, TypeError, ValueError, InvalidParameterError) as exc:
                raise MalformedCertificateError(f"certificate {what} cannot be parsed: {exc}") from exc
            object.__setattr__(self, "_charges", cached)
        return cached


@dataclass(frozen=True, kw_only=True)
class ScopedGuarantee(_Statement, _HasCharges):
    """A statement about something narrower than the checkpoint (e.g. PeCL's perturbed input embeddings): its
    ``name``, ``scope`` sentence (what it covers and what not) and its own events. Never the headline."""

    name: str = json_field(sentence)
    scope: str = json_field(scope_sentence)
    events: tuple[dict[str, Any], ...] = json_field(_parse_charges)
    tolerance: dict[str, Any] | None = json_field(json_object, optional=True)

    json_order = ("name", "scope", *STATEMENT_KEYS, "events", "tolerance")

    def check(self, where: str, reading: Reading) -> None:
        self._check_stated(f"{where} ({self.name!r})")
        if not self.events:
            raise _malformed(_at(where, "events"), f"of scoped guarantee {self.name!r} must be a non-empty list")
        self.charges(f"{_at(where, 'events')} (scoped guarantee {self.name!r})")


def _parse_version(value: Any, where: str, reading: Reading) -> int:
    if isinstance(value, bool) or value not in READABLE_VERSIONS:
        raise MalformedCertificateError(
            f"certificate version {value!r} is not supported (this dpcl reads "
            f"{', '.join(str(v) for v in READABLE_VERSIONS)})."
        )
    return int(value)


def _parse_format(value: Any, where: str, reading: Reading) -> str:
    if value != CERTIFICATE_FORMAT:
        raise MalformedCertificateError(f"this is not a dpcl certificate (format must be {CERTIFICATE_FORMAT!r}).")
    return value


@dataclass(frozen=True, kw_only=True)
class Certificate(JsonModel, _HasCharges):
    """A privacy certificate of one released checkpoint (docs/guarantees.md, "Format version 2").

    ``source`` (not part of the content, not compared) is the JSON object a certificate was read from: its
    content hash and signature are checked against it, whatever layout the model has moved it to."""

    format: str = json_field(_parse_format)
    version: int = json_field(_parse_version)
    dpcl_version: Any = json_field(any_json)
    created: str | None = json_field(string, optional=True)
    release: Release | None = json_field(model(Release), optional=True)
    guarantee: Guarantee = json_field(model(Guarantee))
    scoped_guarantees: tuple[ScopedGuarantee, ...] = json_field(models(ScopedGuarantee))
    label_space: LabelSpace = json_field(model(LabelSpace))
    assumptions: tuple[str, ...] = json_field(sentences)
    events: tuple[dict[str, Any], ...] = json_field(_parse_charges)
    filter: dict[str, Any] | None = json_field(nullable(json_object))
    checkpoint: CheckpointRef | None = json_field(nullable(model(CheckpointRef)))
    tolerance: dict[str, Any] | None = json_field(json_object, optional=True)
    config: dict[str, Any] = json_field(json_object)
    extra: dict[str, Any] | None = json_field(json_object, optional=True)
    sha256: Any = json_field(any_json, optional=True)
    signature: Any = json_field(any_json, optional=True)
    source: Mapping[str, Any] | None = field(default=None, compare=False, repr=False)

    json_order = ("format", "version", "dpcl_version", "created", "release", "guarantee", "scoped_guarantees",
                  "label_space", "assumptions", "events", "filter", "checkpoint", "tolerance", "config", "extra",
                  "sha256", "signature")

    @classmethod
    def from_json(cls, data: Any, where: str = "", reading: Reading | None = None) -> "Certificate":
        """Validate a certificate (any readable version, migrated through :data:`MIGRATIONS`) and build it."""
        if not isinstance(data, dict):
            raise MalformedCertificateError(f"this is not a dpcl certificate (a JSON object): {type(data).__name__}.")
        _parse_format(data.get("format"), "format", Reading())
        version = _parse_version(data.get("version"), "version", Reading())
        layout, migrated = version, data
        while layout in MIGRATIONS:
            layout, step = MIGRATIONS[layout]
            migrated = step(migrated)
        made = super().from_json(migrated, where, Reading(version))
        object.__setattr__(made, "source", data)
        return made

    def check(self, where: str, reading: Reading) -> None:
        if self.guarantee.private and not self.events:
            raise _malformed("events", "must be a non-empty list of charges (the checkpoint is private)")
        if not self.guarantee.private and self.events:
            raise _malformed("events", "must be empty: a certificate whose checkpoint is not private states no "
                             "headline events (statements about narrower releases belong in scoped_guarantees)")
        names = [s.name for s in self.scoped_guarantees]
        if len(set(names)) != len(names):
            raise _malformed("scoped_guarantees", f"names must be distinct, got {names}")
        self.charges()

    def content(self) -> Mapping[str, Any]:
        """The JSON object whose hash is the certificate's ``sha256``: the file's own content when read from one."""
        return self.source if self.source is not None else self.to_json()
