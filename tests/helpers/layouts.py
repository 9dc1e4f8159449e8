"""Hypothesis strategies of layout regions shared by the lowering fuzzers (tests/lower/test_layout_fuzz.py,
tests/lower/test_row_vectors.py)."""

from __future__ import annotations

from typing import Any

from hypothesis import strategies as st


@st.composite
def layout_regions(draw: st.DrawFn) -> dict[str, Any]:
    """A graph (as a dict) of transposes, reshapes (splits and merges) and broadcast adds / muls of an input
    ``x`` of 2-3 small axes, one reduction stage over some of its axes (``s``), ``y = cur - s`` and maybe a
    transposed ``y``: the regions the layout fuzz and the row-vector fuzz draw."""
    shape = draw(st.lists(st.sampled_from([2, 3, 4, 8, 16]), min_size=2, max_size=3))
    nodes: list[dict] = []
    cur, cur_shape = "x", list(shape)
    inputs = {"x": {"shape": list(shape), "dtype": "float32"}}

    def add(node: dict, new_shape: list[int]) -> None:
        nonlocal cur, cur_shape
        nodes.append(node)
        cur, cur_shape = node["id"], new_shape

    for step in range(draw(st.integers(1, 3))):
        kind = draw(st.sampled_from(["transpose", "reshape", "bcast"]))
        nid = f"n{len(nodes)}"
        if kind == "transpose" and len(cur_shape) > 1:
            perm = draw(st.permutations(range(len(cur_shape))))
            add({"id": nid, "op": "transpose", "args": [cur], "perm": list(perm)}, [cur_shape[p] for p in perm])
        elif kind == "reshape":
            k = draw(st.integers(0, len(cur_shape) - 1))
            d = cur_shape[k]
            if d in (4, 8, 16) and len(cur_shape) < 4:  # split
                f = 2
                new = cur_shape[:k] + [f, d // f] + cur_shape[k + 1:]
            elif k + 1 < len(cur_shape):  # merge with the next
                new = cur_shape[:k] + [d * cur_shape[k + 1]] + cur_shape[k + 2:]
            else:
                continue
            add({"id": nid, "op": "reshape", "args": [cur], "shape": new}, new)
        else:
            wshape = [s if draw(st.booleans()) else 1 for s in cur_shape]
            w = f"w{len(inputs)}"
            inputs[w] = {"shape": wshape, "dtype": "float32"}
            add({"id": nid, "op": draw(st.sampled_from(["add", "mul"])), "args": [cur, w]}, cur_shape)
    axes = sorted(draw(st.sets(st.integers(0, len(cur_shape) - 1), min_size=1, max_size=len(cur_shape))))
    op = draw(st.sampled_from(["reduce_sum", "reduce_max", "reduce_mean"]))
    nodes.append({"id": "s", "op": op, "args": [cur], "axes": axes, "keepdims": True})
    nodes.append({"id": "y", "op": "sub", "args": [cur, "s"]})
    outs = ["y"]
    if draw(st.booleans()) and len(cur_shape) > 1:
        perm = draw(st.permutations(range(len(cur_shape))))
        nodes.append({"id": "yt", "op": "transpose", "args": ["y"], "perm": list(perm)})
        outs = ["yt"]
    return {"name": "fz", "inputs": inputs, "nodes": nodes, "outputs": outs + ["s"]}
