"""Expression translation for the emulator: kir expressions into numpy closures with their static types.

Contract
--------
* :class:`ExprCompiler` is the expression half of :class:`~stitchtune.emulate.translate._Compiled`: every
  expression becomes ``fn(state, mask) -> [T] array | scalar`` with a static type (C arithmetic,
  conversions, lazy ``&&`` / ``||`` / ``?:``, loads through :mod:`stitchtune.emulate.memory`). It needs
  ``kernel``, ``var_types``, ``params``, ``shared`` and ``locals``, which the subclass sets.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, assert_never

import numpy as np

from stitchtune.emulate.cluster_ops import ClusterOps, ExprFn
from stitchtune.ir import kir
from stitchtune.emulate.memory import (
    _NP_SCALAR,
    _access,
    _active,
    _lanes_of,
    _shared_broadcast_load,
    _State,
)
from stitchtune.ir.kir import (
    BOOL,
    CMP_OPS,
    F32,
    I32,
    I64,
    Bin,
    Cast,
    Const,
    IndexLoad,
    IntOp,
    Load,
    LocalRef,
    MathOp,
    Select,
    Shfl,
    Special,
    Var,
)


def _const_fn(v: Any) -> ExprFn:
    """The expression whose value is always ``v`` (marked, so that its users can fold it in)."""
    def const(st: _State, m: np.ndarray) -> Any:
        return v
    setattr(const, "emu_const", (v,))
    return const


def _var_fn(name: str) -> ExprFn:
    """The value of variable ``name`` (marked, so that its users can read it without a call)."""
    def var(st: _State, m: np.ndarray) -> Any:
        return st.vars[name]
    setattr(var, "emu_var", name)
    return var


def _const_of(fn: ExprFn) -> tuple[Any] | None:
    """``(value,)`` of a constant expression, None otherwise."""
    return getattr(fn, "emu_const", None)


def _binary(fn: Callable[[Any, Any], Any], af: ExprFn, bf: ExprFn) -> ExprFn:
    """``fn(a, b)`` of two expressions, evaluated as ``lambda st, m: fn(af(st, m), bf(st, m))`` does,
    with the calls to constant and variable operands taken out of the closure (two constants: the
    value, computed once here, as the numpy call would at run time)."""
    ca, cb = _const_of(af), _const_of(bf)
    if ca is not None and cb is not None:
        with np.errstate(all="ignore"):  # as the launch runs it
            return _const_fn(fn(ca[0], cb[0]))
    va: str | None = getattr(af, "emu_var", None)
    vb: str | None = getattr(bf, "emu_var", None)
    if cb is not None:
        b = cb[0]
        if va is not None:
            return lambda st, m: fn(st.vars[va], b)
        return lambda st, m: fn(af(st, m), b)
    if ca is not None:
        a = ca[0]
        if vb is not None:
            return lambda st, m: fn(a, st.vars[vb])
        return lambda st, m: fn(a, bf(st, m))
    if va is not None and vb is not None:
        return lambda st, m: fn(st.vars[va], st.vars[vb])
    if va is not None:
        return lambda st, m: fn(st.vars[va], bf(st, m))
    if vb is not None:
        return lambda st, m: fn(af(st, m), st.vars[vb])
    return lambda st, m: fn(af(st, m), bf(st, m))


def _cast_fn(fn: ExprFn, src: str, dst: str) -> ExprFn:
    """Convert values of type ``src`` to ``dst`` with C semantics (a constant's once, here)."""
    if src == dst:
        return fn
    cast = _cast_fn_of(fn, src, dst)
    c = _const_of(fn)
    if c is not None:
        with np.errstate(all="ignore"):  # as the launch runs it
            return _const_fn(cast(None, None))  # type: ignore[arg-type]  # a constant reads no state
    return cast


def _cast_fn_of(fn: ExprFn, src: str, dst: str) -> ExprFn:
    if dst == F32:
        return lambda st, m: np.asarray(fn(st, m)).astype(np.float32)
    if dst in (I32, I64):
        # float -> int truncates toward zero like C; bool -> 0/1; int64 -> int32 keeps the low bits
        npt = _NP_SCALAR[dst]
        return lambda st, m: np.asarray(fn(st, m)).astype(npt)
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


def _uses_mask(e: kir.Expr) -> bool:
    """Whether evaluating ``e`` depends on the active mask: a memory load, a local array read or a
    shuffle (their checks and faults are per active lane). Anything else is arithmetic on every lane,
    which never faults, so a lazy operand made only of it may be evaluated everywhere."""
    match e:
        case Const() | Var() | Special() | kir.ClusterRank() | kir.Extent():
            return False
        case Bin():
            return _uses_mask(e.a) or _uses_mask(e.b)
        case MathOp() | IntOp():
            return any(_uses_mask(a) for a in e.args)
        case Select():
            return _uses_mask(e.cond) or _uses_mask(e.a) or _uses_mask(e.b)
        case Cast():
            return _uses_mask(e.expr)
        case Load() | IndexLoad() | LocalRef() | Shfl() | kir.RemoteLoad():
            return True  # memory loads, local arrays, shuffles, remote loads
        case _:
            assert_never(e)


def _promote(a: str, b: str) -> str:
    """C's usual arithmetic conversions restricted to bool < i32 < i64 < f32."""
    order = {BOOL: 0, I32: 1, I64: 2, F32: 3}
    return a if order[a] >= order[b] else b


class ExprCompiler(ClusterOps):
    """Compiles kir expressions into closures (the expression half of the emulator's translator)."""

    var_types: dict[str, str]
    params: dict[str, kir.Param]
    shared: dict[str, kir.SharedBuf]
    locals: dict[str, kir.LocalArray]


    def buf_kind(self, name: str) -> bool:
        """True if ``name`` is a shared buffer, False for a parameter; ValueError otherwise."""
        if name in self.shared:
            return True
        if name in self.params:
            return False
        raise ValueError(f"kernel {self.kernel.name}: unknown buffer {name}")

    def expr(self, e: kir.Expr) -> tuple[ExprFn, str]:
        """Compile ``e`` into ``fn(state, mask) -> array | scalar`` and its static type."""
        match e:
            case Const():
                return _const_fn(_NP_SCALAR[e.dtype](e.value)), e.dtype
            case Var():
                if e.name not in self.var_types:
                    raise ValueError(f"kernel {self.kernel.name}: variable {e.name} is never assigned")
                return _var_fn(e.name), self.var_types[e.name]
            case kir.Extent():
                if e.name not in self.kernel.extents:
                    raise ValueError(f"kernel {self.kernel.name}: extent {e.name} is not one of its arguments")
                ext = e.name
                return (lambda st, m: st.extents[ext]), I32
            case Special():
                return self.special(e), I32
            case Bin():
                return self.bin(e)
            case MathOp():
                return self.mathop(e)
            case IntOp():
                return self.intop(e)
            case Select():
                return self.select(e)
            case Cast():
                f, t = self.expr(e.expr)
                return _cast_fn(f, t, e.dtype), e.dtype
            case Load():
                return self.load(e), e.dtype
            case IndexLoad():
                return self.index_load(e), I32
            case LocalRef():
                return self.localref(e), F32
            case Shfl():
                return self.shfl(e), F32
            case kir.ClusterRank():
                self._need_cluster("ClusterRank")
                return (lambda st, m: st.bid % np.int32(st.cluster)), I32
            case kir.RemoteLoad():
                return self.remote_load(e), F32
            case _:
                assert_never(e)

    def special(self, e: Special) -> ExprFn:
        """The thread / block index or the block / grid size, as int32."""
        kind = e.kind
        if kind == "tid":
            return lambda st, m: st.tid
        if kind == "bid":
            return lambda st, m: st.bid
        if kind == "bdim":
            return lambda st, m: np.int32(st.block)
        return lambda st, m: np.int32(st.gdim)

    def select(self, e: Select) -> tuple[ExprFn, str]:
        """``cond ? a : b``, each side evaluated under the lanes that take it (when it can fault)."""
        cf = self.as_type(e.cond, BOOL)
        (af, at), (bf, bt) = self.expr(e.a), self.expr(e.b)
        rt = _promote(at, bt)
        af, bf = _cast_fn(af, at, rt), _cast_fn(bf, bt, rt)
        if not (_uses_mask(e.a) or _uses_mask(e.b)):  # no mask to narrow: both sides on every lane
            return (lambda st, m: np.where(cf(st, m), af(st, m), bf(st, m))), rt

        def select(st: _State, m: np.ndarray) -> Any:
            c = cf(st, m)
            return np.where(c, af(st, m & c), bf(st, m & ~c))
        return select, rt

    def as_type(self, e: kir.Expr, t: str) -> ExprFn:
        f, et = self.expr(e)
        return _cast_fn(f, et, t)

    def bin(self, e: Bin) -> tuple[ExprFn, str]:
        op = e.op
        (af, at), (bf, bt) = self.expr(e.a), self.expr(e.b)
        if op in ("&&", "||"):
            af, bf = _cast_fn(af, at, BOOL), _cast_fn(bf, bt, BOOL)
            if not _uses_mask(e.b):  # a pure right operand: evaluated on every lane, same result
                if op == "&&":
                    return (lambda st, m: af(st, m) & bf(st, m)), BOOL
                return (lambda st, m: af(st, m) | bf(st, m)), BOOL
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
            return _binary(_CMP[op], af, bf), BOOL
        if op in ("&", "^") and at == BOOL and bt == BOOL:
            fn: Callable[[Any, Any], Any] = np.bitwise_and if op == "&" else np.bitwise_xor
            return _binary(fn, af, bf), BOOL
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
        return _binary(fn, af, bf), rt

    def mathop(self, e: MathOp) -> tuple[ExprFn, str]:
        from stitchtune.graph.ops import KERNEL_OPS, OPS, kernel_op

        if e.op not in OPS and e.op not in KERNEL_OPS:
            raise ValueError(f"unknown kernel operator {e.op}")
        info = kernel_op(e.op)
        np_fn = info.np_fn
        # int operands ('i': uniform's seed and counter) at their own int type, the others as float32
        args = [self.expr(a)[0] if info.arg_type(k) == "i" else self.as_type(a, F32) for k, a in enumerate(e.args)]

        if len(args) == 1:  # the common arities without building an argument list per call
            a0 = args[0]
            return (lambda st, m: np.asarray(np_fn(a0(st, m))).astype(np.float32, copy=False)), F32
        if len(args) == 2:
            a0, a1 = args
            return (lambda st, m: np.asarray(np_fn(a0(st, m), a1(st, m))).astype(np.float32, copy=False)), F32

        def mathop(st: _State, m: np.ndarray) -> Any:
            vals = [a(st, m) for a in args]
            return np.asarray(np_fn(*vals)).astype(np.float32, copy=False)
        return mathop, F32

    def intop(self, e: IntOp) -> tuple[ExprFn, str]:
        """An int operator at its width (wrapping), see :class:`~stitchtune.ir.kir.IntOp`."""
        from stitchtune.graph.int_ops import INT_CUDA, int_np

        if e.op not in INT_CUDA:
            raise ValueError(f"unknown int operator {e.op}")
        fn = int_np(e.op, {I32: "int32", I64: "int64"}[e.dtype])
        args = [self.as_type(a, F32 if e.op == "from_float" else e.dtype) for a in e.args]
        return (lambda st, m: fn(*(a(st, m) for a in args))), e.dtype

    def load(self, e: Load) -> ExprFn:
        is_shared = self.buf_kind(e.buf)
        raw = e.dtype != F32
        if raw and (is_shared or self.params[e.buf].dtype not in ("int32", "int64")):
            raise ValueError(f"kernel {self.kernel.name}: int load from non-integer buffer {e.buf}")
        npt = _NP_SCALAR[e.dtype]
        idx = self.as_type(e.index, I32)
        pred = self.as_type(e.pred, BOOL) if e.pred is not None else None
        buf = e.buf

        def load(st: _State, m: np.ndarray) -> Any:
            act, lanes = _active(st, m, pred)
            if lanes.size == st.T:  # every thread loads: no compaction needed
                iv = idx(st, act)
                if is_shared and st.trace is None:   # the fast path is not observed: take the general one
                    v = _shared_broadcast_load(st, buf, iv)
                    if v is not None:
                        return v
                v = _access(st, buf, is_shared, st.ar, np.broadcast_to(iv, (st.T,)), 1, "load", raw=raw)[:, 0]
                return v.astype(npt, copy=False) if raw else v
            out: np.ndarray = np.zeros(st.T, npt)
            if lanes.size:
                base = _lanes_of(idx(st, act), lanes)
                out[lanes] = _access(st, buf, is_shared, lanes, base, 1, "load", raw=raw)[:, 0]
            return out
        return load

    def index_load(self, e: IndexLoad) -> ExprFn:
        """An int32/int64 element, range-checked exactly (never through float32), as an i32 or -1."""
        if self.buf_kind(e.buf) or self.params[e.buf].dtype not in ("int32", "int64"):
            raise ValueError(f"kernel {self.kernel.name}: index load from non-integer buffer {e.buf}")
        idx = self.as_type(e.index, I32)
        pred = self.as_type(e.pred, BOOL) if e.pred is not None else None
        buf, bound = e.buf, int(e.bound)

        def index_load(st: _State, m: np.ndarray) -> Any:
            act, lanes = _active(st, m, pred)
            out = np.full(st.T, -1, np.int32)
            if lanes.size:
                base = _lanes_of(idx(st, act), lanes)
                v = _access(st, buf, False, lanes, base, 1, "load", raw=True)[:, 0].astype(np.int64)
                out[lanes] = np.where((v >= 0) & (v < bound), v, -1).astype(np.int32)
            return out
        return index_load

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
            if i.view(np.uint32).max() >= size:  # some lane (active or not) outside: the full check
                bad = m & ((i < 0) | (i >= size))
                if bad.any():
                    lanes = np.flatnonzero(m)
                    raise st.fault("out_of_bounds", f"read of local array {arr_name}{{at}} (size {size})",
                                   bad[lanes], lanes, i[lanes])
                i = np.clip(i, 0, size - 1)  # inactive lanes read a valid element, unused
            return st.locals[arr_name].take(st.local_rows[arr_name] + i)  # flat index: far faster than [ar, i]
        return localref

    def shfl(self, e: Shfl) -> ExprFn:
        if e.width not in (1, 2, 4, 8, 16, 32) or not 0 <= e.lane_mask < 32:
            raise ValueError(f"bad shuffle lane_mask {e.lane_mask} / width {e.width}")
        vf = self.as_type(e.value, F32)
        lane_mask, width = e.lane_mask, e.width

        def shfl(st: _State, m: np.ndarray) -> Any:
            if m is not st.full:
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
