"""PyTorch import, layout and index ops: the ATen ops that move elements, mapped onto graph.json ops.

:class:`LayoutOps` is the part of :class:`~stitchtune.importers.torch_aten._Walker` (its base class) that
maps the ops of :data:`_LAYOUT` and reads values at exactly PyTorch's shape (``exact``, ``_reframe``);
it uses the walker's builder ``b``, ``vals``, ``val`` and ``tshape``. Every problem raises
:class:`~stitchtune.importers.builder.ImportError_` naming the op and its source location.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from stitchtune.importers.builder import GraphBuilder, ImportError_, Value, scalar
from stitchtune.importers.torch_fx_util import _fits, _meta, _strip1, _where

#: ops that move elements, mapped onto graph.json's layout and index ops (``transpose``, ``concat``,
#: ``slice``, ``gather``; the element-moving views of :data:`_VIEWS` become ``reshape``)
_LAYOUT = {"aten.transpose": "transpose", "aten.permute": "transpose", "aten.t": "transpose",
           "aten.cat": "concat", "aten.concat": "concat", "aten.slice": "slice", "aten.select": "slice",
           "aten.embedding": "gather", "aten.index": "index", "aten.gather": "gather_elements",
           "aten.take_along_dim": "gather_elements", "aten.slice_scatter": "slice_scatter",
           "aten.scatter": "one_hot"}


def _bounds(node: Any, a: dict[str, Any], n: int) -> tuple[int, int]:
    """``(start, end)`` of a ``slice`` / ``slice_scatter`` over a dim of size ``n``, clamped as PyTorch
    does (negative bounds count from the end); a step other than 1 raises."""
    if (a.get("step") or 1) != 1:
        raise ImportError_(f"{node.target} at {_where(node)}: slice step {a['step']} (graph.json slices "
                           "have step 1)")
    start = 0 if a.get("start") is None else int(a["start"])
    stop = n if a.get("end") is None else int(a["end"])
    return min(max(start + n if start < 0 else start, 0), n), min(max(stop + n if stop < 0 else stop, 0), n)


@dataclass(frozen=True)
class Padded:
    """A slice scattered into zeros (``slice_scatter(full(shape, 0), src, dim, lo, hi)``): ``shape``
    with each part ``(lo, hi, value)`` along ``dim`` and zeros elsewhere. Not a graph value: only an
    ``add`` reads it (:meth:`LayoutOps.add_padded`), any other reader refuses it."""

    shape: tuple[int, ...]
    dim: int
    parts: tuple[tuple[int, int, Value], ...]
    dtype: str


@dataclass(frozen=True)
class Empty:
    """A slice with no elements (``shape`` has a 0: the gradient of Phi-3's ``q_pass`` where the rotary
    covers the whole head). Not a graph value: a ``concat`` leaves it out and a ``slice_scatter``
    scatters nothing (:meth:`LayoutOps._slice_scatter`); any other reader refuses it."""

    shape: tuple[int, ...]


class LayoutOps:
    """The layout and index ops of the ATen walker (mixin of ``torch_aten._Walker``)."""

    b: GraphBuilder
    vals: dict[str, Any]
    _exact: dict[str, Value]
    #: a ``reshape`` node's value -> the value it reshapes (a view back to that shape is that value)
    _reshaped: dict[str, Value]

    def tshape(self, n: Any) -> tuple[int, ...]:  # provided by the walker
        raise NotImplementedError

    def val(self, x: Any, node: Any) -> Value:  # provided by the walker
        raise NotImplementedError

    def _layout_shape(self, node: Any, shape: Sequence[int]) -> tuple[int, ...]:
        from stitchtune.graph.checks import MAX_RANK

        shape = tuple(int(d) for d in shape)
        if not 1 <= len(shape) <= MAX_RANK or min(shape) < 1:
            raise ImportError_(f"{node.target} at {_where(node)}: a tensor of shape {list(shape)} (graph.json "
                               f"tensors have rank 1..{MAX_RANK} and positive dims)")
        return shape

    def exact(self, x: Any, node: Any) -> Value:
        """The value of fx node ``x`` at exactly PyTorch's shape (a ``reshape`` of the same elements when
        its graph shape differs in unit axes, an ``expand`` of a broadcast view)."""
        v = self.val(x, node)
        if v.is_scalar:
            raise ImportError_(f"{node.target} at {_where(node)}: a constant tensor argument is not supported")
        t = self.tshape(x)
        if tuple(v.shape) == t:
            return v
        if math.prod(v.shape) != math.prod(t) and not _fits(v.shape, t):
            raise ImportError_(f"{node.target} at {_where(node)}: reads {x.name!a} (graph shape {list(v.shape)}, "
                               f"PyTorch shape {list(t)}), neither a broadcast nor a reshape of it")
        if x.name not in self._exact:   # a broadcast view is materialised by ``expand`` (numpy broadcast_to)
            t = self._layout_shape(node, t)
            op = "reshape" if math.prod(v.shape) == math.prod(t) else "expand"
            self._exact[x.name] = self.b.layout(op, [v], t, str(v.dtype), f"{x.name}_exact", shape=list(t))
            if op == "reshape":
                self._reshaped[str(self._exact[x.name].ref)] = v
        return self._exact[x.name]

    def _reshape(self, v: Value, shape: tuple[int, ...], name: str) -> Value:
        """A ``reshape`` of ``v`` (same elements, row-major), remembered so that a view back to
        ``v``'s shape is ``v`` itself (:meth:`unreshaped`)."""
        out = self.b.layout("reshape", [v], shape, str(v.dtype), name, shape=list(shape))
        self._reshaped[str(out.ref)] = v
        return out

    def unreshaped(self, v: Value, shape: Sequence[int]) -> Value | None:
        """The value that ``reshape`` node ``v`` was made from when it has ``shape`` (a round trip such as
        logits ``[B*S, V]`` viewed ``[B, S, V]`` and back), else None."""
        src = self._reshaped.get(str(v.ref))
        return src if src is not None and tuple(src.shape) == tuple(shape) else None

    def _reframe(self, x: Any, v: Value, t_in: Sequence[int], t_new: Sequence[int], name: str, node: Any) -> Value:
        """``v`` (the value of PyTorch shape ``t_in``) viewed as ``t_new`` (same element count): when
        the view only adds or removes unit axes a broadcast ``v`` stays one (its own axes re-framed),
        else the exact value is reshaped."""
        p = [1] * (len(t_in) - len(v.shape)) + list(v.shape)
        big_in = [i for i, d in enumerate(t_in) if d != 1]
        big_new = [d for d in t_new if d != 1]
        if len(p) == len(t_in) and [t_in[i] for i in big_in] == big_new:
            it = iter(big_in)
            q = tuple(1 if d == 1 else p[next(it)] for d in t_new)
            if tuple(v.shape) == q or _strip1(v.shape) == _strip1(q):
                return v
            return self._reshape(v, self._layout_shape(node, q), name)
        src = self.exact(x, node) if x is not None else v
        return self._reshape(src, self._layout_shape(node, t_new), name)

    def layout_node(self, node: Any, key: str, a: dict[str, Any], x: Any) -> Value | Padded | Empty:
        """``transpose``/``permute``/``t``, ``cat``, ``slice``/``select``, ``slice_scatter`` and ``embedding``
        (see :data:`_LAYOUT`)."""
        op = _LAYOUT[key]
        if op == "transpose":
            return self._transpose(node, key, a, x)
        if op == "index":
            return self._index(node, a, x)
        if op == "slice":
            return self._slice(node, key, a, x)
        if op == "gather_elements":
            return self._gather_elements(node, key, a, x)
        if op == "slice_scatter":
            return self._slice_scatter(node, a, x)
        if op == "one_hot":
            return self._one_hot(node, a, x)
        t = self._layout_shape(node, self.tshape(node))
        _, dt = _meta(node)
        if op == "concat":
            parts = [n for n in a["tensors"] if math.prod(self.tshape(n)) > 0]
            vals = [self.b.cast(self.exact(n, node), str(dt), f"{node.name}_in{i}") for i, n in enumerate(parts)]
            if len(vals) == 1:
                return vals[0]
            if not 2 <= len(vals) <= 8:
                raise ImportError_(f"{node.target} at {_where(node)}: concatenates {len(vals)} tensors "
                                   "(graph.json's concat takes 2 to 8)")
            return self.b.layout("concat", vals, t, str(dt), node.name, axis=int(a["dim"]) % len(t))
        folded = self.vals.get(getattr(a["indices"], "name", ""))
        if folded is not None and not isinstance(folded, Value):   # constant ids resolved at import time
            return self._table_rows(node, a, folded, t)
        ids = self.val(a["indices"], node)   # embedding(weight, indices): rows of the table
        if ids.dtype not in ("int32", "int64") or not self.b.is_input(ids):
            raise ImportError_(f"{node.target} at {_where(node)}: the indices must be an int32/int64 tensor that "
                               "is a graph input (graph.json gathers by input indices only)")
        table = self.exact(a["weight"], node)
        return self.b.layout("gather", [table, ids], t, str(table.dtype), node.name, axis=0)

    def _table_rows(self, node: Any, a: dict[str, Any], ids: Any, t: tuple[int, ...]) -> Value:
        """``embedding(weight, ids)`` for constant ``ids`` that are consecutive rows ``[start, stop)``
        of the table (:func:`~stitchtune.importers.torch_consts.row_range`: position ids ``arange(S)``):
        the table's slice of those rows, reshaped to the result (no index, no gather)."""
        from stitchtune.importers.torch_consts import row_range

        table = self.exact(a["weight"], node)
        span = row_range(ids, table.shape[0])
        if span is None:
            raise ImportError_(f"{node.target} at {_where(node)}: constant ids that are not a range of the "
                               "table's rows")
        start, stop = span
        rows = (stop - start, *table.shape[1:])
        out = table if rows == tuple(table.shape) else self.b.layout(
            "slice", [table], rows, str(table.dtype), f"{node.name}_rows", axis=0, start=start, stop=stop)
        return self._reframe(None, out, rows, t, node.name, node)

    def _gather_elements(self, node: Any, key: str, a: dict[str, Any], x: Any) -> Value:
        """``gather(self, dim, index)`` / ``take_along_dim(self, indices, dim)`` (index of ``self``'s
        shape along ``dim``, no broadcasting): graph.json's ``gather_elements``, its index an int32/int64
        graph input (the candidates leave an index view of an input such as ``target.unsqueeze(1)`` to
        PyTorch) or an int tensor the region computes (``where(t != ignore, t, 0)``, a pick's per-row index;
        the planner refuses other computed indices naming the gather)."""
        idx_arg = a.get("index", a.get("indices"))
        dim = a.get("dim")
        t = self.tshape(node)
        if dim is None or tuple(self.tshape(idx_arg)) != tuple(t):
            raise ImportError_(f"{node.target} at {_where(node)}: graph.json's gather_elements needs a dim and an "
                               "index of the result's shape (no broadcasting of the indices)")
        ids = self.val(idx_arg, node)
        if ids.dtype not in ("int32", "int64") or tuple(ids.shape) != tuple(t):
            raise ImportError_(f"{node.target} at {_where(node)}: the index must be an int32/int64 tensor of the "
                               "result's shape (a graph input, or computed in the region)")
        src = self.exact(x, node)
        return self.b.layout("gather_elements", [src, ids], t, str(src.dtype), node.name, axis=int(dim) % len(t))

    def _one_hot(self, node: Any, a: dict[str, Any], x: Any) -> Value:
        """``scatter(self, dim, index, value)`` (``scatter.value``, no ``reduce``) whose index has size 1
        along ``dim`` and ``self``'s size on every other axis: one position per row set to a number
        (cross entropy's backward: a one-hot of the target), mapped as ``where(iota(dim) == index,
        value, self)``. Element-wise: no address depends on the index, so an index outside
        ``[0, size)`` reads and writes nothing out of bounds; it matches no position and the row stays
        ``self`` (where PyTorch raises; the forward's pick of the same target raises its error flag).
        ``self`` may be a number (a ``full`` of one value)."""
        t = self.tshape(node)
        dim, idx_arg, value = a.get("dim"), a.get("index"), a.get("value")
        if a.get("reduce") is not None or not isinstance(value, (int, float)) or isinstance(value, bool) \
                or not isinstance(dim, int):
            raise ImportError_(f"{node.target} at {_where(node)}: only scatter of a number without reduce "
                               "(a one-hot) is supported")
        d = int(dim) % len(t)
        it = self.tshape(idx_arg)
        if len(it) != len(t) or it[d] != 1 or any(i != n for k, (i, n) in enumerate(zip(it, t)) if k != d):
            raise ImportError_(f"{node.target} at {_where(node)}: the index must have size 1 along dim {d} and "
                               f"the result's size elsewhere (index {list(it)}, result {list(t)})")
        ids = self.val(idx_arg, node)
        if ids.dtype not in ("int32", "int64"):
            raise ImportError_(f"{node.target} at {_where(node)}: the index must be an int32/int64 tensor")
        base = self.val(x, node)
        if base.dtype == "bool" or base.dtype in ("int32", "int64"):
            raise ImportError_(f"{node.target} at {_where(node)}: scatter into a {base.dtype} tensor is not supported")
        pos = self.b.iota(tuple(n if k == d else 1 for k, n in enumerate(t)), d, str(ids.dtype), f"{node.name}_pos")
        hit = self.b.elementwise("eq", [pos, ids], f"{node.name}_hit")
        return self.b.elementwise("where", [hit, scalar(float(value)), base], node.name)

    def _transpose(self, node: Any, key: str, a: dict[str, Any], x: Any) -> Value:
        """A permutation of the axes; one that keeps the order of the non-unit axes is a reshape; one of
        a transposed value composes with it (:meth:`GraphBuilder.transpose`)."""
        t_in = self.tshape(x)
        r = len(t_in)
        perm = list(range(r))
        if key == "aten.t":
            perm.reverse()
        elif key == "aten.transpose":
            d0, d1 = int(a["dim0"]) % max(r, 1), int(a["dim1"]) % max(r, 1)
            perm[d0], perm[d1] = perm[d1], perm[d0]
        else:
            perm = [int(d) % r for d in a["dims"]]
        t_new = self.tshape(node)
        if [p for p in perm if t_in[p] != 1] == [i for i in range(r) if t_in[i] != 1]:
            return self._reframe(x, self.val(x, node), t_in, t_new, node.name, node)
        shape = self._layout_shape(node, t_new)
        out = self.b.transpose(self.exact(x, node), perm, node.name)   # (a transpose of a transpose: one)
        if tuple(out.shape) != shape:
            raise ImportError_(f"{node.target} at {_where(node)}: transposed to {list(out.shape)}, PyTorch "
                               f"says {list(shape)}")
        return out

    def _slice(self, node: Any, key: str, a: dict[str, Any], x: Any) -> Value | Empty:
        """``slice.Tensor`` (step 1; start/end clamped to the dim as PyTorch does) and ``select.int``
        (a slice of one, then its axis dropped). Slicing an axis that the value broadcasts along
        changes nothing; else the value's own axis is sliced (it may broadcast along others)."""
        t_in = self.tshape(x)
        r = len(t_in)
        dim = int(a["dim"]) % max(r, 1)
        n = t_in[dim]
        if key == "aten.select":
            i = int(a["index"])
            start, stop = i + n if i < 0 else i, (i + n if i < 0 else i) + 1
            if not 0 <= start < n:
                raise ImportError_(f"{node.target} at {_where(node)}: index {i} out of range for size {n}")
        else:
            start, stop = _bounds(node, a, n)
            if stop <= start:   # (read by a concat, which leaves it out, or scattered: nothing)
                return Empty(tuple(0 if i == dim else d for i, d in enumerate(t_in)))
        v = self.val(x, node)
        if len(v.shape) > r:   # a keepdims frame of a reduction: slice the exact value
            v = self.exact(x, node)
        g = dim - (r - len(v.shape))
        sliced_shape = tuple(stop - start if i == dim else d for i, d in enumerate(t_in))
        if start == 0 and stop == n or g < 0 or v.shape[g] == 1:
            out = v   # the whole axis, or an axis that v broadcasts along
        else:
            shape = tuple(stop - start if i == g else d for i, d in enumerate(v.shape))
            out = self.b.layout("slice", [v], self._layout_shape(node, shape), str(v.dtype),
                                node.name if key == "aten.slice" else f"{node.name}_slice",
                                axis=g, start=start, stop=stop)
        if key == "aten.select":
            return self._reframe(None, out, sliced_shape, self.tshape(node), node.name, node)
        return out

    def _slice_scatter(self, node: Any, a: dict[str, Any], x: Any) -> Value | Padded:
        """``slice_scatter(self, src, dim, start, end)`` (step 1), the backward of a ``slice``. When
        ``self`` is a value of the region: ``src`` between its parts before ``start`` and after
        ``end`` (one ``concat`` along ``dim``). When ``self`` is a constant of zeros (``full(shape,
        0)``, folded, or the number 0 that a ``full`` the region computes itself maps to): a
        :class:`Padded` value that only an ``add`` may read (:meth:`add_padded`: the sum of rotary's
        two halves in a training graph is one ``concat``; no zeros are made)."""
        import torch

        t = self._layout_shape(node, self.tshape(node))
        dim = int(a.get("dim", 0)) % len(t)
        n = t[dim]
        start, stop = _bounds(node, a, n)
        _, dt = _meta(node)
        if isinstance(self.vals.get(getattr(a["src"], "name", "")), Empty) or stop <= start:
            return self._scatter_nothing(node, x, t, dim, str(dt))
        src = self.b.cast(self.exact(a["src"], node), str(dt), f"{node.name}_src")
        if stop <= start or tuple(src.shape) != tuple(stop - start if i == dim else d for i, d in enumerate(t)):
            raise ImportError_(f"{node.target} at {_where(node)}: src of shape {list(src.shape)} does not fill "
                               f"[{start}:{stop}] of dim {dim} of {list(t)}")
        if (start, stop) == (0, n):
            return src
        base = self.vals.get(x.name) if hasattr(x, "name") else None
        if isinstance(base, Value) and base.is_scalar:   # a fill the region computes (a pulled ``full``)
            base = torch.tensor(float(base.ref))
        if isinstance(base, torch.Tensor):   # a folded constant: zeros, or refused
            if base.numel() == 0 or bool((base != 0).any()):
                raise ImportError_(f"{node.target} at {_where(node)}: scatters into a constant that is not zeros")
            return Padded(t, dim, ((start, stop, src),), str(dt))
        whole = self.b.cast(self.exact(x, node), str(dt), f"{node.name}_base")
        return self._concat_parts(node, t, dim, [(start, stop, src)], whole, str(dt), add=False)

    def _scatter_nothing(self, node: Any, x: Any, t: tuple[int, ...], dim: int, dt: str) -> Value | Padded:
        """``slice_scatter(self, src)`` of an empty ``src``: ``self`` unchanged; zeros (a folded constant,
        or a fill of 0 the region computes) are a :class:`Padded` value without parts."""
        import torch

        base = self.vals.get(x.name) if hasattr(x, "name") else None
        if isinstance(base, Value) and base.is_scalar:
            base = torch.tensor(float(base.ref))
        if isinstance(base, torch.Tensor):
            if base.numel() == 0 or bool((base != 0).any()):
                raise ImportError_(f"{node.target} at {_where(node)}: scatters into a constant that is not zeros")
            return Padded(t, dim, (), dt)
        return self.b.cast(self.exact(x, node), dt, f"{node.name}_base")

    def add_padded(self, node: Any, lhs: Any, rhs: Any) -> Value | Padded:
        """``lhs + rhs`` where one of them (graph values or :class:`Padded`) is a :class:`Padded`:
        two with disjoint parts along the same axis are one (a ``concat`` when the parts cover the
        axis); a tensor plus one is a ``concat`` of its slices, the parts added to theirs."""
        t = self._layout_shape(node, self.tshape(node))
        _, dt = _meta(node)
        p, q = (lhs, rhs) if isinstance(lhs, Padded) else (rhs, lhs)
        if p.shape != t:
            raise ImportError_(f"{node.target} at {_where(node)}: adds a scattered slice of shape {list(p.shape)} "
                               f"to a result of shape {list(t)}")
        if isinstance(q, Padded) and not (p.parts and q.parts):   # zeros plus zeros scattered
            if q.shape != t:
                raise ImportError_(f"{node.target} at {_where(node)}: adds scattered slices of other shapes")
            return p if p.parts else q
        if isinstance(q, Padded):
            parts = sorted(p.parts + q.parts, key=lambda s: s[0])
            if q.shape != t or q.dim != p.dim or any(a[1] > b[0] for a, b in zip(parts, parts[1:])):
                raise ImportError_(f"{node.target} at {_where(node)}: adds scattered slices that overlap")
            covered = parts[0][0] == 0 and parts[-1][1] == t[p.dim] and all(
                a[1] == b[0] for a, b in zip(parts, parts[1:]))
            if not covered:
                return Padded(t, p.dim, tuple(parts), str(dt))
            return self._concat_parts(node, t, p.dim, parts, None, str(dt))
        return self._concat_parts(node, t, p.dim, list(p.parts), q, str(dt), add=True)

    def _concat_parts(self, node: Any, t: Sequence[int], dim: int, parts: Sequence[tuple[int, int, Value]],
                      whole: Value | None, dt: str, add: bool = False) -> Value:
        """A tensor of shape ``t``: along ``dim``, each part ``(lo, hi, v)`` (``add``: plus
        ``whole[lo:hi]``) and ``whole`` between the parts (``whole`` None: the parts cover the axis);
        one ``concat``."""
        pieces: list[Value] = []
        at = 0

        def piece(lo: int, hi: int, tag: str) -> Value:
            assert whole is not None
            shape = tuple(hi - lo if i == dim else d for i, d in enumerate(t))
            if (lo, hi) == (0, t[dim]):
                return whole
            return self.b.layout("slice", [whole], shape, dt, f"{node.name}_{tag}", axis=dim, start=lo, stop=hi)

        if whole is not None and tuple(whole.shape) != tuple(t):
            raise ImportError_(f"{node.target} at {_where(node)}: adds a broadcast tensor to a scattered slice")
        for k, (lo, hi, v) in enumerate(parts):
            if lo > at:
                pieces.append(piece(at, lo, f"gap{k}"))
            pieces.append(self.b.binary("add", v, piece(lo, hi, f"at{k}"), f"{node.name}_p{k}") if add else v)
            at = hi
        if at < t[dim]:
            pieces.append(piece(at, t[dim], "tail"))
        if len(pieces) == 1:
            return pieces[0]
        if len(pieces) > 8:
            raise ImportError_(f"{node.target} at {_where(node)}: concatenates {len(pieces)} tensors "
                               "(graph.json's concat takes 2 to 8)")
        return self.b.layout("concat", pieces, tuple(t), dt, node.name, axis=dim)

    def _index(self, node: Any, a: dict[str, Any], x: Any) -> Value:
        """``index.Tensor`` with indices known at import time: resolved on the index grid of ``x``
        (:mod:`stitchtune.importers.index_grid`) when the result is ``x`` broadcast or reshaped, or
        rotated along one axis (``torch.roll``: two slices and a concat)."""
        import torch

        from stitchtune.importers.index_grid import MAX_GRID, grid_kind, rotation

        idx = [None if i is None else self.vals.get(i.name) for i in a["indices"]]
        if any(i is not None and not isinstance(i, torch.Tensor) for i in idx):
            raise ImportError_(f"{node.target} at {_where(node)}: indices computed at run time (graph.json "
                               "gathers rows by input indices only)")
        t_in, t_out = self.tshape(x), self.tshape(node)
        if math.prod(t_in) > MAX_GRID or math.prod(t_out) > MAX_GRID:
            raise ImportError_(f"{node.target} at {_where(node)}: too large to resolve at import time")
        from torch._subclasses.fake_tensor import unset_fake_temporarily

        with unset_fake_temporarily():
            grid = torch.arange(math.prod(t_in), dtype=torch.int64).reshape(t_in)
            res = torch.ops.aten.index.Tensor(grid, idx).numpy()
        kind = grid_kind(res, tuple(t_in))
        v = self.val(x, node)
        if kind == "broadcast" and _fits(v.shape, t_out):
            return v
        if kind == "reshape":
            return self._reframe(x, v, t_in, t_out, node.name, node)
        turn = rotation(res, tuple(t_in))
        if turn is not None:   # torch.roll along one axis (decomposed into an index): two slices, a concat
            axis, k = turn
            src = self.exact(x, node)
            n = int(t_in[axis])
            parts = [self.b.layout("slice", [src], tuple(n - k if i == axis else d for i, d in enumerate(t_in)),
                                   str(src.dtype), f"{node.name}_tail", axis=axis, start=k, stop=n),
                     self.b.layout("slice", [src], tuple(k if i == axis else d for i, d in enumerate(t_in)),
                                   str(src.dtype), f"{node.name}_head", axis=axis, start=0, stop=k)]
            return self.b.layout("concat", parts, tuple(t_in), str(src.dtype), node.name, axis=axis)
        raise ImportError_(f"{node.target} at {_where(node)}: constant indices that gather (not a broadcast "
                           "or reshape of the input)")
