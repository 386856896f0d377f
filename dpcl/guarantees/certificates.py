"""Privacy certificates of released checkpoints, and their verification.

A certificate is a JSON file written next to (or near) a released checkpoint.
It states the guarantee -- epsilon, delta, neighbouring relation, privacy unit,
accountant, composition across tasks (Tobaben et al., Thm 4.4 / 4.5), label-space
policy and the assumptions it relies on as plain sentences -- and carries
everything needed to check it: the full list of charged privacy events, the
SHA-256 of the checkpoint (whose path is stored *relative to the certificate*),
the dpcl version and the training config.

:func:`verify_certificate` recomputes epsilon from the events with the
accountant named for each composition group and compares it with the stated
value within :data:`RELATIVE_TOLERANCE` (per accountant of the recomputation),
checks that the stated accountants are the ones that produced the recomputed
values, that the guarantee agrees with the privacy settings of the recorded
config, re-hashes the checkpoint, and checks the SHA-256 of the certificate's
own content (written by :func:`write_certificate`). An edited epsilon, an edited
event, a swapped checkpoint, or an edit of any other field (an assumption, the
config, the version, the checkpoint hash) fails. The content hash detects edits
and damage; it is not a signature: someone who rewrites the file can recompute
it, so certificates must be stored where they cannot be edited if that threat
matters.

Typical use by a training run (one certificate per release)::

    record = ledger.release(t, checkpoint_sha256=sha256_file(ckpt))
    cert = certificate_from_ledger(ledger, checkpoint=ckpt, method="cosine",
                                   label_space="prior_const", assumptions=plan.assumptions,
                                   config=config_dict)
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
from dpcl.errors import DpclError, InvalidParameterError, MalformedCertificateError, VerificationError
from dpcl.guarantees.atomic_io import read_json, sha256_file, write_json_atomic
from dpcl.guarantees.ledger import ACROSS_TASKS, Charge, StreamGuarantee, TaskLedger, compose_stream

__all__ = [
    "CERTIFICATE_FORMAT",
    "NON_PRIVATE_FORMAT",
    "NonPrivateReleaseError",
    "RELATIVE_TOLERANCE",
    "DEFAULT_RELATIVE_TOLERANCE",
    "build_certificate",
    "certificate_from_ledger",
    "write_certificate",
    "content_sha256",
    "read_certificate",
    "verify_certificate",
    "VerificationCheck",
    "VerificationReport",
]

CERTIFICATE_FORMAT = "dpcl-certificate"
#: Format of the statement ``dpcl run`` writes for a release of a ``[run] private = false`` run
#: (``taskNNN.nonprivate-cert.json``): it says the checkpoint is NOT private; it is not a certificate.
NON_PRIVATE_FORMAT = "dpcl-non-private-release"
CERTIFICATE_VERSION = 1

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
    """SHA-256 of a certificate's canonical JSON (sorted keys, no whitespace), its ``sha256`` field excluded."""
    body = {k: v for k, v in certificate.items() if k != "sha256"}
    return hashlib.sha256(
        json.dumps(body, sort_keys=True, separators=(",", ":"), allow_nan=False).encode()
    ).hexdigest()


def _now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).replace(microsecond=0).isoformat()


def build_certificate(
    *,
    guarantee: StreamGuarantee,
    charges: Sequence[Charge],
    release_task: int,
    method: str,
    label_space: str,
    assumptions: Sequence[str],
    checkpoint: "str | os.PathLike[str] | None" = None,
    checkpoint_sha256: str | None = None,
    config: Mapping[str, Any] | None = None,
    filter_state: Mapping[str, Any] | None = None,
    label_filtering: Sequence[Mapping[str, int]] | None = None,
    extra: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """Assemble a certificate (a JSON-able dict) for the checkpoint released after ``release_task``.

    ``checkpoint`` is the checkpoint file (hashed here unless ``checkpoint_sha256``
    is given; when both are given they must agree). Its path is made relative to
    the certificate by :func:`write_certificate`. ``assumptions`` are plain
    sentences; ``extra`` holds method-specific fields (e.g. per-token budgets).
    """
    if not charges:
        raise InvalidParameterError("a certificate needs at least one charged event.")
    sentences = [str(a).strip() for a in assumptions if str(a).strip()]
    if not sentences:
        raise InvalidParameterError("a certificate must state at least one assumption sentence.")
    ckpt: dict[str, Any] | None = None
    if checkpoint is not None:
        cpath = Path(checkpoint)
        if not cpath.is_file():
            raise InvalidParameterError(f"checkpoint {str(cpath)!r} does not exist or is not a file.")
        digest = sha256_file(cpath)
        if checkpoint_sha256 is not None and checkpoint_sha256 != digest:
            raise InvalidParameterError(
                f"checkpoint {str(cpath)!r} hashes to {digest} but the ledger recorded {checkpoint_sha256}."
            )
        ckpt = {"path": str(cpath.resolve()), "sha256": digest}
    elif checkpoint_sha256 is not None:
        ckpt = {"path": None, "sha256": str(checkpoint_sha256)}
    return {
        "format": CERTIFICATE_FORMAT,
        "version": CERTIFICATE_VERSION,
        "dpcl_version": __version__,
        "created": _now(),
        "release": {"task_index": int(release_task), "method": str(method)},
        "guarantee": {
            "epsilon": guarantee.epsilon,
            "delta": guarantee.delta,
            "adjacency": guarantee.adjacency,
            "unit": guarantee.unit,
            "accountant": guarantee.accountant,
            "across_tasks": guarantee.across_tasks,
            "composition": COMPOSITION_TEXT[guarantee.across_tasks],
            "groups": [g.to_dict() for g in guarantee.groups],
            "notes": list(guarantee.notes),
        },
        "label_space": {"policy": str(label_space), "filtered": [dict(x) for x in (label_filtering or [])]},
        "assumptions": sentences,
        "events": [c.to_dict() for c in charges],
        "filter": dict(filter_state) if filter_state else None,
        "checkpoint": ckpt,
        "tolerance": {"relative": _tolerance(guarantee.accountant)},
        "config": dict(config or {}),
        "extra": dict(extra or {}),
    }


def certificate_from_ledger(
    ledger: TaskLedger,
    *,
    method: str,
    label_space: str,
    assumptions: Sequence[str],
    checkpoint: "str | os.PathLike[str] | None" = None,
    release_index: int = -1,
    config: Mapping[str, Any] | None = None,
    label_filtering: Sequence[Mapping[str, int]] | None = None,
    extra: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """Certificate of release ``release_index`` (default: the latest) recorded in ``ledger``."""
    if not ledger.releases:
        raise InvalidParameterError("the ledger has no release yet; call ledger.release(task) first.")
    record = ledger.releases[release_index]
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
        checkpoint=checkpoint,
        checkpoint_sha256=record.checkpoint_sha256,
        config=config if config is not None else ledger.metadata.get("config"),
        filter_state=filter_state or None,
        label_filtering=label_filtering,
        extra=extra,
    )


def write_certificate(path: "str | os.PathLike[str]", certificate: Mapping[str, Any]) -> Path:
    """Write ``certificate`` atomically to ``path``, storing the checkpoint path relative to it and the
    SHA-256 of the certificate's content (:func:`content_sha256`) in its ``sha256`` field."""
    target = Path(path)
    cert = {k: v for k, v in certificate.items() if k != "sha256"}
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
        "(epsilon is infinite). It is not a certificate; train with private = true to get one."
    )


def read_certificate(path: "str | os.PathLike[str]") -> dict[str, Any]:
    """Read and structurally validate a certificate; malformed input raises MalformedCertificateError."""
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
    if data.get("version") != CERTIFICATE_VERSION:
        raise MalformedCertificateError(
            f"certificate version {data.get('version')!r} is not supported (this dpcl reads {CERTIFICATE_VERSION})."
        )
    required = ("guarantee", "events", "assumptions", "label_space", "checkpoint", "dpcl_version", "config")
    missing = [k for k in required if k not in data]
    if missing:
        raise MalformedCertificateError(f"certificate {str(p)!r} lacks required field(s): {', '.join(missing)}.")
    g = data["guarantee"]
    needed = ("epsilon", "delta", "adjacency", "unit", "accountant", "across_tasks", "groups")
    if not isinstance(g, dict) or any(k not in g for k in needed):
        raise MalformedCertificateError(f"certificate guarantee must have the fields {', '.join(needed)}.")
    if not isinstance(g["epsilon"], (int, float)) or isinstance(g["epsilon"], bool) or not math.isfinite(g["epsilon"]):
        raise MalformedCertificateError(f"certificate epsilon must be a finite number, got {g['epsilon']!r}.")
    if g["across_tasks"] not in ACROSS_TASKS:
        raise MalformedCertificateError(
            f"certificate across_tasks must be one of {', '.join(ACROSS_TASKS)}, got {g['across_tasks']!r}."
        )
    if not isinstance(g["delta"], (int, float)) or isinstance(g["delta"], bool) or not 0 < g["delta"] < 1:
        raise MalformedCertificateError(f"certificate delta must be a number in (0, 1), got {g['delta']!r}.")
    if not isinstance(g["groups"], list) or not all(isinstance(x, dict) for x in g["groups"]):
        raise MalformedCertificateError("certificate guarantee groups must be a list of objects.")
    if not isinstance(data["events"], list) or not data["events"]:
        raise MalformedCertificateError("certificate events must be a non-empty list of charges.")
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
class VerificationReport:
    """Outcome of :func:`verify_certificate`: every check with its result."""

    path: str
    stated_epsilon: float
    recomputed_epsilon: float | None
    delta: float
    relative_tolerance: float
    checks: tuple[VerificationCheck, ...] = field(default_factory=tuple)

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
            "stated_epsilon": self.stated_epsilon,
            "recomputed_epsilon": self.recomputed_epsilon,
            "delta": self.delta,
            "relative_tolerance": self.relative_tolerance,
            "checks": [c.to_dict() for c in self.checks],
        }


def _parse_charges(data: Mapping[str, Any]) -> list[Charge]:
    try:
        return [Charge.from_dict(c) for c in data["events"]]
    except (KeyError, TypeError, ValueError, InvalidParameterError) as exc:
        raise MalformedCertificateError(f"certificate events cannot be parsed: {exc}") from exc


def _config_checks(config: Any, g: Mapping[str, Any], group_accountants: Sequence[str]) -> list[str]:
    """Disagreements between the stated guarantee and the privacy settings of the recorded config.

    Only keys the config states are compared; a config without ``[privacy]`` / ``[stream]`` (e.g. a
    certificate built from Python without one) has nothing to disagree with.
    """
    if not isinstance(config, Mapping):
        return [f"config must be an object, got {type(config).__name__}"]
    privacy = config.get("privacy") if isinstance(config.get("privacy"), Mapping) else {}
    stream = config.get("stream") if isinstance(config.get("stream"), Mapping) else {}
    problems: list[str] = []
    if "delta" in privacy and privacy["delta"] != g["delta"]:
        problems.append(f"config [privacy] delta = {privacy['delta']!r} but the guarantee states delta {g['delta']!r}")
    if g["across_tasks"] == "parallel":
        if stream.get("disjoint_units") is False:
            problems.append(
                "the guarantee states parallel composition (Thm 4.4) but the config says disjoint_units = false"
            )
        if privacy.get("across_tasks") == "sequential":
            problems.append(
                "the guarantee states parallel composition but the config asks across_tasks = 'sequential'"
            )
    if privacy:
        asked = privacy.get("accountant", "auto")
        other = sorted({a for a in group_accountants if a != asked})
        if other:
            problems.append(f"config [privacy] accountant = {asked!r} but the groups were accounted with {other}")
    return problems


def verify_certificate(
    path: "str | os.PathLike[str]", checkpoint: "str | os.PathLike[str] | None" = None
) -> VerificationReport:
    """Check a certificate: recompute epsilon from its events, re-hash its checkpoint and its own content.

    Checks (each a :class:`VerificationCheck`): ``relation`` (the events' adjacency and unit are the
    stated ones), ``epsilon`` (recomputed with each group's accountant, within :data:`RELATIVE_TOLERANCE`
    of the accountant that produced it), ``composition_groups`` (tasks, charges, epsilon and accountant of
    every group), ``accountant`` (the stated accountant is the one that produced the recomputed epsilon),
    ``config`` (delta, composition and accountant agree with the recorded config's privacy settings),
    ``checkpoint`` (SHA-256 of the checkpoint file) and ``integrity`` (SHA-256 of the certificate's own
    content, :func:`content_sha256`, so an edit of any field is noticed).

    ``checkpoint`` overrides the checkpoint path named in the certificate (which is
    relative to the certificate's directory). Returns a :class:`VerificationReport`;
    call :meth:`VerificationReport.raise_if_invalid` to turn a failure into
    :class:`VerificationError`. A malformed certificate raises
    :class:`MalformedCertificateError` (exit code 2).
    """
    p = Path(path)
    data = read_certificate(p)
    g = data["guarantee"]
    charges = _parse_charges(data)
    checks: list[VerificationCheck] = []

    try:
        stated = float(g["epsilon"])
        delta = float(g["delta"])
        # recompute with the accountant that was asked for: ``auto`` re-runs its own comparison, so the
        # winner and its settings (e.g. auto's PLD discretisation) are reproduced exactly.
        group_accountants = [str(x.get("requested_accountant", x["accountant"])) for x in g["groups"]]
        stated_groups = [
            (tuple(int(t) for t in x["tasks"]), float(x["epsilon"]), str(x["accountant"]),
             tuple(int(i) for i in x.get("charges", ())))
            for x in g["groups"]
        ]
    except (KeyError, TypeError, ValueError) as exc:
        raise MalformedCertificateError(f"certificate guarantee is malformed: {exc}") from exc
    # The tolerance belongs to the accountant that really produced the recomputed value (set below); the
    # stated name is only a fallback when nothing can be recomputed, so editing it cannot loosen the check.
    tolerance = _tolerance(str(g["accountant"]))

    # 1. events agree with the stated neighbouring relation and unit.
    adj = {e.adjacency.value for c in charges for e in c.events}
    units = {e.unit for c in charges for e in c.events}
    ok = adj == {g["adjacency"]} and units == {g["unit"]}
    checks.append(
        VerificationCheck(
            "relation",
            ok,
            f"events state adjacency {sorted(adj)} and unit {sorted(units)}; certificate states "
            f"{g['adjacency']!r} / {g['unit']!r}",
        )
    )

    # 2. recompute epsilon.
    recomputed: float | None = None
    try:
        again = compose_stream(charges, str(g["across_tasks"]), delta, group_accountants=group_accountants)
        recomputed = again.epsilon
        tolerance = _tolerance(again.accountant)
        close = abs(recomputed - stated) <= tolerance * max(abs(recomputed), 1e-300)
        checks.append(
            VerificationCheck(
                "epsilon",
                close,
                f"stated {stated!r}, recomputed {recomputed!r} from {sum(len(c.events) for c in charges)} events "
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
                elif b[3] and a[3] != b[3]:
                    bad.append(f"tasks {list(b[0])}: stated charges {list(b[3])}, recomputed {list(a[3])}")
            same_groups = not bad
            detail = "; ".join(bad) if bad else f"all {len(got_groups)} composition group(s) match"
        checks.append(VerificationCheck("composition_groups", same_groups, detail))
        checks.append(
            VerificationCheck(
                "accountant",
                str(g["accountant"]) == again.accountant,
                f"certificate states accountant {str(g['accountant'])!r}; the recomputed epsilon comes from "
                f"{again.accountant!r}",
            )
        )
    except MalformedCertificateError:
        raise
    except DpclError as exc:  # an accountant refusing the events is a failed check, not a crash
        checks.append(VerificationCheck("epsilon", False, f"epsilon cannot be recomputed from the events: {exc}"))

    # 3. the recorded config's privacy settings.
    problems = _config_checks(data["config"], g, group_accountants)
    checks.append(
        VerificationCheck(
            "config",
            not problems,
            "; ".join(problems) if problems else "guarantee agrees with the recorded config's privacy settings",
        )
    )

    # 4. checkpoint hash.
    ckpt = data.get("checkpoint")
    if checkpoint is not None or (ckpt and ckpt.get("path")):
        if checkpoint is not None:
            cpath = Path(checkpoint)
        else:
            cpath = (p.resolve().parent / ckpt["path"]).resolve()
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

    # 5. the certificate's own content.
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

    return VerificationReport(
        path=str(p),
        stated_epsilon=stated,
        recomputed_epsilon=recomputed,
        delta=delta,
        relative_tolerance=tolerance,
        checks=tuple(checks),
    )
