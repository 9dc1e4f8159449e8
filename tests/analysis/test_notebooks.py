"""The analysis notebooks: committed with their outputs (``scripts/run_notebooks.py`` executes them against
the committed H200 database), checked cheaply against the code here; and (slow) executed top to bottom on a
real Jupyter kernel (nbclient + ipykernel).

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
    for c in nb.cells:   # committed with outputs (scripts/run_notebooks.py): run from clean here
        if c.cell_type == "code":
            c.outputs, c.execution_count = [], None
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


def _outputs(cell) -> list:
    return cell.get("outputs", []) if cell.cell_type == "code" else []


@pytest.mark.parametrize("name", NOTEBOOKS)
def test_notebook_is_committed_with_its_outputs(name):
    """What a reader browsing the repository sees: every code cell ran (in order), every figure cell
    holds its PNG, no error, no path of the machine that ran it (scripts/run_notebooks.py)."""
    nb = nbformat.read(REPO / "notebooks" / name, as_version=4)
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert [c.execution_count for c in code] == list(range(1, len(code) + 1)), "run scripts/run_notebooks.py"
    for c in code:
        assert _outputs(c), c.source[:80]
        assert not [o for o in _outputs(c) if o.get("output_type") == "error"]
        if "report.figure_" in c.source:
            assert any("image/png" in o.get("data", {}) for o in _outputs(c)), c.source[:80]
    text = (REPO / "notebooks" / name).read_text()
    assert "/work/" not in text and "/home/" not in text and "site-packages" not in text
    first = "".join(o.get("text", "") for o in _outputs(code[0]))
    assert first.endswith("workload runs from ../results/h200-2026-11-29\n"), first


def test_the_committed_summary_table_is_what_the_code_computes_now():
    """The notebook's table (with each workload's Spearman rho) is the one report.summary_table gives
    for the committed database today: a change to the analysis without re-running the notebooks fails."""
    import pandas as pd

    from stitchtune.analysis import report
    from stitchtune.tune.database import read_db

    nb = nbformat.read(REPO / "notebooks" / "analyze_tuning.ipynb", as_version=4)
    [cell] = [c for c in nb.cells if c.cell_type == "code" and c.source.startswith("report.summary_table(d)")]
    shown = next(o["data"]["text/plain"] for o in _outputs(cell) if "text/plain" in o.get("data", {}))
    d = report.prepare(read_db(REPO / "results" / "h200-2026-11-29"))
    with pd.option_context("display.max_columns", 20, "display.width", 80):   # the kernel's repr settings
        assert shown == repr(report.summary_table(d).round(3))
    first = "".join(o.get("text", "") for c in nb.cells if c.cell_type == "code" for o in _outputs(c)[:1])
    assert first.startswith(f"{len(d)} trials, {d['run'].nunique()} workload runs")
