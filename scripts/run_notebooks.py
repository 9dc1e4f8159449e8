#!/usr/bin/env python3
"""Execute the notebooks in ``notebooks/`` against the committed H200 tuning database and save them
with their outputs, so that a reader browsing the repository sees the tables and figures, and they
stay true to the code and the data.

    python scripts/run_notebooks.py            # execute every notebook, write its outputs in place
    python scripts/run_notebooks.py --check    # execute, write nothing; exit 1 when a text output
                                               # differs from the committed one (figures not compared)

Each notebook runs on a real Jupyter kernel (nbclient + ipykernel, the ``test`` extra) with
``notebooks/`` as its working directory (as when a reader opens it), the repository on
``PYTHONPATH`` and ``STITCHTUNE_DB`` / ``STITCHTUNE_WORKLOAD`` unset, so it reads its default, the
committed ``results/h200-2026-11-29`` (found as ``../results/...``). Timings and kernel versions are
left out of the saved file, so that a re-run without changes leaves ``git diff`` empty apart from
PNG bytes when matplotlib changes. About a minute of CPU on 2 cores.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
NOTEBOOKS = REPO / "notebooks"
CELL_TIMEOUT_S = 300


def execute(path: Path):
    """The notebook at ``path`` executed from clean (outputs cleared first), volatile metadata removed."""
    import nbclient
    import nbformat

    nb = nbformat.read(path, as_version=4)
    for cell in nb.cells:
        if cell.cell_type == "code":
            cell.outputs = []
            cell.execution_count = None
    env_keep = {k: os.environ.pop(k) for k in ("STITCHTUNE_DB", "STITCHTUNE_WORKLOAD") if k in os.environ}
    old_pp = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), old_pp]))
    try:
        nbclient.NotebookClient(nb, timeout=CELL_TIMEOUT_S, kernel_name="python3", record_timing=False,
                                resources={"metadata": {"path": str(NOTEBOOKS)}}).execute()
    finally:
        os.environ.update(env_keep)
        if old_pp is None:
            os.environ.pop("PYTHONPATH", None)
        else:
            os.environ["PYTHONPATH"] = old_pp
    nb.metadata["language_info"] = {"name": "python"}
    for cell in nb.cells:
        cell.metadata.pop("execution", None)
    return nb


def text_outputs(nb) -> list[list[str]]:
    """Per code cell, its text outputs (stream text and text/plain), the part ``--check`` compares."""
    out = []
    for cell in nb.cells:
        if cell.cell_type != "code":
            continue
        texts = []
        for o in cell.get("outputs", []):
            if o.get("output_type") == "stream":
                texts.append(o.get("text", ""))
            elif "text/plain" in o.get("data", {}) and "image/png" not in o.get("data", {}):
                texts.append(o["data"]["text/plain"])
            elif o.get("output_type") == "error":
                texts.append(f"{o.get('ename')}: {o.get('evalue')}")
        out.append(texts)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("notebooks", nargs="*", type=Path, help="notebooks (default: notebooks/*.ipynb)")
    ap.add_argument("--check", action="store_true", help="compare text outputs with the committed ones; write nothing")
    args = ap.parse_args(argv)
    import nbformat

    paths = args.notebooks or sorted(NOTEBOOKS.glob("*.ipynb"))
    stale = []
    for path in paths:
        nb = execute(path)
        if args.check:
            committed = nbformat.read(path, as_version=4)
            if text_outputs(committed) != text_outputs(nb):
                stale.append(path)
                print(f"{path}: text outputs differ from a fresh run", file=sys.stderr)
            else:
                print(f"{path}: up to date")
        else:
            nbformat.write(nb, path)
            print(f"wrote {path} with its outputs")
    if stale:
        print("run `python scripts/run_notebooks.py` and commit the notebooks", file=sys.stderr)
    return 1 if stale else 0


if __name__ == "__main__":
    sys.exit(main())
