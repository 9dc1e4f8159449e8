"""SymInts read as *sizes* by ops a region computes (issue 41): ``iota(S)`` (a prompt's positions,
``cache_position``), ``full([1, H, L, D], 0)`` (a static cache's lazy zeros), a causal mask's
``iota(L) <= past`` of a static cache of ``L`` positions.

Under ``torch.compile(..., dynamic=True)`` such an op reads the SymInt ``S`` itself (a graph input
that is a Python int at run time), not a tensor; a region reads tensors only and takes its symbolic
extents from their shapes (:class:`~stitchtune.importers.torch_symbolic.SymbolicRegion`), so the op
used to stay with PyTorch ("reads a SymInt value, not a tensor").

Contract
--------
* :func:`sym_sizes(gm)` returns a copy of ``gm`` (``gm`` untouched), or None when it has nothing to
  change, in which:

  - every SymInt node ``S`` that an op of :data:`SIZE_OPS` reads as a size (``prims.iota``'s and
    ``arange``'s length, a ``full``'s shape) has one *carrier*: a node ``empty([S], dtype=bool)``
    (:func:`is_carrier`, :func:`carrier_of`) that nothing in the graph reads. The ops keep reading
    ``S``; a region that computes one takes the carrier as an input instead and reads ``S`` as the
    carrier's extent (``sym_size(carrier, 0)`` in the region's module:
    :func:`~stitchtune.importers.torch_subgraph._subgraph`), so the size is a symbolic extent of a
    region input like any other (one generic kernel per bucket, the extent passed at run time and
    never in the generated code). The region's graph declares the carrier as an input that no node
    reads (:func:`stitchtune.plan.axes.unread_inputs`: it spans no axis and is never loaded);
  - an ``expand`` / ``view`` / ``reshape`` with a SymInt size whose result has its input's shape
    (``expand(mask, [1, -1, 1, L])`` of a ``[1, 1, 1, L]`` mask) is its input: a no-op that would
    otherwise stay with PyTorch as a symbolic view and cut the mask from the ``where`` that reads it.
    Not where the graph returns it (a view must not become its base there). So is a ``slice`` of a
    whole dim (``x[..., :]``, end past the dim: a causal mask's int positions);
  - a ``full`` of a symbolic shape is no constant (it is a region's node like any other: a region
    whose output it is stores its value, ``iota * 0 + fill``).

* A region's call passes each carrier's ``S`` as a SymInt value (``stitchtune::region(key, tensors,
  scalars)``, :mod:`stitchtune.deploy.torch_rewrite`); the registered region makes the carrier, a
  one-element bool buffer it keeps on its device expanded to ``(S,)`` (stride 0: no allocation, no
  kernel, no data; :func:`~stitchtune.importers.torch_symvalues.bound_inputs` lists it with shape None).
"""

from __future__ import annotations

from typing import Any

from stitchtune.importers.torch_fx_util import _key, fake_mode_of, graph_copy

__all__ = ["CARRIER_KEY", "SIZE_OPS", "carrier_of", "is_carrier", "is_size_arg", "sym_sizes"]

#: the meta key marking a carrier made by :func:`sym_sizes`
CARRIER_KEY = "stitchtune_carrier"
#: ops whose SymInt arguments are sizes a region may read from a carrier
SIZE_OPS = frozenset({"prims.iota", "aten.arange", "aten.full"})
#: views whose SymInt sizes may give their input's shape back (a no-op, :func:`sym_sizes`)
_NOOP_VIEWS = frozenset({"aten.expand", "aten.view", "aten.reshape", "aten._unsafe_view"})


def _symint_val(x: Any) -> Any:
    """The SymInt value of the fx node ``x`` when it has one with an example value (a hint), else None."""
    import torch

    val = getattr(x, "meta", {}).get("val") if hasattr(x, "op") else None
    if not isinstance(val, torch.SymInt) or val.node.hint is None:
        return None
    return val


def is_carrier(node: Any) -> bool:
    """Whether ``node`` is a carrier made by :func:`sym_sizes` (``empty([S], dtype=bool)``)."""
    return getattr(node, "op", None) == "call_function" and bool(node.meta.get(CARRIER_KEY))


def carrier_of(sym: Any) -> Any | None:
    """The carrier of the SymInt node ``sym`` (:func:`sym_sizes`), or None."""
    return next((u for u in getattr(sym, "users", ()) if is_carrier(u)), None)


def is_size_arg(node: Any, arg: Any) -> bool:
    """Whether ``node`` (an op of :data:`SIZE_OPS`) reads the fx node ``arg`` as a size that a carrier
    stands for (a region computing ``node`` takes the carrier as its input)."""
    return getattr(node, "op", None) == "call_function" and _key(node.target) in SIZE_OPS \
        and carrier_of(arg) is not None and arg in _size_args(node)


def _size_args(node: Any) -> list[Any]:
    """The fx nodes ``node`` (an op of :data:`SIZE_OPS`) reads as sizes."""
    key = _key(node.target)
    if key == "prims.iota" and node.args:
        return [node.args[0]]
    if key == "aten.arange" and str(node.target).endswith(".default") and node.args:
        return [node.args[0]]
    if key == "aten.full" and node.args and isinstance(node.args[0], (list, tuple)):
        return [a for a in node.args[0] if hasattr(a, "op")]
    return []


def _same_shape(a: Any, b: Any) -> bool:
    """Whether two fake tensors have the same shape, symbol for symbol (no guard is added)."""
    if a.dim() != b.dim():
        return False
    for x, y in zip(a.shape, b.shape):
        if isinstance(x, int) and isinstance(y, int):
            if x != y:
                return False
        elif isinstance(x, int) or isinstance(y, int) or str(x.node.expr) != str(y.node.expr):
            return False
    return True


def _noop_view(n: Any) -> bool:
    """Whether ``n`` is a view with a SymInt size whose result has its input's shape, not returned by the graph."""
    import torch

    if n.op != "call_function" or _key(n.target) not in _NOOP_VIEWS or not n.args or not hasattr(n.args[0], "op"):
        return False
    src, val = n.args[0].meta.get("val"), n.meta.get("val")
    if not isinstance(src, torch.Tensor) or not isinstance(val, torch.Tensor):
        return False
    sizes = n.args[1] if len(n.args) > 1 and isinstance(n.args[1], (list, tuple)) else []
    if not any(_symint_val(a) is not None for a in sizes):
        return False
    if any(u.op == "output" for u in n.users):
        return False
    return _same_shape(src, val) and (_key(n.target) == "aten.expand" or src.is_contiguous())


def _noop_slice(n: Any) -> bool:
    """Whether ``n`` is ``slice(x, dim, 0, end)`` with step 1 and an ``end`` past the dim (``x[..., :]``
    of an int tensor: a causal mask's positions), not returned by the graph: ``x`` itself."""
    import torch

    if n.op != "call_function" or _key(n.target) != "aten.slice" or len(n.args) < 4 or not hasattr(n.args[0], "op"):
        return False
    src, val = n.args[0].meta.get("val"), n.meta.get("val")
    start, end = n.args[2], n.args[3]
    step = n.args[4] if len(n.args) > 4 else 1
    if not isinstance(src, torch.Tensor) or not isinstance(val, torch.Tensor) or any(u.op == "output" for u in n.users):
        return False
    return start in (0, None) and step == 1 and isinstance(end, int) and end >= 2**62 and _same_shape(src, val)


def sym_sizes(gm: Any) -> Any | None:
    """``gm`` with a carrier per SymInt read as a size and its no-op symbolic views dropped, or None
    (see module docstring)."""
    import torch
    import torch.fx

    def sized(n: Any) -> bool:
        return n.op == "call_function" and _key(n.target) in SIZE_OPS and any(
            _symint_val(a) is not None for a in _size_args(n))

    if not any(sized(n) or _noop_view(n) or _noop_slice(n) for n in gm.graph.nodes):
        return None
    mode = fake_mode_of(gm)
    if mode is None:
        return None
    graph = graph_copy(gm)
    changed = False
    for n in list(graph.nodes):
        if _noop_view(n) or _noop_slice(n):
            n.replace_all_uses_with(n.args[0])
            graph.erase_node(n)
            changed = True
            continue
        if not sized(n):
            continue
        device = n.meta["val"].device
        for s in _size_args(n):
            if _symint_val(s) is None or carrier_of(s) is not None:
                continue
            with graph.inserting_before(n):
                c = graph.call_function(torch.ops.aten.empty.memory_format, ([s],),
                                        {"dtype": torch.bool, "device": device, "pin_memory": False})
            with mode:
                c.meta["val"] = torch.empty((s.meta["val"],), dtype=torch.bool, device=device)
            c.meta[CARRIER_KEY] = True
            changed = True
    if not changed:
        return None
    graph.lint()
    return torch.fx.GraphModule(gm, graph)
