"""Every command but run and demo answers within its processor-time limit or refuses (exit 2, one line, nothing on stdout).

The fuzz test (test_cli_fuzz.py) found accounting questions that take minutes: ``epsilon dpsgd`` with noise
multiplier 0.001 at sampling rate 1e-6 over 1e4 steps (auto: 214 s), ``calibrate dpsgd`` to epsilon 0.001 at the
same rate (more than 300 s). Here the limit is set low so that such a command reaches it quickly.
"""

from __future__ import annotations

import json
import time

import pytest

from dpcl.cli import main
from dpcl.cli.time_limit import DEFAULT_TIME_LIMIT_S, TIME_LIMIT_VARIABLE, configured_limit

SLOW = [
    ["epsilon", "dpsgd", "--noise-multiplier", "0.001", "--delta", "0.001", "--sample-rate", "1e-06", "--steps", "1e4"],
    ["calibrate", "dpsgd", "--epsilon", "0.001", "--delta", "0.001", "--sample-rate", "1e-06", "--steps", "1e4"],
]


@pytest.mark.parametrize("argv", SLOW, ids=lambda argv: argv[0])
@pytest.mark.parametrize("as_json", [False, True])
def test_a_command_past_its_limit_refuses_in_one_line(argv, as_json, monkeypatch, capsys):
    monkeypatch.setenv(TIME_LIMIT_VARIABLE, "0.5")
    start = time.monotonic()
    code = main(argv + ["--json"] * as_json)
    seconds = time.monotonic() - start
    out, err = capsys.readouterr()
    assert code == 2 and seconds < 20
    assert err.count("\n") == 1 and "Traceback" not in err
    assert "no answer within 0.5 s of processor time" in err and argv[2] in err and "--accountant rdp" in err
    assert TIME_LIMIT_VARIABLE in err
    if as_json:
        assert set(json.loads(out)) == {"error", "exit_code"}
    else:
        assert out == ""


def test_the_limit_is_restored_after_the_command(monkeypatch, capsys):
    import signal

    monkeypatch.setenv(TIME_LIMIT_VARIABLE, "30")
    before = signal.getsignal(signal.SIGPROF)
    assert main(["epsilon", "gaussian", "--sigma", "1", "--delta", "1e-5"]) == 0
    assert signal.getitimer(signal.ITIMER_PROF) == (0.0, 0.0) and signal.getsignal(signal.SIGPROF) is before


@pytest.mark.parametrize(("text", "seconds"), [(None, DEFAULT_TIME_LIMIT_S), ("", DEFAULT_TIME_LIMIT_S), ("0", 0.0),
                                                ("12.5", 12.5)])
def test_the_limit_comes_from_the_environment(text, seconds, monkeypatch):
    if text is None:
        monkeypatch.delenv(TIME_LIMIT_VARIABLE, raising=False)
    else:
        monkeypatch.setenv(TIME_LIMIT_VARIABLE, text)
    assert configured_limit() == seconds


@pytest.mark.parametrize("text", ["-1", "nan", "inf", "soon"])
def test_a_bad_limit_is_refused_by_name(text, monkeypatch, capsys):
    monkeypatch.setenv(TIME_LIMIT_VARIABLE, text)
    assert main(["epsilon", "gaussian", "--sigma", "1", "--delta", "1e-5"]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.count("\n") == 1 and TIME_LIMIT_VARIABLE in err


def test_the_limit_waits_for_an_import_to_finish(monkeypatch, tmp_path):
    """A limit reached inside a module's top-level code fires after the import, not inside it: an exception
    thrown there would leave the package half initialised for the rest of the process."""
    import importlib
    import sys

    from dpcl.cli.time_limit import CommandTimeLimitExceeded, time_limit

    (tmp_path / "dpcl_slow_import_probe.py").write_text(
        "import time\n"
        "start = time.process_time()\n"
        "while time.process_time() - start < 0.6:\n"
        "    pass\n"
        "COMPLETE = True\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv(TIME_LIMIT_VARIABLE, "0.2")
    monkeypatch.delitem(sys.modules, "dpcl_slow_import_probe", raising=False)
    with pytest.raises(CommandTimeLimitExceeded):
        with time_limit("epsilon"):
            importlib.import_module("dpcl_slow_import_probe")
            start = time.process_time()
            while time.process_time() - start < 30:
                pass
    assert sys.modules["dpcl_slow_import_probe"].COMPLETE is True
    monkeypatch.delitem(sys.modules, "dpcl_slow_import_probe")
