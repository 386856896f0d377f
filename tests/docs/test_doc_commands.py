"""Every `$ dpcl ...` command shown in README.md, docs/cli.md and docs/audit.md runs as written.

The commands run in order, as a user would type them, from a scratch directory that has the
repository's `dpcl/configs` (the docs use paths relative to the repository root), with the
installed `dpcl` command. A `# exit N` comment gives the expected exit code (0 otherwise); a
documented JSON line such as `{"sigma": 0.3441..., "classic_valid": false, ...}` must match
the printed object key by key (`0.3441...` means "starts with these digits").
"""

from __future__ import annotations

import json
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCS = ("README.md", "docs/cli.md", "docs/audit.md")
DPCL = str(Path(sys.executable).parent / "dpcl")
COMMAND = re.compile(r"^\s*\$ dpcl (.+)$")
JSON_ITEM = re.compile(r'"(\w+)": ("[^"]*"|true|false|null|-?[\d.e+-]+(?:\.\.\.)?)')


def documented_commands(doc: str) -> list[tuple[str, int, list[tuple[str, str]]]]:
    """(command line, expected exit code, documented JSON items) of each `$ dpcl` line of ``doc``."""
    lines = (ROOT / doc).read_text(encoding="utf-8").splitlines()
    found = []
    for i, line in enumerate(lines):
        match = COMMAND.match(line)
        if not match:
            continue
        command, _, comment = match.group(1).partition("  #")
        items = []
        for follow in lines[i + 1:]:
            if not follow.strip().startswith("{"):
                break
            output, _, output_comment = follow.partition("  #")
            items += JSON_ITEM.findall(output)
            comment += " " + output_comment
        exit_code = re.search(r"\bexit (\d)\b", comment)
        found.append((command.strip(), int(exit_code.group(1)) if exit_code else 0, items))
    return found


def _matches(documented: str, actual) -> bool:
    if documented.endswith("..."):
        return isinstance(actual, float) and repr(actual).startswith(documented[:-3])
    value = json.loads(documented)
    if isinstance(value, float) and isinstance(actual, float):
        digits = len(documented.split(".")[1]) if "." in documented else 0
        return round(actual, digits) == value  # a rounded number, as the docs print them
    return value == actual


@pytest.mark.parametrize("doc", DOCS)
def test_documented_commands_run_as_written(doc, tmp_path):
    commands = documented_commands(doc)
    assert commands, f"{doc} shows no `$ dpcl` command"
    (tmp_path / "dpcl").mkdir()
    (tmp_path / "dpcl" / "configs").symlink_to(ROOT / "dpcl" / "configs")
    for command, expected_code, items in commands:
        done = subprocess.run([DPCL, *shlex.split(command)], cwd=tmp_path, capture_output=True, text=True,
                              timeout=600, check=False)
        assert done.returncode == expected_code, f"{doc}: dpcl {command}\n{done.stderr}"
        assert "Traceback" not in done.stderr
        if "--json" in command:
            payload = json.loads(done.stdout)
            for key, documented in items:
                assert key in payload, f"{doc}: dpcl {command}: no key {key!r}"
                assert _matches(documented, payload[key]), (
                    f"{doc}: dpcl {command}: documented {key} = {documented}, printed {payload[key]!r}"
                )


def test_the_parser_reads_exit_codes_and_json_items():
    readme = documented_commands("README.md")
    assert any(code == 3 and command.startswith("audit-mechanism") for command, code, _ in readme)
    cli = dict((command, items) for command, _, items in documented_commands("docs/cli.md"))
    items = dict(cli["calibrate gaussian --epsilon 16 --delta 1e-5 --json"])
    assert items == {"sigma": "0.3441...", "classic_sigma": "0.3028...", "classic_valid": "false",
                     "classic_actual_epsilon": "18.89..."}
    assert _matches("0.3441...", 0.34417) and not _matches("0.3441...", 0.3442)
    assert _matches("3.1", 3.137) and not _matches("3.1", 3.16) and _matches('"violated"', "violated")
    (audit,) = [c for c in documented_commands("docs/audit.md") if c[0].startswith("audit-mechanism")]
    assert audit[1] == 3 and dict(audit[2]) == {"epsilon_lower_bound": "3.1", "claimed_epsilon": "2.0",
                                                  "verdict": '"violated"'}
