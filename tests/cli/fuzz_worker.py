"""Child process of the CLI fuzz test: runs ``dpcl.cli.main`` on one argv per stdin line, one JSON result per line.

Started by ``test_cli_fuzz.py`` with a memory limit (``resource.setrlimit`` in ``preexec_fn``), so many
examples share one interpreter start-up. For each example it reports the exit code, what the command printed
on stdout and stderr, whether it raised (a traceback: the CLI let an exception escape) and whether it ran out
of memory (``MemoryError`` under the limit).
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import sys
import time
import traceback


def main() -> None:
    results = os.fdopen(os.dup(sys.stdout.fileno()), "w", buffering=1)
    from dpcl.cli import main as dpcl_main

    results.write(json.dumps({"ready": True}) + "\n")
    for line in sys.stdin:
        argv = json.loads(line)
        out, err = io.StringIO(), io.StringIO()
        status, code = "ok", None
        start = time.monotonic()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                code = dpcl_main(argv)
            except SystemExit as exc:  # argparse usage errors (and --help) leave through SystemExit
                code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 2)
            except MemoryError:
                status = "memory"
            except BaseException:  # noqa: BLE001 - any escape is what the test looks for
                status = "traceback"
                err.write(traceback.format_exc())
        results.write(json.dumps({
            "argv": argv, "code": code, "status": status, "stdout": out.getvalue()[-4000:],
            "stderr": err.getvalue()[-4000:], "seconds": time.monotonic() - start,
        }) + "\n")


if __name__ == "__main__":
    main()
