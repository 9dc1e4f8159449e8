"""The DRAM floor of a gathered table (issue 39): ``Graph.min_bytes`` counts at most the rows the
indices name, ``io_bytes`` (what must fit in memory) the whole table; ``check_fits`` uses the latter."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from stitchtune.graph.parse import load_graph, parse_graph
from stitchtune.hardware.device import DeviceError, check_fits

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def _embed(rows: int, tokens: int, extra: list[dict[str, Any]] | None = None, outputs: tuple[str, ...] = ("y",)) -> Any:
    return parse_graph({
        "name": "emb",
        "inputs": {"ids": {"shape": [tokens], "dtype": "int32"}, "w": {"shape": [rows, 64], "dtype": "float32"}},
        "nodes": [{"id": "y", "op": "gather", "args": ["w", "ids"], "axis": 0}] + (extra or []),
        "outputs": list(outputs)})


def test_gathered_table_counts_the_rows_its_indices_name() -> None:
    g = _embed(rows=1000, tokens=100)
    assert g.input_read_bytes() == {"ids": 100 * 4, "w": 100 * 64 * 4}
    assert g.min_bytes() == 100 * 4 + 2 * 100 * 64 * 4   # ids + gathered rows + the output
    assert g.io_bytes() == 100 * 4 + 1000 * 64 * 4 + 100 * 64 * 4


def test_more_indices_than_rows_count_the_table_once() -> None:
    g = _embed(rows=10, tokens=100)
    assert g.input_read_bytes()["w"] == 10 * 64 * 4
    assert g.min_bytes() == g.io_bytes()


def test_two_gathers_of_one_table_add_their_indices() -> None:
    g = _embed(rows=1000, tokens=100, extra=[{"id": "z", "op": "gather", "args": ["w", "ids"], "axis": 0}],
               outputs=("y", "z"))
    assert g.input_read_bytes()["w"] == 2 * 100 * 64 * 4


def test_a_table_read_any_other_way_counts_whole() -> None:
    g = _embed(rows=1000, tokens=100, extra=[{"id": "s", "op": "reduce_sum", "args": ["w"], "axes": [0],
                                              "keepdims": False}], outputs=("y", "s"))
    assert g.input_read_bytes()["w"] == 1000 * 64 * 4


def test_gather_elements_counts_one_element_per_index() -> None:
    g = parse_graph({
        "name": "ge",
        "inputs": {"x": {"shape": [64, 512], "dtype": "float32"}, "i": {"shape": [64, 8], "dtype": "int64"}},
        "nodes": [{"id": "y", "op": "gather_elements", "args": ["x", "i"], "axis": 1}],
        "outputs": ["y"]})
    assert g.input_read_bytes() == {"x": 64 * 8 * 4, "i": 64 * 8 * 8}


def test_the_bert_embedding_example() -> None:
    g = load_graph(EXAMPLES / "embed_gather_layernorm.json")
    tokens, hidden = 32 * 512, 768
    assert g.input_read_bytes()["word"] == tokens * hidden * 4 < 30522 * hidden * 4
    assert g.io_bytes() - g.min_bytes() == (30522 - tokens) * hidden * 4


def test_check_fits_needs_the_whole_table_in_memory() -> None:
    g = _embed(rows=1000, tokens=100)

    class Small:
        name = "small"
        key = "small/sm_90"
        memory_bytes = g.io_bytes() - 1

    assert Small.memory_bytes >= g.min_bytes()
    with pytest.raises(DeviceError) as e:
        check_fits(g, Small())
    assert str(g.io_bytes()) in str(e.value)
