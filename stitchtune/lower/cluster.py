"""The ``cluster`` stitching scheme of row reductions (thread-block clusters, sm_90).

A row split over ``split`` blocks whose stage uses the ``cluster`` scheme is launched as clusters of
``split`` blocks (``Kernel.cluster``, rendered ``__cluster_dims__``): the grid is a multiple of the
split (``_Lowerer.grid_for`` rounds it so), so the blocks of one task group ``bid // split`` hold the
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

from typing import TYPE_CHECKING

from stitchtune.ir import kir
from stitchtune.ir.kir import Assign, Bin
from stitchtune.lower.base import _I

if TYPE_CHECKING:  # the row kernel builder (stitchtune.lower.row imports this module)
    from stitchtune.lower.row import _RowKernel

#: the shared buffer of the cluster exchange (one float per reduction of a stage)
CLUSTER_BUF = "scl"


def cluster_size(schemes: tuple[str, ...], seg: list[int], split: int) -> int:
    """Blocks per cluster of a kernel running stages ``seg``: the split when one of them uses the
    cluster scheme, else 1."""
    return split if any(schemes[i] == "cluster" for i in seg) else 1


def cluster_shared(slots: int) -> kir.SharedBuf:
    """The exchange buffer of a cluster kernel whose stages have at most ``slots`` reductions."""
    return kir.SharedBuf(CLUSTER_BUF, max(1, slots))


def cluster_exchange(k: "_RowKernel", reds: list[str]) -> None:
    """Combine the block partials ``k.pvals[r]`` of ``reds`` across the row's cluster (module
    docstring, steps 1-4); afterwards every thread of every block holds the row's combined value."""
    low, rb = k.low, k.rb
    size = low.s.split
    writer = Bin("==", kir.Special("tid"), _I(0))
    for slot, r in enumerate(reds):
        rb.append(kir.StoreVec(CLUSTER_BUF, _I(slot), (k.pvals[r],), writer))
    rb.append(kir.ClusterSync())
    for slot, r in enumerate(reds):
        acc = k.pvals[r]
        rb.append(Assign(acc, low.identity(r)))
        for q in range(size):
            rb.append(Assign(acc, low.combine(r, acc, kir.RemoteLoad(CLUSTER_BUF, _I(q), _I(slot)))))
    rb.append(kir.ClusterSync())


def cluster_exchange_merged(k: "_RowKernel", st) -> None:
    """The same exchange for the running state ``st`` of a single-pass pair
    (:class:`stitchtune.lower.single_pass.OnlineState`): every state variable in its own slot, then
    every thread merges the states of ranks 0..split-1 in order (bitwise the same row result in every
    block)."""
    from stitchtune.lower import single_pass as sp  # noqa: PLC0415 (a sibling module, used here only)

    rb, size = k.rb, k.low.s.split
    writer = Bin("==", kir.Special("tid"), _I(0))
    for slot, v in enumerate(st.vars):
        rb.append(kir.StoreVec(CLUSTER_BUF, _I(slot), (v,), writer))
    rb.append(kir.ClusterSync())
    rb.extend(sp.reset(st))
    for q in range(size):
        other = tuple(kir.RemoteLoad(CLUSTER_BUF, _I(q), _I(slot)) for slot in range(len(st.vars)))
        rb.extend(sp.merge(st, other, k.cx.var))
    rb.append(kir.ClusterSync())


#: slots of the exchange buffer a single-pass state can need (Welford: n, mean, M2, shift)
STATE_SLOTS = 4


def cluster_counts(kern: kir.Kernel, rounds: int) -> dict[str, int]:
    """What the cost model needs of a cluster kernel: cluster barriers one block passes and remote
    shared-memory loads one thread issues per launch (``rounds`` rounds of the body's statements)."""
    syncs = sum(1 for st in kir.walk(kern.body) if isinstance(st, kir.ClusterSync))

    loads = sum(isinstance(e, kir.RemoteLoad) for st in kir.walk(kern.body) if not isinstance(st, (kir.For, kir.If))
                for e in kir.exprs(st))
    return {"cluster": kern.cluster, "cluster_barriers": rounds * syncs, "dsmem_loads": rounds * loads}
