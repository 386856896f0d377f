"""Errors no command turned into a typed error still end as one stderr line, never a traceback."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from dpcl.cli import BROKEN_PIPE_EXIT, main

DPCL = str(Path(sys.executable).parent / "dpcl")


def test_os_error_in_a_command_is_one_line_and_exit_2(monkeypatch, capsys):
    import dpcl.cli.verify as verify

    def denied(args):
        raise PermissionError(13, "Permission denied", "/srv/run/certificates/task001.cert.json")

    monkeypatch.setattr(verify, "run_verify", denied)
    code = main(["verify", "anything.json"])
    out, err = capsys.readouterr()
    assert code == 2 and out == ""
    assert err == "dpcl verify: error: Permission denied: '/srv/run/certificates/task001.cert.json'.\n"


def test_reader_closing_the_pipe_ends_quietly():
    """`dpcl ... --json | head -c 1`: the reader goes away before dpcl writes; no traceback, exit 141."""
    proc = subprocess.Popen(
        [DPCL, "calibrate", "gaussian", "--epsilon", "1", "--delta", "1e-5", "--json"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )
    proc.stdout.close()  # before the interpreter has even imported dpcl: every write hits a closed pipe
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == BROKEN_PIPE_EXIT
    assert err == b""


def test_no_command_is_one_line_listing_the_commands(capsys):
    code = main([])
    out, err = capsys.readouterr()
    assert code == 2 and out == "" and err.count("\n") == 1
    for command in ("demo", "run", "audit", "verify", "calibrate", "epsilon", "audit-mechanism"):
        assert command in err
