"""Hostile gather indices through `stitchtune run` (issue 17): an index out of range (-1, V, 2**31 - 1)
is one named error line, exit 2, no output file; valid indices run; an int tensor used as anything
but a gather index is refused by `validate` with one named line."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from helpers.cli import call_cli as _call
from helpers.common import EXAMPLES
from stitchtune.graph.parse import load_graph
from stitchtune.graph.reference import random_inputs

GRAPH = EXAMPLES / "embed_gather_layernorm_small.json"


@pytest.mark.parametrize("bad", [-1, 50, 2**31 - 1])
def test_out_of_range_index_is_a_named_error(tmp_path: Path, bad: int) -> None:
    x = random_inputs(load_graph(GRAPH), 0)
    x["ids"][1, 2] = bad
    np.savez(tmp_path / "in.npz", **x)
    out = tmp_path / "out.npz"
    rc, _, err = _call(["run", str(GRAPH), "--inputs", str(tmp_path / "in.npz"), "--out", str(out),
                        "--backend", "emulate", "--device", "h200", "--db", str(tmp_path / "db")])
    lines = [ln for ln in err.splitlines() if "error" in ln]
    assert rc == 2 and not out.exists()
    assert lines == ["stitchtune: error: gather 'we': index out of range (the table has fewer rows, or the "
                     "index is negative); those output rows are zeros"]
    assert "Traceback" not in err


def test_valid_indices_run(tmp_path: Path) -> None:
    rc, stdout, err = _call(["run", str(GRAPH), "--random-inputs", "1", "--out", str(tmp_path / "o.npz"),
                             "--backend", "emulate", "--device", "h200", "--db", str(tmp_path / "db")])
    assert rc == 0, err
    assert "y: float32[2, 5, 32]" in stdout


def test_int_tensor_mixed_with_floats_is_refused(tmp_path: Path) -> None:
    d = json.loads(GRAPH.read_text())
    d["nodes"][1]["args"] = ["we", "ids"]
    (tmp_path / "g.json").write_text(json.dumps(d))
    rc, out, err = _call(["validate", str(tmp_path / "g.json")])
    assert rc == 2 and out == ""
    assert "nodes[1].args: add cannot mix int and non-int tensors: 'we' (float32), 'ids' (int32)" in err
    assert err.count("\n") == 1   # one line, no traceback
