"""Occupancy against the CUDA occupancy calculator's formulas.

Source of every expected value: the rules of ``cudaOccMaxActiveBlocksPerMultiprocessor`` in
``/usr/local/cuda/include/cuda_occupancy.h`` (CUDA 13.0), which is the CUDA Occupancy Calculator
described in the CUDA C++ Programming Guide. Notation in the derivations:

  W   = warps per block = ceil(threads / 32)
  Wl  = warp limit      = (max threads per SM / 32) // W
  Bl  = block limit     = max blocks per SM (V100 32, T4 16, A100 32, L4 24, H200 32)
  rpw = registers per warp = round_up(regs x 32, 256);  Rl = 4 x ((65536 / 4) // rpw) // W
        (0 if rpw x W or rpw x round_up(W, 4) > 65536 registers per block)
  sa  = shared memory per block = round_up(smem + reserved, unit) (V100/T4: reserved 0, unit 256;
        A100/L4/H200: reserved 1024, unit 128);  Sl = smem per SM // sa   (0 if sa > limit+reserved)
  blocks = min(Wl, Bl, Rl, Sl); occupancy = blocks x W / max warps per SM.

The table was also checked against the header itself (test_matches_cuda_occupancy_header compiles
it with g++ and compares a few hundred more configurations).

On a machine with a GPU, ``stitchtune devices --check`` compares occupancy() with the driver's
cuOccupancyMaxActiveBlocksPerMultiprocessor (stitchtune.hardware.occupancy.driver_check); test_driver_check
below does the same under pytest and skips itself without a GPU.
"""

from __future__ import annotations

import os
import random
import shutil
import subprocess
import tempfile

import pytest

from stitchtune.hardware.device import get_device
from stitchtune.hardware.occupancy import Occupancy, max_resident_blocks, occupancy, smem_allocated_per_block

INF = "inf"

# (device, threads, regs/thread, smem bytes) -> (blocks/SM, active warps, limiter)   derivation
CASES = [
    # ---- V100, sm_70: 64 warps, 32 blocks, 96 KiB smem, unit 256, no reservation ---------------
    ("v100", 256, 32, 0, 8, 64, "warps"),          # W8 Wl8; rpw1024 Rl=4*16//8=8 (tie -> warps)
    ("v100", 128, 64, 0, 8, 32, "registers"),      # W4 Wl16; rpw2048 Rl=4*8//4=8
    ("v100", 1024, 64, 0, 1, 32, "registers"),     # W32 Wl2; rpw2048 x32=65536 ok; Rl=32//32=1
    ("v100", 1024, 65, 0, 0, 0, "registers"),      # rpw=round_up(2080,256)=2304; x32=73728>65536
    ("v100", 64, 16, 0, 32, 64, "warps"),          # W2 Wl32 Bl32; rpw512 Rl=128//2=64
    ("v100", 32, 16, 0, 32, 32, "blocks"),         # W1 Wl64 Bl32 -> 32
    ("v100", 256, 32, 49152, 2, 16, "shared_memory"),  # sa=49152; Sl=98304//49152=2
    ("v100", 256, 32, 50000, 1, 8, "shared_memory"),   # opt-in; sa=50176; Sl=98304//50176=1
    ("v100", 256, 32, 98305, 0, 0, "shared_memory"),   # sa=98560 > 96 KiB opt-in
    ("v100", 2048, 32, 0, 0, 0, "threads_per_block"),  # > 1024 threads per block
    ("v100", 96, 40, 0, 16, 48, "registers"),      # W3 Wl21; rpw1280 16384//1280=12 -> 48 warps //3=16
    ("v100", 256, 255, 0, 1, 8, "registers"),      # rpw=round_up(8160,256)=8192; 2/part -> 8 warps -> 1
    ("v100", 256, 256, 0, 0, 0, "registers"),      # 256 > 255 registers per thread (ISA limit)
    # ---- T4, sm_75: 32 warps, 16 blocks, 64 KiB smem, unit 256, no reservation -----------------
    ("t4", 256, 32, 0, 4, 32, "warps"),            # W8 Wl4; Rl=64//8=8; Bl16
    ("t4", 32, 32, 0, 16, 16, "blocks"),           # W1 Wl32 Bl16
    ("t4", 1024, 64, 0, 1, 32, "warps"),           # W32 Wl1; rpw2048 Rl=32//32=1 (tie -> warps)
    ("t4", 128, 128, 0, 4, 16, "registers"),       # W4 Wl8; rpw4096 4/part -> 16 warps //4 = 4
    ("t4", 128, 32, 20000, 3, 12, "shared_memory"),  # sa=20224; 65536//20224=3
    ("t4", 128, 32, 65536, 1, 4, "shared_memory"),   # sa=65536 = opt-in limit; 1
    ("t4", 64, 24, 1, 16, 32, "warps"),            # W2 Wl16 Bl16; rpw768 Rl=84//2=42; sa=256 Sl=256
    # ---- A100, sm_80: 64 warps, 32 blocks, 164 KiB smem, opt-in 163 KiB, unit 128, 1 KiB reserved
    ("a100", 256, 32, 0, 8, 64, "warps"),          # W8 Wl8 Rl8; sa=1024 (reservation) Sl=164
    ("a100", 128, 16, 0, 16, 64, "warps"),         # W4 Wl16; rpw512 Rl=128//4=32
    ("a100", 32, 16, 0, 32, 32, "blocks"),         # W1 Wl64 Bl32
    ("a100", 256, 48, 0, 5, 40, "registers"),      # rpw1536 16384//1536=10 -> 40 warps //8 = 5
    ("a100", 512, 72, 0, 1, 16, "registers"),      # rpw2304 16384//2304=7 -> 28 warps //16 = 1
    ("a100", 256, 32, 32768, 4, 32, "shared_memory"),   # sa=33792; 167936//33792=4
    ("a100", 256, 32, 166912, 1, 8, "shared_memory"),   # sa=167936 <= 163 KiB + 1 KiB; 1
    ("a100", 256, 32, 166913, 0, 0, "shared_memory"),   # sa=168064 > 167936
    ("a100", 1024, 32, 49152, 2, 64, "warps"),     # W32 Wl2 Rl2; sa=50176 Sl=3
    ("a100", 1000, 40, 0, 1, 32, "registers"),     # W=ceil(1000/32)=32 Wl2; rpw1280 -> 48 warps //32 = 1
    # ---- L4, sm_89: 48 warps, 24 blocks, 100 KiB smem, opt-in 99 KiB, unit 128, 1 KiB reserved --
    ("l4", 256, 32, 0, 6, 48, "warps"),            # W8 Wl6; Rl8; Bl24
    ("l4", 32, 16, 0, 24, 24, "blocks"),           # W1 Wl48 Bl24
    ("l4", 1024, 32, 0, 1, 32, "warps"),           # W32 Wl=48//32=1 -> occupancy 32/48
    ("l4", 128, 64, 40960, 2, 8, "shared_memory"),  # sa=41984; 102400//41984=2; Rl=32//4=8
    # ---- H200, sm_90: 64 warps, 32 blocks, 228 KiB smem, opt-in 227 KiB, unit 128, 1 KiB reserved
    ("h200", 1024, 32, 0, 2, 64, "warps"),         # W32 Wl2 Rl2
    ("h200", 128, 122, 0, 4, 16, "registers"),     # rpw=round_up(3904,256)=4096; 4/part -> 16 warps //4
    ("h200", 256, 122, 0, 2, 16, "registers"),     # 16 warps //8 = 2
    ("h200", 1024, 122, 0, 0, 0, "registers"),     # 4096 x 32 = 131072 > 65536 per block
    ("h200", 512, 64, 0, 2, 32, "registers"),      # rpw2048 -> 32 warps //16 = 2; Wl4
    ("h200", 256, 32, 100000, 2, 16, "shared_memory"),  # sa=round_up(101024,128)=101120; 233472//101120=2
    ("h200", 256, 32, 232448, 1, 8, "shared_memory"),   # sa=233472 = 227 KiB + 1 KiB; 1
    ("h200", 256, 32, 232449, 0, 0, "shared_memory"),   # sa=233600 > 233472
    ("h200", 64, 32, 4096, 32, 64, "warps"),       # W2 Wl32 Bl32 Rl32 (tie); sa=5120 Sl=45
    ("h200", 96, 168, 0, 4, 12, "registers"),      # rpw5376 16384//5376=3 -> 12 warps //3 = 4
    ("h200", 160, 255, 0, 1, 5, "registers"),      # rpw8192 x round_up(5,4)=8 -> 65536 ok; 8 warps //5 = 1
    ("h200", 288, 200, 0, 0, 0, "registers"),      # rpw6400 x 9 = 57600 ok, x round_up(9,4)=12 = 76800 > 65536
]


@pytest.mark.parametrize("dev,threads,regs,smem,blocks,warps,limiter", CASES)
def test_documented_cases(dev: str, threads: int, regs: int, smem: int, blocks: int, warps: int,
                          limiter: str) -> None:
    d = get_device(dev)
    occ = occupancy(d, threads, regs, smem)
    assert occ == Occupancy(blocks, warps, warps / d.max_warps_per_sm, limiter)


def test_case_count_and_architectures() -> None:
    assert len(CASES) >= 30
    archs = {get_device(c[0]).arch for c in CASES}
    assert {"sm_70", "sm_80", "sm_90"} <= archs


def test_smem_allocation_and_co_residency() -> None:
    h200 = get_device("h200")
    assert smem_allocated_per_block(h200, 0) == 1024           # the reservation alone
    assert smem_allocated_per_block(h200, 1) == 1152           # 1025 rounded up to 128
    assert smem_allocated_per_block(get_device("v100"), 1) == 256
    assert max_resident_blocks(h200, 1024, 32, 0) == 2 * 132
    assert max_resident_blocks(h200, 1024, 122, 0) == 0


def test_rejects_nonpositive_block() -> None:
    with pytest.raises(ValueError):
        occupancy(get_device("h200"), 0, 32, 0)


# ---- cross-check against cuda_occupancy.h itself ----------------------------------------------
HEADER = "/usr/local/cuda/include/cuda_occupancy.h"
HARNESS = r"""
#include <cstdio>
#include <cuda_occupancy.h>
int main() {
  long long b[14];
  for (;;) {
    for (int i = 0; i < 14; i++) if (scanf("%lld", &b[i]) != 1) return 0;
    cudaOccDeviceProp p;
    p.computeMajor = b[0]; p.computeMinor = b[1]; p.maxThreadsPerBlock = b[2];
    p.maxThreadsPerMultiprocessor = b[3]; p.regsPerBlock = b[4]; p.regsPerMultiprocessor = b[5];
    p.warpSize = b[6]; p.sharedMemPerBlock = b[7]; p.sharedMemPerMultiprocessor = b[8]; p.numSms = 1;
    p.sharedMemPerBlockOptin = b[9]; p.reservedSharedMemPerBlock = b[10];
    cudaOccFuncAttributes f; f.maxThreadsPerBlock = 1 << 30; f.numRegs = b[12]; f.sharedSizeBytes = 0;
    f.shmemLimitConfig = FUNC_SHMEM_LIMIT_OPTIN; f.maxDynamicSharedSizeBytes = b[9]; f.numBlockBarriers = 1;
    cudaOccDeviceState s; cudaOccResult r;
    int e = cudaOccMaxActiveBlocksPerMultiprocessor(&r, &p, &f, &s, (int)b[11], (size_t)b[13]);
    printf("%d %d\n", e, e == 0 ? r.activeBlocksPerMultiprocessor : 0);
  }
}
"""


def _header_blocks(configs: list[tuple[str, int, int, int]]) -> list[int]:
    with tempfile.TemporaryDirectory() as tmp:
        src, exe = os.path.join(tmp, "occ.cpp"), os.path.join(tmp, "occ")
        with open(src, "w") as f:
            f.write(HARNESS)
        subprocess.run(["g++", "-O1", "-I", os.path.dirname(HEADER), src, "-o", exe], check=True,
                       capture_output=True, timeout=120)
        lines = []
        for dev, threads, regs, smem in configs:
            d = get_device(dev)
            lines.append(" ".join(str(v) for v in (
                d.cc_major, d.cc_minor, d.max_threads_per_block, d.max_threads_per_sm,
                d.max_regs_per_block, d.regs_per_sm, d.warp_size, d.smem_per_block_default,
                d.smem_per_sm, d.smem_per_block_optin, d.smem_reserved_per_block, threads, regs, smem)))
        out = subprocess.run([exe], input="\n".join(lines) + "\n", capture_output=True, text=True,
                             check=True, timeout=60).stdout.split("\n")
    return [int(line.split()[1]) for line in out if line.strip()]


@pytest.mark.skipif(not (os.path.exists(HEADER) and shutil.which("g++")),
                    reason="needs cuda_occupancy.h and g++")
def test_matches_cuda_occupancy_header() -> None:
    rng = random.Random(1234)
    configs = [(c[0], c[1], c[2], c[3]) for c in CASES if c[1] <= 1024 and c[2] <= 255]
    for _ in range(400):
        dev = rng.choice(["v100", "t4", "a100", "l4", "h100", "h200"])
        threads = rng.choice([32, 64, 96, 128, 160, 192, 256, 288, 384, 512, 640, 768, 1000, 1024])
        regs = rng.choice([0, 16, 24, 32, 40, 48, 56, 64, 72, 80, 96, 122, 128, 168, 200, 232, 255])
        smem = rng.choice([0, 1, 1024, 4096, 12288, 40000, 49152, 65536, 99000, 150000, 232448])
        configs.append((dev, threads, regs, smem))
    expected = _header_blocks(configs)
    mismatches = [(cfg, exp, occupancy(get_device(cfg[0]), *cfg[1:]).blocks_per_sm)
                  for cfg, exp in zip(configs, expected, strict=True)
                  if occupancy(get_device(cfg[0]), *cfg[1:]).blocks_per_sm != exp]
    assert len(expected) == len(configs)
    assert not mismatches, mismatches[:10]


def _has_gpu() -> bool:
    try:
        from stitchtune.gpu.device_query import query_device

        query_device(0)
        return True
    except Exception:  # noqa: BLE001 - any failure means: no usable GPU here
        return False


@pytest.mark.gpu
@pytest.mark.skipif(not _has_gpu(), reason="needs a CUDA GPU, cuda-python and nvcc")
def test_driver_check() -> None:
    from stitchtune.gpu.build import find_nvcc
    from stitchtune.gpu.device_query import query_device
    from stitchtune.hardware.occupancy import driver_check

    total, mismatches = driver_check(query_device(0), ordinal=0, nvcc=find_nvcc())
    assert total > 50
    assert not mismatches, mismatches[:10]


@pytest.mark.slow
@pytest.mark.skipif(not shutil.which("nvcc"), reason="needs nvcc")
def test_driver_check_plumbing_with_fake_driver(monkeypatch: pytest.MonkeyPatch) -> None:
    """driver_check's nvcc + driver-call sequence, with a fake libcuda that answers from occupancy():
    catches argument mistakes before the check runs on a real GPU. The five check kernels are built by
    one nvcc call into one module, each looked up by its name."""
    import ctypes

    from stitchtune.hardware import occupancy as occ_mod

    dev = get_device("h200")
    calls: list[str] = []
    kernels: list[bytes] = []

    class FakeCuda:
        def __getattr__(self, name: str):  # every cu* call succeeds unless special-cased
            def call(*args):
                calls.append(name)
                if name == "cuModuleGetFunction":
                    kernels.append(args[2])
                if name == "cuFuncGetAttribute":
                    args[0]._obj.value = 40
                if name == "cuOccupancyMaxActiveBlocksPerMultiprocessor":
                    threads, smem = args[2].value, args[3].value
                    args[0]._obj.value = occupancy(dev, threads, 40, smem).blocks_per_sm
                return 0
            return call

    monkeypatch.setattr(ctypes, "CDLL", lambda _name: FakeCuda())
    total, bad = occ_mod.driver_check(dev)
    assert total == 5 * 7 * 6 and bad == []
    assert calls.count("cuModuleLoad") == 1 and calls.count("cuModuleUnload") == 1 and calls[0] == "cuInit"
    assert kernels == [b"k1", b"k24", b"k56", b"k120", b"k200"]
