"""The README's first screen and its Python example stay true."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

README = Path(__file__).resolve().parents[2] / "README.md"
CI_SCRIPT = Path(__file__).resolve().parents[2] / ".ci" / "run"


def _blocks(language: str) -> list[str]:
    return re.findall(rf"```{language}\n(.*?)```", README.read_text(encoding="utf-8"), flags=re.S)


def test_first_screen_has_exactly_two_commands_and_ci_runs_the_test_one():
    bash_blocks = [b.strip() for b in _blocks("bash")]
    first_screen = README.read_text(encoding="utf-8").split("---", 1)[0]
    commands = [b.strip() for b in re.findall(r"```bash\n(.*?)```", first_screen, flags=re.S)]
    assert len(commands) == 2 and all("\n" not in c for c in commands)
    assert commands[0].endswith("dpcl demo")
    assert commands == bash_blocks[:2]
    assert commands[1] in CI_SCRIPT.read_text(encoding="utf-8").splitlines()


def test_python_examples_run(capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # the examples write run directories relative to the working directory
    blocks = _blocks("python")
    assert blocks, "the README should show the Python API"
    for block in blocks:
        exec(compile(block, str(README), "exec"), {"__name__": "readme_example"})
    out = capsys.readouterr().out
    assert "add_remove" in out and "example" in out
    # "Certify your own training loop": two certified tasks whose certificates `dpcl verify` accepts
    assert "task 2: epsilon" in out
    certificates = sorted((tmp_path / "runs" / "my_loop" / "certificates").glob("*.json"))
    assert len(certificates) == 2
    verify = subprocess.run([sys.executable, "-m", "dpcl", "verify", *map(str, certificates)],
                            capture_output=True, text=True, timeout=300)
    assert verify.returncode == 0, verify.stdout + verify.stderr
