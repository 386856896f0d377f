"""Under --json every refusal is one JSON object {"error", "exit_code"} on stdout, next to one line on stderr."""

from __future__ import annotations

import json

import pytest

from dpcl.cli import main


def _run(capsys, *argv):
    try:
        code = main(list(argv))
    except SystemExit as exc:  # argparse usage errors leave through SystemExit(2)
        code = exc.code
    out, err = capsys.readouterr()
    return code, out, err


def _refusal(out: str, err: str, code: int) -> dict:
    payload = json.loads(out)
    assert payload == {"error": payload["error"], "exit_code": code}
    assert err.count("\n") == 1 and payload["error"] in err and "Traceback" not in err
    return payload


@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        (("epsilon", "gaussian", "--sigma", "-1", "--delta", "1e-5", "--json"), "--sigma"),
        (("epsilon", "gaussian", "--delta", "1e-5", "--json"), "--sigma"),  # argparse: missing option
        (("calibrate", "gaussian", "--epsilon", "1", "--delta", "1e-5", "--bogus", "--json"), "--bogus"),
        (("--json",), "unrecognized arguments"),
    ],
    ids=["invalid_value", "missing_option", "unknown_option", "no_command"],
)
def test_exit_2_refusals_print_one_json_error(capsys, argv, needle):
    code, out, err = _run(capsys, *argv)
    assert code == 2
    assert needle in _refusal(out, err, 2)["error"]


def test_without_json_a_refusal_prints_nothing_on_stdout(capsys):
    code, out, err = _run(capsys, "epsilon", "gaussian", "--sigma", "-1", "--delta", "1e-5")
    assert code == 2 and out == "" and err.count("\n") == 1


def test_exit_3_refusal_prints_one_json_error(tmp_path, capsys):
    statement = tmp_path / "task001.nonprivate-cert.json"
    statement.write_text(json.dumps({"format": "dpcl-non-private-release", "release": {"task_index": 0}}))
    code, out, err = _run(capsys, "verify", str(statement), "--json")
    assert code == 3
    assert "NOT differentially private" in _refusal(out, err, 3)["error"]


def test_unreadable_file_under_json(tmp_path, capsys):
    directory = tmp_path / "cfg.toml"
    directory.mkdir()
    code, out, err = _run(capsys, "audit", str(directory), "--json")
    assert code == 2
    _refusal(out, err, 2)


def test_a_json_value_after_double_dash_is_not_the_flag(capsys):
    code, out, err = _run(capsys, "verify", "--", "--json")
    assert code == 2 and out == ""
