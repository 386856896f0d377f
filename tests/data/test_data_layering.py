"""dpcl.data and dpcl.metrics never import torch (layer rule), not even to plan a stream."""

from __future__ import annotations

import os
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


def test_encoder_loads_and_encodes_without_any_network_access() -> None:
    """Nothing is downloaded at run time: with every socket connection and DNS lookup refused,
    the MiniLM encoder still loads from the installed package and embeds text."""
    code = textwrap.dedent(
        """
        import socket

        def refuse(*args, **kwargs):
            raise OSError("network access attempted")

        socket.socket.connect = refuse
        socket.socket.connect_ex = refuse
        socket.getaddrinfo = refuse
        socket.create_connection = refuse
        from dpcl.data.encoder import encode_texts
        features = encode_texts(["A fortune a day keeps the doctor away."])
        print("SHAPE", features.shape)
        """
    )
    env = {k: v for k, v in os.environ.items() if k not in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")}
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    assert result.returncode == 0 and "SHAPE (1, 384)" in result.stdout, result.stdout + result.stderr
