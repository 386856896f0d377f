"""Persistence of the task ledger: one JSON file written atomically and a hash-chained journal beside it.

Every change after the first save appends one line holding only what changed (:meth:`LedgerPersistence.save`);
the journal is folded into the file (:meth:`LedgerPersistence.compact`) when it grows larger than the file, when
a run resumes and when it stops. A damaged file or journal raises :class:`~dpcl.errors.LedgerCorruptError` and
is never replaced silently; :meth:`LedgerPersistence.from_dict` also refuses content that is inconsistent
whatever its hash.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any, Mapping, Self, Sequence

from dpcl.errors import ConfigError, InvalidParameterError, LedgerCorruptError, PrivacyViolationError
from dpcl._io.atomic_io import (
    MAX_JSON_BYTES,
    FileTooLargeError,
    append_bytes_durably,
    collector_paused,
    parse_json,
    read_bytes_limited,
    read_json,
    write_json_atomic,
)
from dpcl.guarantees.charges import MAX_CHARGES, Charge, charges_from_list, charges_to_list
from dpcl.guarantees.stream_composition import _composition_groups
from dpcl.guarantees.stream_guarantee import GroupGuarantee, ReleaseRecord, StreamGuarantee, _extended, _shared_prefix

LEDGER_FORMAT = "dpcl-task-ledger"
#: Version this dpcl writes: 2 (runs of equal charges stored once with ``repeat``, releases list only the groups
#: that changed: ``groups_kept``). Version 1 (every charge and every release's groups written out) is still read.
LEDGER_VERSION = 2
READABLE_LEDGER_VERSIONS = (1, 2)
#: Ledgers with more charges and releases than this are written without indentation.
COMPACT_LEDGER_ENTRIES = 1000
#: A ledger's journal is folded into the ledger (one atomic rewrite, :meth:`TaskLedger.compact`) once appending
#: would make it larger than the ledger and than this many bytes: the bytes written over a stream stay linear in
#: its length.
JOURNAL_MIN_BYTES = 1 << 20


def journal_path(path: "str | os.PathLike[str]", ledger_sha256: str) -> Path:
    """The journal of the ledger file ``path`` whose content hash is ``ledger_sha256``:
    ``NAME.<first 16 hex digits of the hash>.journal`` beside it, so that a journal extends one ledger content
    only (one folded into a rewritten ledger no longer names it)."""
    p = Path(path)
    return p.with_name(f"{p.name}.{str(ledger_sha256)[:16]}.journal")



def _same_json(a: Any, b: Any) -> bool:
    """``a`` and ``b`` are the same JSON value (``1``, ``1.0`` and ``true`` differ, unlike in Python)."""
    if type(a) is not type(b):
        return False
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_same_json(v, b[k]) for k, v in a.items())
    if isinstance(a, list):
        return len(a) == len(b) and all(_same_json(x, y) for x, y in zip(a, b))
    return a == b


def _json_patch(old: Any, new: Any, path: tuple[str, ...] = ()) -> list[list[Any]]:
    """Operations turning JSON object ``old`` into ``new``: ``["set", path, value]``, ``["del", path]`` and
    ``["extend", path, items]`` (a list that only grew), ``path`` the keys from the root (metadata grows by a
    release's certificate and label counts, so a journal line holds those, not the whole metadata)."""
    if type(old) is dict and type(new) is dict:
        ops: list[list[Any]] = [["del", [*path, k]] for k in old if k not in new]
        for k, v in new.items():
            if k not in old:
                ops.append(["set", [*path, k], v])
            elif not _same_json(old[k], v):
                ops.extend(_json_patch(old[k], v, (*path, k)))
        return ops
    if type(old) is list and type(new) is list and len(new) > len(old) and _same_json(new[: len(old)], old):
        return [["extend", list(path), new[len(old):]]]
    return [["set", list(path), new]]


def _apply_json_patch(target: dict[str, Any], ops: Any, where: str) -> None:
    """Apply :func:`_json_patch` operations to ``target`` in place; malformed ones raise LedgerCorruptError."""
    if not isinstance(ops, list):
        raise LedgerCorruptError(f"{where}: metadata changes must be a list.")
    for op in ops:
        if not (isinstance(op, list) and len(op) in (2, 3) and op[0] in ("set", "del", "extend")
                and isinstance(op[1], list) and op[1] and all(isinstance(k, str) for k in op[1])
                and (len(op) == 3) == (op[0] != "del")):
            raise LedgerCorruptError(f"{where}: malformed metadata change {op!r:.100}.")
        *parents, key = op[1]
        node: Any = target
        for k in parents:
            node = node.get(k) if isinstance(node, dict) else None
        if not isinstance(node, dict) or (op[0] != "set" and key not in node):
            raise LedgerCorruptError(f"{where}: metadata change {op[0]} {op[1]!r} names no such entry.")
        if op[0] == "set":
            node[key] = op[2]
        elif op[0] == "del":
            del node[key]
        elif isinstance(node[key], list) and isinstance(op[2], list):
            node[key].extend(op[2])
        else:
            raise LedgerCorruptError(f"{where}: metadata change extend {op[1]!r} does not extend a list.")


def _canonical(payload: Mapping[str, Any]) -> str:
    return json.dumps(payload, sort_keys=True, separators=(",", ":"), allow_nan=False)



class LedgerPersistence:
    """Saving, compacting and loading of :class:`~dpcl.guarantees.ledger.TaskLedger` (a mixin: the ledger's
    charges, releases, unit ids, settings and filters are its own)."""

    # -- persistence ------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        body = {
            "format": LEDGER_FORMAT,
            "version": LEDGER_VERSION,
            "settings": self.settings(),
            "metadata": self.metadata,
            "charges": charges_to_list(self.charges),
            "releases": self._releases_to_list(),
            "units": {str(k): v for k, v in sorted(self._units.items())},
        }
        body["sha256"] = hashlib.sha256(_canonical(body).encode()).hexdigest()
        return body

    def _releases_to_list(self, start: int = 0) -> list[dict[str, Any]]:
        """Release records from ``start`` on, each listing only the groups after those it shares with the previous
        release."""
        out: list[dict[str, Any]] = []
        before = self.releases[start - 1].guarantee if start else None
        previous: Sequence[GroupGuarantee] = before.groups if before else ()
        previous_notes: tuple[str, ...] | None = before.notes if before else None
        for record in self.releases[start:]:
            groups = record.guarantee.groups
            kept = _shared_prefix(previous, groups)
            entry = record.to_dict(groups_kept=kept)
            if record.guarantee.notes == previous_notes:
                entry["guarantee"]["notes"] = "same"  # the previous release's notes
            out.append(entry)
            previous, previous_notes = groups, record.guarantee.notes
        return out

    def save(self) -> None:
        """Make every change since the last save durable at ``path`` (nothing without a path).

        The first save (or one to another path) writes the whole ledger atomically (:meth:`compact`). A later
        save appends one line to the ledger's journal (:func:`journal_path`) holding only what changed: the new
        charges, the new releases, the unit ids of the tasks that got new ones and the changes of ``metadata``,
        so a stream of n releases writes O(n) bytes, not O(n^2). The line is the unit of a save: it is written
        with one ``write`` and ``fsync``-ed before this returns; a crash leaves at most a torn last line, without
        its final newline, which :meth:`load` drops (the save did not happen, as with an interrupted atomic
        rewrite). A journal that would grow larger than the ledger and :data:`JOURNAL_MIN_BYTES` is folded in.
        """
        if self.path is None:
            return
        state = self._persisted
        if state is None or state["path"] != self.path:
            self.compact()
            return
        line, last = self._journal_line(state)
        if line is None:
            return
        if state["journal_bytes"] + len(line) > max(state["ledger_bytes"], JOURNAL_MIN_BYTES):
            self.compact()
            return
        # cut the journal to what is known complete first: a torn line that load dropped, or the part of a line
        # that a failed write (a full disk) left, never prefixes this one
        size = append_bytes_durably(journal_path(self.path, state["sha256"]), line, keep=state["journal_bytes"])
        self._mark_persisted(state, last=last, journal_bytes=size)

    def compact(self) -> None:
        """Write the whole ledger atomically to ``path`` and remove the journal it folds in (nothing without a
        path). A crash in between leaves the new ledger and a journal that names the old one, which no load reads.
        """
        if self.path is None:
            return
        body = self.to_dict()
        state = self._persisted
        # a journal naming the new content cannot be this ledger's (it would be replayed onto it): removed first
        journal_path(self.path, body["sha256"]).unlink(missing_ok=True)
        # indented for reading while small; compact for long streams (a third of the size, far from the
        # 16 MiB that dpcl reads at most)
        long_stream = len(self.charges) + len(self.releases) > COMPACT_LEDGER_ENTRIES
        write_json_atomic(self.path, body, indent=None if long_stream else 2)
        if state is not None and state["path"] == self.path:
            journal_path(self.path, state["sha256"]).unlink(missing_ok=True)
        self._persisted = {"path": self.path, "sha256": body["sha256"], "ledger_bytes": self.path.stat().st_size}
        self._mark_persisted(self._persisted, last=body["sha256"], journal_bytes=0)

    def _mark_persisted(self, state: dict[str, Any], *, last: str, journal_bytes: int) -> None:
        """Record that everything in memory is on disk: ``last`` is the hash the next journal line chains to,
        ``journal_bytes`` the length of the journal's complete lines."""
        state.update(charges=len(self.charges), releases=len(self.releases), metadata=_canonical(self.metadata),
                     last=last, journal_bytes=journal_bytes)
        self._units_dirty = set()

    def _journal_line(self, state: Mapping[str, Any]) -> tuple[bytes | None, str]:
        """The journal line of the changes since ``state`` (None when nothing changed) and its hash."""
        body: dict[str, Any] = {"ledger": state["sha256"], "prev": state["last"]}
        n = state["charges"]
        if len(self.charges) > n:
            entries = charges_to_list(self.charges[n:])
            if n and self.charges[n] == self.charges[n - 1]:  # the run of the last saved charge goes on
                entries[0] = {"repeat_previous": entries[0].get("repeat", 1)}
            body["charges"] = entries
        if len(self.releases) > state["releases"]:
            body["releases"] = self._releases_to_list(state["releases"])
        if self._units_dirty:
            body["units"] = {str(t): self._units[t] for t in sorted(self._units_dirty) if t in self._units}
        metadata = _canonical(self.metadata)
        if metadata != state["metadata"]:
            body["metadata"] = _json_patch(json.loads(state["metadata"]), json.loads(metadata))
        if len(body) == 2:
            return None, state["last"]
        body["sha256"] = hashlib.sha256(_canonical(body).encode()).hexdigest()
        return (json.dumps(body, separators=(",", ":"), allow_nan=False) + "\n").encode(), body["sha256"]

    def _replay_journal(self, ledger_sha256: str, ledger_bytes: int) -> None:
        """Apply the lines of this ledger's journal (if any) in order, each checked against its hash and chained
        to the previous one (the first to the ledger's hash); a damaged or foreign line raises
        :class:`LedgerCorruptError`. A last line without its final newline is a torn write: dropped (the save
        that wrote it never returned), and cut off before the next line is appended."""
        assert self.path is not None
        jpath = journal_path(self.path, ledger_sha256)
        state: dict[str, Any] = {"path": self.path, "sha256": ledger_sha256, "ledger_bytes": ledger_bytes}
        try:
            raw = read_bytes_limited(jpath, MAX_JSON_BYTES, "ledger journal")
        except FileNotFoundError:
            raw = b""
        except FileTooLargeError as exc:
            raise LedgerCorruptError(f"{exc}; restore the ledger and its journal from a backup.") from exc
        complete, newline, torn = raw.rpartition(b"\n")
        last = ledger_sha256
        lines = complete.split(b"\n") if newline else []
        for k, line in enumerate(lines):
            where = f"ledger journal {str(jpath)!r} line {k + 1}"
            try:
                entry = parse_json(line.decode("utf-8"))
                stated = entry.pop("sha256") if isinstance(entry, dict) else None
                actual = hashlib.sha256(_canonical(entry).encode()).hexdigest()
            except (ValueError, UnicodeDecodeError, TypeError) as exc:
                raise LedgerCorruptError(
                    f"{where} is not valid JSON ({exc}): the journal was damaged. Restore the ledger and its journal "
                    "from a backup; they are never repaired automatically."
                ) from exc
            if stated != actual or entry.get("ledger") != ledger_sha256 or entry.get("prev") != last:
                raise LedgerCorruptError(
                    f"{where} failed its integrity check (its hash, or its chain to the ledger and the line before "
                    "it): it was edited, damaged or belongs to another ledger. Restore the ledger and its journal "
                    "from a backup; they are never repaired automatically."
                )
            try:
                self._apply_journal_entry(entry, where)
            except LedgerCorruptError:
                raise
            except (KeyError, TypeError, ValueError, IndexError, InvalidParameterError, PrivacyViolationError) as exc:
                raise LedgerCorruptError(f"{where} is inconsistent: {exc}") from exc
            last = stated
        self.torn_journal_bytes = len(torn)
        self._persisted = state
        self._mark_persisted(state, last=last, journal_bytes=len(raw) - len(torn))
        state["lines"] = len(lines)

    def _apply_journal_entry(self, entry: Mapping[str, Any], where: str) -> None:
        """Add one journal line's charges, releases, unit ids and metadata changes to the ledger."""
        entries = entry.get("charges", [])
        if not isinstance(entries, list):
            raise LedgerCorruptError(f"{where}: charges must be a list.")
        previous = None
        repeated: list[Charge] = []
        if entries and isinstance(entries[0], dict) and "repeat_previous" in entries[0]:
            count = entries[0]["repeat_previous"]
            if set(entries[0]) != {"repeat_previous"} or isinstance(count, bool) or not isinstance(count, int) \
                    or count < 1 or not self.charges:
                raise LedgerCorruptError(f"{where}: repeat_previous must be a count >= 1 of a charge already recorded.")
            previous = self.charges[-1]
            entries = entries[1:]
            repeated = [previous] * min(count, MAX_CHARGES + 1)
        charges = charges_from_list(entries, f"{where} charges")
        if len(self.charges) + len(repeated) + len(charges) > MAX_CHARGES:
            raise LedgerCorruptError(f"{where}: the ledger would hold more than {MAX_CHARGES:.0e} charges.")
        self._load_charges([*repeated, *charges], where, previous=previous)
        self._load_releases(entry.get("releases", []), where, LEDGER_VERSION)
        units = entry.get("units", {})
        if not isinstance(units, dict) or not all(isinstance(v, list) for v in units.values()):
            raise LedgerCorruptError(f"{where}: units must map task indices to lists of unit ids.")
        for t, ids in units.items():
            self._units[int(t)] = list(ids)
        _apply_json_patch(self.metadata, entry.get("metadata", []), where)

    @classmethod
    def from_dict(cls, data: Any, *, path: "str | os.PathLike[str] | None" = None) -> Self:
        where = f"ledger {str(path)!r}" if path is not None else "ledger"
        if not isinstance(data, dict) or data.get("format") != LEDGER_FORMAT:
            raise LedgerCorruptError(f"{where} is not a dpcl task ledger (missing format {LEDGER_FORMAT!r}).")
        stated = data.get("sha256")
        body = {k: v for k, v in data.items() if k != "sha256"}
        try:
            actual = hashlib.sha256(_canonical(body).encode()).hexdigest()
        except (TypeError, ValueError) as exc:
            raise LedgerCorruptError(f"{where} holds values that are not plain JSON: {exc}.") from exc
        if stated != actual:
            raise LedgerCorruptError(
                f"{where} failed its integrity check (stored sha256 {str(stated)[:12]}..., content {actual[:12]}...): "
                "it was edited or damaged. Restore it from a backup; it is never replaced automatically."
            )
        version = data.get("version")
        if isinstance(version, bool) or version not in READABLE_LEDGER_VERSIONS:
            raise LedgerCorruptError(
                f"{where} has version {version!r}; this dpcl reads {', '.join(map(str, READABLE_LEDGER_VERSIONS))}."
            )
        try:
            s = data["settings"]
            ledger = cls(
                delta=s["delta"],
                across_tasks=s["across_tasks"],
                accountant=s["accountant"],
                adjacency=s["adjacency"],
                unit=s["unit"],
                total_epsilon=s["total_epsilon"],
                total_delta=s["total_delta"],
                path=None,
                metadata=data.get("metadata", {}),
            )
            charges = (
                [Charge.from_dict(c) for c in data["charges"]] if version == 1 else charges_from_list(data["charges"])
            )
            ledger._units = {int(k): list(v) for k, v in data.get("units", {}).items()}
            ledger._load_charges(charges, where)
            ledger._load_releases(data["releases"], where, version)
        except LedgerCorruptError:
            raise
        except (KeyError, TypeError, ValueError, InvalidParameterError, PrivacyViolationError) as exc:
            raise LedgerCorruptError(f"{where} is inconsistent: {exc}") from exc
        ledger.path = None if path is None else Path(path)
        return ledger

    def _load_charges(self, charges: Sequence[Charge], where: str, previous: Charge | None = None) -> None:
        """Check and append charges read from a file (the ledger or its journal): each distinct charge reads a task
        and holds events under the ledger's settings; every one is admitted to the filter. ``previous`` is a charge
        already appended whose repetitions ``charges`` may continue (checked already)."""
        checked = previous
        offset = len(self.charges)
        for i, c in enumerate(charges):
            if c is checked:  # a repeated charge: checked already (admitted to the filter below every time)
                if self.uses_filter:
                    self._admit(c)
                self._append(c)
                continue
            checked = c
            if not c.tasks or any(t < 0 for t in c.tasks) or not c.events:
                raise LedgerCorruptError(
                    f"{where}: charge {offset + i} must read at least one task index >= 0 and hold at least one event."
                )
            for e in c.events:
                if e.adjacency is not self.adjacency or e.unit != self.unit:
                    raise LedgerCorruptError(
                        f"{where}: charge {offset + i} holds an event under {e.adjacency.value!r} / {e.unit!r} but the "
                        f"ledger accounts {self.adjacency.value!r} / {self.unit!r}."
                    )
            if self.across_tasks == "sequential" and len(c.tasks) > 1:
                _composition_groups([c], "sequential")
            if self.uses_filter:
                self._admit(c)
            self._append(c)

    def _load_releases(self, entries: Any, where: str, version: int) -> None:
        """Check and append release records read from a file (the ledger or its journal)."""
        for r in entries:
            g = r["guarantee"]
            kept = g.get("groups_kept", 0) if version >= 2 else 0
            if g.get("notes") == "same" and not (version >= 2 and self.releases):
                raise LedgerCorruptError(f"{where}: release {len(self.releases)} refers to a previous release's notes.")
            previous_groups = self.releases[-1].guarantee.groups if self.releases else ()
            if isinstance(kept, bool) or not isinstance(kept, int) or not 0 <= kept <= len(previous_groups):
                raise LedgerCorruptError(
                    f"{where}: release {len(self.releases)} keeps {kept!r} groups of the previous release, "
                    f"which has {len(previous_groups)}."
                )
            guarantee = StreamGuarantee(
                epsilon=float(g["epsilon"]),
                delta=float(g["delta"]),
                across_tasks=g["across_tasks"],
                accountant=g["accountant"],
                adjacency=g["adjacency"],
                unit=g["unit"],
                groups=_extended(previous_groups, kept, [GroupGuarantee.from_dict(x) for x in g["groups"]]),
                notes=(
                    self.releases[-1].guarantee.notes
                    if version >= 2 and g.get("notes") == "same" and self.releases
                    else tuple(str(n) for n in g.get("notes", ()))
                ),
            )
            record = ReleaseRecord(int(r["task_index"]), int(r["n_charges"]), guarantee, r.get("checkpoint_sha256"))
            previous = self.releases[-1].n_charges if self.releases else 1
            if not previous <= record.n_charges <= len(self.charges):
                raise LedgerCorruptError(
                    f"{where}: release {len(self.releases)} covers {record.n_charges} charges; releases must "
                    f"cover a non-decreasing number of charges between 1 and the {len(self.charges)} recorded."
                )
            stated = (guarantee.delta, guarantee.across_tasks, guarantee.adjacency, guarantee.unit)
            expected = (self.delta, self.across_tasks, self.adjacency.value, self.unit)
            if stated != expected:
                raise LedgerCorruptError(
                    f"{where}: release {len(self.releases)} states (delta, across_tasks, adjacency, unit) = "
                    f"{stated} but the ledger's settings are {expected}."
                )
            self.releases.append(record)

    @classmethod
    def load(cls, path: "str | os.PathLike[str]") -> Self:
        """Load a saved ledger and the lines of its journal (:meth:`save`); a missing file raises
        FileNotFoundError, a damaged ledger or journal LedgerCorruptError."""
        p = Path(path)
        with collector_paused():
            try:
                size = p.stat().st_size
                data = read_json(p)
            except FileNotFoundError:
                raise
            except (ValueError, UnicodeDecodeError) as exc:
                raise LedgerCorruptError(
                    f"ledger {str(p)!r} is truncated or not valid JSON ({exc}); it is never replaced automatically: "
                    "restore it from a backup or move it away deliberately."
                ) from exc
            ledger = cls.from_dict(data, path=p)
            ledger._replay_journal(data["sha256"], size)
        return ledger

    @classmethod
    def open(cls, path: "str | os.PathLike[str]", *, must_exist: bool = False, **settings: Any) -> Self:
        """Resume the ledger at ``path`` if it exists (its settings must match), else create it there.

        A resumed ledger keeps every charge and release already recorded. A caller resuming a run that
        has already released something passes ``must_exist=True``: a missing ledger then raises
        :class:`~dpcl.errors.LedgerCorruptError` instead of starting an empty one, which would drop the
        budget already spent and understate every later guarantee.
        """
        p = Path(path)
        if must_exist and not p.exists():
            raise LedgerCorruptError(
                f"ledger {str(p)!r} is missing but the run being resumed has already released checkpoints: "
                "starting a new ledger would forget the budget they spent. Restore the ledger from a backup, "
                "or start the run over in a new directory."
            )
        if p.exists():
            ledger = cls.load(p)
            fresh = cls(**settings)
            mismatched = {
                k: (ledger.settings()[k], v) for k, v in fresh.settings().items() if ledger.settings()[k] != v
            }
            if mismatched:
                desc = "; ".join(f"{k}: ledger has {a!r}, run asks {b!r}" for k, (a, b) in mismatched.items())
                raise ConfigError(
                    f"ledger {str(p)!r} was written with different privacy settings ({desc}). "
                    "Resume with the original settings or start a new ledger file."
                )
            if settings.get("metadata"):
                ledger.metadata.update(settings["metadata"])
            if ledger._persisted["lines"] or ledger.torn_journal_bytes:
                ledger.compact()  # a resumed run starts from one file again
            return ledger
        ledger = cls(path=p, **settings)
        ledger.save()
        return ledger
