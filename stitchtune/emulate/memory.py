"""Launch state, memory accesses and race tracking of the kir emulator (:mod:`stitchtune.emulate.emulator`).

Contract
--------
* :class:`EmulatorFault` (``kind`` one of :data:`FAULT_KINDS`) is the one error a kernel bug raises;
  :func:`elem_dtype` / :data:`NP_ELEM` give the numpy element type of each buffer dtype.
* ``_State`` is one launch: ``T = grid * block`` lockstep lanes (``tid``, ``bid``, ``lane``), the
  variables (``[T]`` arrays), local arrays (``[T, size]``, NaN at start), the global buffers of the
  launch (``_GBuf``: array, written flags, race tracker when the kernel writes the buffer) and the
  shared buffers (``_SBuf``: one ``size`` slice per block). Written flags only ever turn on, so once a
  buffer is fully written its loads skip the check (``_Written``). ``_State.full`` is the mask of every
  lane; a statement run under that very object takes its fast path (no ``where``, no compaction), and
  ``_State.mask`` hands it back for any mask that turns out all-active. ``_State.fault`` builds a fault
  naming the kernel, statement, element, block and thread of the first offending lane.
* ``_access`` is every (vector) load / store / atomic add of a global or shared buffer, with the
  checks of the emulator's module docstring (alignment, bounds, uninitialised reads, shared and global
  races through :class:`~stitchtune.emulate.races._Tracker`; the cluster's race record of a shared
  access, ``_cluster_track``), in named steps (``_checked_elements``: alignment and bounds;
  ``_atomic_add``); ``_shared_broadcast_load`` is its fast path for a shared load whose index repeats
  along the threads of a block, with the same checks. A load / store of another block's shared memory
  in the cluster (distributed shared memory, with the cluster checks: rank inside the cluster, after
  the cluster's first barrier, no access by two blocks of a cluster between cluster barriers unless
  both read) is :func:`stitchtune.emulate.cluster_ops._remote_access`.
* This module knows nothing of the IR's expressions and statements: they are compiled into closures
  over ``_State`` by :mod:`stitchtune.emulate.translate`; what a launch needs of such a compiled
  kernel is the protocol ``_CompiledKernel``. Imports go memory <- translate <- emulator (this
  module imports neither); :mod:`stitchtune.emulate.emulator` re-exports the public names.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any, Literal, Protocol, overload

import numpy as np

from stitchtune.emulate.races import _Tracker
from stitchtune.emulate.trace import AccessSink, MemoryAccess
from stitchtune.ir import kir
from stitchtune.ir.kir import BOOL, F32, I32, I64

FAULT_KINDS = (
    "out_of_bounds",
    "uninitialized_read",
    "shared_race",
    "global_race",
    "divergent_barrier",
    "inactive_shuffle",
    "grid_not_coresident",
    "bad_alignment",
    "cluster_out_of_range",
    "cluster_race",
    "cluster_not_resident",
)

class _ElemTypes(Mapping[str, np.dtype]):
    """Buffer dtype -> numpy element type; ``bfloat16`` imports ml_dtypes on its first lookup only."""

    _KEYS = ("float32", "float16", "bfloat16", "bool", "uint32", "int32", "int64", "float64")

    def __init__(self) -> None:
        self._known: dict[str, np.dtype] = {"float32": np.dtype(np.float32), "float16": np.dtype(np.float16),
                                            "bool": np.dtype(np.bool_), "uint32": np.dtype(np.uint32),
                                            "int32": np.dtype(np.int32), "int64": np.dtype(np.int64),
                                            "float64": np.dtype(np.float64)}   # (read only: a float64 input)

    def __getitem__(self, key: str) -> np.dtype:
        try:
            return self._known[key]
        except KeyError:
            if key != "bfloat16":
                raise
        from stitchtune.graph.reference import bfloat16_dtype

        dt = self._known[key] = bfloat16_dtype()
        return dt

    def __iter__(self) -> Iterator[str]:
        return iter(self._KEYS)

    def __len__(self) -> int:
        return len(self._KEYS)


#: numpy element type of each buffer dtype (barrier buffers are always uint32)
NP_ELEM: Mapping[str, np.dtype] = _ElemTypes()
_NP_SCALAR = {F32: np.float32, I32: np.int32, I64: np.int64, BOOL: np.bool_}


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
# Launch state
# ----------------------------------------------------------------------------------------------


class _Written:
    """The written flags of a buffer and whether a load must still check them: once every element of
    ``written[:size]`` is set it stays set (nothing clears a flag), so loads skip the check from then on.
    Stores call :meth:`stored`; the next load recounts (one ``all()`` instead of a gather per load)."""

    written: np.ndarray
    check_written: bool
    _nflags: int
    _stored: bool

    def _init_written(self, written: np.ndarray, n: int) -> None:
        self.written = written
        self._nflags = n  # the flags of the buffer's elements (written may be longer)
        self.check_written = not bool(written[:n].all())
        self._stored = False

    def stored(self) -> None:
        self._stored = True

    def must_check_written(self) -> bool:
        """True while some element of the buffer may be unwritten."""
        if self.check_written and self._stored:
            self._stored = False
            self.check_written = not bool(self.written[: self._nflags].all())
        return self.check_written


class _GBuf(_Written):
    """A global buffer as seen by one launch."""

    def __init__(self, param: kir.Param, arr: np.ndarray, written: np.ndarray, tracked: bool,
                 atomics: bool, size: int | None = None) -> None:
        size = param.size if size is None else size  # a generic kernel's launch: the actual buffer
        self.name = param.name
        self.arr = arr
        self.size = size
        self._init_written(written, size)
        self.tracker = _Tracker(size, atomics) if tracked else None
        self.scratch: np.ndarray | None = None  # positions, for the same-statement write check


class _SBuf(_Written):
    """A shared buffer: ``[grid * size]`` float32 values, written flags and a race tracker; in a
    cluster kernel also ``ctracker``, the blocks that accessed each element since the last cluster
    barrier (local and remote accesses; None otherwise)."""

    def __init__(self, size: int, grid: int, bid: np.ndarray, cluster: int = 1, atomics: bool = False) -> None:
        self.arr = np.zeros(grid * size, np.float32)
        self.size = size  # elements per block
        self._init_written(np.zeros(grid * size, bool), grid * size)
        self.tracker = _Tracker(grid * size, atomics=atomics)   # atomics: the kernel adds to it atomically
        self.ctracker = _Tracker(grid * size, atomics=False) if cluster > 1 else None
        # element offset of each thread's block in the flat array
        self.lane_base = bid.astype(np.intp) * size


class _CompiledKernel(Protocol):
    """What a launch needs of a compiled kernel (``stitchtune.emulate.translate._Compiled`` is one)."""

    @property
    def kernel(self) -> kir.Kernel: ...
    var_types: dict[str, str]    # every variable of the kernel -> its IR type
    written_params: set[str]     # parameters the kernel stores to (race-tracked)
    atomic_params: set[str]      # parameters (and shared buffers) the kernel adds to atomically


class _State:
    def __init__(self, ck: _CompiledKernel, grid: int, buffers: dict[str, np.ndarray],
                 written: dict[str, np.ndarray], coresident_limit: int | None,
                 extents: dict[str, int] | None = None, *, gdim: int | None = None,
                 trace: AccessSink | None = None) -> None:
        k = ck.kernel
        ext = dict(extents or {})
        if set(ext) != set(k.extents) or any(v < 1 or v >= 2**31 for v in ext.values()):
            raise ValueError(f"kernel {k.name}: extents {sorted(ext.items())} for arguments {list(k.extents)}")
        #: a generic kernel's dynamic extents (int32 values of its ``int`` arguments)
        self.extents = {n: np.int32(v) for n, v in ext.items()}
        self.kernel = k
        self.grid = grid
        #: gridDim.x the kernel sees: the launch's grid, larger than ``grid`` when only its first
        #: ``grid`` blocks are emulated (a slice of the launch, :func:`emulate_kernel`'s ``blocks``)
        self.gdim = grid if gdim is None else gdim
        #: the sink of a :class:`MemoryAccess` per executed global and shared access statement (None: off)
        self.trace = trace
        self.block = k.block
        self.T = T = grid * k.block
        t = np.arange(T, dtype=np.int32)
        self.tid = t % np.int32(k.block)
        self.bid = t // np.int32(k.block)
        self.lane = self.tid % np.int32(32)
        self.ar = t
        self.full = np.ones(T, bool)  # the mask of every lane: the body runs under it, never written to
        self.coresident_limit = coresident_limit
        self.block_rank: np.ndarray | None = None  # the order blocks apply atomic adds in (None: thread order)
        self.where = ""
        self.vars: dict[str, np.ndarray] = {}
        for name, dt in ck.var_types.items():  # declared `= 0` at the top, as gpu/render.py does
            self.vars[name] = np.zeros(T, _NP_SCALAR[dt])
        self.locals = {a.name: np.full((T, a.size), np.nan, np.float32) for a in k.locals}
        # flat offset of each lane's row in a local array (a gather by flat index is far faster than [lane, i])
        self.local_rows = {a.name: t.astype(np.intp) * a.size for a in k.locals}
        self.glob: dict[str, _GBuf] = {}
        for p in k.params:
            if p.name not in buffers:
                raise ValueError(f"kernel {k.name}: no buffer for parameter {p.name}")
            arr = buffers[p.name]
            want = elem_dtype(p.dtype, p.role)
            # a generic kernel's buffers are those of the launch's extents, at most Param.size
            if arr.ndim != 1 or arr.dtype != want or (arr.size < p.size and not k.extents):
                raise ValueError(f"kernel {k.name}: buffer {p.name} must be 1-D {want} of >= {p.size} "
                                 f"elements, got {arr.dtype} {arr.shape}")
            w = written.get(p.name)
            if w is None:
                w = np.ones(arr.size, bool)
            self.glob[p.name] = _GBuf(p, arr, w, tracked=p.name in ck.written_params,
                                      atomics=p.name in ck.atomic_params,
                                      size=min(arr.size, p.size) if k.extents else p.size)
        self.cluster = k.cluster
        self.shared = {s.name: _SBuf(s.size, grid, self.bid, k.cluster, atomics=s.name in ck.atomic_params)
                       for s in k.shared}
        self.cluster_synced = False   # a ClusterSync has run (every block of the cluster has started)
        self.remote_pending = False   # a remote access since the last ClusterSync
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

    def mask(self, m: np.ndarray) -> np.ndarray:
        """``m``, or :attr:`full` itself when every lane of ``m`` is active (the statements take their
        fast paths on ``m is st.full``: no ``where``, no compaction)."""
        return self.full if m is not self.full and m.all() else m

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


def _active(st: _State, m: np.ndarray, pred: Any) -> tuple[np.ndarray, np.ndarray]:
    """(mask, lane indices) of the threads of ``m`` that execute a predicated memory statement
    (``pred``: its compiled predicate, or None for all of ``m``)."""
    act = st.mask(m & pred(st, m)) if pred is not None else m
    return act, (st.ar if act is st.full else np.flatnonzero(act))


def _lanes_of(x: Any, lanes: np.ndarray) -> np.ndarray:
    """The values of ``x`` (a [T] array or a scalar) at ``lanes``."""
    if np.ndim(x) == 0:
        return np.full(lanes.size, x)
    if lanes.size == x.shape[0]:  # lanes: sorted distinct lanes, so all of them
        return x
    return x.take(lanes)


def _elements(base: np.ndarray, width: int) -> np.ndarray:
    """``[base + k for k < width]`` per lane, flat (int32, lane-major)."""
    e = np.empty((base.size, width), np.int32)
    for k in range(width):  # one strided column at a time: far faster than a [n, 1] + [width] broadcast
        np.add(base, np.int32(k), out=e[:, k])
    return e.ravel()


def _per_element(x: np.ndarray, width: int) -> np.ndarray:
    """``x`` (one value per lane) repeated for each of the ``width`` elements of the lane's access."""
    return x if width == 1 else np.repeat(x, width)


@overload
def _access(st: _State, buf: str, is_shared: bool, lanes: np.ndarray, base: np.ndarray, width: int,
            op: Literal["load"], values: np.ndarray | None = None, raw: bool = False) -> np.ndarray: ...
@overload
def _access(st: _State, buf: str, is_shared: bool, lanes: np.ndarray, base: np.ndarray, width: int,
            op: str, values: np.ndarray | None = None, raw: bool = False) -> np.ndarray | None: ...
def _access(st: _State, buf: str, is_shared: bool, lanes: np.ndarray, base: np.ndarray, width: int,
            op: str, values: np.ndarray | None = None, raw: bool = False) -> np.ndarray | None:
    """One (vector) memory access of ``width`` elements from ``base`` by each thread in ``lanes``.

    ``op``: load (returns float32 [n, width]; ``raw``: in the buffer's own dtype), store or atomic
    (``values`` float32 [n, width]).
    """
    base = np.ascontiguousarray(base, dtype=np.int32)  # IR indices are i32
    b: _GBuf | _SBuf = st.shared[buf] if is_shared else st.glob[buf]
    e = _checked_elements(st, buf, op, b.size, lanes, base, width)
    if st.trace is not None:
        st.trace.append(MemoryAccess(st.kernel.name, st.where, buf, op, 4 if is_shared else b.arr.dtype.itemsize,
                                     st.block, lanes.astype(np.int64), base.astype(np.int64), width, is_shared))
    # flat element of each lane (intp: numpy converts any other index type on every gather)
    g = _per_element(b.lane_base.take(lanes), width) + e if isinstance(b, _SBuf) else e.astype(np.intp)
    tracker = b.tracker
    if tracker is not None:  # the accessor ids the tracker records: threads (shared) or blocks (global)
        ids = st.tid if is_shared else st.bid
        who = ids if lanes is st.ar else ids.take(lanes)
        if width > 1:
            who = np.repeat(who, width)
        # increasing elements (a coalesced access) are distinct: the trackers and the same-statement
        # write check then skip their search for lanes that share an element
        distinct = g.size < 2 or bool((g[1:] > g[:-1]).all())
    if op in ("load", "atomic") and b.must_check_written():
        wr = b.written.take(g)
        if not wr.all():
            raise st.fault("uninitialized_read", f"{op} of unwritten {buf}{{at}}", ~wr, _per_element(lanes, width), e)
    if isinstance(b, _SBuf) and b.ctracker is not None:
        _cluster_track(st, b, buf, op, g, _per_element(lanes, width), e)
    race = "shared_race" if is_shared else "global_race"
    if op == "load":
        if tracker is not None:
            bad = tracker.read(g, who, distinct)
            if bad.any():
                raise st.fault(race, f"read of {buf}{{at}} written by another "
                               f"{'thread' if is_shared else 'block'} without a barrier", bad,
                               _per_element(lanes, width), e)
        v = b.arr.take(g)
        if v.dtype != np.float32 and not raw:
            v = v.astype(np.float32)
        return v.reshape(-1, width)
    assert values is not None
    arr = b.arr
    if op == "store":
        if tracker is not None:
            bad = tracker.write(g, who, distinct)
            if bad.any():
                raise st.fault(race, f"write of {buf}{{at}} accessed by another "
                               f"{'thread' if is_shared else 'block'} without a barrier", bad,
                               _per_element(lanes, width), e)
        if isinstance(b, _GBuf) and tracker is not None and lanes.size > 1 and not distinct:
            _check_same_statement_writes(st, b, g, lanes, width, e)
        arr[g] = values.ravel().astype(arr.dtype, copy=False)
        b.written[g] = True
        b.stored()
        return None
    # atomic add
    if tracker is not None:
        bad = tracker.atomic(g, who, distinct)
        if bad.any():
            raise st.fault(race, f"atomic add to {buf}{{at}} also plainly accessed by another block", bad,
                           _per_element(lanes, width), e)
    _atomic_add(st, arr, g, values, lanes, width)
    return None


def _checked_elements(st: _State, buf: str, op: str, size: int, lanes: np.ndarray, base: np.ndarray,
                      width: int) -> np.ndarray:
    """The elements an access of ``width`` from each lane's ``base`` (i32) touches, ``width`` per lane in
    lane order, after its checks: every base aligned to the width (``bad_alignment``), every element
    inside the buffer's ``size`` (``out_of_bounds``)."""
    if width > 1:
        # widths are powers of two: every base is aligned iff their bitwise or is (one reduction)
        if base.size and np.bitwise_or.reduce(base) & np.int32(width - 1):
            mis = (base & np.int32(width - 1)) != 0
            raise st.fault("bad_alignment", f"{width}-wide access to {buf}{{at}}", mis, lanes, base)
        e = _elements(base, width)
    else:
        e = base
    eu = e.view(np.uint32)  # negative indices wrap to huge unsigned values
    if eu.size and eu.max() >= size:  # one reduction; the offending lanes only on the fault path
        raise st.fault("out_of_bounds", f"{op} of {buf}{{at}} (size {size})", eu >= size,
                       _per_element(lanes, width), e)
    return e


def _atomic_add(st: _State, arr: np.ndarray, g: np.ndarray, values: np.ndarray, lanes: np.ndarray,
                width: int) -> None:
    """``arr[g] += values`` for every element (repeated elements add up), each add at the buffer's own
    precision (a 16-bit buffer rounds each add, as ``atomicAdd`` does), the blocks' adds in the launch's
    seeded block order where it has one (float addition is not associative)."""
    vals = values.ravel()
    if arr.dtype != vals.dtype:
        vals = vals.astype(arr.dtype)
    if st.block_rank is not None:
        order = np.argsort(st.block_rank[st.bid[_per_element(lanes, width)]], kind="stable")
        g, vals = g[order], vals[order]
    np.add.at(arr, g, vals)


def _check_same_statement_writes(st: _State, b: _GBuf, g: np.ndarray, lanes: np.ndarray, width: int,
                                 e: np.ndarray) -> None:
    """``global_race`` when two threads write one global element in the same store statement (one
    thread's vector never repeats an element, so a repeat is always two threads).

    Each position's index is scattered into a scratch array of the buffer's size and read back: with a
    repeated element only one of its positions can read its own index back (O(n), no sort); the fault
    then names the first repeat in lane order.
    """
    pos = np.arange(g.size, dtype=np.intp)
    if b.scratch is None:
        b.scratch = np.empty(b.size, np.intp)
    b.scratch[g] = pos
    if (b.scratch.take(g) == pos).all():
        return
    order = np.argsort(g, kind="stable")
    sg = g[order]
    dup = sg[1:] == sg[:-1]
    bad = np.zeros(g.size, bool)
    bad[order[1:][dup]] = True
    raise st.fault("global_race", f"write of {b.name}{{at}} by two threads in one store (no atomic)", bad,
                   _per_element(lanes, width), e)


def _cluster_track(st: _State, sb: _SBuf, buf: str, op: str, g: np.ndarray, lanes: np.ndarray,
                   e: np.ndarray) -> None:
    """Record a (local or remote) access of shared elements ``g`` (flat over the grid) by the blocks of
    ``lanes`` since the last cluster barrier; an element another block wrote (or, for a write, read or
    wrote) in that interval is a ``cluster_race``."""
    assert sb.ctracker is not None
    who = st.bid[lanes]
    bad = sb.ctracker.read(g, who) if op == "load" else sb.ctracker.write(g, who)
    if bad.any():
        verb = "read" if op == "load" else "write"
        raise st.fault("cluster_race", f"{verb} of {buf}{{at}} accessed by another block of the cluster "
                       "without a cluster barrier in between", bad, lanes, e)


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
        ib: np.ndarray = np.full((grid, 1), iv, np.int32)
    else:
        per_block = iv.reshape(grid, block)
        row0 = per_block[0]
        p = 1
        # row0[p] == row0[0] is necessary for period p: a scalar test before the O(block) one
        while p < block and (row0[p] != row0[0] or not (row0.reshape(-1, p) == row0[:p]).all()):
            p *= 2
        if p >= block:
            return None
        ib = per_block[:, :p]
        if not (per_block.reshape(grid, block // p, p) == ib[:, None, :]).all():
            return None
        ib = np.ascontiguousarray(ib, dtype=np.int32)
    sb = st.shared[buf]
    if sb.ctracker is not None:  # a cluster kernel: the general path records the cluster accesses
        return None
    lanes: np.ndarray = (st.ar[::block][:, None] + np.arange(p, dtype=np.int32)).ravel()  # threads to name in a fault
    ib = ib.ravel()
    oob = ib.view(np.uint32) >= sb.size
    if oob.any():
        raise st.fault("out_of_bounds", f"load of {buf}{{at}} (size {sb.size})", oob, lanes, ib)
    g = sb.lane_base.take(lanes) + ib
    if sb.must_check_written():
        wr = sb.written.take(g)
        if not wr.all():
            raise st.fault("uninitialized_read", f"load of unwritten {buf}{{at}}", ~wr, lanes, ib)
    w = sb.tracker.w.take(g)
    bad = w != -1  # several threads read each element: any writer in this interval races with one
    if bad.any():
        other = lanes + np.where(w == st.tid[lanes], p, 0).astype(np.int32)  # a reader that is not the writer
        raise st.fault("shared_race", f"read of {buf}{{at}} written by another thread without a barrier",
                       bad, other, ib)
    sb.tracker.r[g] = -2
    v = sb.arr.take(g).reshape(grid, 1, p)
    return np.broadcast_to(v, (grid, block // p, p)).reshape(st.T)
