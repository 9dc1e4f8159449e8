"""GPU device descriptions: presets from public specifications, and a Device from driver attributes.

Contract
--------
* :class:`Device` is a frozen, JSON-round-trippable description of one GPU model (``to_dict`` /
  ``from_dict``). Every hardware limit used by occupancy, the cost model, the heuristic and code
  generation comes from here, never from literals elsewhere.
* :func:`get_device` returns a preset by case-insensitive name ("h200", "H100", "NVIDIA A100-SXM4-80GB",
  a device key such as "NVIDIA H200/sm_90", ...) and raises :class:`DeviceError` (a
  :class:`~stitchtune.errors.StitchtuneError`) listing the presets for an unknown name.
* :func:`device_from_attributes` turns what the CUDA driver reports (``CU_DEVICE_ATTRIBUTE_*`` values
  named in :data:`DEVICE_ATTRIBUTES`, the name, the memory size) into a :class:`Device`; it is pure.
  Reading them from the GPU is :mod:`stitchtune.gpu.device_query` (``query_device`` /
  ``default_device``): this layer sits below the driver and never imports it.

Sources of the preset numbers (cited again next to each value):
  [CC]   CUDA C++ Programming Guide, "Compute Capabilities" -> "Technical Specifications per Compute
         Capability" (threads, blocks, warps, registers, shared memory per SM and per block) and
         "Features and Technical Specifications" (1 KB shared memory reserved per block on 8.x/9.x).
  [OCC]  /usr/local/cuda/include/cuda_occupancy.h (CUDA 13.0): register allocation granularity 256,
         shared-memory allocation granularity 256 (cc 7.x) / 128 (cc 8.x, 9.x), max blocks per SM.
  [H200] NVIDIA H200 Tensor Core GPU datasheet (H200 SXM: 141 GB HBM3e, 4.8 TB/s).
  [H100] NVIDIA H100 Tensor Core GPU Architecture whitepaper (H100 SXM5: 132 SMs, 50 MB L2,
         5120-bit HBM3) and H100 datasheet (SXM 80 GB: 3.35 TB/s).
  [A100] NVIDIA A100 Tensor Core GPU Architecture whitepaper (108 SMs, 40 MB L2, 5120-bit HBM2e,
         1410 MHz boost) and A100 80GB datasheet (SXM: 2,039 GB/s).
  [L4]   NVIDIA L4 datasheet (300 GB/s, 24 GB GDDR6) and Ada Lovelace architecture whitepaper
         (AD104 in L4: 58 SMs, 48 MB L2, 192-bit, 2040 MHz boost).
  [T4]   NVIDIA T4 datasheet (320 GB/s GDDR6, 40 SMs) and Turing architecture whitepaper (TU104:
         4 MB L2, 256-bit, 1590 MHz boost).
  [V100] NVIDIA Tesla V100 datasheet (SXM2: 900 GB/s) and Volta architecture whitepaper (GV100:
         80 SMs, 6 MB L2, 4096-bit HBM2, 1530 MHz boost).
  [CLU]  CUDA C++ Programming Guide, "Thread Block Clusters" and "Distributed Shared Memory" (cc 9.0:
         a portable cluster size of at most 8 blocks; H100 allows 16 with the non-portable opt-in
         cudaFuncAttributeNonPortableClusterSizeAllowed; a cluster's blocks are co-scheduled on one
         GPU processing cluster, GPC) and the Hopper whitepaper (full GH100: 8 GPCs x 9 TPCs x 2 SMs =
         144 SMs). How the 132 SMs of an H100/H200 SXM part are spread over its GPCs is not published:
         ``gpc_sms`` is a GUESS (8 GPCs, the SMs spread evenly: 4 x 17 + 4 x 16; measured
         cudaOccupancyMaxActiveClusters values on the first GPU run should replace it).
  [ATOM] CUDA C++ Programming Guide, "Atomic Functions" -> atomicAdd(): the float2 and float4 overloads
         (global memory only) are supported on devices of compute capability 9.x and higher.
  [BASE] /work/shared/baselines/README.md: measured on an H200 (2026-11-29): device-to-device copy
         4.12 TB/s; empty kernel launch timed with CUDA events 6.6 us; software grid barrier
         1.0 us (132x1024 blocks), 1.3 (264x512), 2.0 (528x256), 3.5 (1056x128).
"""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass
from collections.abc import Mapping
from typing import Any

from stitchtune.errors import StitchtuneError

log = logging.getLogger(__name__)

KiB = 1024
MiB = 1024 * 1024

# Software grid barrier cost on the H200 [BASE], least-squares line through the four measured points
# (grid, us) = (132, 1.0), (264, 1.3), (528, 2.0), (1056, 3.5):  us = 0.600 + 0.002727 * grid
# (residuals <= 0.04 us). Used for every preset until it is measured elsewhere (labelled "assumed").
GRID_BARRIER_BASE_US_H200 = 0.600
GRID_BARRIER_PER_BLOCK_US_H200 = 0.002727
# Empty-kernel launch timed with CUDA events on the H200 [BASE]; assumed for the other presets.
LAUNCH_OVERHEAD_US_H200 = 6.6


class DeviceError(StitchtuneError):
    """Unknown device name or an unusable device description."""


@dataclass(frozen=True)
class Device:
    """One GPU model's limits and speeds.

    Units: bytes, MHz, GB/s (1e9 bytes/s), microseconds. ``copy_bandwidth_gbs`` is a measured
    device-to-device copy bandwidth (bytes read + written per second) or ``None`` when unknown;
    ``dram_bandwidth_gbs`` is the datasheet figure.
    """

    name: str
    cc_major: int
    cc_minor: int
    sm_count: int
    max_threads_per_block: int
    max_threads_per_sm: int
    max_blocks_per_sm: int
    warp_size: int
    regs_per_sm: int
    max_regs_per_block: int
    max_regs_per_thread: int
    smem_per_sm: int
    smem_per_block_optin: int
    smem_per_block_default: int
    smem_alloc_unit: int
    smem_reserved_per_block: int
    l2_bytes: int
    dram_bandwidth_gbs: float
    copy_bandwidth_gbs: float | None
    clock_mhz: float
    mem_bus_bits: int
    launch_overhead_us: float
    grid_barrier_base_us: float
    grid_barrier_per_block_us: float
    fp32_lanes_per_sm: int
    sfu_lanes_per_sm: int
    reg_alloc_unit: int = 256
    reg_alloc_granularity: str = "warp"
    register_subpartitions: int = 4
    source: str = "preset"          # "preset" | "cuda" (QUERIED_SOURCE: read from the driver) | "file"
    memory_bytes: int | None = None  # global memory (datasheet GB = 1e9 B; queried: cuDeviceTotalMem); None: unknown
    #: thread-block clusters (cc >= 9.0, [CLU]): the largest portable cluster (1 = no clusters), the
    #: largest with the non-portable opt-in, and the SMs of each GPC (a cluster lives on one GPC;
    #: empty: clusters unsupported). Defaults: a device without clusters (old descriptions load as such).
    max_cluster_size: int = 1
    max_cluster_size_nonportable: int = 1
    gpc_sms: tuple[int, ...] = ()
    #: the widest float32 vector ``atomicAdd`` on global memory, in elements ([ATOM]: float2 / float4 on
    #: cc 9.x and higher, each element added atomically on its own); 1: scalar adds only (the default:
    #: old descriptions load as such)
    atomic_vector_width: int = 1

    # ---- derived -------------------------------------------------------------------------------
    @property
    def key(self) -> str:
        """Stable device key, e.g. ``"NVIDIA H200/sm_90"`` (the tuning database's device_key)."""
        return f"{self.name}/{self.arch}"

    @property
    def arch(self) -> str:
        """nvcc architecture string, e.g. ``"sm_90"``."""
        return f"sm_{self.cc_major}{self.cc_minor}"

    @property
    def compute_capability(self) -> tuple[int, int]:
        return (self.cc_major, self.cc_minor)

    @property
    def max_warps_per_sm(self) -> int:
        return self.max_threads_per_sm // self.warp_size

    @property
    def supports_clusters(self) -> bool:
        """Whether thread-block clusters of two or more blocks can be launched (cc >= 9.0 presets)."""
        return self.max_cluster_size > 1 and bool(self.gpc_sms)

    def grid_barrier_us(self, grid: int) -> float:
        """Cost of one software grid barrier for a co-resident grid of ``grid`` blocks (linear model)."""
        return self.grid_barrier_base_us + self.grid_barrier_per_block_us * max(int(grid), 1)

    def effective_copy_bandwidth_gbs(self, copy_efficiency: float = 4120.0 / 4800.0) -> float:
        """Measured copy bandwidth when known, else ``copy_efficiency`` x datasheet bandwidth.

        The default efficiency is the H200's measured/datasheet ratio (4120/4800 [BASE]).
        """
        if self.copy_bandwidth_gbs:
            return float(self.copy_bandwidth_gbs)
        return float(self.dram_bandwidth_gbs) * copy_efficiency

    # ---- persistence ---------------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["gpc_sms"] = list(self.gpc_sms)  # the JSON form (from_dict turns it back into a tuple)
        d["key"] = self.key
        d["arch"] = self.arch
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Device:
        """Inverse of :meth:`to_dict`; derived keys are ignored, unknown keys raise DeviceError."""
        names = {f.name for f in dataclasses.fields(cls)}
        extra = set(d) - names - {"key", "arch"}
        if extra:
            raise DeviceError(f"device description has unknown fields: {sorted(extra)}")
        missing = [f.name for f in dataclasses.fields(cls)
                   if f.name not in d and f.default is dataclasses.MISSING]
        if missing:
            raise DeviceError(f"device description lacks fields: {missing}")
        kw = {k: v for k, v in d.items() if k in names}
        if "gpc_sms" in kw:  # JSON gives a list
            kw["gpc_sms"] = tuple(int(x) for x in kw["gpc_sms"])
        return cls(**kw)


# ---- per-architecture facts used by presets and by device_from_attributes ----------------------
# max blocks per SM [OCC cudaOccMaxBlocksPerMultiprocessor]
def _max_blocks_per_sm(major: int, minor: int) -> int:
    if major == 7:
        return 16 if minor == 5 else 32
    if major == 8:
        return {0: 32, 9: 24}.get(minor, 16)
    if major == 12:
        return 24
    return 32


def _smem_alloc_unit(major: int) -> int:
    """[OCC cudaOccSMemAllocationGranularity]: 256 B up to cc 7.x, 128 B from cc 8.0."""
    return 256 if major <= 7 else 128


def _fp32_lanes_per_sm(major: int, minor: int) -> int:
    """FP32 cores per SM [CC "Arithmetic Instructions" throughput table]: 64 on 7.x and 8.0, else 128."""
    if major == 7 or (major == 8 and minor == 0):
        return 64
    return 128


def _cluster_limits(major: int, sm_count: int) -> dict[str, Any]:
    """Cluster fields of an architecture [CLU]: cc 9.x has clusters of 8 portable / 16 non-portable
    blocks (documented); the GPCs are a GUESS: 8 GPCs (the GH100 count) with the SMs spread as evenly
    as possible (132 SMs: four GPCs of 17 and four of 16). Other architectures: no clusters (sm_100 has
    them too, but no preset of it exists here)."""
    if major != 9:
        return {}
    gpcs = 8
    base, extra = divmod(sm_count, gpcs)
    return dict(max_cluster_size=8, max_cluster_size_nonportable=16,
                gpc_sms=tuple(base + (1 if i < extra else 0) for i in range(gpcs)))


def _atomic_vector_width(major: int) -> int:
    """[ATOM]: float4 ``atomicAdd`` on global memory from cc 9.0, scalar before."""
    return 4 if major >= 9 else 1


SFU_LANES_PER_SM = 16  # [CC throughput table]: 16 results/clock/SM for __expf/rsqrt etc. on 7.x-9.0


def _preset(name: str, cc: tuple[int, int], **kw: Any) -> Device:
    major, minor = cc
    base: dict[str, Any] = dict(
        name=name, cc_major=major, cc_minor=minor,
        max_threads_per_block=1024,             # [CC] all cc >= 2.0
        warp_size=32,                           # [CC]
        regs_per_sm=64 * KiB,                   # [CC] 64K 32-bit registers per SM, cc 5.0-9.0
        max_regs_per_block=64 * KiB,            # [CC]
        max_regs_per_thread=255,                # [CC]
        smem_per_block_default=48 * KiB,        # [CC] static / default dynamic limit
        smem_alloc_unit=_smem_alloc_unit(major),  # [OCC]
        smem_reserved_per_block=1 * KiB if major >= 8 else 0,  # [CC] 1 KB reserved on 8.x/9.x
        max_blocks_per_sm=_max_blocks_per_sm(major, minor),    # [OCC]
        fp32_lanes_per_sm=_fp32_lanes_per_sm(major, minor),
        sfu_lanes_per_sm=SFU_LANES_PER_SM,
        copy_bandwidth_gbs=None,
        launch_overhead_us=LAUNCH_OVERHEAD_US_H200,           # measured on H200 [BASE]; assumed here
        grid_barrier_base_us=GRID_BARRIER_BASE_US_H200,       # fitted on H200 [BASE]; assumed here
        grid_barrier_per_block_us=GRID_BARRIER_PER_BLOCK_US_H200,
        atomic_vector_width=_atomic_vector_width(major),      # [ATOM]
    )
    base.update(kw)
    base.update(_cluster_limits(major, base["sm_count"]))
    return Device(**base)


PRESETS: dict[str, Device] = {
    "h200": _preset(
        "NVIDIA H200", (9, 0),
        sm_count=132,                    # [H100] GH100 as shipped in SXM parts (H200 uses the same die)
        max_threads_per_sm=2048,         # [CC] cc 9.0
        smem_per_sm=228 * KiB,           # [CC] 228 KB per SM on 9.0 (233,472 B; also /work/shared/device)
        smem_per_block_optin=227 * KiB,  # [CC] 227 KB per block on 9.0
        l2_bytes=60 * MiB,               # CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE read on an H200, 2026-11-29
        dram_bandwidth_gbs=4800.0,       # [H200] 4.8 TB/s
        copy_bandwidth_gbs=4120.0,       # [BASE] measured device-to-device copy
        clock_mhz=1980.0,                # [H100]/[H200] max boost 1980 MHz
        mem_bus_bits=6144,               # [H200] six HBM3e stacks x 1024 bit
        launch_overhead_us=LAUNCH_OVERHEAD_US_H200,  # [BASE] measured
        memory_bytes=141 * 10**9,        # [H200] 141 GB HBM3e
    ),
    "h100": _preset(
        "NVIDIA H100 80GB HBM3", (9, 0),
        sm_count=132,                    # [H100] SXM5
        max_threads_per_sm=2048,         # [CC]
        smem_per_sm=228 * KiB,           # [CC]
        smem_per_block_optin=227 * KiB,  # [CC]
        l2_bytes=50 * MiB,               # [H100]
        dram_bandwidth_gbs=3350.0,       # [H100] SXM 3.35 TB/s
        clock_mhz=1980.0,                # [H100] max boost
        mem_bus_bits=5120,               # [H100] 5 HBM3 stacks
        memory_bytes=80 * 10**9,         # [H100] SXM 80 GB
    ),
    "a100": _preset(
        "NVIDIA A100-SXM4-80GB", (8, 0),
        sm_count=108,                    # [A100]
        max_threads_per_sm=2048,         # [CC] cc 8.0
        smem_per_sm=164 * KiB,           # [CC] 164 KB per SM on 8.0
        smem_per_block_optin=163 * KiB,  # [CC] 163 KB per block on 8.0
        l2_bytes=40 * MiB,               # [A100]
        dram_bandwidth_gbs=2039.0,       # [A100] 80GB SXM datasheet
        clock_mhz=1410.0,                # [A100] boost
        mem_bus_bits=5120,               # [A100]
        memory_bytes=80 * 10**9,         # [A100] 80 GB
    ),
    "l4": _preset(
        "NVIDIA L4", (8, 9),
        sm_count=58,                     # [L4]
        max_threads_per_sm=1536,         # [CC] cc 8.9: 48 warps per SM
        smem_per_sm=100 * KiB,           # [CC] 100 KB per SM on 8.6/8.9
        smem_per_block_optin=99 * KiB,   # [CC] 99 KB per block on 8.6/8.9
        l2_bytes=48 * MiB,               # [L4]
        dram_bandwidth_gbs=300.0,        # [L4] datasheet
        clock_mhz=2040.0,                # [L4] boost
        mem_bus_bits=192,                # [L4]
        memory_bytes=24 * 10**9,         # [L4] 24 GB GDDR6
    ),
    "t4": _preset(
        "Tesla T4", (7, 5),
        sm_count=40,                     # [T4]
        max_threads_per_sm=1024,         # [CC] cc 7.5: 32 warps per SM
        smem_per_sm=64 * KiB,            # [CC] 64 KB per SM on 7.5
        smem_per_block_optin=64 * KiB,   # [CC] 64 KB per block on 7.5
        l2_bytes=4 * MiB,                # [T4]
        dram_bandwidth_gbs=320.0,        # [T4] datasheet
        clock_mhz=1590.0,                # [T4] boost
        mem_bus_bits=256,                # [T4]
        memory_bytes=16 * 10**9,         # [T4] 16 GB GDDR6
    ),
    "v100": _preset(
        "Tesla V100-SXM2-16GB", (7, 0),
        sm_count=80,                     # [V100]
        max_threads_per_sm=2048,         # [CC] cc 7.0
        smem_per_sm=96 * KiB,            # [CC] 96 KB per SM on 7.0
        smem_per_block_optin=96 * KiB,   # [CC] 96 KB per block on 7.0
        l2_bytes=6 * MiB,                # [V100]
        dram_bandwidth_gbs=900.0,        # [V100] SXM2 datasheet
        clock_mhz=1530.0,                # [V100] boost
        mem_bus_bits=4096,               # [V100]
        memory_bytes=16 * 10**9,         # [V100] SXM2 16 GB
    ),
}


def _norm(s: str) -> str:
    return "".join(ch for ch in s.lower() if ch.isalnum())


def get_device(name: str) -> Device:
    """The preset matched case-insensitively against its short name ("h200"), full name
    ("NVIDIA H200") or key ("NVIDIA H200/sm_90").

    Raises DeviceError naming the presets when nothing matches, and for ``None``: the local GPU is
    :func:`stitchtune.gpu.device_query.default_device` (this layer cannot reach the driver).
    """
    if name is None:
        raise DeviceError("get_device needs a device name; the local GPU (else the H200 preset) is "
                          "stitchtune.gpu.device_query.default_device()")
    want = _norm(name)
    for short, dev in PRESETS.items():
        if want in (_norm(short), _norm(dev.name), _norm(dev.key)):
            return dev
    # "nvidia h100", "h100 sxm", ...: a unique preset whose short name is a word of the request
    words = {_norm(w) for w in name.replace("/", " ").replace("-", " ").split()}
    hits = [dev for short, dev in PRESETS.items() if short in words]
    if len(hits) == 1:
        if words - {_norm(w) for w in hits[0].name.replace("-", " ").split()} - {"nvidia", "sxm"}:
            log.warning("device %r taken as the preset %r (a different variant may differ in SMs and "
                        "bandwidth)", name, hits[0].name)
        return hits[0]
    raise DeviceError(f"unknown device {name!r}; presets: {', '.join(PRESETS)}")


def _preset_like(name: str) -> Device | None:
    try:
        return get_device(name)
    except DeviceError:
        return None


#: CU_DEVICE_ATTRIBUTE_* names (without the prefix) that :func:`device_from_attributes` reads; a query
#: passes those its driver reports. Only the compute capability is required.
DEVICE_ATTRIBUTES: tuple[str, ...] = (
    "COMPUTE_CAPABILITY_MAJOR", "COMPUTE_CAPABILITY_MINOR", "MULTIPROCESSOR_COUNT",
    "MAX_THREADS_PER_BLOCK", "MAX_THREADS_PER_MULTIPROCESSOR", "MAX_BLOCKS_PER_MULTIPROCESSOR",
    "WARP_SIZE", "MAX_REGISTERS_PER_MULTIPROCESSOR", "MAX_REGISTERS_PER_BLOCK",
    "MAX_SHARED_MEMORY_PER_MULTIPROCESSOR", "MAX_SHARED_MEMORY_PER_BLOCK_OPTIN", "MAX_SHARED_MEMORY_PER_BLOCK",
    "RESERVED_SHARED_MEMORY_PER_BLOCK", "L2_CACHE_SIZE", "CLOCK_RATE", "MEMORY_CLOCK_RATE",
    "GLOBAL_MEMORY_BUS_WIDTH",
)
#: ``Device.source`` of a description read from the CUDA driver (:mod:`stitchtune.gpu.device_query`)
QUERIED_SOURCE = "cuda"


def device_from_attributes(name: str, attrs: Mapping[str, int], *, memory_bytes: int | None = None,
                           source: str = QUERIED_SOURCE) -> Device:
    """The :class:`Device` of a GPU named ``name`` whose driver reports ``attrs``
    (``{"MULTIPROCESSOR_COUNT": 132, ...}``, names of :data:`DEVICE_ATTRIBUTES`; clock rates in kHz as
    the driver gives them) and ``memory_bytes`` of global memory (``None``: unknown). Pure: no driver.

    An attribute that is absent (or 0) takes the architecture's value (``cuda_occupancy.h`` tables,
    the CUDA C++ Programming Guide limits). DRAM bandwidth is 2 x memory clock x bus width / 8 (double
    data rate) when both are reported, else the preset's figure. Speeds the driver does not report
    (measured copy bandwidth, launch and grid-barrier costs, and L2 / clock / bus width when absent)
    come from the preset of the same name when there is one, else the H200's (assumed).
    Raises :class:`DeviceError` when the compute capability is missing.
    """
    def attr(label: str, default: int | None = None) -> int | None:
        v = attrs.get(label)
        return default if v is None else int(v)

    major = attr("COMPUTE_CAPABILITY_MAJOR")
    minor = attr("COMPUTE_CAPABILITY_MINOR")
    if major is None or minor is None:
        raise DeviceError(f"the driver did not report the compute capability of {name!r}")
    like = _preset_like(name)
    fallback = like or PRESETS["h200"]
    mem_khz = attr("MEMORY_CLOCK_RATE")
    bus = attr("GLOBAL_MEMORY_BUS_WIDTH")
    if mem_khz and bus:
        dram = 2.0 * mem_khz * 1e3 * (bus / 8) / 1e9   # double data rate: 2 transfers per clock
    else:
        dram = fallback.dram_bandwidth_gbs
    clock_khz = attr("CLOCK_RATE")
    smem_block = attr("MAX_SHARED_MEMORY_PER_BLOCK", 48 * KiB) or 48 * KiB
    blocks_default = _max_blocks_per_sm(major, minor)
    return Device(
        name=name, cc_major=major, cc_minor=minor,
        sm_count=attr("MULTIPROCESSOR_COUNT") or 1,
        max_threads_per_block=attr("MAX_THREADS_PER_BLOCK", 1024) or 1024,
        max_threads_per_sm=attr("MAX_THREADS_PER_MULTIPROCESSOR", 2048) or 2048,
        max_blocks_per_sm=attr("MAX_BLOCKS_PER_MULTIPROCESSOR", blocks_default) or blocks_default,
        warp_size=attr("WARP_SIZE", 32) or 32,
        regs_per_sm=attr("MAX_REGISTERS_PER_MULTIPROCESSOR", 64 * KiB) or 64 * KiB,
        max_regs_per_block=attr("MAX_REGISTERS_PER_BLOCK", 64 * KiB) or 64 * KiB,
        max_regs_per_thread=255,
        smem_per_sm=attr("MAX_SHARED_MEMORY_PER_MULTIPROCESSOR", smem_block) or smem_block,
        smem_per_block_optin=attr("MAX_SHARED_MEMORY_PER_BLOCK_OPTIN", smem_block) or smem_block,
        smem_per_block_default=smem_block,
        smem_alloc_unit=_smem_alloc_unit(major),
        smem_reserved_per_block=attr("RESERVED_SHARED_MEMORY_PER_BLOCK",
                                     1 * KiB if major >= 8 else 0) or 0,
        l2_bytes=attr("L2_CACHE_SIZE", fallback.l2_bytes) or fallback.l2_bytes,
        dram_bandwidth_gbs=round(dram, 1),
        copy_bandwidth_gbs=like.copy_bandwidth_gbs if like else None,
        clock_mhz=(clock_khz / 1000.0) if clock_khz else fallback.clock_mhz,
        mem_bus_bits=bus or fallback.mem_bus_bits,
        launch_overhead_us=fallback.launch_overhead_us,
        grid_barrier_base_us=fallback.grid_barrier_base_us,
        grid_barrier_per_block_us=fallback.grid_barrier_per_block_us,
        fp32_lanes_per_sm=_fp32_lanes_per_sm(major, minor),
        sfu_lanes_per_sm=SFU_LANES_PER_SM,
        source=source,
        memory_bytes=None if memory_bytes is None else int(memory_bytes),
        atomic_vector_width=_atomic_vector_width(major),
        **_cluster_limits(major, attr("MULTIPROCESSOR_COUNT") or 1),
    )


def check_fits(graph: Any, device: Any) -> None:
    """Refuse, before anything is allocated, a graph whose inputs and outputs alone
    (``graph.io_bytes()``: a gathered table whole) exceed the device's global memory; raises :class:`DeviceError` giving
    both numbers. A device without ``memory_bytes`` (unknown) is not checked."""
    have = getattr(device, "memory_bytes", None)
    if not have:
        return
    need = int(graph.io_bytes())
    if need > int(have):
        raise DeviceError(
            f"graph {str(graph.name)!a} does not fit in device memory: its inputs and outputs alone need "
            f"{need} bytes ({need / 2**30:.2f} GiB), {getattr(device, 'key', device)} has {int(have)} bytes "
            f"({int(have) / 2**30:.2f} GiB)")
