"""dpcl.data and dpcl.metrics never import torch (layer rule), not even to plan a stream."""

from __future__ import annotations

import subprocess
import sys
import textwrap


def test_data_and_metrics_do_not_import_torch() -> None:
    code = textwrap.dedent(
        """
        import sys
        import dpcl.data, dpcl.metrics
        from dpcl.data import task_sizes, build_stream, load_dataset
        sizes = task_sizes({"dataset": "digits", "tasks": [[0, 1], [2, 3]]})
        stream = build_stream({"dataset": "digits", "kind": "permuted", "n_tasks": 2})
        dpcl.metrics.summarize([[0.9, float("nan")], [0.8, 0.7]])
        try:
            task_sizes({"dataset": "fortunes", "tasks": [[0], [1]]})
        except Exception as exc:  # fortunes may be absent; the point is what got imported
            print("fortunes:", type(exc).__name__)
        heavy = [m for m in ("torch", "transformers", "sentence_transformers", "opacus") if m in sys.modules]
        print("HEAVY", heavy)
        """
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert "HEAVY []" in result.stdout, result.stdout + result.stderr
