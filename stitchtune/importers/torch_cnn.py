"""ATen ops of convolutional networks (ResNet-style blocks) for :mod:`stitchtune.importers.torch_aten`.

* Eval-mode batch norm (``batch_norm``, ``native_batch_norm`` and
  ``_native_batch_norm_legit_no_training`` with running statistics): ``y = (x - mean) * rsqrt(var +
  eps) [* weight] [+ bias]`` over channel axis 1; the per-channel ``[C]`` vectors are reshaped to
  ``[C, 1, ..., 1]`` so that they broadcast along the spatial axes (a middle-axis broadcast). The
  ``native`` forms return ``(y, None, None)``: their saved statistics are empty in eval mode.
* ``var_mean`` with ``keepdim=True`` (training-mode batch norm's statistics as Inductor's decompositions
  leave them): ``mean`` then the mean of the centred squares, times ``n / (n - correction)``; both
  reductions over the same axes, so the normalisation, ReLU and running-statistics updates that read
  them join one region.
* ``adaptive_avg_pool2d`` (and ``_adaptive_avg_pool2d``) to 1x1 is ``reduce_mean`` over H and W with
  keepdims; a spatial dim whose output size equals its input size is kept (size 1 of size 1 too).
  Any other output size is a windowed average: refused with that reason.
* In-place ops (``add_``, ``mul_``, ``relu_``, ...) are their functional form when the mutation is
  not observable (:func:`inplace_problem`): non-strict ``torch.export`` keeps them in its graph
  (it does not functionalise intermediates), so a mutated value read later would be silently wrong.
* Pooling ops with windows (:data:`WINDOWED_OPS`) are the framework's, like convolutions.

Every problem raises :class:`~stitchtune.importers.builder.ImportError_` naming the op and its
source location.
"""

from __future__ import annotations

import operator
from collections.abc import Mapping
from typing import Any

from stitchtune.importers.builder import ImportError_, Value, scalar

__all__ = ["CNN_OPS", "WINDOWED_OPS", "dead", "functional_of", "inplace_problem", "inplace_reason", "is_inplace",
           "map_cnn_op"]

#: eval-mode batch norm: ``batch_norm`` returns ``y``; the ``native`` forms ``(y, mean, rstd)``
BATCH_NORM_OPS: frozenset[str] = frozenset({"aten.batch_norm", "aten.native_batch_norm",
                                            "aten._native_batch_norm_legit_no_training"})
#: adaptive average pooling, mapped when every spatial output size is 1 or the input's size
POOL_MEAN_OPS: frozenset[str] = frozenset({"aten.adaptive_avg_pool2d", "aten._adaptive_avg_pool2d"})
#: the ops :func:`map_cnn_op` maps (``torch_aten.SUPPORTED_OPS`` has them)
CNN_OPS: frozenset[str] = BATCH_NORM_OPS | POOL_MEAN_OPS | {"aten.var_mean"}
#: pooling over windows: no graph.json equivalent, left to the framework like a convolution
WINDOWED_OPS: frozenset[str] = frozenset({
    "aten.max_pool1d", "aten.max_pool2d", "aten.max_pool3d", "aten.max_pool2d_with_indices",
    "aten.max_pool3d_with_indices", "aten.avg_pool1d", "aten.avg_pool2d", "aten.avg_pool3d",
    "aten.adaptive_max_pool1d", "aten.adaptive_max_pool2d", "aten.adaptive_max_pool3d",
    "aten.adaptive_avg_pool3d", "aten.max_unpool2d", "aten.max_unpool3d"})


def _where(node: Any) -> str:
    from stitchtune.importers.torch_fx_util import _where as where

    return where(node)


def dead(node: Any) -> bool:
    """True for a call nothing reads that mutates nothing (``make_fx`` keeps e.g. batch norm's
    ``empty`` reserve tensors and ``detach`` calls): skipped, whatever its op."""
    schema = getattr(node.target, "_schema", None)
    return node.op == "call_function" and not node.users and schema is not None and not schema.is_mutable


def map_cnn_op(w: Any, node: Any, key: str, a: dict[str, Any]) -> Any:
    """The graph value(s) of a :data:`BATCH_NORM_OPS` or :data:`POOL_MEAN_OPS` node; ``w`` is the
    :class:`~stitchtune.importers.torch_aten._Walker` (its builder ``w.b`` and value helpers)."""
    if key in BATCH_NORM_OPS:
        y = _batch_norm(w, node, a)
        return y if key == "aten.batch_norm" else (y, None, None)
    if key == "aten.var_mean":
        return _var_mean(w, node, a)
    return _pool_mean(w, node, a)


def _var_mean(w: Any, node: Any, a: dict[str, Any]) -> tuple[Value, Value]:
    """``(var, mean)`` over ``dim`` (all axes when None) with ``keepdim=True``."""
    import math

    b, name, x = w.b, node.name, a["self"]
    if not a.get("keepdim"):
        raise ImportError_(f"{node.target} at {_where(node)}: var_mean without keepdim=True is not supported")
    axes = w.axes(x, a.get("dim"), node)
    t = w.tshape(x)
    dims = a.get("dim")
    dims = range(len(t)) if dims is None or dims == [] else ([dims] if isinstance(dims, int) else dims)
    n = math.prod(t[d] for d in dims)
    corr = a.get("correction")   # the ``dim`` overload says ``unbiased`` instead
    corr = float(a.get("unbiased", True)) if corr is None else float(corr)
    if n - corr <= 0:
        raise ImportError_(f"{node.target} at {_where(node)}: {n} value(s) with correction {corr}")
    v = w.val(x, node)
    mean = b.reduce("reduce_mean", v, axes, True, f"{name}_mean")
    xc = b.binary("sub", v, mean, f"{name}_xc")
    var = b.reduce("reduce_mean", b.binary("mul", xc, xc, f"{name}_sq"), axes, True,
                   f"{name}_msq" if corr else f"{name}_var")
    if corr:
        var = b.binary("mul", var, scalar(n / (n - corr)), f"{name}_var")
    return var, mean


def _batch_norm(w: Any, node: Any, a: dict[str, Any]) -> Value:
    b, name = w.b, node.name
    x = a["input"]
    if a.get("training") or a.get("running_mean") is None or a.get("running_var") is None:
        raise ImportError_(f"{node.target} at {_where(node)}: batch norm with batch statistics (training "
                           "mode, or no running statistics) is not supported (call .eval() first)")
    t = w.tshape(x)
    if not 2 <= len(t) <= 4:
        raise ImportError_(f"{node.target} at {_where(node)}: input of rank {len(t)} (N, C and up to two "
                           "more axes are supported)")
    frame = (t[1],) + (1,) * (len(t) - 2)   # broadcasts along the axes after the channel axis

    def channel(arg: Any, part: str) -> Value:
        v = w.exact(arg, node)
        if tuple(v.shape) != (t[1],):
            raise ImportError_(f"{node.target} at {_where(node)}: {part} has shape {list(v.shape)}, not "
                               f"[{t[1]}] (one value per channel)")
        return v

    mean, var = channel(a["running_mean"], "running_mean"), channel(a["running_var"], "running_var")
    weight = None if a.get("weight") is None else channel(a["weight"], "weight")
    bias = None if a.get("bias") is None else channel(a["bias"], "bias")
    rstd = b.unary("rsqrt", b.binary("add", var, scalar(float(a["eps"])), f"{name}_ve"), f"{name}_rstd")
    scale = rstd if weight is None else b.binary("mul", rstd, weight, f"{name}_scale")

    def framed(v: Value, part: str) -> Value:
        if len(frame) == 1:
            return v
        return b.layout("reshape", [v], frame, str(v.dtype), f"{name}_{part}", shape=list(frame))

    v = w.val(x, node)
    xc = b.binary("sub", v, framed(mean, "mean_c"), f"{name}_xc")
    y = b.binary("mul", xc, framed(scale, "scale_c"), name if bias is None else f"{name}_xn")
    if bias is not None:
        y = b.binary("add", y, framed(bias, "bias_c"), name)
    return b.cast(y, str(v.dtype), f"{name}_out")   # PyTorch: the input's dtype


def _pool_mean(w: Any, node: Any, a: dict[str, Any]) -> Value:
    x = a["self"]
    t = w.tshape(x)
    size = [int(s) for s in a["output_size"]]
    if len(t) not in (3, 4) or len(size) != 2:
        raise ImportError_(f"{node.target} at {_where(node)}: input of rank {len(t)} (C, H, W or N, C, H, W "
                           "with a 2-d output size are supported)")
    axes = []
    for d, (n_in, n_out) in zip((-2, -1), zip(t[-2:], size)):
        if n_out == 1 and n_in != 1:
            axes.append(d)
        elif n_out != n_in:
            raise ImportError_(f"{node.target} at {_where(node)}: output size {size} of a {list(t[-2:])} "
                               "input is a windowed average; only 1x1 (a mean over H and W) is supported")
    v = w.val(x, node)
    if not axes:
        return v
    return w.b.reduce("reduce_mean", v, w.axes(x, axes, node), True, node.name)


# ---------------------------------------------------------------------------- in-place ops
def is_inplace(node: Any) -> bool:
    """True for an ATen in-place op (``add_``, not the dunder ``__and__``)."""
    name = getattr(getattr(node.target, "_schema", None), "name", "")
    return node.op == "call_function" and name.endswith("_") and not name.endswith("__")


def functional_of(target: Any) -> Any:
    """The functional overload of an in-place ATen overload (``add_.Tensor`` -> ``add.Tensor``), or None."""
    import torch

    schema = target._schema
    packet = getattr(torch.ops.aten, schema.name.split("::")[-1][:-1], None)
    return getattr(packet, schema.overload_name or "default", None) if packet is not None else None


def _aliases(node: Any) -> bool:
    """True when ``node``'s result may share storage with an argument (a view, an in-place op)."""
    schema = getattr(node.target, "_schema", None)
    return schema is None or any(r.alias_info is not None for r in schema.returns)


def _fresh(node: Any) -> bool:
    """True when ``node`` is a call whose result is a new tensor (not a graph input, not a view)."""
    if node.op != "call_function":
        return False
    return not _aliases(node.args[0] if node.target is operator.getitem else node)


def inplace_problem(node: Any, order: Mapping[Any, int]) -> str | None:
    """None when in-place ``node`` may be read as its functional form: the tensor it mutates (through
    a chain of in-place ops) is a fresh intermediate, and neither it nor any view or in-place result
    of it is read after ``node``; else why not. ``order``: fx node -> position in its graph."""
    t = node.args[0] if node.args else None
    while t is not None and hasattr(t, "op") and is_inplace(t):
        t = t.args[0]
    if t is None or not hasattr(t, "op") or not _fresh(t):
        return "mutates a graph input or a view of another tensor (graph.json graphs are pure)"
    same, todo = {t}, [t]   # every node whose value is (a view of) the mutated tensor
    while todo:
        for u in todo.pop().users:
            if u is not node and u not in same and u.op == "call_function" and _aliases(u):
                same.add(u)
                todo.append(u)
    for c in same:
        if any(order[u] > order[node] for u in c.users if u is not node):
            return f"mutates {t.name!a}, which is read afterwards (graph.json graphs are pure)"
    return None


def inplace_reason(node: Any, order: Mapping[Any, int], supported: frozenset[str]) -> str | None:
    """Why in-place ``node`` cannot be in a region of the region finder as its functional form (the
    op must be in ``supported``, the mutation unobservable, every tensor of one dtype), or None."""
    fn = functional_of(node.target)
    if fn is None or str(fn).rsplit(".", 1)[0] not in supported:
        return "no graph.json equivalent yet"
    why = inplace_problem(node, order)
    if why:
        return f"in-place op that {why}"
    dt = getattr(node.meta.get("val"), "dtype", None)
    if any(getattr(a.meta.get("val"), "dtype", dt) != dt for a in node.all_input_nodes):
        return "in-place op on tensors of different dtypes (its functional form would promote)"
    return None
