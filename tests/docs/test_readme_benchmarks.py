"""The README's benchmark summary quotes the committed benchmark report, number for number."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_every_number_in_the_readme_benchmark_table_is_in_results_md():
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    section = readme.split("## Benchmarks", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in section.splitlines() if line.startswith("| ") and "---" not in line][1:]
    assert rows, "README should summarise the benchmark report"
    # a row quoting benchmarks/BOOKKEEPING.md (bench_bookkeeping.py) is checked against that report
    reports = {name: (ROOT / "benchmarks" / name).read_text(encoding="utf-8") for name in ("RESULTS.md", "BOOKKEEPING.md")}
    missing = []
    for row in rows:
        name = "BOOKKEEPING.md" if "BOOKKEEPING.md" in row else "RESULTS.md"
        numbers = set(re.findall(r"\d[\d,]*\.\d+|\d{1,3}(?:,\d{3})+", row))
        missing += sorted(f"{n} (from {name})" for n in numbers if n not in reports[name])
    assert not missing, f"README benchmark numbers not in their benchmark report: {missing}"
