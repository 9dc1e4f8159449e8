"""ONNX Transpose/Reshape/Slice/Concat/Split/Gather/Expand onto the graph.json layout ops, once graph.json has them.

Each mapping turns on when its graph op is in :data:`stitchtune.graph.ops.OPS` (``transpose``
``{"perm"}``, ``reshape`` ``{"shape"}``, ``slice`` ``{"axis", "start", "stop"}`` with step 1,
``concat`` ``{"axis"}``, ``gather`` ``{"axis": 0}`` with an int32/int64 index tensor, ``expand``
``{"shape"}`` for an Expand that is not a broadcast view); until then
:func:`layout_op` says None and the node stays a boundary, as before.

Contract
--------
* :func:`layout_op(op_type)` -> the graph op an ONNX op maps to, or None (not a layout op, or its
  graph op is absent).
* :func:`why_not_layout(node, attrs, const_of, elem_of, rank_of)` -> None if the node can be mapped
  (its parameters are constants, Slice steps are 1, Gather is on axis 0 with an integer index
  tensor whose dtype graph.json takes), else the reason.
* :func:`map_layout(b, node, attrs, x, ins, out_shape, dtype, const_of, name)` emits the node(s)
  through :meth:`GraphBuilder.layout`; ``x(t)`` gives the (exact-shaped) value of tensor ``t``.
* ``Split`` maps to one ``slice`` per output (:func:`map_split`): the sizes are the ``split``
  attribute (opset < 13) or constant input, else ``num_outputs`` (or the output count) equal parts
  of ``ceil(dim / n)``, the last one smaller, as ONNX defines; :func:`split_sizes` gives them.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from stitchtune.graph.ops import OPS
from stitchtune.graph.values import DTYPES
from stitchtune.importers.builder import GraphBuilder, Value

__all__ = ["INT_DTYPES", "layout_op", "map_layout", "map_split", "split_sizes", "why_not_layout"]

_LAYOUT = {"Transpose": "transpose", "Reshape": "reshape", "Flatten": "reshape", "Squeeze": "reshape",
           "Unsqueeze": "reshape", "Slice": "slice", "Concat": "concat", "Gather": "gather", "Split": "slice",
           "Expand": "expand", "GatherElements": "gather_elements"}
INT_DTYPES = {6: "int32", 7: "int64"}   # TensorProto enum -> graph.json (index tensors of gather)


def layout_op(op_type: str) -> str | None:
    """The graph.json op ``op_type`` maps to, when graph.json has it."""
    g = _LAYOUT.get(op_type)
    return g if g is not None and g in OPS else None


def _slices(node: Any, attrs: dict[str, Any], const_of: Callable[[int], list[int] | None],
            rank: int) -> list[tuple[int, int, int, int]] | None:
    """``(axis, start, end, step)`` per sliced axis, or None if a parameter is not a constant."""
    starts: list[int] | None
    ends: list[int] | None
    axes: list[int] | None
    steps: list[int] | None
    if "starts" in attrs:   # opset < 10
        starts, ends, axes, steps = list(attrs["starts"]), list(attrs["ends"]), attrs.get("axes"), None
    else:
        starts, ends = const_of(1), const_of(2)
        axes = const_of(3) if len(node.input) > 3 and node.input[3] else None
        steps = const_of(4) if len(node.input) > 4 and node.input[4] else None
        if starts is None or ends is None or (len(node.input) > 3 and node.input[3] and axes is None) \
                or (len(node.input) > 4 and node.input[4] and steps is None):
            return None
    axes = list(axes) if axes is not None else list(range(len(starts)))
    steps = list(steps) if steps is not None else [1] * len(starts)
    return [(a % rank, s, e, st) for a, s, e, st in zip(axes, starts, ends, steps)]


def why_not_layout(node: Any, attrs: dict[str, Any], const_of: Callable[[int], list[int] | None],
                   elem_of: Callable[[str], int | None], rank_of: Callable[[str], int]) -> str | None:
    """None if the layout node can be mapped, else the reason (see the module docstring)."""
    op = node.op_type
    if op in ("Reshape", "Squeeze", "Unsqueeze", "Expand") and len(node.input) > 1 and node.input[1] \
            and const_of(1) is None:
        return "its shape/axes are not constants"
    if op == "Slice":
        sl = _slices(node, attrs, const_of, rank_of(node.input[0]))
        if sl is None:
            return "slice parameters are not constants"
        if any(st != 1 for *_, st in sl):
            return "slice step is not 1"
    if op == "Split" and split_sizes(node, attrs, const_of, None) is None:
        return "split sizes are not constants"
    if op == "Gather":
        if int(attrs.get("axis", 0)) != 0:
            return "gather along an axis other than 0"
        if const_of(1) is not None:
            return "gather of constant indices (a view when it only moves unit axes; else not yet)"
        name = INT_DTYPES.get(elem_of(node.input[1]) or -1)
        if name is None or name not in DTYPES:
            return "gather indices are not an integer tensor graph.json takes"
    if op == "GatherElements":
        if const_of(1) is not None:
            return "gather of constant indices (not yet)"
        name = INT_DTYPES.get(elem_of(node.input[1]) or -1)
        if name is None or name not in DTYPES:
            return "gather indices are not an integer tensor graph.json takes"
    return None


def map_layout(b: GraphBuilder, node: Any, attrs: dict[str, Any], x: Callable[[str], Value],
               out_shape: tuple[int, ...], dtype: str, const_of: Callable[[int], list[int] | None],
               name: str) -> Value:
    """The value of the layout ``node``'s output (see the module docstring)."""
    op, ins = node.op_type, list(node.input)
    g = _LAYOUT[op]
    if g == "transpose":
        v = x(ins[0])
        perm = list(attrs.get("perm") or reversed(range(len(v.shape))))
        return b.layout("transpose", [v], out_shape, dtype, name, perm=[int(p) for p in perm])
    if g in ("reshape", "expand"):   # expand: numpy's broadcast_to of the (exact) data to the output shape
        return b.layout(g, [x(ins[0])], out_shape, dtype, name, shape=list(out_shape))
    if g == "concat":
        vals = [x(t) for t in ins if t]
        return b.layout("concat", vals, out_shape, dtype, name, axis=int(attrs["axis"]) % len(out_shape))
    if g == "gather":
        return b.layout("gather", [x(ins[0]), x(ins[1])], out_shape, dtype, name, axis=0)
    if g == "gather_elements":   # torch.gather's semantics: the index has the result's shape
        return b.layout("gather_elements", [x(ins[0]), x(ins[1])], out_shape, dtype, name,
                        axis=int(attrs.get("axis", 0)) % len(out_shape))
    v = x(ins[0])   # slice: one graph node per sliced axis, start/stop clamped as ONNX does
    sl = _slices(node, attrs, const_of, len(v.shape)) or []
    shape = list(v.shape)
    for k, (axis, s, e, _) in enumerate(sl):
        n = shape[axis]
        start = int(np.clip(s + n if s < 0 else s, 0, n))
        stop = int(np.clip(e + n if e < 0 else e, 0, n))
        shape[axis] = max(stop - start, 0)
        last = k == len(sl) - 1
        v = b.layout("slice", [v], out_shape if last else tuple(shape), dtype, name if last else f"{name}_{k}",
                     axis=axis, start=start, stop=stop)
    return v


def split_sizes(node: Any, attrs: dict[str, Any], const_of: Callable[[int], list[int] | None],
                dim: int | None) -> list[int] | None:
    """The sizes of a Split's outputs along its axis (None: a size input that is not a constant);
    with ``dim`` None only whether they are known is checked (``[]`` for equal parts)."""
    if "split" in attrs:
        return [int(v) for v in attrs["split"]]
    if len(node.input) > 1 and node.input[1]:
        return const_of(1)
    if dim is None:
        return []
    n = int(attrs.get("num_outputs", len(node.output)))
    part = -(-dim // n)
    return [min(part, dim - k * part) for k in range(n)]


def map_split(b: GraphBuilder, node: Any, attrs: dict[str, Any], x: Callable[[str], Value],
              dtype: str, const_of: Callable[[int], list[int] | None], names: list[str]) -> list[Value | None]:
    """One ``slice`` per output of a Split (None for an unnamed output); a size list that does not
    add up to the dim, or an empty part, is an :class:`~stitchtune.importers.builder.ImportError_`."""
    from stitchtune.importers.builder import ImportError_

    v = x(node.input[0])
    axis = int(attrs.get("axis", 0)) % len(v.shape)
    sizes = split_sizes(node, attrs, const_of, v.shape[axis]) or []
    if sum(sizes) != v.shape[axis] or len(sizes) != len(node.output) or min(sizes, default=0) <= 0:
        raise ImportError_(f"Split {names[0]!a}: sizes {sizes} do not cut dim {v.shape[axis]} into "
                           f"{len(node.output)} non-empty parts")
    out: list[Value | None] = []
    start = 0
    for size, t, name in zip(sizes, node.output, names):
        shape = tuple(size if k == axis else d for k, d in enumerate(v.shape))
        out.append(b.layout("slice", [v], shape, dtype, name, axis=axis, start=start, stop=start + size)
                   if t else None)
        start += size
    return out
