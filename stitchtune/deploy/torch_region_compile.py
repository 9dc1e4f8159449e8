"""Compiling one region's graph for the torch backend: the device the backend's options name
(:func:`device_for`), the region graph's :class:`~stitchtune.deploy.compiled.CompiledGraph` with one
schedule selection (:func:`compile_region_graph`), the cubins of many regions built in one nvcc batch
(:func:`attach_cubins`), the float atomics of a program (:func:`program_atomics`) and the outputs a
region's kernel returns (:func:`kept_outputs`). Shared by the static regions
(:mod:`stitchtune.deploy.torch_backend`) and the symbolic-shape ones (:mod:`stitchtune.deploy.torch_dynamic`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from stitchtune.deploy.backend_options import BackendOptions
from stitchtune.errors import StitchtuneError


def device_for(opts: BackendOptions) -> Any:
    """The Device schedules are chosen for: ``opts.device`` (a Device or preset name), else the local GPU
    (the H200 preset without one)."""
    from stitchtune.hardware.device import get_device

    if opts.device is None:
        from stitchtune.gpu.device_query import default_device

        return default_device()
    return get_device(opts.device) if isinstance(opts.device, str) else opts.device


def attach_cubins(kernels: Sequence[Any], arch: str, opts: BackendOptions) -> dict[int, str]:
    """Build the cubins of the static ``kernels`` in one parallel nvcc batch (the builder's cache)
    and attach them; {index: why} for those that failed (every one when nvcc is missing)."""
    from dataclasses import replace
    from pathlib import Path

    from stitchtune.deploy.torch_ops import RegionKernel
    from stitchtune.gpu.build import BuildStatus, NvccBuilder

    todo = [i for i, k in enumerate(kernels) if isinstance(k, RegionKernel) and k.compiled.cubin is None]
    if not todo:
        return {}
    try:
        results = NvccBuilder().build([kernels[i].compiled.sources for i in todo], arch)
    except Exception as exc:  # noqa: BLE001 - no toolchain: these regions stay with Inductor
        opts.reraise(exc)
        return {i: f"cannot build kernels: {type(exc).__name__}: {exc}" for i in todo}
    failed = {}
    for i, res in zip(todo, results):
        if res.status == BuildStatus.OK and res.cubin_path:
            kernels[i].compiled = replace(kernels[i].compiled, cubin=Path(res.cubin_path).read_bytes())
        else:
            failed[i] = f"nvcc failed ({res.status}): {(res.error or '')[:300]}"
    return failed


def program_atomics(program: Any) -> int:
    """Float atomic adds the kernels of ``program`` issue (from their profiles; 0: bitwise reproducible)."""
    return sum(k.atomics for k in program.profile.kernels)


def compile_region_graph(graph: Any, opts: BackendOptions, device: Any, counter: Any = None) -> Any:
    """The CompiledGraph of ``graph`` (no cubin: the backend builds them in one batch, a
    per-shape kernel at its first launch); one schedule selection, counted by ``counter``."""
    from stitchtune.deploy.compiled import compile as compile_graph

    cg = compile_graph(graph, db=opts.db, device=device, build=False, deterministic=opts.deterministic)
    if counter is not None:
        counter.add(selections=1)
    if opts.deterministic and program_atomics(cg.program):   # selection should prevent it
        raise StitchtuneError("its program uses float atomics (deterministic=True)")
    return cg


def kept_outputs(region: Any) -> tuple[int, ...] | None:
    """Which outputs of ``region.module`` the kernel returns (None: all): the module also returns the
    no-ops that the region's ``aliases`` stand for (its outputs are its nodes read outside it, in
    graph order)."""
    if not region.aliases:
        return None
    read = set(region.outputs) | {a for a, _ in region.aliases}
    every = [n for n in region.nodes if n in read]
    return tuple(every.index(o) for o in region.outputs)
