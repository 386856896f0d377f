"""The CLI at the edges of float64: every such input is read, or refused with exit 2 naming what to change.

* a config with an integer beyond float range (a 400-digit epsilon, delta, size, learning rate, clip, epochs ...)
  exits 2 naming the key (was a traceback, exit 1);
* a certificate holding such an integer (content hash recomputed) is refused as malformed, naming the field;
* ``verify --cross-check`` with sigma 1e-300 or 1e300 reports the group "not cross-checked" with the reason (was a
  ZeroDivisionError);
* a TOML file starting with a UTF-8 byte-order mark is read;
* delta = 5e-324 is reported as written (``5e-324``), not as "got 0.0";
* no RuntimeWarning reaches the user.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from dpcl.accounting.events import GaussianEvent
from dpcl.cli import main
from dpcl.guarantees.ledger import TaskLedger

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "guarantees"))
from certified_runs import certify, edit_certificate  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
NAIVE = (ROOT / "dpcl" / "configs" / "naive.toml").read_text(encoding="utf-8")
BIG = int("1" + "0" * 400)


def _set(text: str, key: str, value: str) -> str:
    out, n = re.subn(rf"(?m)^{key} = [^#\n]*", f"{key} = {value}", text)
    assert n == 1, key
    return out


def _audit(tmp_path: Path, text: str, capsys, name: str = "c.toml") -> tuple[int, str, str]:
    path = tmp_path / name
    path.write_bytes(text.encode("utf-8"))
    code = main(["audit", "--json", str(path)])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


@pytest.mark.parametrize("section,key", [
    ("privacy", "epsilon"), ("privacy", "delta"), ("privacy", "total_epsilon"), ("method", "epochs"),
    ("method", "batch_size"), ("method", "max_grad_norm"), ("method", "learning_rate"), ("method", "adapter_dim"),
])
@pytest.mark.parametrize("sign", ["", "-"])
def test_a_config_integer_beyond_float_range_exits_2_naming_the_key(tmp_path, capsys, section, key, sign):
    code, _, err = _audit(tmp_path, _set(NAIVE, key, f"{sign}{BIG}"), capsys)
    assert code == 2
    assert f"[{section}] {key}" in err and "401 digits" in err and "Traceback" not in err
    assert len(err.strip().splitlines()) == 1


def test_integers_beyond_float_range_in_lists_are_named_with_their_index(tmp_path, capsys):
    text = NAIVE.replace("disjoint_units = false", f"disjoint_units = false\ntask_sizes = [10, {BIG}, 10, 10, 10]")
    code, _, err = _audit(tmp_path, text, capsys)
    assert code == 2 and "[stream] task_sizes[1]" in err
    code, _, err = _audit(tmp_path, NAIVE.replace("tasks = [[0, 1]", f"tasks = [[{BIG}, 1]"), capsys)
    assert code == 2 and "[stream] tasks[0][0]" in err


def test_the_346_digit_epsilon_of_the_issue_exits_2(tmp_path, capsys):
    code, _, err = _audit(tmp_path, _set(NAIVE, "epsilon", "9" * 346), capsys)
    assert code == 2 and "[privacy] epsilon" in err and "346 digits" in err and "Traceback" not in err


def test_a_toml_file_with_a_byte_order_mark_is_read(tmp_path, capsys):
    plain = _audit(tmp_path, NAIVE, capsys, "plain.toml")
    marked = _audit(tmp_path, "\ufeff" + NAIVE, capsys, "marked.toml")
    assert plain[0] == marked[0] == 0
    assert json.loads(marked[1])["epsilon"] == json.loads(plain[1])["epsilon"]


def test_a_tiny_delta_is_reported_as_written(tmp_path, capsys):
    code, _, err = _audit(tmp_path, _set(NAIVE, "delta", "5e-324"), capsys)
    assert code == 2
    assert "5e-324" in err and "got 0.0" not in err and "Traceback" not in err


def _certificate(tmp_path: Path, edit) -> Path:
    ledger = TaskLedger(delta=1e-5, across_tasks="sequential")
    path, _ = certify(tmp_path / "run", ledger, 0, GaussianEvent(sigma=2.0), name="task001",
                      checkpoint_bytes=b"weights", method="cosine", assumptions=["Public features."])
    edit_certificate(path, edit, reseal=True)
    return path


def _set_sigma(sigma):
    def edit(data):
        for charge in data["events"]:
            for event in charge["events"]:
                event["sigma"] = sigma
    return edit


@pytest.mark.parametrize("field", ["epsilon", "delta"])
def test_a_certificate_with_an_integer_beyond_float_range_is_refused_naming_the_field(tmp_path, capsys, field):
    path = _certificate(tmp_path, lambda data: data["guarantee"].__setitem__(field, BIG))
    code = main(["verify", str(path)])
    err = capsys.readouterr().err
    assert code == 2 and f"guarantee.{field}" in err and "401 digits" in err and "Traceback" not in err


def test_a_certificate_event_beyond_float_range_is_refused_naming_the_field(tmp_path, capsys):
    path = _certificate(tmp_path, _set_sigma(BIG))
    code = main(["verify", str(path)])
    err = capsys.readouterr().err
    assert code == 2 and "events[0].events[0].sigma" in err and "Traceback" not in err


@pytest.mark.parametrize("sigma,reason", [(1e-300, "grid points"), (1e300, "underflows to 0")])
def test_cross_check_of_an_extreme_sigma_reports_the_group_not_cross_checked(tmp_path, capsys, sigma, reason):
    path = _certificate(tmp_path, _set_sigma(sigma))
    code = main(["verify", "--cross-check", "--json", str(path)])
    out = capsys.readouterr().out
    assert code in (2, 3)  # the stated epsilon (of sigma 2) no longer matches the events: not valid
    skipped = re.findall(r'"skipped": "([^"]*)"', out)  # a group not cross-checked states why (JSON: "skipped")
    assert skipped and all(reason in s for s in skipped), out[-2000:]
    code = main(["verify", "--cross-check", str(path)])
    assert "not cross-checked" in capsys.readouterr().out  # the table says so in words


def test_no_runtime_warning_reaches_the_user(tmp_path):
    """Extreme inputs through the real entry point, warnings on as a user's interpreter has them."""
    config = tmp_path / "tiny.toml"
    config.write_text(_set(NAIVE, "delta", "5e-324"), encoding="utf-8")
    cert = _certificate(tmp_path, _set_sigma(1e-300))
    for argv in (["audit", str(config)], ["verify", "--cross-check", str(cert)],
                 ["epsilon", "--help"]):
        proc = subprocess.run([sys.executable, "-W", "default", "-m", "dpcl", *argv], capture_output=True, text=True,
                              timeout=300, cwd=tmp_path)
        assert "Warning" not in proc.stderr and "Traceback" not in proc.stderr, (argv, proc.stderr[-2000:])
