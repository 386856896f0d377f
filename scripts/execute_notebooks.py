"""Execute the notebooks in ``notebooks/`` and store them with their outputs, or check the stored outputs.

    .venv/bin/python scripts/execute_notebooks.py            # execute every notebook, store it with its outputs
    .venv/bin/python scripts/execute_notebooks.py 04_*.ipynb # only these

The notebooks are stored executed, so a reader sees every number and figure in a repository browser;
``tests/test_notebooks.py`` executes them again and compares what they print with what is stored, after
:func:`comparable_outputs` masks what may differ between runs: timings, temporary paths, hashes, and every
number of a cell tagged ``noise`` (its results depend on DP noise drawn from the operating system).
"""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path
from typing import Any

NOTEBOOK_DIR = Path(__file__).resolve().parents[1] / "notebooks"
NOISE_TAG = "noise"

_MASKS = (
    (re.compile(r"/tmp/[^\s'\"]+"), "<tmp>"),
    (re.compile(r"\b[0-9a-f]{16,}\b"), "<hex>"),
    (re.compile(r"\b\d+(?:\.\d+)?\s?(?:s|ms|µs|us|seconds|minutes)\b"), "<time>"),
    (re.compile(r"\b0x[0-9a-f]+\b"), "<address>"),
)
_NUMBER = re.compile(r"[-+]?\d+(?:\.\d+)?(?:e[-+]?\d+)?")


def execute(path: Path, timeout: int = 600) -> Any:
    """The notebook at ``path`` executed in a fresh kernel, with its folder as working directory."""
    import nbclient
    import nbformat

    notebook = nbformat.read(path, as_version=4)
    # the kernel draws figures inline, into the cells' outputs, whatever backend the calling process uses
    before = os.environ.get("MPLBACKEND")
    os.environ["MPLBACKEND"] = "module://matplotlib_inline.backend_inline"
    try:
        nbclient.NotebookClient(notebook, timeout=timeout, kernel_name="python3",
                                resources={"metadata": {"path": str(path.parent)}}).execute()
    finally:
        if before is None:
            os.environ.pop("MPLBACKEND", None)
        else:
            os.environ["MPLBACKEND"] = before
    return notebook


def _text(output: dict) -> str:
    if output.get("output_type") == "stream":
        return output.get("text", "") if output.get("name") == "stdout" else ""
    data = output.get("data", {})
    return data.get("text/plain", "") if "image/png" not in data else "<figure>"


def comparable_outputs(notebook: Any) -> list[tuple[str, list[float]]]:
    """Each code cell's printed text (stdout, results, a marker per figure) with run-dependent parts masked, and the
    numbers in it apart (``<n>`` in the text): they are compared to a relative 1e-6, so that another CPU's last
    bits do not count; a cell tagged ``noise`` keeps no numbers."""
    cells = []
    for cell in notebook.cells:
        if cell.cell_type != "code":
            continue
        text = "".join(_text(o) for o in cell.get("outputs", []))
        for pattern, mask in _MASKS:
            text = pattern.sub(mask, text)
        numbers = [float(n) for n in _NUMBER.findall(text)]
        text = _NUMBER.sub("<n>", text)
        if NOISE_TAG in cell.get("metadata", {}).get("tags", []):
            numbers = []
        cells.append((text, numbers))
    return cells


def same_outputs(stored: tuple[str, list[float]], fresh: tuple[str, list[float]]) -> bool:
    """Whether two cells of :func:`comparable_outputs` agree: the same text, numbers equal to a relative 1e-6."""
    import math

    return stored[0] == fresh[0] and len(stored[1]) == len(fresh[1]) and all(
        math.isclose(a, b, rel_tol=1e-6, abs_tol=1e-12) for a, b in zip(stored[1], fresh[1]))


def main(argv: list[str]) -> int:
    import nbformat

    from dpcl._io.atomic_io import write_text_atomic

    paths = [NOTEBOOK_DIR / name for name in argv] if argv else sorted(NOTEBOOK_DIR.glob("*.ipynb"))
    for path in paths:
        notebook = execute(path)
        write_text_atomic(path, nbformat.writes(notebook) + "\n")
        path.chmod(0o644)
        print(f"{path.name}: executed and stored with its outputs", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
