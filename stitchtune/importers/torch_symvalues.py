"""SymInt *values* read by a graph's ops, as int tensors that a region's call fills (issue 41).

Under ``torch.compile(..., dynamic=True)`` a decode step's positions are ``arange(1) + past`` with
``past`` a SymInt (a graph input that is a Python int at run time); regions take tensors only, so such
an op used to stay with PyTorch ("reads a SymInt value, not a tensor").

Contract
--------
* :func:`sym_values(gm)` returns a copy of ``gm`` (``gm`` untouched) in which every read of a SymInt
  *as a value* that the importer maps is a read of a *bound tensor*: an ``aten.full(shape, s,
  dtype=int64)`` of a static shape whose fill is the SymInt ``s`` (:func:`is_bound`), or None when
  ``gm`` has none. Rewritten: an element-wise int op / comparison with one SymInt operand
  (``add(arange, s)`` reads ``full([], s)``); ``arange(1) + s`` (of one element, the value 0) is the
  bound tensor ``full([1], s)`` itself, and a view of a bound tensor with a static shape is a bound
  tensor of that shape (a decode step's position ids ``unsqueeze(arange(1) + s)``: the embedding then
  gathers by a region input, as graph.json's ``gather`` wants); likewise ``arange(1) + t`` with ``t`` a
  0-d int tensor (a static cache's past length) is the view ``t.view([1])`` and views of it one view of
  ``t`` (the gather's index then is a view of a graph input); ``prims.iota`` / ``arange`` with a SymInt
  ``start`` and a static length is ``iota(length) + full([], start)``; a ``full`` of a static shape
  filled with a SymInt is a bound tensor (an int dtype) or a bound tensor cast (a float one). GPT-2's
  prompt position rows ``embedding(table, arange(S))`` are the view ``table[0:S]`` (below). Every rewritten value equals
  the original (same dtype, shape and values; int arithmetic is exact). SymInts read as *sizes*
  (views, ``arange``'s length) are not touched.
* A bound tensor is never in a region: the region reads it as an input, and its call passes the
  SymInt itself (``stitchtune::region(key, tensors, scalars)``, :mod:`stitchtune.deploy.torch_rewrite`),
  which the registered region writes into the tensor (:func:`bound_inputs` says which inputs, at which
  shape and dtype; :meth:`stitchtune.deploy.torch_guard.GuardedRegion.__call__` fills its buffers in
  place: no tensor is made per call). So the
  value reaches the kernel as data: a new value never builds a new kernel, and the generated CUDA
  never holds it. A bound tensor that another op outside the regions reads stays as PyTorch's
  ``full`` (the value it was).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from stitchtune.importers.torch_fx_util import _key, fake_mode_of, graph_copy

__all__ = ["bound_inputs", "is_bound", "sym_values"]

#: the meta key marking a bound tensor made by :func:`sym_values`
BOUND_KEY = "stitchtune_bound"
#: the meta key marking a view of a 0-d int tensor made for ``arange(1) + t`` (:meth:`_Rewriter.scalar_view`)
SCALAR_VIEW_KEY = "stitchtune_scalar_view"

#: element-wise ops whose SymInt operand becomes a 0-d bound tensor (``.Tensor`` overloads only:
#: the same op reads the tensor as it read the number; a 0-d int tensor promotes like a Python int)
_ELEMENTWISE = frozenset({"aten.add", "aten.sub", "aten.rsub", "aten.mul", "aten.maximum", "aten.minimum",
                          "aten.eq", "aten.ne", "aten.lt", "aten.le", "aten.gt", "aten.ge"})
#: views whose result, of a bound tensor, is the bound tensor of the view's shape
_VIEWS = frozenset({"aten.view", "aten.reshape", "aten._unsafe_view", "aten.unsqueeze", "aten.squeeze",
                    "aten.flatten", "aten.alias", "aten.clone", "aten.contiguous"})


def _is_symint(x: Any) -> bool:
    """Whether ``x`` is an fx node whose value is a SymInt with an example value (a hint)."""
    import torch

    val = getattr(x, "meta", {}).get("val") if hasattr(x, "op") else None
    if not isinstance(val, torch.SymInt):
        return False
    return val.node.hint is not None


def is_bound(node: Any) -> bool:
    """Whether ``node`` is a bound tensor made by :func:`sym_values` (``full(static shape, SymInt)``)."""
    return getattr(node, "op", None) == "call_function" and bool(node.meta.get(BOUND_KEY))


def bound_inputs(inputs: Sequence[Any]) -> tuple[tuple[int, tuple[int, ...] | None, Any], ...]:
    """(position, shape, torch dtype) of each bound tensor among a region's ``inputs`` (fx nodes), and
    (position, None, torch.bool) of each carrier (:mod:`~stitchtune.importers.torch_symsizes`: the
    tensor ``empty((value,))`` whose extent is the SymInt passed for it)."""
    from stitchtune.importers.torch_symsizes import is_carrier

    out: list[tuple[int, tuple[int, ...] | None, Any]] = []
    for i, x in enumerate(inputs):
        if is_carrier(x):
            out.append((i, None, x.meta["val"].dtype))
        elif is_bound(x):
            val = x.meta["val"]
            out.append((i, tuple(int(d) for d in val.shape), val.dtype))
    return tuple(out)


def _static_shape(node: Any) -> tuple[int, ...] | None:
    import torch

    val = node.meta.get("val")
    if not isinstance(val, torch.Tensor) or not all(isinstance(d, int) for d in val.shape):
        return None
    return tuple(int(d) for d in val.shape)


def _is_zero_iota(node: Any) -> bool:
    """Whether ``node`` is an int ``arange`` / ``iota`` of one element starting at 0 (its value ``[0]``)."""
    if getattr(node, "op", None) != "call_function" or _static_shape(node) != (1,):
        return False
    key, a = _key(node.target), node.args
    if key == "aten.arange":
        start = a[0] if len(a) > 1 else node.kwargs.get("start", 0)
        return bool(start == 0 and not isinstance(start, bool)) and not node.meta["val"].dtype.is_floating_point
    if key == "prims.iota":
        start = node.kwargs.get("start", a[1] if len(a) > 1 else 0)
        return bool(start == 0) and not node.meta["val"].dtype.is_floating_point
    return False


class _Rewriter:
    """Edits one graph copy; ``fake_mode``: the graph's fake mode (meta values of the new nodes)."""

    def __init__(self, graph: Any, fake_mode: Any) -> None:
        self.graph = graph
        self.mode = fake_mode
        self.changed = False

    def bound(self, before: Any, sym: Any, shape: tuple[int, ...], dtype: Any, device: Any) -> Any:
        """A new bound tensor ``full(shape, sym)`` inserted before ``before``."""
        import torch

        with self.graph.inserting_before(before):
            n = self.graph.call_function(torch.ops.aten.full.default, (list(shape), sym),
                                         {"dtype": dtype, "device": device, "pin_memory": False})
        with self.mode:
            n.meta["val"] = torch.full(shape, sym.meta["val"], dtype=dtype, device=device)
        n.meta[BOUND_KEY] = True
        self.changed = True
        return n

    def replace(self, old: Any, new: Any) -> None:
        old.replace_all_uses_with(new)
        if not old.users:
            self.graph.erase_node(old)

    def scalar_view(self, n: Any, t: Any, shape: tuple[int, ...]) -> None:
        """Replace ``n`` by ``view(t, shape)``, ``t`` a 0-d int tensor (its one value at every element)."""
        import torch

        with self.graph.inserting_before(n):
            v = self.graph.call_function(torch.ops.aten.view.default, (t, list(shape)))
        with self.mode:
            v.meta["val"] = torch.ops.aten.view.default(t.meta["val"], list(shape))
        v.meta[SCALAR_VIEW_KEY] = True
        self.replace(n, v)
        self.changed = True

    def elementwise(self, n: Any) -> None:
        import torch

        if _key(n.target) == "aten.add" and len(n.args) == 2 and n.kwargs.get("alpha", 1) == 1 \
                and _static_shape(n) == (1,):   # arange(1) + t, t a 0-d int tensor (a static cache's
            a, b = n.args                       # past length): the view [1] of t
            t = b if _is_zero_iota(a) else a if _is_zero_iota(b) else None
            val = getattr(t, "meta", {}).get("val")
            if isinstance(val, torch.Tensor) and val.dim() == 0 and val.dtype == n.meta["val"].dtype:
                iota = a if t is b else b
                self.scalar_view(n, t, (1,))
                if not iota.users:
                    self.graph.erase_node(iota)
                return

        tensors = [a for a in n.args if hasattr(a, "op") and isinstance(a.meta.get("val"), torch.Tensor)]
        syms = [i for i, a in enumerate(n.args) if _is_symint(a)]
        if len(syms) != 1 or len(tensors) != 1 or n.kwargs.get("alpha", 1) != 1 or str(n.target).split(".")[-1] != "Tensor":
            return
        t, s = tensors[0], n.args[syms[0]]
        device = t.meta["val"].device
        shape = _static_shape(n)
        if _key(n.target) == "aten.add" and _is_zero_iota(t) and shape is not None \
                and n.meta["val"].dtype == torch.int64:   # arange(1) + s: the bound tensor [s]
            self.replace(n, self.bound(n, s, shape, torch.int64, device))
            if not t.users:   # the arange(1) nobody reads any more
                self.graph.erase_node(t)
            return
        b = self.bound(n, s, (), torch.int64, device)
        n.args = tuple(b if i == syms[0] else a for i, a in enumerate(n.args))

    def iota_start(self, n: Any) -> None:
        """``iota(length, start=s)`` / ``arange(s, e)`` with a SymInt ``s``, a static length: ``iota + full([], s)``."""
        import torch

        key = _key(n.target)
        shape = _static_shape(n)
        val = n.meta.get("val")
        if shape is None or len(shape) != 1 or not isinstance(val, torch.Tensor) or val.dtype not in (torch.int32, torch.int64):
            return
        if key == "prims.iota":
            start = n.kwargs.get("start")
            step = n.kwargs.get("step", 1)
        elif key == "aten.arange" and str(n.target).endswith(".start"):
            start, step = n.args[0], 1
        else:
            return
        if not _is_symint(start) or step != 1:
            return
        with self.graph.inserting_before(n):
            base = self.graph.call_function(torch.ops.aten.arange.default, (shape[0],),
                                            {"dtype": val.dtype, "device": val.device, "pin_memory": False})
        with self.mode:
            base.meta["val"] = torch.arange(shape[0], dtype=val.dtype, device=val.device)
        with self.graph.inserting_before(n):
            add = self.graph.call_function(torch.ops.aten.add.Tensor, (base, start))
        add.meta = dict(n.meta)
        self.replace(n, add)
        self.elementwise(add)

    def fill(self, n: Any) -> None:
        """``full(static shape, s)``: the bound tensor itself (an int dtype), or its cast (a float one:
        the value is exact below 2**24 in float32, as PyTorch's own fill)."""
        import torch

        shape = _static_shape(n)
        if shape is None or len(n.args) < 2 or not _is_symint(n.args[1]):
            return
        val = n.meta["val"]
        if val.dtype in (torch.int32, torch.int64):
            n.meta[BOUND_KEY] = True
            self.changed = True
            return
        if not val.dtype.is_floating_point:
            return
        b = self.bound(n, n.args[1], shape, torch.int64, val.device)
        with self.graph.inserting_before(n):
            cast = self.graph.call_function(torch.ops.prims.convert_element_type.default, (b, val.dtype))
        cast.meta = dict(n.meta)
        self.replace(n, cast)

    def view(self, n: Any) -> None:
        src = n.args[0] if n.args else None
        shape = _static_shape(n)
        if src is not None and getattr(src, "op", None) == "call_function" and src.meta.get(SCALAR_VIEW_KEY) \
                and shape is not None and _key(n.target) != "aten.clone":   # a view of that view: one view of t
            self.scalar_view(n, src.args[0], shape)
            if not src.users:
                self.graph.erase_node(src)
            return
        if src is None or not is_bound(src) or shape is None:
            return
        val = n.meta["val"]
        self.replace(n, self.bound(n, src.args[1], shape, val.dtype, val.device))


def _range_source(ids: Any) -> tuple[Any, list[Any]] | None:
    """(the SymInt ``S``, the chain's nodes) when ``ids`` is ``iota(S)`` / ``arange(S)`` (start 0, step
    1, an int dtype), through ``+ 0`` and views, with one dim ``S`` and every other 1; else None."""
    import torch

    chain = []
    n = ids
    while getattr(n, "op", None) == "call_function":
        chain.append(n)
        key = _key(n.target)
        if key in ("aten.unsqueeze", "aten.view", "aten.reshape", "aten._unsafe_view") and n.args:
            n = n.args[0]
        elif key == "aten.add" and len(n.args) == 2 and n.args[1] == 0 and not isinstance(n.args[1], bool) \
                and n.kwargs.get("alpha", 1) == 1:
            n = n.args[0]
        elif (key == "prims.iota" and n.kwargs.get("start") == 0 and n.kwargs.get("step") == 1
              or key == "aten.arange" and str(n.target).endswith(".default") and len(n.args) == 1) \
                and _is_symint(n.args[0]) and n.meta["val"].dtype in (torch.int32, torch.int64):
            size = n.args[0]
            shape = ids.meta["val"].shape
            if sum(not (isinstance(d, int) and d == 1) for d in shape) != 1 \
                    or not any(str(d) == str(size.meta["val"]) for d in shape):   # (no guard on the symbols)
                return None
            return size, chain
        else:
            return None
    return None


def _position_rows(rw: _Rewriter, n: Any) -> None:
    """``embedding(table, iota(S))`` (GPT-2's prompt position embedding: ids ``arange(S)`` viewed) is
    ``table[0:S]`` viewed at the ids' shape: a view of the table that a region reads as an input (rows
    read in place, no gather and no iota). Only where every reader of the embedding is an op that
    does not mutate it and none is the graph's output (a view must not escape where a fresh tensor did)."""
    import torch

    if len(n.args) < 2 or any(u.op != "call_function" or getattr(u.target, "_schema", None) is None
                              or u.target._schema.is_mutable for u in n.users):
        return
    src = _range_source(n.args[1])
    if src is None:
        return
    size, chain = src
    table, ids = n.args[0], n.args[1]
    shape = list(ids.meta["val"].shape)
    with rw.graph.inserting_before(n):
        v = rw.graph.call_function(torch.ops.aten.slice.Tensor, (table, 0, 0, size))
    with rw.mode:
        v.meta["val"] = torch.ops.aten.slice.Tensor(table.meta["val"], 0, 0, size.meta["val"])
    for k, d in enumerate(shape):
        if isinstance(d, int) and d == 1:
            with rw.graph.inserting_before(n):
                u = rw.graph.call_function(torch.ops.aten.unsqueeze.default, (v, k))
            with rw.mode:
                u.meta["val"] = torch.ops.aten.unsqueeze.default(v.meta["val"], k)
            v = u
    rw.replace(n, v)
    rw.changed = True
    for c in chain:   # the ids nobody reads any more
        if not c.users and not getattr(c, "_erased", False):
            rw.graph.erase_node(c)


def sym_values(gm: Any) -> Any | None:
    """``gm`` with its SymInt values read through bound tensors, or None (see module docstring)."""
    import torch.fx

    def reads_sym(n: Any) -> bool:
        return n.op == "call_function" and any(_is_symint(a) for a in n.all_input_nodes)

    if not any(reads_sym(n) and _key(n.target) in (*_ELEMENTWISE, "prims.iota", "aten.arange", "aten.full")
               or n.op == "call_function" and _key(n.target) in ("aten.embedding", "aten.add") for n in gm.graph.nodes):
        return None
    mode = fake_mode_of(gm)
    if mode is None:
        return None
    graph = graph_copy(gm)
    rw = _Rewriter(graph, mode)
    for n in list(graph.nodes):
        if n.op != "call_function" or getattr(n, "_erased", False):
            continue
        key = _key(n.target)
        if key == "aten.embedding":
            _position_rows(rw, n)
        elif key in ("prims.iota", "aten.arange") and reads_sym(n):
            rw.iota_start(n)
        elif key in _ELEMENTWISE and (reads_sym(n) or key == "aten.add"):
            rw.elementwise(n)
        elif key == "aten.full" and reads_sym(n):
            rw.fill(n)
        elif key in _VIEWS:
            rw.view(n)
    if not rw.changed:
        return None
    graph.lint()
    return torch.fx.GraphModule(gm, graph)
