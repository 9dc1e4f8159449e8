"""A linear layer's bias added by the region that reads its output, not by the matmul (the torch backend's pre-pass).

``nn.Linear`` (and GPT-2's ``Conv1D``) reaches the backend's ATen graph as ``addmm(bias, x, w)``: the
library call adds the bias in its epilogue. cuBLAS picks another, slower kernel for that epilogue than for
the plain product: on the H200 (results/h200-2026-12-04-models, fp32, batch 8 x 512) BERT's FFN output
projection ``[4096, 3072] x [3072, 768]`` ran 497-499 us as ``addmm`` (eager and the backend's step:
``sm80_xmma_gemm ... tilesize64``) and 412.6-412.7 us as Inductor's ``mm`` (``tilesize128``), its
intermediate projection 398-401 us against 388 us. Inductor's post-grad pass
``unfuse_bias_add_to_pointwise`` therefore turns an ``addmm`` whose readers are all element-wise into
``mm`` + ``add`` and fuses the add into its reader's kernel (its head-split copies and layer norms read the
bias). The backend hands the rest of a graph to Inductor after its regions are cut out, where a region's
``stitchtune::region`` call is no element-wise reader, so the ``addmm`` stayed. :func:`unfused_bias_adds`
makes the same rewrite before the region finder runs, so the region that reads the product adds the bias
(a 1-D read of N elements beside the M x N product: no measurable bytes)::

    addmm(bias, x, w)  ->  add(mm(x, w), bias)

Contract: an ``addmm`` is rewritten when ``alpha`` and ``beta`` are 1, its bias has one element per output
column (shape ``[N]`` or ``[1, N]``), its dtype is float32 or float64 (as Inductor, half dtypes keep the
epilogue, which adds in float32 before rounding once), and every reader is element-wise (an op tagged
``pointwise``), following views (a view's readers must be element-wise too): a product that the graph
returns, or that another matmul or a reduction reads, keeps its ``addmm``. The values are the same up to
the rounding of one float add (``mm`` then ``add`` instead of the fused epilogue); every new node's
``meta["val"]`` is PyTorch's fake value of it, and the ``add`` carries the ``addmm``'s name in
``meta[BIAS_OF]``. A product read only by slices along its last axis (directly or through reshapes that keep
that extent: GPT-2's fused q / k / v projection cut into q, k and v, :func:`column_slices`) gets one ``add``
per slice instead, after it, of the bias's own slice with the same bounds (``add(slice(view(mm)),
slice(bias))``, the same float add per element): the planner refuses a slice of a computed tensor wider than
its region's domain, so one add before the slices would be a region of its own; after them it joins the head
split that reads each slice. ``keep``: names of ``addmm`` nodes left as they are. The caller keeps an ``addmm`` whose
add would be a region of its own (a reader cut off by a view with a symbolic size, or declined): that
region would be one more launch over the whole product (:func:`lonely_bias_adds`,
:func:`stitchtune.deploy.torch_prepare.prepared_regions`).
"""

from __future__ import annotations

from collections.abc import Collection
from typing import Any

from stitchtune.importers.torch_fx_util import graph_copy, op_key
from stitchtune.importers.torch_mm_views import _node

__all__ = ["BIAS_OF", "column_slices", "lonely_bias_adds", "unfused_bias_adds"]

#: fx node meta key on the ``add`` made from an ``addmm``: that ``addmm`` node's name
BIAS_OF = "stitchtune_bias_of"

#: reshapes of a product that :func:`column_slices` follows (they keep the last extent)
_RESHAPES = ("aten.view", "aten._unsafe_view", "aten.reshape")

#: ops that only look at their input's storage differently (their readers are followed)
_VIEWS = ("aten.view", "aten._unsafe_view", "aten.reshape", "aten.permute", "aten.transpose", "aten.t",
          "aten.expand", "aten.unsqueeze", "aten.squeeze", "aten.slice", "aten.select", "aten.narrow",
          "aten.split", "aten.split_with_sizes", "aten.unbind", "aten.chunk")


def _pointwise_use(user: Any) -> bool:
    """Whether fx node ``user`` is element-wise, a view whose readers all are, or a tuple item of one."""
    import operator

    import torch

    if user.op != "call_function":
        return False
    if user.target is operator.getitem or op_key(user.target) in _VIEWS:
        return bool(user.users) and all(_pointwise_use(u) for u in user.users)
    return torch.Tag.pointwise in getattr(user.target, "tags", ())


def _candidate(n: Any) -> bool:
    """Whether ``n`` is an ``addmm`` the module docstring's contract rewrites."""
    import torch

    if n.op != "call_function" or n.target is not torch.ops.aten.addmm.default:
        return False
    if n.kwargs.get("alpha", 1) != 1 or n.kwargs.get("beta", 1) != 1:
        return False
    bias, out = n.args[0], n.meta.get("val")
    b = getattr(bias, "meta", {}).get("val")
    if not isinstance(out, torch.Tensor) or not isinstance(b, torch.Tensor) or out.dim() != 2:
        return False
    if out.dtype not in (torch.float32, torch.float64) or b.dtype != out.dtype:
        return False
    if tuple(b.shape) not in ((out.shape[1],), (1, out.shape[1])):
        return False
    return bool(n.users) and all(_pointwise_use(u) for u in n.users)


def unfused_bias_adds(gm: Any, keep: Collection[str] = ()) -> Any | None:
    """A copy of ``gm`` with every ``addmm`` of the module docstring's contract, except those named in
    ``keep``, made ``mm`` + ``add``, or None when there is none. ``gm`` itself is left as it was."""
    import torch

    def chosen(n: Any) -> bool:
        return n.name not in keep and _candidate(n)

    try:
        if not any(chosen(n) for n in gm.graph.nodes):
            return None
    except (KeyError, AttributeError, TypeError):   # a node without PyTorch's fake value: nothing to do
        return None
    graph = graph_copy(gm)
    aten = torch.ops.aten
    for n in [n for n in graph.nodes if chosen(n)]:
        bias, x, w = n.args[:3]
        with graph.inserting_before(n):
            mm = _node(graph, aten.mm.default, x, w)
        slices = column_slices(n)
        if slices:
            _add_after_slices(graph, n, mm, bias, slices)
            continue
        with graph.inserting_before(n):
            add = _node(graph, aten.add.Tensor, mm, bias)
        add.meta[BIAS_OF] = n.name
        n.replace_all_uses_with(add)
        graph.erase_node(n)
    return torch.fx.GraphModule(gm, graph)


def column_slices(n: Any) -> list[Any]:
    """The ``aten.slice`` nodes along the last axis that read ``n``'s ``[M, N]`` product, directly or
    through reshapes that keep its last extent ``N``, when they and those reshapes are all its readers
    (GPT-2's fused q / k / v projection ``[B*S, 3H]`` viewed ``[B, S, 3H]`` and cut into q, k and v);
    [] otherwise, and [] where a slice has fewer dimensions than the bias (a ``[1, N]`` bias of a one-row
    product viewed ``[N]``: the add after the slice would broadcast it to ``[1, k]``, not the slice's shape)."""
    width = n.meta["val"].shape[-1]
    bias_dims = n.args[0].meta["val"].dim()
    found: list[Any] = []
    stack = list(n.users)
    while stack:
        u = stack.pop()
        val = u.meta.get("val") if u.op == "call_function" else None
        if val is None or not val.dim():
            return []
        key = op_key(u.target)
        if key == "aten.slice" and len(u.args) > 1 and u.args[1] in (-1, val.dim() - 1):
            if val.dim() < bias_dims:
                return []
            found.append(u)
        elif key in _RESHAPES and val.shape[-1] == width and u.users:
            stack += list(u.users)
        else:
            return []
    return found


def _add_after_slices(graph: Any, n: Any, mm: Any, bias: Any, slices: list[Any]) -> None:
    """Replace ``addmm`` node ``n`` of ``graph`` by ``mm`` under its reshapes and slices (:func:`column_slices`),
    and add each slice's part of ``bias`` (its own ``aten.slice``, the same bounds along the bias's last
    axis) after the slice: ``slice(view(addmm(b, x, w)))`` -> ``add(slice(view(mm(x, w))), slice(b))``, the
    same float add per element. The region finder then stitches each add with what reads the slice (a head
    split), where the planner refuses a slice of a computed tensor wider than the iteration domain."""
    import torch

    aten = torch.ops.aten
    for sl in slices:
        _, _, *bounds = sl.args
        with graph.inserting_after(sl):
            part = _node(graph, aten.slice.Tensor, bias, bias.meta["val"].dim() - 1, *bounds, **sl.kwargs)
        with graph.inserting_after(part):
            add = _node(graph, aten.add.Tensor, sl, part)
        add.meta[BIAS_OF] = n.name
        sl.replace_all_uses_with(add, delete_user_cb=lambda user: user is not add)
    n.replace_all_uses_with(mm)
    graph.erase_node(n)


def lonely_bias_adds(gm: Any, regions: Collection[Any]) -> frozenset[str]:
    """The ``addmm`` names (``meta[BIAS_OF]``) of ``gm``'s bias adds that share no region of ``regions``
    (:class:`~stitchtune.importers.torch_regions.TorchRegion`) with another computing op: in none, or in
    one of bias adds and views only (a launch the ``addmm``'s epilogue saves)."""
    found: set[str] = set()
    for n in gm.graph.nodes:
        if BIAS_OF not in n.meta:
            continue
        mine = next((r for r in regions if n in r.nodes), None)
        if mine is None or all(BIAS_OF in m.meta or op_key(m.target) in _VIEWS for m in mine.nodes):
            found.add(n.meta[BIAS_OF])
    return frozenset(found)
