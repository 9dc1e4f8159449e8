"""PyTorch import: an embedding's gradient (an accumulating index put into zeros) as ``scatter_add``.

The backward of ``nn.Embedding`` (word, position and token-type embeddings) reaches the backend, after
Inductor's decompositions, as

* ``_unsafe_masked_index_put_accumulate(full(shape, 0), mask, [ids], values)``: ``mask`` (bool,
  broadcast against ``values``) keeps the ids in range and not ``padding_idx``; torch clamps a
  masked-out id and adds a zero there;
* ``index_put(zeros, [ids], values, accumulate=True)`` (the unmasked form).

Both map to ``scatter_add(where(mask, values, 0), ids)`` with the table's ``shape`` (no ``where``
without a mask): a masked-out row adds zero where torch adds it to a clamped row (equal tables), and
an id outside the table adds nothing (graph.json's semantics: nothing is written out of bounds).

:func:`scatter_reason` is why such a node cannot be in a region (None when it can): the table must
be a fresh tensor of zeros (``full`` / ``zeros`` / ``new_zeros`` / ``zeros_like`` of 0, read by nothing
else), ``accumulate`` true, one index tensor of int32/int64 over the leading dims of ``values``, and a
float32, float16 or bfloat16 table (the kernels' atomic adds; a 16-bit one needs a device that has
it). :func:`is_zeros_base` says a ``full`` is such a base (then no constant of the graph). :func:`map_scatter` emits the nodes.
"""

from __future__ import annotations

from typing import Any

from stitchtune.importers.builder import GraphBuilder, ImportError_, Value, scalar
from stitchtune.importers.torch_fx_util import _where, op_key

__all__ = ["SCATTER_OPS", "ZERO_FILLS", "is_zeros_base", "map_scatter", "scatter_index", "scatter_reason"]

#: the accumulating index puts an embedding's backward becomes
SCATTER_OPS: frozenset[str] = frozenset({"aten._unsafe_masked_index_put_accumulate", "aten.index_put"})
#: ops that make a fresh tensor of one value (zeros: the base of a scatter)
ZERO_FILLS: frozenset[str] = frozenset({"aten.full", "aten.zeros", "aten.new_zeros", "aten.zeros_like",
                                        "aten.new_full", "aten.full_like"})


def _fill_value(node: Any) -> float | None:
    """The value a :data:`ZERO_FILLS` node fills with (0 for the zeros ops), None for another node."""
    if getattr(node, "op", None) != "call_function":
        return None
    key = op_key(node.target)
    if key in ("aten.zeros", "aten.new_zeros", "aten.zeros_like"):
        return 0.0
    if key in ("aten.full", "aten.new_full", "aten.full_like"):
        v = node.kwargs.get("fill_value", node.args[2] if key == "aten.new_full" and len(node.args) > 2 else
                            node.args[1] if len(node.args) > 1 else None)
        return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None
    return None


def _parts(node: Any) -> tuple[Any, Any, list[Any], Any, bool]:
    """``(base, mask, indices, values, accumulate)`` of a :data:`SCATTER_OPS` node (mask None: index_put)."""
    if op_key(node.target) == "aten._unsafe_masked_index_put_accumulate":
        base, mask, indices, values = (list(node.args) + [None] * 4)[:4]
        return base, mask, list(indices or []), values, True
    base, indices, values = (list(node.args) + [None] * 3)[:3]
    acc = node.kwargs.get("accumulate", node.args[3] if len(node.args) > 3 else False)
    return base, None, list(indices or []), values, bool(acc)


def is_zeros_base(node: Any) -> bool:
    """Whether ``node`` is a fresh tensor of zeros read only as the base (``self``) of scatters."""
    return _fill_value(node) == 0.0 and bool(node.users) and all(
        u.op == "call_function" and op_key(u.target) in SCATTER_OPS and u.args[0] is node
        and node not in list(u.args[1:]) for u in node.users)


def scatter_index(node: Any) -> Any:
    """The fx node of a scatter's index tensor (None when it has not exactly one)."""
    indices = _parts(node)[2]
    return indices[0] if len(indices) == 1 else None


def _dims(x: Any) -> tuple[int, ...] | None:
    val = x.meta.get("val") if hasattr(x, "meta") else None
    shape = getattr(val, "shape", None)
    return None if shape is None or not all(type(d) is int for d in shape) else tuple(shape)


def scatter_reason(node: Any, base_checked: bool = False) -> str | None:
    """Why a :data:`SCATTER_OPS` node cannot be a region's ``scatter_add`` (one line), or None.
    ``base_checked``: its base was found a fresh tensor of zeros in the whole graph already (a region's
    copy of the node reads it as an input)."""
    base, _, indices, values, acc = _parts(node)
    if not acc:
        return "index_put without accumulate (an overwrite, not an embedding's gradient)"
    if not base_checked and (_fill_value(base) != 0.0 or not is_zeros_base(base)):
        return "an index put into a tensor that is not a fresh tensor of zeros (only an embedding's gradient maps)"
    if len(indices) != 1 or indices[0] is None:
        return "an index put with several index tensors (only rows of a table, one index, map)"
    table, ids, vals = _dims(node), _dims(indices[0]), _dims(values)
    if table is None or ids is None or vals is None:
        return "an index put of dynamic shape (stitched scatters are specialised per shape)"
    if vals != ids + table[1:]:
        return (f"an index put whose values {list(vals)} are not index {list(ids)} + table rows "
                f"{list(table[1:])} (broadcast values are not mapped)")
    dt = str(getattr(node.meta.get("val"), "dtype", "")).removeprefix("torch.")
    if dt not in ("float32", "float16", "bfloat16"):
        return f"an index put into a {dt} table (stitched kernels add into float32 / float16 / bfloat16 tables)"
    idt = str(getattr(indices[0].meta.get("val"), "dtype", "")).removeprefix("torch.")
    if idt not in ("int32", "int64"):
        return f"an index put with a {idt} index (int32 / int64 rows only)"
    return None


def map_scatter(b: GraphBuilder, node: Any, val: Any, table: tuple[int, ...]) -> Value:
    """The graph value of a :data:`SCATTER_OPS` node: ``scatter_add(where(mask, values, 0), ids)``
    (``val(x)``: the walk's value of fx node ``x``; ``table``: the result's shape). Raises
    :class:`ImportError_` naming the op when :func:`scatter_reason` refuses it (the base is the
    candidates' check: :mod:`stitchtune.importers.torch_candidates` ran it on the whole graph)."""
    why = scatter_reason(node, base_checked=True)
    if why is not None:
        raise ImportError_(f"{node.target} at {_where(node)}: {why}")
    _, mask, indices, values, _ = _parts(node)
    v, ids = val(values), val(indices[0])
    if ids.dtype not in ("int32", "int64"):
        raise ImportError_(f"{node.target} at {_where(node)}: its index is not an int32/int64 tensor of the graph")
    if mask is not None:
        v = b.elementwise("where", [val(mask), v, scalar(0.0)], f"{node.name}_masked")
    return b.layout("scatter_add", [v, ids], table, str(v.dtype), node.name, shape=list(table))
