"""``gather_elements`` (``torch.gather`` / ONNX ``GatherElements``): validation of its form and the
reference's semantics, out-of-range indices included."""

from __future__ import annotations

import numpy as np
import pytest

from stitchtune.errors import GraphError
from stitchtune.graph.parse import parse_graph
from stitchtune.graph.reference import gather_bounds, random_inputs, run_reference


def _g(x: list[int], idx: list[int], axis: int, idx_dtype: str = "int64", x_dtype: str = "float32") -> object:
    return parse_graph({"name": "g", "inputs": {"x": {"shape": x, "dtype": x_dtype}, "i": {"shape": idx, "dtype": idx_dtype}},
                        "nodes": [{"id": "y", "op": "gather_elements", "args": ["x", "i"], "axis": axis}],
                        "outputs": ["y"]})


@pytest.mark.parametrize("x,idx,axis", [([4, 6], [4, 1], 1), ([4, 6], [3, 2], -1), ([5, 3, 4], [2, 3, 4], 0),
                                        ([5, 3, 4], [5, 2, 4], 1)])
def test_reference_is_torch_gather(x: list[int], idx: list[int], axis: int) -> None:
    torch = pytest.importorskip("torch")
    g = _g(x, idx, axis)
    assert g.spec("y").shape == tuple(idx) and gather_bounds(g) == {"i": x[axis]}
    inp = random_inputs(g, 0)
    assert inp["i"].min() >= 0 and inp["i"].max() < x[axis]
    want = torch.gather(torch.from_numpy(inp["x"]), axis, torch.from_numpy(inp["i"])).numpy()
    np.testing.assert_array_equal(run_reference(g, inp)["y"], want)


def test_out_of_range_indices_give_zeros() -> None:
    g = _g([3, 5], [3, 1], 1, "int32")
    x = np.arange(15, dtype=np.float32).reshape(3, 5) + 1
    out = run_reference(g, {"x": x, "i": np.array([[4], [5], [-1]], dtype=np.int32)})["y"]
    assert out.ravel().tolist() == [5.0, 0.0, 0.0]


@pytest.mark.parametrize("x,idx,axis,dtypes,needle", [
    ([4, 6], [4], 1, ("int64", "float32"), "same rank"),
    ([4, 6], [5, 1], 1, ("int64", "float32"), "no larger outside axis 1"),
    ([4, 6], [4, 1], 2, ("int64", "float32"), "axis 2 out of range"),
    ([4, 6], [4, 1], 1, ("float32", "float32"), "int32/int64"),
])
def test_bad_forms_are_one_line_each(x, idx, axis, dtypes, needle) -> None:
    with pytest.raises(GraphError) as e:
        _g(x, idx, axis, *dtypes)
    assert any(needle in p for p in e.value.problems), e.value.problems
