"""Helpers of the PyTorch importers: dtype names, fx node metadata, shapes and source locations.

Re-exported by :mod:`stitchtune.importers.torch_aten` (whose walker uses them all).
"""

from __future__ import annotations

import operator
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np


# ---------------------------------------------------------------------------- fx graphs
def fx_args(node: Any) -> list[Any]:
    """The fx nodes ``node`` reads (its args and kwargs, nested containers included), in order."""
    import torch.fx

    out: list[Any] = []
    torch.fx.node.map_arg((node.args, node.kwargs), out.append)
    return out


def data_args(node: Any) -> list[Any]:
    """The fx nodes ``node`` reads as values: :func:`fx_args`, but of an ``index`` only its source (its
    indices are constants the importers resolve at import time)."""
    args = fx_args(node)
    return args[:1] if node.op == "call_function" and op_key(node.target) == "aten.index" else args


# ---------------------------------------------------------------------------- dtypes
_TORCH_DTYPES = {"float32": "float32", "float16": "float16", "bfloat16": "bfloat16"}


def torch_dtype_name(dt: Any) -> str | None:
    """``torch.float32`` -> ``"float32"``; None for dtypes graph.json does not have as inputs of an
    imported function (bool is a value dtype only, see :func:`value_dtype_name`)."""
    return _TORCH_DTYPES.get(str(dt).removeprefix("torch."))


def value_dtype_name(dt: Any) -> str | None:
    """:func:`torch_dtype_name`, plus ``torch.bool`` -> ``"bool"`` (masks inside a graph)."""
    return "bool" if str(dt) == "torch.bool" else torch_dtype_name(dt)


def is_scalar64(val: Any) -> bool:
    """Whether ``val`` is a 0-d float64 tensor: a framework's float scalar (dynamo's unspecialised
    Python float, ``eps``, ``math.pi``; rotary's ``attention_scaling``) or float64 arithmetic on such
    scalars. A region reads one as a ``float64`` graph input that its kernels load rounded to float32,
    and computes on it in float32 (:func:`_meta` maps its dtype to ``float32``)."""
    return str(getattr(val, "dtype", "")) == "torch.float64" and len(getattr(val, "shape", (0,))) == 0


def index_dtype_name(dt: Any) -> str | None:
    """``torch.int64`` -> ``"int64"`` (and int32): the dtypes of gather indices (``embedding``'s ids)."""
    name = str(dt).removeprefix("torch.")
    return name if name in ("int32", "int64") else None


def _to_numpy(t: Any, dtype: str) -> np.ndarray:
    import torch

    from stitchtune.graph.reference import numpy_dtype

    return t.detach().to(torch.float32).cpu().numpy().astype(numpy_dtype(dtype))


def _where(node: Any) -> str:
    """The innermost source location of an fx node outside PyTorch itself (else the innermost one)."""
    import torch

    torch_dir = str(Path(torch.__file__).parent)
    st = node.meta.get("stack_trace") or ""
    lines = [ln for ln in st.strip().splitlines() if ln.strip()]
    frames = []
    for i, ln in enumerate(lines):
        ln = ln.strip()
        if ln.startswith("File "):
            code = lines[i + 1].strip() if i + 1 < len(lines) and not lines[i + 1].strip().startswith("File ") else ""
            loc = ln.split(", in ")[0].replace("File ", "").replace('"', "").replace(", line ", ":")
            frames.append((loc, code))
    if not frames:
        return f"graph node {node.name!a} (no source location recorded)"
    user = [f for f in frames if not f[0].startswith(torch_dir)]
    loc, code = (user or frames)[-1]
    return f"{loc} ({code})" if code else loc


def _meta(node: Any) -> tuple[tuple[int, ...], str | None]:
    val = node.meta.get("val")
    if val is None:
        tm = node.meta.get("tensor_meta")
        if tm is None:
            return (), None
        return tuple(int(d) for d in tm.shape), value_dtype_name(tm.dtype)
    if is_scalar64(val):   # float64 scalar arithmetic is computed in float32 in a region
        return (), "float32"
    return tuple(int(d) for d in val.shape), value_dtype_name(val.dtype)


def _strip1(shape: Sequence[int]) -> tuple[int, ...]:
    s = list(shape)
    while s and s[0] == 1:
        s.pop(0)
    return tuple(s)


def _fits(g: Sequence[int], t: Sequence[int]) -> bool:
    """True if a value of graph shape ``g`` broadcasts (numpy) to the PyTorch shape ``t``."""
    g = list(g)
    while len(g) > len(t) and g[0] == 1:
        g.pop(0)
    if len(g) > len(t):
        return False
    return all(gd in (1, td) for gd, td in zip(reversed(g), reversed(t)))


def _bind(node: Any) -> dict[str, Any]:
    """Schema argument name -> value (positional, keyword or default)."""
    schema = node.target._schema
    out: dict[str, Any] = {}
    for i, a in enumerate(schema.arguments):
        if i < len(node.args):
            out[a.name] = node.args[i]
        elif a.name in node.kwargs:
            out[a.name] = node.kwargs[a.name]
        elif a.has_default_value():
            out[a.name] = a.default_value
        else:
            out[a.name] = None
    return out


def op_key(target: Any) -> str:
    """An fx target's op name without its overload (``torch.ops.aten.add.Tensor`` -> ``aten.add``)."""
    s = str(target)
    return s.rsplit(".", 1)[0] if s.count(".") >= 2 else s


_key = op_key   # the importers' short name


def zero_pad(node: Any) -> bool:
    """Whether fx node ``node`` is a ``constant_pad_nd`` that pads nothing (every pad 0: Swin's
    ``maybe_pad`` where the windows tile the image): the value of its input, unchanged."""
    if getattr(node, "op", None) != "call_function" or op_key(node.target) != "aten.constant_pad_nd":
        return False
    pad = node.args[1] if len(node.args) > 1 else node.kwargs.get("pad")
    return isinstance(pad, (list, tuple)) and all(isinstance(p, int) and p == 0 for p in pad)


#: ATen ops that return their input cut into parts along one dim (``chunk`` is ``split`` in ATen graphs)
_SPLITS = ("aten.split", "aten.split_with_sizes")


def _split_bounds(node: Any) -> list[tuple[int, int]] | None:
    """``[(start, end)]`` of each part of a ``split`` / ``split_with_sizes`` node along its dim, or None
    when the split dim or a size is symbolic or the node is not such a split (other dims may be
    symbolic: GPT-2's ``c_attn`` output ``[1, s, 192]`` cut along its last dim in a prompt graph)."""
    if getattr(node, "op", None) != "call_function" or op_key(node.target) not in _SPLITS \
            or not hasattr(node.target, "_schema"):
        return None
    a = _bind(node)
    val, dim = a["self"].meta.get("val"), a.get("dim", 0)
    if val is None or not isinstance(dim, int) or val.dim() == 0 or not isinstance(val.shape[dim % val.dim()], int):
        return None
    n = val.shape[dim % val.dim()]
    sizes = a.get("split_size") if "split_size" in a else a.get("split_sizes")
    if isinstance(sizes, int):
        if sizes <= 0:
            return None
        sizes = [min(sizes, n - i) for i in range(0, n, sizes)] or [0]
    if not isinstance(sizes, (list, tuple)) or not all(isinstance(s, int) and s >= 0 for s in sizes) \
            or sum(sizes) != n:
        return None
    starts = [sum(sizes[:i]) for i in range(len(sizes))]
    return [(s, s + k) for s, k in zip(starts, sizes)]


def graph_copy(gm: Any) -> Any:
    """A new ``torch.fx.Graph`` with ``gm``'s nodes, its output node's meta included (to edit and
    wrap as a new GraphModule while ``gm`` stays as it was)."""
    import torch.fx

    graph = torch.fx.Graph()
    copied: Any = graph.graph_copy(gm.graph, {}, return_output_node=True)
    out, old_output = copied
    graph.output(out).meta = dict(old_output.meta)
    return graph


def fake_mode_of(gm: Any) -> Any | None:
    """The fake tensor mode of ``gm``'s node values (dynamo's, holding its shape env), or None where no
    node carries a tensor value (a pass that makes new fake values needs it)."""
    import torch
    from torch._guards import detect_fake_mode

    return detect_fake_mode([n.meta.get("val") for n in gm.graph.nodes if isinstance(n.meta.get("val"), torch.Tensor)])


def splits_as_slices(gm: Any) -> Any | None:
    """A copy of ``gm`` in which each ``split`` / ``split_with_sizes`` of static sizes that only
    ``getitem`` nodes read is one ``aten.slice`` per part read (the same view: same sizes, strides
    and offset), so that the parts' readers may share one region (Phi-3's fused ``qkv_proj`` and
    ``gate_up_proj`` outputs, cut in three and two); None when ``gm`` has no such split. ``gm``
    itself is left as it was."""
    import torch
    import torch.fx

    def wanted(n: Any) -> bool:
        return _split_bounds(n) is not None and bool(n.users) and all(
            u.op == "call_function" and u.target is operator.getitem and isinstance(u.args[1], int) for u in n.users)

    if not any(wanted(n) for n in gm.graph.nodes):
        return None
    graph = graph_copy(gm)
    for split in [n for n in graph.nodes if wanted(n)]:
        bounds = _split_bounds(split)
        assert bounds is not None
        src, dim = _bind(split)["self"], _bind(split).get("dim", 0)
        for item in list(split.users):
            lo, hi = bounds[item.args[1]]
            with graph.inserting_before(item):
                part = graph.call_function(torch.ops.aten.slice.Tensor, (src, dim, lo, hi))
            part.meta = dict(item.meta)
            item.replace_all_uses_with(part)
            graph.erase_node(item)
        graph.erase_node(split)
    return torch.fx.GraphModule(gm, graph)
