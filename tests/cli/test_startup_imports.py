"""The light commands load only what they use (issue 15, item 7: start-up time, measured in
``benchmarks/bench_cli_startup.py``; here the imports themselves are checked, never a time)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

#: Modules that ``dpcl calibrate gaussian`` and ``dpcl --help`` must not import: the auditor's statistics,
#: the accounting libraries, torch and the guarantees layer (config, audit, certificates, ledger).
HEAVY = ("scipy.stats", "dp_accounting", "prv_accountant", "torch", "opacus", "dpcl.guarantees", "dpcl.methods")


def loaded_after(args: list[str]) -> set[str]:
    code = (
        "import sys, json\n"
        "from dpcl.cli import main\n"
        "try:\n"
        f"    main({args!r})\n"
        "except SystemExit:\n"  # --help
        "    pass\n"
        "sys.stderr.write(json.dumps(sorted(sys.modules)))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    return set(json.loads(done.stderr.strip().splitlines()[-1]))


@pytest.mark.parametrize("args", [["calibrate", "gaussian", "--epsilon", "1", "--delta", "1e-5", "--json"], ["--help"],
                                  ["audit", "--help"]])
def test_light_commands_do_not_import_heavy_modules(args):
    loaded = loaded_after(args)
    assert "dpcl.cli" in loaded
    heavy = sorted(m for m in loaded if any(m == h or m.startswith(h + ".") for h in HEAVY))
    assert not heavy, heavy
