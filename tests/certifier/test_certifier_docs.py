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


@pytest.mark.torch
def test_doc_opacus_loop_seeded_twice_gives_different_checkpoints(tmp_path, monkeypatch):
    """The docs' opacus loop calls torch.manual_seed(0); dpcl's noise generators keep the noise unpredictable."""
    import json

    opacus_block = _blocks("python")[0]
    assert "torch.manual_seed(0)" in opacus_block and "attach(" in opacus_block
    checkpoints = []
    for run in ("first", "second"):
        monkeypatch.chdir(tmp_path)
        (tmp_path / run).mkdir()
        monkeypatch.chdir(tmp_path / run)
        exec(compile(opacus_block, str(DOC), "exec"), {"__name__": "docs_certifier_example"})
        out = tmp_path / run / "runs" / "opacus_doc"
        checkpoints.append((out / "checkpoints" / "task001.pt").read_bytes())
        certificate = out / "certificates" / "task001.cert.json"
        done = subprocess.run([sys.executable, "-m", "dpcl", "verify", str(certificate)],
                              capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stdout + done.stderr
        data = json.loads(certificate.read_text())
        assert data["extra"]["certifier"]["noise_sources"] == {"1": "os_entropy"}
        assert any("dpcl seeded from OS entropy" in a for a in data["assumptions"])
    assert checkpoints[0] != checkpoints[1]


def test_readme_links_the_certifier_page():
    readme = (DOC.parents[1] / "README.md").read_text(encoding="utf-8")
    assert "[certifier](docs/certifier.md)" in readme and "## Certify your own training loop" in readme
