"""Shared pytest configuration.

Thorough statistical/training checks are marked ``@pytest.mark.thorough`` and
skipped unless ``DPCL_THOROUGH=1`` (or ``-m thorough`` is given).
"""

from __future__ import annotations

import os

# One intra-op thread per test process: `pytest -n 2` already runs two workers on
# two cores, and torch's thread hand-offs make small tensor operations far slower.
os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("MKL_NUM_THREADS", "1")

import pytest
from hypothesis import HealthCheck, settings

settings.register_profile("ci", deadline=None, max_examples=60, suppress_health_check=[HealthCheck.too_slow])
settings.register_profile("thorough", deadline=None, max_examples=1000)
settings.load_profile("thorough" if os.environ.get("DPCL_THOROUGH") == "1" else "ci")

THOROUGH = os.environ.get("DPCL_THOROUGH") == "1"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if THOROUGH or "thorough" in (config.getoption("-m") or ""):
        return
    skip = pytest.mark.skip(reason="thorough check: run with DPCL_THOROUGH=1")
    for item in items:
        if "thorough" in item.keywords:
            item.add_marker(skip)
