"""ONNX -> graph.json: the maximal memory-intensive subgraphs of a model, one graph.json each.

Contract
--------
* :func:`import_onnx(model, node_range=None, shapes=None)` loads the model with the ``onnx`` package,
  applies ``shapes`` (``{graph input name: shape}`` or ``{dim_param: (size,)}``) to the graph
  inputs, folds constants and runs ONNX shape inference, and returns an :class:`OnnxImport`.
* A node is *mappable* if its op is in :data:`SUPPORTED_OPS`, it lies in ``node_range`` (python
  slice over node indices), its float tensors are float32/float16/bfloat16 of rank 1..4, and its
  attribute-like inputs (reduction axes, clip bounds) are constants. Every other node (MatMul,
  Gemm, Conv, Reshape, Transpose, integer ops, ...) is a boundary.
* Subgraphs are the maximal connected groups of mappable nodes (joined by tensors) that can run as
  one fused unit. A group that some path leaves and re-enters through a boundary node (a residual
  around a MatMul) is split by *stage*: every path through a boundary moves to a later stage, a
  part never spans stages, so each part is convex and its inputs exist before it starts.
* Subgraph inputs are the tensors it reads but does not produce; single-element constants are
  inlined as scalars, other constants (weights) become inputs with their values in
  ``OnnxSubgraph.constants``. Outputs are the tensors it produces that are read outside it or are
  model outputs. Names are sanitised to ``[A-Za-z_][A-Za-z0-9_]{0,63}``; ``tensor_names`` maps them
  back to ONNX names.
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
  :data:`COMPUTE_OPS`); each :class:`OnnxRegion` says whether it was imported whole, cut (and by
  which nodes), dropped as a no-op, or skipped.
"""

from __future__ import annotations

import json
import logging
import math
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from stitchtune.graph.parse import Graph
from stitchtune.importers.builder import (
    GraphBuilder,
    ImportError_,
    Value,
    scalar,
)
from stitchtune.importers.onnx_fold import FoldReport, fold_and_infer
from stitchtune.importers.onnx_load import MAX_TENSOR_ELEMENTS, ConstTable, load_model
from stitchtune.importers.onnx_partition import COMPUTE_OPS, OnnxRegion, label, partition
from stitchtune.importers.onnx_partition import regions as find_regions

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

_UNARY = {"Sqrt": "sqrt", "Reciprocal": "reciprocal", "Exp": "exp", "Log": "log", "Tanh": "tanh",
          "Sigmoid": "sigmoid", "Relu": "relu", "Erf": "erf", "Neg": "neg", "Abs": "abs"}
_BINARY = {"Add": "add", "Sub": "sub", "Mul": "mul", "Div": "div", "Pow": "pow"}
_VARIADIC = {"Max": "maximum", "Min": "minimum"}
_REDUCE = {"ReduceMean": "reduce_mean", "ReduceSum": "reduce_sum", "ReduceMax": "reduce_max",
           "ReduceMin": "reduce_min"}
_OTHER = {"Identity", "Softmax", "LogSoftmax", "LayerNormalization", "RMSNormalization",
          "SimplifiedLayerNormalization", "Cast", "Gelu", "FastGelu", "Clip"}
SUPPORTED_OPS: frozenset[str] = frozenset([*_UNARY, *_BINARY, *_VARIADIC, *_REDUCE, *_OTHER])
_DOMAINS = {"", "ai.onnx", "com.microsoft"}
_MS_ONLY = {"SimplifiedLayerNormalization", "FastGelu"}

_NOOP_SHAPE_OPS = {"Reshape", "Squeeze", "Unsqueeze", "Flatten", "Expand"}   # mappable when they change nothing
_ONNX_DTYPES = {1: "float32", 10: "float16", 16: "bfloat16"}   # TensorProto enum -> graph.json


@dataclass(frozen=True)
class OnnxSubgraph:
    """One memory-intensive subgraph of the model, as a validated graph."""

    graph: Graph
    onnx_nodes: tuple[str, ...]                     # "index:op:name" of each ONNX node in it
    tensor_names: tuple[tuple[str, str], ...]       # (graph input/output name, ONNX tensor name)
    constants: tuple[tuple[str, np.ndarray], ...] = field(default=(), compare=False)


@dataclass(frozen=True)
class OnnxImport:
    subgraphs: tuple[OnnxSubgraph, ...]
    boundaries: tuple[str, ...]   # "index:op:name: reason" for each node left out
    regions: tuple[OnnxRegion, ...] = ()
    dropped: tuple[str, ...] = ()      # no-op groups dropped: their nodes' labels, comma-separated
    compute_ops: tuple[str, ...] = ()  # "index:op:name" of the compute ops left to the framework
    fold: FoldReport = field(default_factory=lambda: FoldReport((), ()))


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


@dataclass
class _Tensor:
    shape: tuple[int | str | None, ...] | None   # None = unknown rank; str = dim_param; None dim = unknown
    elem: int


def _type_table(model: Any) -> dict[str, _Tensor]:
    out: dict[str, _Tensor] = {}
    vis = [*model.graph.input, *model.graph.output, *model.graph.value_info]
    for vi in vis:
        tt = vi.type.tensor_type
        if not vi.type.HasField("tensor_type"):
            continue
        shape: tuple[int | str | None, ...] | None = None
        if tt.HasField("shape"):
            shape = tuple(d.dim_value if d.HasField("dim_value") else (d.dim_param or None) for d in tt.shape.dim)
        out[vi.name] = _Tensor(shape, tt.elem_type)
    for t in model.graph.initializer:
        out[t.name] = _Tensor(tuple(t.dims), t.data_type)
    return out


# ---------------------------------------------------------------------------- per-node support
class _Ctx:
    def __init__(self, model: Any, types: dict[str, _Tensor], consts: ConstTable) -> None:
        self.types, self.consts = types, consts
        self.opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 13)
        inits = {t.name for t in model.graph.initializer}
        self.symbol_at: dict[str, str] = {}   # dim symbol -> "input 'x' dim 0" where it first appears
        for vi in model.graph.input:
            if vi.name not in inits:
                for k, d in enumerate(vi.type.tensor_type.shape.dim):
                    if d.HasField("dim_param"):
                        self.symbol_at.setdefault(d.dim_param, f"model input {vi.name!a} dim {k}")

    @staticmethod
    def attrs(node: Any) -> dict[str, Any]:
        from onnx import helper

        out = {}
        for a in node.attribute:
            v = helper.get_attribute_value(a)
            out[a.name] = v.decode() if isinstance(v, bytes) else v
        return out

    def const_list(self, node: Any, idx: int) -> list[int] | None:
        if len(node.input) <= idx or not node.input[idx]:
            return None
        c = self.consts.get(node.input[idx])
        return None if c is None else [int(v) for v in np.asarray(c).reshape(-1)]


def _why_not(ctx: _Ctx, i: int, node: Any, in_range: bool) -> str | None:
    """None if the node can be part of a subgraph, else the reason it is a boundary."""
    if node.op_type == "Constant":
        return "constant"
    if node.op_type in COMPUTE_OPS:
        return "compute op, left to the framework"
    if node.op_type in _NOOP_SHAPE_OPS and node.domain in ("", "ai.onnx"):
        if not _changes_nothing(ctx, node):
            return "changes the shape (graph.json has no reshape)"
    elif node.domain not in _DOMAINS or node.op_type not in SUPPORTED_OPS:
        return "unsupported op"
    if node.op_type in _MS_ONLY and node.domain != "com.microsoft":
        return "unsupported op"
    if not in_range:
        return "outside --node-range"
    tensor_ins = [t for t in node.input if t and t not in ctx.consts]
    if not tensor_ins:
        return "all inputs are constants"
    for t in [*node.input, *node.output]:
        if not t or (t in ctx.consts and t not in node.output):
            continue
        ty = ctx.types.get(t)
        if ty is None or ty.elem not in _ONNX_DTYPES:
            if node.op_type in _REDUCE and node.input[1:2] == [t]:
                continue
            return f"tensor {t!a} is not float32/float16/bfloat16 (or has no type)"
        if ty.shape is not None and not 1 <= len(ty.shape) <= 4:
            return f"tensor {t!a} has rank {len(ty.shape)} (graph.json takes 1..4)"
    a = ctx.attrs(node)
    if node.op_type in _REDUCE and "axes" not in a and len(node.input) > 1 and node.input[1] \
            and ctx.const_list(node, 1) is None:
        return "reduction axes are not a constant"
    if node.op_type == "Clip":
        for k in (1, 2):
            if len(node.input) > k and node.input[k] and node.input[k] not in ctx.consts:
                return "clip bounds are not constants"
    if node.op_type == "Cast" and a.get("to") not in _ONNX_DTYPES:
        return "cast to a non-float type"
    if node.op_type == "Gelu" and a.get("approximate", "none") not in ("none", "tanh"):
        return "unknown gelu approximation"
    return None


def _changes_nothing(ctx: _Ctx, node: Any) -> bool:
    """True if a reshape-like ``node`` has a static output shape equal to its data input's."""
    if not node.input or not node.output or not node.input[0]:
        return False
    a, b = ctx.types.get(node.input[0]), ctx.types.get(node.output[0])
    return (a is not None and b is not None and a.shape is not None and a.shape == b.shape
            and all(isinstance(d, int) and d > 0 for d in a.shape))


def _static_shape(ctx: _Ctx, t: str) -> tuple[int, ...]:
    """The static shape of tensor ``t``; an error naming the dimension if it is not static and
    positive, or if the tensor is larger than graph.json takes."""
    ty = ctx.types.get(t)
    if ty is None or ty.shape is None:
        raise ImportError_(f"tensor {t!a} has no inferred shape; pass --shapes for the model inputs")
    for k, d in enumerate(ty.shape):
        if isinstance(d, int) and d == 0:
            raise ImportError_(f"tensor {t!a} dim {k} is 0 (empty tensors cannot be imported)")
        if isinstance(d, str) and d in ctx.symbol_at:
            raise ImportError_(f"tensor {t!a} dim {k} ({d!a}, from {ctx.symbol_at[d]}) is dynamic; fix it "
                               f"with --shapes INPUT=AxB... or --shapes SYMBOL=N")
        if not isinstance(d, int) or d < 0:
            sym = f" ({d!a})" if isinstance(d, str) else ""
            dyn = ", ".join(f"{s!a} ({w})" for s, w in ctx.symbol_at.items())
            hint = (f"the model's dynamic inputs are {dyn}: fix them with --shapes SYMBOL=N or INPUT=AxB..."
                    if dyn else "no model input is dynamic: the model derives it from a value known only at run time")
            raise ImportError_(f"tensor {t!a} dim {k}{sym} is dynamic after constant folding and shape "
                               f"inference; {hint}")
    shape = tuple(int(d) for d in ty.shape)
    if math.prod(shape) > MAX_TENSOR_ELEMENTS:
        raise ImportError_(f"tensor {t!a} has shape {list(shape)}, over {MAX_TENSOR_ELEMENTS} elements")
    return shape


# ---------------------------------------------------------------------------- mapping one node
def _map_node(ctx: _Ctx, b: GraphBuilder, node: Any, v: Callable[[str], Value],
              out_names: list[str]) -> list[Value | None]:
    op, a = node.op_type, ctx.attrs(node)
    name = out_names[0]
    ins = [t for t in node.input]
    if op in _UNARY:
        return [b.unary(_UNARY[op], v(ins[0]), name)]
    if op == "Identity" or op in _NOOP_SHAPE_OPS:   # reshapes get here only when they change nothing
        return [v(ins[0])]
    if op in _BINARY:
        return [b.binary(_BINARY[op], v(ins[0]), v(ins[1]), name)]
    if op in _VARIADIC:
        acc = v(ins[0])
        for k, t in enumerate(ins[1:], 1):
            acc = b.binary(_VARIADIC[op], acc, v(t), name if k == len(ins) - 1 else f"{name}_{k}")
        return [acc]
    if op in _REDUCE:
        x = v(ins[0])
        axes = a.get("axes")
        if axes is None:
            axes = ctx.const_list(node, 1)
        if not axes:
            if a.get("noop_with_empty_axes", 0):
                return [x]
            axes = list(range(len(x.shape)))
        return [b.reduce(_REDUCE[op], x, axes, bool(a.get("keepdims", 1)), name)]
    if op in ("Softmax", "LogSoftmax"):
        x = v(ins[0])
        r = len(x.shape)
        axis = a.get("axis", -1 if ctx.opset >= 13 else 1)
        axes = [axis % r] if ctx.opset >= 13 else list(range(axis % r, r))
        return [b.softmax(x, axes, name, log_=op == "LogSoftmax")]
    if op in ("LayerNormalization", "RMSNormalization", "SimplifiedLayerNormalization"):
        x = v(ins[0])
        r = len(x.shape)
        axes = list(range(a.get("axis", -1) % r, r))
        eps = float(a.get("epsilon", 1e-5))
        w = v(ins[1]) if len(ins) > 1 and ins[1] else None
        if op == "LayerNormalization":
            bias = v(ins[2]) if len(ins) > 2 and ins[2] else None
            return list(b.layer_norm(x, axes, w, bias, eps, name))
        y, rstd = b.rms_norm(x, axes, w, eps, name)
        return [y, rstd]
    if op == "Cast":
        return [b.cast(v(ins[0]), _ONNX_DTYPES[a["to"]], name)]
    if op in ("Gelu", "FastGelu"):
        x = v(ins[0])
        if op == "FastGelu" and len(ins) > 1 and ins[1]:
            x = b.binary("add", x, v(ins[1]), f"{name}_bias")
        approx = "tanh" if op == "FastGelu" else a.get("approximate", "none")
        return [b.unary("gelu_tanh" if approx == "tanh" else "gelu", x, name)]
    if op == "Clip":
        x = v(ins[0])
        lo = a.get("min") if ctx.opset < 11 else (v(ins[1]) if len(ins) > 1 and ins[1] else None)
        hi = a.get("max") if ctx.opset < 11 else (v(ins[2]) if len(ins) > 2 and ins[2] else None)
        if lo is not None:
            x = b.binary("maximum", x, lo if isinstance(lo, Value) else scalar(lo),
                         f"{name}_lo" if hi is not None else name)
        if hi is not None:
            x = b.binary("minimum", x, hi if isinstance(hi, Value) else scalar(hi), name)
        return [x]
    raise AssertionError(f"unmapped supported op {op}")  # _why_not admits only mapped ops


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
    lo, hi = node_range or (None, None)
    in_range = set(range(len(nodes))[slice(lo, hi)])
    reasons = {i: _why_not(ctx, i, n, i in in_range) for i, n in enumerate(nodes)}
    mappable = {i for i, r in reasons.items() if r is None}
    part = partition(nodes, mappable, ctx.consts)
    model_outputs = {o.name for o in m.graph.output}
    subgraphs: list[OnnxSubgraph] = []
    fate: dict[int, str] = {}   # first member of each group -> graph name, "no-op" or "unused"
    for members in sorted(part.groups, key=lambda g: g[0]):
        built = _build(ctx, nodes, members, part.consumers, model_outputs, f"{base}_{len(subgraphs)}")
        if isinstance(built, OnnxSubgraph):
            subgraphs.append(built)
            fate[members[0]] = built.graph.name
        else:
            fate[members[0]] = built
    dropped = tuple(", ".join(label(i, nodes[i]) for i in g) for g in sorted(part.groups, key=lambda g: g[0])
                    if fate[g[0]] == "no-op")
    boundaries = tuple(f"{label(i, n)}: {reasons[i]}" for i, n in enumerate(nodes)
                       if reasons[i] is not None and n.op_type != "Constant")
    regions = find_regions(nodes, in_range, reasons, part, fate)
    compute = tuple(label(i, n) for i, n in enumerate(nodes) if n.op_type in COMPUTE_OPS)
    log.info("%s: %d nodes (%d folded), %d regions, %d subgraphs, %d no-op groups dropped, %d boundary nodes",
             base, len(nodes), len(fold.folded), len(regions), len(subgraphs), len(dropped), len(boundaries))
    return OnnxImport(subgraphs=tuple(subgraphs), boundaries=boundaries, regions=regions, dropped=dropped,
                      compute_ops=compute, fold=fold)


def _build(ctx: _Ctx, nodes: list[Any], members: list[int], consumers: dict[str, set[int]],
           model_outputs: set[str], gname: str) -> OnnxSubgraph | str:
    """The group's subgraph, or ``"no-op"`` when every value it hands on is one of its inputs passed
    through unchanged, or ``"unused"`` when nothing outside reads what it computes."""
    b = GraphBuilder(gname)
    member_set = set(members)
    produced = {t for i in members for t in nodes[i].output if t}
    vals: dict[str, Value] = {}
    names: list[tuple[str, str]] = []
    constants: list[tuple[str, np.ndarray]] = []

    def value(t: str) -> Value:
        if t in vals:
            return vals[t]
        if t in ctx.consts and t not in produced:
            c = ctx.consts[t]
            if c.size == 1:
                vals[t] = scalar(float(np.asarray(c, dtype=np.float64).reshape(-1)[0]))
                return vals[t]
            ty = _ONNX_DTYPES.get(ctx.types[t].elem if t in ctx.types else 0)
            if ty is None:
                raise ImportError_(f"constant {t!a} is not float32/float16/bfloat16")
            v = b.add_input(t, tuple(int(d) for d in c.shape), ty)
            from stitchtune.graph.reference import numpy_dtype

            constants.append((str(v.ref), np.asarray(c, dtype=np.float32).astype(numpy_dtype(ty))))
        else:
            ty = _ONNX_DTYPES[ctx.types[t].elem]
            v = b.add_input(t, _static_shape(ctx, t), ty)
        names.append((str(v.ref), t))
        vals[t] = v
        return v

    outputs: list[Value] = []
    passed_through = False
    for i in members:
        n = nodes[i]
        outs = list(n.output)
        hints = [o or f"{n.op_type}_{i}" for o in outs]
        results = _map_node(ctx, b, n, value, hints)
        for t, r in zip(outs, results):
            if not t or r is None:
                continue
            expect = _static_shape(ctx, t)
            if r.is_scalar or tuple(r.shape) != expect:
                raise ImportError_(f"{label(i, n)}: mapped shape {list(r.shape)} differs from the model's "
                                   f"{list(expect)} for {t!a}")
            dt = _ONNX_DTYPES[ctx.types[t].elem]
            if r.dtype != dt:
                r = b.cast(r, dt, f"{t}_cast")
            vals[t] = r
            if t in model_outputs or (consumers.get(t, set()) - member_set):
                if b.is_input(r):
                    passed_through = True   # the tensor equals one of the group's inputs: nothing to compute
                    continue
                outputs.append(r)
                names.append((str(r.ref), t))
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


def _write_atomic(path: Path, write: Callable[[Any], None]) -> None:
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        with open(tmp, "wb") as f:
            write(f)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def write_subgraphs(result: OnnxImport, out_dir: str | Path) -> list[Path]:
    """Write ``<name>.json`` (+ ``<name>.constants.npz`` when it has weights) per subgraph and
    ``manifest.json`` (subgraphs, boundaries, regions, dropped no-op groups, folded nodes, compute
    ops), each file through a temporary name; returns the graph.json paths. A file system error is
    an :class:`ImportError_` naming the path."""
    out = Path(out_dir)
    paths, manifest = [], []
    try:
        out.mkdir(parents=True, exist_ok=True)
        for sg in result.subgraphs:
            p = out / f"{sg.graph.name}.json"
            text = (json.dumps(sg.graph.to_dict(), indent=1) + "\n").encode()
            _write_atomic(p, lambda f, text=text: f.write(text))
            entry: dict[str, Any] = {"graph": p.name, "onnx_nodes": list(sg.onnx_nodes),
                                     "onnx_tensors": dict(sg.tensor_names)}
            if sg.constants:
                cp = out / f"{sg.graph.name}.constants.npz"
                arrays = dict(sg.constants)   # bfloat16 comes back as |V2; `stitchtune run` reads it
                _write_atomic(cp, lambda f, arrays=arrays: np.savez(f, **arrays))
                entry["constants"] = cp.name
            manifest.append(entry)
            paths.append(p)
        doc = {"subgraphs": manifest, "boundaries": list(result.boundaries),
               "regions": [{"nodes": list(r.nodes), "status": r.status, "subgraphs": list(r.subgraphs),
                            "stopped_by": list(r.stopped_by)} for r in result.regions],
               "dropped_noop_groups": list(result.dropped), "folded": list(result.fold.folded),
               "not_folded": list(result.fold.unfolded), "compute_ops": list(result.compute_ops)}
        text = (json.dumps(doc, indent=1) + "\n").encode()
        _write_atomic(out / "manifest.json", lambda f: f.write(text))
    except OSError as e:
        raise ImportError_(f"cannot write to {ascii(str(out))}: {e.strerror or e}") from None
    return paths


def _counted(ops: list[str]) -> str:
    counts: dict[str, int] = {}
    for op in ops:
        counts[op] = counts.get(op, 0) + 1
    return ", ".join(f"{op} x{n}" if n > 1 else op for op, n in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])))


def summary_lines(result: OnnxImport) -> list[str]:
    """What the import did, for the CLI: regions found / imported whole / cut (by which ops) /
    dropped / skipped, the dropped no-op groups, folding, and the compute ops left to the framework."""
    by = {s: [r for r in result.regions if r.status == s] for s in ("whole", "cut", "dropped", "skipped")}
    lines = [f"regions: {len(result.regions)} found, {len(by['whole'])} imported whole, {len(by['cut'])} cut, "
             f"{len(by['dropped'])} dropped as no-ops, {len(by['skipped'])} not imported"]
    for r in by["cut"]:
        lines.append(f"  cut: nodes {r.nodes[0].split(':')[0]}..{r.nodes[-1].split(':')[0]} -> "
                     f"{', '.join(r.subgraphs)}; stopped by {_counted([b.split(':')[1] for b in r.stopped_by])}")
    stops = [b.split(":")[1] for r in by["skipped"] for b in r.stopped_by]
    if by["skipped"]:
        lines.append(f"  not imported: {len(by['skipped'])} region(s) of {_counted(stops) or 'unused nodes'}")
    lines.append(f"dropped no-op groups: {len(result.dropped)}" + "".join(f"\n  {d}" for d in result.dropped))
    lines.append(f"constant-only nodes folded: {len(result.fold.folded)}"
                 + (f" ({len(result.fold.unfolded)} left unfolded, see manifest.json)" if result.fold.unfolded else ""))
    lines.append("compute ops left to the framework: "
                 + (_counted([c.split(":")[1] for c in result.compute_ops]) or "none"))
    return lines
