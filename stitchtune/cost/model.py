"""Analytical cost model: predicted time of a lowered program, legality pruning, cost-based pruning.

Contract
--------
* :func:`predict(profile, device, registers=None, params=None) -> Prediction`. ``registers`` maps
  kernel name -> ptxas register count and replaces ``KernelProfile.est_registers`` for the kernels it
  names. Illegal points get ``prune_reason`` (a sentence naming the kernel and the limit) and
  ``time_us = inf``; legal points get ``prune_reason = None`` and a finite time. Never raises for a
  well-formed profile. Times are *predictions* (µs), never to be presented as measurements.
* :func:`should_prune(prediction, best_measured_us, factor=3.0) -> str | None`: the reason to skip
  compiling a point (illegal, or predicted more than ``factor`` x the best measured time so far).
* :class:`CostParams` holds the per-device constants of the model; :func:`predict` uses, in order,
  its ``params`` argument, the params activated by :func:`load_params` / :func:`use_params` for that
  device key, else :func:`default_params`. ``stitchtune calibrate`` writes
  ``<db>/cost_params_<device key>.json`` (see :mod:`stitchtune.cost.calibrate`).

The model, per kernel (all quantities from the :class:`~stitchtune.ir.kir.KernelProfile`):

1. Legality: block <= max threads per block; shared memory <= per-block opt-in limit; theoretical
   occupancy (:mod:`stitchtune.hardware.occupancy`, registers from ptxas when given) > 0; a kernel with grid
   barriers needs grid <= SMs x blocks per SM (all blocks co-resident, else it deadlocks).
2. Waves: ``blocks_per_wave = SMs x blocks_per_sm``; the grid runs as ``grid // blocks_per_wave`` full
   waves plus a tail wave of the remaining blocks, each wave timed on its own (a tail or a small grid
   keeps fewer bytes in flight and fewer SMs busy).
3. Memory time of a wave of ``n`` blocks: bytes / achieved bandwidth, where bandwidth is a smooth
   minimum of (a) ``bw_efficiency`` x copy bandwidth, (b) Little's law: bytes in flight
   (``n x block x bytes_in_flight_per_thread``) / ``dram_latency_ns``, (c) the busy SMs' share
   (``sm_bw_share`` x copy bandwidth / SMs per busy SM). DRAM bytes = first-touch reads + writes + the
   re-reads that miss L2; re-reads hit L2 in proportion ``min(1, l2_usable_fraction x L2 /
   working set)`` and are served at ``l2_bw_factor`` x that bandwidth. A re-read in reverse order
   (``reversed_rereads``, schedule order ``alternate``) starts with the most recently read data, so
   it finds up to ``l2_reverse_fraction`` x L2 of it (assumed 0.9; a forward re-read of a working set
   larger than the L2 finds little, as an LRU-like cache evicts each line before it is read again).
4. Compute time of a wave: flops over FP32 lanes x clock of the busy SMs, plus SFU ops over SFU
   lanes, both scaled by ``compute_efficiency``; a wave takes max(memory, compute).
5. Plus: launch overhead (device.launch_overhead_us x launch_scale); block barriers
   (``waves x barriers x block_barrier_us / blocks_per_sm``: each barrier stalls its block, hidden in
   part by the other resident blocks); grid barriers (device.grid_barrier_us(grid) x scale each);
   atomics (``atomics x atomic_ns``, device-wide throughput per atomic instruction: a float4 add is one
   L2 request and counts once, an assumption the committed GPU data cannot check, as it has scalar adds
   only; or, when larger, the adds one address
   receives in sequence: ``atomic_serial x atomic_serial_ns``, assumed 1 ns each); the scratch chain
   (``ceil(waves) x scratch_loads x scratch_load_ns``): every thread combines the partials of its
   row from scratch, and on the H200 that cost grows with the loads per thread and per wave of
   blocks (measured rows in results/h200-2026-11-29/: split 64 layernorm_wide schedules run 10-25x slower than
   their streaming time). The SASS issues ~20 of these ``LDG.E.STRONG.GPU`` loads before the first
   add, so it is not a plain latency chain; all warps of all blocks of a row hit the same few L2
   lines, which is the likely bottleneck. The constant is empirical: 300 ns assumed, 234-323 ns
   when fitted leaving one workload out (scripts/model_quality.py).
6. Single-pass statistics (``schedule.single_pass``) need no term of their own: the lowering's profile
   counts one sweep fewer of the row (``dram_read_bytes`` + ``reread_bytes``: a row that is not kept on
   chip is read twice instead of three times) and the running update's math ops as the IR has them
   (Welford's division, online softmax's exps) in ``flops`` / ``sfu_ops``; the program's ``notes`` name the
   merged stages.
7. Thread-block clusters (the ``cluster`` scheme, sm_90): a cluster kernel is illegal when its
   cluster exceeds the device's portable size or cannot be resident on one GPC
   (:func:`~stitchtune.hardware.occupancy.max_active_clusters` = 0); a wave is the resident clusters x
   cluster size (GPCs can leave SMs idle); plus ``ceil(waves) x (cluster_barriers x cluster_barrier_us
   + dsmem_loads x dsmem_load_ns) / blocks_per_sm`` (each barrier and remote read stalls its block,
   hidden in part by the other resident blocks, as for block barriers). Both constants are GUESSES
   (0.5 us per cluster barrier, 40 ns per remote load: DSMEM latency of the order of 200 cycles at
   ~2 GHz with a few loads in flight), unmeasured: re-fit them from the first GPU database.
8. Generic kernels (one program per bucket of a dynamic graph, :mod:`stitchtune.lower.dynamic`): the
   profile of a generic program at given extents is the specialised program's at those extents (the
   same schedule: the same grid, bytes and rounds, :func:`stitchtune.lower.dynamic.generic_profile`),
   plus ``runtime_divs``: the integer divisions and remainders by a runtime value (its row bounds,
   position-embedding maps ``r % S``, the round count over ``gridDim.x``) one thread executes, each
   ``runtime_div_ns`` (a GUESS: ~20 dependent instructions at ~2 GHz, 20 ns), hidden in part by the
   other resident blocks (``ceil(waves) x runtime_divs x runtime_div_ns / blocks_per_sm``). Its
   other cost, a schedule tuned for the bucket's largest extent run at a smaller one, is in the
   specialised profile at that extent. Unmeasured: compare with ``scripts/gpu_check.sh``'s generic step.
8. Program time = sum over kernels, x ``time_scale``. ``occupancy``/``limiter`` of a Prediction are
   those of its slowest kernel (of the first illegal one when pruned).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import os
import re
from dataclasses import dataclass
from typing import Any, Mapping

from stitchtune.hardware.device import Device
from stitchtune.errors import StitchtuneError
from stitchtune.ir.kir import KernelProfile, ProgramProfile
from stitchtune.hardware.occupancy import Occupancy, clusters_resident, launch_refusal

log = logging.getLogger(__name__)

DEFAULT_PRUNE_FACTOR = 3.0
_SMOOTH_P = 6.0   # exponent of the smooth minimum of bandwidth limits (larger = closer to min)


@dataclass(frozen=True)
class CostParams:
    """Per-device constants of the model. Defaults are assumptions (labelled), not measurements;
    :func:`stitchtune.cost.calibrate.fit` re-fits them from measured rows."""

    device_key: str = ""
    dram_latency_ns: float = 700.0     # loaded DRAM latency for Little's law (assumed, Hopper-class)
    bw_efficiency: float = 0.92        # streaming kernel / copy bandwidth at full bytes in flight (assumed)
    sm_bw_share: float = 4.0           # one SM draws at most this x its fair share of bandwidth (assumed)
    l2_bw_factor: float = 2.5          # L2-hit bandwidth / DRAM bandwidth (assumed)
    l2_usable_fraction: float = 0.6    # share of L2 a re-read working set can keep (assumed)
    l2_reverse_fraction: float = 0.9   # share of L2 a reverse-order re-read finds (assumed)
    compute_efficiency: float = 0.5   # achieved / peak FP32 and SFU issue rate (assumed)
    launch_scale: float = 1.0          # x device.launch_overhead_us per kernel
    block_barrier_us: float = 0.25     # stall of one block at one __syncthreads after loads (assumed)
    grid_barrier_scale: float = 1.0    # x device.grid_barrier_us(grid)
    atomic_ns: float = 0.05            # device-wide cost per global atomic (assumed 20 per ns)
    scratch_load_ns: float = 300.0     # per scratch load per thread and wave (empirical, see item 5)
    atomic_serial_ns: float = 1.0      # per float atomic add to one address after another (assumed)
    cluster_barrier_us: float = 0.5    # stall of one block at one cluster.sync() (GUESS, item 6)
    dsmem_load_ns: float = 40.0        # per remote shared-memory load per thread (GUESS, item 6)
    runtime_div_ns: float = 20.0       # per integer division by a runtime value per thread (GUESS, item 8)
    time_scale: float = 1.0            # final multiplier (fitted when only predicted_us is known)
    fitted_rows: int = 0               # measured rows the values were fitted on (0 = defaults)
    source: str = "defaults"           # "defaults" | "calibrated"

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> CostParams:
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = set(d) - names
        if unknown:
            raise CostParamsError(f"cost parameters have unknown fields: {sorted(unknown)}")
        return cls(**dict(d))


#: Parameters that calibration may fit (positive reals), with their bounds.
FIT_BOUNDS: dict[str, tuple[float, float]] = {
    "dram_latency_ns": (100.0, 5000.0),
    "bw_efficiency": (0.2, 1.0),
    "sm_bw_share": (1.0, 64.0),
    "l2_bw_factor": (1.0, 10.0),
    "l2_reverse_fraction": (0.1, 1.0),
    "compute_efficiency": (0.05, 1.0),
    "launch_scale": (0.05, 5.0),
    "block_barrier_us": (0.001, 10.0),
    "grid_barrier_scale": (0.1, 10.0),
    "atomic_ns": (0.001, 50.0),
    "atomic_serial_ns": (0.01, 100.0),
    "scratch_load_ns": (20.0, 5000.0),
    "cluster_barrier_us": (0.01, 20.0),
    "dsmem_load_ns": (1.0, 2000.0),
    "time_scale": (0.1, 10.0),
}


class CostParamsError(StitchtuneError):
    """A cost-parameter file cannot be read or does not match the device."""


@dataclass(frozen=True)
class Prediction:
    """Predicted time of one program on one device (a prediction, not a measurement)."""

    time_us: float
    per_kernel_us: tuple[float, ...]
    occupancy: float
    limiter: str
    prune_reason: str | None   # None = legal


# ---------------------------------------------------------------------------- params registry
_ACTIVE: dict[str, CostParams] = {}


def default_params(device: Device) -> CostParams:
    return CostParams(device_key=device.key)


def use_params(params: CostParams) -> None:
    """Make ``params`` the ones :func:`predict` uses for ``params.device_key`` in this process."""
    _ACTIVE[params.device_key] = params


def active_params(device: Device) -> CostParams:
    return _ACTIVE.get(device.key) or default_params(device)


def params_path(db_dir: str, device: Device) -> str:
    """``<db>/cost_params_<device key with unsafe characters as _>.json``."""
    safe = re.sub(r"[^A-Za-z0-9_.-]", "_", device.key)
    return os.path.join(db_dir, f"cost_params_{safe}.json")


def load_params(db_dir: str, device: Device, activate: bool = True) -> CostParams:
    """Fitted params of ``device`` from ``db_dir`` when the file exists, else the defaults.
    With ``activate`` they become what :func:`predict` uses for the device in this process."""
    path = params_path(db_dir, device)
    params = default_params(device)
    if os.path.exists(path):
        try:
            with open(path, encoding="utf-8") as f:
                params = CostParams.from_dict(json.load(f))
        except (OSError, ValueError, TypeError) as exc:
            raise CostParamsError(f"cannot read cost parameters {ascii(path)}: {exc}") from None
        if params.device_key != device.key:
            raise CostParamsError(f"{ascii(path)} holds parameters for {params.device_key!r}, "
                                  f"not {device.key!r}")
        log.info("cost parameters for %s from %s (%d rows)", device.key, path, params.fitted_rows)
    if activate:
        use_params(params)
    return params


def save_params(db_dir: str, device: Device, params: CostParams) -> str:
    """Write ``params`` atomically to :func:`params_path`; returns the path."""
    path = params_path(db_dir, device)
    tmp = f"{path}.tmp-{os.getpid()}"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(params.to_dict(), f, indent=1, sort_keys=True)
    os.replace(tmp, path)
    return path


# ---------------------------------------------------------------------------- profile persistence
def profile_to_dict(profile: ProgramProfile, registers: Mapping[str, int] | None = None) -> dict[str, Any]:
    """JSON-ready form of a profile (plus ptxas registers when known): the ``profile_json`` column
    that lets :func:`stitchtune.cost.calibrate.fit` re-predict rows with new parameters."""
    d: dict[str, Any] = {"kernels": [dataclasses.asdict(k) for k in profile.kernels],
                         "min_bytes": int(profile.min_bytes)}
    if registers:
        d["registers"] = {str(k): int(v) for k, v in registers.items()}
    return d


def profile_from_dict(d: Mapping[str, Any]) -> tuple[ProgramProfile, dict[str, int] | None]:
    """Inverse of :func:`profile_to_dict`."""
    names = {f.name for f in dataclasses.fields(KernelProfile)}
    kernels = tuple(KernelProfile(**{k: v for k, v in kd.items() if k in names}) for kd in d["kernels"])
    regs = d.get("registers")
    return ProgramProfile(kernels=kernels, min_bytes=int(d.get("min_bytes", 0))), (
        {str(k): int(v) for k, v in regs.items()} if regs else None)


# ---------------------------------------------------------------------------- the model
def _smooth_min(*xs: float) -> float:
    return float(sum(x ** -_SMOOTH_P for x in xs) ** (-1.0 / _SMOOTH_P))


def kernel_legality(k: KernelProfile, device: Device, regs: int) -> tuple[Occupancy, str | None]:
    """Occupancy of kernel ``k`` and the reason it can never run correctly (None when legal): the
    rules of :func:`~stitchtune.hardware.occupancy.launch_refusal`, the reason prefixed with the kernel."""
    occ, reason = launch_refusal(device, k.block, regs, k.smem_bytes, k.grid, k.grid_barriers > 0, k.cluster)
    return occ, None if reason is None else f"kernel {k.name}: {reason}"


def kernel_time_us(k: KernelProfile, device: Device, occ: Occupancy, params: CostParams) -> float:
    """Predicted time of one legal kernel launch (µs), before ``time_scale``."""
    return sum(kernel_terms_us(k, device, occ, params).values())


def kernel_terms_us(k: KernelProfile, device: Device, occ: Occupancy, params: CostParams) -> dict[str, float]:
    """The terms of :func:`kernel_time_us` (µs): launch, body (the waves: max of memory and
    compute), block_barriers, grid_barriers, atomics, scratch_chain -- for explaining a prediction."""
    p = params
    copy_bw = device.effective_copy_bandwidth_gbs()        # GB/s == bytes/ns
    cap = p.bw_efficiency * copy_bw
    per_sm_bw = p.sm_bw_share * copy_bw / device.sm_count
    ws = max(int(k.reread_working_set), 1)
    kept = max(p.l2_usable_fraction, p.l2_reverse_fraction) if k.reversed_rereads else p.l2_usable_fraction
    hit = min(1.0, kept * device.l2_bytes / ws) if k.reread_bytes > 0 else 0.0
    dram_bytes = k.dram_read_bytes + k.dram_write_bytes + k.reread_bytes * (1.0 - hit)
    l2_bytes = k.reread_bytes * hit
    grid = int(k.grid)
    per_block_dram, per_block_l2 = dram_bytes / grid, l2_bytes / grid
    per_block_flops, per_block_sfu = k.flops / grid, k.sfu_ops / grid
    bif = max(int(k.bytes_in_flight_per_thread), 1)
    fp32_per_us = device.fp32_lanes_per_sm * device.clock_mhz * p.compute_efficiency   # per SM
    sfu_per_us = device.sfu_lanes_per_sm * device.clock_mhz * p.compute_efficiency

    def wave_us(n: int) -> float:
        if n <= 0:
            return 0.0
        busy_sms = min(device.sm_count, n)
        little = n * k.block * bif / p.dram_latency_ns
        bw = _smooth_min(cap, little, busy_sms * per_sm_bw)          # bytes per ns
        mem_ns = n * per_block_dram / bw + n * per_block_l2 / (p.l2_bw_factor * bw)
        comp_us = n * (per_block_flops / (busy_sms * fp32_per_us) + per_block_sfu / (busy_sms * sfu_per_us))
        return max(mem_ns / 1000.0, comp_us)

    per_wave = occ.blocks_per_sm * device.sm_count
    if k.cluster > 1:  # whole clusters per GPC: a GPC may leave SMs idle
        per_wave = max(k.cluster, min(per_wave, k.cluster * clusters_resident(device, occ.blocks_per_sm, k.cluster)))
    full, tail = divmod(grid, per_wave)
    body = full * wave_us(per_wave) + wave_us(tail)
    waves = grid / per_wave
    barriers = math.ceil(waves) * k.block_barriers * p.block_barrier_us / occ.blocks_per_sm
    grid_sync = k.grid_barriers * device.grid_barrier_us(grid) * p.grid_barrier_scale
    atomics = max(k.atomics * p.atomic_ns, k.atomic_serial * p.atomic_serial_ns) / 1000.0
    # a block's scratch loads cost in sequence; the blocks of one wave overlap
    chain = math.ceil(waves) * k.scratch_loads * p.scratch_load_ns / 1000.0
    launch = device.launch_overhead_us * p.launch_scale
    terms = {"launch": launch, "body": body, "block_barriers": barriers, "grid_barriers": grid_sync,
             "atomics": atomics, "scratch_chain": chain}
    if k.runtime_divs:  # a generic kernel's index arithmetic (item 8)
        terms["runtime_index"] = math.ceil(waves) * k.runtime_divs * p.runtime_div_ns / 1000.0 / occ.blocks_per_sm
    if k.cluster > 1:
        terms["cluster_exchange"] = math.ceil(waves) * (k.cluster_barriers * p.cluster_barrier_us + k.dsmem_loads
                                                        * p.dsmem_load_ns / 1000.0) / occ.blocks_per_sm
    return terms


def explain(profile: ProgramProfile, device: Device, registers: Mapping[str, int] | None = None,
            params: CostParams | None = None) -> list[dict[str, Any]]:
    """Per kernel: occupancy, limiter, waves, DRAM/L2 bytes and the time terms (µs, predicted,
    before ``time_scale``); illegal kernels carry their ``prune_reason`` instead of terms."""
    p = params or active_params(device)
    out = []
    for k in profile.kernels:
        regs = int((registers or {}).get(k.name, k.est_registers))
        occ, reason = kernel_legality(k, device, regs)
        row: dict[str, Any] = {"kernel": k.name, "grid": k.grid, "block": k.block, "registers": regs,
                               "blocks_per_sm": occ.blocks_per_sm, "occupancy": occ.occupancy,
                               "limiter": occ.limiter, "prune_reason": reason}
        if reason is None:
            row["waves"] = k.grid / (occ.blocks_per_sm * device.sm_count)
            row.update(kernel_terms_us(k, device, occ, p))
        out.append(row)
    return out


def predict(profile: ProgramProfile, device: Device, registers: Mapping[str, int] | None = None,
            params: CostParams | None = None) -> Prediction:
    """Predicted time of ``profile`` on ``device`` (see the module docstring for the model)."""
    p = params or active_params(device)
    regs_of = dict(registers or {})
    times: list[float] = []
    occs: list[Occupancy] = []
    for k in profile.kernels:
        regs = int(regs_of.get(k.name, k.est_registers))
        occ, reason = kernel_legality(k, device, regs)
        if reason is not None:
            return Prediction(math.inf, tuple(times) + (math.inf,) * (len(profile.kernels) - len(times)),
                              occ.occupancy, occ.limiter, reason)
        times.append(kernel_time_us(k, device, occ, p) * p.time_scale)
        occs.append(occ)
    if not times:
        return Prediction(math.inf, (), 0.0, "none", "program has no kernels")
    slow = max(range(len(times)), key=times.__getitem__)
    return Prediction(float(sum(times)), tuple(times), occs[slow].occupancy, occs[slow].limiter, None)


def should_prune(prediction: Prediction, best_measured_us: float | None,
                 factor: float = DEFAULT_PRUNE_FACTOR) -> str | None:
    """Why to skip compiling this point, or None to keep it.

    Illegal points return their ``prune_reason``. A legal point is pruned when
    ``prediction.time_us > factor x best_measured_us`` (no pruning while nothing is measured, or when
    ``factor`` is not finite and positive)."""
    if prediction.prune_reason:
        return prediction.prune_reason
    if best_measured_us is None or not (best_measured_us > 0 and math.isfinite(best_measured_us)):
        return None
    if not (factor > 0 and math.isfinite(factor)):
        return None
    if prediction.time_us > factor * best_measured_us:
        return (f"predicted {prediction.time_us:.1f} us > {factor:g} x best measured "
                f"{best_measured_us:.1f} us")
    return None
