"""Verification of a certificate: every check a rule of :data:`VERIFY_RULES` or a field's own rule.

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
"""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Mapping, Sequence

from dpcl._io.atomic_io import collector_paused, sha256_file
from dpcl._io.safe_paths import contained_path
from dpcl.accounting.accountants.registry import TOLERANCES
from dpcl.errors import DpclError, MalformedCertificateError, VerificationError
from dpcl.guarantees.certificate_files import content_sha256, load_certificate
from dpcl.guarantees.certificate_model import CERTIFICATE_VERSION, Certificate
from dpcl.guarantees.charges import Charge, charge_runs, distinct_charges, expand_indices, indices_equal
from dpcl.guarantees.ed25519 import signature_check
from dpcl.guarantees.settings import config_disagreements as _config_checks
from dpcl.guarantees.stream_composition import compose_stream

#: Relative tolerance between stated and recomputed epsilon, per accountant: each registered accountant's
#: ``tolerance`` (a read-only view of :mod:`dpcl.accounting.accountants.registry`). Closed-form and RDP
#: accountants are deterministic to rounding (1e-9); PLD and PRV are recomputed deterministically from the same
#: events, but their FFT-based numerics may differ in the last digits across numpy/scipy builds, hence 1e-6.
RELATIVE_TOLERANCE: Mapping[str, float] = TOLERANCES
#: Used only where nothing can be recomputed (a stated accountant that is not registered fails verification).
DEFAULT_RELATIVE_TOLERANCE = 1e-9


def _tolerance(accountant: str) -> float:
    parts = accountant.split("+")
    return max(RELATIVE_TOLERANCE.get(p, DEFAULT_RELATIVE_TOLERANCE) for p in parts)


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
        return asdict(self)


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


def _relation_check(g: Any, charges: Sequence[Charge], name: str) -> VerificationCheck:
    """The events agree with the stated neighbouring relation and unit."""
    distinct = distinct_charges(charges)  # a run of equal charges is one object
    adj = {e.adjacency.value for c in distinct for e in c.events}
    units = {e.unit for c in distinct for e in c.events}
    ok = adj == {g.adjacency} and units == {g.unit}
    return VerificationCheck(
        name,
        ok,
        f"events state adjacency {sorted(adj)} and unit {sorted(units)}; certificate states "
        f"{g.adjacency!r} / {g.unit!r}",
    )


def _compare_groups(got_groups: Sequence[tuple[Any, ...]], stated_groups: Sequence[tuple[Any, ...]],
                    tolerance: float) -> tuple[bool, str]:
    """Whether the recomputed composition groups (tasks, epsilon, accountant, charges) are the stated ones."""
    if len(got_groups) != len(stated_groups):
        return False, f"{len(stated_groups)} groups stated, {len(got_groups)} recomputed from the events"
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
    return not bad, "; ".join(bad) if bad else f"all {len(got_groups)} composition group(s) match"


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

    checks.append(_relation_check(g, charges, name("relation")))

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
        same_groups, detail = _compare_groups(got_groups, stated_groups, tolerance)
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
