"""The graph-wide rewrites of an ATen graph before the region finder reads it: one list that the torch
backend and the model capture (tuning, the audit) both apply, so that both cut the same regions.

Contract: :func:`prepared(gm, kind, keep_addmm)` returns ``gm`` itself when no rewrite applies, else a copy (``gm``
is never edited, except the forward graph's saved-outputs mark, which only an AOTAutograd forward
compiler sets: :func:`~stitchtune.importers.torch_saved.mark_saved_outputs`). In order: dropout's draws
seeded in the regions that read them (``seed_rands``), a split's parts as slices, a linear layer's bias
added by the region that reads its product (``unfused_bias_adds``), a transposed matmul operand read as
a view (``matmul_views``), SymInt values and SymInt sizes as tensors a region call makes.
:func:`prepared_regions(gm, kind)` is that graph and its regions
(:func:`~stitchtune.importers.torch_regions.find_regions`), with the ``addmm`` of every bias add that would
be a region of its own kept fused (found again without those; see :mod:`stitchtune.importers.torch_bias`).
"""

from __future__ import annotations

from collections.abc import Collection
from typing import Any


def prepared_regions(gm: Any, kind: str) -> tuple[Any, Any]:
    """(the prepared graph, its :class:`~stitchtune.importers.torch_regions.RegionSplit`): see the module
    docstring. Errors of the region finder propagate."""
    from stitchtune.importers.torch_bias import lonely_bias_adds
    from stitchtune.importers.torch_regions import find_regions

    work = prepared(gm, kind)
    split = find_regions(work)
    lonely = lonely_bias_adds(work, split.regions)
    if lonely:
        work = prepared(gm, kind, keep_addmm=lonely)
        split = find_regions(work)
    return work, split


def prepared(gm: Any, kind: str, keep_addmm: Collection[str] = ()) -> Any:
    """``gm`` as the region finder reads it (module docstring); ``kind``: ``"forward"`` | ``"backward"``
    | ``"inference"``; ``keep_addmm``: names of ``addmm`` nodes whose bias stays in the library call."""
    from stitchtune.importers.torch_bias import unfused_bias_adds
    from stitchtune.importers.torch_fx_util import splits_as_slices
    from stitchtune.importers.torch_mm_views import matmul_views
    from stitchtune.importers.torch_random import seed_rands
    from stitchtune.importers.torch_saved import mark_saved_outputs
    from stitchtune.importers.torch_symsizes import sym_sizes
    from stitchtune.importers.torch_symvalues import sym_values

    if kind == "forward":   # a training step's forward: which outputs only the backward reads
        mark_saved_outputs(gm)
    seeded = seed_rands(gm)   # dropout's rand drawn by the regions that read it (one seed per call)
    work = gm if seeded is None else seeded
    work = splits_as_slices(work) or work   # a split's parts as slices: their readers may share a region
    work = unfused_bias_adds(work, keep_addmm) or work   # addmm -> mm + add: the bias added by the region reading the product
    work = matmul_views(work) or work   # a transposed matmul operand read as a view, not copied transposed
    work = sym_values(work) or work   # SymInt values (positions ``arange + past``) as tensors a region call makes
    return sym_sizes(work) or work    # SymInt sizes (``iota(S)``, a cache's ``full``) read from carriers it makes
