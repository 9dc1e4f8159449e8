"""Compilation of a kir :class:`~stitchtune.ir.kir.Kernel` into numpy closures for the emulator.

Contract
--------
* ``_compiled(kernel)`` returns the kernel's ``_Compiled`` form, built once per kernel object (cached by
  identity while the kernel lives: the compiled form refers to its kernel weakly, and the entry leaves
  the cache when the kernel is collected). Building it checks the IR and raises ``ValueError`` for a
  malformed kernel (unknown variable, buffer or type, a name used by two buffers, a non-i32 loop
  variable, ...).
* ``_Compiled`` is a :class:`~stitchtune.emulate.memory._CompiledKernel` (the kernel, its variable
  types, the parameters it writes / adds to atomically), what a ``_State`` is built from.
* ``_Compiled.body(state, mask)`` runs the kernel body on a
  :class:`~stitchtune.emulate.memory._State` under the active ``mask`` (``[T]`` bool). Every
  expression becomes ``fn(state, mask) -> [T] array | scalar`` with a static type, every statement
  ``fn(state, mask) -> None``; control flow, C arithmetic and barrier / shuffle checks follow the
  semantics in :mod:`stitchtune.emulate.emulator`'s docstring. Expressions are compiled by
  :class:`~stitchtune.emulate.translate_expr.ExprCompiler` (its base class), statements here. Memory accesses go through
  :mod:`stitchtune.emulate.memory` (``_access``), which raises :class:`EmulatorFault` on a kernel bug.
"""

from __future__ import annotations

import weakref
from typing import assert_never

import numpy as np

from stitchtune.emulate.cluster_ops import StmtFn
from stitchtune.ir import kir
from stitchtune.emulate.memory import (
    _NP_SCALAR,
    EmulatorFault,
    _access,
    _active,
    _lanes_of,
    _State,
)
from stitchtune.emulate.translate_expr import ExprCompiler
from stitchtune.ir.kir import (
    ATOMIC_DTYPES,
    BOOL,
    F32,
    I32,
    I64,
    Assign,
    AtomicAdd,
    Barrier,
    Comment,
    Const,
    For,
    GridSync,
    If,
    Kernel,
    LoadVec,
    SetLocal,
    StoreVec,
)

# ----------------------------------------------------------------------------------------------
# Compilation of IR trees into closures
# ----------------------------------------------------------------------------------------------


def _nothing(st: _State, m: np.ndarray) -> None:
    """A statement that does nothing (a comment)."""


class _Compiled(ExprCompiler):
    """A kernel compiled into closures (cached per kernel object; the cluster statements are
    :class:`~stitchtune.emulate.cluster_ops.ClusterOps`')."""

    def __init__(self, kernel: Kernel) -> None:
        self._kernel = weakref.ref(kernel)  # weak: the cache entry must not keep its kernel alive
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

    @property
    def kernel(self) -> Kernel:
        """The compiled kernel (alive while anyone uses its compiled form: the caller holds it)."""
        k = self._kernel()
        if k is None:
            raise ReferenceError("the compiled kernel has been collected")
        return k

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
        match s:
            case Assign():
                return self.assign(s, where)
            case SetLocal():
                return self.setlocal(s, where)
            case LoadVec():
                return self.loadvec(s, where)
            case StoreVec():
                return self.storevec(s, where)
            case AtomicAdd():
                return self.atomic(s, where)
            case kir.RemoteStore():
                return self.remote_store(s, where)
            case kir.ClusterSync():
                return self.cluster_sync(where)
            case For():
                return self.for_(s, path, where)
            case If():
                return self.if_(s, path, where)
            case Barrier():
                return self.barrier(where)
            case GridSync():
                return self.gridsync(where)
            case Comment():  # (block_fn leaves comments out: nothing to run)
                return _nothing
            case _:
                assert_never(s)

    def assign(self, s: Assign, where: str) -> StmtFn:
        name = s.var.name
        t = self.var_types[name]
        f = self.as_type(s.expr, t)
        npt = _NP_SCALAR[t]

        def assign(st: _State, m: np.ndarray) -> None:
            st.where = where
            if m is st.full:  # vars are never written in place: sharing an array is safe
                v = f(st, m)
                st.vars[name] = np.full(st.T, v, npt) if np.ndim(v) == 0 else v.astype(npt, copy=False)
            else:
                st.vars[name] = np.where(m, f(st, m), st.vars[name]).astype(npt, copy=False)
        return assign

    def if_(self, s: If, path: str, where: str) -> StmtFn:
        cf = self.as_type(s.cond, BOOL)
        then = self.block_fn(s.then, path + ".t")
        orelse = self.block_fn(s.orelse, path + ".e") if s.orelse else None

        def if_(st: _State, m: np.ndarray) -> None:
            st.where = where
            c = cf(st, m)
            mt = st.mask(m & c)
            if mt is st.full or mt.any():  # (full: every lane, no reduction needed)
                then(st, mt)
            if orelse is not None:
                mf = st.mask(m & ~c)
                if mf is st.full or mf.any():
                    orelse(st, mf)
        return if_

    def barrier(self, where: str) -> StmtFn:
        def barrier(st: _State, m: np.ndarray) -> None:
            st.where = where
            if m is st.full:
                for sb in st.shared.values():
                    sb.tracker.reset()
                return
            b = m.reshape(st.grid, st.block)
            some, every = b.any(axis=1), b.all(axis=1)
            part = some & ~every
            if part.any():
                raise st.fault("divergent_barrier", "__syncthreads() not reached by every thread "
                               "of the block", np.repeat(part, st.block) & ~m, st.ar)
            for sb in st.shared.values():
                sb.tracker.reset(np.asarray(every), sb.size)
        return barrier

    def gridsync(self, where: str) -> StmtFn:
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
                a[:, k] = vf(st, m) if m is st.full else np.where(m, vf(st, m), a[:, k])
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
            # by flat index (np.put works on the array in place): far faster than [lanes, i]
            np.put(st.locals[arr_name], st.local_rows[arr_name].take(lanes) + i, _lanes_of(vf(st, m), lanes))
        return setlocal

    def _vec_check(self, buf: str, width: int, is_shared: bool) -> None:
        """One aligned access of at most 16 bytes; an int32/int64 vector (read-only) may be wider: the
        renderer splits it into aligned 16-byte accesses (the whole-width alignment implies theirs)."""
        dtype = "float32" if is_shared else self.params[buf].dtype
        nbytes = width * kir.ELEM_BYTES.get(dtype, 4)
        if dtype in ("int32", "int64"):
            nbytes = min(nbytes, 16)
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
        raw = any(self.var_types[d.name] in (I32, I64) for d in s.dsts)  # int registers: the element itself
        if raw and (is_shared or self.params[buf].dtype not in ("int32", "int64")
                    or len({self.var_types[d.name] for d in s.dsts}) > 1):
            raise ValueError(f"kernel {self.kernel.name}: int vector load from {buf} needs an int buffer and "
                             "int destinations only")

        def loadvec(st: _State, m: np.ndarray) -> None:
            st.where = where
            act, lanes = _active(st, m, pred)
            if not lanes.size:
                return
            base = _lanes_of(idx(st, act), lanes)
            vals = _access(st, buf, is_shared, lanes, base, width, "load", raw=raw)
            for k, (name, npt) in enumerate(dsts):
                if lanes.size == st.T:
                    st.vars[name] = vals[:, k].astype(npt)
                    continue
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
        ity = {"int32": I32, "int64": I64}.get(self.params[s.buf].dtype) if not is_shared else None
        vt = ity or F32  # an int output stores int values (int registers), any other buffer float32
        vals = [self.as_type(v, vt) for v in s.values]
        npt = _NP_SCALAR[vt]
        buf = s.buf

        def storevec(st: _State, m: np.ndarray) -> None:
            st.where = where
            act, lanes = _active(st, m, pred)
            if not lanes.size:
                return
            base = _lanes_of(idx(st, act), lanes)
            v: np.ndarray = np.empty((lanes.size, width), npt)  # every value is of type npt already (as_type)
            for k, f in enumerate(vals):
                v[:, k] = _lanes_of(f(st, act), lanes)
            _access(st, buf, is_shared, lanes, base, width, "store", v)
        return storevec

    def atomic(self, s: AtomicAdd, where: str) -> StmtFn:
        shared = self.buf_kind(s.buf)   # a shared buffer (float32): scalar adds, threads of the block race-free
        if shared and s.width > 1:
            raise ValueError(f"kernel {self.kernel.name}: a vector atomic add to shared {s.buf} (scalar only)")
        if not shared and self.params[s.buf].dtype not in ATOMIC_DTYPES:
            raise ValueError(f"kernel {self.kernel.name}: atomic add needs a float32 / float16 / bfloat16 global "
                             f"buffer, not {s.buf}")
        idx = self.as_type(s.index, I32)
        pred = self.as_type(s.pred, BOOL) if s.pred is not None else None
        vfs = [self.as_type(v, F32) for v in s.values]
        buf, width = s.buf, s.width
        if width > 1 and not shared and self.params[buf].dtype != "float32":
            raise ValueError(f"kernel {self.kernel.name}: a vector atomic add needs a float32 buffer, not {buf}")

        def atomic(st: _State, m: np.ndarray) -> None:
            st.where = where
            act, lanes = _active(st, m, pred)
            if not lanes.size:
                return
            base = _lanes_of(idx(st, act), lanes)
            # a vector add: one aligned access of ``width`` elements, each added on its own
            v = np.stack([_lanes_of(f(st, act), lanes).astype(np.float32, copy=False) for f in vfs], axis=1)
            _access(st, buf, shared, lanes, base, width, "atomic", v)
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
            v0 = start(st, m)
            if m is st.full:
                st.vars[name] = np.full(st.T, v0, np.int32) if np.ndim(v0) == 0 else v0.astype(np.int32, copy=False)
            else:
                st.vars[name] = np.where(m, v0, st.vars[name]).astype(np.int32, copy=False)
            act = m
            while True:
                st.where = where
                act = st.mask(act & (st.vars[name] < stop(st, act)))
                if act is not st.full and not act.any():
                    return
                body(st, act)
                v = st.vars[name]
                st.vars[name] = v + step if act is st.full else np.where(act, v + step, v).astype(np.int32, copy=False)
        return for_


_CACHE: dict[int, tuple[weakref.ref, _Compiled]] = {}


def _compiled(kernel: Kernel) -> _Compiled:
    """The closures of ``kernel``, compiled once per kernel object (the entry goes with the kernel)."""
    key = id(kernel)
    hit = _CACHE.get(key)
    if hit is not None and hit[0]() is kernel:
        return hit[1]
    ck = _Compiled(kernel)

    def drop(ref: weakref.ref) -> None:
        if _CACHE.get(key, (None,))[0] is ref:
            del _CACHE[key]
    _CACHE[key] = (weakref.ref(kernel, drop), ck)
    return ck
