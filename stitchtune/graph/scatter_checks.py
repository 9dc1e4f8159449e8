"""Validation of ``scatter_add`` (an embedding's gradient): its ``shape`` attribute and result spec.

Contract (graph.json form)
--------------------------
``{"op": "scatter_add", "args": ["v", "idx"], "shape": [R, ...]}``: ``shape`` is the table's (rank 1
to :data:`~stitchtune.graph.checks.MAX_RANK`, positive dims); ``idx`` an ``int32``/``int64`` graph input
(parse checks that it is an input, as for ``gather``); ``v`` a float tensor of shape
``idx.shape + shape[1:]``. Result: ``shape``, ``v``'s dtype; ``out = zeros(shape)``, then
``out[idx[i...], ...] += v[i..., ...]``; an index out of ``[0, R)`` adds nothing (a defined result,
not a validation error). Every problem is one ``"<json path>: <what>"`` line naming the argument.
"""

from __future__ import annotations

from typing import Any

from stitchtune.graph.checks import _check_shape, _Problems, _show
from stitchtune.graph.values import FLOAT_DTYPES, INT_DTYPES, TensorSpec

__all__ = ["scatter_spec"]


def scatter_spec(rn: dict[str, Any], path: str, specs: tuple[TensorSpec, ...], names: tuple[str, ...],
                 p: _Problems) -> tuple[tuple[int, ...] | None, str | None]:
    """``(shape, dtype)`` of a valid ``scatter_add`` node (``specs``/``names``: its two tensor arguments);
    ``(None, None)`` with a problem added to ``p`` otherwise."""
    if "shape" not in rn:
        return None, None   # reported by the attribute check ("missing: ... needs a table shape")
    shape = _check_shape(rn["shape"], f"{path}.shape", p)
    if shape is None or len(specs) != 2:
        return None, None
    v, idx = specs
    if idx.dtype not in INT_DTYPES:
        p.add(f"{path}.args[1]", f"scatter_add needs an int32/int64 graph input as its index, "
                                 f"{_show(names[1])} is {idx.dtype}")
        return None, None
    if v.dtype not in FLOAT_DTYPES:
        p.add(f"{path}.args[0]", f"scatter_add needs float values, {_show(names[0])} is {v.dtype}")
        return None, None
    want = tuple(idx.shape) + tuple(shape[1:])
    if tuple(v.shape) != want:
        p.add(f"{path}.args[0]", f"scatter_add needs values of shape index shape + table shape[1:] = {list(want)} "
                                 f"(index {_show(names[1])} {list(idx.shape)}, table {list(shape)}), "
                                 f"{_show(names[0])} is {list(v.shape)}")
        return None, None
    return shape, v.dtype
