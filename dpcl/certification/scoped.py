"""Scoped statements of a Certifier: guarantees about something narrower than the checkpoint, each with its
own ledger under ``scoped/``."""

from __future__ import annotations

from typing import Any, Iterable, Sequence

from dpcl.accounting.events import Adjacency, PrivacyEvent
from dpcl.errors import InvalidParameterError, LedgerCorruptError
from dpcl.guarantees.ledger import Charge, TaskLedger
from dpcl.certification.arguments import _SCOPE_NAME, _charge_or_reuse, _task_index


class ScopedStatements:
    """The scoped statements of :class:`~dpcl.certifier.Certifier` (a mixin: the ledgers and settings are the
    Certifier's)."""

    def open_scoped(self, name: str, *, adjacency: "Adjacency | str", unit: str, must_exist: bool = False) -> TaskLedger:
        """The ledger of scoped statement ``name`` (``scoped/NAME.ledger.json``), opened once, resumed if present.

        A scoped statement covers something narrower than the checkpoint (e.g. PeCL's per-token release of
        its perturbed input embeddings); its events are composed across tasks like the headline's, with the
        Certifier's delta, accountant and composition, and its own ``adjacency`` and ``unit``. ``must_exist``:
        a release already stated it, so a missing file raises :class:`~dpcl.errors.LedgerCorruptError`.
        """
        if not isinstance(name, str) or not _SCOPE_NAME.fullmatch(name):
            raise InvalidParameterError(
                f"scoped statement name {name!r} must be letters, digits, '_', '.' or '-' (it names a ledger file)."
            )
        if name not in self._scoped:
            settings = {**self._scoped_settings, "adjacency": adjacency, "unit": unit,
                        "metadata": {**self._metadata, "scope_name": name}}
            self._scoped[name] = (
                TaskLedger(**settings) if self.run_dir is None
                else TaskLedger.open(self.scoped_dir / f"{name}.ledger.json", must_exist=must_exist, **settings)
            )
        return self._scoped[name]

    def charge_scoped(
        self,
        name: str,
        scope: str,
        task: "int | Sequence[int]",
        events: "PrivacyEvent | Sequence[PrivacyEvent]",
        *,
        unit_ids: Any = None,
        label: str = "",
        reuse_uncommitted: bool = False,
    ) -> Charge:
        """Charge the events of scoped statement ``name`` (what it covers: the sentence ``scope``) before training.

        The events state the statement's adjacency and unit (the first event's); otherwise as :meth:`charge`,
        ``reuse_uncommitted`` included. Every later certificate that names ``name`` (:meth:`certify`) states it
        in ``scoped_guarantees``, never in the headline.
        """
        if not isinstance(scope, str) or not scope.strip():
            raise InvalidParameterError("a scoped statement needs a scope sentence saying what it covers.")
        event_list = [events] if isinstance(events, PrivacyEvent) else list(events)
        if not event_list or not isinstance(event_list[0], PrivacyEvent):
            raise InvalidParameterError("events must be one or more PrivacyEvent objects.")
        ledger = self.open_scoped(name, adjacency=event_list[0].adjacency, unit=event_list[0].unit)
        indices, event_list = self._charge_arguments(task, event_list, ledger)
        self._scopes[name] = scope.strip()
        name_label = label or f"{self.method} task {indices[0]} ({name})"
        return _charge_or_reuse(ledger, indices, event_list, unit_ids=unit_ids, label=name_label,
                                reuse_uncommitted=reuse_uncommitted)

    def scoped_statements(self) -> dict[str, tuple[str, TaskLedger]]:
        """Every scoped statement charged in this process: name -> (scope sentence, its ledger), in charge order."""
        return {name: (scope, self._scoped[name]) for name, scope in self._scopes.items()}

    def release_scoped(self, name: str, task: int, *, checkpoint_sha256: str | None = None) -> bool:
        """Record the release of ``task`` in scoped statement ``name``'s ledger; False if it is recorded already.

        Idempotent (a driver finishing a release after a crash calls it again): the release is recorded
        unless the ledger's last release is of ``task`` and covers every charge.
        """
        t = _task_index(task, self.n_tasks)
        if name not in self._scoped:
            raise InvalidParameterError(f"scoped statement {name!r} was never charged or opened; charge it first.")
        ledger = self._scoped[name]
        last = ledger.releases[-1] if ledger.releases else None
        if last is not None and last.task_index == t and last.n_charges == len(ledger.charges):
            return False
        ledger.release(t, checkpoint_sha256=checkpoint_sha256)
        return True

    def require_released(self, tasks: Iterable[int], *, scoped: str | None = None, adjacency: Any = None,
                         unit: str | None = None, listed_by: str = "the run state") -> None:
        """Raise :class:`~dpcl.errors.LedgerCorruptError` unless the ledger records a release of every task in ``tasks``.

        A driver resuming from its own run state calls it for the releases that state lists: a ledger older
        than the run (or from another run) would forget budget already spent. ``scoped`` checks that
        statement's ledger instead (opened with ``adjacency`` and ``unit``; it must exist).
        """
        needed = sorted({int(t) for t in tasks})
        if not needed:
            return
        if scoped is None:
            ledger, path = self.ledger, self.ledger_path
        else:
            ledger = self.open_scoped(scoped, adjacency=adjacency, unit=str(unit), must_exist=True)
            path = self.scoped_dir / f"{scoped}.ledger.json"
        missing = sorted(set(needed) - set(ledger.released_tasks()))
        if missing:
            raise LedgerCorruptError(
                f"{str(path)!r} has no record of the release(s) of task(s) {', '.join(str(t + 1) for t in missing)} "
                f"that {listed_by} lists: it is older than the run (or from another run), so resuming would forget "
                "budget already spent. Restore the run's own ledger, or start the run over in a new directory."
            )
