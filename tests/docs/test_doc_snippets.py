"""The Python and TOML examples of docs/data.md run as written."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest

DATA_DOC = Path(__file__).resolve().parents[2] / "docs" / "data.md"
FORTUNES = Path("/usr/share/games/fortunes")


def _blocks(language: str) -> list[str]:
    return re.findall(rf"```{language}\n(.*?)```", DATA_DOC.read_text(encoding="utf-8"), flags=re.S)


@pytest.mark.skipif(not FORTUNES.is_dir(), reason="the examples load Debian fortunes (apt-get install fortunes)")
def test_data_doc_python_examples_run(capsys):
    blocks = _blocks("python")
    assert len(blocks) >= 2
    for block in blocks:
        namespace: dict = {"__name__": "docs_data_example"}
        exec(compile(block, str(DATA_DOC), "exec"), namespace)
    # the stream example prints one line per task: index, labels, train and test sizes
    rows = [line.split() for line in capsys.readouterr().out.splitlines() if line.strip()]
    assert [row[0] for row in rows] == ["0", "1", "2", "3", "4"]


@pytest.mark.skipif(not FORTUNES.is_dir(), reason="the example streams Debian fortunes (apt-get install fortunes)")
def test_data_doc_stream_section_is_a_valid_section():
    from dpcl.data import task_sizes, task_train_labels

    (block,) = _blocks("toml")
    section = tomllib.loads(block)["stream"]
    sizes = task_sizes(section)
    labels = task_train_labels(section)
    assert len(sizes) == len(section["tasks"]) and all(n > 0 for n in sizes)
    for group, y in zip(section["tasks"], labels):
        assert set(y.tolist()) == set(group)
