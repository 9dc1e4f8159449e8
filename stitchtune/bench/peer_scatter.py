"""The peers' ``scatter_add`` (an embedding's gradient), in torch and in JAX, as the reference.

``torch_scatter_ops()`` / ``jax_scatter_ops()`` give ``{"scatter_add": f(node, args)}`` for the node-op
tables of :mod:`stitchtune.bench.peers` and :mod:`stitchtune.bench.jax_peer`: ``zeros(node.shape)``
with the rows of ``v`` added at the rows ``idx`` names (``index_add`` in torch, ``.at[idx].add`` in
JAX); an index outside ``[0, rows)`` adds nothing (its row is masked to zero and added to a clamped
row). torch and jax are imported inside the
functions (optional dependencies).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from stitchtune.bench.peer_ops import NodeOp

if TYPE_CHECKING:
    from stitchtune.graph.parse import Node

__all__ = ["jax_scatter_ops", "torch_scatter_ops"]


def torch_scatter_ops() -> dict[str, NodeOp]:
    """``scatter_add`` on torch tensors: ``zeros(shape).index_add(0, idx, v)`` (the masked rows zero)."""
    import torch

    def scatter_add(node: Node, args: list[Any]) -> Any:
        v, idx = args
        shape = tuple(node.shape)
        idx = idx.reshape(-1)
        ok = (idx >= 0) & (idx < shape[0])
        rows = v.reshape((-1,) + shape[1:]) * ok.reshape((-1,) + (1,) * (len(shape) - 1)).to(v.dtype)
        out = torch.zeros(shape, dtype=v.dtype, device=v.device)
        return out.index_add(0, idx.clamp(0, shape[0] - 1), rows)

    return {"scatter_add": scatter_add}


def jax_scatter_ops() -> dict[str, NodeOp]:
    """``scatter_add`` on JAX arrays: ``zeros(shape).at[idx].add(v)`` (the masked rows zero)."""
    import jax.numpy as jnp

    def scatter_add(node: Node, args: list[Any]) -> Any:
        v, idx = args
        shape = tuple(node.shape)
        idx = idx.reshape(-1)
        ok = (idx >= 0) & (idx < shape[0])
        rows = v.reshape((-1,) + shape[1:]) * ok.reshape((-1,) + (1,) * (len(shape) - 1)).astype(v.dtype)
        return jnp.zeros(shape, dtype=v.dtype).at[jnp.clip(idx, 0, shape[0] - 1)].add(rows)

    return {"scatter_add": scatter_add}
