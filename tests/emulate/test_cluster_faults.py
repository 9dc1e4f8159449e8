"""Thread-block clusters in the emulator: cluster rank, cluster barrier and distributed shared memory
on hand-built kernels, and each cluster fault (``cluster_out_of_range``, ``cluster_race``,
``cluster_not_resident``)."""

from __future__ import annotations

import numpy as np
import pytest

from stitchtune.emulate.emulator import FAULT_KINDS, EmulatorFault, emulate_kernel
from stitchtune.ir.kir import (
    I32,
    Assign,
    Bin,
    ClusterRank,
    ClusterSync,
    Const,
    Kernel,
    Load,
    Param,
    RemoteLoad,
    RemoteStore,
    SharedBuf,
    Special,
    StoreVec,
    Var,
)

TID, BID = Special("tid"), Special("bid")
C = 4  # blocks per cluster
GRID = 8


def _i(v: int) -> Const:
    return Const(v, I32)


def cluster_sum_kernel(*, first_sync: bool = True, middle_sync: bool = True, last_sync: bool = True,
                       rank_offset: int = 0, cluster: int = C) -> Kernel:
    """y[bid] = the sum over the block's cluster of x[bid'], exchanged through each block's shared ``s``:
    thread 0 writes x[bid] to its own s[0], then (after a cluster barrier) every thread of the block
    reads s[0] of every rank of the cluster. The flags drop barriers, ``rank_offset`` shifts the ranks."""
    acc = Var("acc")
    body: list = [Assign(acc, Const(0.0))]
    if first_sync:
        body.append(ClusterSync())
    body.append(StoreVec("s", _i(0), (Load("x", BID),), Bin("==", TID, _i(0))))
    if middle_sync:
        body.append(ClusterSync())
    for q in range(cluster):
        body.append(Assign(acc, Bin("+", acc, RemoteLoad("s", _i(q + rank_offset), _i(0)))))
    if last_sync:
        body.append(ClusterSync())
    body.append(StoreVec("y", BID, (acc,), Bin("==", TID, _i(0))))
    return Kernel("csum", (Param("x", "float32", GRID, "input"), Param("y", "float32", GRID, "output")),
                  tuple(body), block=64, shared=(SharedBuf("s", 1),), cluster=cluster)


def _bufs() -> dict[str, np.ndarray]:
    return {"x": np.arange(1, GRID + 1, dtype=np.float32), "y": np.zeros(GRID, np.float32)}


def _fault(kernel: Kernel, grid: int = GRID, **kw) -> EmulatorFault:
    with pytest.raises(EmulatorFault) as ei:
        emulate_kernel(kernel, grid, _bufs(), **kw)
    return ei.value


def test_cluster_fault_kinds_are_declared() -> None:
    assert {"cluster_out_of_range", "cluster_race", "cluster_not_resident"} <= set(FAULT_KINDS)


def test_cluster_sum_through_distributed_shared_memory() -> None:
    bufs = _bufs()
    emulate_kernel(cluster_sum_kernel(), GRID, bufs, cluster_limit=4)
    want = bufs["x"].reshape(-1, C).sum(axis=1).repeat(C)
    np.testing.assert_array_equal(bufs["y"], want)


def test_cluster_rank_is_the_block_index_within_its_cluster() -> None:
    r = Var("r", I32)
    k = Kernel("rank", (Param("y", "float32", GRID, "output"),),
               (Assign(r, ClusterRank()), StoreVec("y", BID, (r,), Bin("==", TID, _i(0)))), block=32, cluster=C)
    bufs = {"y": np.zeros(GRID, np.float32)}
    emulate_kernel(k, GRID, bufs)
    np.testing.assert_array_equal(bufs["y"], np.arange(GRID) % C)


def test_remote_access_outside_the_cluster() -> None:
    fault = _fault(cluster_sum_kernel(rank_offset=1))
    assert fault.kind == "cluster_out_of_range" and "rank 4" in fault.message


def test_remote_read_before_the_cluster_barrier() -> None:
    fault = _fault(cluster_sum_kernel(middle_sync=False))  # reads what other blocks just wrote
    assert fault.kind == "cluster_race" and "without a cluster barrier" in fault.message


def test_remote_read_before_the_first_cluster_barrier() -> None:
    fault = _fault(cluster_sum_kernel(first_sync=False, middle_sync=False))
    assert fault.kind == "cluster_race" and "first barrier" in fault.message


def test_remote_read_after_the_last_cluster_barrier() -> None:
    fault = _fault(cluster_sum_kernel(last_sync=False))  # a block may exit while it is read
    assert fault.kind == "cluster_race" and "after the last cluster barrier" in fault.message


def test_overwriting_while_another_block_reads_is_a_cluster_race() -> None:
    k = cluster_sum_kernel(last_sync=False)
    # write s again right after the remote reads, without a cluster barrier in between
    body = k.body[:-1] + (StoreVec("s", _i(0), (Const(0.0),), Bin("==", TID, _i(0))), ClusterSync(), k.body[-1])
    fault = _fault(Kernel(k.name, k.params, body, k.block, k.shared, cluster=k.cluster))
    assert fault.kind == "cluster_race"


def test_remote_store_then_barrier_then_local_read() -> None:
    v = Var("v")
    body = (ClusterSync(),
            RemoteStore("s", Bin("%", Bin("+", ClusterRank(), _i(1)), _i(C)), _i(0), Bin("+", BID, _i(0)),
                        Bin("==", TID, _i(0))),
            ClusterSync(),
            Assign(v, Load("s", _i(0))),
            StoreVec("y", BID, (v,), Bin("==", TID, _i(0))))
    k = Kernel("ring", (Param("y", "float32", GRID, "output"),), body, block=32, shared=(SharedBuf("s", 1),),
               cluster=C)
    bufs = {"y": np.zeros(GRID, np.float32)}
    emulate_kernel(k, GRID, bufs)
    bid = np.arange(GRID)
    np.testing.assert_array_equal(bufs["y"], (bid // C) * C + (bid % C - 1) % C)  # from the previous rank


def test_grid_not_a_multiple_of_the_cluster_cannot_launch() -> None:
    fault = _fault(cluster_sum_kernel(), grid=6)
    assert fault.kind == "cluster_not_resident" and "multiple" in fault.message


def test_cluster_that_cannot_be_resident() -> None:
    fault = _fault(cluster_sum_kernel(), cluster_limit=0)
    assert fault.kind == "cluster_not_resident" and "resident" in fault.message


def test_cluster_operations_need_a_cluster_kernel() -> None:
    k = Kernel("nocl", (), (ClusterSync(),), block=32)
    with pytest.raises(ValueError, match="without a cluster"):
        emulate_kernel(k, 1, {})
