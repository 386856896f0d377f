"""The README's benchmark summary quotes the committed benchmark reports, number for number."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_every_number_in_the_readme_benchmark_table_is_in_its_report():
    """Each row's numbers appear in benchmarks/RESULTS.md, or in the benchmarks/*.md report the row names."""
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    section = readme.split("## Benchmarks", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in section.splitlines() if line.startswith("| ") and "---" not in line][1:]
    assert rows, "README should summarise the benchmark report"
    results = (ROOT / "benchmarks" / "RESULTS.md").read_text(encoding="utf-8")
    missing = []
    for row in rows:
        named = re.findall(r"benchmarks/([A-Za-z0-9_]+\.md)", row)
        reports = [(ROOT / "benchmarks" / name).read_text(encoding="utf-8") for name in named] or [results]
        numbers = set(re.findall(r"\d[\d,]*\.\d+|\d{1,3}(?:,\d{3})+", row))
        missing += sorted(n for n in numbers if not any(n in report for report in reports))
    assert not missing, f"README benchmark numbers not in their benchmark report: {missing}"
