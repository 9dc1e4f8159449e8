"""Training dropout's random numbers drawn inside regions (for the torch.compile backend).

An ATen graph draws dropout's numbers with ``aten.rand(size)``: no seed that a kernel could hash, so a
region could only read them as a float tensor that another kernel made (Inductor's kernel drawing and
comparing them, one per dropout). Here each such ``rand`` becomes ``stitchtune::rand(seed, stream,
size)``: float32 numbers in ``[0, 1)`` that the region computes itself with graph.json's ``uniform`` (a
counter-based hash of the seed and each element's flat index), from one int64 seed per graph call.

* :func:`uniform_torch(seed, counter)`: :func:`stitchtune.graph.ops.uniform` on int64 torch tensors,
  bit for bit (the custom op's eager form; the framework peers of ``stitchtune bench``).
* ``stitchtune::rand(Tensor seed, int stream, int[] size) -> Tensor``: ``uniform(seed[0] + stream *``
  :data:`STREAM_STEP` ``, flat index)`` at ``size`` (eager, fake and the importer's mapping agree).
* :func:`seed_rands(gm)`: a copy of ``gm`` in which the ``k``-th float32 ``aten.rand`` of static size is
  ``stitchtune::rand(seeds[2k:2k + 1], 0, size)``, ``seeds = prims.inductor_seeds(2n)`` (Inductor's own
  seeds, a ``randint`` drawn once per call: fresh masks every step; one seed per draw, every other
  one so that each draw's seed is 16-byte aligned); None when ``gm`` has none.
* :func:`unseed_rands(gm)`: ``gm`` (in place) with every ``stitchtune::rand`` that no region took as
  Inductor's own draw of it (``prims.inductor_random`` of ``inductor_lookup_seed(seeds, 2k)``, what its
  random pass makes of ``aten.rand``: drawn in the kernel that compares the numbers, from the same
  seeds, no second seed kernel).

The numbers differ from eager PyTorch's (as Inductor's do); a step draws each mask once and the
backward reads the saved mask, so gradients agree with the forward's mask.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import torch
import torch._inductor.inductor_prims  # noqa: F401  (registers prims.inductor_seeds, the seed's op)

from stitchtune.importers.torch_aten import RAND_STREAM_STEP as STREAM_STEP
from stitchtune.importers.torch_fx_util import graph_copy

__all__ = ["STREAM_STEP", "seed_rands", "uniform_torch", "unseed_rands"]

_M32 = 0xFFFFFFFF
#: seeds apart in Inductor's seed tensor: each draw's ``seeds[i:i + 1]`` starts 16-byte aligned, so a
#: region's launch takes it as it is (a misaligned input would be copied first)
_SEED_STRIDE = 2


def uniform_torch(seed: torch.Tensor, counter: torch.Tensor) -> torch.Tensor:
    """:func:`stitchtune.graph.ops.uniform` of int tensors (broadcast), float32, the same bits."""
    s = seed.to(torch.int64)
    i = counter.to(torch.int64) & _M32
    lo, hi = s & _M32, (s >> 32) & _M32
    h = (i * 0x9E3779B1 + lo) & _M32          # int64 products wrap; the low 32 bits are exact
    h = h ^ (h >> 16)
    h = (h * 0x85EBCA6B) & _M32
    h = h ^ hi
    h = h ^ (h >> 13)
    h = (h * 0xC2B2AE35) & _M32
    h = h ^ (h >> 16)
    return (h >> 8).to(torch.float32) * 2.0**-24


_lib = torch.library.Library("stitchtune", "FRAGMENT")
_lib.define("rand(Tensor seed, int stream, int[] size) -> Tensor")


def _rand(seed: torch.Tensor, stream: int, size: Sequence[int]) -> torch.Tensor:
    idx = torch.arange(math.prod(size), device=seed.device, dtype=torch.int64)
    return uniform_torch(seed.reshape(()) + stream * STREAM_STEP, idx).reshape(list(size))


def _rand_fake(seed: torch.Tensor, stream: int, size: Sequence[int]) -> torch.Tensor:
    return seed.new_empty(list(size), dtype=torch.float32)


_lib.impl("rand", _rand, "CompositeExplicitAutograd")
torch.library.register_fake("stitchtune::rand", _rand_fake, lib=_lib)


def _drawable(n: Any) -> bool:
    """A float32 ``aten.rand`` of static size on the default generator (what a region can draw)."""
    if n.op != "call_function" or n.target is not torch.ops.aten.rand.default:
        return False
    val = n.meta.get("val")
    return (isinstance(val, torch.Tensor) and val.dtype == torch.float32
            and all(isinstance(d, int) for d in val.shape) and math.prod(val.shape) < 2**31)


def seed_rands(gm: Any) -> Any | None:
    """A copy of ``gm`` whose drawable ``aten.rand`` nodes are ``stitchtune::rand`` (see module
    docstring), or None when it has none. ``gm`` itself is left as it was."""
    if not any(_drawable(n) for n in gm.graph.nodes):
        return None
    graph = graph_copy(gm)
    rands: list[Any] = [n for n in graph.nodes if _drawable(n)]
    first = rands[0]
    n = _SEED_STRIDE * len(rands)
    with graph.inserting_before(first):
        seeds = graph.call_function(torch.ops.prims.inductor_seeds.default, (n, first.meta["val"].device))
    seeds.meta["val"] = first.meta["val"].new_empty((n,), dtype=torch.int64)
    for k, r in enumerate(rands):
        i = _SEED_STRIDE * k
        with graph.inserting_before(r):
            seed = graph.call_function(torch.ops.aten.slice.Tensor, (seeds, 0, i, i + 1))
            drawn = graph.call_function(torch.ops.stitchtune.rand.default, (seed, 0, list(r.meta["val"].shape)))
        seed.meta["val"] = seeds.meta["val"][i:i + 1]
        drawn.meta = dict(r.meta)
        r.replace_all_uses_with(drawn)
        graph.erase_node(r)
    return torch.fx.GraphModule(gm, graph)


def unseed_rands(gm: Any) -> Any:
    """``gm`` with its ``stitchtune::rand`` nodes (those no region took) back to ``aten.rand``, and an
    unread seed removed (in place; returns ``gm``)."""
    graph = gm.graph
    changed = False
    n: Any
    for n in list(graph.nodes):
        if n.op == "call_function" and n.target is torch.ops.stitchtune.rand.default:
            val = n.meta["val"]
            seed: Any = n.args[0]
            seeds, k = seed.args[0], seed.args[2]
            with graph.inserting_before(n):
                one = graph.call_function(torch.ops.prims.inductor_lookup_seed.default, (seeds, k))
                r = graph.call_function(torch.ops.prims.inductor_random.default, (list(val.shape), one, "rand"))
            one.meta["val"] = seed.meta["val"].reshape(())
            r.meta = dict(n.meta)
            n.replace_all_uses_with(r)
            graph.erase_node(n)
            if not seed.users:
                graph.erase_node(seed)
            changed = True
    if changed:
        graph.lint()
        gm.recompile()
    return gm
