"""A static cache's write in place: ``index_put(cache, [.., iota(S) + start], new)`` as one kernel call.

transformers' ``StaticCache.update`` writes a step's new keys / values at ``cache_position``; after
functionalization the backend receives ``index_put(cache, [None, None, iota(S) + start], new)``
(``S`` positions from a SymInt, int or one-element int tensor ``start``: one in a decode step, the
prompt's length in a prompt; or ``index_copy_(axis, positions, new)`` with a 1-D position tensor),
whose result is returned for AOTAutograd to copy back into the cache (a graph input mutated in
place) or is the cache itself (a prompt graph makes it: ``full(.., 0)``). Functionally that reads
and writes the whole cache, and the copy back does again.

Contract
--------
* :func:`inplace_puts(gm, make_kernel)` returns a copy of ``gm`` in which every such ``index_put``
  whose base may be written in place (:func:`put_reason` is None) is one call of the in-place op
  ``stitchtune::put(key, table, values, start) -> Tensor(a!)`` (it writes ``values`` into rows
  ``start .. start + S - 1`` of ``table`` along the index's axis and returns ``table`` itself), the
  readers of the ``index_put`` reading that result; the ``iota`` / ``add`` that made the positions go
  when nothing else reads them. ``make_kernel(name, axis)`` makes the :class:`PutKernel` registered
  under the call's key; a :class:`PutSite` per write says what was made. Returns ``(gm, ())`` without
  such nodes.
* In place only where no one can tell: the base is a graph input that AOTAutograd marks as mutated
  (``TracingContext.fw_metadata``: a data mutation, no metadata mutation, no grad) whose mutation's
  result is this ``index_put`` (so the graph's output for it becomes the input itself and
  AOTAutograd's copy back is a copy of a tensor onto itself, which PyTorch skips), or a fresh tensor
  the graph makes (``full`` / ``zeros`` / ``empty``...); in both cases read by nothing but the
  ``index_put``. Anything else keeps its functional form (the one-position ``where`` of
  :mod:`stitchtune.importers.torch_index_copy`, or PyTorch's op).
* :class:`PutKernel` runs the call: on CUDA the kernel of :func:`stitchtune.lower.put.put_program`
  (built per shape, counted as builds in :mod:`stitchtune.deploy.torch_stats`; under
  :func:`~stitchtune.deploy.torch_ops.stand_in_driver` CPU tensors too, through its driver); on CPU the same
  program in the emulator, in place on the tensor's memory (``cpu="emulate"``) or PyTorch's
  ``index_copy_`` (``cpu="reference"``). Positions outside ``[0, rows)`` or repeated (CPU), a table that is not
  contiguous or not 16-byte aligned, or values of another shape or dtype run PyTorch's own
  ``index_put_`` (counted as an eager call): so a position outside the cache raises PyTorch's own
  ``IndexError`` (on CPU; a device assert on CUDA), as eager does, and a negative position in range
  wraps as eager's does. The kernel itself writes nothing for a start outside the cache.
"""

from __future__ import annotations

import logging
import math
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

import stitchtune.deploy.torch_ops  # noqa: F401  (defines the ``stitchtune`` library first)
from stitchtune.deploy.torch_guard import StreamBuffers
from stitchtune.hardware.device import Device
from stitchtune.importers.torch_fx_util import op_key

__all__ = ["PutKernel", "PutSite", "final_puts", "inplace_puts", "put_reason", "PUT_OP", "PUT_INPLACE_OP"]

log = logging.getLogger(__name__)

#: ops that make a fresh tensor (a prompt's cache: StaticCache's lazy ``zeros``)
_FRESH = frozenset({"aten.full", "aten.zeros", "aten.empty", "aten.new_zeros", "aten.new_full", "aten.new_empty",
                    "aten.zeros_like", "aten.full_like", "aten.empty_like", "aten.empty_strided"})
_FLOATS = (torch.float32, torch.float16, torch.bfloat16)

_registry: dict[str, "PutKernel"] = {}
_lock = threading.Lock()


def _put_op(key: str, table: torch.Tensor, values: torch.Tensor, start_t: torch.Tensor | None,
            start_i: int) -> torch.Tensor:
    k = _registry.get(key)
    if k is None:
        from stitchtune.deploy.torch_ops import RegionError

        raise RegionError(f"no stitched cache write {key!r} in this process")
    k(table, values, start_t, int(start_i))
    return table


def _put_fake(key: str, table: torch.Tensor, values: torch.Tensor, start_t: Any, start_i: Any) -> torch.Tensor:
    return table


_lib = torch.library.Library("stitchtune", "FRAGMENT")  # type: ignore[no-untyped-call]  # untyped
_lib.define("put(str key, Tensor(a!) table, Tensor values, Tensor? start_t, "  # type: ignore[no-untyped-call]
            "SymInt start_i) -> Tensor(a!)")
_lib.impl("put", _put_op, "CompositeExplicitAutograd")  # type: ignore[no-untyped-call]
torch.library.register_fake("stitchtune::put", _put_fake, lib=_lib)


def _put_inplace_op(key: str, table: torch.Tensor, values: torch.Tensor, start_t: torch.Tensor | None,
                    start_i: int) -> None:
    _put_op(key, table, values, start_t, start_i)


def _put_inplace_fake(key: str, table: torch.Tensor, values: torch.Tensor, start_t: Any, start_i: Any) -> None:
    return None


_lib.define("put_(str key, Tensor(a!) table, Tensor values, Tensor? start_t, "  # type: ignore[no-untyped-call]
            "SymInt start_i) -> ()")
_lib.impl("put_", _put_inplace_op, "CompositeExplicitAutograd")  # type: ignore[no-untyped-call]
torch.library.register_fake("stitchtune::put_", _put_inplace_fake, lib=_lib)
#: the op a cache write becomes while the backend rewrites the graph (its result, the table, orders the
#: readers after it whatever order the rewrite puts the nodes in)
PUT_OP = torch.ops.stitchtune.put.default
#: the same write in the graph handed on (:func:`final_puts`): no result, Inductor lowers it
PUT_INPLACE_OP = torch.ops.stitchtune.put_.default


# ---------------------------------------------------------------------------- matching
def _positions(idx: Any) -> tuple[Any, Any] | None:
    """``(count, start)`` of an index node ``iota(count) + start`` (``start``: an int or a SymInt's fx
    node; also ``start + iota``, and an ``iota`` with its own int start, step 1), else None."""
    def iota(n: Any) -> tuple[Any, Any] | None:
        if getattr(n, "op", None) != "call_function" or op_key(n.target) != "prims.iota":
            return None
        first = n.kwargs.get("start", 0)
        if n.kwargs.get("step", 1) != 1 or not (isinstance(first, int) or _symint(first)):
            return None
        return n.args[0], first

    got = iota(idx)
    if got is not None:
        return got
    if getattr(idx, "op", None) != "call_function" or op_key(idx.target) != "aten.add" or len(idx.args) != 2:
        return None
    for a, b in (idx.args, idx.args[::-1]):
        got = iota(a)
        if got is None or not isinstance(got[1], int) or got[1] != 0 or len(a.users) != 1:
            continue
        if isinstance(b, int) and not isinstance(b, bool):
            return got[0], b
        v = getattr(b, "meta", {}).get("val")
        if _symint(b) or (isinstance(v, torch.Tensor) and v.numel() == 1 and v.dim() <= 1
                                           and v.dtype in (torch.int32, torch.int64)):
            return got[0], b
    return None


def _position_tensor(idx: Any, values: Any, axis: int) -> bool:
    """Whether ``idx`` is a 1-D int32 / int64 tensor node with one position per row of ``values``
    along ``axis`` (``index_copy_(axis, positions, new)``)."""
    v = getattr(idx, "meta", {}).get("val")
    return (isinstance(v, torch.Tensor) and v.dim() == 1 and v.dtype in (torch.int32, torch.int64)
            and str(v.shape[0]) == str(values.shape[axis]))


def _size(x: Any) -> Any:
    """An iota's length: an int, or the SymInt of its fx node."""
    return getattr(x, "meta", {}).get("val", x) if hasattr(x, "meta") else x


def _symint(x: Any) -> bool:
    """Whether ``x`` is an fx node of a SymInt."""
    return isinstance(getattr(x, "meta", {}).get("val"), torch.SymInt)


def _mutated_input(node: Any, base: Any, gm: Any) -> str | None:
    """Why graph input ``base`` may not be written in place by ``node`` (None: it may)."""
    tc = torch._guards.TracingContext.try_get()
    meta = getattr(tc, "fw_metadata", None)
    places = [n for n in gm.graph.nodes if n.op == "placeholder"]
    if meta is None or len(meta.input_info) != len(places):
        return "the cache is a graph input and AOTAutograd's input metadata is not at hand"
    i = places.index(base)
    info = meta.input_info[i]
    if not info.mutates_data or info.mutates_metadata or getattr(info, "requires_grad", False):
        return "the cache is a graph input that the model does not overwrite in place (a functional index_put)"
    mutated = list(meta.mutated_inp_runtime_indices)
    outs = next(n for n in gm.graph.nodes if n.op == "output").args[0]
    k = mutated.index(i) if i in mutated else -1
    if k < 0 or k >= len(outs) or outs[k] is not node:
        return "the cache input's new value is not this index_put's result"
    return None


def put_reason(node: Any, gm: Any) -> str | None:
    """Why ``index_put`` node ``node`` of ``gm`` is not a cache write done in place (one line), or None."""
    if node.op != "call_function" or op_key(node.target) != "aten.index_put":
        return "not an index_put"
    base, indices, values = (list(node.args) + [None] * 3)[:3]
    if node.kwargs.get("accumulate", node.args[3] if len(node.args) > 3 else False):
        return "an accumulating index_put"
    real = [i for i, x in enumerate(indices or []) if x is not None]
    if len(real) != 1:
        return "an index_put with several index tensors"
    axis = real[0]
    bval, vval = base.meta.get("val"), getattr(values, "meta", {}).get("val")
    if not isinstance(bval, torch.Tensor) or not isinstance(vval, torch.Tensor):
        return "an index_put without tensor values"
    got = _positions(indices[axis])
    if got is None and not _position_tensor(indices[axis], vval, axis):
        return "positions that are neither iota(S) + start nor a 1-D int tensor of one per values' row"
    if got is not None and str(_size(got[0])) != str(vval.shape[axis]):
        return "values broadcast along the positions (not one row per position)"
    if bval.dtype not in _FLOATS or vval.dtype != bval.dtype or vval.dim() != bval.dim():
        return "values of another dtype or rank than the cache (or a cache that is not float32/16, bfloat16)"
    if any(str(a) != str(b) for i, (a, b) in enumerate(zip(vval.shape, bval.shape)) if i != axis):
        return "values that are broadcast against the cache"
    if list(base.users) != [node]:
        return "a cache read by other nodes than its write (its old value is still needed)"
    if base.op == "placeholder":
        return _mutated_input(node, base, gm)
    if base.op == "call_function" and op_key(base.target) in _FRESH:
        return None
    return "a cache that is neither a graph input written in place nor a fresh tensor of the graph"


@dataclass(frozen=True)
class PutSite:
    """One cache write made a ``stitchtune::put`` call: its op key, the ``index_put`` node's name, the
    cache's and the values' shapes (at the example inputs) and the dtype (for ``explain``)."""

    key: str
    name: str
    shapes: tuple[tuple[int, ...], ...]
    dtype: str


def _hint(d: Any) -> int:
    """A size's value at the example inputs, without a guard (a SymInt's hint)."""
    return d if isinstance(d, int) else int(d.node.hint)


def inplace_puts(gm: Any, make_kernel: Callable[[str, int, bool], "PutKernel"]
                 ) -> tuple[Any, tuple[PutSite, ...]]:
    """``(copy of gm with its in-place cache writes, one PutSite each)``; ``(gm, ())`` when it has none
    (see the module docstring)."""
    import torch.fx

    hits = [n for n in gm.graph.nodes if n.op == "call_function" and op_key(n.target) == "aten.index_put"
            and put_reason(n, gm) is None]
    if not hits:
        return gm, ()
    graph = torch.fx.Graph()
    env: dict[Any, Any] = {}
    out = graph.graph_copy(gm.graph, env)
    graph.output(out)
    keys: list[PutSite] = []
    for old in hits:
        n = env[old]
        base, indices, values = n.args[:3]
        axis = next(i for i, x in enumerate(indices) if x is not None)
        idx = indices[axis]
        got = _positions(idx)
        start = idx if got is None else got[1]   # a position tensor, or iota(S) + start's start
        key = f"put_{old.name}#{_next_key()}"
        register(key, make_kernel(old.name, axis, got is None))
        with graph.inserting_before(n):
            tensor = isinstance(getattr(start, "meta", {}).get("val"), torch.Tensor)
            call = graph.call_function(PUT_OP, (key, base, values, start if tensor else None, 0 if tensor else start))
        call.meta = dict(n.meta)
        n.replace_all_uses_with(call)
        graph.erase_node(n)
        for dead in (idx, *[a for a in getattr(idx, "args", ()) if hasattr(a, "users")]):
            if hasattr(dead, "users") and not dead.users and dead.op == "call_function" and got is not None:
                graph.erase_node(dead)
        vals = (base.meta["val"], values.meta["val"])
        keys.append(PutSite(key, old.name, tuple(tuple(_hint(d) for d in v.shape) for v in vals),
                            str(vals[0].dtype).removeprefix("torch.")))
    return torch.fx.GraphModule(gm, graph), tuple(keys)


def final_puts(gm: Any) -> Any:
    """``gm`` (changed in place) with each ``stitchtune::put`` call made a ``stitchtune::put_`` call
    (no result: Inductor cannot lower an op that returns its mutated argument) and its readers reading
    the table it writes; called once the backend reorders nothing any more. ``gm`` without put calls
    is returned untouched."""
    puts = [n for n in gm.graph.nodes if n.op == "call_function" and n.target is PUT_OP]
    for n in puts:
        with gm.graph.inserting_before(n):
            call = gm.graph.call_function(PUT_INPLACE_OP, n.args)
        call.meta = {k: v for k, v in n.meta.items() if k != "val"}
        n.replace_all_uses_with(n.args[1])
        gm.graph.erase_node(n)
    if puts:
        gm.recompile()
    return gm


_count = [0]


def _next_key() -> int:
    with _lock:
        _count[0] += 1
        return _count[0]


def register(key: str, kernel: "PutKernel") -> None:
    """Make ``kernel`` what ``stitchtune::put(key, ...)`` runs."""
    with _lock:
        _registry[key] = kernel


# ---------------------------------------------------------------------------- running
@dataclass
class PutKernel:
    """One cache write: ``values`` into ``table`` along ``axis`` from ``start`` (module docstring).
    ``counter``: a :class:`~stitchtune.deploy.torch_stats.RegionCounter` (builds per shape, eager calls).
    ``positions``: the rows are a tensor of positions (``start_t``, one per values' row), not a start."""

    name: str
    axis: int
    device: Device
    cpu: str = "emulate"
    counter: Any = None
    positions: bool = False
    _programs: dict[Any, Any] = field(default_factory=dict, repr=False)
    _launchers: dict[Any, Any] = field(default_factory=dict, repr=False)
    #: the one-element int64 start buffer per thread and (device, stream), refilled at each call
    _starts: StreamBuffers = field(default_factory=StreamBuffers, repr=False, compare=False)

    def shape(self, table: torch.Tensor, values: torch.Tensor, start: torch.Tensor | None = None) -> Any:
        from stitchtune.lower.put import PutShape

        a = self.axis
        index = str(start.dtype).removeprefix("torch.") if self.positions and start is not None else "int64"
        return PutShape(math.prod(table.shape[:a]), table.shape[a], values.shape[a],
                        math.prod(table.shape[a + 1:]), str(table.dtype).removeprefix("torch."),
                        positions=self.positions, index_dtype=index)

    def program(self, table: torch.Tensor, values: torch.Tensor, start: torch.Tensor | None = None) -> Any:
        """The program for these shapes (built and counted once per shape)."""
        from stitchtune.lower.put import put_program

        sh = self.shape(table, values, start)
        prog = self._programs.get(sh)
        if prog is None:
            prog = self._programs[sh] = put_program(sh, self.device)
            if self.counter is not None:
                self.counter.add(builds=1)
        elif self.counter is not None:
            self.counter.add(hits=1)
        return prog

    def _fits(self, table: torch.Tensor, values: torch.Tensor, start_t: torch.Tensor | None) -> bool:
        """Whether the kernel takes these tensors (else PyTorch's ``index_put_`` runs)."""
        a = self.axis
        if self.positions and (start_t is None or start_t.dim() != 1 or start_t.numel() != values.shape[a]
                               or start_t.dtype not in (torch.int32, torch.int64)):
            return False
        same = (values.dtype == table.dtype and values.dim() == table.dim()
                and all(v == t for i, (v, t) in enumerate(zip(values.shape, table.shape)) if i != a))
        return (same and table.dtype in _FLOATS and table.is_contiguous() and table.data_ptr() % 16 == 0
                and 0 < values.shape[a] <= table.shape[a] and values.numel() > 0 and table.numel() < 2**31)

    def eager(self, table: torch.Tensor, values: torch.Tensor, start_t: torch.Tensor | None, start_i: int) -> None:
        """PyTorch's own in-place ``index_put_`` (its errors, its wrapping of negative positions)."""
        if self.counter is not None:
            self.counter.add(eager=1)
        if self.positions and start_t is not None:
            pos = start_t
        else:
            pos = torch.arange(values.shape[self.axis], device=table.device) + start_i
            pos = pos if start_t is None else pos + start_t.reshape(())
        torch.ops.aten.index_put_(table, [None] * self.axis + [pos], values)

    def __call__(self, table: torch.Tensor, values: torch.Tensor, start_t: torch.Tensor | None, start_i: int) -> None:
        """Write ``values`` at rows ``start_t + start_i ..`` (``start_t``: a one-element int tensor or None),
        or with ``positions`` at rows ``start_t[j]``."""
        if not self._fits(table, values, start_t):
            self.eager(table, values, start_t, start_i)
            return
        if table.device.type == "cuda" or _stand_in() is not None:   # no host read of the start: the kernel
            self._launch(table, values.contiguous(), self._start_tensor(start_t, start_i, table.device))
            return                                                   # writes nothing outside the cache
        rows, n = table.shape[self.axis], values.shape[self.axis]
        if self.positions:
            assert start_t is not None   # _fits
            pos = start_t.detach().to(torch.int64)
            ok = bool((pos >= 0).all() and (pos < rows).all()) and int(torch.unique(pos).numel()) == n
        else:
            first = start_i + (int(start_t.reshape(())) if start_t is not None else 0)
            pos, ok = torch.arange(first, first + n), 0 <= first <= rows - n
        if not ok:   # outside the cache (PyTorch's error, or its wrap), or a position twice (its order)
            self.eager(table, values, start_t, start_i)
        elif self.cpu == "reference":
            table.index_copy_(self.axis, pos, values)
        else:
            self._emulate(table, values.contiguous(), pos if self.positions else pos[:1])

    def _start_tensor(self, start_t: torch.Tensor | None, start_i: int, device: Any) -> torch.Tensor:
        """The start as an aligned one-element int64 tensor on ``device`` (the kernel's ``start``), or
        with ``positions`` the positions, contiguous and aligned. A start that is not already such a tensor
        is written into this thread and stream's start buffer (:class:`~stitchtune.deploy.torch_guard.
        StreamBuffers`: ``fill_`` with an int, ``copy_`` of a tensor, plus ``start_i``), not allocated per call."""
        if self.positions:
            assert start_t is not None   # _fits
            t = start_t.to(device=device).contiguous()
            return t if t.data_ptr() % 16 == 0 else t.clone()
        if start_t is not None:
            t = start_t.reshape(1)
            if not start_i and t.dtype == torch.int64 and t.data_ptr() % 16 == 0 and t.device == device:
                return t
        buf: torch.Tensor = self._starts.get(device, lambda: [torch.empty((1,), dtype=torch.int64, device=device)])[0]
        if start_t is None:
            return buf.fill_(start_i)
        buf.copy_(start_t.reshape(1))
        return buf.add_(start_i) if start_i else buf

    def _emulate(self, table: torch.Tensor, values: torch.Tensor, start: torch.Tensor) -> None:
        """The kernel in the emulator on ``start`` (int64: the start, or the positions), writing the
        table's own memory (a copy back where not shared)."""
        from stitchtune.emulate.emulator import emulate_kernel

        prog = self.program(table, values, start)
        bf16 = table.dtype == torch.bfloat16
        table, values = table.detach(), values.detach()   # the same memory
        tab = table.view(torch.int16).numpy().view(_bf16()) if bf16 else table.numpy()
        vals = values.view(torch.int16).numpy().view(_bf16()) if bf16 else values.numpy()
        flat = tab.reshape(-1)
        emulate_kernel(prog.kernels[0], prog.launches[0].grid,
                       {"table": flat, "vals": vals.reshape(-1), "start": start.numpy().astype("int64")})
        if not _np_shares(flat, tab):   # pragma: no cover - a contiguous tensor's view shares it
            table.copy_(torch.from_numpy(flat.reshape(tab.shape)))

    def _launch(self, table: torch.Tensor, values: torch.Tensor, start: torch.Tensor) -> None:
        """The kernel on torch's current stream (cubin built and loaded once per shape, GPU and stream);
        CPU tensors under :func:`~stitchtune.deploy.torch_ops.stand_in_driver` (CPU tests of the launch
        path) through its driver, their pointers as they are."""
        from stitchtune.deploy.device_run import build_cubin
        from stitchtune.gpu.driver import open_driver
        from stitchtune.gpu.launch import Launcher, launch_plan
        from stitchtune.gpu.render import render

        if values.data_ptr() % 16:
            values = values.clone()
        dev, stand_in = table.device, _stand_in()
        if dev.type == "cuda":
            index = dev.index if dev.index is not None else torch.cuda.current_device()
            stream = torch.cuda.current_stream(dev).cuda_stream
        else:
            index, stream = -1, 0
        prog = self.program(table, values, start)
        sh = self.shape(table, values, start)
        launcher = self._launchers.get((sh, index, stream))
        if launcher is None:
            cubin = stand_in[1](prog) if stand_in else build_cubin(render(prog), self.device.arch)[1]
            driver = stand_in[0] if stand_in else open_driver(index)
            launcher = self._launchers[(sh, index, stream)] = Launcher(driver, launch_plan(prog), cubin, stream=stream)
        bound = launcher.bind({"table": table.data_ptr(), "values": values.data_ptr(), "start": start.data_ptr()})
        launcher.launch(bound, stream)


def _np_shares(a: Any, b: Any) -> bool:
    import numpy as np

    return bool(np.shares_memory(a, b))


def _stand_in() -> Any:
    """The (driver, image) of :func:`~stitchtune.deploy.torch_ops.stand_in_driver`, or None."""
    from stitchtune.deploy import torch_ops

    return torch_ops._STAND_IN[0]


def _bf16() -> Any:
    from stitchtune.graph.reference import numpy_dtype

    return numpy_dtype("bfloat16")


