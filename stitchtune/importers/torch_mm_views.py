"""Transposed matmul operands handed over as views, not materialised (the torch backend's pre-pass).

``torch.matmul(q, k.transpose(-1, -2))`` on 4-D attention tensors reaches the backend's ATen graph as
``bmm(_unsafe_view(clone(expand(transpose(k4, 2, 3)))), ...)``: the ``clone`` copies ``k`` with its last
two dims swapped (BERT's "K transposed copy": each lane's store 4 useful bytes of a 32-byte sector),
only because the batch dims ``[B, H]`` of the transposed head split cannot be merged by a view. Yet
``bmm`` reads a transposed operand for free (cuBLAS's transposed op: either of its last two strides
may be 1), which is how Inductor's ``mm`` reads it too. :func:`matmul_views` rewrites each such chain
to copy ``k4`` in its own axis order (a coalesced copy, the same kind as the ``q`` and ``v`` head splits)
and transpose the merged result as a view::

    bmm(..., view(clone(expand(transpose(x, -2, -1)))))  ->  bmm(..., transpose(view(clone(expand(x))), -2, -1))

Contract: a chain is rewritten only when every link has the matmul as its only reader (the ``clone``
and the optional ``view`` / ``_unsafe_view`` / ``reshape``; the ``expand`` and the transpose may have
other readers, which keep them), the transpose (``transpose`` / ``permute`` / ``t``) swaps exactly the
last two dims, and an optional ``view`` keeps the last two dims (it merges batch dims only). The
values are the same tensors (the matmul's operand has the same shape and values; its strides are
those of a transposed view); every new node's ``meta["val"]`` is PyTorch's fake value of it.
"""

from __future__ import annotations

from typing import Any

from stitchtune.importers.torch_fx_util import graph_copy, op_key

__all__ = ["matmul_views"]

_MATMULS = ("aten.mm", "aten.bmm")
_VIEWS = ("aten.view", "aten._unsafe_view", "aten.reshape")
_CLONES = ("aten.clone", "aten.contiguous")


def _only_user(n: Any, user: Any) -> bool:
    return len(n.users) == 1 and user in n.users


def _last_two_swapped(x: Any) -> Any | None:
    """The source of ``x`` when ``x`` transposes exactly the last two dims of it, else None."""
    if getattr(x, "op", "") != "call_function":
        return None
    key, rank = op_key(x.target), len(x.meta["val"].shape)
    if key == "aten.t" and rank == 2:
        return x.args[0]
    if key == "aten.transpose" and rank >= 2:
        dims = sorted(d % rank for d in x.args[1:3])
        return x.args[0] if dims == [rank - 2, rank - 1] else None
    if key == "aten.permute" and rank >= 2:
        perm = [d % rank for d in x.args[1]]
        return x.args[0] if perm == [*range(rank - 2), rank - 1, rank - 2] else None
    return None


def _chain(operand: Any, mm: Any) -> tuple[Any, Any, Any | None, Any] | None:
    """(view or None, clone, expand or None, transpose's source) of a matmul operand of the form
    ``[view](clone([expand](transpose_last_two(src))))``, each link read by the next only."""
    view: Any | None = None
    node = operand
    if op_key(node.target) in _VIEWS and node.op == "call_function":
        shape = tuple(node.meta["val"].shape)
        before = tuple(node.args[0].meta["val"].shape)
        if shape[-2:] != before[-2:] or not _only_user(node, mm):
            return None
        view, node = node, node.args[0]
    if node.op != "call_function" or op_key(node.target) not in _CLONES:
        return None
    if not _only_user(node, view if view is not None else mm):
        return None
    clone, node = node, node.args[0]
    expand: Any | None = None
    if node.op == "call_function" and op_key(node.target) == "aten.expand":
        expand, node = node, node.args[0]
    src = _last_two_swapped(node)
    return None if src is None else (view, clone, expand, src)


def _swap_last(seq: Any) -> list[Any]:
    s = list(seq)
    s[-2], s[-1] = s[-1], s[-2]
    return s


def _fake(target: Any, *args: Any, **kwargs: Any) -> Any:
    """PyTorch's fake value of ``target(*args)`` over the nodes' fake values."""
    import torch.fx

    vals = torch.fx.node.map_arg((args, kwargs), lambda a: a.meta["val"])
    with _mode_of(vals):
        return target(*vals[0], **vals[1])


def _mode_of(vals: Any) -> Any:
    """The fake mode of the first fake tensor in ``vals`` (nested tuples / lists)."""
    stack = [vals]
    while stack:
        v = stack.pop()
        if isinstance(v, (tuple, list)):
            stack.extend(v)
        elif hasattr(v, "fake_mode"):
            return v.fake_mode
    raise ValueError("no fake tensor among the arguments")


def _node(graph: Any, target: Any, *args: Any, **kwargs: Any) -> Any:
    n = graph.call_function(target, args, kwargs)
    n.meta["val"] = _fake(target, *args, **kwargs)
    return n


def matmul_views(gm: Any) -> Any | None:
    """A copy of ``gm`` with every transposed matmul operand chain rewritten (module docstring), or
    None when ``gm`` has none. ``gm`` itself is left as it was."""
    import torch
    import torch.fx

    Chain = tuple[Any, Any, tuple[Any, Any, Any | None, Any]]

    def chains(g: Any) -> list[Chain]:
        out: list[Chain] = []
        for mm in g.nodes:
            if mm.op != "call_function" or op_key(mm.target) not in _MATMULS:
                continue
            for operand in mm.args[:2]:
                found = _chain(operand, mm) if isinstance(operand, torch.fx.Node) else None
                if found is not None and all(x is not operand for _, x, _ in out):
                    out.append((mm, operand, found))
        return out

    try:
        if not chains(gm.graph):
            return None
    except (KeyError, AttributeError, TypeError):   # a node without PyTorch's fake value: nothing to do
        return None
    graph = graph_copy(gm)
    aten = torch.ops.aten
    for mm, operand, (view, clone, expand, src) in chains(graph):
        with graph.inserting_before(mm):
            x = src
            if expand is not None:
                x = _node(graph, aten.expand.default, x, _swap_last(expand.args[1]))
            x = _node(graph, aten.clone.default, x, memory_format=torch.contiguous_format)
            if view is not None:
                x = _node(graph, aten._unsafe_view.default, x, _swap_last(view.meta["val"].shape))
            rank = len(x.meta["val"].shape)
            x = _node(graph, aten.transpose.int, x, rank - 2, rank - 1)
        mm.replace_input_with(operand, x)
    graph.eliminate_dead_code()
    return torch.fx.GraphModule(gm, graph)
