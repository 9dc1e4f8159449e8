"""PyTorch import: a static KV cache's index copy (issue 41 item 2) as a ``where`` over the cache.

transformers' ``StaticCache.update`` writes the new keys / values at ``cache_position`` with
``k_out.index_copy_(2, cache_position, key_states)`` (or ``k_out[:, :, cache_position] = ...``); after
functionalization the backend sees ``index_put(cache, [None, None, pos], new)`` (no accumulate), whose
result the graph returns (PyTorch copies it into the cache buffer) and attention reads. One position at
a time (a decode step: ``pos`` has one element, ``new`` extent 1 along the axis) it is, element by element,

    out[..., s, ...] = new[..., 0, ...] if s == pos[0] else cache[..., s, ...]

which graph.json computes with the ops it has: ``where(eq(iota(axis), pos), new, cache)``, the index an
int input (or int arithmetic) of the region, compared, never used as an address (no write out of
bounds: a position outside the cache changes nothing, where PyTorch raises).

:func:`index_copy_axis` says a node is such a copy (the axis, or None), :func:`index_copy_reason` why
an ``index_put`` without accumulate is not (one line), :func:`map_index_copy` emits the nodes. The
result is a new tensor, as functionalization's ``index_put`` is: the cache is read and written whole
(PyTorch's own copy back into the buffer stays PyTorch's). Writing only the new row in place is not
done here.
"""

from __future__ import annotations

from typing import Any, Callable

from stitchtune.importers.builder import GraphBuilder, ImportError_, Value
from stitchtune.importers.torch_fx_util import _where, op_key

__all__ = ["index_copy_axis", "index_copy_index", "index_copy_reason", "is_overwrite", "map_index_copy"]


def _numel(x: Any) -> int | None:
    val = x.meta.get("val") if hasattr(x, "meta") else None
    shape = getattr(val, "shape", None)
    if shape is None:
        return None
    n = 1
    for d in shape:
        if type(d) is not int:
            return None
        n *= d
    return n


def _parts(node: Any) -> tuple[Any, list[Any], Any, bool]:
    base, indices, values = (list(node.args) + [None] * 3)[:3]
    acc = node.kwargs.get("accumulate", node.args[3] if len(node.args) > 3 else False)
    return base, list(indices or []), values, bool(acc)


def is_overwrite(node: Any) -> bool:
    """Whether ``node`` is an ``aten.index_put`` without accumulate (an index copy, of any shape)."""
    return op_key(node.target) == "aten.index_put" and not _parts(node)[3]


def index_copy_reason(node: Any) -> str | None:
    """Why an ``aten.index_put`` node is not a one-position index copy (one line), or None when it is."""
    if op_key(node.target) != "aten.index_put":
        return "not an index_put"
    base, indices, values, acc = _parts(node)
    if acc:
        return "an accumulating index_put (an embedding's gradient: torch_scatter)"
    real = [i for i, x in enumerate(indices) if x is not None]
    if len(real) != 1:
        return "an index copy with several index tensors (one axis, one position, maps)"
    axis = real[0]
    idx = indices[axis]
    ival, bval, vval = (getattr(x, "meta", {}).get("val") for x in (idx, base, values))
    if ival is None or bval is None or vval is None:
        return "an index copy without shapes"
    if str(ival.dtype) not in ("torch.int32", "torch.int64"):
        return f"an index copy with a {str(ival.dtype).removeprefix('torch.')} index (int32 / int64 only)"
    if _numel(idx) != 1:
        return "an index copy of several positions (one position, a decode step, maps)"
    if vval.dim() != bval.dim() or vval.dtype != bval.dtype:
        return "an index copy whose values do not have the cache's rank and dtype"
    if not (type(vval.shape[axis]) is int and vval.shape[axis] == 1):
        return "an index copy whose values are not one position along the index's axis"
    if str(bval.dtype).removeprefix("torch.") not in ("float32", "float16", "bfloat16"):
        return f"an index copy into a {str(bval.dtype).removeprefix('torch.')} tensor"
    return None


def index_copy_axis(node: Any) -> int | None:
    """The axis of a one-position index copy (:func:`index_copy_reason` is None), else None."""
    if index_copy_reason(node) is not None:
        return None
    return next(i for i, x in enumerate(_parts(node)[1]) if x is not None)


def index_copy_index(node: Any) -> Any:
    """The fx node of an index copy's position (compared in the region, not an address)."""
    axis = index_copy_axis(node)
    return None if axis is None else _parts(node)[1][axis]


def map_index_copy(b: GraphBuilder, node: Any, val: Callable[[Any], Value], shape: tuple[int, ...]) -> Value:
    """The graph value of a one-position index copy: ``where(eq(iota, pos), values, cache)`` with the
    iota along the copy's axis of ``shape`` (the result's). Raises :class:`ImportError_` naming the op
    when :func:`index_copy_reason` refuses it."""
    why = index_copy_reason(node)
    if why is not None:
        raise ImportError_(f"{node.target} at {_where(node)}: {why}")
    base, indices, values, _ = _parts(node)
    axis = next(i for i, x in enumerate(indices) if x is not None)
    pos = val(indices[axis])
    if pos.dtype not in ("int32", "int64"):
        raise ImportError_(f"{node.target} at {_where(node)}: its position is not an int32/int64 tensor of the graph")
    if pos.shape != (1,):
        pos = b.layout("reshape", [pos], (1,), str(pos.dtype), f"{node.name}_pos", shape=[1])
    grid = tuple(d if i == axis else 1 for i, d in enumerate(shape))
    at = b.iota(grid, axis, str(pos.dtype), f"{node.name}_at")
    hit = b.elementwise("eq", [at, pos], f"{node.name}_hit")
    return b.elementwise("where", [hit, val(values), val(base)], node.name)
