"""The ``cluster`` stitching scheme of row reductions (thread-block clusters, sm_90).

A row split over ``split`` blocks whose stage uses the ``cluster`` scheme is launched as clusters of
``split`` blocks (``Kernel.cluster``, rendered ``__cluster_dims__``): the grid is a multiple of the
split (``Lowerer.grid_for`` rounds it so), so the blocks of one task group ``bid // split`` hold the
pieces of one row and a block's split index is its cluster rank. After the block has its partial
(warp shuffles, then shared memory across the warps when the block has several), the partials are
combined through distributed shared memory:

1. thread 0 of each block writes the block's partial of each reduction of the stage to its own
   ``scl`` (one slot per reduction);
2. ``cluster.sync()``: every block of the cluster has written (and has started, so its shared memory
   may be mapped);
3. every thread reads slot ``r`` of every block of the cluster (ranks 0..split-1, in that order, so
   every block computes bitwise the same total) and combines them;
4. ``cluster.sync()`` again: no block overwrites ``scl`` (next stage or round) or exits while
   another one still reads it.

The row's elements stay where the reuse levels say (registers, shared memory) between stages, as for
``regional``: nothing of the row goes through global memory and there is no grid barrier.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from stitchtune.ir import kir
from stitchtune.lower.base import I

if TYPE_CHECKING:
    from stitchtune.space.schemes import SchemeTable

#: the shared buffer of the cluster exchange (one float per slot of a stage's reduction states)
CLUSTER_BUF = "scl"


def cluster_size(schemes: tuple[str, ...], seg: list[int], split: int, table: "SchemeTable") -> int:
    """Blocks per cluster of a kernel running stages ``seg``: the split when one of them uses a cluster
    scheme, else 1."""
    return split if table.any((schemes[i] for i in seg), lambda sc: sc.cluster) else 1


def cluster_shared(slots: int) -> kir.SharedBuf:
    """The exchange buffer of a cluster kernel whose stages' states have at most ``slots`` slots."""
    return kir.SharedBuf(CLUSTER_BUF, max(1, slots))


@dataclass(frozen=True)
class ClusterMeeting:
    """The blocks of a row's cluster meeting in their ``scl`` (module docstring, steps 1-4): a
    :class:`~stitchtune.lower.exchange.Meeting` of ``size`` blocks, every state variable in its own slot,
    written by thread 0; every thread merges the states of ranks 0..size-1 in order, so every block holds
    bitwise the same row result."""

    size: int

    def store(self, slot: int, j: int, value: kir.Expr) -> kir.Stmt:
        return kir.StoreVec(CLUSTER_BUF, I(slot), (value,), kir.Bin("==", kir.Special("tid"), I(0)))

    def load(self, slot: int, peer: kir.Expr, j: int) -> kir.Expr:
        return kir.RemoteLoad(CLUSTER_BUF, peer, I(slot))

    def sync(self) -> kir.Stmt:
        return kir.ClusterSync()

    def peers(self, body: Callable[[kir.Expr], list[kir.Stmt]]) -> list[kir.Stmt]:
        return [st for q in range(self.size) for st in body(I(q))]


#: slots of the exchange buffer a single-pass state can need (Welford: n, mean, M2, shift)
STATE_SLOTS = 4


def cluster_counts(kern: kir.Kernel, rounds: int) -> dict[str, int]:
    """What the cost model needs of a cluster kernel: cluster barriers one block passes and remote
    shared-memory loads one thread issues per launch (``rounds`` rounds of the body's statements)."""
    syncs = sum(1 for st in kir.walk(kern.body) if isinstance(st, kir.ClusterSync))

    loads = sum(isinstance(e, kir.RemoteLoad) for st in kir.walk(kern.body) if not isinstance(st, (kir.For, kir.If))
                for e in kir.exprs(st))
    return {"cluster": kern.cluster, "cluster_barriers": rounds * syncs, "dsmem_loads": rounds * loads}


def as_cluster(kern: kir.Kernel, prof: kir.KernelProfile, cluster: int,
               rounds: int) -> tuple[kir.Kernel, kir.KernelProfile]:
    """``kern`` launched as thread-block clusters of ``cluster`` blocks, and its profile with the
    cluster's counts (:func:`cluster_counts` over ``rounds`` rounds)."""
    kern = dataclasses.replace(kern, cluster=cluster)
    counts = cluster_counts(kern, rounds)
    return kern, dataclasses.replace(prof, cluster=counts["cluster"], cluster_barriers=counts["cluster_barriers"],
                                     dsmem_loads=counts["dsmem_loads"])
