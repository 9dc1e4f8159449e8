"""Fast start: commands that do not search import none of the heavy libraries.

Each command runs in a fresh interpreter under ``python -X importtime``; the modules it imported are read
from that stderr report. ``validate``, ``space``, ``run --backend reference`` on a float32 graph and
``--help`` must not import any of :data:`HEAVY` (ml_dtypes alone costs ~0.6 s, pandas/optuna/torch more);
a bfloat16 ``run`` imports ml_dtypes and a sigmoid ``run`` scipy, each alone (the control that the report
is read right and that the libraries load where they are used). No timing is
asserted: wall times depend on the machine.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = REPO / "examples"

HEAVY = ("ml_dtypes", "pandas", "optuna", "torch", "matplotlib", "scipy", "pyarrow")


def imported_modules(argv: list[str], cwd: Path) -> set[str]:
    """Full names of every module ``python -m stitchtune ARGV`` imports (exit 0 required)."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])))
    proc = subprocess.run([sys.executable, "-X", "importtime", "-m", "stitchtune", *argv], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    names = set()
    for line in proc.stderr.splitlines():
        if line.startswith("import time:") and line.count("|") == 2:
            name = line.rsplit("|", 1)[1].strip()
            if name != "package":   # the header line: "import time: self [us] | cumulative | imported package"
                names.add(name)
    return names


def heavy_in(names: set[str]) -> list[str]:
    return sorted({n.split(".")[0] for n in names} & set(HEAVY))


@pytest.mark.parametrize("argv", [
    ["--help"],
    ["validate", str(EXAMPLES / "layernorm_small.json")],
    ["space", str(EXAMPLES / "layernorm_small.json"), "--sample", "3"],
    ["run", str(EXAMPLES / "layernorm_small.json"), "--backend", "reference", "--random-inputs", "0",
     "--out", "out.npz"],
], ids=["help", "validate", "space", "run-reference-fp32"])
def test_commands_that_do_not_search_import_no_heavy_library(argv: list[str], tmp_path: Path) -> None:
    names = imported_modules(argv, tmp_path)
    assert "stitchtune.cli" in names and "numpy" in names   # the report was read
    assert heavy_in(names) == [], f"{' '.join(argv[:1])} imported {heavy_in(names)}"


@pytest.mark.parametrize("graph,needed", [("layernorm_bf16_small", "ml_dtypes"),
                                          ("colsum_sigmoid_scale_small", "scipy")])
def test_a_graph_that_needs_a_library_imports_it_alone(graph: str, needed: str, tmp_path: Path) -> None:
    """bfloat16 tensors need ml_dtypes, sigmoid's reference needs scipy's expit: imported then, and only that."""
    names = imported_modules(["run", str(EXAMPLES / f"{graph}.json"), "--random-inputs", "0", "--out", "out.npz"],
                             tmp_path)
    assert heavy_in(names) == [needed]


def test_no_cuda_bindings_where_there_is_no_driver(tmp_path: Path) -> None:
    """Without the CUDA driver library no GPU can be found, so asking which device we are on (space)
    must not import cuda-python (~50 ms) first."""
    from stitchtune.gpu.driver import _driver_library_loads

    if _driver_library_loads():
        pytest.skip("this machine has the CUDA driver library: the bindings are imported to query the GPU")
    names = imported_modules(["space", str(EXAMPLES / "layernorm_small.json"), "--sample", "3"], tmp_path)
    assert "stitchtune.gpu.device_query" in names   # the device was asked for
    assert not any(n == "cuda" or n.startswith("cuda.") for n in names)

