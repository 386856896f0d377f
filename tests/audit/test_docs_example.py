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
    documented = re.search(r"# AssertionError: lower bound (\d+\.\d+) > 1\.0", block)
    assert documented, "the example states the bound the audit finds"
    with pytest.raises(AssertionError, match="claimed epsilon 1.0000") as info:
        exec(compile(block, str(DOC), "exec"), {"__name__": "docs_api_example"})
    found = float(re.search(r"epsilon lower bound (\d+\.\d+) >", str(info.value)).group(1))
    digits = len(documented.group(1).split(".")[1])
    assert round(found, digits) == float(documented.group(1))
