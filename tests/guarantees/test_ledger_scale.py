"""Bookkeeping at scale: repetition stored once with its count (events, charges, releases), never expanded.

Soundness of the compressed form is checked against dp-accounting composing the *expanded* events one by one
(not against dpcl); the incremental parallel composition against :func:`compose_stream`; old (version 1)
ledgers against the loader; the task-count bounds against the config parser.
"""

from __future__ import annotations

import copy
import hashlib
import json

import pytest

from dpcl.accounting.events import GaussianEvent, LaplaceEvent, PoissonSampledGaussianEvent, RepeatedEvent
from dpcl.errors import ConfigError, LedgerCorruptError, MalformedCertificateError
from dpcl.guarantees import ledger as ledger_module
from dpcl.guarantees import ledger_store
from dpcl.guarantees import stream_composition as composition_module
from dpcl.guarantees.certificates import (
    CERTIFICATE_VERSION,
    REPEATED_CHARGES_VERSION,
    certificate_from_ledger,
    content_sha256,
    verify_certificate,
    write_certificate,
)
from dpcl.guarantees.config import MAX_COMPOSED_TASKS, MAX_TASKS, parse_config
from dpcl.guarantees.cross_check import cross_check_certificate
from dpcl.guarantees.ledger import TaskLedger, charges_to_list, compose_stream, compress_events
from dpcl.guarantees.method_schema import ReleaseCoverage

DELTA = 1e-5
STEP = PoissonSampledGaussianEvent(noise_multiplier=1.0, sample_rate=0.01)
COVERED = ReleaseCoverage.post_processing("The checkpoint is a post-processing of the charged releases.")


def _dp_accounting_pld_epsilon(dp_events) -> float:
    """dp-accounting's PLD accountant composing ``dp_events`` one at a time (the expanded form)."""
    from dp_accounting.pld.pld_privacy_accountant import PLDAccountant

    accountant = PLDAccountant()
    for event in dp_events:
        accountant.compose(event)
    return float(accountant.get_epsilon(DELTA))


def test_stated_indices_compare_with_increasing_ones_without_expanding():
    from dpcl.guarantees.ledger import compact_indices, expand_indices, indices_equal

    increasing = [(), (3,), tuple(range(100)), (0, 2, 4, 5, 6, 8), (5, 6, 7, 9, 10, 11, 12, 40)]
    stated = [*(compact_indices(list(v)) for v in increasing), *(list(v) for v in increasing),
              [[0, 99]], [[1, 100]], [[0, 98]], [0, [2, 5]], [[5, 7], 9, [10, 12], 40], [[5, 7], [9, 12]], [40],
              [[0, 3], [3, 6]], [2, 1], [[5, 7], [9, 12], 40, 41]]
    for got in increasing:
        for value in stated:
            assert indices_equal(value, got) == (expand_indices(value) == got), (value, got)
    for bad in ([[3, 1]], [[0, 10**12]], [True], 5):
        with pytest.raises(Exception, match="range|indices|integers"):
            indices_equal(bad, (0,))


def test_index_runs_are_stored_as_ranges():
    from dpcl.guarantees.ledger import compact_indices, expand_indices

    assert compact_indices([0, 1, 2, 3, 7, 9, 10, 11, 12]) == [[0, 3], 7, [9, 12]]
    assert compact_indices([4, 5]) == [4, 5]
    for values in ([], [3], list(range(100)), [0, 2, 4, 5, 6, 8]):
        assert expand_indices(compact_indices(values)) == tuple(values)
    for bad in ([[3, 1]], [[0, 10**12]], [[0, 1, 2]], ["1"], [True], 5):
        with pytest.raises(Exception, match="range|indices|integers"):
            expand_indices(bad)


def test_compress_events_stores_each_run_once_with_its_count():
    g, h = GaussianEvent(sigma=2.0), GaussianEvent(sigma=3.0)
    assert compress_events([g, g, g]) == (RepeatedEvent(g, 3),)
    assert compress_events([g, h, g]) == (g, h, g)  # not consecutive: kept in order
    assert compress_events([RepeatedEvent(g, 4), g, RepeatedEvent(g, 2), h]) == (RepeatedEvent(g, 7), h)
    single = RepeatedEvent(g, 1)
    assert compress_events([single])[0] is single  # a run of one is kept as given


def test_charge_stores_a_run_of_equal_events_as_one_repeated_event():
    ledger = TaskLedger(delta=DELTA, across_tasks="parallel", accountant="pld")
    charge = ledger.charge(0, [STEP] * 40)
    assert charge.events == (RepeatedEvent(STEP, 40),)
    assert json.dumps(charge.to_dict()).count("poisson_sampled_gaussian") == 1


def test_compressed_steps_give_dp_accountings_epsilon_of_the_expanded_steps():
    from dp_accounting import dp_event

    ledger = TaskLedger(delta=DELTA, across_tasks="sequential", accountant="pld")
    for _ in range(3):  # three equal charges of 4 equal steps each: one stored charge, one stored event
        ledger.charge(0, [STEP] * 4)
    assert len(charges_to_list(ledger.charges)) == 1 and ledger.charges[0].events == (RepeatedEvent(STEP, 4),)
    expanded = [dp_event.PoissonSampledDpEvent(0.01, dp_event.GaussianDpEvent(1.0))] * 12
    reference = _dp_accounting_pld_epsilon(expanded)
    assert ledger.guarantee().epsilon == pytest.approx(reference, rel=2e-3)


@pytest.mark.parametrize("accountant", ["exact", "basic"])
def test_compressed_gaussian_and_laplace_runs_match_dp_accounting_on_the_expanded_events(accountant):
    from dp_accounting import dp_event

    if accountant == "exact":
        events, expanded = [GaussianEvent(sigma=5.0)] * 10, [dp_event.GaussianDpEvent(5.0)] * 10
    else:
        events, expanded = [LaplaceEvent(scale=20.0)] * 10, [dp_event.LaplaceDpEvent(20.0)] * 10
    ledger = TaskLedger(delta=DELTA, across_tasks="sequential", accountant=accountant)
    ledger.charge(0, events)
    ledger.charge(0, events)
    epsilon = ledger.guarantee().epsilon
    reference = _dp_accounting_pld_epsilon(expanded * 2)
    if accountant == "exact":
        assert epsilon == pytest.approx(reference, rel=1e-3)  # exact vs a fine PLD of the same 20 mechanisms
    else:
        assert epsilon == pytest.approx(20 / 20.0, rel=1e-12) and epsilon >= reference  # basic: sum, >= PLD


def _events_ledger(tasks: int, per_task: int, steps: int = 10) -> TaskLedger:
    ledger = TaskLedger(delta=DELTA, across_tasks="parallel", accountant="rdp")
    for t in range(tasks):
        for _ in range(per_task):
            ledger.charge(t, RepeatedEvent(STEP, steps), label=f"task {t}")
        ledger.release(t)
    return ledger


def test_equal_consecutive_charges_are_one_entry_on_disk_and_load_back(tmp_path):
    ledger = _events_ledger(3, 25)
    path = tmp_path / "ledger.json"
    ledger.path = path
    ledger.save()
    data = json.loads(path.read_text())
    assert data["version"] == 2
    assert [c["repeat"] for c in data["charges"]] == [25, 25, 25]
    assert [r["guarantee"]["groups_kept"] for r in data["releases"]] == [0, 1, 2]
    assert [len(r["guarantee"]["groups"]) for r in data["releases"]] == [1, 1, 1]
    loaded = TaskLedger.load(path)
    assert len(loaded.charges) == 75 and loaded.charges[0] is loaded.charges[24]
    assert loaded.guarantee() == ledger.guarantee()
    assert [r.guarantee for r in loaded.releases] == [r.guarantee for r in ledger.releases]
    assert loaded.to_dict() == ledger.to_dict()


def _as_version_1(ledger: TaskLedger) -> dict:
    """The ledger as dpcl wrote it before format 2: every charge and every release's groups written out."""
    body = {
        "format": "dpcl-task-ledger",
        "version": 1,
        "settings": ledger.settings(),
        "metadata": ledger.metadata,
        "charges": [c.to_dict() for c in ledger.charges],
        "releases": [
            {"task_index": r.task_index, "n_charges": r.n_charges, "checkpoint_sha256": r.checkpoint_sha256,
             "guarantee": {**r.guarantee.to_dict(), "groups": [g.to_dict() for g in r.guarantee.groups]}}
            for r in ledger.releases
        ],
        "units": {},
    }
    for r in body["releases"]:
        r["guarantee"].pop("groups_kept", None)
    body["sha256"] = hashlib.sha256(ledger_module._canonical(body).encode()).hexdigest()
    return body


def test_version_1_ledgers_still_load(tmp_path):
    ledger = _events_ledger(2, 3)
    path = tmp_path / "v1.json"
    path.write_text(json.dumps(_as_version_1(ledger)))
    loaded = TaskLedger.load(path)
    assert len(loaded.charges) == 6 and loaded.guarantee() == ledger.guarantee()
    assert [r.guarantee for r in loaded.releases] == [r.guarantee for r in ledger.releases]


@pytest.mark.parametrize(
    "edit, message",
    [
        (lambda d: d["charges"][0].__setitem__("repeat", 10**12), "at most"),
        (lambda d: d["charges"][0].__setitem__("repeat", 0), "repeat"),
        (lambda d: d["releases"][1]["guarantee"].__setitem__("groups_kept", 5), "keeps 5 groups"),
        (lambda d: d["releases"][0]["guarantee"].__setitem__("notes", "same"), "previous release's notes"),
    ],
)
def test_malformed_compressed_ledgers_are_refused(tmp_path, edit, message):
    data = _events_ledger(2, 3).to_dict()
    edit(data)
    data.pop("sha256")
    data["sha256"] = hashlib.sha256(ledger_module._canonical(data).encode()).hexdigest()
    with pytest.raises(LedgerCorruptError, match=message):
        TaskLedger.from_dict(data)


def test_incremental_parallel_guarantee_equals_compose_stream():
    ledger = TaskLedger(delta=DELTA, across_tasks="parallel", accountant="exact")
    order = [3, 0, 3, 1, 5, 0, 2, 2, 4, 1]  # out of order, tasks charged again later, equal tasks
    for step, t in enumerate(order):
        ledger.charge(t, GaussianEvent(sigma=2.0 + (t % 3) + 0.5 * (step % 2)))
        got = ledger.guarantee()
        want = compose_stream(ledger.charges, "parallel", DELTA, "exact")
        assert (got.epsilon, got.accountant, got.groups) == (want.epsilon, want.accountant, want.groups)
        assert set(got.notes) == set(want.notes)


def test_a_long_parallel_stream_runs_the_accountant_once_per_distinct_group(monkeypatch):
    calls = []
    real = composition_module._compute

    def counting(events, delta, accountant):
        calls.append(events)
        return real(events, delta, accountant)

    monkeypatch.setattr(composition_module, "_compute", counting)
    ledger = TaskLedger(delta=DELTA, across_tasks="parallel", accountant="exact")
    for t in range(2000):
        ledger.charge(t, GaussianEvent(sigma=4.0))
        ledger.task_guarantee(t)
        ledger.release(t)
    assert len(calls) == 1
    data = ledger.to_dict()
    assert sum(len(r["guarantee"]["groups"]) for r in data["releases"]) == 2000  # one new group per release


def _certificate(ledger: TaskLedger, path, index: int = -1) -> dict:
    ckpt = path.parent / "task.pt"
    ckpt.write_bytes(b"weights")
    cert = certificate_from_ledger(ledger, method="naive", label_space="prior_const", assumptions=["Public labels."],
                                   release=COVERED, checkpoint=ckpt, release_index=index)
    write_certificate(path, cert)
    return cert


def test_certificate_with_repeated_charges_is_version_3_and_verifies_and_cross_checks(tmp_path):
    ledger = _events_ledger(2, 6, steps=2)
    path = tmp_path / "task.cert.json"
    cert = _certificate(ledger, path)
    assert cert["version"] == REPEATED_CHARGES_VERSION
    assert [c["repeat"] for c in cert["events"]] == [6, 6]
    assert [g["charges"] for g in cert["guarantee"]["groups"]] == [[[0, 5]], [[6, 11]]]
    report = verify_certificate(path)
    assert report.valid, [c.to_dict() for c in report.failed]
    cross = cross_check_certificate(path)
    assert cross.passed
    (group,) = {g.independent_epsilon for s in cross.statements for g in s.groups}  # equal groups: one result
    from dp_accounting import dp_event

    expanded = [dp_event.PoissonSampledDpEvent(0.01, dp_event.GaussianDpEvent(1.0))] * 12
    assert group == pytest.approx(_dp_accounting_pld_epsilon(expanded), rel=1e-6)


def test_certificates_without_repeated_charges_stay_version_2(tmp_path):
    ledger = TaskLedger(delta=DELTA, across_tasks="parallel", accountant="rdp")
    ledger.charge(0, [STEP] * 50)  # a run of equal events is a RepeatedEvent, which version 2 already has
    ledger.release(0)
    cert = _certificate(ledger, tmp_path / "c.cert.json")
    assert cert["version"] == CERTIFICATE_VERSION == 2
    assert verify_certificate(tmp_path / "c.cert.json").valid


def _rewrite(path, edit) -> None:
    data = json.loads(path.read_text())
    edit(data)
    data["sha256"] = content_sha256(data)
    path.write_text(json.dumps(data))


def test_an_edited_repeat_count_fails_verification(tmp_path):
    path = tmp_path / "task.cert.json"
    _certificate(_events_ledger(2, 30), path)
    _rewrite(path, lambda d: d["events"][1].__setitem__("repeat", 3))
    report = verify_certificate(path)
    assert not report.valid and "composition_groups" in {c.name for c in report.failed}


@pytest.mark.parametrize(
    "edit, message",
    [
        (lambda d: d.__setitem__("version", 2), "only certificate version 3"),
        (lambda d: d["events"][0].__setitem__("repeat", 10**13), "at most"),
        (lambda d: d["events"][0].__setitem__("repeat", -1), "repeat"),
    ],
)
def test_malformed_repeats_in_certificates_are_refused(tmp_path, edit, message):
    path = tmp_path / "task.cert.json"
    _certificate(_events_ledger(2, 30), path)
    _rewrite(path, edit)
    with pytest.raises(MalformedCertificateError, match=message):
        verify_certificate(path)


def _config(n_tasks: int, *, disjoint: bool = True, across: str = "auto", method: str = "cosine") -> dict:
    return {
        "privacy": {"epsilon": 1.0, "delta": 1e-5, "across_tasks": across},
        "stream": {"dataset": "custom", "task_sizes": [100] * n_tasks, "label_space": "prior_const",
                   "prior_labels": [0, 1], "disjoint_units": disjoint},
        "method": {"name": method,
                   **({} if method == "cosine" else {"epochs": 1, "batch_size": 10, "max_grad_norm": 1.0})},
    }


def test_task_count_bounds():
    assert parse_config(_config(MAX_TASKS)).n_tasks == MAX_TASKS == 10_000
    with pytest.raises(ConfigError, match=rf"task_sizes gives {MAX_TASKS + 1} tasks.*at most {MAX_TASKS} tasks"):
        parse_config(_config(MAX_TASKS + 1))
    assert parse_config(_config(MAX_COMPOSED_TASKS, disjoint=False)).n_tasks == MAX_COMPOSED_TASKS
    for raw in (_config(MAX_COMPOSED_TASKS + 1, disjoint=False),
                _config(MAX_COMPOSED_TASKS + 1, across="sequential"),
                _config(MAX_COMPOSED_TASKS + 1, method="non_cl")):
        with pytest.raises(ConfigError, match=rf"at most {MAX_COMPOSED_TASKS} tasks when every release.*disjoint_units"):
            parse_config(raw)


def test_audit_of_thousands_of_equal_tasks(monkeypatch):
    from dpcl.audit_config import audit_config

    config = parse_config(_config(3000))
    report = audit_config(config, [100] * 3000)
    assert report.sound and len(report.per_task) == 3000
    assert {p["cumulative_epsilon"] for p in report.per_task} == {report.epsilon}
    task_notes = [n for n in report.notes if n.startswith("task")]
    assert len(task_notes) == 1 and task_notes[0].startswith("tasks 0-2999: Gaussian noise sigma=")


def test_charges_to_list_is_a_copy_not_a_view():
    ledger = _events_ledger(1, 4)
    first = charges_to_list(ledger.charges)
    second = copy.deepcopy(first)
    first[0]["repeat"] = 99
    assert charges_to_list(ledger.charges) == second


def test_released_groups_never_change_when_a_task_is_charged_again(tmp_path):
    ledger = TaskLedger(delta=DELTA, across_tasks="parallel", accountant="exact", path=tmp_path / "l.json")
    for t in range(4):
        ledger.charge(t, GaussianEvent(sigma=3.0))
        ledger.release(t)
    before = [tuple(r.guarantee.groups) for r in ledger.releases]
    ledger.charge(1, GaussianEvent(sigma=2.0))  # task 1 again, after releases that state its group
    ledger.release(1)
    assert [tuple(r.guarantee.groups) for r in ledger.releases[:4]] == before
    want = compose_stream(ledger.charges, "parallel", DELTA, "exact")
    assert ledger.releases[-1].guarantee.groups == want.groups and ledger.guarantee().epsilon == want.epsilon
    loaded = TaskLedger.load(tmp_path / "l.json")
    assert [r.guarantee for r in loaded.releases] == [r.guarantee for r in ledger.releases]
    loaded.charge(4, GaussianEvent(sigma=1.0))
    assert loaded.guarantee() == compose_stream(loaded.charges, "parallel", DELTA, "exact")


def test_resume_recognises_a_pending_charge_whose_equal_events_the_ledger_compressed():
    from dpcl.certification.arguments import _uncommitted_charge

    ledger = TaskLedger(delta=DELTA, across_tasks="parallel", accountant="rdp")
    charge = ledger.charge(0, [STEP] * 3)  # stored as RepeatedEvent(STEP, 3)
    assert _uncommitted_charge(ledger, [0], [STEP] * 3) is charge
    assert _uncommitted_charge(ledger, [0], [STEP] * 2) is None


def _parsed(entries, which: int):
    """Charge ``which`` of ``entries`` parsed together, or the type of the error the parse raises."""
    try:
        return ledger_module.charges_from_list(entries)[which]
    except Exception as exc:  # noqa: BLE001  (errors are compared between two parses)
        return type(exc)


@pytest.mark.parametrize("count", [1000, 1000.0, True, "1000", -5, 10**20])
def test_charges_with_the_same_events_json_share_their_parsed_events_and_nothing_else(count):
    good = {"tasks": [0], "label": "a", "events": [RepeatedEvent(STEP, 1000).to_dict()]}
    other = copy.deepcopy(good) | {"tasks": [1], "label": "b"}
    other["events"][0]["count"] = count  # 1000.0 and True equal 1000 in Python but are other JSON
    alone, shared = _parsed([other], 0), _parsed([good, other], 1)
    assert shared == alone  # parsed next to an equal-looking entry: the same events, or the same error
    if not isinstance(shared, type):
        first = ledger_module.charges_from_list([good, other])
        same_json = json.dumps(other["events"]) == json.dumps(good["events"])
        assert (first[0].events is first[1].events) == same_json
        assert (first[1].tasks, first[1].label) == ((1,), "b")


def _reference_groups(charges, across):
    """:func:`compose_stream`'s groups and events computed charge by charge (no runs, no sharing)."""
    out = []
    for tasks, idx in ledger_module._composition_groups(list(charges), across):
        events = ledger_module._group_events(list(charges), idx)  # walks every index
        out.append((tasks, idx, events))
    return out


@pytest.mark.parametrize("across", ["parallel", "sequential"])
def test_composition_by_runs_gives_the_charge_by_charge_groups(across):
    from dpcl.guarantees.ledger import Charge, ChargeRuns, charge_runs

    a, b, c = (Charge((t,), (GaussianEvent(sigma=2.0 + t),), f"t{t}") for t in range(3))
    both = Charge((0, 2), (GaussianEvent(sigma=5.0),), "both")
    plain = [a, a, a, b, a, a, c, b, b]  # task 0 read by two runs of one object with task 1 between them
    runs = ChargeRuns(plain, [(0, 3), (3, 4), (4, 6), (6, 7), (7, 9)])
    assert charge_runs(plain) == runs.runs
    cases = [plain, runs] + ([plain + [both, both]] if across == "parallel" else [])
    for charges in cases:
        want = _reference_groups(charges, across)
        got = ledger_module._groups_with_runs(charges, across)
        assert [(t, i) for t, i, _ in got] == [(t, i) for t, i, _ in want]
        for (_, idx, segments), (_, _, events) in zip(got, want):
            assert ledger_module._group_events(charges, idx, segments) == events
            assert all(a < b for a, b in zip(idx, idx[1:]))  # what indices_equal relies on
        stream = compose_stream(charges, across, DELTA, "exact")
        assert stream == compose_stream(list(charges), across, DELTA, "exact", cache={})
    assert ledger_module._group_events(plain, (0, 1, 2, 4, 5)) == (RepeatedEvent(a.events[0], 5),)


def test_verification_leaves_the_garbage_collector_as_it_found_it(tmp_path):
    import gc

    path = tmp_path / "task.cert.json"
    _certificate(_events_ledger(2, 3), path)
    assert gc.isenabled()
    assert verify_certificate(path).valid and gc.isenabled()
    gc.disable()
    try:
        assert verify_certificate(path).valid and not gc.isenabled()
    finally:
        gc.enable()


# -- the journal: saves append what changed ------------------------------------------------------------------------
def _journal(path):
    (journal,) = path.parent.glob(f"{path.name}.*.journal")
    return journal


def _journaled_ledger(path, tasks: int = 6) -> TaskLedger:
    """A ledger on disk whose saves after the first went to its journal: runs of equal charges that go on across
    saves, releases, unit ids, and metadata that grows, changes type and loses keys."""
    ledger = TaskLedger.open(path, delta=DELTA, across_tasks="parallel", accountant="rdp",
                             metadata={"run": {"certificates": [], "flag": 1, "gone": "x"}})
    for t in range(tasks):
        for _ in range(3):
            ledger.charge(t, RepeatedEvent(STEP, 10), label=f"task {t}")  # one object, saved three times
        ledger.register_units(t, [f"u{t}-{i}" for i in range(4)])
        ledger.release(t, checkpoint_sha256=f"{t:064x}")
        ledger.metadata["run"]["certificates"].append(f"task{t}.cert.json")
        ledger.metadata["run"]["flag"] = True if t % 2 else 1  # equal in Python, other JSON
        ledger.metadata["run"].pop("gone", None)
        ledger.save()
    return ledger


def test_the_journal_loads_back_to_the_ledger_in_memory(tmp_path):
    path = tmp_path / "ledger.json"
    ledger = _journaled_ledger(path)
    assert json.loads(path.read_text())["charges"] == []  # the first save; the rest is in the journal
    loaded = TaskLedger.load(path)
    assert loaded.to_dict() == ledger.to_dict()
    assert loaded.metadata["run"]["flag"] is True and "gone" not in loaded.metadata["run"]
    assert loaded.guarantee() == ledger.guarantee()
    assert [loaded.charges[i] is loaded.charges[i + 1] for i in (0, 1)] == [True, True]  # a run stays one object
    ledger.compact()
    assert not list(tmp_path.glob("*.journal")) and TaskLedger.load(path).to_dict() == loaded.to_dict()


def test_a_save_appends_what_changed_only(tmp_path):
    """Bytes written per release do not grow with the stream (the whole file was rewritten every time)."""
    path = tmp_path / "ledger.json"
    ledger = TaskLedger.open(path, delta=DELTA, across_tasks="parallel", accountant="exact")
    sizes = []
    for t in range(300):
        ledger.charge(t, GaussianEvent(sigma=4.0), label="t")
        ledger.release(t)
        sizes.append(_journal(path).stat().st_size)
    growth = [b - a for a, b in zip(sizes, sizes[1:])]
    assert max(growth[-50:]) <= max(growth[:50]) + 16  # digits of larger indices at most
    assert path.stat().st_size < 2000  # the ledger itself was written once, empty
    assert TaskLedger.load(path).to_dict() == ledger.to_dict()


def test_a_torn_last_line_is_dropped_and_cut_off_by_the_next_save(tmp_path):
    path = tmp_path / "ledger.json"
    ledger = _journaled_ledger(path, tasks=2)
    journal = _journal(path)
    whole = journal.read_bytes()
    for cut in (1, len(whole.split(b"\n")[-2]) // 2, len(whole.split(b"\n")[-2])):  # a prefix of the last line
        journal.write_bytes(whole[: len(whole) - 1 - cut] if cut < len(whole.split(b"\n")[-2]) else whole[:-1])
        loaded = TaskLedger.load(path)
        assert loaded.torn_journal_bytes > 0
        assert len(loaded.releases) + len(loaded.charges) < len(ledger.releases) + len(ledger.charges) or \
            loaded.metadata != ledger.metadata  # the torn save is not there
    loaded.charge(5, GaussianEvent(sigma=3.0))  # cuts the torn tail off first
    again = TaskLedger.load(path)
    assert again.torn_journal_bytes == 0 and again.to_dict() == loaded.to_dict()


@pytest.mark.parametrize(
    "damage, message",
    [
        (lambda lines: lines.__setitem__(0, lines[0].replace(b'"task 0"', b'"task 9"')), "integrity"),
        (lambda lines: lines.pop(2), "integrity"),  # a line missing from the chain
        (lambda lines: lines.__setitem__(2, lines[2][:-5]), "not valid JSON"),  # torn, yet not the last line
        (lambda lines: lines.__setitem__(2, b""), "not valid JSON"),
    ],
)
def test_a_damaged_journal_line_is_refused(tmp_path, damage, message):
    path = tmp_path / "ledger.json"
    _journaled_ledger(path, tasks=2)
    journal = _journal(path)
    lines = journal.read_bytes().split(b"\n")
    damage(lines)
    journal.write_bytes(b"\n".join(lines))
    with pytest.raises(LedgerCorruptError, match=message):
        TaskLedger.load(path)


def test_a_resealed_journal_line_is_still_checked(tmp_path):
    """The line hash is not a signature: a resealed line that records an inconsistent charge is refused."""
    path = tmp_path / "ledger.json"
    _journaled_ledger(path, tasks=1)
    journal = _journal(path)
    lines = journal.read_bytes().split(b"\n")
    entry = json.loads(lines[0])
    entry["charges"][0]["events"][0]["event"]["unit"] = "user"
    entry.pop("sha256")
    entry["sha256"] = hashlib.sha256(ledger_module._canonical(entry).encode()).hexdigest()
    lines[0] = json.dumps(entry).encode()
    chained = json.loads(lines[1])  # the next line chains to the resealed one
    chained["prev"] = entry["sha256"]
    chained.pop("sha256")
    chained["sha256"] = hashlib.sha256(ledger_module._canonical(chained).encode()).hexdigest()
    lines[1] = json.dumps(chained).encode()
    journal.write_bytes(b"\n".join(lines))
    with pytest.raises(LedgerCorruptError, match="holds an event under"):
        TaskLedger.load(path)


def test_a_journal_is_folded_in_when_it_outgrows_the_ledger_and_a_crash_in_between_loses_nothing(
    tmp_path, monkeypatch
):
    monkeypatch.setattr(ledger_store, "JOURNAL_MIN_BYTES", 2000)
    path = tmp_path / "ledger.json"
    ledger = _journaled_ledger(path, tasks=8)
    assert len(json.loads(path.read_text())["releases"]) > 0  # folded in at least once
    assert TaskLedger.load(path).to_dict() == ledger.to_dict()
    # a crash after the rewrite and before the old journal's removal: that journal names the old content
    old_journal = _journal(path)
    saved = old_journal.read_bytes()
    ledger.compact()
    old_journal.write_bytes(saved)
    assert TaskLedger.load(path).to_dict() == ledger.to_dict()


def test_the_part_of_a_line_a_failed_write_left_is_cut_off_by_the_next_save(tmp_path, monkeypatch):
    import dpcl._io.atomic_io as atomic_io

    path = tmp_path / "ledger.json"
    ledger = _journaled_ledger(path, tasks=2)
    original = atomic_io.os.write

    def half_then_full(fd, data):  # a disk that fills up in the middle of the line
        original(fd, bytes(data[: len(data) // 2]))
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(atomic_io.os, "write", half_then_full)
    with pytest.raises(OSError):
        ledger.charge(7, GaussianEvent(sigma=3.0))
    monkeypatch.setattr(atomic_io.os, "write", original)
    assert TaskLedger.load(path).torn_journal_bytes > 0  # the half line is on disk, without its newline
    ledger.charge(8, GaussianEvent(sigma=3.0))  # saves the charge of task 7 too, after cutting the half line off
    loaded = TaskLedger.load(path)
    assert loaded.torn_journal_bytes == 0 and loaded.to_dict() == ledger.to_dict()
