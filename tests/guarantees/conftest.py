"""Fixtures shared by the guarantee tests: the independent reference accountant and a certified one-task run."""

from __future__ import annotations

import numpy as np
import pytest

from dpcl.accounting.events import GaussianEvent
from dpcl.guarantees import stream_composition as composition_module
from dpcl.guarantees.ledger import TaskLedger

from .certified_runs import certify
from .reference import reference_compute


@pytest.fixture()
def reference_accountant(monkeypatch):
    """Account with the independent closed form of tests/guarantees/reference.py (never with dpcl's own output)."""
    monkeypatch.setattr(composition_module, "_compute", reference_compute)


@pytest.fixture()
def certificate(tmp_path, reference_accountant):
    """RUN/certificates/task001.cert.json: one Gaussian release (sigma 3, delta 1e-5) of task 0, with a non-ASCII
    field (the canonical serialisation must keep it) and its checkpoint RUN/checkpoints/task001.pt."""
    ledger = TaskLedger(delta=1e-5, across_tasks="sequential")
    path, _ = certify(tmp_path / "run", ledger, 0, GaussianEvent(sigma=3.0), name="task001",
                      checkpoint_bytes=np.random.default_rng(0).bytes(500), method="cosine",
                      assumptions=["Labels are public (prior)."], extra={"note": "naïve ünïcode"})
    return path
