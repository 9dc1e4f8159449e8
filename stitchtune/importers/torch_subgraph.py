"""The sub-graph of one region candidate group (for :mod:`stitchtune.importers.torch_regions`).

* :func:`_subgraph(group, consts, pulled)`: a graph (a GraphModule on demand) of the group and the pulled nodes it reads;
  its placeholders are the external inputs (symbolic dims at their hints), 0-d constants are
  ``scalar_tensor`` nodes and constant ``index`` indices are buffers of the module (resolved at
  import time, never graph inputs); a SymInt read as a size (``iota(S)``) is ``sym_size(carrier, 0)``
  of its carrier, an input (:mod:`~stitchtune.importers.torch_symsizes`); its outputs are the group's
  nodes read outside it.
* :func:`viewed_inputs`: in a region with a pick, the inputs read only through one reshape (declared
  at the reshaped shape by the region).
* :func:`_is_view` / :func:`is_noop`: nodes whose result PyTorch gives for free from their input
  (a view; eval dropout or a same-dtype cast), left outside a region at its boundary.
* :func:`_dense_perm`: the axis order a strided output is row-major in (PyTorch keeps an element-wise
  result of a transposed input in that order).
"""

from __future__ import annotations

import operator
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import Any

from stitchtune.importers.torch_candidates import GATHER_INDEX_ARG, _hint, is_scatter_base
from stitchtune.importers.torch_fx_util import _key, data_args, fx_args, zero_pad
from stitchtune.importers.torch_cnn import functional_of, is_inplace
from stitchtune.importers.torch_consts import resolved_index as _resolved
from stitchtune.importers.torch_symsizes import carrier_of, is_size_arg


def _embedded(x: Any, members: set[Any], consts: Mapping[Any, Any]) -> bool:
    """True for a constant that the region's module holds itself: a 0-d value (a scalar of the graph),
    indices resolved at import time (:func:`_resolved`) or the base of a ``slice_scatter`` (a ``full``
    that the walker turns into fills), never a graph input."""
    if x not in consts:
        return False
    if consts[x].dim() == 0 or _uniform_base(x, consts[x]):
        return True
    return all(_resolved(u, x, consts) or _key(u.target) == "aten.slice_scatter" and x is u.args[0]
               for u in x.users if u in members)


def _uniform_base(x: Any, t: Any) -> bool:
    """A constant of one value (a folded ``full``) read only as a ``scatter``'s base: a number of the
    graph (:func:`~stitchtune.importers.torch_candidates.is_scatter_base`)."""
    from torch._subclasses.fake_tensor import unset_fake_temporarily

    if not is_scatter_base(x) or t.numel() == 0 or not t.dtype.is_floating_point:
        return False
    with unset_fake_temporarily():
        return bool((t == t.reshape(-1)[0]).all())


def saved_pulled(nodes: Sequence[Any], pulled: set[Any]) -> list[Any]:
    """The ``pulled`` nodes (computed again by every region that reads them) that the graph also
    returns, in graph order: a training forward's rotary angles, saved for the backward."""
    return [n for n in nodes if n in pulled and any(u.op == "output" for u in n.users)]


def _with_pulled(group: list[Any], pulled: set[Any]) -> list[Any]:
    """``group`` and the ``pulled`` nodes it reads through chains of them, in graph order."""
    seen: set[Any] = set(group)
    todo = [a for n in group for a in data_args(n)]
    while todo:
        a = todo.pop()
        if a in pulled and a not in seen:
            seen.add(a)
            todo.extend(data_args(a))
    if len(seen) == len(group):
        return group
    order = {n: i for i, n in enumerate(next(iter(group)).graph.nodes)}
    return sorted(seen, key=order.__getitem__)


@dataclass(frozen=True)
class _Sub:
    """A group as a graph of its own (see :func:`_subgraph`); :attr:`module` makes it a GraphModule."""

    graph: Any                  # torch.fx.Graph: placeholders = ``inputs``, outputs = ``outputs``
    root: Any                   # torch.nn.Module holding the graph's buffers (its ``get_attr`` targets)
    inputs: list[Any]           # the original nodes it reads from outside
    outputs: list[Any]          # the group's nodes read outside it
    back: dict[Any, Any]        # node of ``graph`` -> the original node

    @cached_property
    def module(self) -> Any:
        """The GraphModule of ``graph`` (built on first use: a GraphModule generates and compiles its
        Python code, milliseconds that most groups, mapped and judged only through ``graph``, never need)."""
        import torch.fx

        return torch.fx.GraphModule(self.root, self.graph)


def _subgraph(group: list[Any], consts: Mapping[Any, Any], pulled: set[Any] | None = None) -> _Sub:
    """The group and the ``pulled`` nodes it reads as a GraphModule; constants of :func:`_embedded`
    are nodes of the module (``scalar_tensor`` or a buffer), not inputs. Outputs are nodes of
    ``group`` only."""
    import torch
    import torch.fx

    owned = set(group)
    group = _with_pulled(group, pulled or set())
    members = set(group)
    inputs: list[Any] = []
    held: list[Any] = []
    sizes: dict[Any, Any] = {}   # a SymInt read as a size -> its carrier, the region's input (torch_symsizes)
    for n in group:
        for a in fx_args(n):
            if a in sizes or a in members or a in inputs or a in held:
                continue
            if is_size_arg(n, a):
                sizes[a] = carrier_of(a)
                if sizes[a] not in inputs:
                    inputs.append(sizes[a])
            else:
                (held if _embedded(a, members, consts) else inputs).append(a)
    # indices that the region also computes (a pulled constant read as data too) are still resolved
    # at import time where they are indices: a buffer of the module beside the computed node
    indices = [a for n in group for a in fx_args(n) if a in members and _resolved(n, a, consts)]
    held += [a for a in dict.fromkeys(indices) if a not in held]
    g = torch.fx.Graph()
    root = torch.nn.Module()
    env: dict[Any, Any] = {}
    back: dict[Any, Any] = {}
    for x in inputs:
        ph = g.placeholder(f"in_{x.name}")
        ph.meta = dict(x.meta)
        env[x] = ph
        back[ph] = x
    for a, c in sizes.items():   # the size as the carrier's extent: data of no kernel, a dim of an input
        env[a] = g.call_function(torch.ops.aten.sym_size.int, (env[c], 0))
        env[a].meta = {"val": _hint(a.meta["val"])}
        back[env[a]] = a
    from torch._subclasses.fake_tensor import unset_fake_temporarily

    fixed: dict[Any, Any] = {}   # a held constant -> its node in the module
    for i, x in enumerate(held):
        t = consts[x]
        with unset_fake_temporarily():   # real constants, also inside a compile's fake mode
            if t.dim() == 0 or _uniform_base(x, t):
                fixed[x] = g.call_function(torch.ops.aten.scalar_tensor.default, (float(t.reshape(-1)[0].item()),),
                                           {"dtype": t.dtype})
            else:
                root.register_buffer(f"const{i}", t.clone())
                fixed[x] = g.get_attr(f"const{i}")
        fixed[x].meta = {"val": t, "folded": t}
        if x not in members:
            env[x] = fixed[x]
    for n in group:
        env[n] = g.node_copy(n, lambda a: fixed[a] if a in fixed and _resolved(n, a, consts) else env[a])
        if is_inplace(n):   # accepted by inplace_reason: its functional form, which mutates nothing
            env[n].target = functional_of(n.target)
        back[env[n]] = n
    outputs = [n for n in group if n in owned and any(u not in members for u in n.users)]
    g.output(tuple(env[o] for o in outputs))
    for n in g.nodes:   # symbolic shapes are mapped at their example values (re-mapped per shape later)
        if "val" in n.meta:
            n.meta["val"] = _concrete(n.meta["val"])
    return _Sub(g, root, inputs, outputs, back)


_RESHAPES = frozenset({"aten.view", "aten._unsafe_view", "aten.reshape"})


def viewed_inputs(sub: Any, group: Sequence[Any]) -> dict[str, tuple[tuple[int, ...], str]]:
    """In a region with a pick (``gather``): placeholder name -> (the static shape every reader of it
    reshapes it to, one of those readers) for the inputs read only through such reshapes (a language
    model's logits ``[B, S, V]`` viewed ``[B*S, V]``). The region declares the input at that shape
    (the region op reshapes the contiguous tensor: same bytes) because a pick cannot read through a
    reshape node; other regions keep the reshape node (and their workload keys)."""
    if not any(_key(n.target) in GATHER_INDEX_ARG for n in group if n.op == "call_function"):
        return {}
    out: dict[str, tuple[tuple[int, ...], str]] = {}
    for ph in (n for n in sub.graph.nodes if n.op == "placeholder"):
        val, users = ph.meta.get("val"), list(ph.users)
        if val is None or not val.shape or not all(type(d) is int for d in val.shape) or not users:
            continue
        shapes = {tuple(u.meta["val"].shape) for u in users if u.op == "call_function" and _key(u.target) in _RESHAPES
                  and u.meta.get("val") is not None}
        if len(shapes) != 1 or not all(u.op == "call_function" and _key(u.target) in _RESHAPES for u in users):
            continue
        shape = next(iter(shapes))
        chained = all(w.op == "output" or w.op == "call_function" and _key(w.target) in _RESHAPES
                      for u in users for w in u.users)
        if shape and all(type(d) is int for d in shape) and shape != tuple(val.shape) and not chained:
            out[ph.name] = (shape, users[0].name)   # (a chain of views: the walker sees its round trips)
    return out


def _concrete(val: Any) -> Any:
    """``val`` with every symbolic dim replaced by its hint (a meta tensor), tuples elementwise."""
    import torch

    if isinstance(val, (tuple, list)):
        return type(val)(_concrete(v) for v in val)
    if isinstance(val, torch.Tensor) and not all(isinstance(d, int) for d in val.shape):
        return torch.empty(tuple(_hint(d) or 1 for d in val.shape), dtype=val.dtype, device="meta")
    return val


#: ATen ops whose result is a view of their input in PyTorch (no copy)
_VIEW_OPS = frozenset({"aten.view", "aten._unsafe_view", "aten.unsqueeze", "aten.squeeze", "aten.expand",
                       "aten.expand_as", "aten.alias", "aten.view_as", "aten.transpose", "aten.permute",
                       "aten.t", "aten.slice", "aten.select", "aten.detach", "aten.flatten", "aten.reshape"})
#: the same set, public: ATen ops that make views (``scripts/decode_matrix.py`` does not count them left out)
VIEW_OPS = _VIEW_OPS


def _is_view(node: Any) -> bool:
    """True when ``node``'s result is a view of its input (left outside a region, PyTorch applies it
    to the region's contiguous output for free)."""
    key = _key(node.target) if node.target is not operator.getitem else ""
    if key in ("aten.reshape", "aten.flatten"):   # a view only of a contiguous input (else a copy)
        src = node.args[0].meta.get("val") if node.args and hasattr(node.args[0], "meta") else None
        return src is not None and src.is_contiguous()
    return key in _VIEW_OPS


def is_noop(node: Any) -> bool:
    """True for a view, eval dropout, a cast to the same dtype or a pad of nothing: the value of its
    input, unchanged."""
    if _is_view(node) or zero_pad(node):
        return True
    key = _key(node.target)
    if key in ("aten.dropout", "aten.feature_dropout"):
        return True
    if key in ("aten.to", "aten._to_copy", "aten.type_as", "aten.contiguous", "aten.clone"):
        src = node.args[0] if node.args else None
        sv, ov = getattr(src, "meta", {}).get("val"), node.meta.get("val")
        return sv is not None and ov is not None and getattr(sv, "dtype", None) == getattr(ov, "dtype", None)
    return False


def _dense_perm(val: Any) -> tuple[int, ...] | None:
    """The axis order in which the strided tensor ``val`` is row-major (``val.permute(perm)`` is
    contiguous), or None when it is not a permutation of a dense tensor. Symbolic sizes and strides
    are read at their hints (no guard is added): the order PyTorch's symbolic strides give at the
    traced sizes, which the backend's fake check compares symbolically afterwards."""
    if all(isinstance(d, int) for d in (*val.shape, *val.stride())):
        perm = tuple(sorted(range(val.dim()), key=lambda i: (-val.stride()[i], i)))
        return perm if val.permute(perm).is_contiguous() else None
    hinted = [_hint(d) for d in (*val.shape, *val.stride())]
    if any(h is None for h in hinted):
        return None
    shape, stride = [int(h or 0) for h in hinted[:val.dim()]], [int(h or 0) for h in hinted[val.dim():]]
    perm = tuple(sorted(range(val.dim()), key=lambda i: (-stride[i], i)))
    step = 1
    for i in reversed(perm):   # row-major in this order: each stride the product of the sizes after it
        if shape[i] != 1 and stride[i] != step:
            return None
        step *= shape[i]
    return perm


def view_root(node: Any, group: Any) -> Any | None:
    """The node outside ``group`` that ``node`` is a view of through a chain of views of ``group``
    (``node`` itself one of them: a slice of a region's input, Phi-3's ``gate`` of its fused
    ``gate_up`` output), or None. Such a node read outside the region is an alias: PyTorch's readers
    view the input again (no kernel, no new tensor), the region need not store it."""
    n = node
    while n in group and n.op == "call_function" and _is_view(n) and n.args and hasattr(n.args[0], "op"):
        n = n.args[0]
    return n if n is not node and n not in group else None
