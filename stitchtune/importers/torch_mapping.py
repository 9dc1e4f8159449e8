"""Mapping one candidate group of an ATen graph to a stitchtune graph (the region finder's step that
:mod:`stitchtune.importers.torch_regions` repeats per group): :func:`_map_group` returns the mapped
group (:class:`_Mapped`), the node to exclude (:class:`_Culprit`), the group declined whole
(:class:`Declined`) or None (dead code); its stored outputs, output checks and helpers."""

from __future__ import annotations

import logging
import operator
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from stitchtune.errors import StitchtuneError
from stitchtune.graph.parse import Graph
from stitchtune.importers.builder import GraphBuilder, ImportError_
from stitchtune.importers.torch_aten import (
    _Captured,
    _key,
    _strip1,
    _Walker,
    _where,
    index_dtype_name,
    row_vectors,
    value_dtype_name,
)
from stitchtune.importers.torch_candidates import _hint
from stitchtune.importers.torch_fx_util import _fits, fx_args, is_scalar64
from stitchtune.importers.torch_saved import may_share
from stitchtune.importers.torch_subgraph import (_dense_perm, _is_view, _Sub, _subgraph, _with_pulled, is_noop,
                                                view_root, viewed_inputs)
from stitchtune.importers.torch_windows import Window, declare_windowed, input_perms, input_windows, symbolic

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Declined:
    """Something not stitched: ``what`` is ``op aten.X`` (with ``count`` nodes) or ``region NAME (ops)``."""

    what: str
    reason: str
    count: int = 1


@dataclass(frozen=True)
class _Culprit:
    node: Any
    reason: str
    free: bool = False   # a view or no-op left to the framework (not reported as declined)
    unroll: bool = False   # a small sum to map again as adds of slices (not excluded)
    cut: tuple[Any, Any] | None = None   # an edge to leave out of every group instead (torch_cuts.chain_cut)
    more_cuts: tuple[tuple[Any, Any], ...] = ()   # edges cut together with ``cut`` (torch_cuts.edge_cuts)


def _inverse(perm: Sequence[int]) -> tuple[int, ...]:
    inv = [0] * len(perm)
    for i, p in enumerate(perm):
        inv[p] = i
    return tuple(inv)


# ---------------------------------------------------------------------------- mapping one group
@dataclass(frozen=True)
class _Mapped:
    """One group mapped to a stitchtune graph (what :class:`TorchRegion` is made from)."""

    graph: Graph
    inputs: tuple[Any, ...]      # fx nodes feeding graph.inputs, same order
    outputs: tuple[Any, ...]     # fx nodes of graph.outputs, same order
    sub: _Sub                    # the group's ATen ops (``sub.module``: as a GraphModule)
    perms: tuple[tuple[int, ...] | None, ...]   # see TorchRegion.output_perms
    aliases: tuple[tuple[Any, Any], ...]        # see TorchRegion.aliases
    pulled: frozenset[Any] = frozenset()        # the pulled nodes it was mapped with (see _settle)
    in_perms: tuple[tuple[int, ...] | None, ...] = ()   # see TorchRegion.input_perms
    in_windows: tuple[Window | None, ...] = ()          # see TorchRegion.input_windows


def _map_group(group: list[Any], name: str, consts: Mapping[Any, Any],
               pulled: set[Any] | None = None, unrolled: Iterable[Any] = (),
               permuted: bool = True) -> _Mapped | _Culprit | Declined | None:
    """One group mapped, or the node to exclude, or the whole group declined, or None when nothing
    outside the group reads it (dead code: no region); the ``unrolled`` sums as adds of slices.
    ``permuted``: inputs that PyTorch holds permuted are declared in their memory order
    (:func:`~stitchtune.importers.torch_windows.input_perms`); False: in PyTorch's axes."""
    part = _subgraph(group, consts, pulled)
    sub, inputs, outputs, back = part, part.inputs, part.outputs, part.back   # (``sub.graph``: the walk)
    full = _with_pulled(group, pulled or set())
    if not outputs:
        return None
    zero_d = _zero_d_culprit(inputs, full)
    if zero_d is not None:
        return zero_d
    b = GraphBuilder(name)
    placeholders = [n for n in sub.graph.nodes if n.op == "placeholder"]
    values, raw, in_perms, wins, viewed = _declare_inputs(b, sub, group, placeholders, consts, permuted)
    bindings = {ph.name: ("user", i) for i, ph in enumerate(placeholders)}
    bindings.update({n.name: ("folded", n.meta["folded"]) for n in sub.graph.nodes if n.op == "get_attr"})
    walker = _Walker(_Captured(sub, bindings, "fx"), b, values, lambda fqn, t: "float32")
    walker.viewed = frozenset(viewed)
    sums = set(unrolled)
    walker.unrolled = frozenset(s.name for s, n in back.items() if n in sums)
    try:
        outs = walker.run()
    except ImportError_ as exc:
        cur = walker.current
        if cur is not None and cur.op == "call_function":
            prefix = f"{cur.target} at {_where(cur)}: "
            msg = str(exc)
            return _Culprit(back[cur], msg[len(prefix):] if msg.startswith(prefix) else msg)
        outs = None
    perms = _check_outputs(walker, sub, outputs, outs,
                           {str(v.ref): x for vs in (values, raw) for v, x in zip(vs, inputs)}, set(full))
    if isinstance(perms, _Culprit):
        return perms
    out_node = next(n for n in sub.graph.nodes if n.op == "output")
    if outs is None:   # the walker refused an output shape that differs only in leading 1s
        outs = [walker.vals[s.name] for s in out_node.args[0]]
    aliases = tuple((o, p) for o, p in zip(outputs, perms) if p is not None and p is not _COPY
                    and not isinstance(p, tuple))
    kept = [i for i, p in enumerate(perms) if p is None or p is _COPY or isinstance(p, tuple)]
    try:
        outs = [_stored(walker, out_node.args[0][i], outs[i], perms[i]) for i in kept]
        graph = b.graph(outs)
    except (StitchtuneError, ImportError_) as exc:
        return Declined(f"region {name} ({_ops_text(group)})", str(exc))
    return _Mapped(graph, tuple(inputs), tuple(outputs[i] for i in kept), sub,
                   tuple(None if perms[i] is _COPY else perms[i] for i in kept), aliases,
                   frozenset(pulled or ()), tuple(in_perms), tuple(wins))


def _zero_d_culprit(inputs: list[Any], full: list[Any]) -> _Culprit | None:
    """The node to exclude where the region reads a 0-d tensor it cannot hold: a 0-d input (a loss's
    incoming gradient, a count) is a ``[1]`` tensor of the graph that broadcasts like PyTorch's 0-d one
    (graph.json tensors have rank >= 1), for the value, index and float64 scalar types only."""
    for x in inputs:
        val = x.meta["val"]
        if len(val.shape) == 0 and not (value_dtype_name(val.dtype) or index_dtype_name(val.dtype)
                                        or is_scalar64(val)):
            return _Culprit(next(n for n in full if x in fx_args(n)), f"reads the 0-d tensor {x.name!a}")
    return None


def _declare_inputs(b: GraphBuilder, sub: Any, group: list[Any], placeholders: list[Any],
                    consts: Mapping[Any, Any], permuted: bool) -> tuple[list[Any], list[Any], list[Any], list[Any],
                                                                          dict[str, Any]]:
    """Declare the region's inputs in ``b``, named by position (equal regions get equal workload keys):
    (the values the walk reads, the graph's inputs, each input's memory-order permutation or None, each
    input's window or None, the inputs read through views). A ``[B]`` input the region holds per row is
    declared ``[B, 1]``; a part of a larger tensor as that tensor (its window, read through a slice); a
    float64 scalar loaded rounded to float32; an input PyTorch holds permuted in its memory order, read
    through a transpose (``permuted``; False: in PyTorch's axes)."""
    inputs, outputs = sub.inputs, sub.outputs
    values: list[Any] = []
    rows = row_vectors(sub)   # [B] inputs the region holds as [B, 1] (one value per row)
    viewed = viewed_inputs(sub, group)
    in_perms = input_perms(inputs, outputs, consts, {ph.name for ph in placeholders if ph.name in rows or ph.name in viewed},
                           [ph.name for ph in placeholders]) if permuted else [None] * len(inputs)
    wins = input_windows(inputs, outputs, in_perms, {i for i, (x, ph) in enumerate(zip(inputs, placeholders))
                                                     if x in consts or ph.name in rows or ph.name in viewed}) \
        if permuted else [None] * len(inputs)   # (a part of a larger tensor is declared as that tensor)
    raw: list[Any] = []
    for i, x in enumerate(inputs):
        val = x.meta["val"]
        shape = tuple(_hint(d) or 1 for d in val.shape) + ((1,) if placeholders[i].name in rows or not val.shape else ())
        if placeholders[i].name in viewed:
            shape, rows_view = viewed[placeholders[i].name]
            shape += (1,) if rows_view in rows else ()
        p = in_perms[i]
        w = wins[i]
        if w is not None:   # (read through a slice of the window: the region op passes the window itself)
            w_raw, w_val = declare_windowed(b, f"in{i}", w, shape, value_dtype_name(val.dtype) or "?")
            raw.append(w_raw)
            values.append(w_val)
            continue
        if is_scalar64(val):   # a framework's float64 scalar: loaded rounded to float32 (torch_fx_util._meta)
            raw.append(b.add_input(f"in{i}", shape, "float64"))
            values.append(b.cast(raw[-1], "float32", f"in{i}_f32"))
            continue
        raw.append(b.add_input(f"in{i}", shape if p is None else tuple(shape[a] for a in p),
                               value_dtype_name(val.dtype) or index_dtype_name(val.dtype) or "?"))
        # (an input PyTorch holds permuted is declared in its memory order and read through a transpose)
        values.append(raw[-1] if p is None else b.transpose(raw[-1], _inverse(p), f"in{i}_read"))
    return values, raw, in_perms, wins, viewed


#: an output that is PyTorch's copy (``clone``) of another output: the region stores the value twice
_COPY = object()


def _stored(walker: Any, s: Any, v: Any, perm: Any) -> Any:
    """Output value ``v`` of sub node ``s`` as the region stores it: itself, or (``perm``: PyTorch
    keeps it in permuted memory order) its exact value transposed by ``perm``, a row-major tensor
    that ``permute(inverse(perm))`` turns into PyTorch's strided one for free, or (``_COPY``) a
    second tensor of the same value (a same-shape ``reshape``: the kernel stores it twice)."""
    if perm is _COPY:
        return walker.b.layout("reshape", [v], v.shape, str(v.dtype), f"{s.name}_copy", shape=list(v.shape))
    if perm is None:
        t = tuple(int(d) for d in s.meta["val"].shape)
        if _strip1(v.shape) == _strip1(t) or s.name in walker.rows and tuple(v.shape) == (*t, 1):
            return v   # (a [B] value held per row as [B, 1]: the same bytes)
        return walker.exact(s, s)   # a materialised broadcast
    x = walker.exact(s, s)
    shape = tuple(x.shape[p] for p in perm)
    return walker.b.layout("transpose", [x], shape, str(x.dtype), f"{s.name}_stored", perm=list(perm))


def _check_outputs(walker: Any, sub: Any, outputs: list[Any], outs: list[Any] | None,
                   input_names: Mapping[str, Any], group: set[Any]) -> _Culprit | list[Any]:
    """The first output the graph cannot return as PyTorch does (shape, a duplicate, an input), or
    for each output the axis order PyTorch stores it in when that is not row-major (else None), or
    the fx node (an input or earlier output) that a no-op output equals or that a view output is a
    view of (:func:`_viewed_output`: never stored twice). A view or no-op output that no node of
    ``group`` reads is left to the framework (``free``)."""
    def inner(n: Any) -> bool:
        return any(u in group for u in n.users)

    out_node = next(n for n in sub.graph.nodes if n.op == "output")
    seen: dict[str, Any] = {}
    perms: list[Any] = []
    stored: set[Any] = set()   # the outputs stored as PyTorch's value (their views are aliases)
    for orig, s in zip(outputs, out_node.args[0]):
        if _is_view(orig) and not inner(orig):   # the region returns its base; PyTorch views it for free
            return _Culprit(orig, "a view at the region's boundary", free=True)
        root = view_root(orig, group)
        if root is not None and root in input_names.values():   # a view of an input read inside too:
            perms.append(root)                                  # an alias (PyTorch views the input again)
            continue
        base = _viewed_output(orig, group, stored)
        if base is not None:   # a view of another stored output, read inside too: an alias (PyTorch views
            perms.append(base)   # that output again, as eager does), not a second store of its values
            continue
        v = walker.vals.get(s.name)
        src = walker._reshaped.get(str(getattr(v, "ref", "")))
        if _is_view(orig) and src is not None and str(src.ref) in input_names:   # (read inside too)
            return _Culprit(orig, "a view of an input at the region's boundary", free=True)
        t = tuple(int(d) for d in s.meta["val"].shape) if s.meta.get("val") is not None else None
        if v is None or not hasattr(v, "is_scalar") or v.is_scalar:
            return _Culprit(orig, "its value is not a tensor the graph computes")
        row = s.name in walker.rows and t is not None and tuple(v.shape) == (*t, 1)   # a [B] value held as [B, 1]
        if t is None or _strip1(v.shape) != _strip1(t) and not _materialised(orig, v.shape, t) and not row:
            return _Culprit(orig, f"an output of PyTorch shape {list(t or ())} is graph shape {list(v.shape)}")
        perm = None if s.meta["val"].is_contiguous() else _dense_perm(orig.meta["val"])
        if perm is None and symbolic(orig.meta["val"]):   # the concrete trace may tie where PyTorch's symbolic
            perm = _dense_perm(orig.meta["val"])           # strides do not (a rotary output at seq = head dim)
            perm = None if perm == tuple(range(len(perm or ()))) else perm
        if perm is None and not s.meta["val"].is_contiguous() or _is_view(orig) and perm is not None \
                and not (inner(orig) and all(u.op != "output" for u in orig.users)):
            # (a permuted view also read inside the region, and not returned by the graph, is stored
            # in its memory order like any permuted output: ConvNeXt's NHWC gradient viewed as NCHW)
            return _Culprit(orig, "a non-contiguous output (stitched kernels write row-major tensors)",
                            free=_is_view(orig) and not inner(orig))
        perms.append(perm)
        stored.add(orig)
        if _strip1(v.shape) != _strip1(t):   # a materialised broadcast: a new tensor (its own expand node)
            continue
        same, same_perm = seen.get(str(v.ref), (input_names.get(str(v.ref)), None))
        if same is not None and str(v.ref) in seen and perm is None and same_perm is None \
                and _key(orig.target) in ("aten.clone", "aten.contiguous"):
            if orig.args and orig.args[0] is same and may_share(orig, same):
                # a copy of that very output, which may share its tensor (importers.torch_saved: e.g. both
                # only saved for the backward): left out, the backend's rewrite makes its readers read it
                return _Culprit(orig, "a copy of another output that may share its tensor", free=True)
            perms[-1] = _COPY   # PyTorch's copy of another output (attention dropout at p = 0 in training)
            continue            # that a user may write to: stored again by the region, not by a copy kernel
        if same is not None:   # a no-op (eval dropout, same-dtype cast) of an input or another output
            if is_noop(orig) and not inner(orig):
                return _Culprit(orig, "a no-op output", free=True)
            if not is_noop(orig) or perm != same_perm:   # an alias must have the same strides
                why = "passes an input through" if str(v.ref) in input_names else "equal to another output"
                return _Culprit(orig, f"an output that {why}")
            perms[-1] = same   # read inside the region too: PyTorch's node is an alias of ``same``
            continue
        seen[str(v.ref)] = (orig, perm)
    if outs is None and walker.current is not None and walker.current.op != "output":
        return _Culprit(outputs[0], "the region's outputs could not be mapped")
    if all(walker.vals[s.name].dtype == "bool" for s in out_node.args[0]):
        # a mask and nothing else: Inductor computes it inside the kernel that reads it (no launch)
        return _Culprit(outputs[-1], "a region of bool outputs only (a mask Inductor fuses into its reader)")
    return perms


def _viewed_output(node: Any, group: set[Any], stored: set[Any]) -> Any | None:
    """The output in ``stored`` that ``node`` is a view of through a chain of views of ``group``
    (``node`` itself one of them: BERT's and GPT-2's input gradient ``mul_23`` and its ``view_51`` that
    the weight gradient's matmul reads), or None. The region returns that output only; the backend
    applies the chain to it (:func:`stitchtune.deploy.torch_rewrite.replace_regions`), so the view has
    eager's shape, strides and storage (issue 39: no region writes the same values twice)."""
    n = node
    while n in group and n.op == "call_function" and _is_view(n) and n.args and hasattr(n.args[0], "op"):
        n = n.args[0]
    return n if n is not node and n in stored else None


def _materialised(orig: Any, shape: Sequence[int], t: Sequence[int]) -> bool:
    """Whether output ``orig`` is a copy (``clone`` / ``contiguous``) of a broadcast value of graph
    ``shape`` that PyTorch holds at ``t`` (Llama's ``repeat_kv``: ``expand`` then ``clone``): the region
    stores it expanded (:func:`_stored`), reading the source once per copy."""
    return _key(orig.target) in ("aten.clone", "aten.contiguous") and _fits(shape, t) and not _is_view(orig)


def _ops_text(nodes: Iterable[Any]) -> str:
    ops = [_key(n.target).removeprefix("aten.") for n in nodes if n.target is not operator.getitem]
    return ", ".join(ops[:8]) + (f", ... ({len(ops)} ops)" if len(ops) > 8 else "")


def _computes(graph: Any) -> bool:
    return any(n.op not in ("cast", "reshape") for n in graph.nodes)


# ---------------------------------------------------------------------------- entry point
