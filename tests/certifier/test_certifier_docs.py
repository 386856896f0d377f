"""The Python examples of docs/certifier.md run as written, and their certificates verify."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

DOC = Path(__file__).resolve().parents[2] / "docs" / "certifier.md"


def _blocks(language: str) -> list[str]:
    return re.findall(rf"```{language}\n(.*?)```", DOC.read_text(encoding="utf-8"), flags=re.S)


@pytest.mark.torch
def test_certifier_doc_examples_run_and_verify(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    blocks = _blocks("python")
    assert len(blocks) == 2  # opacus, and a loop of your own
    for block in blocks:
        exec(compile(block, str(DOC), "exec"), {"__name__": "docs_certifier_example"})
    assert capsys.readouterr().out.split() == "task 1: epsilon 1.000 task 2: epsilon 1.000".split()
    certificates = sorted(tmp_path.glob("runs/*/certificates/*.json"))
    assert len(certificates) == 3
    done = subprocess.run([sys.executable, "-m", "dpcl", "verify", *map(str, certificates)],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr


def test_readme_links_the_certifier_page():
    readme = (DOC.parents[1] / "README.md").read_text(encoding="utf-8")
    assert "[certifier](docs/certifier.md)" in readme and "## Certify your own training loop" in readme
