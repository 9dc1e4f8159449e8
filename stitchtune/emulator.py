"""A numpy lockstep SIMT emulator of the kernel IR (:mod:`stitchtune.kir`).

Contract
--------
:func:`emulate_kernel` runs one launch of a :class:`~stitchtune.kir.Kernel` in place on named numpy
buffers; :func:`emulate_program` allocates a :class:`~stitchtune.kir.Program`'s buffers, runs its
launches in order and returns its outputs. A bug in a generated kernel raises :class:`EmulatorFault`
(``kind`` + message naming kernel, statement, buffer, element, block and thread); a malformed IR
(unknown variable, bad types) raises ``ValueError``.

Execution model
---------------
All ``T = grid * block`` threads of a launch run in lockstep as numpy arrays of length ``T``
(thread ``t``: ``bid = t // block``, ``tid = t % block``). Variables are ``[T]`` arrays (f32 ->
float32, i32 -> int32, bool); local arrays are ``[T, size]`` float32. Control flow carries an
active mask: ``If`` splits it, ``For`` loops while an active thread has ``var < stop`` (the body
runs under ``mask & (var < stop)``; a thread that leaves never comes back), ``Select``, ``&&`` and
``||`` evaluate their lazy operand only where C would (so loads in them behave as in C).

Memory checks (each one an :class:`EmulatorFault` kind):

* ``out_of_bounds``: an active access outside the buffer (global: ``Param.size``; shared:
  ``SharedBuf.size`` per block; local arrays: their size), or a launch with less dynamic shared
  memory than the kernel's shared buffers;
* ``uninitialized_read``: a load (or atomic) of a global / shared element nothing wrote;
* ``bad_alignment``: a vector access whose index is not a multiple of its width, or wider than 16 B
  (also for shared buffers, as kir states, although the renderer splits those into scalar accesses);
* ``shared_race``: within one barrier interval, a shared element written by one thread and read or
  written by another thread of the same block;
* ``global_race``: within one grid-sync interval of a launch, a global element written by one block
  and read or written by another block (atomic adds from several blocks do not race each other;
  an atomic add races with a plain read or write from another block);
* ``divergent_barrier``: ``Barrier`` reached by some but not all threads of a block, ``GridSync``
  reached by some but not all threads of the launch;
* ``inactive_shuffle``: ``Shfl`` executed by some but not all lanes of a warp;
* ``grid_not_coresident``: ``GridSync`` executed with ``grid > coresident_limit``.

Arithmetic: floats are float32 (C's ``fminf``/``fmaxf``/``fmodf`` for min/max/%), integers int32 with C
truncating division and remainder, mixed int/float operands promote to float32 as in C. Graph
operators (:class:`~stitchtune.kir.MathOp`) use ``stitchtune.ops.OPS[name].np_fn`` on float32
arrays. float16 / bfloat16 buffers are widened to float32 on load and rounded to nearest even on
store (``np.float16`` / ``ml_dtypes.bfloat16``), like ``__float2half_rn`` / ``__float2bfloat16_rn``.
Variables start at zero (the renderer declares them ``= 0`` at the top of the kernel); local arrays
are not initialised in CUDA, so here they start as NaN and a missing initialisation shows in the
output.
"""

from __future__ import annotations

import logging
import weakref
from collections.abc import Callable
from typing import Any

import ml_dtypes
import numpy as np

from stitchtune import kir
from stitchtune.kir import (
    BOOL,
    CMP_OPS,
    F32,
    I32,
    Assign,
    AtomicAdd,
    Barrier,
    Bin,
    Cast,
    Comment,
    Const,
    For,
    GridSync,
    If,
    Kernel,
    Load,
    LoadVec,
    LocalRef,
    MathOp,
    Program,
    Select,
    SetLocal,
    Shfl,
    Special,
    StoreVec,
    Var,
)

log = logging.getLogger(__name__)

FAULT_KINDS = (
    "out_of_bounds",
    "uninitialized_read",
    "shared_race",
    "global_race",
    "divergent_barrier",
    "inactive_shuffle",
    "grid_not_coresident",
    "bad_alignment",
)

#: numpy element type of each buffer dtype (barrier buffers are always uint32)
NP_ELEM: dict[str, Any] = {
    "float32": np.dtype(np.float32),
    "float16": np.dtype(np.float16),
    "bfloat16": np.dtype(ml_dtypes.bfloat16),
    "uint32": np.dtype(np.uint32),
}
_NP_SCALAR = {F32: np.float32, I32: np.int32, BOOL: np.bool_}
_ELEM_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2, "uint32": 4}


class EmulatorFault(Exception):
    """A bug in a generated kernel found by the emulator. ``kind`` is one of :data:`FAULT_KINDS`."""

    def __init__(self, kind: str, message: str) -> None:
        if kind not in FAULT_KINDS:
            raise ValueError(f"unknown fault kind {kind!r}")
        self.kind = kind
        self.message = message
        super().__init__(f"{kind}: {message}")


def elem_dtype(dtype: str, role: str = "") -> np.dtype:
    """The numpy dtype holding a buffer of graph dtype ``dtype`` (``role == 'barrier'``: uint32)."""
    if role == "barrier":
        return NP_ELEM["uint32"]
    return NP_ELEM[dtype]


# ----------------------------------------------------------------------------------------------
# Race tracking
# ----------------------------------------------------------------------------------------------


class _Tracker:
    """Per-element accessors of the current interval, one int32 array per access kind.

    ``w`` (plain writes), ``r`` (plain reads), ``a`` (atomic adds) hold -1 (nobody), the single
    accessor id, or -2 (several different accessors). Accessor ids are block ids (global memory) or
    thread ids (shared memory).
    """

    def __init__(self, n: int, atomics: bool) -> None:
        self.w = np.full(n, -1, np.int32)
        self.r = np.full(n, -1, np.int32)
        self.a = np.full(n, -1, np.int32) if atomics else None  # None: the kernel has no atomics here

    def reset(self, rows: np.ndarray | None = None, row_len: int = 0) -> None:
        """Start a new interval for all elements, or for the blocks ``rows`` (bool) of length ``row_len``."""
        for arr in (self.w, self.r, self.a):
            if arr is None:
                continue
            if rows is None:
                arr.fill(-1)
            else:
                arr.reshape(-1, row_len)[rows] = -1

    @staticmethod
    def _other(arr: np.ndarray, e: np.ndarray, who: np.ndarray) -> np.ndarray:
        """Lanes whose element has an accessor other than ``who`` in ``arr``."""
        x = arr[e]
        return (x != -1) & (x != who)

    @staticmethod
    def _add(arr: np.ndarray, e: np.ndarray, who: np.ndarray) -> None:
        """Record ``who`` as an accessor of ``e`` (exact also when lanes share an element)."""
        x = arr[e]
        arr[e] = np.where((x == -1) | (x == who), who, np.int32(-2))
        y = arr[e]  # with duplicate elements the last lane won: a lane that sees a different id clashes
        clash = (y != who) & (y != -2)
        if clash.any():
            arr[e[clash]] = -2

    def read(self, e: np.ndarray, who: np.ndarray) -> np.ndarray:
        bad = self._other(self.w, e, who)
        if self.a is not None:
            bad |= self._other(self.a, e, who)
        self._add(self.r, e, who)
        return bad

    def write(self, e: np.ndarray, who: np.ndarray) -> np.ndarray:
        self._add(self.w, e, who)  # first, so that two writers in one statement conflict
        bad = self._other(self.w, e, who)
        bad |= self._other(self.r, e, who)
        if self.a is not None:
            bad |= self._other(self.a, e, who)
        return bad

    def atomic(self, e: np.ndarray, who: np.ndarray) -> np.ndarray:
        assert self.a is not None
        self._add(self.a, e, who)
        bad = self._other(self.w, e, who)
        bad |= self._other(self.r, e, who)
        return bad


# ----------------------------------------------------------------------------------------------
# Launch state
# ----------------------------------------------------------------------------------------------


class _GBuf:
    """A global buffer as seen by one launch."""

    def __init__(self, param: kir.Param, arr: np.ndarray, written: np.ndarray, tracked: bool,
                 atomics: bool) -> None:
        self.name = param.name
        self.arr = arr
        self.size = param.size
        self.written = written
        self.check_written = not bool(written[: param.size].all())  # stays all-True once all-True
        self.tracker = _Tracker(param.size, atomics) if tracked else None


class _SBuf:
    """A shared buffer: ``[grid * size]`` float32 values, written flags and a race tracker."""

    def __init__(self, size: int, grid: int, bid: np.ndarray) -> None:
        self.size = size
        self.arr = np.zeros(grid * size, np.float32)
        self.written = np.zeros(grid * size, bool)
        self.tracker = _Tracker(grid * size, atomics=False)
        # element offset of each thread's block in the flat array
        self.lane_base = bid.astype(np.int32 if grid * size < 2**31 else np.int64) * size


class _State:
    def __init__(self, ck: _Compiled, grid: int, buffers: dict[str, np.ndarray],
                 written: dict[str, np.ndarray], coresident_limit: int | None) -> None:
        k = ck.kernel
        self.kernel = k
        self.grid = grid
        self.block = k.block
        self.T = T = grid * k.block
        t = np.arange(T, dtype=np.int32)
        self.tid = t % np.int32(k.block)
        self.bid = t // np.int32(k.block)
        self.lane = self.tid % np.int32(32)
        self.ar = t
        self.coresident_limit = coresident_limit
        self.where = ""
        self.vars: dict[str, np.ndarray] = {}
        for name, dt in ck.var_types.items():  # declared `= 0` at the top, as render_cuda does
            self.vars[name] = np.zeros(T, _NP_SCALAR[dt])
        self.locals = {a.name: np.full((T, a.size), np.nan, np.float32) for a in k.locals}
        self.glob: dict[str, _GBuf] = {}
        for p in k.params:
            if p.name not in buffers:
                raise ValueError(f"kernel {k.name}: no buffer for parameter {p.name}")
            arr = buffers[p.name]
            want = elem_dtype(p.dtype, p.role)
            if arr.ndim != 1 or arr.dtype != want or arr.size < p.size:
                raise ValueError(f"kernel {k.name}: buffer {p.name} must be 1-D {want} of >= {p.size} "
                                 f"elements, got {arr.dtype} {arr.shape}")
            w = written.get(p.name)
            if w is None:
                w = np.ones(arr.size, bool)
            self.glob[p.name] = _GBuf(p, arr, w, tracked=p.name in ck.written_params,
                                      atomics=p.name in ck.atomic_params)
        self.shared = {s.name: _SBuf(s.size, grid, self.bid) for s in k.shared}
        self._shfl_src: dict[tuple[int, int], np.ndarray] = {}

    def shfl_src(self, lane_mask: int, width: int) -> np.ndarray:
        key = (lane_mask, width)
        if key not in self._shfl_src:
            lane = self.lane
            src = lane ^ np.int32(lane_mask)
            # CUDA: a source lane in a later width-segment returns the caller's own value
            src = np.where(src >= (lane // width + 1) * width, lane, src)
            self._shfl_src[key] = (self.ar - lane + src).astype(np.intp)
        return self._shfl_src[key]

    def fault(self, kind: str, what: str, bad: np.ndarray, lanes: np.ndarray,
              elems: np.ndarray | None = None) -> EmulatorFault:
        """Build a fault naming the first offending lane (``bad`` is aligned with ``lanes``)."""
        idx = np.flatnonzero(bad)
        i = int(idx[0])
        t = int(lanes[i])
        at = f"[{int(elems[i])}]" if elems is not None else ""
        what = what.replace("{at}", at) if "{at}" in what else what + at
        return EmulatorFault(kind, f"kernel {self.kernel.name} (grid {self.grid}, block {self.block}), "
                                   f"{self.where}: {what} by block {t // self.block} thread "
                                   f"{t % self.block} ({idx.size} offending access(es))")


def _lanes_of(x: Any, lanes: np.ndarray) -> np.ndarray:
    """The values of ``x`` (a [T] array or a scalar) at ``lanes``."""
    if np.ndim(x) == 0:
        return np.full(lanes.size, x)
    return x[lanes]


def _access(st: _State, buf: str, is_shared: bool, lanes: np.ndarray, base: np.ndarray, width: int,
            op: str, values: np.ndarray | None = None) -> np.ndarray | None:
    """One (vector) memory access of ``width`` elements from ``base`` by each thread in ``lanes``.

    ``op``: load (returns float32 [n, width]), store or atomic (``values`` float32 [n, width]).
    """
    base = np.ascontiguousarray(base, dtype=np.int32)  # IR indices are i32
    if width > 1:
        mis = (base & np.int32(width - 1)) != 0  # widths are powers of two
        if mis.any():
            raise st.fault("bad_alignment", f"{width}-wide access to {buf}{{at}}", mis, lanes, base)
        e = (base[:, None] + np.arange(width, dtype=np.int32)).ravel()
        lr = np.repeat(lanes, width)
    else:
        e, lr = base, lanes
    if is_shared:
        sb = st.shared[buf]
        size = sb.size
    else:
        gb = st.glob[buf]
        size = gb.size
    oob = e.view(np.uint32) >= size  # negative indices wrap to huge unsigned values
    if oob.any():
        raise st.fault("out_of_bounds", f"{op} of {buf}{{at}} (size {size})", oob, lr, e)
    if is_shared:
        g = sb.lane_base[lr] + e
        who = st.tid[lr]
        arr, written, tracker, race = sb.arr, sb.written, sb.tracker, "shared_race"
        check_written = True
    else:
        g = e
        who = st.bid[lr]
        arr, written, tracker, race = gb.arr, gb.written, gb.tracker, "global_race"
        check_written = gb.check_written
    if op in ("load", "atomic") and check_written:
        un = ~written[g]
        if un.any():
            raise st.fault("uninitialized_read", f"{op} of unwritten {buf}{{at}}", un, lr, e)
    if op == "load":
        if tracker is not None:
            bad = tracker.read(g, who)
            if bad.any():
                raise st.fault(race, f"read of {buf}{{at}} written by another "
                               f"{'thread' if is_shared else 'block'} without a barrier", bad, lr, e)
        v = arr[g]
        if v.dtype != np.float32:
            v = v.astype(np.float32)
        return v.reshape(-1, width)
    assert values is not None
    if op == "store":
        if tracker is not None:
            bad = tracker.write(g, who)
            if bad.any():
                raise st.fault(race, f"write of {buf}{{at}} accessed by another "
                               f"{'thread' if is_shared else 'block'} without a barrier", bad, lr, e)
        arr[g] = values.ravel().astype(arr.dtype, copy=False)
        written[g] = True
        return None
    # atomic add
    if tracker is not None:
        bad = tracker.atomic(g, who)
        if bad.any():
            raise st.fault(race, f"atomic add to {buf}{{at}} also plainly accessed by another block", bad, lr, e)
    np.add.at(arr, g, values.ravel())
    return None


def _shared_broadcast_load(st: _State, buf: str, iv: Any) -> np.ndarray | None:
    """Fast path of a shared load by every thread where the index repeats with a period ``p < block``
    along the threads of each block (``p == 1``: one element per block, a broadcast).

    Then each element read is read by ``block / p >= 2`` threads, so any writer of it in this
    interval is a race. Same checks as :func:`_access`, on ``grid * p`` elements instead of ``T``;
    returns None when the index has no such period (the caller takes the general path).
    """
    grid, block = st.grid, st.block
    if np.ndim(iv) == 0:
        p = 1
        ib = np.full((grid, 1), iv, np.int32)
    else:
        per_block = iv.reshape(grid, block)
        row0 = per_block[0]
        p = 1
        while p < block and not (row0.reshape(-1, p) == row0[:p]).all():
            p *= 2
        if p >= block:
            return None
        ib = per_block[:, :p]
        if not (per_block.reshape(grid, block // p, p) == ib[:, None, :]).all():
            return None
        ib = np.ascontiguousarray(ib, dtype=np.int32)
    sb = st.shared[buf]
    lanes = (st.ar[::block][:, None] + np.arange(p, dtype=np.int32)).ravel()  # threads to name in a fault
    ib = ib.ravel()
    oob = ib.view(np.uint32) >= sb.size
    if oob.any():
        raise st.fault("out_of_bounds", f"load of {buf}{{at}} (size {sb.size})", oob, lanes, ib)
    g = sb.lane_base[lanes] + ib
    un = ~sb.written[g]
    if un.any():
        raise st.fault("uninitialized_read", f"load of unwritten {buf}{{at}}", un, lanes, ib)
    w = sb.tracker.w[g]
    bad = w != -1  # several threads read each element: any writer in this interval races with one
    if bad.any():
        other = lanes + np.where(w == st.tid[lanes], p, 0).astype(np.int32)  # a reader that is not the writer
        raise st.fault("shared_race", f"read of {buf}{{at}} written by another thread without a barrier",
                       bad, other, ib)
    sb.tracker.r[g] = -2
    v = sb.arr[g].reshape(grid, 1, p)
    return np.broadcast_to(v, (grid, block // p, p)).reshape(st.T)


# ----------------------------------------------------------------------------------------------
# Compilation of IR trees into closures
# ----------------------------------------------------------------------------------------------

ExprFn = Callable[[_State, np.ndarray], Any]
StmtFn = Callable[[_State, np.ndarray], None]


def _cast_fn(fn: ExprFn, src: str, dst: str) -> ExprFn:
    """Convert values of type ``src`` to ``dst`` with C semantics."""
    if src == dst:
        return fn
    if dst == F32:
        return lambda st, m: np.asarray(fn(st, m)).astype(np.float32)
    if dst == I32:
        # float -> int truncates toward zero like C; bool -> 0/1
        return lambda st, m: np.asarray(fn(st, m)).astype(np.int32)
    if dst == BOOL:
        return lambda st, m: np.asarray(fn(st, m)) != 0
    raise ValueError(f"unknown type {dst}")


def _int_div(a: Any, b: Any) -> Any:
    b = np.where(b == 0, np.int32(1), b)
    return ((a - np.fmod(a, b)) // b).astype(np.int32)


def _int_mod(a: Any, b: Any) -> Any:
    b = np.where(b == 0, np.int32(1), b)
    return np.fmod(a, b).astype(np.int32)


_FLOAT_BIN: dict[str, Callable[[Any, Any], Any]] = {
    "+": np.add, "-": np.subtract, "*": np.multiply, "/": np.divide, "%": np.fmod,
    "min": np.fmin, "max": np.fmax,
}
_INT_BIN: dict[str, Callable[[Any, Any], Any]] = {
    "+": np.add, "-": np.subtract, "*": np.multiply, "/": _int_div, "%": _int_mod,
    "min": np.minimum, "max": np.maximum, "&": np.bitwise_and, "^": np.bitwise_xor,
    ">>": np.right_shift, "<<": np.left_shift,
}
_CMP: dict[str, Callable[[Any, Any], Any]] = {
    "<": np.less, "<=": np.less_equal, ">": np.greater, ">=": np.greater_equal,
    "==": np.equal, "!=": np.not_equal,
}


class _Compiled:
    """A kernel compiled into closures (cached per kernel object)."""

    def __init__(self, kernel: Kernel) -> None:
        self.kernel = kernel
        self.var_types = {v.name: v.dtype for v in kir.collect_vars(kernel)}
        for name, dt in self.var_types.items():
            if dt not in _NP_SCALAR:
                raise ValueError(f"kernel {kernel.name}: variable {name} has unknown type {dt}")
        self.params = {p.name: p for p in kernel.params}
        self.shared = {s.name: s for s in kernel.shared}
        self.locals = {a.name: a for a in kernel.locals}
        if len({*self.params, *self.shared, *self.locals}) != len(self.params) + len(self.shared) + len(self.locals):
            raise ValueError(f"kernel {kernel.name}: a name is used by two buffers")
        self.written_params: set[str] = set()
        self.atomic_params: set[str] = set()
        self.has_grid_sync = False
        for s in kir.walk(kernel.body):
            if isinstance(s, (StoreVec, AtomicAdd)) and s.buf in self.params:
                self.written_params.add(s.buf)
            if isinstance(s, AtomicAdd):
                self.atomic_params.add(s.buf)
            if isinstance(s, GridSync):
                self.has_grid_sync = True
        if self.has_grid_sync and kernel.barrier_param not in self.params:
            raise ValueError(f"kernel {kernel.name}: GridSync needs barrier_param naming a parameter")
        self.body = self.block_fn(kernel.body, "stmt ")

    # -- expressions ---------------------------------------------------------------------------

    def buf_kind(self, name: str) -> bool:
        """True if ``name`` is a shared buffer, False for a parameter; ValueError otherwise."""
        if name in self.shared:
            return True
        if name in self.params:
            return False
        raise ValueError(f"kernel {self.kernel.name}: unknown buffer {name}")

    def expr(self, e: kir.Expr) -> tuple[ExprFn, str]:
        """Compile ``e`` into ``fn(state, mask) -> array | scalar`` and its static type."""
        if isinstance(e, Const):
            v = _NP_SCALAR[e.dtype](e.value)
            return (lambda st, m: v), e.dtype
        if isinstance(e, Var):
            if e.name not in self.var_types:
                raise ValueError(f"kernel {self.kernel.name}: variable {e.name} is never assigned")
            name = e.name
            return (lambda st, m: st.vars[name]), self.var_types[name]
        if isinstance(e, Special):
            kind = e.kind
            if kind == "tid":
                return (lambda st, m: st.tid), I32
            if kind == "bid":
                return (lambda st, m: st.bid), I32
            if kind == "bdim":
                return (lambda st, m: np.int32(st.block)), I32
            return (lambda st, m: np.int32(st.grid)), I32
        if isinstance(e, Bin):
            return self.bin(e)
        if isinstance(e, MathOp):
            return self.mathop(e)
        if isinstance(e, Select):
            cf = self.as_type(e.cond, BOOL)
            (af, at), (bf, bt) = self.expr(e.a), self.expr(e.b)
            rt = _promote(at, bt)
            af, bf = _cast_fn(af, at, rt), _cast_fn(bf, bt, rt)

            def select(st: _State, m: np.ndarray) -> Any:
                c = cf(st, m)
                return np.where(c, af(st, m & c), bf(st, m & ~c))
            return select, rt
        if isinstance(e, Cast):
            f, t = self.expr(e.expr)
            return _cast_fn(f, t, e.dtype), e.dtype
        if isinstance(e, Load):
            return self.load(e), F32
        if isinstance(e, LocalRef):
            return self.localref(e), F32
        if isinstance(e, Shfl):
            return self.shfl(e), F32
        raise ValueError(f"unknown expression {e!r}")

    def as_type(self, e: kir.Expr, t: str) -> ExprFn:
        f, et = self.expr(e)
        return _cast_fn(f, et, t)

    def bin(self, e: Bin) -> tuple[ExprFn, str]:
        op = e.op
        (af, at), (bf, bt) = self.expr(e.a), self.expr(e.b)
        if op in ("&&", "||"):
            af, bf = _cast_fn(af, at, BOOL), _cast_fn(bf, bt, BOOL)
            if op == "&&":
                def land(st: _State, m: np.ndarray) -> Any:
                    a = af(st, m)
                    return a & bf(st, m & a)  # b only where a holds (C short-circuit)
                return land, BOOL

            def lor(st: _State, m: np.ndarray) -> Any:
                a = af(st, m)
                return a | bf(st, m & ~a)
            return lor, BOOL
        if op in CMP_OPS:
            ct = _promote(at, bt)
            if ct == BOOL:
                ct = I32
            af, bf = _cast_fn(af, at, ct), _cast_fn(bf, bt, ct)
            cmp = _CMP[op]
            return (lambda st, m: cmp(af(st, m), bf(st, m))), BOOL
        if op in ("&", "^") and at == BOOL and bt == BOOL:
            fn = np.bitwise_and if op == "&" else np.bitwise_xor
            return (lambda st, m: fn(af(st, m), bf(st, m))), BOOL
        rt = _promote(at, bt)
        if rt == BOOL:
            rt = I32
        if rt == F32:
            if op not in _FLOAT_BIN:
                raise ValueError(f"operator {op} on float operands")
            fn = _FLOAT_BIN[op]
        else:
            fn = _INT_BIN[op]
        af, bf = _cast_fn(af, at, rt), _cast_fn(bf, bt, rt)
        return (lambda st, m: fn(af(st, m), bf(st, m))), rt

    def mathop(self, e: MathOp) -> tuple[ExprFn, str]:
        from stitchtune.ops import OPS  # written in parallel; imported when a kernel uses an op

        if e.op not in OPS:
            raise ValueError(f"unknown graph operator {e.op}")
        np_fn = OPS[e.op].np_fn
        args = [self.as_type(a, F32) for a in e.args]

        def mathop(st: _State, m: np.ndarray) -> Any:
            vals = [a(st, m) for a in args]
            return np.asarray(np_fn(*vals)).astype(np.float32, copy=False)
        return mathop, F32

    def load(self, e: Load) -> ExprFn:
        is_shared = self.buf_kind(e.buf)
        idx = self.as_type(e.index, I32)
        pred = self.as_type(e.pred, BOOL) if e.pred is not None else None
        buf = e.buf

        def load(st: _State, m: np.ndarray) -> Any:
            act = m & pred(st, m) if pred is not None else m
            lanes = np.flatnonzero(act)
            if lanes.size == st.T:  # every thread loads: no compaction needed
                iv = idx(st, act)
                if is_shared:
                    v = _shared_broadcast_load(st, buf, iv)
                    if v is not None:
                        return v
                return _access(st, buf, is_shared, st.ar, np.broadcast_to(iv, (st.T,)), 1, "load")[:, 0]
            out = np.zeros(st.T, np.float32)
            if lanes.size:
                base = _lanes_of(idx(st, act), lanes)
                out[lanes] = _access(st, buf, is_shared, lanes, base, 1, "load")[:, 0]
            return out
        return load

    def localref(self, e: LocalRef) -> ExprFn:
        arr_name = e.array
        if arr_name not in self.locals:
            raise ValueError(f"kernel {self.kernel.name}: unknown local array {arr_name}")
        size = self.locals[arr_name].size
        if isinstance(e.index, Const):
            k = int(e.index.value)
            if not 0 <= k < size:
                where = f"local array {arr_name}[{k}] (size {size})"

                def oob(st: _State, m: np.ndarray) -> Any:
                    lanes = np.flatnonzero(m)
                    if lanes.size:
                        raise st.fault("out_of_bounds", where, np.ones(lanes.size, bool), lanes)
                    return np.float32(0)
                return oob
            return lambda st, m: st.locals[arr_name][:, k]
        idx = self.as_type(e.index, I32)

        def localref(st: _State, m: np.ndarray) -> Any:
            i = np.broadcast_to(idx(st, m), (st.T,))
            bad = m & ((i < 0) | (i >= size))
            if bad.any():
                lanes = np.flatnonzero(m)
                raise st.fault("out_of_bounds", f"read of local array {arr_name}{{at}} (size {size})",
                               bad[lanes], lanes, i[lanes])
            return st.locals[arr_name][st.ar, np.clip(i, 0, size - 1)]
        return localref

    def shfl(self, e: Shfl) -> ExprFn:
        if e.width not in (1, 2, 4, 8, 16, 32) or not 0 <= e.lane_mask < 32:
            raise ValueError(f"bad shuffle lane_mask {e.lane_mask} / width {e.width}")
        vf = self.as_type(e.value, F32)
        lane_mask, width = e.lane_mask, e.width

        def shfl(st: _State, m: np.ndarray) -> Any:
            w = m.reshape(-1, 32)
            part = w.any(axis=1) & ~w.all(axis=1)
            if part.any():
                bad = np.repeat(part, 32) & ~m
                raise st.fault("inactive_shuffle", "shuffle with an inactive lane in the warp",
                               bad, st.ar)
            v = vf(st, m)
            if np.ndim(v) == 0:
                return v
            return v[st.shfl_src(lane_mask, width)]
        return shfl

    # -- statements ----------------------------------------------------------------------------

    def block_fn(self, stmts: tuple[kir.Stmt, ...], path: str) -> StmtFn:
        fns = [self.stmt(s, f"{path}{i}") for i, s in enumerate(stmts)
               if not isinstance(s, Comment)]

        def run(st: _State, m: np.ndarray) -> None:
            for f in fns:
                f(st, m)
        return run

    def stmt(self, s: kir.Stmt, path: str) -> StmtFn:
        where = f"{path} ({type(s).__name__}{' ' + s.buf if hasattr(s, 'buf') else ''})"
        if isinstance(s, Assign):
            name = s.var.name
            t = self.var_types[name]
            f = self.as_type(s.expr, t)
            npt = _NP_SCALAR[t]

            def assign(st: _State, m: np.ndarray) -> None:
                st.where = where
                st.vars[name] = np.where(m, f(st, m), st.vars[name]).astype(npt, copy=False)
            return assign
        if isinstance(s, SetLocal):
            return self.setlocal(s, where)
        if isinstance(s, LoadVec):
            return self.loadvec(s, where)
        if isinstance(s, StoreVec):
            return self.storevec(s, where)
        if isinstance(s, AtomicAdd):
            return self.atomic(s, where)
        if isinstance(s, For):
            return self.for_(s, path, where)
        if isinstance(s, If):
            cf = self.as_type(s.cond, BOOL)
            then = self.block_fn(s.then, path + ".t")
            orelse = self.block_fn(s.orelse, path + ".e") if s.orelse else None

            def if_(st: _State, m: np.ndarray) -> None:
                st.where = where
                c = cf(st, m)
                mt = m & c
                if mt.any():
                    then(st, mt)
                if orelse is not None:
                    mf = m & ~c
                    if mf.any():
                        orelse(st, mf)
            return if_
        if isinstance(s, Barrier):
            def barrier(st: _State, m: np.ndarray) -> None:
                st.where = where
                b = m.reshape(st.grid, st.block)
                some, every = b.any(axis=1), b.all(axis=1)
                part = some & ~every
                if part.any():
                    raise st.fault("divergent_barrier", "__syncthreads() not reached by every thread "
                                   "of the block", np.repeat(part, st.block) & ~m, st.ar)
                for sb in st.shared.values():
                    sb.tracker.reset(every, sb.size)
            return barrier
        if isinstance(s, GridSync):
            def gridsync(st: _State, m: np.ndarray) -> None:
                st.where = where
                if not m.all():
                    raise st.fault("divergent_barrier", "grid sync not reached by every thread",
                                   ~m, st.ar)
                if st.coresident_limit is not None and st.grid > st.coresident_limit:
                    raise EmulatorFault("grid_not_coresident",
                                        f"kernel {st.kernel.name}, {where}: grid sync over {st.grid} "
                                        f"blocks, at most {st.coresident_limit} can be co-resident")
                for gb in st.glob.values():
                    if gb.tracker is not None:
                        gb.tracker.reset()
                for sb in st.shared.values():
                    sb.tracker.reset()
            return gridsync
        raise ValueError(f"unknown statement {s!r}")

    def setlocal(self, s: SetLocal, where: str) -> StmtFn:
        arr_name = s.array
        if arr_name not in self.locals:
            raise ValueError(f"kernel {self.kernel.name}: unknown local array {arr_name}")
        size = self.locals[arr_name].size
        vf = self.as_type(s.value, F32)
        if isinstance(s.index, Const) and 0 <= int(s.index.value) < size:
            k = int(s.index.value)

            def setlocal_const(st: _State, m: np.ndarray) -> None:
                st.where = where
                a = st.locals[arr_name]
                a[:, k] = np.where(m, vf(st, m), a[:, k])
            return setlocal_const
        idx = self.as_type(s.index, I32)

        def setlocal(st: _State, m: np.ndarray) -> None:
            st.where = where
            lanes = np.flatnonzero(m)
            i = _lanes_of(idx(st, m), lanes)
            bad = (i < 0) | (i >= size)
            if bad.any():
                raise st.fault("out_of_bounds", f"write of local array {arr_name}{{at}} (size {size})",
                               bad, lanes, i)
            st.locals[arr_name][lanes, i] = _lanes_of(vf(st, m), lanes)
        return setlocal

    def _vec_check(self, buf: str, width: int, is_shared: bool) -> None:
        dtype = "float32" if is_shared else self.params[buf].dtype
        nbytes = width * _ELEM_BYTES.get(dtype, 4)
        if width not in (1, 2, 4, 8) or nbytes > 16:
            raise EmulatorFault("bad_alignment", f"kernel {self.kernel.name}: a {width}-wide access "
                                f"to {buf} ({dtype}) is not one aligned access of at most 16 bytes")

    def loadvec(self, s: LoadVec, where: str) -> StmtFn:
        is_shared = self.buf_kind(s.buf)
        width = len(s.dsts)
        self._vec_check(s.buf, width, is_shared)
        idx = self.as_type(s.index, I32)
        pred = self.as_type(s.pred, BOOL) if s.pred is not None else None
        dsts = [(d.name, _NP_SCALAR[self.var_types[d.name]]) for d in s.dsts]
        buf = s.buf

        def loadvec(st: _State, m: np.ndarray) -> None:
            st.where = where
            act = m & pred(st, m) if pred is not None else m
            lanes = np.flatnonzero(act)
            if not lanes.size:
                return
            base = _lanes_of(idx(st, act), lanes)
            vals = _access(st, buf, is_shared, lanes, base, width, "load")
            for k, (name, npt) in enumerate(dsts):
                a = st.vars[name].copy()
                a[lanes] = vals[:, k]
                st.vars[name] = a
        return loadvec

    def storevec(self, s: StoreVec, where: str) -> StmtFn:
        is_shared = self.buf_kind(s.buf)
        width = len(s.values)
        self._vec_check(s.buf, width, is_shared)
        idx = self.as_type(s.index, I32)
        pred = self.as_type(s.pred, BOOL) if s.pred is not None else None
        vals = [self.as_type(v, F32) for v in s.values]
        buf = s.buf

        def storevec(st: _State, m: np.ndarray) -> None:
            st.where = where
            act = m & pred(st, m) if pred is not None else m
            lanes = np.flatnonzero(act)
            if not lanes.size:
                return
            base = _lanes_of(idx(st, act), lanes)
            v = np.stack([_lanes_of(f(st, act), lanes) for f in vals], axis=1).astype(np.float32, copy=False)
            _access(st, buf, is_shared, lanes, base, width, "store", v)
        return storevec

    def atomic(self, s: AtomicAdd, where: str) -> StmtFn:
        if self.buf_kind(s.buf) or self.params[s.buf].dtype != "float32":
            raise ValueError(f"kernel {self.kernel.name}: atomic add needs a float32 global buffer, "
                             f"not {s.buf}")
        idx = self.as_type(s.index, I32)
        pred = self.as_type(s.pred, BOOL) if s.pred is not None else None
        vf = self.as_type(s.value, F32)
        buf = s.buf

        def atomic(st: _State, m: np.ndarray) -> None:
            st.where = where
            act = m & pred(st, m) if pred is not None else m
            lanes = np.flatnonzero(act)
            if not lanes.size:
                return
            base = _lanes_of(idx(st, act), lanes)
            v = _lanes_of(vf(st, act), lanes).astype(np.float32, copy=False)[:, None]
            _access(st, buf, False, lanes, base, 1, "atomic", v)
        return atomic

    def for_(self, s: For, path: str, where: str) -> StmtFn:
        if s.var.dtype != I32 or self.var_types.get(s.var.name) != I32:
            raise ValueError(f"loop variable {s.var.name} must be i32")
        if s.step <= 0:
            raise ValueError(f"loop over {s.var.name} has step {s.step} (must be positive)")
        name = s.var.name
        start = self.as_type(s.start, I32)
        stop = self.as_type(s.stop, I32)
        step = np.int32(s.step)
        body = self.block_fn(s.body, path + ".")

        def for_(st: _State, m: np.ndarray) -> None:
            st.where = where
            st.vars[name] = np.where(m, start(st, m), st.vars[name]).astype(np.int32, copy=False)
            act = m
            while True:
                st.where = where
                act = act & (st.vars[name] < stop(st, act))
                if not act.any():
                    return
                body(st, act)
                v = st.vars[name]
                st.vars[name] = np.where(act, v + step, v).astype(np.int32, copy=False)
        return for_


def _promote(a: str, b: str) -> str:
    """C's usual arithmetic conversions restricted to bool < i32 < f32."""
    order = {BOOL: 0, I32: 1, F32: 2}
    return a if order[a] >= order[b] else b


_CACHE: dict[int, tuple[weakref.ref, _Compiled]] = {}


def _compiled(kernel: Kernel) -> _Compiled:
    """The closures of ``kernel``, compiled once per kernel object."""
    hit = _CACHE.get(id(kernel))
    if hit is not None and hit[0]() is kernel:
        return hit[1]
    ck = _Compiled(kernel)
    for key in [k for k, (r, _) in _CACHE.items() if r() is None]:
        del _CACHE[key]
    _CACHE[id(kernel)] = (weakref.ref(kernel), ck)
    return ck


# ----------------------------------------------------------------------------------------------
# Public API
# ----------------------------------------------------------------------------------------------


def emulate_kernel(kernel: Kernel, grid: int, buffers: dict[str, np.ndarray], *,
                   written: dict[str, np.ndarray] | None = None,
                   coresident_limit: int | None = None) -> None:
    """Run one launch ``kernel<<<grid, kernel.block>>>`` in place on ``buffers``.

    ``buffers`` maps each parameter name to a 1-D numpy array of the parameter's element type
    (:func:`elem_dtype`) with at least ``Param.size`` elements. ``written[name]`` (optional, bool,
    same length) says which elements hold data; loads of other elements fault, and stores set it
    (updated in place). A missing entry means fully written. ``coresident_limit``: the most blocks
    that can be co-resident; a ``GridSync`` in a larger grid raises ``grid_not_coresident``.
    Raises :class:`EmulatorFault` on a kernel bug (buffers are then partly updated).
    """
    if grid < 1 or grid * kernel.block >= 2**31:
        raise ValueError(f"grid {grid} x block {kernel.block} is not an emulable launch")
    ck = _compiled(kernel)
    st = _State(ck, grid, buffers, written or {}, coresident_limit)
    with np.errstate(all="ignore"):
        ck.body(st, np.ones(st.T, bool))


def emulate_program(program: Program, inputs: dict[str, np.ndarray], *,
                    coresident_limit: Callable[[Kernel], int] | None = None) -> dict[str, np.ndarray]:
    """Run every launch of ``program`` on fresh buffers; return ``{output tensor: flat array}``.

    Inputs are taken from ``inputs`` by ``BufferSpec.tensor`` (any shape, flattened in C order and
    converted to the buffer dtype). Outputs start as NaN and unwritten; scratch buffers with
    ``zero_init`` start as zeros (written), others as NaN (unwritten); barrier buffers are zeroed
    uint32. Returned arrays are 1-D in the buffer dtype (the caller reshapes to the graph shape).
    """
    arrays: dict[str, np.ndarray] = {}
    written: dict[str, np.ndarray] = {}
    for b in program.buffers:
        dt = elem_dtype(b.dtype, b.role)
        if b.role == "input":
            if b.tensor not in inputs:
                raise ValueError(f"no input for tensor {b.tensor!r} (buffer {b.name})")
            src = np.asarray(inputs[b.tensor]).ravel()
            if src.size != b.size:
                raise ValueError(f"input {b.tensor!r} has {src.size} elements, buffer {b.name} {b.size}")
            arrays[b.name] = src.astype(dt)
            written[b.name] = np.ones(b.size, bool)
        elif b.role == "barrier" or (b.role == "scratch" and b.zero_init):
            arrays[b.name] = np.zeros(b.size, dt)
            written[b.name] = np.ones(b.size, bool)
        elif b.role in ("output", "scratch"):
            arrays[b.name] = np.full(b.size, np.nan, np.float32).astype(dt)
            written[b.name] = np.zeros(b.size, bool)
        else:
            raise ValueError(f"buffer {b.name} has unknown role {b.role!r}")
    for i, launch in enumerate(program.launches):
        kernel = program.kernel(launch.kernel)
        if launch.block != kernel.block:
            raise ValueError(f"launch {i} of {kernel.name}: block {launch.block} != kernel block {kernel.block}")
        if launch.smem_bytes < kernel.smem_bytes:
            raise EmulatorFault("out_of_bounds", f"launch {i} of {kernel.name}: {launch.smem_bytes} B of dynamic "
                                f"shared memory for {kernel.smem_bytes} B of shared buffers")
        if len(launch.args) != len(kernel.params):
            raise ValueError(f"launch {i} of {kernel.name}: {len(launch.args)} args for "
                             f"{len(kernel.params)} parameters")
        kb = {p.name: arrays[a] for p, a in zip(kernel.params, launch.args)}
        kw = {p.name: written[a] for p, a in zip(kernel.params, launch.args)}
        limit = coresident_limit(kernel) if coresident_limit is not None else None
        log.debug("emulating launch %d: %s<<<%d, %d>>>", i, kernel.name, launch.grid, launch.block)
        emulate_kernel(kernel, launch.grid, kb, written=kw, coresident_limit=limit)
    return {b.tensor: arrays[b.name].copy() for b in program.buffers if b.role == "output"}
