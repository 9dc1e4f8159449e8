"""Theoretical occupancy with the CUDA occupancy calculator's allocation rules.

The rules follow ``cudaOccMaxActiveBlocksPerMultiprocessor`` in ``cuda_occupancy.h`` (CUDA 13.0,
``/usr/local/cuda/include/cuda_occupancy.h``) and the CUDA C++ Programming Guide's occupancy
calculator section, for the default shared-memory carveout (the whole ``smem_per_sm`` available)
and partitioned global caching off (cc >= 7.0 has none):

* warps per block = ceil(threads / warp_size)                                 (warp granularity)
* warp limit      = (max_threads_per_sm / warp_size) // warps per block;  0 if threads > max per block
* block limit     = max_blocks_per_sm
* registers       = regs_per_thread x warp_size rounded up to ``reg_alloc_unit`` (256) per warp; the
  register file is split in ``register_subpartitions`` (4) parts, so the SM holds
  4 x floor((regs_per_sm / 4) / regs per warp) warps; register limit = that // warps per block.
  A block can never run (limit 0) when regs per thread > max_regs_per_thread, or when
  regs per warp x warps per block (also that rounded up to a multiple of 4 warps, the hardware check)
  exceeds max_regs_per_block.
* shared memory   = round_up(smem + smem_reserved_per_block, smem_alloc_unit) per block; limit 0 when
  that exceeds the per-block limit (default 48 KiB, or the opt-in limit when more is requested) plus
  the reservation; else smem_per_sm // allocated per block.
* blocks per SM   = min of the four limits; occupancy = blocks x warps per block / max warps per SM.

Hopper's named-barrier limit (64 per SM at one barrier per block) never binds below 32 blocks per SM,
so it is not modelled.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from stitchtune.hardware.device import Device

LIMITERS = ("warps", "blocks", "registers", "shared_memory", "threads_per_block")


@dataclass(frozen=True)
class Occupancy:
    """Theoretical occupancy of one kernel launch shape on one SM.

    ``limiter`` names the resource that sets ``blocks_per_sm``; on ties the first of
    warps, blocks, registers, shared_memory wins (a resource is reported only when it is strictly
    more restrictive than the fixed warp and block slots). ``threads_per_block`` means the block is
    larger than the device allows.
    """

    blocks_per_sm: int
    active_warps: int
    occupancy: float
    limiter: str


def _round_up(x: int, unit: int) -> int:
    return -(-x // unit) * unit


def register_limit(device: Device, warps_per_block: int, registers_per_thread: int) -> int:
    """Blocks per SM allowed by the register file (cuda_occupancy.h ``cudaOccMaxBlocksPerSMRegsLimit``)."""
    if registers_per_thread > device.max_regs_per_thread:
        return 0
    regs_per_warp = _round_up(max(registers_per_thread, 0) * device.warp_size, device.reg_alloc_unit)
    if regs_per_warp == 0:
        return 1 << 30
    parts = device.register_subpartitions
    per_block = regs_per_warp * warps_per_block
    assumed = regs_per_warp * _round_up(warps_per_block, parts)
    if per_block > device.max_regs_per_block or assumed > device.max_regs_per_block:
        return 0
    warps_per_part = (device.regs_per_sm // parts) // regs_per_warp
    return (warps_per_part * parts) // warps_per_block


def smem_allocated_per_block(device: Device, smem_per_block: int) -> int:
    """Shared memory a block occupies: request + per-block reservation, rounded to the allocation unit."""
    return _round_up(max(smem_per_block, 0) + device.smem_reserved_per_block, device.smem_alloc_unit)


def smem_limit(device: Device, smem_per_block: int) -> int:
    """Blocks per SM allowed by shared memory (``cudaOccMaxBlocksPerSMSmemLimit``, default carveout)."""
    allocated = smem_allocated_per_block(device, smem_per_block)
    per_block_limit = (device.smem_per_block_optin if smem_per_block > device.smem_per_block_default
                       else device.smem_per_block_default) + device.smem_reserved_per_block
    if allocated > per_block_limit:
        return 0
    if allocated == 0:
        return 1 << 30
    return device.smem_per_sm // allocated


def occupancy(device: Device, threads_per_block: int, registers_per_thread: int,
              smem_per_block: int) -> Occupancy:
    """Theoretical occupancy (see the module docstring for the rules). Never raises for legal ints;
    a block that can never run gives ``blocks_per_sm == 0`` and names the reason in ``limiter``."""
    if threads_per_block <= 0:
        raise ValueError(f"threads_per_block must be positive, got {threads_per_block}")
    if threads_per_block > device.max_threads_per_block:
        return Occupancy(0, 0, 0.0, "threads_per_block")
    warps_per_block = -(-threads_per_block // device.warp_size)
    limits = {
        "warps": device.max_warps_per_sm // warps_per_block,
        "blocks": device.max_blocks_per_sm,
        "registers": register_limit(device, warps_per_block, registers_per_thread),
        "shared_memory": smem_limit(device, smem_per_block),
    }
    blocks = min(limits.values())
    limiter = next(name for name in LIMITERS if limits.get(name) == blocks)
    warps = blocks * warps_per_block
    return Occupancy(blocks, warps, warps / device.max_warps_per_sm, limiter)


def max_resident_blocks(device: Device, threads_per_block: int, registers_per_thread: int,
                        smem_per_block: int) -> int:
    """Blocks that can be co-resident on the whole device (the grid-barrier bound)."""
    occ = occupancy(device, threads_per_block, registers_per_thread, smem_per_block)
    return occ.blocks_per_sm * device.sm_count


def max_active_clusters(device: Device, threads_per_block: int, registers_per_thread: int,
                        smem_per_block: int, cluster: int) -> int:
    """Clusters of ``cluster`` blocks that can be resident on the device at once, by the rules of
    ``cudaOccupancyMaxActiveClusters`` as the CUDA C++ Programming Guide states them: all blocks of a
    cluster are co-scheduled on one GPC, so a GPC of ``g`` SMs holds ``(g * blocks_per_sm) // cluster``
    clusters (blocks of one cluster may share an SM), summed over the GPCs of ``device.gpc_sms``.
    0 when the device has no clusters, when ``cluster`` exceeds the non-portable limit, or when one
    cluster does not fit on a GPC. ``cluster == 1`` is every resident block. The per-GPC SM counts of
    the presets are a guess (:mod:`stitchtune.hardware.device`, [CLU])."""
    blocks = occupancy(device, threads_per_block, registers_per_thread, smem_per_block).blocks_per_sm
    return clusters_resident(device, blocks, cluster)


def clusters_resident(device: Device, blocks_per_sm: int, cluster: int) -> int:
    """:func:`max_active_clusters` for a kernel of ``blocks_per_sm`` blocks per SM."""
    if cluster <= 1:
        return blocks_per_sm * device.sm_count
    if not device.supports_clusters or cluster > device.max_cluster_size_nonportable:
        return 0
    return sum((g * blocks_per_sm) // cluster for g in device.gpc_sms)



def launch_refusal(device: Device, block: int, registers_per_thread: int, smem_per_block: int, grid: int,
                   grid_barrier: bool = False, cluster: int = 1) -> tuple[Occupancy, str | None]:
    """Occupancy of one launch shape and why the device refuses it for resources (None when it can
    run): a block outside ``1..max_threads_per_block``, shared memory over the opt-in limit, zero
    occupancy (registers, shared memory, warps), an empty grid, a cluster the device cannot launch or
    hold on one GPC (or a grid that is not a multiple of it), and a grid with a grid barrier
    (``grid_barrier``) larger than the blocks (whole clusters) that can be co-resident.

    The one statement of these rules: the cost model's legality (``cost.model.kernel_legality``) and
    the space's resource check (``lower.resources``) both call it. The reason is a sentence without
    the kernel's name (callers prefix it)."""
    if block > device.max_threads_per_block or block <= 0:
        return (Occupancy(0, 0, 0.0, "threads_per_block"),
                f"block of {block} threads outside 1..{device.max_threads_per_block}")
    occ = occupancy(device, block, registers_per_thread, smem_per_block)
    if smem_per_block > device.smem_per_block_optin:
        return occ, (f"{smem_per_block} B shared memory per block exceeds the "
                     f"{device.smem_per_block_optin} B opt-in limit of {device.name}")
    if occ.blocks_per_sm == 0:
        return occ, (f"zero occupancy ({occ.limiter}: {block} threads, "
                     f"{registers_per_thread} registers/thread, {smem_per_block} B shared memory)")
    if grid <= 0:
        return occ, f"empty grid ({grid} blocks)"
    resident = occ.blocks_per_sm * device.sm_count
    if cluster > 1:
        if cluster > device.max_cluster_size:
            return occ, (f"cluster of {cluster} blocks, {device.name} launches at most "
                         f"{device.max_cluster_size} (portable size)")
        if grid % cluster:
            return occ, f"grid {grid} is not a multiple of its cluster of {cluster} blocks"
        clusters = clusters_resident(device, occ.blocks_per_sm, cluster)
        if clusters < 1:
            return occ, (f"a cluster of {cluster} blocks ({block} threads, {registers_per_thread} registers/thread, "
                         f"{smem_per_block} B shared memory each) cannot be resident on one GPC")
        resident = min(resident, cluster * clusters)
    if grid_barrier and grid > resident:
        return occ, (f"grid barrier needs all {grid} blocks co-resident, but only "
                     f"{resident} fit ({device.sm_count} SMs x {occ.blocks_per_sm} blocks/SM, "
                     f"limited by {occ.limiter})")
    return occ, None

# ---------------------------------------------------------------------------- check against a GPU driver
_CHECK_KERNEL = r"""
extern "C" __global__ void k(float* out, int n) {
  extern __shared__ float s[];
  float v[NACC];                      // NACC values live across the barrier: registers ~ NACC
  #pragma unroll
  for (int i = 0; i < NACC; ++i) v[i] = out[(threadIdx.x + i * 977) % n];
  s[threadIdx.x] = v[0]; __syncthreads();
  float acc = 0.f;
  #pragma unroll
  for (int i = 0; i < NACC; ++i) acc += v[i] * s[(threadIdx.x + i) % blockDim.x];
  out[blockIdx.x * blockDim.x + threadIdx.x] = acc;
}
"""
#: the check kernels' NACC (named ``k<NACC>``); sm_90: 14, 40, 72, 168, 255 registers
_CHECK_NACC = (1, 24, 56, 120, 200)


def _check_kernel(cuda: Any, ck: Callable[[int, str], None], mod: Any, name: str,
                  device: Device) -> tuple[int, list[dict[str, int]]]:
    """:func:`driver_check` for kernel ``name`` of the loaded module ``mod`` (``cuda``: libcuda; ``ck``
    raises on a failed call): its registers as the driver reports them, compared with :func:`occupancy`
    over the block sizes and shared-memory sizes up to the opt-in limit. Returns (configurations
    compared, mismatches as dicts)."""
    import ctypes

    fn, regs = ctypes.c_void_p(), ctypes.c_int()
    ck(cuda.cuModuleGetFunction(ctypes.byref(fn), mod, name.encode()), "cuModuleGetFunction")
    ck(cuda.cuFuncGetAttribute(ctypes.byref(regs), 4, fn), "cuFuncGetAttribute(NUM_REGS)")
    # CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES (8): allow up to the opt-in limit
    ck(cuda.cuFuncSetAttribute(fn, 8, ctypes.c_int(device.smem_per_block_optin)), "cuFuncSetAttribute")
    total, bad = 0, []
    for threads in (32, 96, 128, 256, 512, 768, 1024):
        for smem in (0, 4096, 40000, 65536, 100000, device.smem_per_block_optin):
            if smem > device.smem_per_block_optin:
                continue
            n = ctypes.c_int()
            ck(cuda.cuOccupancyMaxActiveBlocksPerMultiprocessor(
                ctypes.byref(n), fn, ctypes.c_int(threads), ctypes.c_size_t(smem)),
               "cuOccupancyMaxActiveBlocksPerMultiprocessor")
            ours = occupancy(device, threads, regs.value, smem).blocks_per_sm
            total += 1
            if ours != n.value:
                bad.append(dict(threads=threads, registers=regs.value, smem=smem, driver=n.value, ours=ours))
    return total, bad


def driver_check(device: Device, ordinal: int = 0, nvcc: str = "nvcc") -> tuple[int, list[dict[str, int]]]:
    """Compare :func:`occupancy` with the driver's ``cuOccupancyMaxActiveBlocksPerMultiprocessor`` on
    GPU ``ordinal`` for kernels of ~14..255 registers (compiled with nvcc for ``device.arch``), several
    block sizes and dynamic shared-memory sizes up to the opt-in limit.

    ``nvcc``: the compiler to run (callers pass :func:`stitchtune.gpu.build.find_nvcc`'s answer; this
    module sits below the GPU layer). Returns (configurations compared, mismatches as dicts). Needs
    libcuda and nvcc; raises
    :class:`~stitchtune.errors.ToolchainError` when either is missing or a driver call fails.
    """
    import ctypes
    import os
    import subprocess
    import tempfile

    from stitchtune.errors import ToolchainError

    try:
        cuda = ctypes.CDLL("libcuda.so.1")
    except OSError as exc:
        raise ToolchainError(f"no CUDA driver library: {exc}") from exc

    def ck(rc: int, what: str) -> None:
        if rc != 0:
            raise ToolchainError(f"CUDA driver call {what} failed with error {rc}")

    ck(cuda.cuInit(0), "cuInit")
    dev = ctypes.c_int()
    ck(cuda.cuDeviceGet(ctypes.byref(dev), ordinal), "cuDeviceGet")
    ctx = ctypes.c_void_p()
    ck(cuda.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev), "cuDevicePrimaryCtxRetain")
    ck(cuda.cuCtxPushCurrent_v2(ctx), "cuCtxPushCurrent")
    total, bad = 0, []
    try:
        with tempfile.TemporaryDirectory() as tmp:
            # the five kernels in one source, one nvcc call and one module: each nvcc process spends
            # most of a CPU-second on the CUDA headers before its first kernel
            src, cubin = os.path.join(tmp, "check.cu"), os.path.join(tmp, "check.cubin")
            with open(src, "w") as f:
                f.write("".join(_CHECK_KERNEL.replace("NACC", str(nacc)).replace("void k(", f"void k{nacc}(")
                                for nacc in _CHECK_NACC))
            try:
                subprocess.run([nvcc, "-cubin", f"-arch={device.arch}", src, "-o", cubin], check=True,
                               capture_output=True, timeout=300)
            except (OSError, subprocess.SubprocessError) as exc:
                raise ToolchainError(f"nvcc failed on the occupancy check kernels: {exc}") from exc
            mod = ctypes.c_void_p()
            ck(cuda.cuModuleLoad(ctypes.byref(mod), cubin.encode()), "cuModuleLoad")
            try:
                for nacc in _CHECK_NACC:
                    n_compared, mismatches = _check_kernel(cuda, ck, mod, f"k{nacc}", device)
                    total += n_compared
                    bad += mismatches
            except BaseException:
                cuda.cuModuleUnload(mod)
                raise
            ck(cuda.cuModuleUnload(mod), "cuModuleUnload")
    finally:  # leave the thread's context and the primary context's reference count as they were
        cuda.cuCtxPopCurrent_v2(ctypes.byref(ctypes.c_void_p()))
        cuda.cuDevicePrimaryCtxRelease_v2(dev)
    return total, bad
