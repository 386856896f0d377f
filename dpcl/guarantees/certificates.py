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

:func:`verify_certificate` (:mod:`dpcl.guarantees.verification`) recomputes every stated epsilon from its
events, re-hashes the checkpoint and checks the certificate's content hash.

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
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Sequence

from dpcl._io.atomic_io import sha256_file
from dpcl._version import __version__
from dpcl.errors import InvalidParameterError, MalformedCertificateError, UndeclaredReleaseError
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
from dpcl.guarantees.ledger import Charge, ReleaseRecord, StreamGuarantee, TaskLedger, charges_to_list, compact_indices
from dpcl.guarantees.method_schema import ReleaseCoverage
# writing and reading certificates, and verifying them, live in their own modules; their names are re-exported
from dpcl.guarantees.certificate_files import (
    NON_PRIVATE_FORMAT,
    NonPrivateReleaseError,
    content_sha256,
    load_certificate,
    read_certificate,
    write_certificate,
)
from dpcl.guarantees.verification import (
    DEFAULT_RELATIVE_TOLERANCE,
    RELATIVE_TOLERANCE,
    VERIFY_RULES,
    ScopedVerification,
    VerificationCheck,
    VerificationReport,
    Verifying,
    _tolerance,
    certified_checkpoint_path,
    verify_certificate,
)

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
    covered = release.covered  # if not, the ledger supplies only the release's task index and checkpoint hash
    return build_certificate(
        guarantee=record.guarantee if covered else None,
        charges=ledger.charges[: record.n_charges] if covered else (),
        release_task=record.task_index,
        method=method,
        label_space=label_space,
        assumptions=assumptions,
        release=release,
        scoped_guarantees=_scoped_entries(scoped, record.task_index),
        checkpoint=checkpoint,
        checkpoint_sha256=record.checkpoint_sha256,
        config=config if config is not None else ledger.metadata.get("config"),
        filter_state=(_filter_state_at(ledger, record) or None) if covered else None,
        label_filtering=label_filtering,
        extra=extra,
        fields=fields,
        model=model,
    )


def _filter_state_at(ledger: TaskLedger, record: ReleaseRecord) -> dict[str, Any]:
    """The ledger's filter state as of ``record``: an earlier release's is that of the charges it covers, not
    of later ones."""
    if ledger.uses_filter and record.n_charges < len(ledger.charges):
        replay = TaskLedger(**ledger.settings())
        for c in ledger.charges[: record.n_charges]:
            replay._admit(c)
        return replay.filter_state()
    return ledger.filter_state()


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


