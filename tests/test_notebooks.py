"""The notebooks in notebooks/ execute from top to bottom without error."""

from __future__ import annotations

from pathlib import Path

import pytest

nbclient = pytest.importorskip("nbclient")
nbformat = pytest.importorskip("nbformat")

NOTEBOOKS = sorted((Path(__file__).parents[1] / "notebooks").glob("*.ipynb"))

#: What the suite changes in a notebook before running it, to keep the suite fast: the
#: cosmology notebook's 64^3 box in 256 Mpc/h (40 s here) runs as 32^3 in 128 Mpc/h, the
#: same particle mass over an eighth of the volume. Every pattern must be found, so the
#: suite notices when the notebook changes.
SMALLER = {"cosmology.ipynb": [("cosmological_ics(64, 256.0", "cosmological_ics(32, 128.0"),
                               ("256 / 64", "128 / 32"),
                               ("power_spectrum(traj, 128)", "power_spectrum(traj, 64)")]}


def test_there_are_notebooks():
    assert {p.name for p in NOTEBOOKS} >= {"quickstart.ipynb", "analysis.ipynb"}


@pytest.mark.slow
@pytest.mark.timeout(600)
@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_notebook_executes(path, tmp_path):
    book = nbformat.read(path, as_version=4)
    assert all(not cell.get("outputs") for cell in book.cells if cell.cell_type == "code"), \
        "commit notebooks without outputs"
    for old, new in SMALLER.get(path.name, []):
        cells = [cell for cell in book.cells if old in cell.source]
        assert cells, f"{path.name} no longer holds {old!r}: update SMALLER"
        for cell in cells:
            cell.source = cell.source.replace(old, new)
    client = nbclient.NotebookClient(book, timeout=300, kernel_name="python3",
                                     resources={"metadata": {"path": str(tmp_path)}})
    client.execute()  # raises CellExecutionError, with the cell and traceback, on failure
    assert list(tmp_path.glob("*.zarr"))  # each notebook writes a real trajectory
