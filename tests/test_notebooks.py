"""Every notebook in ``notebooks/`` is stored executed, and executing it again prints what it stores.

The notebooks run in a fresh Python kernel (nbclient + ipykernel) with the notebook's own folder as working
directory; a cell that raises fails the test and names the cell. Notebooks contain their own ``assert`` checks.
A reader sees the stored outputs in a repository browser, so they must be what the code prints today:
``scripts/execute_notebooks.py`` stores them, and the comparison masks only what may differ between runs
(timings, temporary paths, hashes, and the numbers of cells tagged ``noise``, whose results depend on DP noise;
other numbers are compared to a relative 1e-6).
"""

from __future__ import annotations

import sys
from pathlib import Path

import nbformat
import pytest
from nbclient.exceptions import CellExecutionError

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))
from execute_notebooks import comparable_outputs, execute, same_outputs  # noqa: E402

NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))


def test_there_are_notebooks_to_run():
    assert NOTEBOOKS, "notebooks/ holds no .ipynb file"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.name for p in NOTEBOOKS])
def test_notebook_is_stored_executed_and_prints_what_it_stores(path: Path):
    stored = nbformat.read(path, as_version=4)
    stored_cells = [cell for cell in stored.cells if cell.cell_type == "code"]
    assert all(cell.get("execution_count") for cell in stored_cells), (
        f"{path.name} is stored without its outputs: run scripts/execute_notebooks.py {path.name}")
    try:
        notebook = execute(path)
    except CellExecutionError as exc:
        pytest.fail(f"{path.name}: a cell raised\n{exc}")
    code_cells = [cell for cell in notebook.cells if cell.cell_type == "code"]
    assert code_cells and all(cell.get("execution_count") for cell in code_cells)
    errors = [out for cell in code_cells for out in cell.get("outputs", []) if out.get("output_type") == "error"]
    assert not errors
    fresh, kept = comparable_outputs(notebook), comparable_outputs(stored)
    assert len(fresh) == len(kept)
    for i, (a, b) in enumerate(zip(kept, fresh)):
        assert same_outputs(a, b), (
            f"{path.name}, code cell {i + 1}: the stored output is not what the code prints now; rerun "
            f"scripts/execute_notebooks.py {path.name} (or tag the cell 'noise' if its numbers depend on DP noise)."
            f"\nstored:  {a[0]!r} {a[1]}\nprinted: {b[0]!r} {b[1]}")
