"""The guarantees layer (and `dpcl audit`/`dpcl verify`) never imports torch."""

from __future__ import annotations

import subprocess
import sys


def test_guarantees_and_audit_cli_do_not_import_torch():
    code = (
        "import sys\n"
        "import dpcl._io.atomic_io, dpcl.guarantees.label_space, dpcl.guarantees.ledger\n"
        "import dpcl.guarantees.certificates, dpcl.guarantees.config, dpcl.guarantees.schedules\n"
        "import dpcl.audit_config, dpcl.cli.audit, dpcl.cli.verify\n"
        "from dpcl.guarantees.method_schema import get_method_spec\n"
        "for name in ('cosine', 'peft_ensemble', 'naive', 'non_cl'):\n"
        "    get_method_spec(name)\n"
        "bad = sorted(m for m in sys.modules if m == 'torch' or m.startswith('torch.'))\n"
        "assert not bad, bad\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
