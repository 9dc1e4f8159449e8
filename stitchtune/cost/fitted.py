"""Device time of a lowered program from its IR-derived features, with coefficients fitted to GPU data.

Contract
--------
* :func:`device_time_us(features, device, coefficients=None) -> float`: predicted device time of the
  launches (µs, the kernels' durations as a profiler reports them: **no launch term**);
  :func:`launch_us(features, device)` is the host's launch cost, reported separately
  (``device.launch_overhead_us`` per launch).
* :func:`kernel_terms_us(f, device, c) -> dict[str, float]`: the terms of one launch (for explaining).
* :func:`predict_program(program, device, registers=None, coefficients=None) -> Prediction`: legality as
  :func:`stitchtune.cost.model.predict` (same ``prune_reason`` rules), time = device time (predicted).
* :func:`coefficients_for(device) -> Coefficients`: the user's coefficients of the device when ``stitchtune
  calibrate`` wrote some (:func:`stitchtune.cost.fitted_store.user_path`, ``source="calibrated"``), else the
  fitted coefficients shipped for it (package data ``stitchtune/cost/fitted_<device key>.json``, written by
  ``scripts/fit_cost_model.py`` with the fit's provenance; :func:`package_coefficients` reads only those),
  else :meth:`Coefficients.defaults` (assumed, labelled ``source="defaults"``).

The model, per launch (``f`` a :class:`~stitchtune.cost.features.KernelFeatures`):

* **memory**: ``nb = min(grid, blocks_per_sm x SMs)`` blocks in flight keep ``nb x block x active_lanes
  x bif`` bytes in flight, where ``bif`` is the compiled code's bytes in flight per thread when the
  kernel was compiled (``compiled_bytes_in_flight`` > 0, :mod:`stitchtune.cost.compiled`), else the IR
  walk's, at most
  ``inflight_reg_share`` of the thread's registers (4 bytes each: a load in flight needs its
  destination registers); the bandwidth is a smooth minimum of ``bw_efficiency`` x copy bandwidth and
  that over the loaded latency (Little's law; a kernel without global loads, no bytes in flight walked or compiled
  and no load round, is not latency-bound: its stores are issued without waiting, so it streams at
  ``store_bw_factor`` x copy bandwidth, a **prior, not fitted** (no fit row is store-only): 1.13, from Inductor's
  MEASURED zero fill of a 98.3 MB table on the H200, 21.9 us (BERT training, ``triton_poi_fused_18``: 98.3 MB /
  (21.9 us - ``ramp_us``) = 4.66 TB/s; its 3.1 MB fill, 1.4 us measured, is predicted 1.5; ``scripts/atomics_prior.py``);
  0: at the ceiling, ``bw_efficiency`` x copy bandwidth, as before).
  Two optional terms (0 = off, as shipped: results/cost-fit-2026-12-07-s14/): the bytes in flight of all SMs are at
  most ``min(grid, SMs) x sm_inflight_kib`` (the memory parallelism of the SMs a grid keeps busy: miss queues), and
  the latency they wait is ``dram_latency_ns x (1 + loaded_latency x bw / copy bandwidth)`` (queueing as the
  bandwidth drawn rises), so the bandwidth solves ``bw = bytes in flight / latency(bw)``: ``2B / (L0 + sqrt(L0^2 +
  4 a L0 B / copy))`` (``B / L0`` when off).
  DRAM bytes are the unique bytes plus the sector bytes
  beyond them (re-reads, strided sectors) that miss the L2; they hit in proportion ``min(1, l2_keep x L2
  / window)``, ``window = unique bytes / (max(1, waves) x task_trips ** reuse_tasks) ** reuse_window`` (with
  ``reuse_window`` 1: the bytes of one wave, the data between a block's read and its re-read; 0: the whole tensor;
  ``reuse_tasks`` 1: one wave of tasks, a block's tasks running one after another, the IR walk's ``task_trips``;
  0, as shipped: one wave of blocks, results/cost-fit-2026-12-07-s14-unroll/README.md). Every
  sector also passes the L2 at ``l2_bw_factor`` x copy bandwidth, and the sectors beyond each access's
  ideal (strided: a transposed store's 4 useful bytes per 32-byte sector) at ``strided_bw_factor`` x
  copy bandwidth, even when they hit. Memory time is the largest of the three.
* **issue**: per thread (features are per-thread counts) float ops, divisions x ``div_cycles``,
  transcendentals x ``sfu_cycles``, over the FP32 lanes of the SMs; shared-memory wavefronts
  (conflicts counted) x ``smem_cycles`` per SM and clock.
* **blocks**: ``grid / SMs x cta_ns``: an SM starts blocks at a limited rate (49,152 blocks of 32
  threads copy 25 MB in 30.7 us on the H200, floor 5.2 us).
* **chain**: ``ceil(waves) x (rounds x round_ns + barriers x barrier_ns + shuffles x shfl_ns)``: a
  block's serial chain (its load rounds that cannot overlap, barriers and warp shuffles one after another),
  run ``ceil(waves)`` times by each block slot of an SM: the time of a kernel with few blocks and long
  per-thread loops, which Little's law over the average bytes in flight misses. ``rounds`` is the IR walk's
  ``serial_rounds``; when the kernel was compiled and its code keeps more bytes in flight than the walk's mean
  group (``compiled_bytes_in_flight`` > ``bytes_in_flight_per_thread``: nvcc hoisted loads across the iterations
  of a staging loop or the branches that end a walk group), the same bytes travel in fewer rounds: ``serial_rounds x
  bytes_in_flight_per_thread / compiled_bytes_in_flight`` (never more than the walk's).
* **l2 requests**: ``grid x l2_requests / SMs x l2_request_ns``: every warp-level request of a scratch
  load (``__ldcg``, L1 bypassed) is served by the L2 at a limited rate per SM; a broadcast read of one
  word is one request however few bytes it moves (layernorm_wide's partials: ~13 ns per request and SM).
* body = max(memory, issue, blocks, chain, l2 requests): each is a limit on the same launch. Two optional terms
  (0 = off, as shipped: results/cost-fit-2026-12-07-s15-order/): ``overlap_warps`` adds the **exposed** issue work,
  ``min(memory, issue) x exp(-resident warps per SM / overlap_warps) / task_trips ** overlap_tasks`` (a warp
  computes while its loads are not in flight; few resident warps leave the memory pipe idle meanwhile, unless the
  thread's next task's loads are already issued); ``l2_latency_ns`` bounds the L2's sector rate by Little's law
  over the same bytes in flight (a small grid's L2 hits are latency-bound too). ``phase_tasks`` 1 divides the
  phase term by ``task_trips`` (0 as shipped).
* **phases**: ``ceil(waves) x (load_phases - 1) x phase_us / blocks_per_sm`` (a barrier-separated load
  phase waits for DRAM unless other resident blocks hide it);
* **scratch**: ``ceil(waves) x scratch_loads x scratch_load_ns`` (the cost model's scratch chain);
* **spills**: ``ceil(waves) x spill_instructions x spill_ns`` (local-memory round trips of a compiled
  kernel's spills; 0 without compiled facts);
  grid barriers ``device.grid_barrier_us(grid)`` each; atomics ``atomics x grid x block x atomic_ns``.
* **atomics**: ``atomics`` counts a thread's atomic instructions (a ``float4`` add once: one ``REDG.E.ADD.F32x4``
  lane in SASS), added to the body (not overlapped with its memory). ``atomic_ns`` is a **prior, not fitted**: no
  fit row has atomics. 0.023 ns is what makes this form reproduce the one measured H200 kernel with atomics we have,
  Inductor's BERT-training embedding backward (``triton_per_fused_19``: 64.9 us MEASURED, CUPTI,
  results/h200-2026-12-04-models/logs/time_run3.log; its Triton code compiled for sm_90 issues 1,572,864
  ``REDG.E.ADD.F32x4`` lanes, half of them into the 2-row token-type table, and moves 88.1 MB): 64.9 us less
  its bytes at this model's ceiling plus the ramp (28.2 us), over the lanes (``scripts/atomics_prior.py``,
  results/atomics-2026-12-07-s15/; 0.027 with Inductor's own bandwidth line for the rest, 0.047 if the contended
  token-type adds cost nothing). Whether a scalar add costs what a ``float4`` one does (this count) or a quarter
  (bytes) is not measured: scripts/gpu_scatter_variants.py's ``scalar`` variant.
* **ramp**: ``ramp_us`` per launch (the first loads' latency before data flows, the last wave's drain).
* device time = body + phases + scratch + spills + grid barriers + atomics + ramp.
* ``event_us`` is not device time: it is the per-launch start that times taken with CUDA events around a
  program include (:mod:`stitchtune.cost.fitting` adds it to such rows only, so that the fit of device
  time is not biased by how a row was measured).

All times are predictions, never measurements.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
from dataclasses import dataclass, field
from importlib import resources
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from stitchtune.cost.compiled import CompiledFacts, registers_of, with_compiled
from stitchtune.cost.features import KernelFeatures, program_features
from stitchtune.cost.fitted_store import data_name, user_path
from stitchtune.cost.model import Prediction, kernel_legality
from stitchtune.hardware.device import Device
from stitchtune.ir import kir

log = logging.getLogger(__name__)

_SMOOTH_P = 4.0


@dataclass(frozen=True)
class Coefficients:
    """The fitted constants of the feature model (defaults: assumptions, ``source="defaults"``)."""

    device_key: str = ""
    bw_efficiency: float = 0.92      # streaming / copy bandwidth at full bytes in flight
    dram_latency_ns: float = 700.0   # loaded DRAM latency (Little's law)
    l2_bw_factor: float = 2.5        # L2 sector bandwidth / copy bandwidth
    strided_bw_factor: float = 0.5   # bandwidth of sectors beyond an access's ideal / copy bandwidth
    l2_keep: float = 0.6             # share of the L2 a kernel's data can stay in
    div_cycles: float = 8.0          # issue cycles of a float division per lane
    sfu_cycles: float = 16.0         # issue cycles of a transcendental per lane (not fitted: see FIT_BOUNDS)
    flop_cycles: float = 1.0         # issue cycles of another float op per lane
    smem_cycles: float = 1.0         # cycles per shared-memory wavefront per SM
    cta_ns: float = 50.0             # per block and SM
    phase_us: float = 0.5            # per extra load phase, wave and resident block
    scratch_load_ns: float = 300.0   # per scratch load per thread and wave
    atomic_ns: float = 0.023         # per global atomic instruction of a lane, device-wide: a PRIOR, not fitted
    #                                  (module docstring, **atomics**; results/atomics-2026-12-07-s15/)
    inflight_reg_share: float = 1.0  # share of a thread's registers that can hold loads in flight
    ramp_us: float = 1.0             # per launch: first loads' latency and the last wave's drain
    event_us: float = 2.0            # per launch, in times taken with CUDA events only (not device time)
    reuse_window: float = 1.0        # 1: re-read sectors hit the L2 by the footprint of one wave, 0: of the tensor
    round_ns: float = 600.0          # per load round on a block's serial chain (a loaded DRAM round trip)
    barrier_ns: float = 20.0         # per block barrier on a block's serial chain (~40 cycles; not fitted)
    shfl_ns: float = 12.0            # per warp shuffle on a block's serial chain (~24 cycles; not fitted)
    spill_ns: float = 0.0            # per spill instruction (LDL / STL) of a compiled kernel, per wave (0: off)
    l2_request_ns: float = 4.0       # per warp-level scratch-load request and SM (the L2's request rate)
    flush_writeback: float = 0.0     # share of the L2 left dirty by the timing's L2 flush (fitting only; 0: off)
    sm_inflight_kib: float = 0.0     # most bytes in flight one SM's memory pipeline holds, KiB (0: no such limit)
    loaded_latency: float = 0.0      # DRAM latency's rise with the bandwidth drawn: x (1 + this x bw / copy) (0: off)
    reuse_tasks: float = 0.0         # 1: the reuse window in waves of tasks (x task_trips), 0: of blocks (as shipped)
    overlap_warps: float = 0.0       # resident warps per SM at which 1/e of the issue work stays exposed (0: off)
    overlap_tasks: float = 1.0       # the exposed issue work over task_trips ** this (1: a thread's tasks pipeline)
    l2_latency_ns: float = 0.0       # latency of an L2 hit: Little's law for every sector (0: the L2 has only a rate)
    phase_tasks: float = 0.0         # the phase term over task_trips ** this (0, as shipped; 1: phases of tasks overlap)
    store_bw_factor: float = 1.13    # a kernel without loads (a zero fill) streams at this x copy bandwidth: a PRIOR
    #                                  (module docstring, **memory**; 0: at the ceiling, bw_efficiency, as before)
    source: str = "defaults"
    provenance: Mapping[str, Any] = field(default_factory=dict)

    @classmethod
    def defaults(cls, device: Device) -> "Coefficients":
        return cls(device_key=device.key)

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["provenance"] = dict(self.provenance)
        return d

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "Coefficients":
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = set(d) - names
        if unknown:
            raise ValueError(f"cost coefficients have unknown fields: {sorted(unknown)}")
        return cls(**dict(d))


#: coefficients a fit may change, with bounds. Not fitted (2026-12-07, s11; chosen comparing leave-one-model-out
#: scores, so those scores are slightly optimistic: results/cost-fit-2026-12-07-s11/fit.md): ``sfu_cycles`` (16: a
#: MUFU op issues at 16 per SM and clock against 128 FP32 lanes, 8 lane-cycles, plus its range reduction; only
#: softmax_tiny_rows pins it, and fitted without that group it ran to 69 and mispredicted it), ``barrier_ns`` and
#: ``shfl_ns`` (latencies; fitted, they absorbed other terms the same way)
FIT_BOUNDS: dict[str, tuple[float, float]] = {
    "bw_efficiency": (0.3, 1.0),
    "dram_latency_ns": (200.0, 5000.0),
    "l2_bw_factor": (0.5, 10.0),
    "strided_bw_factor": (0.05, 10.0),
    "div_cycles": (0.5, 200.0),
    "smem_cycles": (0.1, 50.0),
    "cta_ns": (1.0, 2000.0),
    "phase_us": (0.001, 50.0),
    "scratch_load_ns": (10.0, 5000.0),
    "inflight_reg_share": (0.05, 1.0),
    "ramp_us": (0.01, 10.0),
    "event_us": (0.01, 20.0),
    "round_ns": (10.0, 5000.0),
    "l2_request_ns": (0.1, 200.0),
}
#: coefficients fitted only when a caller names them (``fit_coefficients(names=...)``): ``spill_ns`` needs rows
#: with compiled facts (scripts/fit_compiled_variants.py); the shipped model is fitted without them, spill term 0
#: ``sm_inflight_kib`` and ``loaded_latency`` (s14: the memory parallelism of small grids, the latency's rise with the
#: bandwidth drawn): scored by scripts/fit_terms.py, not shipped (results/cost-fit-2026-12-07-s14/README.md)
#: ``overlap_warps`` and ``l2_latency_ns`` (s15: the issue work few resident warps leave exposed beside memory, the
#: L2 hits' latency): scored by scripts/fit_order.py, not shipped (results/cost-fit-2026-12-07-s15-order/README.md)
OPTIONAL_BOUNDS: dict[str, tuple[float, float]] = {"spill_ns": (1.0, 5000.0), "flush_writeback": (0.01, 1.0),
                                                   "sm_inflight_kib": (1.0, 4096.0), "loaded_latency": (0.01, 20.0),
                                                   "overlap_warps": (0.5, 500.0), "l2_latency_ns": (20.0, 2000.0)}
#: where a fitted term is off in the base coefficients (0, as in :meth:`Coefficients.defaults`), the fit starts it
#: here (else it would start at its lower bound); the weak pull of the fit is towards this start
FIT_START: dict[str, float] = {"sm_inflight_kib": 32.0, "loaded_latency": 1.0, "overlap_warps": 16.0, "l2_latency_ns": 250.0}


_CACHE: dict[tuple[str, str, int | None], Coefficients] = {}


def _read(text: str, device: Device, where: str, fill: Coefficients | None = None) -> Coefficients | None:
    """The coefficients in ``text`` (None, logged, when unreadable or of another device); fields the file
    lacks (written by an older version) are ``fill``'s, else the defaults."""
    try:
        d = json.loads(text)
        if fill is not None and isinstance(d, dict):
            d = {**fill.to_dict(), **d}
        c = Coefficients.from_dict(d)
    except (ValueError, TypeError) as exc:
        log.warning("fitted cost coefficients for %s in %s unreadable (%s); not used", device.key, where, exc)
        return None
    if c.device_key and c.device_key != device.key:
        log.warning("%s holds coefficients of %s, not %s; not used", where, c.device_key, device.key)
        return None
    return c


def coefficients_for(device: Device) -> Coefficients:
    """The coefficients of ``device``: the user's (:func:`stitchtune.cost.fitted_store.user_path`, written by
    ``stitchtune calibrate``; a field it lacks is the package's) when that file exists and is readable, else
    the package's (written by
    ``scripts/fit_cost_model.py``), else the defaults. Cached per device and user file (path and
    modification time: a new calibration is read at the next call)."""
    user = user_path(device)
    try:
        mtime: int | None = user.stat().st_mtime_ns
    except OSError:
        mtime = None
    key = (device.key, str(user), mtime)
    if key in _CACHE:
        return _CACHE[key]
    c: Coefficients | None = None
    if mtime is not None:
        try:
            c = _read(user.read_text(encoding="utf-8"), device, str(user), fill=package_coefficients(device))
        except OSError as exc:
            log.warning("cannot read %s (%s); the package's coefficients used", user, exc)
    if c is None:
        try:
            text = resources.files("stitchtune.cost").joinpath(data_name(device)).read_text(encoding="utf-8")
            c = _read(text, device, "the package")
        except (FileNotFoundError, OSError):
            pass
    _CACHE[key] = c if c is not None else Coefficients.defaults(device)
    return _CACHE[key]


def package_coefficients(device: Device) -> Coefficients:
    """The package's coefficients of ``device`` (never the user's), else the defaults."""
    try:
        text = resources.files("stitchtune.cost").joinpath(data_name(device)).read_text(encoding="utf-8")
    except (FileNotFoundError, OSError):
        return Coefficients.defaults(device)
    return _read(text, device, "the package") or Coefficients.defaults(device)


def kernel_terms_us(f: KernelFeatures | Any, device: Device, c: Coefficients) -> dict[str, Any]:
    """The predicted terms (µs) of one launch: memory, issue, blocks, chain, l2_requests, exposed, body (= max of
    those five, plus exposed), phases,
    scratch, spills, grid_barriers, atomics, ramp; device time = body + the last six. ``f`` may also be any object with
    the :class:`KernelFeatures` fields as numpy arrays (many launches at once: the fit)."""
    sms = device.sm_count
    bps = np.maximum(f.blocks_per_sm, 1)
    copy = device.effective_copy_bandwidth_gbs()   # bytes per ns
    nb = np.minimum(f.grid, bps * sms)
    unique = np.maximum(np.asarray(f.unique_bytes, dtype=float), 1.0)
    waves_f = np.maximum(np.asarray(f.grid, dtype=float) / (bps * sms), 1e-9)
    # bytes between a read and its re-read: one wave of blocks, or with reuse_tasks 1 one wave of tasks (a block's
    # tasks run one after another: a persistent grid re-reads within a task)
    window = unique / (np.maximum(1.0, waves_f) * tasks_of(f) ** c.reuse_tasks) ** c.reuse_window
    hit = np.minimum(1.0, c.l2_keep * device.l2_bytes / window)
    regs = np.maximum(np.asarray(f.registers, dtype=float), 16.0)
    compiled = np.asarray(getattr(f, "compiled_bytes_in_flight", 0.0), dtype=float)
    walked = np.where(compiled > 0, compiled, f.bytes_in_flight_per_thread)
    bif = np.minimum(np.maximum(walked, 4.0), np.maximum(4.0, c.inflight_reg_share * 4.0 * regs))
    inflight = nb * f.block * np.maximum(f.active_lanes, 1.0 / 32) * bif   # bytes in flight, all SMs
    if c.sm_inflight_kib > 0:
        # memory parallelism per SM: the busy SMs (at most one per block) each hold at most sm_inflight_kib
        busy = np.minimum(np.asarray(f.grid, dtype=float), float(sms))
        inflight = np.minimum(inflight, busy * c.sm_inflight_kib * 1024.0)
    # Little's law; with loaded_latency a, latency L0 x (1 + a x bw / copy): bw = 2B / (L0 + sqrt(L0^2 + 4 a L0 B / copy))
    lat = c.dram_latency_ns
    little = 2.0 * inflight / (lat + np.sqrt(lat * lat + 4.0 * c.loaded_latency * lat * inflight / copy))
    # a kernel that loads nothing (a zero fill) waits on no round trip: its stores stream at the measured rate of
    # stores alone (store_bw_factor, a prior), or at the ceiling with store_bw_factor 0
    store_only = (walked <= 0) & (np.asarray(f.load_rounds, dtype=float) <= 0)
    little = np.where(store_only, np.inf, little)
    cap = np.where(store_only & (c.store_bw_factor > 0), c.store_bw_factor * copy, c.bw_efficiency * copy)
    bw = (cap ** -_SMOOTH_P + np.maximum(little, 1e-12) ** -_SMOOTH_P) ** (-1.0 / _SMOOTH_P)   # smooth minimum
    dram = unique + np.maximum(0.0, f.sector_bytes - unique) * (1.0 - hit)
    l2bw = c.l2_bw_factor * copy
    if c.l2_latency_ns > 0:
        # the L2's sectors are fetched by the same bytes in flight: Little's law at the L2 latency (a small grid's
        # re-reads that hit are still latency-bound)
        l2bw = (l2bw ** -_SMOOTH_P + np.maximum(inflight / c.l2_latency_ns, 1e-12) ** -_SMOOTH_P) ** (-1.0 / _SMOOTH_P)
    memory = np.maximum(np.maximum(dram / bw, f.sector_bytes / l2bw),
                        f.excess_sector_bytes / (c.strided_bw_factor * copy)) / 1000.0
    threads = np.asarray(f.grid, dtype=float) * f.block
    lane_us = device.fp32_lanes_per_sm * device.clock_mhz * sms          # lane-cycles per µs
    issue = (threads * (f.float_ops * c.flop_cycles + f.divisions * c.div_cycles + f.transcendentals * c.sfu_cycles)
             / lane_us + f.grid * f.smem_wavefronts * c.smem_cycles / (sms * device.clock_mhz))
    waves = np.ceil(f.grid / (bps * sms))
    blocks = f.grid / sms * c.cta_ns / 1000.0
    l2req = f.grid * np.asarray(getattr(f, "l2_requests", 0.0), dtype=float) / sms * c.l2_request_ns / 1000.0
    # the compiled code batches its loads into fewer rounds than the IR walk's groups: the same bytes per thread in
    # rounds of the compiled bytes in flight (only where the compiled code holds more than the walk's mean group)
    ir_bif = np.maximum(np.asarray(f.bytes_in_flight_per_thread, dtype=float), 4.0)
    batching = np.where(compiled > 0, np.minimum(1.0, ir_bif / np.maximum(compiled, 4.0)), 1.0)
    rounds = f.serial_rounds * batching
    chain = waves * (rounds * c.round_ns + f.barriers * c.barrier_ns + f.shuffles * c.shfl_ns) / 1000.0
    # the issue work that few resident warps leave exposed beside memory (overlap_warps; 0: all of it hidden)
    exposed = _exposed(memory, issue, chain, nb / sms * np.ceil(np.asarray(f.block, dtype=float) / 32.0),
                       tasks_of(f), c)
    return {
        "memory": memory, "issue": issue, "blocks": blocks, "chain": chain, "l2_requests": l2req, "exposed": exposed,
        "body": np.maximum(np.maximum(np.maximum(np.maximum(memory, issue), blocks), chain), l2req) + exposed,
        "phases": waves * np.maximum(0.0, f.load_phases - 1.0) * c.phase_us / bps / tasks_of(f) ** c.phase_tasks,
        "scratch": waves * f.scratch_loads * c.scratch_load_ns / 1000.0,
        "spills": waves * np.asarray(getattr(f, "spill_instructions", 0.0), dtype=float) * c.spill_ns / 1000.0,
        "grid_barriers": f.grid_barriers * (device.grid_barrier_base_us
                                            + device.grid_barrier_per_block_us * np.maximum(f.grid, 1)),
        "atomics": threads * f.atomics * c.atomic_ns / 1000.0,
        "ramp": c.ramp_us + 0.0 * threads,
    }


def tasks_of(f: Any) -> Any:
    """A launch's tasks per block (the walk's ``task_trips``, at least 1; 1 where the features lack it)."""
    return np.maximum(np.asarray(getattr(f, "task_trips", 1.0), dtype=float), 1.0)


#: the work the exposed term lays beside memory, by name (:data:`EXPOSED_OF` picks one): the issue work (as the
#: term is defined); the serial chain, and both: the other forms scripts/fit_order.py scored
#: (results/cost-fit-2026-12-07-s15-order/README.md)
EXPOSED_FORMS: dict[str, Callable[[Any, Any], Any]] = {
    "issue": lambda issue, chain: issue,
    "chain": lambda issue, chain: chain,
    "issue+chain": lambda issue, chain: issue + chain,
}
EXPOSED_OF = "issue"


def _exposed(memory: Any, issue: Any, chain: Any, warps: Any, tasks: Any, c: Coefficients) -> Any:
    """The part of the shorter of memory and the issue work that does not overlap with the other (µs): ``min(memory,
    issue) x exp(-warps / overlap_warps) / tasks ** overlap_tasks``. A warp computes while its own loads are
    not in flight; with few resident warps per SM (``warps``) the memory pipe idles meanwhile, unless a thread's
    next task's loads are issued before this task's work (nvcc hoists them across the task loop: ``tasks`` =
    the walk's ``task_trips``). 0 when ``overlap_warps`` is 0 (off)."""
    if c.overlap_warps <= 0:
        return 0.0 * memory
    return np.minimum(memory, EXPOSED_FORMS[EXPOSED_OF](issue, chain)) * np.exp(-warps / c.overlap_warps) / tasks ** c.overlap_tasks


def _device_us(t: Mapping[str, Any]) -> Any:
    return t["body"] + t["phases"] + t["scratch"] + t["spills"] + t["grid_barriers"] + t["atomics"] + t["ramp"]


def flush_us(row_bytes: Any, device: Device, c: Coefficients) -> Any:
    """The write-back (µs) of the dirty L2 lines the timing's flush leaves, during an event-timed run of
    ``row_bytes`` unique bytes: ``min(row_bytes, c.flush_writeback x L2) / (c.bw_efficiency x copy
    bandwidth)`` (each line the run brings in evicts one; 0 when ``flush_writeback`` is 0). Not device time."""
    cap = c.bw_efficiency * device.effective_copy_bandwidth_gbs()   # bytes per ns
    return np.minimum(np.asarray(row_bytes, dtype=float), c.flush_writeback * device.l2_bytes) / cap / 1000.0


def kernel_device_us(f: KernelFeatures, device: Device, c: Coefficients) -> float:
    """Predicted device time of one launch (µs, no launch term)."""
    return float(_device_us(kernel_terms_us(f, device, c)))


def columns(features: Sequence[KernelFeatures]) -> Any:
    """The numeric fields of ``features`` as numpy arrays (attributes named as the fields), for
    :func:`kernel_terms_us` / :func:`device_us_many` over many launches at once."""
    from types import SimpleNamespace

    names = [f.name for f in dataclasses.fields(KernelFeatures) if f.name not in ("name", "per_access")]
    return SimpleNamespace(**{n: np.array([float(getattr(x, n)) for x in features]) for n in names})


def device_us_many(cols: Any, device: Device, c: Coefficients) -> Any:
    """:func:`kernel_device_us` of every launch in ``cols`` (:func:`columns`), a numpy array."""
    return _device_us(kernel_terms_us(cols, device, c))


def device_time_us(features: Sequence[KernelFeatures], device: Device, coefficients: Coefficients | None = None) -> float:
    """Predicted device time of the launches (µs): the sum of :func:`kernel_device_us`."""
    c = coefficients or coefficients_for(device)
    return float(sum(kernel_device_us(f, device, c) for f in features))


def launch_us(features: Sequence[KernelFeatures], device: Device) -> float:
    """The host's launch cost of the launches (µs): ``device.launch_overhead_us`` each (not device time)."""
    return len(features) * float(device.launch_overhead_us)


def predict_program(program: kir.Program, device: Device, registers: Mapping[str, int] | None = None,
                    coefficients: Coefficients | None = None,
                    compiled: Mapping[str, CompiledFacts] | None = None) -> Prediction:
    """Legality as :func:`stitchtune.cost.model.predict`, time = predicted device time (no launch term).
    ``compiled`` (kernel name -> :class:`~stitchtune.cost.compiled.CompiledFacts`, after a build only): the
    compiled code's bytes in flight and spills are used, and its registers where ``registers`` lacks them."""
    regs_of = {**registers_of(compiled or {}), **dict(registers or {})}
    registers = regs_of or None
    limiter: dict[str, str] = {}
    for k in program.profile.kernels:
        occ, reason = kernel_legality(k, device, int(regs_of.get(k.name, k.est_registers)))
        if reason is not None:
            return Prediction(math.inf, (math.inf,) * len(program.launches), occ.occupancy, occ.limiter, reason)
        limiter[k.name] = occ.limiter
    if not program.launches:
        return Prediction(math.inf, (), 0.0, "none", "program has no kernels")
    c = coefficients or coefficients_for(device)
    feats = with_compiled(program_features(program, device, registers), compiled or {})
    times = tuple(kernel_device_us(f, device, c) for f in feats)
    slow = max(range(len(times)), key=times.__getitem__)
    return Prediction(float(sum(times)), times, feats[slow].occupancy, limiter.get(feats[slow].name, "none"), None)
