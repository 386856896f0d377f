"""`dpcl methods`: one line per method by default, every key with --details, everything with --json."""

from __future__ import annotations

import json

from dpcl.cli import main


def test_methods_short_by_default_details_on_request(capsys):
    assert main(["methods", "--json"]) == 0
    methods = json.loads(capsys.readouterr().out)["methods"]
    assert main(["methods"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == len(methods) + 1
    for method, line in zip(methods, lines):
        assert line.startswith(f"{method['name']} (built-in): ") and "keys: " in line
        for key in method["keys"]:
            assert key["name"] + ("*" if key["required"] else "") in line.split("keys: ", 1)[1].split(", ")
    assert "--details" in lines[-1]
    assert main(["methods", "--details"]) == 0
    details = capsys.readouterr().out
    assert len(details.splitlines()) > 3 * len(lines)
    assert all(k["help"].split()[0] in details for m in methods for k in m["keys"])
