"""Set-up shared by the certificate tests: certified releases in a run directory, and a forger's edit."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any, Callable

from dpcl._io.atomic_io import sha256_file
from dpcl.guarantees.certificates import certificate_from_ledger, write_certificate
from dpcl.guarantees.ledger import TaskLedger
from dpcl.guarantees.method_schema import ReleaseCoverage

COVERED = ReleaseCoverage.post_processing("The checkpoint is a post-processing of the charged noisy releases.")


def certify(run: Path, ledger: TaskLedger, task: int, event: Any, *, name: str, checkpoint_bytes: bytes,
            **certificate_options: Any) -> tuple[Path, Path]:
    """Charge ``event`` to ``task``, write ``run/checkpoints/NAME.pt``, release it and write its certificate
    ``run/certificates/NAME.cert.json`` (covered by :data:`COVERED`, label space ``prior_const`` unless
    ``certificate_options`` say otherwise). Returns (certificate path, checkpoint path)."""
    checkpoint = run / "checkpoints" / f"{name}.pt"
    checkpoint.parent.mkdir(parents=True, exist_ok=True)
    checkpoint.write_bytes(checkpoint_bytes)
    ledger.charge(task, event, label=f"task {task}")
    ledger.release(task, checkpoint_sha256=sha256_file(checkpoint))
    options = {"release": COVERED, "label_space": "prior_const", **certificate_options}
    path = run / "certificates" / f"{name}.cert.json"
    write_certificate(path, certificate_from_ledger(ledger, checkpoint=checkpoint, **options))
    return path, checkpoint


def resealed(data: dict) -> dict:
    """What a forger does after an edit: recompute the content hash (docs/guarantees.md: the SHA-256 of the
    certificate without ``sha256`` and ``signature``, keys sorted, compact separators)."""
    body = {k: v for k, v in data.items() if k not in ("sha256", "signature")}
    data["sha256"] = hashlib.sha256(json.dumps(body, sort_keys=True, separators=(",", ":")).encode()).hexdigest()
    return data


def edit_certificate(path: Path, edit: Callable[[dict], Any], reseal: bool = False) -> None:
    """Edit a certificate file by hand; ``reseal`` also recomputes its content hash (a deliberate forger), so the
    semantic checks are seen on their own."""
    data = json.loads(path.read_text())
    edit(data)
    path.write_text(json.dumps(resealed(data) if reseal else data))
