"""Execute both analysis notebooks top to bottom on a real Jupyter kernel (nbclient + ipykernel).

Database: ``STITCHTUNE_TEST_DB`` when set (CI points it at the committed ``results/h200-2026-11-29``; not
``STITCHTUNE_DB``, which every test sets to its own empty default database), else a synthetic database made by
``scripts/make_demo_db.py --synthetic`` in a temporary directory. The kernel runs with the repository
root as working directory and on ``PYTHONPATH`` so that ``import stitchtune`` works uninstalled.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")
pytest.importorskip("ipykernel")

REPO = Path(__file__).resolve().parents[2]


NOTEBOOKS = ("analyze_tuning.ipynb", "compare_schedules.ipynb")
CELL_TIMEOUT_S = 180


@pytest.fixture(scope="module")
def db_dir(tmp_path_factory, demo_db_script) -> Path:
    given = os.environ.get("STITCHTUNE_TEST_DB")
    if given:
        return Path(given).resolve()
    db = tmp_path_factory.mktemp("nbdb")
    demo = demo_db_script
    demo.write_synthetic(db, seed=2, trials=12, fake_measured=True)
    demo.write_synthetic_bench(db)
    return db


@pytest.mark.slow
@pytest.mark.waits
@pytest.mark.parametrize("name", NOTEBOOKS)
def test_notebook_executes(name, db_dir, monkeypatch):
    path = REPO / "notebooks" / name
    nb = nbformat.read(path, as_version=4)
    # committed without outputs
    assert all(not c.get("outputs") and c.get("execution_count") is None
               for c in nb.cells if c.cell_type == "code"), f"{name} was committed with outputs"
    monkeypatch.setenv("STITCHTUNE_DB", str(db_dir))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])))
    client = nbclient.NotebookClient(nb, timeout=CELL_TIMEOUT_S, kernel_name="python3",
                                     resources={"metadata": {"path": str(REPO)}})
    client.execute()   # raises CellExecutionError on the first failing cell
    images = [o for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", [])
              if "image/png" in o.get("data", {})]
    errors = [o for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", [])
              if o.get("output_type") == "error"]
    assert not errors
    figure_cells = [c for c in nb.cells if c.cell_type == "code" and "report.figure_" in c.source]
    if not os.environ.get("STITCHTUNE_TEST_DB"):    # the synthetic DB has a bench CSV: every figure draws
        assert len(images) == len(figure_cells)
    assert len(images) >= 2
    # each figure has a markdown cell explaining it just before
    for i, c in enumerate(nb.cells):
        if c in figure_cells:
            assert nb.cells[i - 1].cell_type == "markdown"
