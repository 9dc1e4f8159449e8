"""Which nodes of an ATen fx graph may be in a memory-intensive region (for
:mod:`stitchtune.importers.torch_regions`).

* :func:`_initial_exclusions(nodes, consts)`: every ``call_function`` node whose op the importer maps
  (:data:`torch_aten.SUPPORTED_OPS`), with static (or hinted) shapes and float tensors in and out, is a
  candidate; integer tensors only where they are ids (``embedding``), cast (an integer mask) or
  viewed, and constant ``index`` indices; ``full`` only as the base of a ``scatter`` of a number (a
  one-hot: :func:`is_scatter_base`, a number of the graph). Every other node is excluded with a reason (compute op,
  windowed pooling op, no graph.json equivalent, dynamic shape, dtype); constants, assertions and
  dead calls (nothing reads them, they mutate nothing) silently. An in-place op is a candidate as its
  functional form when its mutation is unobservable (:func:`~stitchtune.importers.torch_cnn.inplace_reason`).
* ``stitchtune::rand`` (dropout's numbers drawn in the region, :mod:`stitchtune.importers.torch_random`)
  is a candidate and its seed (a view of Inductor's seeds) a silent input; ``aten.rand`` is not, and a
  comparison of its numbers (or of a draw left out of every region) stays with Inductor, which draws
  them in the kernel that compares them.
* Bool chains of graph inputs and constants (a padding mask's cast, ``index``, ``&``, ``where``) are
  *pulled*: not grouped, but computed again by every region that reads them; so are float chains of
  values from outside every region that only broadcast into larger tensors (the rotary angles:
  :func:`_pull_broadcast_sources`); so are constant tensors that the importer maps (a causal mask's
  ``iota``, ``le`` and ``& True``, float positions), except indices resolved at import time and
  embedding ids (:func:`_pull_constants`; a region the planner then refuses is mapped again reading
  them as inputs, ``torch_regions._map_with_constants``).
"""

from __future__ import annotations

import operator
from collections.abc import Mapping, Sequence
from typing import Any

from stitchtune.importers.torch_aten import (_BINARY, _IGNORED, _IOTA, _UNARY, INT_OPS, RAND_KEY, SUPPORTED_OPS, _key,
                                             index_dtype_name, value_dtype_name)
from stitchtune.importers.torch_cnn import WINDOWED_OPS, dead, inplace_reason, is_inplace
from stitchtune.importers.torch_consts import resolved_index
from stitchtune.importers.torch_fx_util import data_args, fx_args, is_scalar64, zero_pad
from stitchtune.importers.torch_index_copy import index_copy_axis, index_copy_index, index_copy_reason, is_overwrite
from stitchtune.importers.torch_scatter import SCATTER_OPS, is_zeros_base, scatter_index, scatter_reason
from stitchtune.importers.torch_symsizes import is_carrier, is_size_arg
from stitchtune.importers.torch_symvalues import is_bound

#: ATen ops that are compute-intensive (matmuls, convolutions, attention): Inductor's or a library's job
COMPUTE_OPS: frozenset[str] = frozenset({
    "aten.mm", "aten.addmm", "aten.bmm", "aten.baddbmm", "aten.matmul", "aten.linear", "aten.convolution",
    "aten.conv2d", "aten.conv1d", "aten.einsum", "aten._scaled_dot_product_flash_attention",
    "aten._scaled_dot_product_flash_attention_for_cpu", "aten._scaled_dot_product_efficient_attention",
    "aten._scaled_dot_product_cudnn_attention", "aten.scaled_dot_product_attention"})



def _hint(d: Any) -> int | None:
    """A static dim, or a symbolic dim's example value (its hint); None when it has none."""
    if isinstance(d, int):
        return d
    try:
        h = d.node.hint
    except AttributeError:
        return None
    return int(h) if h is not None else None


def _is_symint(node: Any) -> bool:
    """Whether the fx node ``node`` is a SymInt (a size read from a symbolic shape)."""
    import torch

    return isinstance(node.meta.get("val"), torch.SymInt)


def _tensor_ok(val: Any, index: bool = False) -> str | None:
    """None for a float tensor with static dims or symbolic dims with hints, else why not
    (``index``: an int32/int64 tensor is fine too, the indices of ``embedding``)."""
    import torch

    if not isinstance(val, torch.Tensor):
        return f"a {type(val).__name__} value, not a tensor"
    if any(_hint(d) is None for d in val.shape):
        return "dynamic shape without an example value (stitched kernels are specialised per shape)"
    if is_scalar64(val):   # a float64 scalar: read as a float64 input, computed on in float32
        return None
    if value_dtype_name(val.dtype) is None and not (index and index_dtype_name(val.dtype)):
        return f"dtype {str(val.dtype).removeprefix('torch.')}"
    return None



_CAST_KEYS = frozenset({"aten.to", "aten._to_copy", "aten.type_as", "prims.convert_element_type"})
#: ops that may read int32/int64 tensors: casts, views of ids, graph.json's int ops (int arithmetic,
#: comparisons, ``where``), and the float ops that read an int tensor as torch does (promoted to float32)
_INT_OK = frozenset({*_CAST_KEYS, "aten.view", "aten.reshape", "aten._unsafe_view",
                     "aten.unsqueeze", "aten.squeeze", "aten.flatten", "aten.alias", "aten.clone",
                     "aten.contiguous", "aten.detach", "aten.expand", *INT_OPS, *_UNARY, *_BINARY, "aten.pow",
                     RAND_KEY})   # (its int64 seed)
#: ops that may produce int32/int64 tensors: views of ints, casts, the int ops, ``arange``, a bool sum
#: views of int tensors (an embedding's ids reshaped): still input indices for graph.json's gather
_VIEWS_OF_INTS = frozenset({"aten.view", "aten.reshape", "aten._unsafe_view", "aten.unsqueeze", "aten.squeeze",
                            "aten.flatten", "aten.alias", "aten.clone", "aten.contiguous", "aten.detach",
                            "aten.expand"})
_INT_VIEWS = frozenset({"aten.view", "aten.reshape", "aten._unsafe_view", "aten.unsqueeze", "aten.squeeze",
                        "aten.flatten", "aten.alias", "aten.clone", "aten.contiguous", "aten.detach", "aten.expand",
                        *_CAST_KEYS, *INT_OPS, *_IOTA, "aten.sum"}) - {"aten.div", "aten.true_divide"}


#: ATen ops that draw random numbers (no graph.json equivalent: Inductor draws them in its kernels)
RANDOM_OPS = frozenset({"aten.rand", "aten.rand_like", "aten.randn", "aten.randn_like", "aten.bernoulli",
                        "aten.native_dropout", "aten.randint", "aten.randint_like"})
_COMPARISONS = frozenset({"aten.gt", "aten.ge", "aten.lt", "aten.le", "aten.eq", "aten.ne"})


#: views whose arguments after the tensor are sizes or bounds: a SymInt there is a size, never a value
_SIZED_VIEWS = frozenset({"aten.slice", "aten.narrow", "aten.select", "aten.view", "aten.reshape",
                          "aten._unsafe_view", "aten.expand", "aten.as_strided"})
#: why such a view with a SymInt size or bound is left to PyTorch (GPT-2's prompt rows ``wpe[0:S]``,
#: :func:`~stitchtune.importers.torch_symvalues.sym_values`): not left out of the computation, it is an input
SYMBOLIC_VIEW = ("a view with a symbolic size or bound (PyTorch makes the view, no kernel; a region that "
                 "reads it takes it as an input)")


#: ATen gathers along an axis (graph.json's ``gather_elements``) -> the position of their index argument
GATHER_INDEX_ARG = {"aten.gather": 2, "aten.take_along_dim": 1}


def _gather_index_view(node: Any) -> bool:
    """Whether ``node`` (a view of an input) makes an integer tensor that a gather along an axis reads as
    its index: the view stays outside the region (PyTorch makes it, no kernel) and the region reads it as
    an input. A view of a computed index (``where(t != ignore, t, 0).unsqueeze(1)``) stays a candidate:
    the region computes the index (a pick's index may be an int register)."""
    val = node.meta.get("val")
    if val is None or getattr(val, "dtype", None) is None or val.dtype.is_floating_point:
        return False
    src = node.args[0] if node.args else None
    if getattr(src, "op", None) == "call_function":   # a computed index (ignore_index's where): in the region
        return False
    return any(_key(u.target) in GATHER_INDEX_ARG and len(u.args) > GATHER_INDEX_ARG[_key(u.target)]
               and u.args[GATHER_INDEX_ARG[_key(u.target)]] is node for u in node.users)


def is_scatter_base(node: Any) -> bool:
    """Whether every reader of ``node`` is a ``scatter`` that reads it as its base (``self``): a
    constant of one value there is a number of the graph (``where(hit, value, base)``)."""
    return bool(node.users) and all(u.op == "call_function" and _key(u.target) == "aten.scatter"
                                    and u.args[0] is node and node not in u.args[1:] for u in node.users)


def _scatter_index_expand(node: Any) -> bool:
    """Whether ``node`` is an ``expand`` of an integer input that a scatter reads as its index (BERT's token types
    under the min-cut partition: the ``[1, S]`` buffer expanded over the batch in the backward graph). Mapped as
    the view of its input, the index would have fewer leading dims than the values; so PyTorch makes the view (a
    region's input is made contiguous) and the region reads the expanded ids, as when the forward saved them."""
    val = node.meta.get("val")
    if _key(node.target) != "aten.expand" or val is None or getattr(val, "dtype", None) is None \
            or val.dtype.is_floating_point:
        return False
    src = node.args[0] if node.args else None
    if getattr(src, "op", None) == "call_function":   # a computed index: the scatter rule below refuses it
        return False
    src_val = getattr(src, "meta", {}).get("val")
    if src_val is not None and tuple(src_val.shape) == tuple(val.shape):   # expands nothing: mapped as a view
        return False
    return any(u.op == "call_function" and _key(u.target) in SCATTER_OPS and scatter_index(u) is node
               and index_copy_axis(u) is None for u in node.users)


def _reject_reason(node: Any, consts: Mapping[Any, Any], order: Mapping[Any, int]) -> str | None:
    """Why ``node`` (a call_function other than getitem) cannot be in a region, or None."""
    key = _key(node.target)
    if key in COMPUTE_OPS:
        return "compute-intensive op (left to Inductor)"
    if key in WINDOWED_OPS:
        return "windowed op (pooling; left to the framework like a convolution)"
    if is_inplace(node):   # as its functional form (torch_subgraph._subgraph copies it in its place)
        why = inplace_reason(node, order, SUPPORTED_OPS)
        if why:
            return why
    elif not hasattr(node.target, "_schema") or (key not in SUPPORTED_OPS and not zero_pad(node)):
        return "no graph.json equivalent yet"
    val = node.meta.get("val")
    if _dtype_view(node):
        return DTYPE_VIEW
    vals = val if isinstance(val, (tuple, list)) else [val]
    for v in vals:
        if v is None:
            continue
        why = _tensor_ok(v, index=key in _INT_VIEWS)
        if why:
            return f"produces {why}"
    if any(_key(u.target) in ("aten.embedding", "aten.index") and node in fx_args(u)[1:] for u in node.users
           if u.op == "call_function") and key not in _VIEWS_OF_INTS:
        return "computes indices (graph.json gathers by input indices only; the framework computes them)"
    ids = node.args[1] if key == "aten.embedding" and len(node.args) > 1 else None
    if key in GATHER_INDEX_ARG and len(node.args) > GATHER_INDEX_ARG[key]:
        ids = node.args[GATHER_INDEX_ARG[key]]
    if key == "aten.scatter" and len(node.args) > 2:   # a one-hot's index (torch_layout._one_hot)
        ids = node.args[2]
    if key in SCATTER_OPS and index_copy_axis(node) is not None:   # a static cache's index copy: its
        ids = index_copy_index(node)                                # position is compared (torch_index_copy)
    elif key in SCATTER_OPS:   # an embedding's gradient (torch_scatter): its index is read as ids
        why = index_copy_reason(node) if is_overwrite(node) else scatter_reason(node)
        if why:
            return why
        ids = scatter_index(node)
    if any(u.op == "call_function" and _key(u.target) in SCATTER_OPS and scatter_index(u) is node
           and index_copy_axis(u) is None for u in node.users) and key not in _VIEWS_OF_INTS:
        return "computes indices (graph.json scatters by input indices only; the framework computes them)"
    if key == "aten.full" and not is_scatter_base(node) and not is_zeros_base(node) \
            and not any(is_size_arg(node, a) for a in fx_args(node)):   # (a symbolic shape: no constant)
        return "a constant tensor (mapped only as the base of a scatter of a number)"
    if key in _INT_VIEWS and _gather_index_view(node):
        return "an index view read by a gather (left to PyTorch: the gather reads it as an input)"
    if _scatter_index_expand(node):
        return "an expanded index read by a scatter (left to PyTorch: the scatter reads it as an input)"
    if key in _SIZED_VIEWS and any(_is_symint(a) for a in fx_args(node)[1:]):
        return SYMBOLIC_VIEW
    folded = set(fx_args(node)) - {node.args[0]} if key == "aten.index" else set()
    for a in fx_args(node):
        if a in folded and a in consts or is_size_arg(node, a):   # (a size: the region reads its carrier)
            continue
        why = _tensor_ok(a.meta.get("val"), index=a is ids or key in _INT_OK)
        if why:
            return f"reads {why}"
    if key in _COMPARISONS and any(a.op == "call_function" and _key(a.target) in RANDOM_OPS for a in fx_args(node)):
        return _RANDOM_COMPARED
    return None


#: why ``Tensor.view(dtype)`` is left to PyTorch: graph.json's views keep values and its casts convert them
DTYPE_VIEW = ("a dtype view (reinterprets the bits as another dtype; graph.json's casts convert values, "
              "so PyTorch makes the view and a region reads or returns the tensor it views)")


def _dtype_view(node: Any) -> bool:
    """Whether ``node`` is ``aten.view.dtype``: an ``aten.view`` whose result has another dtype than
    the tensor it views: the same bytes read as other values, not a shape view."""
    if _key(node.target) != "aten.view" or not node.args or not hasattr(node.args[0], "meta"):
        return False
    got, src = node.meta.get("val"), node.args[0].meta.get("val")
    return hasattr(got, "dtype") and hasattr(src, "dtype") and got.dtype != src.dtype


_RANDOM_COMPARED = ("compares random numbers drawn in the graph (Inductor draws them in the kernel that "
                    "compares them: a 1-byte mask instead of 4-byte numbers handed to a region)")


class _Excluded:
    """Nodes out of every region: ``reasons`` (reported) and ``derived`` (followed a reported one)."""

    def __init__(self) -> None:
        self.reasons: dict[Any, str] = {}
        self.derived: set[Any] = set()
        self.free: dict[Any, str] = {}
        self.pulled: set[Any] = set()   # recomputed by every region that reads them (bool chains)
        self.constants: set[Any] = set()   # the pulled constants (_pull_constants), also in ``derived``
        self.unrolled: set[Any] = set()    # small sums mapped as adds of slices (torch_regions._unrollable)
        self.cuts: set[tuple[Any, Any]] = set()   # (source, reader) edges no group joins (torch_cuts.chain_cut)

    def __contains__(self, node: Any) -> bool:
        return node in self.reasons or node in self.derived or node in self.free or node in self.pulled

    def add(self, node: Any, reason: str, free: bool = False) -> None:
        """Exclude ``node``; a getitem takes its tuple-producing source along, and a source its getitems.
        A ``free`` node (a view or no-op the framework applies for free) is not reported."""
        self.pulled.discard(node)
        if free and node.target is not operator.getitem:
            self.free[node] = reason
            return
        self.reasons[node] = reason
        if node.target is operator.getitem:
            src = node.args[0]
            if src not in self:
                self.add(src, reason)
                self.derived.add(src)
                del self.reasons[src]
        for u in node.users:
            if u.target is operator.getitem and u not in self:
                self.derived.add(u)
        if _key(node.target) == RAND_KEY:   # a draw left out takes its comparisons along (as aten.rand's)
            for u in node.users:
                if u.op == "call_function" and _key(u.target) in _COMPARISONS and u not in self:
                    self.add(u, _RANDOM_COMPARED)


#: int views and copies that stay with the value PyTorch computes (:func:`_leave_int_copies`)
_INT_COPIES = frozenset({"aten.view", "aten._unsafe_view", "aten.reshape", "aten.flatten", "aten.clone",
                         "aten.contiguous", "aten.alias", "aten.detach"})


def _leave_int_copies(nodes: Sequence[Any], ex: _Excluded) -> None:
    """Leave to PyTorch the int views and copies of int values it computes (a node excluded with a
    reason): a language model's shifted labels ``pad(labels)[:, 1:].clone().view(-1)`` reach the loss
    region as one ``[B*S]`` input, held per row, rather than as a copy of the excluded slice inside
    it. Free (not reported): PyTorch makes them with the value they copy."""
    import torch

    for n in nodes:
        if n in ex or n.op != "call_function" or _key(n.target) not in _INT_COPIES:
            continue
        val, src = n.meta.get("val"), n.args[0] if n.args else None
        if isinstance(val, torch.Tensor) and index_dtype_name(val.dtype) is not None \
                and getattr(src, "op", None) == "call_function" and (src in ex.reasons or src in ex.free):
            ex.add(n, "an int copy of a value PyTorch computes", free=True)


#: ops whose float result is computed again by every region that reads it when they read a pulled mask
_PULLED_FLOAT = frozenset({"aten.where", "aten.masked_fill", "aten.to", "aten._to_copy", "aten.type_as",
                           "aten.expand", "aten.view", "aten.unsqueeze", "aten.index"})


def _pull_bool_chains(nodes: Sequence[Any], ex: _Excluded, consts: Mapping[Any, Any]) -> None:
    """Mark the candidates that produce a bool or integer tensor (a mask or index chain), or
    finish such a mask (``where``), and read only graph inputs, constants and other such nodes: every
    region that reads them computes them again (a padding mask's cast, index, ``&`` and ``where``
    feed every layer's softmax). Those that no region reads are grouped as usual (``find_regions``)."""
    import torch

    for n in nodes:
        if n in ex or n.op != "call_function" or n.target is operator.getitem:
            continue
        val = n.meta.get("val")
        if not isinstance(val, torch.Tensor):
            continue
        reads = fx_args(n)
        if val.dtype.is_floating_point and not (_key(n.target) in _PULLED_FLOAT and any(a in ex.pulled for a in reads)):
            continue   # a float result is pulled only where it finishes a pulled mask (``where``)
        if all(a.op == "placeholder" or a in consts or a in ex.pulled for a in reads):
            ex.pulled.add(n)


def _initial_exclusions(nodes: Sequence[Any], consts: Mapping[Any, Any]) -> _Excluded:
    ex = _Excluded()
    order = {n: i for i, n in enumerate(nodes)}
    for n in nodes:
        if n.op != "call_function" or n in consts or _key(n.target) in _IGNORED or is_bound(n) or is_carrier(n):
            ex.derived.add(n)   # constants are inputs (or scalars) of regions; assertions check nothing here;
            # a SymInt's bound tensor or carrier is an input its call makes (torch_symvalues, torch_symsizes)
        elif n.target is operator.getitem:
            if n.args[0] in ex:
                ex.derived.add(n)
        else:
            why = _reject_reason(n, consts, order)
            if why and dead(n):   # nothing reads it and it mutates nothing (make_fx's ``empty``)
                ex.derived.add(n)
            elif why and n.users and all(_key(u.target) == RAND_KEY for u in n.users):
                ex.derived.add(n)   # a draw's seed (a view of the seeds): a region's input, no kernel
            elif why:
                ex.add(n, why)
    _pull_constants(nodes, ex, consts)
    _leave_int_copies(nodes, ex)
    _pull_bool_chains(nodes, ex, consts)
    _pull_broadcast_sources(nodes, ex, consts)
    return ex


def _pull_constants(nodes: Sequence[Any], ex: _Excluded, consts: Mapping[Any, Any]) -> None:
    """Pull the constant tensors (:func:`~stitchtune.importers.torch_consts.fold_constants`) that the
    importer maps from nothing but other such tensors and 0-d constants: a causal mask's ``iota``,
    ``unsqueeze``, ``le`` and ``& True``, a padding mask's ``ge``, the rotary positions ``iota`` cast to
    float. Every region that reads one as data computes it again (int registers, :mod:`stitchtune.plan.ints`),
    rather than reading a tensor that the framework computes in a kernel of its own at each call. The
    indices of an ``index`` stay constants resolved at import time (they are not read as data); a
    constant that no region reads stays out of every region (it remains excluded). Static shapes only:
    a symbolic size is not a constant of the region's graph."""
    import torch

    for n in nodes:
        val = consts.get(n)
        if n.op != "call_function" or n.target is operator.getitem or not isinstance(val, torch.Tensor):
            continue
        key = _key(n.target)
        fake = n.meta.get("val")
        if val.dim() == 0 or key not in SUPPORTED_OPS or key in COMPUTE_OPS or not isinstance(fake, torch.Tensor) \
                or not all(isinstance(d, int) for d in fake.shape) \
                or value_dtype_name(val.dtype) is None and index_dtype_name(val.dtype) is None:
            continue
        if all(resolved_index(u, n, consts) for u in n.users) or any(
                _key(u.target) == "aten.embedding" and u.args[1] is n and not resolved_index(u, n, consts)
                for u in n.users if u.op == "call_function" and len(u.args) > 1):
            continue   # indices resolved at import time (an index's, a range of embedding ids), or
            # embedding ids that a region reads as an input (graph.json gathers by input indices)
        reads = data_args(n)
        if all(a in ex.pulled or a in consts and getattr(consts[a], "dim", lambda: 1)() == 0 for a in reads):
            ex.pulled.add(n)
            ex.constants.add(n)


#: element-wise and view ops whose float result is computed again by every region that reads it
#: when it only broadcasts into larger tensors (:func:`_pull_broadcast_sources`)
_PULLED_SOURCES = frozenset({"aten.mul", "aten.add", "aten.sub", "aten.div", "aten.neg", "aten.cos", "aten.sin",
                             "aten.exp", "aten.reciprocal", "aten.rsqrt", "aten.sqrt", "aten.view",
                             "aten.reshape", "aten._unsafe_view", "aten.unsqueeze", "aten.expand",
                             "aten.clone", "aten.contiguous", "aten.alias", "aten.to", "aten._to_copy",
                             "aten.true_divide", "aten.pow", "prims.convert_element_type"})


def _pull_broadcast_sources(nodes: Sequence[Any], ex: _Excluded, consts: Mapping[Any, Any]) -> None:
    """Pull the float chains that read only values from outside every region (graph inputs,
    constants, excluded or pulled nodes) through element-wise ops and views, and whose results are
    only broadcast into larger tensors (the rotary angles: ``cos`` / ``sin`` of ``positions *
    inv_freq``, ``[1, S, D]``, read by q ``[B, H, S, D]`` and k ``[B, Hkv, S, D]`` of every layer): every
    region that reads them computes them again, so that q's and k's rotary, whose domains differ,
    are two regions rather than one refused group, and no angle tensor goes through memory. A
    training graph also returns the angles (saved for the backward): the first region that computes
    them stores them too (:func:`~stitchtune.importers.torch_regions._store_saved`), the others
    compute them again. A node is pulled only together with every candidate it reads (a ``mul`` of a
    matmul's viewed output and a saved value, concatenated into a larger gradient, is not: its
    ``view`` is a region's node, which no other region could read)."""
    import torch

    def numel(n: Any) -> int:   # from the dims' hints: no guard on a symbolic size
        val = n.meta.get("val")
        if not isinstance(val, torch.Tensor):
            return 0
        out = 1
        for d in val.shape:
            out *= _hint(d) or 1
        return out

    cand: list[Any] = []
    for n in nodes:
        if n in ex or n.op != "call_function" or _key(n.target) not in _PULLED_SOURCES:
            continue
        val = n.meta.get("val")
        if not isinstance(val, torch.Tensor) or not val.dtype.is_floating_point:
            continue
        if all(a.op == "placeholder" or a in consts or a in ex or a in cand for a in fx_args(n)):
            cand.append(n)
    kept = set(cand)
    for n in reversed(cand):   # users first: a pulled node only broadcasts into larger readers
        users = [u for u in n.users if u.op != "output"]   # (saved for the backward: PyTorch's copy)
        if not users or any(u not in kept and (u in ex or numel(u) <= numel(n)) for u in users):
            kept.discard(n)
    for n in cand:   # (graph order) only with every candidate it reads: a chain of values from outside
        if any(a in cand and a not in kept for a in fx_args(n)):   # every region, never a region's node
            kept.discard(n)
    ex.pulled.update(kept)


