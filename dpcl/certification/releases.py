"""Releases of a Certifier: checkpoints hashed, committed to the ledger, and certified (written, verified,
signed)."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

from dpcl.errors import InvalidParameterError, PrivacyViolationError
from dpcl._io.atomic_io import sha256_file, write_bytes_atomic
from dpcl.guarantees.certificates import (
    ScopedLedger,
    certificate_from_ledger,
    non_private_certificate,
    verify_certificate,
    write_certificate,
)
from dpcl.guarantees.label_space import FilterReport, describe_filtering, label_space_assumption
from dpcl.guarantees.ledger import ReleaseRecord
from dpcl.guarantees.method_schema import ReleaseCoverage
from dpcl.guarantees.signing import sign_certificate
from dpcl.certification.arguments import _FILENAME, _task_index
from dpcl.certification.assumptions import (
    COUNTS_ASSUMPTION,
    CURATOR_ASSUMPTION,
    DISJOINT_ASSUMPTION,
    FIXED_PARAMETERS_ASSUMPTION,
    SHARED_ASSUMPTION,
    adaptive_filter_assumption,
)
from dpcl.certification.records import CertifiedRelease, CommittedRelease, UnchargedStepError


class Releases:
    """Commits, certificates and releases of :class:`~dpcl.certifier.Certifier` (a mixin)."""

    def _checkpoint_file(self, t: int, checkpoint: Any, filename: str | None) -> Path:
        if isinstance(checkpoint, (bytes, bytearray, memoryview)):
            name = filename or f"task{t + 1:03d}.ckpt"
            if not _FILENAME.match(name):
                raise InvalidParameterError(
                    f"filename must be a plain file name (letters, digits, '.', '_', '-'), got {name!r}."
                )
            target = self.checkpoints_dir / name
            if target.exists():
                raise InvalidParameterError(
                    f"checkpoint {str(target)!r} already exists; a released checkpoint is never overwritten "
                    "(its certificate names its SHA-256). Give another filename."
                )
            return write_bytes_atomic(target, bytes(checkpoint))
        if filename is not None:
            raise InvalidParameterError("filename is only used when the checkpoint is given as bytes.")
        if not isinstance(checkpoint, (str, os.PathLike)):
            raise InvalidParameterError(
                f"checkpoint must be a file path or bytes, got {type(checkpoint).__name__}."
            )
        path = Path(checkpoint)
        if not path.is_file():
            raise InvalidParameterError(f"checkpoint {str(path)!r} does not exist or is not a file.")
        run_dir = self.run_dir.resolve()
        if path.is_symlink() or run_dir not in path.resolve().parents:
            # a certificate names its checkpoint inside its run directory, never through a symlink
            # (dpcl._io.safe_paths): a file from elsewhere is released as a copy under checkpoints/
            name = path.name if _FILENAME.match(path.name) else f"task{t + 1:03d}.ckpt"
            return self._checkpoint_file(t, path.read_bytes(), name)
        resolved = path.resolve()
        private = [self.curator_dir.resolve(), self.ledger_path.resolve()]
        if any(resolved == p or p in resolved.parents for p in private):
            raise InvalidParameterError(
                f"checkpoint {str(path)!r} lies in the curator part of the run directory (ledger.json, curator/), "
                "which must not be published; save the released checkpoint elsewhere (e.g. under checkpoints/)."
            )
        return path

    def _certificate_path(self, t: int, replace: bool = False) -> Path:
        base = f"task{t + 1:03d}"
        path = self.certificates_dir / f"{base}.cert.json"
        k = 2
        while path.exists() and not replace:
            path = self.certificates_dir / f"{base}.r{k}.cert.json"
            k += 1
        return path

    def _config(self) -> dict[str, Any]:
        """The certificate's config section (:meth:`PrivacySettings.to_dict`), so ``dpcl verify`` checks it too."""
        return self.settings.to_dict(method=self.method)

    def _check_release(self, t: int, coverage: Any, assumptions: Iterable[str], *, charged: bool = True) -> list[str]:
        """The assumption sentences of a release of ``t``; refuses what :meth:`release` documents."""
        self._refuse_dry_run("release a checkpoint or write a certificate")
        if not isinstance(coverage, ReleaseCoverage):
            raise InvalidParameterError(
                "coverage must be a ReleaseCoverage saying whether the checkpoint is covered by the charged events, "
                "e.g. ReleaseCoverage.post_processing('weights updated only by the charged DP-SGD steps')."
            )
        if coverage.covered and not self.private:
            raise InvalidParameterError(
                "this Certifier was opened with private=False: its checkpoints are not covered by any charged "
                "release; give ReleaseCoverage.not_covered(reasons...)."
            )
        if isinstance(assumptions, str):
            raise InvalidParameterError("assumptions must be a list of sentences, not one string.")
        sentences = [str(a).strip() for a in assumptions if str(a).strip()]
        if not sentences:
            raise InvalidParameterError(
                "state at least one assumption sentence (e.g. how the noise was drawn, what data is public)."
            )
        if charged and self.private and not any(t in c.tasks for c in self.ledger.charges):
            raise PrivacyViolationError(
                f"task {t} has no charged event: charge what your loop did with its data (charge, plan_dpsgd) "
                "before releasing it."
            )
        for plan in self._plans.get(t, ()):
            if plan.recorded > plan.charged:  # record_dpsgd_steps refuses this; a guard against edited state
                raise UnchargedStepError(
                    f"task {t}: {plan.recorded} DP-SGD steps recorded but {plan.charged} charged; not released."
                )
        return sentences

    def _extra_fields(self, t: int, extra: Mapping[str, Any] | None) -> dict[str, Any]:
        extra_fields: dict[str, Any] = {"certifier": {}}
        plans = self._plans.get(t, ())
        if plans:
            extra_fields["certifier"]["dpsgd_plans"] = [p.to_dict() for p in plans]
            recorded = sum(p.recorded for p in plans)
            charged = sum(p.charged for p in plans)
            extra_fields["certifier"]["dpsgd_steps"] = {"recorded": recorded, "charged": charged}
        if self.task_sizes is not None:
            extra_fields["certifier"]["task_sizes"] = self.task_sizes
        sources = self._state().get("noise_sources")
        if sources:
            extra_fields["certifier"]["noise_sources"] = {str(int(k) + 1): v for k, v in sorted(
                sources.items(), key=lambda kv: int(kv[0]))}
        extra_fields.update(dict(extra or {}))
        try:  # checked before the release is recorded, so a bad extra never leaves a release without certificate
            json.dumps(extra_fields, allow_nan=False)
        except (TypeError, ValueError) as exc:
            raise InvalidParameterError(f"extra must hold plain JSON values (finite numbers, strings...): {exc}.") from None
        return extra_fields

    def release(
        self,
        task: int,
        checkpoint: "str | os.PathLike[str] | bytes",
        *,
        coverage: ReleaseCoverage,
        assumptions: Iterable[str],
        filename: str | None = None,
        extra: Mapping[str, Any] | None = None,
    ) -> CertifiedRelease:
        """Release the checkpoint trained up to ``task`` and write its verified certificate.

        ``checkpoint`` is a file, or bytes written atomically to ``checkpoints/<filename>`` (default
        ``taskNNN.ckpt``). A file outside the run directory (or reached through a symlink) is released as
        a copy under ``checkpoints/`` with its own name: a certificate only names files inside its run
        directory. ``coverage`` states whether the checkpoint is a post-processing of the charged
        events (:meth:`ReleaseCoverage.post_processing` with its basis); ``assumptions`` are your plain
        sentences (at least one: how the noise was drawn, what is public...). A covered checkpoint gets a
        certificate whose headline (``guarantee.private: true``) is the cumulative guarantee of every
        charge so far; one that is not covered (:meth:`ReleaseCoverage.not_covered` with every reason) gets
        a certificate that says ``private: false`` with those reasons and states no epsilon. Refused before
        anything is recorded: a task never charged, DP-SGD steps recorded beyond their charge.

        It is :meth:`commit` (the ledger's release record) followed by :meth:`certify`, with every scoped
        statement charged in this process released and stated for ``task``.
        """
        t = _task_index(task, self.n_tasks)
        sentences = self._check_release(t, coverage, assumptions)
        self._extra_fields(t, extra)
        ckpt = self._checkpoint_file(t, checkpoint, filename)
        digest = sha256_file(ckpt)
        self.commit(t, checkpoint_sha256=digest)
        for name in self._scopes:
            self.release_scoped(name, t, checkpoint_sha256=digest)
        return self.certify(t, ckpt, coverage=coverage, assumptions=sentences, extra=extra, scoped=dict(self._scopes))

    def commit(self, task: int, *, checkpoint_sha256: str | None, curator_sha256: str | None = None,
               empty_task: bool = False) -> ReleaseRecord | None:
        """Record the release of ``task``'s checkpoint (by its SHA-256) in the ledger: the release's commit point.

        For crash-safe drivers that write the checkpoint under a temporary name first: once this returns,
        the release happened (the ledger states it with its cumulative guarantee), whatever crashes before
        its certificate is written; :meth:`committed` gives the recorded hashes back to finish it.
        ``curator_sha256`` is the hash of private state kept with the release (recorded in the ledger, never
        in a certificate). Returns the ledger's record; None for a non-private Certifier, which keeps no
        headline ledger (its driver's own run state is then the commit point).

        A task with no charged event is refused (:class:`~dpcl.errors.PrivacyViolationError`) unless
        ``empty_task``: its data is empty after the label filter and the released checkpoint does not depend
        on it (the previous release, or a data-independent one: Tobaben et al., Prop. F.1), so the charges
        so far cover it. Nothing may have been charged at all only if nothing was released.

        A dry run (:meth:`dry_run`) commits without a checkpoint (``checkpoint_sha256=None``).
        """
        t = _task_index(task, self.n_tasks)
        if checkpoint_sha256 is None and self.is_dry_run:
            pass
        elif not isinstance(checkpoint_sha256, str) or not re.fullmatch(r"[0-9a-f]{64}", checkpoint_sha256):
            raise InvalidParameterError(f"checkpoint_sha256 must be 64 lowercase hex digits, got {checkpoint_sha256!r}.")
        if not self.private:
            return None
        if not isinstance(empty_task, bool):
            raise InvalidParameterError(f"empty_task must be True or False, got {empty_task!r}.")
        if not (empty_task and self.ledger.charges) and not any(t in c.tasks for c in reversed(self.ledger.charges)):
            raise PrivacyViolationError(f"task {t} has no charged event: charge it before committing its release.")
        if curator_sha256 is not None:
            self.ledger.metadata.setdefault("curator_sha256", {})[str(t)] = str(curator_sha256)
        return self.ledger.release(t, checkpoint_sha256=checkpoint_sha256)

    def compact_ledgers(self) -> None:
        """Fold the journals of the headline and scoped ledgers into their files (one atomic rewrite each,
        :meth:`~dpcl.guarantees.ledger.TaskLedger.compact`), so that each ledger file holds everything on its own;
        ``dpcl run`` calls it when it stops. Loading a ledger reads its journal anyway."""
        for ledger in (self.ledger, *self._scoped.values()):
            ledger.compact()

    def committed_tasks(self) -> list[int]:
        """Tasks whose release the ledger committed, in order (each once); empty for a non-private Certifier."""
        return list(dict.fromkeys(self.ledger.released_tasks())) if self.private else []

    def committed(self, task: int) -> CommittedRelease:
        """The hashes the ledger committed for the (latest) release of ``task``."""
        t = _task_index(task, self.n_tasks)
        records = [r for r in self.ledger.releases if r.task_index == t] if self.private else []
        if not records:
            raise InvalidParameterError(f"the ledger records no release of task {t}.")
        curator = self.ledger.metadata.get("curator_sha256", {}).get(str(t))
        return CommittedRelease(task_index=t, checkpoint_sha256=records[-1].checkpoint_sha256,
                                curator_sha256=None if curator is None else str(curator))

    def certify(
        self,
        task: int,
        checkpoint: "str | os.PathLike[str]",
        *,
        coverage: ReleaseCoverage,
        assumptions: Iterable[str],
        scoped: Mapping[str, str] | None = None,
        label_filtering: Sequence[FilterReport] | None = None,
        extra: Mapping[str, Any] | None = None,
        standard_assumptions: bool = True,
        replace: bool = False,
    ) -> CertifiedRelease:
        """Write, verify (and sign) the certificate of ``task``'s committed release of ``checkpoint``.

        Private: the release :meth:`commit` recorded (its headline is that record's guarantee, its checkpoint
        hash the committed one). Non-private (``private=False``): ``coverage`` must be not covered and the
        certificate says ``private: false`` with its reasons. ``scoped`` maps the name of each scoped
        statement to state to its scope sentence (each ledger must record a release of ``task``:
        :meth:`release_scoped`). ``label_filtering``: the public filter counts to state (default: those
        :meth:`filter_labels` recorded). ``standard_assumptions=False`` states ``assumptions`` (plus the noise source and
        adaptivity the Certifier knows), for a driver whose sentences already say what the Certifier would add
        (label space, composition, counts, curator-side files). ``replace`` writes ``certificates/taskNNN.cert.json`` even if it exists (a
        driver finishing a release after a crash); otherwise a new name is chosen.
        """
        t = _task_index(task, self.n_tasks)
        sentences = self._check_release(t, coverage, assumptions, charged=False)  # commit checked the charge
        extra_fields = self._extra_fields(t, extra)
        path = Path(checkpoint)
        if not path.is_file():
            raise InvalidParameterError(f"checkpoint {str(path)!r} does not exist or is not a file.")
        reports = self._filter_reports() if label_filtering is None else list(label_filtering)
        index = None
        if self.private:
            index = max((i for i, r in enumerate(self.ledger.releases) if r.task_index == t), default=None)
            if index is None:
                raise InvalidParameterError(f"the release of task {t} was not committed; call commit first.")
        charged = [] if index is None else [
            task for c in self.ledger.charges[: self.ledger.releases[index].n_charges] for task in c.tasks
        ]
        noise = [s for s in self._noise_assumptions(charged) if s not in sentences]
        if standard_assumptions:
            all_assumptions = self._assumptions([*noise, *sentences], reports)
        else:  # the driver's sentences; what dpcl itself knows (noise source, adaptivity) is added
            all_assumptions = [*sentences, *noise, *(a for a in self._adaptivity_assumption() if a not in sentences)]
        statements = {}
        for name, scope in (scoped or {}).items():
            if name not in self._scoped:
                raise InvalidParameterError(f"scoped statement {name!r} was never charged; charge_scoped it first.")
            statements[name] = ScopedLedger(scope, self._scoped[name])
        common: dict[str, Any] = dict(
            method=self.method, label_space=self.label_space.value, assumptions=all_assumptions, scoped=statements,
            checkpoint=path, config=self._config(), label_filtering=describe_filtering(reports), extra=extra_fields,
        )
        record = None
        if index is not None:
            record = self.ledger.releases[index]
            if record.checkpoint_sha256 is not None and sha256_file(path) != record.checkpoint_sha256:
                raise InvalidParameterError(
                    f"checkpoint {str(path)!r} does not hash to the SHA-256 committed for task {t}'s release."
                )
            certificate = certificate_from_ledger(self.ledger, release=coverage, release_index=index, **common)
        else:
            certificate = non_private_certificate(release_task=t, reasons=coverage.reasons, **common)
        written = write_certificate(self._certificate_path(t, replace), certificate)
        verify_certificate(written).raise_if_invalid()
        signed_by = None
        if self._sign_key is not None:
            signed_by = sign_certificate(written, self._sign_key, verify=False)  # verified just above
        listed = self._state().setdefault("certificates", [])
        relative = written.relative_to(self.run_dir).as_posix()
        if relative not in listed:
            listed.append(relative)
        if self.private:
            self.ledger.save()
        return CertifiedRelease(
            task_index=t, checkpoint=path, certificate=written, checkpoint_sha256=sha256_file(path),
            private=coverage.covered, guarantee=record.guarantee if coverage.covered and record else None,
            reasons=coverage.reasons, signed_by=signed_by,
        )

    def _assumptions(self, sentences: Sequence[str], reports: Sequence[FilterReport]) -> list[str]:
        all_assumptions = [label_space_assumption(self.label_space)]
        all_assumptions.append(DISJOINT_ASSUMPTION if self.across_tasks == "parallel" else SHARED_ASSUMPTION)
        all_assumptions += self._adaptivity_assumption()
        if self.task_sizes is not None or reports:
            all_assumptions.append(COUNTS_ASSUMPTION)
        all_assumptions += [s for s in sentences if s not in all_assumptions]
        all_assumptions.append(CURATOR_ASSUMPTION)
        return all_assumptions

    def _adaptivity_assumption(self) -> list[str]:
        """Whether the charges' parameters had to be fixed in advance (no filter) or may be adaptive (a filter)."""
        if not self.private:
            return []
        ledger = self.ledger
        return [FIXED_PARAMETERS_ASSUMPTION if ledger.total_epsilon is None
                else adaptive_filter_assumption(ledger.total_epsilon, ledger.total_delta, self.across_tasks)]

    @property
    def certificates(self) -> list[Path]:
        """Every certificate written in this run directory, oldest first."""
        return [self.run_dir / p for p in self._state().get("certificates", [])]
