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

import datetime as _dt
import hashlib
import json
import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, Sequence

from dpcl import __version__
from dpcl.errors import (
    DpclError,
    InvalidParameterError,
    MalformedCertificateError,
    UndeclaredReleaseError,
    VerificationError,
)
from dpcl.accounting.validation import FLOAT_MAX_INTEGER, describe_number, integer_beyond_float
from dpcl.guarantees.atomic_io import collector_paused, read_json, sha256_file, write_json_atomic
from dpcl.guarantees.ledger import (
    ACROSS_TASKS,
    Charge,
    StreamGuarantee,
    TaskLedger,
    charge_runs,
    charges_from_list,
    charges_to_list,
    check_indices,
    compact_indices,
    compose_stream,
    distinct_charges,
    expand_indices,
    indices_equal,
)
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
    "verify_certificate",
    "VerificationCheck",
    "VerificationReport",
    "ScopedVerification",
]

CERTIFICATE_FORMAT = "dpcl-certificate"
#: Format of the statement that ``dpcl run`` wrote before certificate version 2 for a release of a
#: ``[run] private = false`` run (``taskNNN.nonprivate-cert.json``). It is not a certificate (no content
#: hash, nothing to recompute) and is refused with :class:`NonPrivateReleaseError`; runs now write a
#: version-2 certificate with ``private: false`` instead.
NON_PRIVATE_FORMAT = "dpcl-non-private-release"
#: Version this dpcl writes: 2 (headline = the checkpoint, ``private``, ``reasons``, ``scoped_guarantees``).
CERTIFICATE_VERSION = 2
#: Version written instead when a list of charges holds a run of equal consecutive charges stored once with
#: ``"repeat": n`` (otherwise the same as version 2), so that a dpcl which would not expand it refuses the file.
REPEATED_CHARGES_VERSION = 3
#: Versions this dpcl reads and verifies (1: headline always private, no scoped statements).
READABLE_VERSIONS = (1, 2, 3)

#: Relative tolerance between stated and recomputed epsilon, per accountant.
#: Closed-form and RDP accountants are deterministic to rounding (1e-9). PLD and
#: PRV are recomputed deterministically from the same events, but their FFT-based
#: numerics may differ in the last digits across numpy/scipy builds, hence 1e-6.
RELATIVE_TOLERANCE: dict[str, float] = {
    "exact": 1e-9,
    "basic": 1e-9,
    "advanced": 1e-9,
    "rdp": 1e-9,
    "pld": 1e-6,
    "prv": 1e-6,
}
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
    return {
        "epsilon": guarantee.epsilon,
        "delta": guarantee.delta,
        "adjacency": guarantee.adjacency,
        "unit": guarantee.unit,
        "accountant": guarantee.accountant,
        "across_tasks": guarantee.across_tasks,
        "composition": COMPOSITION_TEXT[guarantee.across_tasks],
        "groups": [g.to_dict() for g in guarantee.groups],
        "notes": list(guarantee.notes),
    }


def _compact_groups(statement: dict[str, Any]) -> None:
    """Version 3: a group's runs of consecutive task and charge indices as ``[first, last]``."""
    statement["groups"] = [
        {**g, "tasks": compact_indices(g["tasks"]), "charges": compact_indices(g["charges"])}
        for g in statement.get("groups", ())
    ]


def _scoped_entries(scoped: Mapping[str, Any] | None, release_task: int) -> list[dict[str, Any]]:
    """One ``scoped_guarantees`` entry per scope: the guarantee its ledger recorded for ``release_task``."""
    entries: list[dict[str, Any]] = []
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
            {
                "name": str(name),
                "scope": str(item.scope).strip(),
                **_stream_statement(record.guarantee),
                "events": charges_to_list(item.ledger.charges[: record.n_charges]),
                "tolerance": {"relative": _tolerance(record.guarantee.accountant)},
            }
        )
    return entries


def _checkpoint_entry(
    checkpoint: "str | os.PathLike[str] | None", checkpoint_sha256: str | None
) -> dict[str, Any] | None:
    if checkpoint is not None:
        cpath = Path(checkpoint)
        if not cpath.is_file():
            raise InvalidParameterError(f"checkpoint {str(cpath)!r} does not exist or is not a file.")
        digest = sha256_file(cpath)
        if checkpoint_sha256 is not None and checkpoint_sha256 != digest:
            raise InvalidParameterError(
                f"checkpoint {str(cpath)!r} hashes to {digest} but the ledger recorded {checkpoint_sha256}."
            )
        return {"path": str(cpath.resolve()), "sha256": digest}
    if checkpoint_sha256 is not None:
        return {"path": None, "sha256": str(checkpoint_sha256)}
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
    scoped_guarantees: Sequence[Mapping[str, Any]] = (),
    checkpoint: "str | os.PathLike[str] | None" = None,
    checkpoint_sha256: str | None = None,
    config: Mapping[str, Any] | None = None,
    filter_state: Mapping[str, Any] | None = None,
    label_filtering: Sequence[Mapping[str, int]] | None = None,
    extra: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """Assemble a version-2 certificate (a JSON-able dict) for the checkpoint released after ``release_task``.

    ``release`` says whether the checkpoint is covered by ``charges``: covered, the headline is
    ``guarantee`` (``private: true`` with the coverage's basis); not covered, the headline is
    ``private: false`` with the coverage's reasons, and ``guarantee``/``charges`` must be empty.
    ``scoped_guarantees`` are entries built from scoped ledgers (see :func:`certificate_from_ledger`).
    ``checkpoint`` is the checkpoint file (hashed here unless ``checkpoint_sha256`` is given; when both
    are given they must agree); its path is made relative to the certificate by :func:`write_certificate`.
    ``assumptions`` are plain sentences; ``extra`` holds method-specific fields.
    """
    release = _require_release(release)
    sentences = _sentences(assumptions, "assumption")
    if release.covered:
        if guarantee is None or not charges:
            raise InvalidParameterError(
                "a certificate of a covered (private) checkpoint needs its guarantee and at least one charged event."
            )
        headline: dict[str, Any] = {"private": True, "basis": release.basis, **_stream_statement(guarantee)}
        tolerance = _tolerance(guarantee.accountant)
    else:
        if guarantee is not None or charges:
            raise InvalidParameterError(
                "the checkpoint is not covered by any charged event, so its certificate states no headline guarantee "
                "and no headline events; put statements about narrower releases into scoped guarantees."
            )
        headline = {
            "private": False,
            "epsilon": None,
            "delta": None,
            "adjacency": None,
            "unit": None,
            "accountant": None,
            "across_tasks": None,
            "composition": None,
            "groups": [],
            "notes": [],
            "reasons": list(release.reasons),
        }
        tolerance = DEFAULT_RELATIVE_TOLERANCE
    names = [str(e["name"]) for e in scoped_guarantees]
    if len(set(names)) != len(names):
        raise InvalidParameterError(f"scoped guarantee names must be distinct, got {names}.")
    events = charges_to_list(charges)
    repeated = any("repeat" in c for c in events) or any(
        "repeat" in c for e in scoped_guarantees for c in e.get("events", ())
    )
    scoped_guarantees = [dict(e) for e in scoped_guarantees]
    if repeated:  # version 3: charge runs stored once, and so the index runs of groups too
        for statement in (headline, *scoped_guarantees):
            _compact_groups(statement)
    return {
        "format": CERTIFICATE_FORMAT,
        "version": REPEATED_CHARGES_VERSION if repeated else CERTIFICATE_VERSION,
        "dpcl_version": __version__,
        "created": _now(),
        "release": {"task_index": int(release_task), "method": str(method)},
        "guarantee": headline,
        "scoped_guarantees": [dict(e) for e in scoped_guarantees],
        "label_space": {"policy": str(label_space), "filtered": [dict(x) for x in (label_filtering or [])]},
        "assumptions": sentences,
        "events": events,
        "filter": dict(filter_state) if filter_state else None,
        "checkpoint": _checkpoint_entry(checkpoint, checkpoint_sha256),
        "tolerance": {"relative": tolerance},
        "config": dict(config or {}),
        "extra": dict(extra or {}),
    }


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
    )


def write_certificate(path: "str | os.PathLike[str]", certificate: Mapping[str, Any]) -> Path:
    """Write ``certificate`` atomically to ``path``, storing the checkpoint path relative to it and the
    SHA-256 of the certificate's content (:func:`content_sha256`) in its ``sha256`` field."""
    target = Path(path)
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


def _is_number(value: Any) -> bool:
    return (isinstance(value, (int, float)) and not isinstance(value, bool)
            and (isinstance(value, float) or abs(value) <= FLOAT_MAX_INTEGER) and math.isfinite(value))


def _check_statement(g: Any, what: str) -> None:
    """Structure of a stated (private) guarantee: the headline of a private checkpoint or a scoped entry."""
    needed = ("epsilon", "delta", "adjacency", "unit", "accountant", "across_tasks", "groups")
    if not isinstance(g, dict) or any(k not in g for k in needed):
        raise MalformedCertificateError(f"certificate {what} must have the fields {', '.join(needed)}.")
    if not _is_number(g["epsilon"]):
        raise MalformedCertificateError(f"certificate {what} epsilon must be a finite number, got {g['epsilon']!r}.")
    if g["across_tasks"] not in ACROSS_TASKS:
        raise MalformedCertificateError(
            f"certificate {what} across_tasks must be one of {', '.join(ACROSS_TASKS)}, got {g['across_tasks']!r}."
        )
    if not _is_number(g["delta"]) or not 0 < g["delta"] < 1:
        raise MalformedCertificateError(f"certificate {what} delta must be a number in (0, 1), got {g['delta']!r}.")
    if not isinstance(g["groups"], list) or not all(isinstance(x, dict) for x in g["groups"]):
        raise MalformedCertificateError(f"certificate {what} groups must be a list of objects.")


def _check_sentences(value: Any, what: str) -> None:
    if not isinstance(value, list) or not value or not all(isinstance(a, str) and a.strip() for a in value):
        raise MalformedCertificateError(f"certificate {what} must be a non-empty list of sentences.")


def read_certificate(path: "str | os.PathLike[str]") -> dict[str, Any]:
    """Read and structurally validate a certificate (version 1 or 2); malformed input raises
    MalformedCertificateError, a legacy statement of non-privacy NonPrivateReleaseError."""
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
    version = data.get("version")
    if isinstance(version, bool) or version not in READABLE_VERSIONS:
        raise MalformedCertificateError(
            f"certificate version {version!r} is not supported (this dpcl reads "
            f"{', '.join(str(v) for v in READABLE_VERSIONS)})."
        )
    required = ("guarantee", "events", "assumptions", "label_space", "checkpoint", "dpcl_version", "config")
    if version >= 2:
        required += ("scoped_guarantees",)
    missing = [k for k in required if k not in data]
    if missing:
        raise MalformedCertificateError(f"certificate {str(p)!r} lacks required field(s): {', '.join(missing)}.")
    if data["checkpoint"] is not None and not isinstance(data["checkpoint"], dict):
        raise MalformedCertificateError(
            f"certificate checkpoint must be an object {{path, sha256}} or null, got {type(data['checkpoint']).__name__}."
        )
    g = data["guarantee"]
    if not isinstance(g, dict):
        raise MalformedCertificateError("certificate guarantee must be an object.")
    if not isinstance(data["events"], list):
        raise MalformedCertificateError("certificate events must be a list of charges.")
    private = True if version == 1 else g.get("private")
    if not isinstance(private, bool):
        raise MalformedCertificateError(f"certificate guarantee private must be true or false, got {private!r}.")
    if private:
        _check_statement(g, "guarantee")
        if version >= 2 and not (isinstance(g.get("basis"), str) and g["basis"].strip()):
            raise MalformedCertificateError(
                "a private certificate must state its coverage basis (guarantee.basis: why the checkpoint is a "
                "post-processing of the charged events)."
            )
        if not data["events"]:
            raise MalformedCertificateError("certificate events must be a non-empty list of charges.")
    else:
        if g.get("epsilon") is not None:
            raise MalformedCertificateError(
                f"a certificate whose checkpoint is not private states epsilon null, got {g.get('epsilon')!r}."
            )
        _check_sentences(g.get("reasons"), "guarantee reasons (why the checkpoint is not private)")
        if data["events"] or g.get("groups"):
            raise MalformedCertificateError(
                "a certificate whose checkpoint is not private states no headline events or groups "
                "(statements about narrower releases belong in scoped_guarantees)."
            )
    scoped = data.get("scoped_guarantees", [])
    if not isinstance(scoped, list) or not all(isinstance(x, dict) for x in scoped):
        raise MalformedCertificateError("certificate scoped_guarantees must be a list of objects.")
    names = []
    for i, entry in enumerate(scoped):
        name = entry.get("name")
        if not isinstance(name, str) or not name.strip():
            raise MalformedCertificateError(f"certificate scoped guarantee {i} needs a non-empty name.")
        if not isinstance(entry.get("scope"), str) or not entry["scope"].strip():
            raise MalformedCertificateError(f"certificate scoped guarantee {name!r} needs a scope sentence.")
        _check_statement(entry, f"scoped guarantee {name!r}")
        if not isinstance(entry.get("events"), list) or not entry["events"]:
            raise MalformedCertificateError(f"certificate scoped guarantee {name!r} needs a non-empty list of events.")
        names.append(name)
    if len(set(names)) != len(names):
        raise MalformedCertificateError(f"certificate scoped guarantee names must be distinct, got {names}.")
    if not isinstance(data["assumptions"], list) or not all(isinstance(a, str) for a in data["assumptions"]):
        raise MalformedCertificateError("certificate assumptions must be a list of sentences.")
    return data


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


def _parse_charges(events: Any, what: str = "certificate events", version: int = CERTIFICATE_VERSION) -> list[Charge]:
    """The charges of a certificate; ``"repeat": n`` (n equal consecutive charges) only from version 3 on."""
    if version < REPEATED_CHARGES_VERSION and isinstance(events, list) and any(
        isinstance(c, Mapping) and "repeat" in c for c in events
    ):
        raise MalformedCertificateError(
            f"{what} use 'repeat', which only certificate version {REPEATED_CHARGES_VERSION} may use "
            f"(this one states version {version})."
        )
    try:
        return charges_from_list(events, what)
    except (KeyError, TypeError, ValueError, InvalidParameterError) as exc:
        raise MalformedCertificateError(f"{what} cannot be parsed: {exc}") from exc


def _count_events(charges: Sequence[Charge]) -> int:
    """Number of events in ``charges`` (a run of n references to one charge counts its events n times)."""
    return sum(len(charges[start].events) * (stop - start) for start, stop in charge_runs(charges))


def _recompute(
    g: Mapping[str, Any], charges: Sequence[Charge], prefix: str
) -> tuple[list[VerificationCheck], float | None, float, list[str]]:
    """Checks ``relation``, ``epsilon``, ``composition_groups`` and ``accountant`` of one stated guarantee.

    Returns (checks, recomputed epsilon or None, relative tolerance, accountant asked for each group).
    """
    try:
        stated = float(g["epsilon"])
        delta = float(g["delta"])
        # recompute with the accountant that was asked for: ``auto`` re-runs its own comparison, so the
        # winner and its settings (e.g. auto's PLD discretisation) are reproduced exactly.
        group_accountants = [str(x.get("requested_accountant", x["accountant"])) for x in g["groups"]]
        # a group's charges are compared in their compact form (indices_equal), checked here like the rest
        stated_groups = [
            (expand_indices(x["tasks"], "group tasks"), float(x["epsilon"]), str(x["accountant"]),
             x.get("charges", []))
            for x in g["groups"]
        ]
        for x in stated_groups:
            check_indices(x[3], "group charges")
    except (KeyError, TypeError, ValueError, InvalidParameterError) as exc:
        raise MalformedCertificateError(f"certificate {prefix or 'guarantee'} is malformed: {exc}") from exc
    name = (lambda check: f"{prefix}{check}")
    checks: list[VerificationCheck] = []
    # The tolerance belongs to the accountant that really produced the recomputed value (set below); the
    # stated name is only a fallback when nothing can be recomputed, so editing it cannot loosen the check.
    tolerance = _tolerance(str(g["accountant"]))

    # events agree with the stated neighbouring relation and unit.
    distinct = distinct_charges(charges)  # a run of equal charges is one object
    adj = {e.adjacency.value for c in distinct for e in c.events}
    units = {e.unit for c in distinct for e in c.events}
    ok = adj == {g["adjacency"]} and units == {g["unit"]}
    checks.append(
        VerificationCheck(
            name("relation"),
            ok,
            f"events state adjacency {sorted(adj)} and unit {sorted(units)}; certificate states "
            f"{g['adjacency']!r} / {g['unit']!r}",
        )
    )

    recomputed: float | None = None
    try:
        again = compose_stream(charges, str(g["across_tasks"]), delta, group_accountants=group_accountants)
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
                str(g["accountant"]) == again.accountant,
                f"certificate states accountant {str(g['accountant'])!r}; the recomputed epsilon comes from "
                f"{again.accountant!r}",
            )
        )
    except MalformedCertificateError:
        raise
    except DpclError as exc:  # an accountant refusing the events is a failed check, not a crash
        checks.append(VerificationCheck(name("epsilon"), False, f"epsilon cannot be recomputed from the events: {exc}"))
    return checks, recomputed, tolerance, group_accountants


def verify_certificate(
    path: "str | os.PathLike[str]", checkpoint: "str | os.PathLike[str] | None" = None, *, public_key: Any = None
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
    config's privacy settings), ``checkpoint`` (SHA-256 of the checkpoint file) and ``integrity``
    (SHA-256 of the certificate's own content, :func:`content_sha256`, so an edit of any field is noticed).

    ``checkpoint`` overrides the checkpoint path named in the certificate (which is
    relative to the certificate's directory and must stay inside the run directory holding the certificate's
    folder, through no symbolic link: :func:`certified_checkpoint_path`). ``signature``
    (:func:`dpcl.guarantees.signing.signature_check`) checks the Ed25519 signature against ``public_key`` (a
    PEM file or key object) when one is given, and otherwise only reports "unsigned" or "signed by ... (not
    checked)". Returns a :class:`VerificationReport`;
    call :meth:`VerificationReport.raise_if_invalid` to turn a failure into
    :class:`VerificationError`. A malformed certificate raises
    :class:`MalformedCertificateError` (exit code 2). Version-1 certificates are verified as
    private headlines without scoped statements.
    """
    with collector_paused():
        return _verify(Path(path), checkpoint, public_key)


def _verify(p: Path, checkpoint: "str | os.PathLike[str] | None", public_key: Any) -> VerificationReport:
    """:func:`verify_certificate` of the certificate at ``p``."""
    data = read_certificate(p)
    version = int(data["version"])
    g = data["guarantee"]
    private = True if version == 1 else bool(g["private"])
    checks: list[VerificationCheck] = []
    problems: list[str] = []
    config = data["config"]

    stated: float | None = None
    recomputed: float | None = None
    delta: float | None = None
    tolerance = DEFAULT_RELATIVE_TOLERANCE
    reasons: tuple[str, ...] = ()
    if private:
        charges = _parse_charges(data["events"], version=version)
        headline_checks, recomputed, tolerance, accountants = _recompute(g, charges, "")
        checks.extend(headline_checks)
        stated, delta = float(g["epsilon"]), float(g["delta"])
        problems.extend(_config_checks(config, g, accountants))
        run = config.get("run") if isinstance(config, Mapping) and isinstance(config.get("run"), Mapping) else {}
        if run.get("private") is False:
            problems.append("the guarantee states a private checkpoint but the config says [run] private = false")
    else:
        reasons = tuple(g["reasons"])
        checks.append(
            VerificationCheck(
                "private",
                True,
                "the certificate states that the checkpoint is NOT differentially private (no epsilon bounds it): "
                + " ".join(reasons),
            )
        )

    scoped: list[ScopedVerification] = []
    for entry in data.get("scoped_guarantees", []):
        label = f"scoped[{entry['name']}]."
        entry_charges = _parse_charges(entry["events"], f"scoped guarantee {entry['name']!r} events", version)
        entry_checks, entry_eps, _tol, entry_accountants = _recompute(entry, entry_charges, label)
        checks.extend(entry_checks)
        problems.extend(_config_checks(config, entry, entry_accountants, f"scoped guarantee {entry['name']!r}"))
        scoped.append(
            ScopedVerification(
                name=str(entry["name"]),
                scope=str(entry["scope"]),
                stated_epsilon=float(entry["epsilon"]),
                recomputed_epsilon=entry_eps,
                delta=float(entry["delta"]),
                adjacency=str(entry["adjacency"]),
                unit=str(entry["unit"]),
            )
        )

    # the recorded config's privacy settings.
    checks.append(
        VerificationCheck(
            "config",
            not problems,
            "; ".join(problems) if problems else "the stated guarantees agree with the recorded config's privacy settings",
        )
    )

    # checkpoint hash.
    ckpt = data.get("checkpoint")
    if checkpoint is not None or (ckpt and ckpt.get("path")):
        if checkpoint is not None:
            cpath = Path(checkpoint)
        else:
            cpath = certified_checkpoint_path(p, ckpt["path"])
        if not ckpt or not ckpt.get("sha256"):
            checks.append(VerificationCheck("checkpoint", False, "certificate records no checkpoint SHA-256"))
        elif not cpath.is_file():
            checks.append(VerificationCheck("checkpoint", False, f"checkpoint file {str(cpath)!r} not found"))
        else:
            digest = sha256_file(cpath)
            checks.append(
                VerificationCheck(
                    "checkpoint",
                    digest == ckpt["sha256"],
                    f"{str(cpath)!r} hashes to {digest}; certificate records {ckpt['sha256']}",
                )
            )
    else:
        checks.append(VerificationCheck("checkpoint", True, "certificate names no checkpoint file (not checked)"))

    # the certificate's own content.
    stored = data.get("sha256")
    actual = content_sha256(data)
    if not isinstance(stored, str) or not stored:
        checks.append(
            VerificationCheck(
                "integrity", False,
                "certificate carries no SHA-256 of its content (field 'sha256'), so edits cannot be detected; "
                "re-issue it with write_certificate",
            )
        )
    else:
        checks.append(
            VerificationCheck(
                "integrity",
                stored == actual,
                f"content hashes to {actual}; certificate records {stored}"
                + ("" if stored == actual else " (the certificate was edited or damaged after it was written)"),
            )
        )

    # 6. who issued it (only when a public key is given; otherwise the signature is reported, not checked).
    from dpcl.guarantees.signing import signature_check

    signed_ok, signed_detail = signature_check(data, public_key)
    checks.append(VerificationCheck("signature", signed_ok, signed_detail))

    return VerificationReport(
        path=str(p),
        stated_epsilon=stated,
        recomputed_epsilon=recomputed,
        delta=delta,
        relative_tolerance=tolerance,
        checks=tuple(checks),
        private=private,
        version=version,
        reasons=reasons,
        scoped=tuple(scoped),
    )


def certified_checkpoint_path(certificate: "str | os.PathLike[str]", name: Any) -> Path:
    """The checkpoint file a certificate names (``name``, relative to the certificate), refusing with
    :class:`~dpcl.guarantees.safe_paths.UnsafePathError` (exit code 2) a path that leaves the run directory (the
    certificate's folder's parent) or passes through a symbolic link."""
    from dpcl.guarantees.safe_paths import contained_path

    p = Path(certificate)
    return contained_path(p.resolve().parent.parent, _relative_to_parent(p, name),
                          what=f"certificate {str(p)!r} checkpoint path")


def _relative_to_parent(certificate: Path, name: Any) -> Any:
    """A checkpoint path relative to the certificate, rewritten relative to the run directory (the certificate's
    folder's parent) for :func:`~dpcl.guarantees.safe_paths.contained_path`; non-strings are left for it to refuse."""
    if not isinstance(name, str) or not name or Path(name).is_absolute():
        return name
    return f"{certificate.resolve().parent.name}/{name}"
