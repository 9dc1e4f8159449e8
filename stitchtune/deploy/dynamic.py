"""Compiled buckets of a dynamic graph: one program per bucket that runs for every extent in it.

Interface (shared with the torch backend, ``deploy/torch_*``)
-------------------------------------------------------------
``compile_dynamic(dgraph, key, db=DEFAULT_DB, device=None, *, schedule=None, build=None)
-> DynamicCompiled | DynamicRefusal``

* ``dgraph``: a :class:`~stitchtune.graph.dynamic.DynamicGraph`; ``key``: a
  :class:`~stitchtune.graph.dynamic.BucketKey` of it (``dgraph.key_of(extents)``).
* The program is planned at the bucket's largest extents (``key.largest()``) and lowered with every
  dynamic extent as an ``int`` kernel argument (after the pointers): row guards, the grid (computed at
  launch from the extents) and index maps that need an extent read the argument. One compile (one
  nvcc build) serves every extent of the bucket.
* The schedule is the database's best record for (structure, device, versions, bucket label), else
  the heuristic at the largest extents (``schedule=`` overrides it).
* A graph or schedule the generic kernel cannot serve gives a
  :class:`~stitchtune.graph.dynamic.DynamicRefusal` (data, never an exception): the caller compiles
  per extent with :func:`stitchtune.deploy.compiled.compile` instead.

``DynamicCompiled`` (immutable):
* ``key``, ``dgraph``, ``schedule``, ``program`` (the kir program, buffers sized for the largest extents);
* ``emulate(extents, **arrays) -> dict[str, ndarray]``: the numpy SIMT emulator with buffers of the
  *actual* extents (every access checked against them);
* ``__call__(extents, **arrays)``: the GPU (cuda-python) launch path, the grid computed from ``extents``;
* ``covers(extents) -> bool``: whether ``extents`` lie in ``key`` (calls outside raise GraphError).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol

import numpy as np

from stitchtune.graph.dynamic import BucketKey, DynamicGraph


class DynamicCompiled(Protocol):
    """One compiled bucket (module docstring)."""

    key: BucketKey
    dgraph: DynamicGraph
    schedule: Any
    program: Any

    def covers(self, extents: Mapping[str, int]) -> bool: ...
    def emulate(self, extents: Mapping[str, int], **arrays: np.ndarray) -> dict[str, np.ndarray]: ...
    def __call__(self, extents: Mapping[str, int], **arrays: Any) -> dict[str, np.ndarray]: ...
