"""Fork server of the CLI fuzz test: imports dpcl once, then runs every example in a forked child.

``test_cli_fuzz.py`` starts this script once per test module (a fresh, single-threaded interpreter: forking the
pytest process itself, which may hold torch's or BLAS's threads, could deadlock a child). It imports the CLI
and the accounting libraries the commands load lazily, then reads one request per stdin line,
``{"argv": [...], "cwd": DIR, "memory": BYTES, "timeout": SECONDS}``, and for each:

* forks a child, which becomes a process-group leader, limits its address space to ``memory`` bytes
  (``resource.setrlimit(RLIMIT_AS)``), points its file descriptors 1 and 2 at temporary files (so output
  written by C code or by grandchildren is caught too), calls ``dpcl.cli.main(argv)`` and reports the exit code
  and whether an exception escaped (a traceback) or memory ran out on a pipe, then leaves with ``os._exit``;
* waits at most ``timeout`` seconds of wall-clock time for it, then kills its whole process group (so nothing it
  started outlives the example), and collects its processor time and peak resident memory (``os.wait4``);
* answers one JSON line: exit code, status (``ok``, ``traceback``, ``memory``, ``timeout`` or ``crash`` with the
  signal), stdout and stderr (their last 20,000 characters, with their full length and line count), wall-clock and
  processor seconds and peak memory.

An example thus costs a fork (milliseconds) plus the command's own work, and examples never share state (a
memoised value, a leaked file handle, a changed working directory).
"""

from __future__ import annotations

import json
import os
import resource
import select
import signal
import sys
import tempfile
import time
import traceback

#: Output kept per stream (its length and line count are reported in full).
KEEP_CHARACTERS = 20_000


def preload() -> None:
    """Import what the commands import lazily, so that a child does not pay for it (nothing here starts a thread).

    torch only where ``DPCL_FUZZ_PRELOAD_TORCH=1`` (the server for ``dpcl run``): it takes 500 MB of address space
    that the other commands never map, and their children would have that much less under the memory limit.
    """
    import dpcl.cli

    dpcl.cli.build_parser()  # imports every command module
    for module in ("dpcl.accounting", "dpcl.accounting.dpsgd", "dpcl.accounting.accountants", "dpcl.accounting.gaussian",
                   "dpcl.guarantees.certificates", "dpcl.guarantees.config", "dpcl.guarantees.ledger",
                   "dpcl.audit", "dp_accounting", "prv_accountant", "scipy.optimize", "scipy.stats", "rich.console",
                   "rich.table", "cryptography.hazmat.primitives.asymmetric.ed25519"):
        try:
            __import__(module)
        except ImportError:  # a module another build does not have: the child imports what it needs
            pass
    if os.environ.get("DPCL_FUZZ_PRELOAD_TORCH") == "1":  # the server for ``dpcl run``, which imports torch anyway
        for module in ("torch", "dpcl.runner.run", "dpcl.runner.distributed"):
            try:
                __import__(module)
            except ImportError:
                pass


def _child(argv: list[str], cwd: str, memory: int, out_fd: int, err_fd: int, report_fd: int) -> None:
    """Runs in the forked child; never returns."""
    status, code = "ok", None
    try:
        os.setpgid(0, 0)
        devnull = os.open(os.devnull, os.O_RDONLY)
        os.dup2(devnull, 0)
        os.dup2(out_fd, 1)
        os.dup2(err_fd, 2)
        sys.stdin = open(0, "r", closefd=False)  # noqa: SIM115 - lives as long as the child
        sys.stdout = open(1, "w", closefd=False, encoding="utf-8", errors="backslashreplace")  # noqa: SIM115
        sys.stderr = open(2, "w", closefd=False, encoding="utf-8", errors="backslashreplace")  # noqa: SIM115
        sys.argv = ["dpcl", *argv]
        os.chdir(cwd)
        resource.setrlimit(resource.RLIMIT_AS, (memory, memory))
        from dpcl.cli import main as dpcl_main

        try:
            code = dpcl_main(argv)
        except SystemExit as exc:  # argparse usage errors (and --help) leave through SystemExit
            code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 2)
        except MemoryError:
            status = "memory"
        except BaseException:  # noqa: BLE001 - any escape is what the test looks for
            status = "traceback"
            sys.stderr.write(traceback.format_exc())
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except BaseException:  # noqa: BLE001 - a stream the command closed or broke
                pass
        os.write(report_fd, json.dumps({"status": status, "code": code}).encode())
    finally:
        os._exit(0)


def _read_output(handle) -> dict:
    handle.seek(0)
    data = handle.read()
    text = data.decode("utf-8", errors="backslashreplace")
    return {"text": text[-KEEP_CHARACTERS:], "length": len(text), "lines": text.count("\n")}


def run_one(argv: list[str], cwd: str, memory: int, timeout: float) -> dict:
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        report_read, report_write = os.pipe()
        start = time.monotonic()
        pid = os.fork()
        if pid == 0:
            os.close(report_read)
            _child(argv, cwd, memory, out.fileno(), err.fileno(), report_write)
        os.close(report_write)
        report = b""
        timed_out = False
        deadline = start + timeout
        while True:  # the pipe closes when the child (and whatever inherited it) exits
            left = deadline - time.monotonic()
            if left <= 0:
                timed_out = True
                break
            ready, _, _ = select.select([report_read], [], [], left)
            if ready:
                chunk = os.read(report_read, 65536)
                if not chunk:
                    break
                report += chunk
        os.close(report_read)
        seconds = time.monotonic() - start
        for target in (pid,):  # the child's group: the child and anything it started
            try:
                os.killpg(target, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        _, wait_status, usage = os.wait4(pid, 0)
        result = {
            "argv": argv, "seconds": seconds, "cpu_seconds": usage.ru_utime + usage.ru_stime,
            "peak_rss_bytes": usage.ru_maxrss * 1024,
            "stdout": _read_output(out), "stderr": _read_output(err),
        }
    if timed_out:
        result.update(status="timeout", code=None)
    elif report:
        result.update(json.loads(report))
    else:
        died = (f"signal {signal.Signals(os.WTERMSIG(wait_status)).name}" if os.WIFSIGNALED(wait_status)
                else f"exit status {os.WEXITSTATUS(wait_status)} without a report")
        result.update(status="crash", code=None, died=died)
    return result


def main() -> None:
    results = os.fdopen(os.dup(sys.stdout.fileno()), "w", buffering=1)
    preload()
    results.write(json.dumps({"ready": True, "pid": os.getpid()}) + "\n")
    for line in sys.stdin:
        request = json.loads(line)
        results.write(json.dumps(run_one(request["argv"], request["cwd"], int(request["memory"]),
                                         float(request["timeout"]))) + "\n")


if __name__ == "__main__":
    main()
