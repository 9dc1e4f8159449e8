"""The emulator's translation of the cluster IR (``RemoteLoad``, ``RemoteStore``, ``ClusterSync``)
into numpy closures: the part of :class:`stitchtune.emulate.translate._Compiled` that knows thread-block
clusters, kept here as a mixin. Semantics (distributed shared memory, the cluster barrier, the faults
``cluster_out_of_range`` / ``cluster_race`` / ``divergent_barrier``) are in
:mod:`stitchtune.emulate.emulator`'s docstring; accesses go through
:func:`_remote_access` (here; local accesses: :func:`stitchtune.emulate.memory._access`).

A user of the mixin provides ``kernel`` (the kir Kernel), ``shared`` (its shared buffers) and
``as_type(expr, type) -> ExprFn``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from stitchtune.emulate.memory import _active, _cluster_track, _lanes_of, _State
from stitchtune.ir import kir
from stitchtune.ir.kir import BOOL, F32, I32

__all__ = ["ClusterOps", "ExprFn", "StmtFn"]

ExprFn = Callable[[_State, np.ndarray], Any]
StmtFn = Callable[[_State, np.ndarray], None]


class ClusterOps:
    """Translation of the cluster statements and expressions (mixin of ``_Compiled``)."""

    shared: Any

    @property
    def kernel(self) -> kir.Kernel:  # provided by the translator
        raise NotImplementedError

    def as_type(self, e: kir.Expr, t: str) -> ExprFn:  # provided by the translator
        raise NotImplementedError

    def _need_cluster(self, what: str) -> None:
        if self.kernel.cluster <= 1:
            raise ValueError(f"kernel {self.kernel.name}: {what} in a kernel without a cluster")

    def _remote_parts(self, buf: str, rank: kir.Expr, index: kir.Expr, pred: kir.Expr | None, what: str):
        self._need_cluster(what)
        if buf not in self.shared:
            raise ValueError(f"kernel {self.kernel.name}: {what} of {buf}, which is not a shared buffer")
        return (self.as_type(rank, I32), self.as_type(index, I32),
                self.as_type(pred, BOOL) if pred is not None else None)

    def remote_load(self, e: kir.RemoteLoad) -> ExprFn:
        rank, idx, pred = self._remote_parts(e.buf, e.rank, e.index, e.pred, "RemoteLoad")
        buf = e.buf

        def remote_load(st: _State, m: np.ndarray) -> Any:
            act, lanes = _active(st, m, pred)
            out = np.zeros(st.T, np.float32)
            if lanes.size:
                out[lanes] = _remote_access(st, buf, lanes, _lanes_of(rank(st, act), lanes),
                                            _lanes_of(idx(st, act), lanes), "load")
            return out
        return remote_load

    def remote_store(self, s: kir.RemoteStore, where: str) -> StmtFn:
        rank, idx, pred = self._remote_parts(s.buf, s.rank, s.index, s.pred, "RemoteStore")
        vf = self.as_type(s.value, F32)
        buf = s.buf

        def remote_store(st: _State, m: np.ndarray) -> None:
            st.where = where
            act, lanes = _active(st, m, pred)
            if lanes.size:
                _remote_access(st, buf, lanes, _lanes_of(rank(st, act), lanes), _lanes_of(idx(st, act), lanes),
                               "store", _lanes_of(vf(st, act), lanes))
        return remote_store

    def cluster_sync(self, where: str) -> StmtFn:
        self._need_cluster("ClusterSync")

        def cluster_sync(st: _State, m: np.ndarray) -> None:
            st.where = where
            size = st.cluster * st.block
            c = m.reshape(-1, size)
            some, every = c.any(axis=1), c.all(axis=1)
            part = some & ~every
            if part.any():
                raise st.fault("divergent_barrier", "cluster.sync() not reached by every thread of the "
                               "cluster", np.repeat(part, size) & ~m, st.ar)
            blocks = np.repeat(every, st.cluster)
            for sb in st.shared.values():
                sb.tracker.reset(blocks, sb.size)
                if sb.ctracker is not None:
                    sb.ctracker.reset(blocks, sb.size)
            if every.all():
                st.cluster_synced = True
                st.remote_pending = False
        return cluster_sync


def _remote_access(st: _State, buf: str, lanes: np.ndarray, rank: np.ndarray, idx: np.ndarray, op: str,
                   values: np.ndarray | None = None) -> np.ndarray | None:
    """A load (returns float32 ``[n]``) or store of element ``idx`` of shared buffer ``buf`` of the
    cluster's block ``rank``, by each thread in ``lanes`` (distributed shared memory)."""
    rank = np.ascontiguousarray(rank, dtype=np.int32)
    idx = np.ascontiguousarray(idx, dtype=np.int32)
    outside = rank.view(np.uint32) >= st.cluster
    if outside.any():
        raise st.fault("cluster_out_of_range", f"remote {op} of {buf} in the block of cluster rank "
                       f"{int(rank[np.flatnonzero(outside)[0]])} (cluster of {st.cluster})", outside, lanes)
    if not st.cluster_synced:
        raise st.fault("cluster_race", f"remote {op} of {buf} before the cluster's first barrier (the "
                       "target block may not have started)", np.ones(lanes.size, bool), lanes)
    sb = st.shared[buf]
    oob = idx.view(np.uint32) >= sb.size
    if oob.any():
        raise st.fault("out_of_bounds", f"remote {op} of {buf}{{at}} (size {sb.size})", oob, lanes, idx)
    target = (st.bid[lanes] // np.int32(st.cluster)) * np.int32(st.cluster) + rank
    g = target.astype(np.int64) * sb.size + idx
    st.remote_pending = True
    if op == "load":
        un = ~sb.written[g]
        if un.any():
            raise st.fault("uninitialized_read", f"remote load of unwritten {buf}{{at}}", un, lanes, idx)
    _cluster_track(st, sb, buf, op, g, lanes, idx)
    if op == "load":
        return sb.arr[g]
    assert values is not None
    sb.arr[g] = values.astype(np.float32, copy=False)
    sb.written[g] = True
    sb.stored()
    return None
