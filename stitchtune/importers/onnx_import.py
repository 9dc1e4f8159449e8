"""ONNX -> graph.json: the maximal memory-intensive subgraphs of a model, one graph.json each.

Contract
--------
* :func:`import_onnx(model, node_range=None, shapes=None)` loads the model with the ``onnx`` package,
  applies ``shapes`` (``{graph input name: shape}`` or ``{dim_param: (size,)}``) to the graph
  inputs, folds constants and runs ONNX shape inference, and returns an :class:`OnnxImport`.
* A node is *mappable* if its op is in :data:`SUPPORTED_OPS` (or is a layout op graph.json has:
  Transpose, Reshape/Flatten/Squeeze/Unsqueeze, Slice, Concat, Split onto one ``slice`` per output,
  Gather by an int index, Expand once graph.json has ``expand``; or a view, below), it lies in
  ``node_range`` (python slice over node indices), its tensors are float32/float16/bfloat16 or bool
  of rank 1..``MAX_RANK``, bools only where graph.json takes them (logical ops, ``Where``'s
  condition, ``Cast``, ``Equal`` of two bools; bool operands are tensors, never constants), int32 /
  int64 tensors only where graph.json takes them (``Cast``'s input and result -- an attention mask
  cast to bool or a float, a position cast to int --, the int ops Add/Sub/Mul/Neg/Abs/Max/Min, the
  comparisons and Where's branches with *all* numeric operands int and integer constants, the data
  of the layout ops, Gather's index; an int value may leave a subgraph), and its attribute-like inputs
  (reduction axes, shapes, slice bounds, split sizes) are constants. Every other node (MatMul, Gemm,
  Conv, integer division, ...) is a boundary; the rules are :func:`~stitchtune.importers.onnx_rules._why_not`.
  The mask chain maps as Equal/Less/LessOrEqual/Greater/GreaterOrEqual -> ``eq lt le gt ge``,
  Not/And/Or -> ``logical_not/and/or``, Where -> ``where``, Clip -> ``clamp`` (a missing bound is
  -inf / +inf). A ``Range`` of constants is folded into a constant (an int input of the region).
* *Views*: a layout node whose other inputs are constants and whose output is its chain's first
  tensor broadcast numpy-style (Expand, Reshape/Unsqueeze/Flatten/Gather chains that only move unit
  axes; see :mod:`~stitchtune.importers.onnx_layout`), of a float, bool or int tensor, maps to
  nothing: its readers read that tensor and broadcasting does the rest (a Reshape of the token ids
  before their Gather reads the ids themselves; one that changes their shape is a boundary, since
  graph.json gathers by graph inputs). A view that a non-element-wise op (reduction, softmax, norm)
  needs materialised becomes an ``expand`` node once graph.json has it; one whose value would leave
  a subgraph is a boundary (it is found while building and the partition is redone without it). A
  Reshape that keeps the element order is a *reshaped frame*: element-wise nodes whose tensor
  operands are all in the same frame compute in it, and a value leaves in it (the same bytes); an
  element-wise node that reads it next to other shapes, or any other op, reads it through a
  ``reshape`` node.
* Subgraphs are the maximal connected groups of mappable nodes (joined by tensors) that can run as
  one fused unit. A group that some path leaves and re-enters through a boundary node (a residual
  around a MatMul) is split by *stage*: every path through a boundary moves to a later stage, a
  part never spans stages, so each part is convex and its inputs exist before it starts. Views and
  element-wise nodes that read only model inputs and constants (the attention mask chain) join no
  group by themselves: every group that reads them recomputes them, so one mask feeds every layer.
* Subgraph inputs are the tensors it reads but does not produce; single-element constants are
  inlined as scalars, other constants (weights, bool tables) become inputs with their values in
  ``OnnxSubgraph.constants`` (a one-element constant read by a layout op is an input too).
  Outputs are the tensors its own (not recomputed) nodes produce that are read outside it or are
  model outputs (float, bool or int tensors). Every output has exactly
  the shape of the ONNX tensor it names: a value computed in another shape with the same elements
  in the same order (a reshaped frame, a Reshape on the way out of the region) is stored through a
  ``reshape`` node (an index map: no extra pass), so a subgraph substitutes mechanically. Names are
  sanitised to ``[A-Za-z_][A-Za-z0-9_]{0,63}``; ``tensor_names`` maps them back to ONNX names.
* A dynamic dimension on a tensor of a mappable node is an error naming the tensor, the dimension
  and its symbol, unless ``shapes`` fixes it.
* The file is read by :mod:`~stitchtune.importers.onnx_load` (hostile files are refused with one
  line) and, after ``shapes``, constant-only nodes are folded and shapes inferred by
  :mod:`~stitchtune.importers.onnx_fold`, so legacy (TorchScript) exports with static inputs come
  out static. Node indices are always those of the file.
* A Reshape/Squeeze/Unsqueeze/Flatten/Expand whose output shape equals its input's is a no-op and
  mappable. A group whose outputs are all passed through unchanged (only Identity, same-type Cast,
  no-op reshapes) is dropped, never fatal, and listed in ``OnnxImport.dropped``.
* *Regions* are the connected groups of memory-intensive nodes (every op but Constant and
  :data:`COMPUTE_OPS`; cheap nodes that read only model inputs, and views, count in every region
  that reads them); each :class:`OnnxRegion` says whether it was imported whole, cut (and by
  which nodes), dropped as a no-op, or skipped.
* The result types and their writing / summary (:func:`write_subgraphs`, :func:`summary_lines`)
  are :mod:`~stitchtune.importers.onnx_result`'s, re-exported here.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from stitchtune.graph.ops import OPS
from stitchtune.graph.parse import broadcast_shapes
from stitchtune.importers.builder import (
    GraphBuilder,
    ImportError_,
    Value,
    scalar,
)
from stitchtune.importers.onnx_fold import fold_and_infer
from stitchtune.importers.onnx_layout import View, resolve_views
from stitchtune.importers.onnx_load import load_model
from stitchtune.importers.onnx_map import _map_node
from stitchtune.importers.onnx_ops_layout import INT_DTYPES, layout_op
from stitchtune.importers.onnx_partition import COMPUTE_OPS, OnnxRegion, label, partition
from stitchtune.importers.onnx_partition import regions as find_regions
from stitchtune.importers.onnx_result import OnnxImport, OnnxSubgraph, summary_lines, write_subgraphs
from stitchtune.importers.onnx_rules import (
    _CHEAP,
    _ELEMENTWISE,
    _ONNX_ALL,
    SUPPORTED_OPS,
    _Ctx,
    _Demote,
    _elem_name,
    _static_shape,
    _type_table,
    _why_not,
)

__all__ = [
    "COMPUTE_OPS",
    "SUPPORTED_OPS",
    "OnnxImport",
    "OnnxRegion",
    "OnnxSubgraph",
    "import_onnx",
    "parse_node_range",
    "summary_lines",
    "write_subgraphs",
]

log = logging.getLogger(__name__)



def parse_node_range(text: str | None) -> tuple[int | None, int | None] | None:
    """``"A:B"`` (either side may be empty) -> (A, B); a python slice over node indices."""
    if not text:
        return None
    a, colon, b = text.partition(":")
    try:
        if not colon:
            raise ValueError
        return (int(a) if a.strip() else None, int(b) if b.strip() else None)
    except ValueError:
        raise ImportError_(f"--node-range {text!a} is not A:B with integer node indices") from None


# ---------------------------------------------------------------------------- shapes
def _apply_shapes(model: Any, shapes: Mapping[str, tuple[int, ...]]) -> Any:
    """A copy of ``model`` with graph-input dims fixed by name or by dim_param symbol."""
    import onnx

    m = onnx.ModelProto()
    m.CopyFrom(model)
    inits = {t.name for t in m.graph.initializer}
    inputs = {i.name: i for i in m.graph.input if i.name not in inits}
    symbols: set[str] = set()
    for i in inputs.values():
        for d in i.type.tensor_type.shape.dim:
            if d.HasField("dim_param"):
                symbols.add(d.dim_param)
    problems: list[str] = []
    for name, shape in shapes.items():
        if name in inputs:
            dims = inputs[name].type.tensor_type.shape.dim
            if len(dims) != len(shape):
                problems.append(f"--shapes: {name!a} has rank {len(dims)} in the model, not {len(shape)}")
                continue
            for d, v in zip(dims, shape):
                if d.HasField("dim_value") and d.dim_value not in (0, v):
                    problems.append(f"--shapes: {name!a} dim {list(dims).index(d)} is {d.dim_value} in the model")
                d.dim_value = v
        elif name in symbols:
            if len(shape) != 1:
                problems.append(f"--shapes: dimension symbol {name!a} takes one size, e.g. {name}=8")
                continue
            for i in inputs.values():
                for d in i.type.tensor_type.shape.dim:
                    if d.HasField("dim_param") and d.dim_param == name:
                        d.dim_value = shape[0]
        else:
            problems.append(f"--shapes: {name!a} is neither a model input ({', '.join(inputs) or 'none'}) "
                            f"nor a dimension symbol ({', '.join(sorted(symbols)) or 'none'})")
    if problems:
        raise ImportError_(problems=problems)
    return m


# ---------------------------------------------------------------------------- partition + build
def import_onnx(model: Any, node_range: tuple[int | None, int | None] | None = None,
                shapes: Mapping[str, tuple[int, ...]] | None = None, name: str | None = None) -> OnnxImport:
    """Split ``model`` (path or ``ModelProto``) into memory-intensive subgraphs; see the module docstring."""
    loaded = load_model(model)   # raises ImportError_ if the onnx package is missing or the file is bad
    m = loaded.model
    if shapes:
        m = _apply_shapes(m, shapes)
    m, fold = fold_and_infer(m, loaded.consts)
    from_file = loaded.base_dir is not None
    base = name or m.graph.name or (Path(str(model)).stem if from_file else "onnx")
    ctx = _Ctx(m, _type_table(m), loaded.consts)
    nodes = list(m.graph.node)
    ctx.producer = {t: i for i, n in enumerate(nodes) for t in n.output if t}
    ctx.views = _mappable_views(ctx, nodes)
    lo, hi = node_range or (None, None)
    in_range = set(range(len(nodes))[slice(lo, hi)])
    model_inputs = {i.name for i in m.graph.input} - set(ctx.consts)
    model_outputs = {o.name for o in m.graph.output}
    # cheap nodes computed from model inputs and constants only (mapped or not): the mask chain
    pre = _preamble(ctx, nodes, set(range(len(nodes))), model_inputs, lambda i: nodes[i].op_type in _CHEAP)
    demoted: dict[int, str] = {}   # nodes found unmappable while building their group
    while True:
        reasons = {i: demoted.get(i) or _why_not(ctx, i, n, i in in_range) for i, n in enumerate(nodes)}
        mappable = {i for i, r in reasons.items() if r is None}
        pullable = {i for i in mappable if i in ctx.views or (i in pre and nodes[i].op_type in _ELEMENTWISE)}
        part = partition(nodes, mappable, ctx.consts, frozenset(pullable), model_outputs)
        try:
            subgraphs, fate = _build_all(ctx, nodes, part, part.external(nodes, mappable, model_outputs), base)
            break
        except _Demote as d:
            if d.node in demoted or d.node < 0:   # cannot happen: a demoted node is in no group
                raise ImportError_(f"{label(d.node, nodes[d.node])}: {d.reason}") from None
            log.info("%s: %s", label(d.node, nodes[d.node]), d.reason)
            demoted[d.node] = d.reason
    dropped = tuple(", ".join(label(i, nodes[i]) for i in g) for g, f in zip(part.groups, fate) if f == "no-op")
    boundaries = tuple(f"{label(i, n)}: {reasons[i]}" for i, n in enumerate(nodes)
                       if reasons[i] is not None and n.op_type != "Constant")
    regions = find_regions(nodes, in_range, reasons, part, fate, frozenset(pre | pullable))
    compute = tuple(label(i, n) for i, n in enumerate(nodes) if n.op_type in COMPUTE_OPS)
    log.info("%s: %d nodes (%d folded), %d regions, %d subgraphs, %d no-op groups dropped, %d boundary nodes",
             base, len(nodes), len(fold.folded), len(regions), len(subgraphs), len(dropped), len(boundaries))
    return OnnxImport(subgraphs=tuple(subgraphs), boundaries=boundaries, regions=regions, dropped=dropped,
                      compute_ops=compute, fold=fold)


def _known_dims(shape: Sequence[int | str | None] | None) -> tuple[int, ...] | None:
    """``shape`` when every dim is a known int, else None."""
    if shape is None:
        return None
    dims = tuple(d for d in shape if isinstance(d, int))
    return dims if len(dims) == len(shape) else None


def _build_all(ctx: _Ctx, nodes: list[Any], part: Any, external: set[str],
               base: str) -> tuple[list[OnnxSubgraph], list[str]]:
    """The subgraphs ``base_0, base_1, ...`` of the groups, and each group's fate (its graph's name,
    ``"no-op"`` or ``"unused"``)."""
    subgraphs: list[OnnxSubgraph] = []
    fate: list[str] = []
    for g, core in zip(part.groups, part.cores):
        sg = _build(ctx, nodes, g, core, external, f"{base}_{len(subgraphs)}")
        if isinstance(sg, OnnxSubgraph):
            subgraphs.append(sg)
        fate.append(sg.graph.name if isinstance(sg, OnnxSubgraph) else sg)
    return subgraphs, fate


def _mappable_views(ctx: _Ctx, nodes: list[Any]) -> dict[int, View]:
    """The views of :func:`resolve_views` that a group can take: broadcast ones, and any whose
    every reader is such a view in turn (a chain that ends broadcast)."""
    shapes = {t: _known_dims(ty.shape) for t, ty in ctx.types.items()}
    same = {i for i, n in enumerate(nodes) if n.op_type == "Cast" and n.input and n.input[0] in ctx.types
            and ctx.types[n.input[0]].elem == ctx.attrs(n).get("to")}
    views = resolve_views(nodes, shapes, ctx.consts, same)
    readers: dict[str, list[int]] = {}
    for i, n in enumerate(nodes):
        for t in n.input:
            readers.setdefault(t, []).append(i)
    keep: dict[int, View] = {}
    for i in sorted(views, reverse=True):
        rs = readers.get(nodes[i].output[0], [])
        if views[i].broadcast or views[i].reshape or (rs and all(r in keep for r in rs)):
            keep[i] = views[i]
    return keep


def _preamble(ctx: _Ctx, nodes: list[Any], among: set[int], model_inputs: set[str],
              cheap: Callable[[int], bool]) -> set[int]:
    """Nodes of ``among`` that are ``cheap`` (and element-wise or views) and read only model inputs,
    constants and each other: recomputed by every group (and counted in every region) that reads them."""
    out: set[int] = set()
    for i, n in enumerate(nodes):
        if i not in among or n.op_type == "Constant" or not cheap(i):
            continue
        if n.op_type not in _ELEMENTWISE and i not in ctx.views and n.op_type not in _CHEAP:
            continue
        tensors = [t for t in n.input if t and t not in ctx.consts]
        if tensors and all(t in model_inputs or ctx.producer.get(t) in out for t in tensors):
            out.add(i)
    return out


def _lazy_origin(ctx: _Ctx, nodes: list[Any], t: str, vals: dict[str, Value]) -> int:
    """The view node nearest to tensor ``t`` that makes its value broadcast (``t``'s producer if
    there is none): the node to leave to the framework so that ``t`` comes out exact."""
    p = ctx.producer[t]
    todo, seen = [p], set()
    while todo:
        q = todo.pop(0)
        if q in seen:
            continue
        seen.add(q)
        if q in ctx.views:
            return q
        for u in nodes[q].input:
            val = vals.get(u)
            if u in ctx.producer and val is not None and not val.is_scalar \
                    and tuple(val.shape) != _static_shape(ctx, u):
                todo.append(ctx.producer[u])
    return p


def _take(ctx: _Ctx, nodes: list[Any], b: GraphBuilder, i: int, t: str, r: Value, leaves: bool,
          vals: dict[str, Value]) -> Value | str | None:
    """Record node ``i``'s value ``r`` of tensor ``t`` (checked against the model's shape, cast to
    its dtype) in ``vals``; return it when it ``leaves`` the group as an output, ``"passed"`` when
    it would leave but is one of the group's inputs, else None. Raises :class:`_Demote` when it
    cannot leave (a broadcast, a rearranged view) or does not fit the model."""
    view = ctx.views.get(i)
    if view is not None and not view.broadcast and not view.reshape:
        if leaves:
            raise _Demote(i, f"its value {t!a} is a rearranged view that leaves the region")
        return None   # an inner link of a chain of views: its readers read the base
    expect = _static_shape(ctx, t)
    if not r.is_scalar and math.prod(r.shape) == math.prod(expect):
        pass   # exact, or a reshaped frame of it: the same elements in the same order
    elif r.is_scalar or broadcast_shapes(tuple(r.shape), expect) != expect:
        raise _Demote(i, f"mapped shape {list(r.shape)} differs from the model's {list(expect)} for {t!a}")
    dt = _elem_name(ctx, t)
    if r.dtype != dt:
        r = b.cast(r, dt, f"{t}_cast")
    vals[t] = r
    if not leaves:
        return None
    same = math.prod(r.shape) == math.prod(expect)   # a pure reshape: the same bytes
    if b.is_input(r) and same:
        return "passed"
    if not same and "expand" not in OPS:
        raise _Demote(_lazy_origin(ctx, nodes, t, vals), f"a broadcast view that would leave "
                      f"the region through {t!a} (graph.json has no expand)")
    if not same:   # a broadcast value leaves expanded (written whole); readers inside keep the broadcast
        return b.layout("expand", [r], expect, str(r.dtype), f"{t}_expand", shape=list(expect))
    if tuple(r.shape) != expect:   # a reshaped frame leaves in the ONNX tensor's shape (stored through the view)
        return b.layout("reshape", [r], expect, str(r.dtype), f"{t}_view", shape=list(expect))
    return r


def _constant_input(ctx: _Ctx, b: GraphBuilder, t: str, constants: list[tuple[str, np.ndarray]]) -> Value:
    """A constant of more than one element as a graph input, its value appended to ``constants``
    (bool as 0 / 1 bytes, floats as float32 then the input's dtype, ints in their own dtype)."""
    from stitchtune.graph.reference import numpy_dtype

    c = ctx.consts[t]
    elem = ctx.types[t].elem if t in ctx.types else 0
    ty = _ONNX_ALL.get(elem) or INT_DTYPES.get(elem)
    if ty is None:
        raise ImportError_(f"constant {t!a} is not float32/float16/bfloat16/bool/int32/int64")
    v = b.add_input(t, tuple(int(d) for d in c.shape), ty)
    if ty == "bool":
        arr = np.asarray(c) != 0
    elif ty in INT_DTYPES.values():
        arr = np.asarray(c)
    else:
        arr = np.asarray(c, dtype=np.float32)
    constants.append((str(v.ref), arr.astype(numpy_dtype(ty))))
    return v


def _build(ctx: _Ctx, nodes: list[Any], members: list[int], core: set[int], external: set[str],
           gname: str) -> OnnxSubgraph | str:
    """The group's subgraph, or ``"no-op"`` when every value it hands on is one of its inputs passed
    through unchanged, or ``"unused"`` when nothing outside reads what it computes. Values of its
    ``core`` nodes in ``external`` leave it (the nodes it only recomputes hand nothing on). Raises
    :class:`_Demote` for a node whose value would leave the group as a broadcast or rearranged view."""
    b = GraphBuilder(gname)
    produced = {t for i in members for t in nodes[i].output if t}
    vals: dict[str, Value] = {}
    names: list[tuple[str, str]] = []
    constants: list[tuple[str, np.ndarray]] = []

    reader: list[Any] = [None]   # the node being mapped: a layout op takes no scalar constant

    def value(t: str) -> Value:
        moves = reader[0] is not None and (layout_op(reader[0].op_type) or reader[0].op_type == "Split")
        key = f"{t}\0tensor" if moves and t in ctx.consts and ctx.consts[t].size == 1 else t
        if key in vals:
            return vals[key]
        if t in produced:   # an inner link of a chain of views, read by something else after all
            raise _Demote(ctx.producer[t], "a rearranged view read inside the region")
        if t in ctx.consts and ctx.consts[t].size == 1 and not moves:
            vals[t] = scalar(float(np.asarray(ctx.consts[t], dtype=np.float64).reshape(-1)[0]))
            return vals[t]
        v = _constant_input(ctx, b, t, constants) if t in ctx.consts else \
            b.add_input(t, _static_shape(ctx, t), _elem_name(ctx, t))
        names.append((str(v.ref), t))
        vals[key] = v
        return v

    outputs: list[Value] = []
    passed_through = False
    for i in members:
        n = nodes[i]
        outs = list(n.output)
        hints = [o or f"{n.op_type}_{i}" for o in outs]
        reader[0] = n
        try:
            results = _map_node(ctx, b, i, n, value, hints)
        except _Demote as d:
            if d.tensor is None:
                raise
            raise _Demote(_lazy_origin(ctx, nodes, d.tensor, vals), d.reason) from None
        for t, r in zip(outs, results):
            if not t or r is None:
                continue
            got = _take(ctx, nodes, b, i, t, r, i in core and t in external, vals)
            if isinstance(got, str):   # "passed"
                passed_through = True   # the tensor equals one of the group's inputs: nothing to compute
            elif got is not None:
                outputs.append(got)
                names.append((str(got.ref), t))
    if not outputs:
        why = "no-op" if passed_through else "unused"
        log.info("%s (ONNX nodes %s): %s", gname, ", ".join(label(i, nodes[i]) for i in members),
                 "only passes its inputs through; dropped" if passed_through else "nothing outside uses it; skipped")
        return why
    graph = b.graph(outputs)
    live = set(graph.outputs) | {n for n, _ in graph.inputs}
    return OnnxSubgraph(graph=graph, onnx_nodes=tuple(label(i, nodes[i]) for i in members),
                        tensor_names=tuple((g, o) for g, o in names if g in live),
                        constants=tuple((c, arr) for c, arr in constants if c in live))
