"""Fork server of the CLI fuzz test: imports dpcl once, then runs every example in a forked child.

``test_cli_fuzz.py`` starts this script once per test module (a fresh, single-threaded interpreter: forking the
pytest process itself, which may hold torch's or BLAS's threads, could deadlock a child). It imports the CLI
and the accounting libraries the commands load lazily, then reads one request per stdin line,
``{"argv": [...], "cwd": DIR, "memory": BYTES, "timeout": SECONDS}`` (or ``{"call": "module:function", "kwargs":
{...}, ...}``: a call of a public library function, whose :class:`~dpcl.errors.DpclError` is a refusal with the error's
exit code and message, as the CLI would give; an optional ``"cpu": SECONDS`` kills the child by ``SIGXCPU`` after
that much processor time), and for each:

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
import subprocess
import sys
import tempfile
import time
import traceback

#: Output kept per stream (its length and line count are reported in full).
KEEP_CHARACTERS = 200_000


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


def _call(target: str, kwargs: dict) -> int:
    """``module:function(**kwargs)`` (a library call of the probe in tests/accounting/test_bounded_work.py): exit code 0
    with the result's ``to_dict()`` (or repr) on stdout, or a DpclError's exit code with its message on stderr. An
argument given as a dict with a ``kind`` key is an event (:func:`~dpcl.accounting.events.event_from_dict`)."""
    import importlib

    from dpcl.errors import DpclError

    from dpcl.accounting.events import event_from_dict

    module, name = target.split(":")
    function = getattr(importlib.import_module(module), name)
    try:
        # an event travels as its to_dict() form
        kwargs = {k: event_from_dict(v) if isinstance(v, dict) and "kind" in v else v for k, v in kwargs.items()}
        result = function(**kwargs)
    except DpclError as exc:
        sys.stderr.write(f"{type(exc).__name__}: {exc}\n")
        return exc.exit_code
    to_dict = getattr(result, "to_dict", None)
    sys.stdout.write((json.dumps(to_dict()) if callable(to_dict) else repr(result)) + "\n")
    return 0


def _child(request: dict, out_fd: int, err_fd: int, report_fd: int) -> None:
    """Runs in the forked child; never returns."""
    argv, cwd, memory = request.get("argv", []), request["cwd"], int(request["memory"])
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
        if request.get("cpu"):
            seconds = int(request["cpu"])
            resource.setrlimit(resource.RLIMIT_CPU, (seconds, seconds + 5))
        from dpcl.cli import main as dpcl_main

        try:
            code = _call(request["call"], request.get("kwargs", {})) if "call" in request else dpcl_main(argv)
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


def run_one(request: dict) -> dict:
    argv, timeout = request.get("argv", []), float(request["timeout"])
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        report_read, report_write = os.pipe()
        start = time.monotonic()
        pid = os.fork()
        if pid == 0:
            os.close(report_read)
            _child(request, out.fileno(), err.fileno(), report_write)
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
            "argv": argv, "call": request.get("call"), "kwargs": request.get("kwargs"), "seconds": seconds, "cpu_seconds": usage.ru_utime + usage.ru_stime,
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
        out_of_time = os.WIFSIGNALED(wait_status) and os.WTERMSIG(wait_status) == signal.SIGXCPU
        result.update(status="cpu" if out_of_time else "crash", code=None, died=died)
    return result


class ForkServer:
    """The client: this script in a fresh interpreter (``env``), restarted if it ever dies (its children may, it
    should not). Each request runs under ``memory`` bytes of address space and ``wall_limit`` seconds."""

    def __init__(self, scratch, *, env: dict, memory: int, wall_limit: float) -> None:
        self.scratch, self.env, self.memory, self.wall_limit = scratch, env, memory, wall_limit
        self.process: subprocess.Popen | None = None

    def _start(self) -> None:
        self.process = subprocess.Popen(
            [sys.executable, __file__], stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            text=True, bufsize=1, env=self.env,
        )
        line = self._read_line(180.0)
        assert line and json.loads(line).get("ready"), self._stop()

    def _read_line(self, timeout: float) -> str | None:
        assert self.process is not None and self.process.stdout is not None
        ready, _, _ = select.select([self.process.stdout], [], [], timeout)
        return self.process.stdout.readline() if ready else None

    def _stop(self) -> str:
        assert self.process is not None
        self.process.kill()
        self.process.wait()
        tail = self.process.stderr.read()[-3000:] if self.process.stderr else ""
        self.process = None
        return tail

    def run(self, argv: list[str], cwd=None) -> dict:
        """``dpcl ARGV`` in a child."""
        return self._request({"argv": argv, "cwd": str(cwd or self.scratch)})

    def call(self, target: str, kwargs: dict, cpu: float | None = None) -> dict:
        """``module:function(**kwargs)`` in a child, killed after ``cpu`` seconds of processor time if given."""
        return self._request({"call": target, "kwargs": kwargs, "cpu": cpu, "cwd": str(self.scratch)})

    def _request(self, request: dict) -> dict:
        if self.process is None or self.process.poll() is not None:
            self._start()
        assert self.process is not None and self.process.stdin is not None
        request.update(memory=self.memory, timeout=self.wall_limit)
        self.process.stdin.write(json.dumps(request) + "\n")
        self.process.stdin.flush()
        line = self._read_line(self.wall_limit + 120.0)  # the server kills a child at the wall limit; this is its guard
        if not line:
            raise AssertionError(f"the fork server stopped answering at {request}: {self._stop()}")
        return json.loads(line)

    def close(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.stdin.close()
            self.process.wait(timeout=60)


def main() -> None:
    results = os.fdopen(os.dup(sys.stdout.fileno()), "w", buffering=1)
    preload()
    results.write(json.dumps({"ready": True, "pid": os.getpid()}) + "\n")
    for line in sys.stdin:
        request = json.loads(line)
        results.write(json.dumps(run_one(request)) + "\n")


if __name__ == "__main__":
    main()
