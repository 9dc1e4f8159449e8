"""The Python API: ``stitchtune.compile(graph_or_path, db=..., device=...) -> CompiledGraph``.

Contract
--------
* :func:`compile` loads/validates the graph, asks :func:`stitchtune.deploy.selection.choose_schedule` for the
  schedule (tuned record, nearest shape, or heuristic; ``schedule=`` overrides it and is checked by
  the space's rules), lowers it, renders the CUDA source and, when nvcc is found (``build=None``) or
  asked for (``build=True``), builds the cubin. A :class:`CompiledGraph` is immutable.
* :attr:`CompiledGraph.manifest` is plain JSON data: the graph, its workload key, the device, the
  versions, the schedule and where it came from (``choice.source`` in tuned|nearest-shape|heuristic|given,
  ``choice.reason``, the database record), the buffers (name, dtype, elements, bytes, role, graph
  tensor, ``zero_init``) and the kernels in launch order (grid, block, dynamic and static shared
  memory, ptxas registers when built, and the arguments in order with buffer, dtype and role).
* :meth:`CompiledGraph.write(dir)` writes ``kernels.cu``, ``kernels.cubin`` (when built) and
  ``manifest.json``; :meth:`CompiledGraph.load(dir)` reads them back, re-lowers the schedule and
  refuses (``StitchtuneError``) a directory whose source this stitchtune would not generate again
  (another code generator version): recompile then.
* ``cg(**arrays)`` runs the kernels on the GPU in this process through the one launch path,
  :mod:`stitchtune.gpu.launch` (cuda-python, the device's primary context, the legacy default
  stream; synchronised before it returns). In: numpy arrays (copied to device buffers allocated at
  the first call and reused), or device arrays exposing ``__cuda_array_interface__`` (torch, cupy;
  C-contiguous and 16-byte aligned, else refused with a StitchtuneError naming it (a view with a
  storage offset such as ``x[1:]`` is not: pass a copy); used in place; a bfloat16 input as its raw
  2-byte bits, e.g. a uint16 view). Out: numpy arrays shaped like the graph's outputs. Scratch and
  barrier buffers are allocated and initialised once, at the first call
  (:meth:`CompiledGraph.device_runner`); calls from several threads are serialised (one set of
  buffers); the driver's context is pushed for the call and popped after it (the thread's current
  context, torch's current device, is left as it was). A driver error is a
  :class:`~stitchtune.gpu.driver.DriverError` (a ToolchainError) naming the call and the error.
  ``cg.emulate(**arrays)`` runs the same program in the numpy SIMT emulator on the CPU (slow: use
  small shapes). Both check every input's name, shape and dtype first.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any, overload

from stitchtune.deploy.compiled_dynamic import compile_buckets, load_any
from stitchtune.deploy.compiled_graph import MANIFEST_FORMAT, CompiledGraph, build_manifest, compile_graph
from stitchtune.deploy.device_run import DeviceRun, build_cubin
from stitchtune.graph.dynamic import DynamicGraph
from stitchtune.tune.dbpath import DEFAULT_DB, DefaultDB, resolve_db

if TYPE_CHECKING:
    from collections.abc import Mapping

    from stitchtune.deploy.compiled_dynamic import DynamicCompiledGraph
    from stitchtune.graph.parse import Graph
    from stitchtune.hardware.device import Device
    from stitchtune.space import Schedule

__all__ = ["MANIFEST_FORMAT", "CompiledGraph", "DeviceRun", "build_cubin", "build_manifest", "compile"]


@overload
def compile(graph_or_path: Graph, db: str | os.PathLike[str] | None | DefaultDB = DEFAULT_DB, device: str | Device | None = None,
            *, schedule: Schedule | Mapping[str, Any] | None = None, build: bool | None = None,
            deterministic: bool = False) -> CompiledGraph: ...
@overload
def compile(graph_or_path: Any, db: str | os.PathLike[str] | None | DefaultDB = DEFAULT_DB, device: str | Device | None = None,
            *, schedule: Schedule | Mapping[str, Any] | None = None, build: bool | None = None,
            deterministic: bool = False) -> CompiledGraph | DynamicCompiledGraph: ...
def compile(graph_or_path: Any, db: str | os.PathLike[str] | None | DefaultDB = DEFAULT_DB, device: str | Device | None = None,
            *, schedule: Schedule | Mapping[str, Any] | None = None, build: bool | None = None,
            deterministic: bool = False) -> CompiledGraph | DynamicCompiledGraph:
    """Compile a graph (a :class:`~stitchtune.graph.parse.Graph`, a path to graph.json, or its dict) for
    ``device`` (a Device, a preset name, or None: the local GPU, else the H200 preset) with the schedule
    the tuning database ``db`` selects (see :mod:`stitchtune.deploy.selection`; default ``$STITCHTUNE_DB``,
    else ``./tuning-db``; None: no database, the heuristic), or ``schedule`` (a Schedule or its dict) when
    given. ``build``: True builds the cubin (ToolchainError without nvcc), False does not, None builds when
    nvcc is found. ``deterministic``: only a bitwise-reproducible schedule (no float atomics): the
    database's non-deterministic records are passed over, and a given one is refused; a graph with a
    ``scatter_add`` (float atomics whatever the schedule) is refused (:class:`UnsupportedGraphError`).

    Returns a :class:`CompiledGraph`; a graph with dynamic dims (a file or dict with a ``"dynamic"`` section,
    or a :class:`~stitchtune.graph.dynamic.DynamicGraph`) gives a
    :class:`~stitchtune.deploy.compiled_dynamic.DynamicCompiledGraph` instead: every bucket's generic
    kernels, called the same way (``cg(**arrays)``, ``cg.emulate(**arrays)``, ``cg.write(dir)``) with inputs
    of any extent in the declared range."""
    db = resolve_db(db)
    graph = load_any(graph_or_path)
    if isinstance(graph, DynamicGraph):   # dynamic dims: every bucket (deploy.compiled_dynamic)
        return compile_buckets(graph, db, device, schedule=schedule, build=build, deterministic=deterministic)
    return compile_graph(graph, db, device, schedule=schedule, build=build, deterministic=deterministic)
