"""Constant-only parts of an ATen fx graph, evaluated at import time.

Masks and position tables are built from constants: ``arange``, ``new_ones``, ``zeros``, integer
``add``/``ge``/``le``, ``unsqueeze``/``expand``/``slice``/``view`` of those, ``&`` of constant bool
tensors, 0-d tensors. ``torch.export`` and the ``torch.compile`` backend specialise shapes, so
these nodes compute the same tensor at every call (the ONNX importer folds the same nodes into
initializers, :mod:`stitchtune.importers.onnx_fold`).

Contract of :func:`fold_constants(nodes, known)` -> ``{fx node: tensor}``:

* a ``call_function`` node is constant when its op is in :data:`FOLDABLE` (deterministic, no
  randomness, no in-place ops) and every fx node it reads is constant; ``known`` names placeholders
  whose values are constant (buffers of an exported program: position ids, rotary frequencies), and
  ``get_attr`` nodes of tensor constants (not parameters) are constant;
* it is evaluated on the CPU with PyTorch itself (``device`` arguments replaced by ``cpu``); a node
  whose evaluation raises, whose result is not a tensor (or tuple of tensors read by ``getitem``) or
  has more than :data:`MAX_ELEMENTS` elements is not constant, and neither is anything that reads it;
* the result holds the constant ``call_function`` nodes (and constant ``getitem`` nodes), never
  placeholders or ``get_attr`` nodes; nothing here modifies the graph.
"""

from __future__ import annotations

import logging
import operator
from collections.abc import Mapping, Sequence
from typing import Any

from stitchtune.importers.torch_fx_util import _key, fx_args

__all__ = ["FOLDABLE", "MAX_ELEMENTS", "fold_constants", "resolved_index", "row_range"]

log = logging.getLogger(__name__)

MAX_ELEMENTS = 1 << 16   # per constant tensor: bigger ones stay ops of the graph

#: ATen op keys (``torch_aten._key``) that are evaluated when all they read is constant
FOLDABLE: frozenset[str] = frozenset({
    "aten.arange", "aten.zeros", "aten.ones", "aten.full", "aten.new_ones", "aten.new_zeros", "aten.new_full",
    "aten.zeros_like", "aten.ones_like", "aten.full_like", "aten.scalar_tensor", "aten.lift_fresh_copy",
    "aten.add", "aten.sub", "aten.rsub", "aten.mul", "aten.div", "aten.neg", "aten.remainder", "aten.fmod",
    "aten.floor_divide",
    "aten.eq", "aten.ne", "aten.lt", "aten.le", "aten.gt", "aten.ge", "aten.__and__", "aten.__or__",
    "aten.bitwise_and", "aten.bitwise_or", "aten.bitwise_not", "aten.logical_and", "aten.logical_or",
    "aten.logical_not", "aten.where", "aten.masked_fill", "aten.tril", "aten.triu", "aten.cumsum",
    "aten.unsqueeze", "aten.squeeze", "aten.expand", "aten.expand_as", "aten.view", "aten.reshape",
    "aten._unsafe_view", "aten.flatten", "aten.slice", "aten.select", "aten.index", "aten.gather",
    "aten.permute", "aten.transpose", "aten.t", "aten.cat", "aten.clone", "aten.contiguous", "aten.alias",
    "aten.detach", "aten.to", "aten._to_copy", "aten.type_as", "aten.split", "aten.chunk",
    "aten.sin", "aten.cos", "aten.exp", "aten.pow", "aten.reciprocal", "aten.sqrt", "aten.rsqrt",
    "aten.mm", "aten.matmul", "aten.bmm", "aten.float", "aten.repeat", "aten.max", "aten.min", "aten.sum",
    "prims.iota", "prims.convert_element_type"})   # (the decompositions of arange and of a dtype cast)


def _real(t: Any) -> bool:
    """A tensor with data (not a fake or meta tensor of a trace)."""
    import torch
    from torch._subclasses.fake_tensor import is_fake

    return isinstance(t, torch.Tensor) and not is_fake(t) and t.device.type != "meta"


def _small(val: Any) -> bool:
    if _real(val):
        return val.numel() <= MAX_ELEMENTS
    return isinstance(val, (tuple, list)) and all(_real(v) and v.numel() <= MAX_ELEMENTS for v in val)


def _evaluate(n: Any, vals: Mapping[Any, Any]) -> Any:
    """``n``'s value from the constant values of what it reads (raises when PyTorch does)."""
    import torch
    import torch.fx

    args, kwargs = torch.fx.node.map_arg((n.args, n.kwargs), lambda a: vals[a])
    if "device" in kwargs:
        kwargs = {**kwargs, "device": torch.device("cpu")}
    if _key(n.target) == "aten.to" and len(args) > 1 and isinstance(args[1], (torch.device, str)):
        args = (args[0], torch.device("cpu"), *args[2:])
    from torch._subclasses.fake_tensor import unset_fake_temporarily

    with torch.no_grad(), unset_fake_temporarily():   # real values even inside a compile's fake mode
        return n.target(*args, **kwargs)


def _attr(root: Any, target: str) -> Any:
    """The tensor constant ``root.<target>`` (not a parameter), or None."""
    import torch

    obj = root
    for part in target.split("."):
        obj = getattr(obj, part, None)
    ok = _real(obj) and not isinstance(obj, torch.nn.Parameter) and obj.numel() <= MAX_ELEMENTS
    return obj if ok else None


def fold_constants(nodes: Sequence[Any], known: Mapping[str, Any] | None = None, root: Any = None) -> dict[Any, Any]:
    """The constant nodes of ``nodes`` (an fx graph's nodes, in order) with their values (see the
    module docstring); ``root`` (the GraphModule) holds the tensor constants of ``get_attr`` nodes."""
    vals: dict[Any, Any] = {}
    known = known or {}
    for n in nodes:
        if n.op == "placeholder":
            if n.name in known and _real(known[n.name]):
                vals[n] = known[n.name]
            continue
        if n.op == "get_attr" and root is not None:
            t = _attr(root, str(n.target))
            if t is not None:
                vals[n] = t
            continue
        if n.op != "call_function":
            continue
        reads = fx_args(n)
        if any(a not in vals for a in reads):
            continue
        if n.target is operator.getitem:
            src, i = n.args
            vals[n] = vals[src][i]
            continue
        if not hasattr(n.target, "_schema") or _key(n.target) not in FOLDABLE:
            continue
        try:
            out = _evaluate(n, vals)
        except Exception as exc:  # noqa: BLE001 -- an op that does not evaluate is simply not constant
            log.debug("%s is not folded: %s", n.name, exc)
            continue
        if _small(out):
            vals[n] = out
    return {n: v for n, v in vals.items() if n.op == "call_function"}


def row_range(ids: Any, rows: int) -> tuple[int, int] | None:
    """``(start, stop)`` when the constant int tensor ``ids`` holds, in row-major order, the consecutive
    rows ``start, start + 1, ..., stop - 1`` of a table of ``rows`` rows (GPT-2's position ids
    ``arange(S)``: an embedding of them is the table's rows ``[0, S)``), else None."""
    import torch

    if not isinstance(ids, torch.Tensor) or ids.dtype not in (torch.int32, torch.int64) or ids.numel() == 0:
        return None
    from torch._subclasses.fake_tensor import unset_fake_temporarily

    with unset_fake_temporarily():   # real values, also inside a compile's fake mode
        flat = ids.reshape(-1).to(torch.int64)
        start = int(flat[0])
        stop = start + flat.numel()
        if start < 0 or stop > rows or not torch.equal(flat, torch.arange(start, stop, dtype=torch.int64)):
            return None
    return start, stop


def resolved_index(u: Any, x: Any, consts: Mapping[Any, Any]) -> bool:
    """Whether fx node ``u`` reads the constant ``x`` (a node of ``consts``) as indices that a region
    resolves at import time: the indices of an ``index``, or the ids of an ``embedding`` that are a
    range of the table's rows (:func:`row_range`: the region reads a slice of the table)."""
    if getattr(u, "op", None) != "call_function" or x not in consts:
        return False
    key = _key(u.target)
    if key == "aten.index":
        return x is not u.args[0] and x in fx_args(u)
    if key == "aten.embedding" and len(u.args) > 1 and u.args[1] is x and x is not u.args[0]:
        table = u.args[0].meta.get("val") if hasattr(u.args[0], "meta") else None
        rows = table.shape[0] if table is not None and table.dim() > 0 else None
        return isinstance(rows, int) and row_range(consts[x], rows) is not None
    return False
