"""Privacy certificates of released checkpoints, and their verification.

A certificate is a JSON file written next to (or near) a released checkpoint.
Its headline, ``guarantee``, is the guarantee of **the released checkpoint**
and of nothing narrower:

* ``private: true`` -- the checkpoint is a post-processing of the charged
  releases (the plan's :class:`~dpcl.guarantees.method_schema.ReleaseCoverage`
  states the ``basis`` sentence). The headline then states epsilon, delta,
  neighbouring relation, privacy unit, accountant, composition across tasks
  (Tobaben et al., Thm 4.4 / 4.5) with its groups, and the certificate carries
  the full list of charged events (``events``) to recompute it.
* ``private: false`` -- the checkpoint has no differential-privacy guarantee:
  ``epsilon`` (and delta, adjacency, unit, accountant, composition) are null,
  ``groups`` and ``events`` are empty, and ``reasons`` lists every reason as a
  sentence (e.g. weights trained on clean private targets, a run with
  ``[run] private = false``).

Statements about something other than the checkpoint (e.g. PeCL's release of
perturbed input embeddings) go into ``scoped_guarantees``: each entry has its
own ``name``, ``scope`` sentence (what it covers and what it does not),
epsilon, delta, adjacency, unit, accountant, composition, groups and the
events that recompute it. They never become the headline.

Every certificate also states the label-space policy, the assumptions as
plain sentences, the SHA-256 of the checkpoint (whose path is stored
*relative to the certificate*), the dpcl version and the training config.

:func:`verify_certificate` recomputes the headline epsilon (when private) and
every scoped epsilon from their events with the accountant named for each
composition group and compares them with the stated values within
:data:`RELATIVE_TOLERANCE` (per accountant of the recomputation), checks that
the stated accountants are the ones that produced the recomputed values, that
the guarantees agree with the privacy settings of the recorded config,
re-hashes the checkpoint, and checks the SHA-256 of the certificate's own
content (written by :func:`write_certificate`). An edited epsilon, an edited
event, a swapped checkpoint, or an edit of any other field (an assumption, a
reason, the config, the version, the checkpoint hash) fails. A valid
certificate whose checkpoint is not private *verifies* (the statement "not
private" is true and checked); its report says ``private: false``. The content
hash detects edits and damage; it is not a signature: someone who rewrites the
file can recompute it, so certificates must be stored where they cannot be
edited if that threat matters.

In Python a certificate is a :class:`~dpcl.guarantees.certificate_model.Certificate` (typed, frozen,
one ``from_json`` and one ``to_json``); this module builds, writes, reads (:func:`load_certificate`) and
verifies it, each check a rule of :data:`VERIFY_RULES` or a field's own rule.

Formats: this dpcl writes version 2 (:data:`CERTIFICATE_VERSION`) and still
reads and verifies version 1 (headline always private, no ``private`` field,
no ``scoped_guarantees``). The statements ``dpcl-non-private-release`` that
earlier ``[run] private = false`` runs wrote (``taskNNN.nonprivate-cert.json``)
are still refused with :class:`NonPrivateReleaseError` (exit 3): they carry no
content hash, so nothing in them can be verified.

Typical use by a training run (one certificate per release)::

    record = ledger.release(t, checkpoint_sha256=sha256_file(ckpt))
    cert = certificate_from_ledger(ledger, checkpoint=ckpt, method="cosine",
                                   label_space="prior_const", assumptions=plan.assumptions,
                                   release=plan.release, config=config_dict)
    write_certificate(run_dir / f"task{t}.cert.json", cert)
    verify_certificate(run_dir / f"task{t}.cert.json").raise_if_invalid()
"""

from __future__ import annotations

import dataclasses
import datetime as _dt
import hashlib
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, Sequence

from dpcl._io.atomic_io import collector_paused, read_json, sha256_file, write_json_atomic
from dpcl._io.safe_paths import contained_path
from dpcl._version import __version__
from dpcl.errors import (
    DpclError,
    InvalidParameterError,
    MalformedCertificateError,
    UndeclaredReleaseError,
    VerificationError,
)
from dpcl.accounting.accountants.registry import TOLERANCES
from dpcl.accounting.validation import describe_number, integer_beyond_float
from dpcl.guarantees.certificate_model import (
    CERTIFICATE_FORMAT,
    CERTIFICATE_VERSION,
    READABLE_VERSIONS,
    REPEATED_CHARGES_VERSION,
    Certificate,
    CheckpointRef,
    CompositionGroup,
    Guarantee,
    LabelSpace,
    Release,
    ScopedGuarantee,
)
from dpcl.guarantees.ledger import (
    Charge,
    StreamGuarantee,
    TaskLedger,
    charge_runs,
    charges_to_list,
    compact_indices,
    compose_stream,
    distinct_charges,
    expand_indices,
    indices_equal,
)
from dpcl.guarantees.ed25519 import signature_check
from dpcl.guarantees.method_schema import ReleaseCoverage
from dpcl.guarantees.settings import config_disagreements as _config_checks

__all__ = [
    "CERTIFICATE_FORMAT",
    "CERTIFICATE_VERSION",
    "REPEATED_CHARGES_VERSION",
    "READABLE_VERSIONS",
    "NON_PRIVATE_FORMAT",
    "NonPrivateReleaseError",
    "RELATIVE_TOLERANCE",
    "DEFAULT_RELATIVE_TOLERANCE",
    "ScopedLedger",
    "build_certificate",
    "certificate_from_ledger",
    "non_private_certificate",
    "write_certificate",
    "content_sha256",
    "read_certificate",
    "load_certificate",
    "verify_certificate",
    "VERIFY_RULES",
    "Verifying",
    "VerificationCheck",
    "VerificationReport",
    "ScopedVerification",
]

#: Format of the statement that ``dpcl run`` wrote before certificate version 2 for a release of a
#: ``[run] private = false`` run (``taskNNN.nonprivate-cert.json``). It is not a certificate (no content
#: hash, nothing to recompute) and is refused with :class:`NonPrivateReleaseError`; runs now write a
#: version-2 certificate with ``private: false`` instead.
NON_PRIVATE_FORMAT = "dpcl-non-private-release"

#: Relative tolerance between stated and recomputed epsilon, per accountant: each registered accountant's
#: ``tolerance`` (a read-only view of :mod:`dpcl.accounting.accountants.registry`). Closed-form and RDP
#: accountants are deterministic to rounding (1e-9); PLD and PRV are recomputed deterministically from the same
#: events, but their FFT-based numerics may differ in the last digits across numpy/scipy builds, hence 1e-6.
RELATIVE_TOLERANCE: Mapping[str, float] = TOLERANCES
#: Used only where nothing can be recomputed (a stated accountant that is not registered fails verification).
DEFAULT_RELATIVE_TOLERANCE = 1e-9

COMPOSITION_TEXT = {
    "parallel": (
        "parallel composition over tasks holding disjoint privacy units (Tobaben et al., Thm 4.4): "
        "epsilon is the largest epsilon of any group of events that can read one unit's data"
    ),
    "sequential": (
        "sequential composition of every event charged so far (Tobaben et al., Thm 4.5), "
        "accounted with the named accountant"
    ),
}


def _tolerance(accountant: str) -> float:
    parts = accountant.split("+")
    return max(RELATIVE_TOLERANCE.get(p, DEFAULT_RELATIVE_TOLERANCE) for p in parts)


def content_sha256(certificate: Mapping[str, Any]) -> str:
    """SHA-256 of a certificate's canonical JSON (sorted keys, no whitespace), its ``sha256`` field excluded.

    The ``signature`` block (:mod:`dpcl.guarantees.signing`) is excluded too: it is added after the hash and
    covers the hash, so signing a certificate does not change it."""
    body = {k: v for k, v in certificate.items() if k not in ("sha256", "signature")}
    return hashlib.sha256(
        json.dumps(body, sort_keys=True, separators=(",", ":"), allow_nan=False).encode()
    ).hexdigest()


def _now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).replace(microsecond=0).isoformat()


@dataclass(frozen=True)
class ScopedLedger:
    """The ledger of one scoped statement (:class:`~dpcl.guarantees.method_schema.ScopedPlan`).

    ``scope`` is the sentence saying what the statement covers (and what it does not);
    ``ledger`` composes the statement's events across tasks like the headline's ledger
    (one :class:`TaskLedger` per scope name, released after every task).
    """

    scope: str
    ledger: TaskLedger

    def __post_init__(self) -> None:
        if not str(self.scope).strip():
            raise InvalidParameterError("a scoped statement needs a scope sentence saying what it covers.")
        if not isinstance(self.ledger, TaskLedger):
            raise InvalidParameterError(f"ScopedLedger.ledger must be a TaskLedger, got {type(self.ledger).__name__}.")


def _stream_statement(guarantee: StreamGuarantee) -> dict[str, Any]:
    """The fields of a stated guarantee (:class:`~dpcl.guarantees.certificate_model.Guarantee`,
    :class:`~dpcl.guarantees.certificate_model.ScopedGuarantee`) from the ledger's guarantee."""
    return {
        "epsilon": guarantee.epsilon,
        "delta": guarantee.delta,
        "adjacency": guarantee.adjacency,
        "unit": guarantee.unit,
        "accountant": guarantee.accountant,
        "across_tasks": guarantee.across_tasks,
        "composition": COMPOSITION_TEXT[guarantee.across_tasks],
        "groups": tuple(CompositionGroup(**g.to_dict()) for g in guarantee.groups),
        "notes": tuple(guarantee.notes),
    }


def _compact_groups(statement: Any) -> Any:
    """Version 3: a group's runs of consecutive task and charge indices as ``[first, last]``."""
    return dataclasses.replace(statement, groups=tuple(
        dataclasses.replace(g, tasks=compact_indices(g.tasks), charges=compact_indices(g.charges))
        for g in statement.groups
    ))


def _scoped_entries(scoped: Mapping[str, Any] | None, release_task: int) -> list[ScopedGuarantee]:
    """One ``scoped_guarantees`` entry per scope: the guarantee its ledger recorded for ``release_task``."""
    entries: list[ScopedGuarantee] = []
    for name, item in (scoped or {}).items():
        if isinstance(item, tuple) and len(item) == 2:
            item = ScopedLedger(scope=item[0], ledger=item[1])
        if not isinstance(item, ScopedLedger):
            raise InvalidParameterError(
                f"scoped[{name!r}] must be (scope sentence, TaskLedger) or a ScopedLedger, got {type(item).__name__}."
            )
        if not str(name).strip():
            raise InvalidParameterError("every scoped statement needs a non-empty name.")
        records = [r for r in item.ledger.releases if r.task_index == int(release_task)]
        if not records:
            raise InvalidParameterError(
                f"the ledger of scoped statement {name!r} records no release of task {release_task}; "
                "call its ledger.release(task) after charging the task's scoped events."
            )
        record = records[-1]
        entries.append(
            ScopedGuarantee(
                name=str(name),
                scope=str(item.scope).strip(),
                **_stream_statement(record.guarantee),
                events=tuple(charges_to_list(item.ledger.charges[: record.n_charges])),
                tolerance={"relative": _tolerance(record.guarantee.accountant)},
            )
        )
    return entries


def _checkpoint_entry(
    checkpoint: "str | os.PathLike[str] | None", checkpoint_sha256: str | None
) -> CheckpointRef | None:
    if checkpoint is not None:
        cpath = Path(checkpoint)
        if not cpath.is_file():
            raise InvalidParameterError(f"checkpoint {str(cpath)!r} does not exist or is not a file.")
        digest = sha256_file(cpath)
        if checkpoint_sha256 is not None and checkpoint_sha256 != digest:
            raise InvalidParameterError(
                f"checkpoint {str(cpath)!r} hashes to {digest} but the ledger recorded {checkpoint_sha256}."
            )
        return CheckpointRef(path=str(cpath.resolve()), sha256=digest)
    if checkpoint_sha256 is not None:
        return CheckpointRef(path=None, sha256=str(checkpoint_sha256))
    return None


def _sentences(items: Sequence[str], what: str) -> list[str]:
    if isinstance(items, str):
        raise InvalidParameterError(f"{what} must be a list of sentences, not one string.")
    sentences = [str(a).strip() for a in items if str(a).strip()]
    if not sentences:
        raise InvalidParameterError(f"a certificate must state at least one {what} sentence.")
    return sentences


def _require_release(release: Any) -> ReleaseCoverage:
    if release is None:
        raise UndeclaredReleaseError(
            "the plan does not declare whether the released checkpoint is covered (release=None), so it cannot be "
            "certified: give release=ReleaseCoverage.post_processing(basis) when the checkpoint is a "
            "post-processing of the charged events, or ReleaseCoverage.not_covered(*reasons) otherwise."
        )
    if not isinstance(release, ReleaseCoverage):
        raise InvalidParameterError(f"release must be a ReleaseCoverage, got {type(release).__name__}.")
    return release


def build_certificate(
    *,
    guarantee: StreamGuarantee | None,
    charges: Sequence[Charge],
    release_task: int,
    method: str,
    label_space: str,
    assumptions: Sequence[str],
    release: ReleaseCoverage,
    scoped_guarantees: "Sequence[ScopedGuarantee | Mapping[str, Any]]" = (),
    checkpoint: "str | os.PathLike[str] | None" = None,
    checkpoint_sha256: str | None = None,
    config: Mapping[str, Any] | None = None,
    filter_state: Mapping[str, Any] | None = None,
    label_filtering: Sequence[Mapping[str, int]] | None = None,
    extra: Mapping[str, Any] | None = None,
    fields: Mapping[str, Any] | None = None,
    model: type[Certificate] = Certificate,
) -> dict[str, Any]:
    """Assemble a version-2 certificate for the checkpoint released after ``release_task``: a
    :class:`~dpcl.guarantees.certificate_model.Certificate`, returned as its JSON form (``to_json``).

    ``release`` says whether the checkpoint is covered by ``charges``: covered, the headline is
    ``guarantee`` (``private: true`` with the coverage's basis); not covered, the headline is
    ``private: false`` with the coverage's reasons, and ``guarantee``/``charges`` must be empty.
    ``scoped_guarantees`` are entries built from scoped ledgers (see :func:`certificate_from_ledger`).
    ``checkpoint`` is the checkpoint file (hashed here unless ``checkpoint_sha256`` is given; when both
    are given they must agree); its path is made relative to the certificate by :func:`write_certificate`.
    ``assumptions`` are plain sentences; ``extra`` holds method-specific fields (stated, not verified).
    ``fields`` sets further attributes of ``model`` (a :class:`~dpcl.guarantees.certificate_model.Certificate`
    subclass, or a field added to it), each checked by its own verify rule.
    """
    release = _require_release(release)
    sentences = _sentences(assumptions, "assumption")
    if release.covered:
        if guarantee is None or not charges:
            raise InvalidParameterError(
                "a certificate of a covered (private) checkpoint needs its guarantee and at least one charged event."
            )
        headline = Guarantee(private=True, basis=release.basis, **_stream_statement(guarantee))
        tolerance = _tolerance(guarantee.accountant)
    else:
        if guarantee is not None or charges:
            raise InvalidParameterError(
                "the checkpoint is not covered by any charged event, so its certificate states no headline guarantee "
                "and no headline events; put statements about narrower releases into scoped guarantees."
            )
        headline = Guarantee(private=False, epsilon=None, delta=None, adjacency=None, unit=None, accountant=None,
                             across_tasks=None, composition=None, groups=(), notes=(), reasons=tuple(release.reasons))
        tolerance = DEFAULT_RELATIVE_TOLERANCE
    scoped = [_scoped_guarantee(e) for e in scoped_guarantees]
    names = [e.name for e in scoped]
    if len(set(names)) != len(names):
        raise InvalidParameterError(f"scoped guarantee names must be distinct, got {names}.")
    events = charges_to_list(charges)
    repeated = any("repeat" in c for e in (events, *(s.events for s in scoped)) for c in e)
    if repeated:  # version 3: charge runs stored once, and so the index runs of groups too
        headline = _compact_groups(headline)
        scoped = [_compact_groups(e) for e in scoped]
    attributes: dict[str, Any] = dict(
        format=CERTIFICATE_FORMAT,
        version=REPEATED_CHARGES_VERSION if repeated else CERTIFICATE_VERSION,
        dpcl_version=__version__,
        created=_now(),
        release=Release(task_index=int(release_task), method=str(method)),
        guarantee=headline,
        scoped_guarantees=tuple(scoped),
        label_space=LabelSpace(policy=str(label_space), filtered=tuple(dict(x) for x in (label_filtering or []))),
        assumptions=tuple(sentences),
        events=tuple(events),
        filter=dict(filter_state) if filter_state else None,
        checkpoint=_checkpoint_entry(checkpoint, checkpoint_sha256),
        tolerance={"relative": tolerance},
        config=dict(config or {}),
        extra=dict(extra or {}),
    )
    try:
        return model(**attributes, **dict(fields or {})).to_json()
    except TypeError as exc:  # a name in ``fields`` that the model does not declare, or one set above
        raise InvalidParameterError(f"fields must name other attributes of {model.__name__}: {exc}.") from None


def _scoped_guarantee(entry: "ScopedGuarantee | Mapping[str, Any]") -> ScopedGuarantee:
    """A scoped statement given to :func:`build_certificate`: built by :func:`_scoped_entries`, or its JSON form."""
    if isinstance(entry, ScopedGuarantee):
        return entry
    try:
        return ScopedGuarantee.from_json(dict(entry), "scoped guarantee")
    except (MalformedCertificateError, TypeError, ValueError) as exc:
        raise InvalidParameterError(f"scoped_guarantees holds an entry that is not a scoped statement: {exc}") from None


def certificate_from_ledger(
    ledger: TaskLedger,
    *,
    method: str,
    label_space: str,
    assumptions: Sequence[str],
    release: ReleaseCoverage,
    scoped: "Mapping[str, ScopedLedger | tuple[str, TaskLedger]] | None" = None,
    checkpoint: "str | os.PathLike[str] | None" = None,
    release_index: int = -1,
    config: Mapping[str, Any] | None = None,
    label_filtering: Sequence[Mapping[str, int]] | None = None,
    extra: Mapping[str, Any] | None = None,
    fields: Mapping[str, Any] | None = None,
    model: type[Certificate] = Certificate,
) -> dict[str, Any]:
    """Certificate of release ``release_index`` (default: the latest) recorded in ``ledger``.

    ``release`` (required) is the plan's :class:`~dpcl.guarantees.method_schema.ReleaseCoverage`:
    ``None`` (undeclared) raises :class:`~dpcl.errors.UndeclaredReleaseError`. A covered release gives
    ``private: true`` with the ledger's guarantee and events; a release that is not covered gives
    ``private: false``, ``epsilon: null`` and the coverage's reasons (the ledger then only supplies the
    release's task index and checkpoint hash; its charges certify nothing about the checkpoint and are
    not stated). ``scoped`` maps a scope name to a :class:`ScopedLedger` (or a ``(scope sentence,
    TaskLedger)`` pair): each becomes a ``scoped_guarantees`` entry with the guarantee that ledger
    recorded for the same task (its latest release of that task).
    """
    release = _require_release(release)
    if not ledger.releases:
        raise InvalidParameterError("the ledger has no release yet; call ledger.release(task) first.")
    record = ledger.releases[release_index]
    if not release.covered:
        return non_private_certificate(
            release_task=record.task_index,
            method=method,
            label_space=label_space,
            assumptions=assumptions,
            reasons=release.reasons,
            scoped=scoped,
            checkpoint=checkpoint,
            checkpoint_sha256=record.checkpoint_sha256,
            config=config if config is not None else ledger.metadata.get("config"),
            label_filtering=label_filtering,
            extra=extra,
            fields=fields,
            model=model,
        )
    filter_state = ledger.filter_state()
    if ledger.uses_filter and record.n_charges < len(ledger.charges):
        # an earlier release: its filter state is that of the charges it covers, not of later ones
        replay = TaskLedger(**ledger.settings())
        for c in ledger.charges[: record.n_charges]:
            replay._admit(c)
        filter_state = replay.filter_state()
    return build_certificate(
        guarantee=record.guarantee,
        charges=ledger.charges[: record.n_charges],
        release_task=record.task_index,
        method=method,
        label_space=label_space,
        assumptions=assumptions,
        release=release,
        scoped_guarantees=_scoped_entries(scoped, record.task_index),
        checkpoint=checkpoint,
        checkpoint_sha256=record.checkpoint_sha256,
        config=config if config is not None else ledger.metadata.get("config"),
        filter_state=filter_state or None,
        label_filtering=label_filtering,
        extra=extra,
        fields=fields,
        model=model,
    )


def non_private_certificate(
    *,
    release_task: int,
    method: str,
    label_space: str,
    assumptions: Sequence[str],
    reasons: Sequence[str],
    scoped: "Mapping[str, ScopedLedger | tuple[str, TaskLedger]] | None" = None,
    checkpoint: "str | os.PathLike[str] | None" = None,
    checkpoint_sha256: str | None = None,
    config: Mapping[str, Any] | None = None,
    label_filtering: Sequence[Mapping[str, int]] | None = None,
    extra: Mapping[str, Any] | None = None,
    fields: Mapping[str, Any] | None = None,
    model: type[Certificate] = Certificate,
) -> dict[str, Any]:
    """Certificate of a checkpoint that is NOT differentially private (``private: false``).

    ``reasons`` (one sentence each, at least one) say why no epsilon bounds the checkpoint, e.g. that it
    was trained with ``[run] private = false`` or on clean private targets. ``scoped`` (as in
    :func:`certificate_from_ledger`) adds statements about narrower releases, which ``dpcl verify``
    recomputes. Such a certificate verifies (exit 0) and reports ``private: false``.
    """
    coverage = ReleaseCoverage.not_covered(*_sentences(reasons, "reason"))
    return build_certificate(
        guarantee=None,
        charges=(),
        release_task=release_task,
        method=method,
        label_space=label_space,
        assumptions=assumptions,
        release=coverage,
        scoped_guarantees=_scoped_entries(scoped, int(release_task)),
        checkpoint=checkpoint,
        checkpoint_sha256=checkpoint_sha256,
        config=config,
        label_filtering=label_filtering,
        extra=extra,
        fields=fields,
        model=model,
    )


def write_certificate(path: "str | os.PathLike[str]", certificate: "Certificate | Mapping[str, Any]") -> Path:
    """Write ``certificate`` (a :class:`~dpcl.guarantees.certificate_model.Certificate` or its JSON form)
    atomically to ``path``, storing the checkpoint path relative to it and the SHA-256 of the certificate's
    content (:func:`content_sha256`) in its ``sha256`` field."""
    target = Path(path)
    if isinstance(certificate, Certificate):
        certificate = certificate.to_json()
    # a signature covers the content it was made for: a (re)written certificate is unsigned until signed again
    cert = {k: v for k, v in certificate.items() if k not in ("sha256", "signature")}
    ckpt = cert.get("checkpoint")
    if ckpt and ckpt.get("path"):
        absolute = Path(ckpt["path"]).resolve()
        rel = os.path.relpath(absolute, target.resolve().parent)
        cert["checkpoint"] = {**ckpt, "path": Path(rel).as_posix()}
    try:  # hash exactly what is written (tuples become lists ...)
        cert = json.loads(json.dumps(cert, allow_nan=False))
    except (TypeError, ValueError) as exc:
        raise InvalidParameterError(f"certificate is not strict JSON (finite numbers, plain values): {exc}.") from exc
    cert["sha256"] = content_sha256(cert)
    return write_json_atomic(target, cert)


class NonPrivateReleaseError(VerificationError):
    """A statement of non-privacy was given where a certificate was expected: the checkpoint it names was
    trained without differential privacy, so there is nothing to verify (exit code 3, like any failed check)."""


def _non_private_message(path: Path, data: Mapping[str, Any]) -> str:
    release = data.get("release") if isinstance(data.get("release"), Mapping) else {}
    ckpt = data.get("checkpoint") if isinstance(data.get("checkpoint"), Mapping) else {}
    what = ", ".join(
        part
        for part in (
            f"task {release['task_index']}" if "task_index" in release else "",
            f"method {release['method']!r}" if "method" in release else "",
            f"checkpoint {ckpt['path']!r}" if "path" in ckpt else "",
        )
        if part
    )
    return (
        f"{str(path)!r} is a statement that the checkpoint is NOT differentially private"
        + (f" ({what})" if what else "")
        + ": it was trained with [run] private = false (no noise, no clipping), so it has no privacy guarantee "
        "(epsilon is infinite). It is not a certificate (a legacy statement written before certificate version 2, with "
        "nothing to verify); train with private = true to get a certificate of a private checkpoint."
    )


def load_certificate(path: "str | os.PathLike[str]", model: type[Certificate] = Certificate) -> Certificate:
    """Read a certificate (any of :data:`READABLE_VERSIONS`) into ``model``
    (:class:`~dpcl.guarantees.certificate_model.Certificate` or a subclass declaring more fields); malformed input
    raises MalformedCertificateError naming the field, a legacy statement of non-privacy NonPrivateReleaseError."""
    p = Path(path)
    try:
        data = read_json(p)
    except FileNotFoundError:
        raise MalformedCertificateError(f"certificate {str(p)!r} does not exist.") from None
    except (ValueError, UnicodeDecodeError) as exc:
        raise MalformedCertificateError(f"certificate {str(p)!r} is not valid JSON: {exc}.") from exc
    if isinstance(data, dict) and data.get("format") == NON_PRIVATE_FORMAT:
        raise NonPrivateReleaseError(_non_private_message(p, data))
    if not isinstance(data, dict) or data.get("format") != CERTIFICATE_FORMAT:
        raise MalformedCertificateError(f"{str(p)!r} is not a dpcl certificate (format must be {CERTIFICATE_FORMAT!r}).")
    found = integer_beyond_float(data)
    if found is not None:
        where = "".join(f"[{k}]" if isinstance(k, int) else f".{k}" for k in found[0]).lstrip(".")
        raise MalformedCertificateError(
            f"certificate {str(p)!r} field {where} must be a number within float range (~1.8e308), got "
            f"{describe_number(found[1])}."
        )
    return model.from_json(data)


def read_certificate(path: "str | os.PathLike[str]") -> dict[str, Any]:
    """Read and validate a certificate (:func:`load_certificate`); returns its JSON object as written."""
    return dict(load_certificate(path).content())


@dataclass(frozen=True)
class VerificationCheck:
    name: str
    passed: bool
    detail: str

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "passed": self.passed, "detail": self.detail}


@dataclass(frozen=True)
class ScopedVerification:
    """Stated and recomputed epsilon of one scoped statement of a certificate."""

    name: str
    scope: str
    stated_epsilon: float
    recomputed_epsilon: float | None
    delta: float
    adjacency: str
    unit: str

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "scope": self.scope,
            "stated_epsilon": self.stated_epsilon,
            "recomputed_epsilon": self.recomputed_epsilon,
            "delta": self.delta,
            "adjacency": self.adjacency,
            "unit": self.unit,
        }


@dataclass(frozen=True)
class VerificationReport:
    """Outcome of :func:`verify_certificate`: every check with its result.

    ``private`` is what the (verified) headline states about the checkpoint: a valid report with
    ``private`` False says, checked, that the checkpoint has no DP guarantee (``reasons`` say why);
    ``stated_epsilon``, ``recomputed_epsilon`` and ``delta`` are then None. ``scoped`` holds every
    scoped statement with its recomputed epsilon.
    """

    path: str
    stated_epsilon: float | None
    recomputed_epsilon: float | None
    delta: float | None
    relative_tolerance: float
    checks: tuple[VerificationCheck, ...] = field(default_factory=tuple)
    private: bool = True
    version: int = CERTIFICATE_VERSION
    reasons: tuple[str, ...] = ()
    scoped: tuple[ScopedVerification, ...] = ()

    @property
    def valid(self) -> bool:
        return all(c.passed for c in self.checks)

    @property
    def failed(self) -> tuple[VerificationCheck, ...]:
        return tuple(c for c in self.checks if not c.passed)

    def raise_if_invalid(self) -> "VerificationReport":
        """Raise :class:`VerificationError` (exit code 3) naming every failed check."""
        if not self.valid:
            raise VerificationError(
                f"certificate {self.path!r} does not verify: "
                + "; ".join(f"{c.name}: {c.detail}" for c in self.failed)
            )
        return self

    def to_dict(self) -> dict[str, Any]:
        return {
            "certificate": self.path,
            "valid": self.valid,
            "version": self.version,
            "private": self.private,
            "reasons": list(self.reasons),
            "stated_epsilon": self.stated_epsilon,
            "recomputed_epsilon": self.recomputed_epsilon,
            "delta": self.delta,
            "relative_tolerance": self.relative_tolerance,
            "scoped_guarantees": [s.to_dict() for s in self.scoped],
            "checks": [c.to_dict() for c in self.checks],
        }




def _count_events(charges: Sequence[Charge]) -> int:
    """Number of events in ``charges`` (a run of n references to one charge counts its events n times)."""
    return sum(len(charges[start].events) * (stop - start) for start, stop in charge_runs(charges))


def _recompute(
    g: Any, charges: Sequence[Charge], prefix: str
) -> tuple[list[VerificationCheck], float | None, float, list[str]]:
    """Checks ``relation``, ``epsilon``, ``composition_groups`` and ``accountant`` of one stated guarantee
    (a private :class:`~dpcl.guarantees.certificate_model.Guarantee` or a
    :class:`~dpcl.guarantees.certificate_model.ScopedGuarantee`).

    Returns (checks, recomputed epsilon or None, relative tolerance, accountant asked for each group).
    """
    stated = float(g.epsilon)
    delta = float(g.delta)
    # recompute with the accountant that was asked for: ``auto`` re-runs its own comparison, so the
    # winner and its settings (e.g. auto's PLD discretisation) are reproduced exactly.
    group_accountants = [x.asked_accountant for x in g.groups]
    # a group's charges are compared in their compact form (indices_equal)
    stated_groups = [(x.task_indices, float(x.epsilon), x.accountant, x.charges or []) for x in g.groups]
    name = (lambda check: f"{prefix}{check}")
    checks: list[VerificationCheck] = []
    # The tolerance belongs to the accountant that really produced the recomputed value (set below); the
    # stated name is only a fallback when nothing can be recomputed, so editing it cannot loosen the check.
    tolerance = _tolerance(g.accountant)

    # events agree with the stated neighbouring relation and unit.
    distinct = distinct_charges(charges)  # a run of equal charges is one object
    adj = {e.adjacency.value for c in distinct for e in c.events}
    units = {e.unit for c in distinct for e in c.events}
    ok = adj == {g.adjacency} and units == {g.unit}
    checks.append(
        VerificationCheck(
            name("relation"),
            ok,
            f"events state adjacency {sorted(adj)} and unit {sorted(units)}; certificate states "
            f"{g.adjacency!r} / {g.unit!r}",
        )
    )

    recomputed: float | None = None
    try:
        again = compose_stream(charges, g.across_tasks, delta, group_accountants=group_accountants)
        recomputed = again.epsilon
        tolerance = _tolerance(again.accountant)
        close = abs(recomputed - stated) <= tolerance * max(abs(recomputed), 1e-300)
        checks.append(
            VerificationCheck(
                name("epsilon"),
                close,
                f"stated {stated!r}, recomputed {recomputed!r} from {_count_events(charges)} events "
                f"(relative tolerance {tolerance:g})",
            )
        )
        got_groups = [(grp.tasks, grp.epsilon, grp.accountant, grp.charges) for grp in again.groups]
        if len(got_groups) != len(stated_groups):
            detail = f"{len(stated_groups)} groups stated, {len(got_groups)} recomputed from the events"
            same_groups = False
        else:
            bad = []
            for a, b in zip(got_groups, stated_groups):
                if a[0] != b[0] or abs(a[1] - b[1]) > tolerance * max(abs(a[1]), 1e-300):
                    bad.append(f"tasks {list(b[0])}: stated epsilon {b[1]!r}, recomputed tasks {list(a[0])} "
                               f"epsilon {a[1]!r}")
                elif a[2] != b[2]:
                    bad.append(f"tasks {list(b[0])}: stated accountant {b[2]!r}, recomputed with {a[2]!r}")
                elif b[3] and not indices_equal(b[3], a[3]):  # a[3] is strictly increasing, as every group's
                    bad.append(f"tasks {list(b[0])}: stated charges {list(expand_indices(b[3]))}, "
                               f"recomputed {list(a[3])}")
            same_groups = not bad
            detail = "; ".join(bad) if bad else f"all {len(got_groups)} composition group(s) match"
        checks.append(VerificationCheck(name("composition_groups"), same_groups, detail))
        checks.append(
            VerificationCheck(
                name("accountant"),
                g.accountant == again.accountant,
                f"certificate states accountant {g.accountant!r}; the recomputed epsilon comes from "
                f"{again.accountant!r}",
            )
        )
    except MalformedCertificateError:
        raise
    except DpclError as exc:  # an accountant refusing the events is a failed check, not a crash
        checks.append(VerificationCheck(name("epsilon"), False, f"epsilon cannot be recomputed from the events: {exc}"))
    return checks, recomputed, tolerance, group_accountants


def verify_certificate(
    path: "str | os.PathLike[str]",
    checkpoint: "str | os.PathLike[str] | None" = None,
    *,
    public_key: Any = None,
    model: type[Certificate] = Certificate,
) -> VerificationReport:
    """Check a certificate: recompute its guarantees from their events, re-hash its checkpoint and its content.

    Checks (each a :class:`VerificationCheck`). For a private headline: ``relation`` (the events'
    adjacency and unit are the stated ones), ``epsilon`` (recomputed with each group's accountant, within
    :data:`RELATIVE_TOLERANCE` of the accountant that produced it), ``composition_groups`` (tasks,
    charges, epsilon and accountant of every group), ``accountant`` (the stated accountant is the one
    that produced the recomputed epsilon). For a headline that is not private: ``private`` (the
    certificate states no epsilon and its reasons; the recorded config does not claim otherwise). For
    every scoped statement ``NAME``: the same four checks named ``scoped[NAME].relation`` and so on.
    Then ``config`` (delta, composition and accountant of every stated guarantee agree with the recorded
    config's privacy settings), ``checkpoint`` (SHA-256 of the checkpoint file), the checks of fields that
    declare a rule (:func:`~dpcl.guarantees.certificate_model.json_field` ``verify``) and ``integrity``
    (SHA-256 of the certificate's own content, :func:`content_sha256`, so an edit of any field is noticed).
    The rules run in the order of :data:`VERIFY_RULES`.

    ``checkpoint`` overrides the checkpoint path named in the certificate (which is
    relative to the certificate's directory and must stay inside the run directory holding the certificate's
    folder, through no symbolic link: :func:`certified_checkpoint_path`). ``signature``
    (:func:`dpcl.guarantees.signing.signature_check`) checks the Ed25519 signature against ``public_key`` (a
    PEM file or key object) when one is given, and otherwise only reports "unsigned" or "signed by ... (not
    checked)". ``model`` reads the certificate (a subclass of
    :class:`~dpcl.guarantees.certificate_model.Certificate` adds fields and their rules). Returns a
    :class:`VerificationReport`; call :meth:`VerificationReport.raise_if_invalid` to turn a failure into
    :class:`VerificationError`. A malformed certificate raises
    :class:`MalformedCertificateError` (exit code 2). Version-1 certificates are verified as
    private headlines without scoped statements.
    """
    with collector_paused():
        p = Path(path)
        state = Verifying(path=p, certificate=load_certificate(p, model), checkpoint=checkpoint, public_key=public_key)
        for rule in VERIFY_RULES:
            rule(state)
        return state.report()


@dataclass
class Verifying:
    """One verification under way: the certificate, what the caller gave, and what the rules found so far.

    A rule of :data:`VERIFY_RULES` (or a field's ``verify`` rule) reads ``certificate`` and appends to ``checks``;
    ``problems`` collects disagreements with the recorded config, reported together by the ``config`` check."""

    path: Path
    certificate: Certificate
    checkpoint: "str | os.PathLike[str] | None" = None
    public_key: Any = None
    checks: list[VerificationCheck] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    stated: float | None = None
    recomputed: float | None = None
    delta: float | None = None
    tolerance: float = DEFAULT_RELATIVE_TOLERANCE
    scoped: list[ScopedVerification] = field(default_factory=list)

    def report(self) -> VerificationReport:
        g = self.certificate.guarantee
        return VerificationReport(
            path=str(self.path),
            stated_epsilon=self.stated,
            recomputed_epsilon=self.recomputed,
            delta=self.delta,
            relative_tolerance=self.tolerance,
            checks=tuple(self.checks),
            private=g.private,
            version=self.certificate.version,
            reasons=() if g.private else tuple(g.reasons or ()),
            scoped=tuple(self.scoped),
        )


def _verify_headline(state: Verifying) -> None:
    """A private headline is recomputed from its events; one that is not private states its reasons."""
    cert, g = state.certificate, state.certificate.guarantee
    if not g.private:
        state.checks.append(VerificationCheck(
            "private", True,
            "the certificate states that the checkpoint is NOT differentially private (no epsilon bounds it): "
            + " ".join(g.reasons or ()),
        ))
        return
    checks, state.recomputed, state.tolerance, accountants = _recompute(g, cert.charges(), "")
    state.checks.extend(checks)
    state.stated, state.delta = float(g.epsilon), float(g.delta)  # type: ignore[arg-type]
    state.problems.extend(_config_checks(cert.config, g, accountants))
    run = cert.config.get("run") if isinstance(cert.config.get("run"), Mapping) else {}
    if run.get("private") is False:
        state.problems.append("the guarantee states a private checkpoint but the config says [run] private = false")


def _verify_scoped(state: Verifying) -> None:
    """Every scoped statement is recomputed from its own events, like the headline."""
    for entry in state.certificate.scoped_guarantees:
        checks, epsilon, _tol, accountants = _recompute(entry, entry.charges(), f"scoped[{entry.name}].")
        state.checks.extend(checks)
        state.problems.extend(
            _config_checks(state.certificate.config, entry, accountants, f"scoped guarantee {entry.name!r}")
        )
        state.scoped.append(ScopedVerification(
            name=entry.name, scope=entry.scope, stated_epsilon=float(entry.epsilon),  # type: ignore[arg-type]
            recomputed_epsilon=epsilon, delta=float(entry.delta),  # type: ignore[arg-type]
            adjacency=str(entry.adjacency), unit=str(entry.unit),
        ))


def _verify_config(state: Verifying) -> None:
    """The stated guarantees agree with the recorded config's privacy settings."""
    state.checks.append(VerificationCheck(
        "config", not state.problems,
        "; ".join(state.problems) if state.problems
        else "the stated guarantees agree with the recorded config's privacy settings",
    ))


def _verify_checkpoint(state: Verifying) -> None:
    """The checkpoint file hashes to the recorded SHA-256."""
    ckpt = state.certificate.checkpoint
    if state.checkpoint is None and not (ckpt and ckpt.path):
        state.checks.append(VerificationCheck("checkpoint", True, "certificate names no checkpoint file (not checked)"))
        return
    if state.checkpoint is not None:
        cpath = Path(state.checkpoint)
    else:
        cpath = certified_checkpoint_path(state.path, ckpt.path)  # type: ignore[union-attr]
    if not ckpt or not ckpt.sha256:
        state.checks.append(VerificationCheck("checkpoint", False, "certificate records no checkpoint SHA-256"))
    elif not cpath.is_file():
        state.checks.append(VerificationCheck("checkpoint", False, f"checkpoint file {str(cpath)!r} not found"))
    else:
        digest = sha256_file(cpath)
        state.checks.append(VerificationCheck(
            "checkpoint", digest == ckpt.sha256,
            f"{str(cpath)!r} hashes to {digest}; certificate records {ckpt.sha256}",
        ))


def _verify_fields(state: Verifying) -> None:
    """The rule of every field that declares one (``json_field(..., verify=rule)``), fields of a subclass too."""
    for owner, rule in state.certificate.field_rules():
        state.checks.extend(rule(owner, state))


def _verify_integrity(state: Verifying) -> None:
    """The certificate's own content hashes to its ``sha256``: an edit of any field is noticed."""
    content = state.certificate.content()
    stored = content.get("sha256")
    actual = content_sha256(content)
    if not isinstance(stored, str) or not stored:
        state.checks.append(VerificationCheck(
            "integrity", False,
            "certificate carries no SHA-256 of its content (field 'sha256'), so edits cannot be detected; "
            "re-issue it with write_certificate",
        ))
        return
    state.checks.append(VerificationCheck(
        "integrity", stored == actual,
        f"content hashes to {actual}; certificate records {stored}"
        + ("" if stored == actual else " (the certificate was edited or damaged after it was written)"),
    ))


def _verify_signature(state: Verifying) -> None:
    """Who issued it: checked against ``public_key`` when one is given; otherwise reported, not checked."""
    signed_ok, signed_detail = signature_check(state.certificate.content(), state.public_key)
    state.checks.append(VerificationCheck("signature", signed_ok, signed_detail))


#: The verification rules, in the order their checks are reported. A new certificate field brings its rule
#: in its declaration (:func:`~dpcl.guarantees.certificate_model.json_field` ``verify``), run by ``_verify_fields``.
VERIFY_RULES = (
    _verify_headline,
    _verify_scoped,
    _verify_config,
    _verify_checkpoint,
    _verify_fields,
    _verify_integrity,
    _verify_signature,
)


def certified_checkpoint_path(certificate: "str | os.PathLike[str]", name: Any) -> Path:
    """The checkpoint file a certificate names (``name``, relative to the certificate), refusing with
    :class:`~dpcl._io.safe_paths.UnsafePathError` (exit code 2) a path that leaves the run directory (the
    certificate's folder's parent) or passes through a symbolic link."""
    p = Path(certificate)
    return contained_path(p.resolve().parent.parent, _relative_to_parent(p, name),
                          what=f"certificate {str(p)!r} checkpoint path")


def _relative_to_parent(certificate: Path, name: Any) -> Any:
    """A checkpoint path relative to the certificate, rewritten relative to the run directory (the certificate's
    folder's parent) for :func:`~dpcl._io.safe_paths.contained_path`; non-strings are left for it to refuse."""
    if not isinstance(name, str) or not name or Path(name).is_absolute():
        return name
    return f"{certificate.resolve().parent.name}/{name}"
