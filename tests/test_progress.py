"""dpcl.progress: one plain line per finished item off a terminal (no carriage returns), tqdm on one."""

from __future__ import annotations

import io

from dpcl.progress import progress


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_plain_lines_count_real_items_off_a_terminal():
    out = io.StringIO()
    assert list(progress(range(3), desc="runs", file=out)) == [0, 1, 2]
    lines = out.getvalue().splitlines()
    assert [line.split(" (")[0] for line in lines] == ["runs: 1/3 done", "runs: 2/3 done", "runs: 3/3 done"]
    assert "\r" not in out.getvalue()
    out = io.StringIO()
    assert list(progress(iter("ab"), desc="x", file=out)) == ["a", "b"]  # no length: counts without a total
    assert out.getvalue().splitlines()[-1].startswith("x: 2 done")


def test_a_bar_on_a_terminal():
    out = _Terminal()
    assert list(progress(range(4), desc="runs", file=out)) == [0, 1, 2, 3]
    assert "4/4" in out.getvalue() and "\r" in out.getvalue()
