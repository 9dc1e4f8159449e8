"""The kernel IR's verifier: what every :class:`~stitchtune.ir.kir.Program` must satisfy before a
consumer (the CUDA renderer, the emulator, the cost counts) sees it.

The constructors of the IR's dataclasses check each node alone (identifiers, operators, block sizes);
this module checks a program as a whole, the way tinygrad checks every program against its spec:

* **declared buffers**: every buffer a statement or expression names is a parameter or shared buffer
  of its kernel (``RemoteLoad`` / ``RemoteStore``: a shared buffer), every local array is declared,
  every :class:`~stitchtune.ir.kir.Extent` is one of the kernel's extents; names are unique;
* **types**: a variable has one type, every variable read is assigned somewhere in its kernel (an
  ``Assign``, a ``For`` counter, a ``LoadVec`` destination); a ``Load`` / ``LoadVec`` at an int width
  reads an int buffer; inputs are never stored to; atomics add to a buffer of an
  :data:`~stitchtune.ir.kir.ATOMIC_DTYPES` type, or one element at a time to a (float32) shared buffer;
* **vector accesses**: 1, 2, 4 or 8 elements, at most 16 bytes (an int buffer's: several 16-byte accesses);
* **uniform barriers**: a ``Barrier`` / ``GridSync`` / ``ClusterSync`` is never under a condition or a
  loop bound that can differ between the threads of a block (a value derived from ``tid``, from a load,
  or from a shuffle), so every thread reaches it; a ``GridSync`` needs the kernel's barrier parameter;
* **cluster rules**: ``ClusterRank``, ``RemoteLoad``, ``RemoteStore`` and ``ClusterSync`` only in a
  kernel with ``cluster > 1``, and a kernel with remote accesses ends with a ``ClusterSync`` after the
  last of them;
* **launches**: every launch names a kernel of the program with matching block, enough dynamic shared
  memory, a grid that is a multiple of the cluster, one declared buffer per parameter of the same
  element type, the barrier parameter bound to a barrier buffer.

:func:`check` returns the defects as values; :func:`verify` raises :class:`IRVerifyError` listing them
(a bug in stitchtune, never a user mistake). :func:`stitchtune.lower.entry.lower` verifies every program
it returns.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, assert_never

from stitchtune.ir import kir

#: element types whose buffers hold ints (a Load/LoadVec into int registers reads only these)
_INT_BUFFERS = frozenset({"int32", "int64"})
_VEC_WIDTHS = frozenset({1, 2, 4, 8})


@dataclass(frozen=True)
class Defect:
    """One violation: the kernel it is in ('' for the program) and what is wrong."""

    kernel: str
    message: str

    def __str__(self) -> str:
        return f"{self.kernel}: {self.message}" if self.kernel else self.message


class IRVerifyError(ValueError):
    """A program breaks the IR's rules (a bug in the lowering that built it)."""

    def __init__(self, defects: tuple[Defect, ...]) -> None:
        self.defects = defects
        head = "; ".join(str(d) for d in defects[:8])
        more = f" (+{len(defects) - 8} more)" if len(defects) > 8 else ""
        super().__init__(f"invalid kernel program: {head}{more}")


def verify(program: kir.Program) -> kir.Program:
    """Return ``program`` unchanged if :func:`check` finds nothing, else raise :class:`IRVerifyError`."""
    defects = check(program)
    if defects:
        raise IRVerifyError(defects)
    return program


def check(program: kir.Program) -> tuple[Defect, ...]:
    """Every defect of ``program`` (empty when it is valid), kernels first, then its launches."""
    out: list[Defect] = []
    for k in program.kernels:
        out.extend(Defect(k.name, m) for m in _KernelCheck(k).run())
    out.extend(Defect("", m) for m in _launch_defects(program))
    return tuple(out)


def _dupes(names: Iterable[str]) -> list[str]:
    seen: set[str] = set()
    dup: list[str] = []
    for n in names:
        if n in seen and n not in dup:
            dup.append(n)
        seen.add(n)
    return dup


class _KernelCheck:
    """The checks of one kernel; :meth:`run` returns the messages."""

    def __init__(self, kernel: kir.Kernel) -> None:
        self.k = kernel
        self.params = {p.name: p for p in kernel.params}
        self.shared = {s.name: s for s in kernel.shared}
        self.locals = {a.name: a for a in kernel.locals}
        self.msgs: list[str] = []
        self.assigned: dict[str, str] = {}   # var name -> dtype
        self.read: set[str] = set()
        #: every statement, depth first, with the expressions it holds (computed once)
        self.flat: list[tuple[kir.Stmt, list[kir.Expr]]] = [(s, list(kir.exprs(s))) for s in kir.walk(kernel.body)]

    def run(self) -> list[str]:
        k = self.k
        for d in _dupes([p.name for p in k.params] + [s.name for s in k.shared] + [a.name for a in k.locals]
                        + list(k.extents)):
            self.msgs.append(f"name {d} declared twice")
        if k.barrier_param is not None:
            p = self.params.get(k.barrier_param)
            if p is None or p.role != kir.BufferRole.BARRIER:
                self.msgs.append(f"barrier parameter {k.barrier_param} is not a parameter of role barrier")
        self._collect_vars()
        self._stmts()
        for name in sorted(self.read - self.assigned.keys()):
            self.msgs.append(f"variable {name} is read but never assigned")
        uniform = _uniform_vars(k.body)
        self._barriers(k.body, uniform, guarded=None)
        self._cluster_rules()
        return self.msgs

    # -- variables ----------------------------------------------------------------------------------
    def _define(self, v: kir.Var) -> None:
        old = self.assigned.setdefault(v.name, v.dtype)
        if old != v.dtype:
            self.msgs.append(f"variable {v.name} used with two types ({old}, {v.dtype})")

    def _collect_vars(self) -> None:
        for s, _ in self.flat:
            if isinstance(s, kir.Assign) or isinstance(s, kir.For):
                self._define(s.var)
            elif isinstance(s, kir.LoadVec):
                for v in s.dsts:
                    self._define(v)

    # -- statements and expressions -----------------------------------------------------------------
    def _stmts(self) -> None:
        for s, es in self.flat:
            self._stmt(s)
            for e in es:
                self._expr(e, s)

    def _global(self, buf: str, what: str) -> kir.Param | None:
        p = self.params.get(buf)
        if p is None:
            self.msgs.append(f"{what} of undeclared global buffer {buf}")
        return p

    def _buffer(self, buf: str, what: str) -> tuple[kir.Param | None, bool]:
        """The parameter named ``buf`` (None for a shared buffer); False where neither is declared."""
        if buf in self.shared:
            return None, True
        if buf in self.params:
            return self.params[buf], True
        self.msgs.append(f"{what} of undeclared buffer {buf}")
        return None, False

    def _stmt(self, s: kir.Stmt) -> None:
        """The defects of ``s`` itself (its expressions are :meth:`_expr`'s; one case per node type)."""
        match s:
            case kir.LoadVec():
                self._load_vec(s)
            case kir.StoreVec():
                p, _ = self._buffer(s.buf, "vector store")
                self._width(len(s.values), p, "vector store")
                if p is not None and p.role == kir.BufferRole.INPUT:
                    self.msgs.append(f"store to input {s.buf}")
            case kir.AtomicAdd():
                self._atomic_add(s)
            case kir.SetLocal():
                self._local(s.array, s.index)
            case kir.RemoteStore():
                if s.buf not in self.shared:
                    self.msgs.append(f"remote store to {s.buf}, which is not a shared buffer")
            case kir.GridSync():
                if self.k.barrier_param is None:
                    self.msgs.append("grid barrier in a kernel without a barrier parameter")
            case kir.For():
                self._for(s)
            case kir.Assign() | kir.If() | kir.Barrier() | kir.ClusterSync() | kir.Comment():
                pass  # (barriers: _barriers; clusters: _cluster_rules)
            case _:
                assert_never(s)

    def _load_vec(self, s: kir.LoadVec) -> None:
        p, _ = self._buffer(s.buf, "vector load")
        ints = {v.dtype for v in s.dsts} & {kir.I32, kir.I64}
        self._width(len(s.dsts), p, "vector load")
        if ints and (p is None or p.dtype not in _INT_BUFFERS):
            self.msgs.append(f"int vector load from {s.buf}, which is not an int global buffer")

    def _atomic_add(self, s: kir.AtomicAdd) -> None:
        if s.buf in self.shared:   # a block-private float32 copy: scalar adds only (no vector shared adds)
            if s.width > 1:
                self.msgs.append(f"vector atomic add of {s.width} elements to shared {s.buf} (scalar only)")
            return
        p = self._global(s.buf, "atomic add")
        if p is not None and p.role == kir.BufferRole.INPUT:
            self.msgs.append(f"atomic add to input {s.buf}")
        if p is not None and p.dtype not in kir.ATOMIC_DTYPES:
            self.msgs.append(f"atomic add to {s.buf} of type {p.dtype}")
        if s.width > 1 and (s.width not in (2, 4) or (p is not None and p.dtype != "float32")):
            self.msgs.append(f"vector atomic add of {s.width} elements to {s.buf} (float2 / float4 of float32 only)")

    def _for(self, s: kir.For) -> None:
        if s.step <= 0:
            self.msgs.append(f"loop over {s.var.name} with step {s.step}")
        if s.unroll and not (isinstance(s.start, kir.Const) and isinstance(s.stop, kir.Const)):
            self.msgs.append(f"unrolled loop over {s.var.name} with bounds that are not constants")
        if s.unroll_by < 0 or (s.unroll and s.unroll_by):
            self.msgs.append(f"loop over {s.var.name} with unroll_by {s.unroll_by} (full unroll: {s.unroll})")

    def _width(self, n: int, p: kir.Param | None, what: str) -> None:
        """1, 2, 4 or 8 elements; at most 16 bytes, except on an int buffer (an int64 vector of 4 is two
        aligned 16-byte accesses, see the IR's docstring)."""
        if n not in _VEC_WIDTHS:
            self.msgs.append(f"{what} of {n} elements (1, 2, 4 or 8)")
            return
        item = kir.ELEM_BYTES.get(p.dtype, 4) if p is not None else 4
        if n * item > 16 and (p is None or p.dtype not in _INT_BUFFERS):
            self.msgs.append(f"{what} of {n * item} bytes (at most 16)")

    def _local(self, name: str, index: kir.Expr) -> None:
        arr = self.locals.get(name)
        if arr is None:
            self.msgs.append(f"local array {name} is not declared")
        elif isinstance(index, kir.Const) and not 0 <= int(index.value) < arr.size:
            self.msgs.append(f"local array {name}[{index.value}] out of its {arr.size} elements")

    def _expr(self, e: kir.Expr, s: kir.Stmt) -> None:
        """The defects of expression ``e`` of statement ``s`` (one case per node type)."""
        match e:
            case kir.Var():
                # a statement's own targets are definitions, every other Var is a read
                if not ((isinstance(s, (kir.Assign, kir.For)) and e is s.var)
                        or (isinstance(s, kir.LoadVec) and any(e is v for v in s.dsts))):
                    self.read.add(e.name)
            case kir.Load():
                self._load(e)
            case kir.IndexLoad():
                p = self._global(e.buf, "index load")
                if p is not None and p.dtype not in _INT_BUFFERS:
                    self.msgs.append(f"index load from {e.buf} of type {p.dtype}")
            case kir.RemoteLoad():
                if e.buf not in self.shared:
                    self.msgs.append(f"remote load of {e.buf}, which is not a shared buffer")
            case kir.LocalRef():
                self._local(e.array, e.index)
            case kir.Extent():
                if e.name not in self.k.extents:
                    self.msgs.append(f"extent {e.name} is not an argument of the kernel")
            case kir.Shfl():
                if e.width not in (1, 2, 4, 8, 16, 32) or not 0 < e.lane_mask < e.width:
                    self.msgs.append(f"shuffle with lane mask {e.lane_mask} and width {e.width}")
            case (kir.Const() | kir.Special() | kir.Bin() | kir.MathOp() | kir.IntOp() | kir.Select() | kir.Cast()
                  | kir.ClusterRank()):
                pass  # (clusters: _cluster_rules)
            case _:
                assert_never(e)

    def _load(self, e: kir.Load) -> None:
        p, ok = self._buffer(e.buf, "load")
        if ok and e.dtype != kir.F32 and (p is None or p.dtype not in _INT_BUFFERS):
            self.msgs.append(f"int load from {e.buf}, which is not an int global buffer")
        size = p.size if p is not None else (self.shared[e.buf].size if e.buf in self.shared else 0)
        if ok and isinstance(e.index, kir.Const) and not 0 <= int(e.index.value) < size:
            self.msgs.append(f"load of {e.buf}[{e.index.value}] out of its {size} elements")

    # -- barriers -----------------------------------------------------------------------------------
    def _barriers(self, body: tuple[kir.Stmt, ...], uniform: frozenset[str], guarded: str | None) -> None:
        for s in body:
            if isinstance(s, (kir.Barrier, kir.GridSync, kir.ClusterSync)) and guarded is not None:
                self.msgs.append(f"{type(s).__name__} under {guarded}, which threads of a block may not all reach")
            elif isinstance(s, kir.If):
                g = guarded if guarded is not None or _is_uniform(s.cond, uniform) else "a thread-varying condition"
                self._barriers(s.then, uniform, g)
                self._barriers(s.orelse, uniform, g)
            elif isinstance(s, kir.For):
                bounded = _is_uniform(s.start, uniform) and _is_uniform(s.stop, uniform)
                g = guarded if guarded is not None or bounded else f"the thread-varying loop over {s.var.name}"
                self._barriers(s.body, uniform, g)

    # -- clusters -----------------------------------------------------------------------------------
    def _cluster_rules(self) -> None:
        k = self.k
        uses = [type(e).__name__ for _, es in self.flat for e in es if isinstance(e, (kir.ClusterRank, kir.RemoteLoad))]
        uses += [type(s).__name__ for s, _ in self.flat if isinstance(s, (kir.RemoteStore, kir.ClusterSync))]
        if k.cluster == 1:
            for name in sorted(set(uses)):
                self.msgs.append(f"{name} in a kernel without a cluster")
            return
        last_remote = last_sync = -1
        for i, (s, es) in enumerate(self.flat):
            if isinstance(s, kir.RemoteStore) or any(isinstance(e, kir.RemoteLoad) for e in es):
                last_remote = i
            if isinstance(s, kir.ClusterSync):
                last_sync = i
        if last_remote >= 0 and last_sync < last_remote:
            self.msgs.append("remote shared-memory access not followed by a cluster barrier")


@dataclass(frozen=True)
class _Deps:
    """What one expression's value depends on: the variables it reads, and whether it reads something that
    varies between the threads of a block by itself (``tid``, a load, a shuffle, a local array)."""

    names: frozenset[str]
    varies: bool


_VARYING_NODES = (kir.Load, kir.IndexLoad, kir.RemoteLoad, kir.LocalRef, kir.Shfl)


def _deps(e: kir.Expr) -> _Deps:
    names: set[str] = set()
    varies = False
    for x in kir.exprs(e):
        if isinstance(x, kir.Var):
            names.add(x.name)
        elif isinstance(x, _VARYING_NODES) or (isinstance(x, kir.Special) and x.kind == "tid"):
            varies = True
    return _Deps(frozenset(names), varies)


def _uniform_vars(body: tuple[kir.Stmt, ...]) -> frozenset[str]:
    """The variables whose value is the same in every thread of a block: no assignment of theirs reads a
    thread-varying value or variable, or is made under a thread-varying condition or loop bound
    (propagated through the variables' dependencies until nothing changes)."""
    deps: dict[str, set[str]] = {}      # var -> the vars its assignments (and their controls) read
    varying: set[str] = set()

    def visit(stmts: tuple[kir.Stmt, ...], ctrl: tuple[_Deps, ...]) -> None:
        for s in stmts:
            if isinstance(s, kir.Assign):
                _assign(s.var.name, (_deps(s.expr),) + ctrl)
            elif isinstance(s, kir.LoadVec):
                varying.update(v.name for v in s.dsts)
            elif isinstance(s, kir.If):
                inner = ctrl + (_deps(s.cond),)
                visit(s.then, inner)
                visit(s.orelse, inner)
            elif isinstance(s, kir.For):
                bounds = (_deps(s.start), _deps(s.stop))
                _assign(s.var.name, bounds + ctrl)
                visit(s.body, ctrl + bounds)

    def _assign(name: str, reads: tuple[_Deps, ...]) -> None:
        d = deps.setdefault(name, set())
        for r in reads:
            d.update(r.names)
            if r.varies:
                varying.add(name)

    visit(body, ())
    readers: dict[str, list[str]] = {}
    for name, used in deps.items():
        for u in used:
            readers.setdefault(u, []).append(name)
    work = list(varying)
    while work:
        for r in readers.get(work.pop(), ()):
            if r not in varying:
                varying.add(r)
                work.append(r)
    return frozenset(deps.keys() - varying)


def _is_uniform(e: kir.Expr, uniform: frozenset[str]) -> bool:
    """Whether ``e`` has one value in every thread of a block: built from constants, extents, the block's
    coordinates (``bid``, ``bdim``, ``gdim``), the cluster rank and uniform variables; never from ``tid``,
    a load or a shuffle."""
    if isinstance(e, (kir.Const, kir.Extent)):
        return True
    if isinstance(e, kir.Var):
        return e.name in uniform
    d = _deps(e)
    return not d.varies and d.names <= uniform


def _launch_defects(program: kir.Program) -> list[str]:
    msgs: list[str] = []
    kernels = {k.name: k for k in program.kernels}
    buffers = {b.name: b for b in program.buffers}
    for d in _dupes(k.name for k in program.kernels):
        msgs.append(f"kernel {d} defined twice")
    for d in _dupes(b.name for b in program.buffers):
        msgs.append(f"buffer {d} declared twice")
    for i, launch in enumerate(program.launches):
        where = f"launch {i} ({launch.kernel})"
        k = kernels.get(launch.kernel)
        if k is None:
            msgs.append(f"{where}: no such kernel")
            continue
        if launch.block != k.block:
            msgs.append(f"{where}: block {launch.block}, the kernel's is {k.block}")
        if launch.smem_bytes < k.smem_bytes:
            msgs.append(f"{where}: {launch.smem_bytes} bytes of shared memory, the kernel needs {k.smem_bytes}")
        if launch.grid < 1 or launch.grid % k.cluster:
            msgs.append(f"{where}: grid {launch.grid} is not a positive multiple of the cluster {k.cluster}")
        if len(launch.args) != len(k.params):
            msgs.append(f"{where}: {len(launch.args)} arguments for {len(k.params)} parameters")
            continue
        for arg, p in zip(launch.args, k.params):
            b = buffers.get(arg)
            if b is None:
                msgs.append(f"{where}: argument {arg} is not a buffer of the program")
            elif p.role == kir.BufferRole.BARRIER or b.role == kir.BufferRole.BARRIER:
                if p.role != b.role:
                    msgs.append(f"{where}: parameter {p.name} ({p.role}) bound to {arg} ({b.role})")
            elif b.dtype != p.dtype:
                msgs.append(f"{where}: parameter {p.name} ({p.dtype}) bound to {arg} ({b.dtype})")
    return msgs
