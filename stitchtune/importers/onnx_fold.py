"""Constant folding + shape inference for ONNX models, so legacy exports come out with static shapes.

The TorchScript-based exporter (``torch.onnx.export(..., dynamo=False)``) computes ``Expand`` and
``Reshape`` shapes with ``Shape/Gather/ConstantOfShape/Equal/Where/Concat`` chains on constants;
ONNX shape inference does not evaluate those, so every tensor downstream gets unnamed dims.

Contract
--------
* :func:`fold_and_infer(model, consts)` alternates ONNX shape inference with one folding pass,
  until a pass folds nothing (at most :data:`MAX_ROUNDS` rounds), and returns the inferred model
  and a :class:`FoldReport`. It never changes ``model`` itself. ONNX's own data propagation
  (``data_prop=True``) is not used: it is unbounded (a one-element constant of 2**46 feeding
  ConstantOfShape makes it allocate gigabytes), and the bounded folding here computes the same
  static shape values (Shape of static tensors, Gather, Concat, ...).
* A node is folded when it is in the default domain, has one output, its op is in
  :data:`FOLDABLE_OPS`, and either all its inputs are constants (of at most
  :data:`MAX_FOLD_ELEMENTS` elements each) or it is ``Shape``/``Size`` of a tensor whose shape is
  static. It is evaluated in numpy; every op that can allocate more than its inputs (Expand,
  ConstantOfShape, Range, Tile, Concat, Gather*, MatMul, broadcasting) checks its output size first
  and is left unfolded when that exceeds :data:`MAX_FOLD_ELEMENTS`. A folded node is replaced *in
  place* by a ``Constant`` node (node indices stay those of the file) and its value is recorded in
  ``consts``. A node that cannot be evaluated is left as it is (reported, never fatal).
* Then a ``Concat`` input that is statically empty along the axis is dropped while another input
  is left, and a node whose empty output nobody reads any more becomes a ``Constant`` in place
  (graph.json has no empty tensors: Phi-3's rotary concatenates ``q[..., rotary_dim:]``, empty when
  the whole head is rotated).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from stitchtune.importers.builder import ImportError_
from stitchtune.importers.onnx_load import ConstTable

__all__ = ["FOLDABLE_OPS", "MAX_FOLD_ELEMENTS", "MAX_ROUNDS", "FoldReport", "evaluate", "fold_and_infer", "infer"]

log = logging.getLogger(__name__)

MAX_FOLD_ELEMENTS = 1 << 22   # 4 Mi elements: a 2048x2048 causal mask folds, a weight-sized tensor does not
MAX_ROUNDS = 8


class _TooBig(Exception):
    pass


@dataclass(frozen=True)
class FoldReport:
    folded: tuple[str, ...]      # "index:op:name" of every folded node
    unfolded: tuple[str, ...]    # "index:op:name: why" of constant-only nodes left as they are


def infer(model: Any) -> Any:
    """``onnx.shape_inference.infer_shapes(model)`` (no data propagation, see the module docstring);
    a failure is an :class:`ImportError_`."""
    import onnx

    try:
        return onnx.shape_inference.infer_shapes(model, data_prop=False)
    except Exception as e:  # noqa: BLE001 -- onnx raises InferenceError, ValidationError, RuntimeError...
        raise ImportError_(f"ONNX shape inference failed: {type(e).__name__}: {str(e).splitlines()[0]}") from None


# ---------------------------------------------------------------------------- numpy evaluation
def _room(shape: Sequence[int]) -> tuple[int, ...]:
    shape = tuple(int(d) for d in shape)
    if any(d < 0 for d in shape):
        raise ValueError(f"negative dimension in {list(shape)}")
    n = math.prod(shape)
    if n > MAX_FOLD_ELEMENTS:
        raise _TooBig(f"would make {n} elements (folding stops at {MAX_FOLD_ELEMENTS})")
    return shape


def _bcast(*arrays: np.ndarray) -> tuple[int, ...]:
    return _room(np.broadcast_shapes(*(a.shape for a in arrays)))


def _ints(a: np.ndarray | None) -> list[int]:
    return [] if a is None else [int(v) for v in np.asarray(a).reshape(-1)]


def _axes(attrs: dict[str, Any], ins: Sequence[np.ndarray | None], k: int) -> list[int] | None:
    if "axes" in attrs:
        return [int(a) for a in attrs["axes"]]
    return _ints(ins[k]) if len(ins) > k and ins[k] is not None else None


def _div(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    _bcast(a, b)
    if np.issubdtype(a.dtype, np.integer):
        q = np.abs(a) // np.abs(b)   # ONNX integer Div truncates toward zero
        return (np.sign(a) * np.sign(b) * q).astype(a.dtype)
    return np.divide(a, b).astype(a.dtype)


def _binary(fn: Callable[[np.ndarray, np.ndarray], np.ndarray], keep: bool = True) -> Callable[..., np.ndarray]:
    def run(attrs: dict[str, Any], ins: list[np.ndarray]) -> np.ndarray:
        a, b = ins
        _bcast(a, b)
        out = np.asarray(fn(a, b))
        return out.astype(a.dtype) if keep else out
    return run


def _unary(fn: Callable[[np.ndarray], np.ndarray]) -> Callable[..., np.ndarray]:
    return lambda attrs, ins: np.asarray(fn(ins[0])).astype(ins[0].dtype)


def _cast(attrs: dict[str, Any], ins: list[np.ndarray]) -> np.ndarray:
    from onnx import TensorProto, helper

    if attrs.get("to") in (TensorProto.STRING, TensorProto.UNDEFINED):
        raise ValueError("cast to a non-numeric type")
    return ins[0].astype(helper.tensor_dtype_to_np_dtype(int(attrs["to"])))


def _unsqueeze(attrs: dict[str, Any], ins: list[np.ndarray]) -> np.ndarray:
    x, axes = ins[0], _axes(attrs, ins, 1) or []
    r = x.ndim + len(axes)
    return np.expand_dims(x, tuple(sorted(a % r for a in axes))) if axes else x


def _squeeze(attrs: dict[str, Any], ins: list[np.ndarray]) -> np.ndarray:
    x, axes = ins[0], _axes(attrs, ins, 1)
    return np.squeeze(x) if axes is None else np.squeeze(x, tuple(a % max(x.ndim, 1) for a in axes))


def _reshape(attrs: dict[str, Any], ins: list[np.ndarray]) -> np.ndarray:
    x, shape = ins[0], _ints(ins[1])
    if not attrs.get("allowzero", 0):
        shape = [x.shape[k] if d == 0 and k < x.ndim else d for k, d in enumerate(shape)]
    return x.reshape(shape)


def _flatten(attrs: dict[str, Any], ins: list[np.ndarray]) -> np.ndarray:
    x = ins[0]
    ax = int(attrs.get("axis", 1)) % (x.ndim + 1)
    return x.reshape(math.prod(x.shape[:ax]), math.prod(x.shape[ax:]))


def _concat(attrs: dict[str, Any], ins: list[np.ndarray]) -> np.ndarray:
    _room((sum(a.size for a in ins),))
    return np.concatenate(ins, axis=int(attrs["axis"]))


def _gather(attrs: dict[str, Any], ins: list[np.ndarray]) -> np.ndarray:
    x, idx = ins
    ax = int(attrs.get("axis", 0)) % x.ndim
    _room(x.shape[:ax] + idx.shape + x.shape[ax + 1:])
    if idx.size and (idx.max() >= x.shape[ax] or idx.min() < -x.shape[ax]):
        raise IndexError("gather index out of range")
    return np.take(x, idx, axis=ax)


def _gather_elements(attrs: dict[str, Any], ins: list[np.ndarray]) -> np.ndarray:
    x, idx = ins
    ax = int(attrs.get("axis", 0)) % x.ndim
    _room(idx.shape)
    if idx.size and (idx.max() >= x.shape[ax] or idx.min() < -x.shape[ax]):
        raise IndexError("gather index out of range")
    return np.take_along_axis(x, np.where(idx < 0, idx + x.shape[ax], idx), axis=ax)


def _gather_nd(attrs: dict[str, Any], ins: list[np.ndarray]) -> np.ndarray:
    x, idx = ins
    if int(attrs.get("batch_dims", 0)) != 0:
        raise ValueError("GatherND batch_dims != 0")
    k = idx.shape[-1]
    if k > x.ndim:
        raise ValueError("GatherND index longer than the data rank")
    _room(idx.shape[:-1] + x.shape[k:])
    dims = np.asarray(x.shape[:k])
    if idx.size and (np.any(idx >= dims) or np.any(idx < -dims)):
        raise IndexError("gather index out of range")
    idx = np.where(idx < 0, idx + dims, idx)
    return x[tuple(np.moveaxis(idx, -1, 0))]


def _slice(attrs: dict[str, Any], ins: list[np.ndarray]) -> np.ndarray:
    x = ins[0]
    if "starts" in attrs:   # opset < 10
        starts, ends, axes, steps = attrs["starts"], attrs["ends"], attrs.get("axes"), None
    else:
        starts, ends = _ints(ins[1]), _ints(ins[2])
        axes = _ints(ins[3]) if len(ins) > 3 and ins[3] is not None else None
        steps = _ints(ins[4]) if len(ins) > 4 and ins[4] is not None else None
    axes = list(axes) if axes is not None else list(range(len(starts)))
    steps = steps or [1] * len(starts)
    index = [slice(None)] * x.ndim
    for s, e, a, st in zip(starts, ends, axes, steps):
        if st == 0:
            raise ValueError("slice step 0")
        index[a % x.ndim] = slice(s, e, st)
    return x[tuple(index)]


def _where(attrs: dict[str, Any], ins: list[np.ndarray]) -> np.ndarray:
    _bcast(*ins)
    return np.where(*ins)


def _constant_of_shape(attrs: dict[str, Any], ins: list[np.ndarray]) -> np.ndarray:
    from onnx import numpy_helper

    shape = _room(_ints(ins[0]))
    v = numpy_helper.to_array(attrs["value"]).reshape(-1) if "value" in attrs else np.zeros(1, np.float32)
    return np.full(shape, v[0], dtype=v.dtype)


def _expand(attrs: dict[str, Any], ins: list[np.ndarray]) -> np.ndarray:
    x, shape = ins[0], _ints(ins[1])
    if any(d < 0 for d in shape):
        raise ValueError("negative expand dimension")
    out = _room(np.broadcast_shapes(x.shape, tuple(shape)))
    return np.broadcast_to(x, out).copy()


def _tile(attrs: dict[str, Any], ins: list[np.ndarray]) -> np.ndarray:
    x, reps = ins[0], _ints(ins[1])
    _room([d * r for d, r in zip(x.shape, reps)])
    return np.tile(x, reps)


def _range(attrs: dict[str, Any], ins: list[np.ndarray]) -> np.ndarray:
    start, limit, delta = (np.asarray(a).reshape(()) for a in ins)
    if delta == 0:
        raise ValueError("range delta 0")
    n = max(int(math.ceil((float(limit) - float(start)) / float(delta))), 0)
    _room((n,))
    return (start + delta * np.arange(n)).astype(start.dtype)


def _matmul(attrs: dict[str, Any], ins: list[np.ndarray]) -> np.ndarray:
    a, b = ins
    if a.ndim >= 2 and b.ndim >= 2:
        _room(np.broadcast_shapes(a.shape[:-2], b.shape[:-2]) + (a.shape[-2], b.shape[-1]))
    return np.matmul(a, b)


def _trilu(attrs: dict[str, Any], ins: list[np.ndarray]) -> np.ndarray:
    k = _ints(ins[1])[0] if len(ins) > 1 and ins[1] is not None else 0
    return np.triu(ins[0], k) if attrs.get("upper", 1) else np.tril(ins[0], k)


def _reduce(fn: Callable[..., np.ndarray]) -> Callable[..., np.ndarray]:
    def run(attrs: dict[str, Any], ins: list[np.ndarray]) -> np.ndarray:
        x, axes = ins[0], _axes(attrs, ins, 1)
        if not axes and attrs.get("noop_with_empty_axes", 0):
            return x
        ax = None if not axes else tuple(a % x.ndim for a in axes)
        return np.asarray(fn(x, axis=ax, keepdims=bool(attrs.get("keepdims", 1)))).astype(x.dtype)
    return run


def _variadic(fn: Callable[[np.ndarray, np.ndarray], np.ndarray]) -> Callable[..., np.ndarray]:
    def run(attrs: dict[str, Any], ins: list[np.ndarray]) -> np.ndarray:
        _bcast(*ins)
        acc = ins[0]
        for x in ins[1:]:
            acc = fn(acc, x)
        return np.asarray(acc).astype(ins[0].dtype)
    return run


_FOLDERS: dict[str, Callable[[dict[str, Any], list[Any]], np.ndarray]] = {
    "Identity": lambda attrs, ins: ins[0], "Cast": _cast, "Unsqueeze": _unsqueeze, "Squeeze": _squeeze,
    "Reshape": _reshape, "Flatten": _flatten, "Concat": _concat, "Gather": _gather, "GatherElements": _gather_elements, "GatherND": _gather_nd, "Slice": _slice,
    "Where": _where, "ConstantOfShape": _constant_of_shape, "Expand": _expand, "Tile": _tile,
    "Range": _range, "MatMul": _matmul, "Trilu": _trilu,
    "Transpose": lambda attrs, ins: np.transpose(ins[0], attrs.get("perm")),
    "Add": _binary(np.add), "Sub": _binary(np.subtract), "Mul": _binary(np.multiply), "Div": _binary(_div),
    "Pow": _binary(np.power), "Mod": lambda attrs, ins: _binary(np.fmod if attrs.get("fmod") else np.mod)(attrs, ins),
    "Equal": _binary(np.equal, False), "Less": _binary(np.less, False), "Greater": _binary(np.greater, False),
    "LessOrEqual": _binary(np.less_equal, False), "GreaterOrEqual": _binary(np.greater_equal, False),
    "And": _binary(np.logical_and, False), "Or": _binary(np.logical_or, False),
    "Xor": _binary(np.logical_xor, False), "Not": lambda attrs, ins: np.logical_not(ins[0]),
    "Max": _variadic(np.maximum), "Min": _variadic(np.minimum),
    "Neg": _unary(np.negative), "Abs": _unary(np.abs), "Sqrt": _unary(np.sqrt), "Exp": _unary(np.exp),
    "Log": _unary(np.log), "Cos": _unary(np.cos), "Sin": _unary(np.sin), "Tanh": _unary(np.tanh),
    "Reciprocal": _unary(np.reciprocal), "Floor": _unary(np.floor), "Ceil": _unary(np.ceil),
    "Sigmoid": _unary(lambda x: 1.0 / (1.0 + np.exp(-x))),
    "ReduceSum": _reduce(np.sum), "ReduceProd": _reduce(np.prod), "ReduceMax": _reduce(np.max),
    "ReduceMin": _reduce(np.min), "ReduceMean": _reduce(np.mean),
}
FOLDABLE_OPS: frozenset[str] = frozenset([*_FOLDERS, "Shape", "Size"])


def evaluate(op: str, attrs: dict[str, Any], ins: list[np.ndarray | None]) -> np.ndarray:
    """``op`` evaluated in numpy on ``ins`` (the folding rules above: bounded, raises ``_TooBig`` /
    ``ValueError`` / ``IndexError`` ... when it cannot be evaluated); ``op`` must be in ``FOLDABLE_OPS``
    and not ``Shape``/``Size``."""
    with np.errstate(all="ignore"):
        return np.asarray(_FOLDERS[op](attrs, ins))


# ---------------------------------------------------------------------------- the passes
def _static_shapes(m: Any) -> dict[str, tuple[int, ...]]:
    out: dict[str, tuple[int, ...]] = {}
    for vi in [*m.graph.input, *m.graph.output, *m.graph.value_info]:
        tt = vi.type.tensor_type
        if vi.type.HasField("tensor_type") and tt.HasField("shape") and all(
                d.HasField("dim_value") for d in tt.shape.dim):
            out[vi.name] = tuple(int(d.dim_value) for d in tt.shape.dim)
    for t in m.graph.initializer:
        out[t.name] = tuple(int(d) for d in t.dims)
    return out


def _evaluate(node: Any, consts: ConstTable, shapes: dict[str, tuple[int, ...]]) -> np.ndarray | None:
    """The value of ``node``'s output, or None if it is not a constant-only node. Raises _TooBig,
    ValueError, ... when it is one but cannot be evaluated."""
    from onnx import helper

    op, ins = node.op_type, [t for t in node.input]
    attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    if op in ("Shape", "Size"):
        if not ins or ins[0] not in shapes:
            return None
        s = shapes[ins[0]]
        if op == "Size":
            return np.asarray(math.prod(s), np.int64)
        r = len(s)
        lo, hi = int(attrs.get("start", 0)), int(attrs.get("end", r))
        return np.asarray(s[max(lo + r if lo < 0 else lo, 0):max(hi + r if hi < 0 else hi, 0)], np.int64)
    if not any(ins) or not all(t in consts for t in ins if t):
        return None
    for t in ins:
        if t:
            _room(consts.shape(t))   # an input too large to fold: refuse before reading it
    with np.errstate(all="ignore"):
        return np.asarray(_FOLDERS[op](attrs, [consts[t] if t else None for t in ins]))


def _fold_pass(m: Any, consts: ConstTable, folded: list[str], unfolded: dict[int, str]) -> bool:
    from onnx import helper, numpy_helper

    shapes = _static_shapes(m)
    changed = False
    for i, node in enumerate(m.graph.node):
        if node.op_type not in FOLDABLE_OPS or node.domain not in ("", "ai.onnx") or len(node.output) != 1 \
                or not node.output[0] or i in unfolded:
            continue
        label = f"{i}:{node.op_type}:{node.name or '-'}"
        try:
            value = _evaluate(node, consts, shapes)
            if value is None:
                continue
            tensor = numpy_helper.from_array(value)
        except (_TooBig, ValueError, TypeError, IndexError, KeyError, OverflowError, ZeroDivisionError) as e:
            unfolded[i] = f"{label}: {e}"
            log.info("not folded: %s: %s", label, e)
            continue
        # turned into a Constant in place: its name and output stay byte for byte what the file had
        del node.input[:]
        del node.attribute[:]
        node.op_type, node.domain = "Constant", ""
        node.attribute.append(helper.make_attribute("value", tensor))
        consts.set(node.output[0], value)
        folded.append(label)
        changed = True
    return changed


def _drop_empty_pieces(m: Any, consts: ConstTable, folded: list[str]) -> bool:
    """Concat inputs that are empty along the axis (static shapes) dropped while another is left
    (Phi-3's ``cat([rotated, q[..., rotary_dim:]])`` with the full head rotated; with one left the
    Concat becomes an ``Identity``); a node whose output
    nobody reads any more and is empty becomes a ``Constant`` of that empty value in place (reported
    as folded). True when something changed."""
    from onnx import helper, numpy_helper

    shapes = _static_shapes(m)
    changed = False
    for node in m.graph.node:
        if node.op_type != "Concat" or node.domain not in ("", "ai.onnx"):
            continue
        axis = next((int(helper.get_attribute_value(a)) for a in node.attribute if a.name == "axis"), 0)
        keep = [t for t in node.input if not (t in shapes and shapes[t] and 0 in shapes[t]
                                               and shapes[t][axis] == 0)]
        if keep and len(keep) < len(node.input):
            del node.input[:]
            node.input.extend(keep)
            if len(keep) == 1:   # one piece left: the value itself
                del node.attribute[:]
                node.op_type = "Identity"
            changed = True
    if not changed:
        return False
    read = {t for n in m.graph.node for t in n.input} | {o.name for o in m.graph.output}
    elem = {vi.name: vi.type.tensor_type.elem_type for vi in m.graph.value_info}
    for i, node in enumerate(m.graph.node):
        out = node.output[0] if len(node.output) == 1 else ""
        if not out or out in read or node.op_type == "Constant" or 0 not in shapes.get(out, (1,)) \
                or out not in elem:
            continue
        value = np.zeros(shapes[out], helper.tensor_dtype_to_np_dtype(elem[out]))
        del node.input[:]
        del node.attribute[:]
        node.op_type, node.domain = "Constant", ""
        node.attribute.append(helper.make_attribute("value", numpy_helper.from_array(value)))
        consts.set(out, value)
        folded.append(f"{i}:empty:{node.name or '-'}")
    return True


def fold_and_infer(model: Any, consts: ConstTable) -> tuple[Any, FoldReport]:
    """Inferred copy of ``model`` with its constant-only nodes folded; see the module docstring."""
    m = infer(model)
    folded: list[str] = []
    unfolded: dict[int, str] = {}
    for _ in range(MAX_ROUNDS):
        if not _fold_pass(m, consts, folded, unfolded):
            break
        m = infer(m)
    if _drop_empty_pieces(m, consts, folded):
        m = infer(m)
    if folded:
        log.info("folded %d constant-only nodes", len(folded))
    return m, FoldReport(folded=tuple(folded), unfolded=tuple(unfolded[i] for i in sorted(unfolded)))
