"""Runs the strategies example of docs/audit.md, so the documented code keeps working."""

import re
from pathlib import Path

DOC = Path(__file__).resolve().parents[2] / "docs" / "audit.md"


def _python_blocks() -> list[str]:
    return re.findall(r"```python\n(.*?)```", DOC.read_text(encoding="utf-8"), flags=re.S)


def test_strategies_example_runs():
    blocks = [b for b in _python_blocks() if "dpcl.audit.strategies" in b]
    assert len(blocks) == 1
    exec(compile(blocks[0], str(DOC), "exec"), {"__name__": "docs_example"})


def test_api_example_behaves_as_documented():
    import pytest

    block = next(b for b in _python_blocks() if "wrong = GaussianMechanism" in b)
    with pytest.raises(AssertionError, match="claimed epsilon 1.0000"):
        exec(compile(block, str(DOC), "exec"), {"__name__": "docs_api_example"})
