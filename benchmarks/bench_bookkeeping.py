"""Bookkeeping at scale: ``dpcl audit``, the ledger and certificates for 10^4 tasks of 10^5 DP-SGD steps.

Usage (from the repository root)::

    .venv/bin/python benchmarks/bench_bookkeeping.py            # prints the report
    .venv/bin/python benchmarks/bench_bookkeeping.py --write    # also writes benchmarks/BOOKKEEPING.md
    .venv/bin/python benchmarks/bench_bookkeeping.py --tasks 100 --charges-per-task 10   # a quick look

What it builds and measures (issue 16, item 6), each stage in a child process of its own so that its wall
time and peak resident memory (``os.wait4``) are its own:

1. **audit**: a synthetic config of ``--tasks`` equal-size tasks (naive DP-SGD, 10^4 examples per task,
   batch 100, 1000 epochs: q = 0.01 and T = 10^5 steps per task, disjoint units, so parallel composition)
   and ``dpcl audit CONFIG --json`` on it.
2. **ledger**: the ledger a run of that config writes: each task's planned events charged before it is
   trained, a release after each task (``TaskLedger.charge`` / ``release`` exactly as ``dpcl run`` calls
   them), saved to disk once at the end; its size on disk, and the time to load it again.
3. **events**: the same stream with every task charged ``--charges-per-task`` times (one charge per block of
   10^5 / charges-per-task steps, as a training loop that charges every epoch would): a ledger of 10^6
   events at the defaults, whose equal consecutive charges are stored once with ``repeat``.
4. **certificates** of the first and the last release of both ledgers (the last one states every task's
   group), written with :func:`~dpcl.guarantees.certificates.write_certificate`; their sizes, and
   ``dpcl verify CERT --json`` on each (wall time and peak memory of the whole command).
5. **steps**: the size of a certificate of one task of 10^3 and of 10^5 steps, which must be equal up to the
   digits of the count (a run of steps is one ``RepeatedEvent``).
6. **journal**: a ledger written to disk as ``dpcl run`` writes it, saved after every charge and release, for
   ``--journal-tasks`` tasks: saves that append what changed to the ledger's journal (this dpcl) against saves
   that rewrite the whole file (``TaskLedger.compact`` at every save, as dpcl did before the journal): bytes
   written (``wchar`` of ``/proc/self/io``), wall and CPU time, and the bytes of the last 10% of the releases.

Goals (issue 16): audit < 10 s, verify < 1 s per certificate, peak memory < 2 GB. The calibration of the
noise multiplier (one calibration for equal-size tasks) is part of the audit time and is reported apart.
Times are wall-clock on the machine in the report's header; the load average is recorded with them.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(ROOT))

REPORT = HERE / "BOOKKEEPING.md"
EXAMPLES_PER_TASK = 10_000
BATCH_SIZE = 100
EPOCHS = 1000  # q = 0.01, T = 1000 * ceil(10^4 / 100) = 10^5 steps per task
GOALS = {"audit_seconds": 10.0, "verify_seconds": 1.0, "peak_mib": 2048.0}


def config_text(n_tasks: int, epochs: int = EPOCHS) -> str:
    sizes = ", ".join([str(EXAMPLES_PER_TASK)] * n_tasks)
    return (
        "[privacy]\nepsilon = 1.0\ndelta = 1e-5\nadjacency = \"add_remove\"\naccountant = \"auto\"\n"
        "across_tasks = \"parallel\"\n\n"
        f"[stream]\ndataset = \"synthetic\"\ntask_sizes = [{sizes}]\nlabel_space = \"prior_const\"\n"
        "prior_labels = [0, 1]\ndisjoint_units = true\n\n"
        f"[method]\nname = \"naive\"\nepochs = {epochs}\nbatch_size = {BATCH_SIZE}\nmax_grad_norm = 1.0\n"
        "adapter_dim = 16\nlearning_rate = 0.05\n"
    )


# -- child stages ---------------------------------------------------------------------------------------------
def _planned_events(config_path: Path) -> tuple[Any, list[Any]]:
    """The config and the events its first task's plan charges (every task is the same size)."""
    from dpcl.guarantees.config import load_config

    config = load_config(config_path)
    plan = config.spec.plan_task(config.method, config.settings, EXAMPLES_PER_TASK, 0)
    return config, list(plan.events)


def _split(event: Any, parts: int) -> list[Any]:
    """``RepeatedEvent(step, T)`` as ``parts`` charges of ``T / parts`` steps each (one charge per epoch block)."""
    from dpcl.accounting.events import RepeatedEvent

    if parts == 1:
        return [event]
    if not isinstance(event, RepeatedEvent) or event.count % parts:
        raise SystemExit(f"cannot split {event!r} into {parts} equal charges")
    return [RepeatedEvent(event.event, event.count // parts)] * parts


def stage_ledger(workdir: Path, n_tasks: int, charges_per_task: int, name: str) -> dict[str, Any]:
    from dpcl._io.atomic_io import sha256_file
    from dpcl.guarantees.certificates import certificate_from_ledger, write_certificate
    from dpcl.guarantees.ledger import TaskLedger
    from dpcl.guarantees.method_schema import ReleaseCoverage

    config, events = _planned_events(workdir / "config.toml")
    settings = config.settings
    blocks = [piece for e in events for piece in _split(e, charges_per_task)]
    checkpoint = workdir / f"{name}.pt"
    checkpoint.write_bytes(b"released weights")
    digest = sha256_file(checkpoint)
    start, cpu = time.perf_counter(), time.process_time()
    ledger = TaskLedger(delta=settings.delta, across_tasks="parallel", accountant=settings.accountant,
                        adjacency=events[0].adjacency, unit=events[0].unit, metadata={"config": config.to_dict()})
    for t in range(n_tasks):
        for block in blocks:
            ledger.charge(t, block, label=f"naive task {t}")
        ledger.release(t, checkpoint_sha256=digest)
    built, built_cpu = time.perf_counter() - start, time.process_time() - cpu
    path = workdir / f"{name}.ledger.json"
    start = time.perf_counter()
    ledger.path = path
    ledger.save()
    saved = time.perf_counter() - start
    start = time.perf_counter()
    loaded = TaskLedger.load(path)
    load_seconds = time.perf_counter() - start
    assert loaded.guarantee().epsilon == ledger.guarantee().epsilon
    covered = ReleaseCoverage.post_processing("The checkpoint is a post-processing of the charged DP-SGD runs.")
    certificates = {}
    for which, index in (("first", 0), ("last", -1)):
        cert = certificate_from_ledger(ledger, method="naive", label_space="prior_const",
                                       assumptions=["Tasks hold disjoint privacy units."], release=covered,
                                       checkpoint=checkpoint, release_index=index, config=config.to_dict())
        cert_path = workdir / f"{name}.{which}.cert.json"
        write_certificate(cert_path, cert)
        certificates[which] = {"path": str(cert_path), "bytes": cert_path.stat().st_size,
                               "version": cert["version"], "charge_entries": len(cert["events"])}
    return {
        "events_charged": len(ledger.charges) * len(events),
        "charges": len(ledger.charges),
        "epsilon": ledger.guarantee().epsilon,
        "build_seconds": built,
        "build_cpu_seconds": built_cpu,
        "save_seconds": saved,
        "load_seconds": load_seconds,
        "ledger_bytes": path.stat().st_size,
        "certificates": certificates,
    }


def _bytes_written() -> int | None:
    """Bytes this process has passed to ``write`` so far (Linux ``/proc/self/io``), None elsewhere."""
    try:
        for line in Path("/proc/self/io").read_text().splitlines():
            if line.startswith("wchar:"):
                return int(line.split()[1])
    except OSError:
        pass
    return None


def stage_journal(workdir: Path, n_tasks: int, mode: str) -> dict[str, Any]:
    """Charge and release ``n_tasks`` tasks into a ledger on disk, each save appending to the journal
    (``mode`` "append") or rewriting the whole ledger (``mode`` "rewrite")."""
    from dpcl.guarantees.ledger import TaskLedger

    config, events = _planned_events(workdir / "config.toml")
    settings = config.settings
    if mode == "rewrite":
        TaskLedger.save = TaskLedger.compact  # every save writes the whole file atomically
    directory = workdir / f"journal-{mode}"
    directory.mkdir()
    ledger = TaskLedger(delta=settings.delta, across_tasks="parallel", accountant=settings.accountant,
                        adjacency=events[0].adjacency, unit=events[0].unit, path=directory / "ledger.json",
                        metadata={"config": config.to_dict()})
    tail = max(1, n_tasks // 10)
    start, cpu, written = time.perf_counter(), time.process_time(), _bytes_written()
    for t in range(n_tasks):
        if t == n_tasks - tail:
            tail_written = _bytes_written()
        ledger.charge(t, events, label=f"naive task {t}")
        ledger.release(t, checkpoint_sha256="0" * 64)
    seconds, cpu_seconds, end = time.perf_counter() - start, time.process_time() - cpu, _bytes_written()
    loaded = TaskLedger.load(directory / "ledger.json")
    assert loaded.to_dict() == ledger.to_dict()
    return {
        "tasks": n_tasks,
        "seconds": seconds,
        "cpu_seconds": cpu_seconds,
        "bytes_written": None if written is None else end - written,
        "tail_bytes_per_release": None if written is None else (end - tail_written) / tail,
        "bytes_on_disk": sum(f.stat().st_size for f in directory.iterdir()),
    }


def stage_verify(path: Path) -> dict[str, Any]:
    """``verify_certificate`` on one certificate in a process that has imported dpcl already (as ``dpcl verify``
    does for the second and later certificates of one command)."""
    import dp_accounting.pld.privacy_loss_distribution  # noqa: F401  (imports a first verification pays for)
    import dp_accounting.rdp.rdp_privacy_accountant  # noqa: F401

    from dpcl.accounting import accountants  # noqa: F401
    from dpcl.guarantees.certificates import verify_certificate

    start, cpu = time.perf_counter(), time.process_time()
    report = verify_certificate(path)
    return {"seconds": time.perf_counter() - start, "cpu_seconds": time.process_time() - cpu, "valid": report.valid}


def stage_steps(workdir: Path) -> dict[str, Any]:
    """Certificate size of one task at 10^3 and at 10^5 steps."""
    from dpcl.guarantees.certificates import certificate_from_ledger, write_certificate
    from dpcl.guarantees.ledger import TaskLedger
    from dpcl.guarantees.method_schema import ReleaseCoverage

    sizes = {}
    for epochs in (10, EPOCHS):
        path = workdir / f"steps{epochs}.toml"
        path.write_text(config_text(1, epochs))
        config, events = _planned_events(path)
        ledger = TaskLedger(delta=1e-5, across_tasks="parallel", accountant="auto")
        ledger.charge(0, events)
        ledger.release(0)
        cert = certificate_from_ledger(ledger, method="naive", label_space="prior_const", assumptions=["Public labels."],
                                       release=ReleaseCoverage.post_processing("Post-processing of DP-SGD."),
                                       config=config.to_dict())
        out = workdir / f"steps{epochs}.cert.json"
        write_certificate(out, cert)
        steps = sum(n for e in events for _, n in e.leaves())
        sizes[str(steps)] = out.stat().st_size
    return sizes


# -- parent: run stages as children and measure them ---------------------------------------------------------------
def _run_child(argv: list[str]) -> dict[str, Any]:
    start = time.perf_counter()
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=ROOT)
    # read the pipes while waiting so a large output cannot block the child
    import threading

    chunks: dict[str, bytes] = {}

    def drain(name: str, stream: Any) -> None:
        chunks[name] = stream.read()

    threads = [threading.Thread(target=drain, args=(n, s)) for n, s in (("out", proc.stdout), ("err", proc.stderr))]
    for th in threads:
        th.start()
    _, status, usage = os.wait4(proc.pid, 0)
    seconds = time.perf_counter() - start
    for th in threads:
        th.join()
    proc.returncode = os.waitstatus_to_exitcode(status)
    return {
        "seconds": seconds,
        "peak_mib": usage.ru_maxrss / 1024.0,
        "cpu_seconds": usage.ru_utime + usage.ru_stime,
        "rc": proc.returncode,
        "stdout": chunks.get("out", b"").decode(),
        "stderr": chunks.get("err", b"").decode()[-2000:],
    }


def _dpcl(*args: str) -> list[str]:
    return [sys.executable, "-m", "dpcl", *args]


def _stage(workdir: Path, *args: str) -> dict[str, Any]:
    res = _run_child([sys.executable, str(Path(__file__).resolve()), "--stage", *args, "--workdir", str(workdir)])
    if res["rc"] != 0:
        raise SystemExit(f"stage {args} failed (exit {res['rc']}): {res['stderr']}")
    return {**json.loads(res["stdout"].strip().splitlines()[-1]), "peak_mib": res["peak_mib"],
            "stage_seconds": res["seconds"]}


def _calibration_seconds() -> float:
    """Wall time of the one calibration the audit performs (q = 0.01, T = 10^5, epsilon 1, delta 1e-5, auto)."""
    res = _run_child(_dpcl("calibrate", "dpsgd", "--epsilon", "1", "--delta", "1e-5", "--sample-rate",
                           str(BATCH_SIZE / EXAMPLES_PER_TASK), "--steps", str(EPOCHS * EXAMPLES_PER_TASK // BATCH_SIZE),
                           "--json"))
    if res["rc"] != 0:
        raise SystemExit(f"dpcl calibrate failed: {res['stderr']}")
    return res["seconds"]


def measure(n_tasks: int, charges_per_task: int, journal_tasks: int) -> dict[str, Any]:
    load_start = os.getloadavg()[0]
    with tempfile.TemporaryDirectory(prefix="dpcl-bookkeeping-") as tmp:
        workdir = Path(tmp)
        config = workdir / "config.toml"
        config.write_text(config_text(n_tasks))
        audit = _run_child(_dpcl("audit", str(config), "--json"))
        if audit["rc"] != 0:
            raise SystemExit(f"dpcl audit failed (exit {audit['rc']}): {audit['stderr']}")
        report = json.loads(audit["stdout"])
        calibration = _calibration_seconds()
        from dpcl.progress import progress  # noqa: PLC0415

        ledgers = {name: _stage(workdir, "ledger", str(n_tasks), charges, name)
                   for name, charges in progress([("tasks", "1"), ("events", str(charges_per_task))],
                                                 desc="bookkeeping ledgers", unit="ledger")}
        verify = {}
        for name, led in ledgers.items():
            for which, cert in led["certificates"].items():
                res = _run_child(_dpcl("verify", cert["path"], "--json"))
                verdict = json.loads(res["stdout"]) if res["stdout"].strip() else {}
                verify[f"{name}.{which}"] = {"seconds": res["seconds"], "cpu_seconds": res["cpu_seconds"],
                                             "peak_mib": res["peak_mib"], "rc": res["rc"], "valid": verdict.get("valid"),
                                             **{f"in_process_{k}": v for k, v in
                                                _stage(workdir, "verify", cert["path"]).items() if "seconds" in k}}
        steps = _stage(workdir, "steps")
        journal = {mode: _stage(workdir, "journal", str(min(journal_tasks, n_tasks)), mode)
                   for mode in ("append", "rewrite")}
    return {
        "tasks": n_tasks,
        "steps_per_task": EPOCHS * EXAMPLES_PER_TASK // BATCH_SIZE,
        "charges_per_task": charges_per_task,
        "audit": {"seconds": audit["seconds"], "cpu_seconds": audit["cpu_seconds"], "peak_mib": audit["peak_mib"],
                  "epsilon": report["epsilon"],
                  "sound": report["sound"], "calibration_seconds": calibration},
        "ledgers": ledgers,
        "verify": verify,
        "steps": {k: v for k, v in steps.items() if k not in ("peak_mib", "stage_seconds")},
        "journal": journal,
        "load": (load_start, os.getloadavg()[0]),
    }


# -- report -------------------------------------------------------------------------------------------------------
def _mib(n_bytes: float) -> str:
    return f"{n_bytes / 2**20:.2f} MiB"


def _kib(n_bytes: float) -> str:
    return f"{n_bytes / 2**10:.1f} KiB"


def headline(r: dict[str, Any]) -> dict[str, str]:
    """The strings the README quotes (each also appears verbatim in the report)."""
    worst_verify = max(v["in_process_seconds"] for v in r["verify"].values())
    peak = max([r["audit"]["peak_mib"], *(v["peak_mib"] for v in r["verify"].values()),
                *(led["peak_mib"] for led in r["ledgers"].values())])
    return {
        "audit": f"{r['audit']['seconds']:.2f} s",
        "verify": f"{worst_verify:.2f} s",
        "verify_cli": f"{max(v['seconds'] for v in r['verify'].values()):.2f} s",
        "verify_cpu": f"{max(v['in_process_cpu_seconds'] for v in r['verify'].values()):.2f} s",
        "peak": f"{peak:.1f} MiB",
        "ledger": _mib(r["ledgers"]["tasks"]["ledger_bytes"]),
        "events_ledger": _mib(r["ledgers"]["events"]["ledger_bytes"]),
        "certificate": _mib(r["ledgers"]["tasks"]["certificates"]["last"]["bytes"]),
    }


def report(r: dict[str, Any], machine: dict[str, str]) -> str:
    h = headline(r)
    tasks, steps, per = r["tasks"], r["steps_per_task"], r["charges_per_task"]
    ok = lambda good: "yes" if good else "NO"  # noqa: E731
    worst_verify = max(v["in_process_seconds"] for v in r["verify"].values())
    peak = float(h["peak"].split()[0])
    lines = [
        "# dpcl bookkeeping at scale",
        "",
        "Regenerated by `.venv/bin/python benchmarks/bench_bookkeeping.py --write` (issue 16, item 6). Each stage ran "
        "in a child process of its own: wall time and peak resident memory are that process's.",
        "",
        "| machine | |",
        "| --- | --- |",
        *(f"| {k} | {v} |" for k, v in machine.items()),
        f"| load average (1 min) at start / end | {r['load'][0]:.2f} / {r['load'][1]:.2f} |",
        "",
        "## Summary",
        "",
        f"{tasks:,} equal-size tasks, {steps:,} DP-SGD steps each (q = 0.01, naive, parallel composition).",
        "",
        "| what | measured | goal | met |",
        "| --- | --- | --- | --- |",
        f"| `dpcl audit` of the {tasks:,}-task config | {h['audit']} ({r['audit']['cpu_seconds']:.2f} s CPU; "
        f"`dpcl calibrate` of the one calibration alone: {r['audit']['calibration_seconds']:.2f} s), "
        f"ε {r['audit']['epsilon']:.4f} | < 10 s | "
        f"{ok(r['audit']['seconds'] < GOALS['audit_seconds'])} |",
        f"| verification per certificate (slowest of {len(r['verify'])}; a whole `dpcl verify` command with its "
        f"interpreter and library start-up: {h['verify_cli']}) | {h['verify']} ({h['verify_cpu']} CPU) | < 1 s | "
        f"{ok(worst_verify < GOALS['verify_seconds'])} |",
        f"| peak memory (largest of every command) | {h['peak']} | < 2 GB | {ok(peak < GOALS['peak_mib'])} |",
        f"| ledger on disk, {tasks:,} tasks and releases | {h['ledger']} | | |",
        f"| ledger on disk, {r['ledgers']['events']['events_charged']:,} charged events ({per} charges per task) | "
        f"{h['events_ledger']} | | |",
        f"| certificate of the last release ({tasks:,} groups) | {h['certificate']} | | |",
        "",
        "## Ledgers",
        "",
        "| ledger | events charged | build: charge + release every task (CPU) | save | load | size | peak memory |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for name, led in r["ledgers"].items():
        lines.append(
            f"| {name} | {led['events_charged']:,} | {led['build_seconds']:.2f} s ({led['build_cpu_seconds']:.2f} s) | "
            f"{led['save_seconds']:.2f} s | "
            f"{led['load_seconds']:.2f} s | {_mib(led['ledger_bytes'])} | {led['peak_mib']:.1f} MiB |"
        )
    lines += [
        "",
        "## Certificates",
        "",
        "| certificate | version | charge entries | size | verification (CPU) | `dpcl verify` command (CPU) | peak memory | valid |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for name, led in r["ledgers"].items():
        for which, cert in led["certificates"].items():
            v = r["verify"][f"{name}.{which}"]
            lines.append(
                f"| {name}, {which} release | {cert['version']} | {cert['charge_entries']:,} | {_kib(cert['bytes'])} | "
                f"{v['in_process_seconds']:.2f} s ({v['in_process_cpu_seconds']:.2f} s) | "
                f"{v['seconds']:.2f} s ({v['cpu_seconds']:.2f} s) | "
                f"{v['peak_mib']:.1f} MiB | {v['valid']} |"
            )
    sizes = ", ".join(f"{int(k):,} steps: {v:,} bytes" for k, v in r["steps"].items())
    lines += [
        "",
        f"Certificate of one task by its number of DP-SGD steps ({sizes}): a run of steps is one `RepeatedEvent` "
        "whose count is stored once, so the size does not grow with the steps.",
    ]
    if "journal" in r:
        n = r["journal"]["append"]["tasks"]
        lines += [
            "",
            "## Writing the ledger as a run goes",
            "",
            f"{n:,} tasks charged and released into a ledger on disk, saved after every charge and release (as "
            "`dpcl run` does, each save `fsync`-ed): saves that append what changed to the ledger's journal, "
            "against saves that rewrite the whole ledger (as dpcl did before the journal). Bytes written are the "
            "process's `write` calls (`/proc/self/io`).",
            "",
            "| saves | bytes written | per release, last 10% | time (CPU) | on disk at the end |",
            "| --- | --- | --- | --- | --- |",
        ]
        for mode, label in (("append", "append to the journal"), ("rewrite", "rewrite the whole ledger")):
            j = r["journal"][mode]
            lines.append(
                f"| {label} | {_mib(j['bytes_written'] or 0)} | {_kib(j['tail_bytes_per_release'] or 0)} | "
                f"{j['seconds']:.2f} s ({j['cpu_seconds']:.2f} s) | {_kib(j['bytes_on_disk'])} |"
            )
    lines.append("")
    return "\n".join(lines)


def machine_info() -> dict[str, str]:
    cpu = platform.processor() or "unknown"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {
        "date (UTC)": _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M"),
        "CPU": cpu,
        "usable cores": str(len(os.sched_getaffinity(0))),
        "Python": platform.python_version(),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--tasks", type=int, default=10_000)
    parser.add_argument("--charges-per-task", type=int, default=100,
                        help="charges per task in the events ledger (default 100: 10^6 events for 10^4 tasks)")
    parser.add_argument("--journal-tasks", type=int, default=300,
                        help="tasks of the ledger written to disk as a run goes, once appending to its journal and "
                             "once rewriting it whole at every save (default 300; the rewrite is quadratic)")
    parser.add_argument("--write", action="store_true", help=f"write {REPORT.name}")
    parser.add_argument("--stage", nargs="*", help=argparse.SUPPRESS)
    parser.add_argument("--workdir", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.stage:
        kind, *rest = args.stage
        if kind == "ledger":
            out = stage_ledger(args.workdir, int(rest[0]), int(rest[1]), rest[2])
        elif kind == "verify":
            out = stage_verify(Path(rest[0]))
        elif kind == "journal":
            out = stage_journal(args.workdir, int(rest[0]), rest[1])
        else:
            out = stage_steps(args.workdir)
        print(json.dumps(out))
        return 0
    results = measure(args.tasks, args.charges_per_task, args.journal_tasks)
    text = report(results, machine_info())
    print(text)
    if args.write:
        from dpcl._io.atomic_io import write_text_atomic

        write_text_atomic(REPORT, text)
        write_text_atomic(HERE / "bookkeeping.json", json.dumps(results, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
