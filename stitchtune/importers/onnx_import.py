"""ONNX -> graph.json: the maximal memory-intensive subgraphs of a model, one graph.json each.

Contract
--------
* :func:`import_onnx(model, node_range=None, shapes=None)` loads the model with the ``onnx`` package,
  applies ``shapes`` (``{graph input name: shape}`` or ``{dim_param: (size,)}``) to the graph
  inputs, runs ONNX shape inference and returns an :class:`OnnxImport`.
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
"""

from __future__ import annotations

import json
import logging
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

__all__ = [
    "SUPPORTED_OPS",
    "OnnxImport",
    "OnnxSubgraph",
    "import_onnx",
    "parse_node_range",
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


# ---------------------------------------------------------------------------- model loading
def _load(model: Any) -> Any:
    try:
        import onnx
    except ModuleNotFoundError as e:
        raise ImportError_("the onnx package is not installed (pip install 'stitchtune[import]')") from e
    if isinstance(model, onnx.ModelProto):
        return model
    try:
        return onnx.load(str(model))
    except FileNotFoundError:
        raise ImportError_(f"ONNX model {str(model)!a} does not exist") from None
    except Exception as e:
        raise ImportError_(f"cannot read {str(model)!a} as an ONNX model: {type(e).__name__}: {e}") from e


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


def _constants(model: Any) -> dict[str, np.ndarray]:
    from onnx import helper, numpy_helper

    consts = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    for n in model.graph.node:
        if n.op_type == "Constant" and n.domain in ("", "ai.onnx") and n.output:
            attrs = {a.name: helper.get_attribute_value(a) for a in n.attribute}
            if "value" in attrs:
                consts[n.output[0]] = numpy_helper.to_array(attrs["value"])
            else:
                for k in ("value_float", "value_floats", "value_int", "value_ints"):
                    if k in attrs:
                        consts[n.output[0]] = np.asarray(attrs[k])
    return consts


# ---------------------------------------------------------------------------- per-node support
class _Ctx:
    def __init__(self, model: Any, types: dict[str, _Tensor], consts: dict[str, np.ndarray]) -> None:
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


def _label(i: int, node: Any) -> str:
    return f"{i}:{node.op_type}:{node.name or '-'}"


def _why_not(ctx: _Ctx, i: int, node: Any, in_range: bool) -> str | None:
    """None if the node can be part of a subgraph, else the reason it is a boundary."""
    if node.op_type == "Constant":
        return "constant"
    if node.domain not in _DOMAINS or node.op_type not in SUPPORTED_OPS:
        return "compute-heavy or unsupported op"
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


def _static_shape(ctx: _Ctx, t: str) -> tuple[int, ...]:
    ty = ctx.types.get(t)
    if ty is None or ty.shape is None:
        raise ImportError_(f"tensor {t!a} has no inferred shape; pass --shapes for the model inputs")
    for k, d in enumerate(ty.shape):
        if not isinstance(d, int) or d <= 0:
            sym = f" ({d!a}, from {ctx.symbol_at[d]})" if isinstance(d, str) and d in ctx.symbol_at else (
                f" ({d!a})" if isinstance(d, str) else "")
            raise ImportError_(f"tensor {t!a} dim {k}{sym} is dynamic; fix it with --shapes "
                               f"INPUT=AxB... or --shapes SYMBOL=N")
    return tuple(int(d) for d in ty.shape)


# ---------------------------------------------------------------------------- mapping one node
def _map_node(ctx: _Ctx, b: GraphBuilder, node: Any, v: Callable[[str], Value],
              out_names: list[str]) -> list[Value | None]:
    op, a = node.op_type, ctx.attrs(node)
    name = out_names[0]
    ins = [t for t in node.input]
    if op in _UNARY:
        return [b.unary(_UNARY[op], v(ins[0]), name)]
    if op == "Identity":
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
    m = _load(model)   # raises ImportError_ if the onnx package is missing
    import onnx

    if shapes:
        m = _apply_shapes(m, shapes)
    try:
        m = onnx.shape_inference.infer_shapes(m, data_prop=True)
    except Exception as e:
        raise ImportError_(f"ONNX shape inference failed: {type(e).__name__}: {str(e).splitlines()[0]}") from e
    base = name or m.graph.name or (Path(str(model)).stem if not isinstance(model, onnx.ModelProto) else "onnx")
    types, consts = _type_table(m), _constants(m)
    ctx = _Ctx(m, types, consts)
    nodes = list(m.graph.node)
    lo, hi = node_range or (None, None)
    in_range = set(range(len(nodes))[slice(lo, hi)])

    reasons = {i: _why_not(ctx, i, n, i in in_range) for i, n in enumerate(nodes)}
    mappable = {i for i, r in reasons.items() if r is None}
    producer: dict[str, int] = {t: i for i, n in enumerate(nodes) for t in n.output if t}
    # stage: boundary nodes move everything after them to a later stage (see module docstring)
    stage: dict[str, int] = {}
    node_stage: dict[int, int] = {}
    for i, n in enumerate(nodes):
        s = max((stage.get(t, 0) for t in n.input if t and t not in consts), default=0)
        node_stage[i] = s
        for t in n.output:
            stage[t] = s if (i in mappable or n.op_type == "Constant") else s + 1
    consumers: dict[str, set[int]] = {}
    for i, n in enumerate(nodes):
        for t in n.input:
            consumers.setdefault(t, set()).add(i)
    succ = {i: {c for t in n.output if t for c in consumers.get(t, ())} for i, n in enumerate(nodes)}
    groups = []
    # widest first: connected components; a component that a path leaves and re-enters through a
    # boundary node cannot be one kernel, so it is split by stage (always convex)
    for comp in _components(mappable, nodes, producer, lambda p, i: True):
        if _convex(set(comp), succ):
            groups.append(comp)
        else:
            groups.extend(_components(set(comp), nodes, producer,
                                      lambda p, i: node_stage[p] == node_stage[i]))
    model_outputs = {o.name for o in m.graph.output}
    subgraphs = []
    for k, members in enumerate(sorted(groups, key=lambda g: g[0])):
        sg = _build(ctx, nodes, members, consumers, model_outputs, f"{base}_{k}")
        if sg is not None:
            subgraphs.append(sg)
    boundaries = tuple(f"{_label(i, n)}: {reasons[i]}" for i, n in enumerate(nodes)
                       if reasons[i] is not None and n.op_type != "Constant")
    log.info("%s: %d nodes, %d subgraphs, %d boundary nodes", base, len(nodes), len(subgraphs), len(boundaries))
    return OnnxImport(subgraphs=tuple(subgraphs), boundaries=boundaries)


def _components(members: set[int], nodes: list[Any], producer: dict[str, int],
                joinable: Callable[[int, int], bool]) -> list[list[int]]:
    """Connected components of ``members`` over producer->consumer edges that ``joinable`` accepts."""
    parent = {i: i for i in members}

    def find(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    for i in sorted(members):
        for t in nodes[i].input:
            p = producer.get(t)
            if p in members and joinable(p, i):
                parent[find(i)] = find(p)
    groups: dict[int, list[int]] = {}
    for i in sorted(members):
        groups.setdefault(find(i), []).append(i)
    return list(groups.values())


def _convex(group: set[int], succ: dict[int, set[int]]) -> bool:
    """False if some path leaves ``group`` and comes back into it."""
    frontier = [c for i in group for c in succ[i] if c not in group]
    seen: set[int] = set()
    while frontier:
        n = frontier.pop()
        if n in seen:
            continue
        seen.add(n)
        for c in succ[n]:
            if c in group:
                return False
            frontier.append(c)
    return True


def _build(ctx: _Ctx, nodes: list[Any], members: list[int], consumers: dict[str, set[int]],
           model_outputs: set[str], gname: str) -> OnnxSubgraph | None:
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
                raise ImportError_(f"{_label(i, n)}: mapped shape {list(r.shape)} differs from the model's "
                                   f"{list(expect)} for {t!a}")
            dt = _ONNX_DTYPES[ctx.types[t].elem]
            if r.dtype != dt:
                r = b.cast(r, dt, f"{t}_cast")
            vals[t] = r
            if t in model_outputs or (consumers.get(t, set()) - member_set):
                outputs.append(r)
                names.append((str(r.ref), t))
    if not outputs:
        log.info("%s: no outputs are used outside it; skipped", gname)
        return None
    graph = b.graph(outputs)
    live = set(graph.outputs) | {n for n, _ in graph.inputs}
    return OnnxSubgraph(graph=graph, onnx_nodes=tuple(_label(i, nodes[i]) for i in members),
                        tensor_names=tuple((g, o) for g, o in names if g in live),
                        constants=tuple((c, arr) for c, arr in constants if c in live))


def write_subgraphs(result: OnnxImport, out_dir: str | Path) -> list[Path]:
    """Write ``<name>.json`` (+ ``<name>.constants.npz`` when it has weights) per subgraph and
    ``manifest.json``; returns the graph.json paths."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths, manifest = [], []
    for sg in result.subgraphs:
        p = out / f"{sg.graph.name}.json"
        p.write_text(json.dumps(sg.graph.to_dict(), indent=1) + "\n")
        entry: dict[str, Any] = {"graph": p.name, "onnx_nodes": list(sg.onnx_nodes),
                                 "onnx_tensors": dict(sg.tensor_names)}
        if sg.constants:
            cp = out / f"{sg.graph.name}.constants.npz"
            np.savez(cp, **dict(sg.constants))   # bfloat16 comes back as |V2; `stitchtune run` reads it
            entry["constants"] = cp.name
        manifest.append(entry)
        paths.append(p)
    (out / "manifest.json").write_text(json.dumps({"subgraphs": manifest,
                                                   "boundaries": list(result.boundaries)}, indent=1) + "\n")
    return paths
