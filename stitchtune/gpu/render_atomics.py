"""Global float32 atomic adds rendered as PTX reductions (``red``), never as a returning ``atom``.

An IR :class:`~stitchtune.ir.kir.AtomicAdd` has no result. CUDA's ``atomicAdd`` is PTX ``atom``, which
ptxas turns into the fire-and-forget ``REDG`` only when nothing after it waits for memory: ahead of a
``__threadfence()`` (every software grid barrier, ``st_grid_sync``) it stays a returning ``ATOMG ... PT, RZ``
(read on sm_90 with nvcc 13 and ``cuobjdump -sass``: Llama's training ``region_view_102``, 8 ``ATOMG.E.ADD.F32x4``;
the same kernel without the barrier, GPT-2's ``region_view_82``, 6 ``REDG.E.ADD.F32x4``). A returning atomic
brings every old value back from the L2 to the SM (16 bytes per lane for a ``float4``) that nothing reads. The
PTX reduction ``red.relaxed.gpu.global.add`` has the semantics of ``atomicAdd`` without the result (relaxed,
device scope: the order a following fence gives is the same) and is ``REDG`` with or without a later fence.

Contract
--------
* :func:`renders_red(dtype)`: whether an atomic add into a parameter of ``dtype`` renders as ``red`` (float32,
  outside :func:`returning_adds`). :func:`needs_red(kernels)`: whether any of ``kernels`` adds atomically so;
  :data:`RED_PREAMBLE` (the ``st_red`` helpers) goes into the source only then, so every other program renders
  byte for byte as before.
* :func:`red_call(ptr, values)`: the statement adding ``values`` (1, 2 or 4 float expressions) at ``ptr`` (a
  ``float*`` expression): ``st_red(ptr, v0[, v1, v2, v3]);``. The 2- and 4-wide PTX forms (``red...v2/v4.f32``) exist
  from sm_90, where the lowering emits vector atomics at all (``Device.atomic_vector_width``), the scalar one from
  sm_70; every form is declared in every compilation pass (a whole-program ``nvcc -c`` build's host pass has no
  ``__CUDA_ARCH__``) and is ``atomicAdd`` one float at a time where its PTX form is missing. 16-bit tables and
  shared-memory copies keep ``atomicAdd`` (not handled here).
* :func:`returning_adds()`: a context within which float32 atomic adds render as ``atomicAdd`` again (and
  :func:`needs_red` says False): the other arm of a GPU A/B only (``scripts/gpu_experiment_cases.py``,
  ``llama-view_102/atom``); :func:`reductions_on` says which rendering is in force.
"""

from __future__ import annotations

import contextlib
from typing import Iterator, Sequence

from stitchtune.ir import kir

_RETURNING = False

RED_PREAMBLE = r"""
// Atomic adds without a result: PTX reductions (REDG), also ahead of a fence (atomicAdd would be a returning ATOMG).
// Every form is declared in every compilation pass (a host pass of nvcc -c sees them too); where the PTX form is
// missing (no __CUDA_ARCH__, or below sm_90 for the vector forms) it is atomicAdd, one float at a time.
__device__ __forceinline__ void st_red(float* p, float a) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 700
  asm volatile("red.relaxed.gpu.global.add.f32 [%0], %1;" :: "l"(__cvta_generic_to_global(p)), "f"(a) : "memory");
#else
  atomicAdd(p, a);
#endif
}
__device__ __forceinline__ void st_red(float* p, float a, float b) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("red.relaxed.gpu.global.add.v2.f32 [%0], {%1, %2};"
               :: "l"(__cvta_generic_to_global(p)), "f"(a), "f"(b) : "memory");
#else
  st_red(p, a); st_red(p + 1, b);
#endif
}
__device__ __forceinline__ void st_red(float* p, float a, float b, float c, float d) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("red.relaxed.gpu.global.add.v4.f32 [%0], {%1, %2, %3, %4};"
               :: "l"(__cvta_generic_to_global(p)), "f"(a), "f"(b), "f"(c), "f"(d) : "memory");
#else
  st_red(p, a); st_red(p + 1, b); st_red(p + 2, c); st_red(p + 3, d);
#endif
}
"""


@contextlib.contextmanager
def returning_adds() -> Iterator[None]:
    """Within: float32 atomic adds rendered as CUDA's ``atomicAdd`` (module docstring; not thread-safe)."""
    global _RETURNING
    old, _RETURNING = _RETURNING, True
    try:
        yield
    finally:
        _RETURNING = old


def reductions_on() -> bool:
    """Whether float32 atomic adds render as PTX reductions (outside :func:`returning_adds`)."""
    return not _RETURNING


def renders_red(dtype: str | None) -> bool:
    """Whether an atomic add into a kernel parameter of ``dtype`` (None: not a parameter, e.g. shared memory)
    renders as a PTX reduction: float32, outside :func:`returning_adds`. The one rule of both the renderer and
    :func:`needs_red`."""
    return dtype == "float32" and reductions_on()


def needs_red(kernels: Sequence[kir.Kernel]) -> bool:
    """Whether any kernel adds atomically into a parameter that :func:`renders_red` (so needs :data:`RED_PREAMBLE`)."""
    for k in kernels:
        dtypes = {p.name: p.dtype for p in k.params}
        if any(isinstance(s, kir.AtomicAdd) and renders_red(dtypes.get(s.buf)) for s in kir.walk(k.body)):
            return True
    return False


def red_call(ptr: str, values: Sequence[str]) -> str:
    """``st_red(ptr, values...);`` for 1, 2 or 4 float32 values (module docstring)."""
    if len(values) not in (1, 2, 4):
        raise ValueError(f"a reduction adds 1, 2 or 4 floats, not {len(values)}")
    return f"st_red({ptr}, {', '.join(values)});"
