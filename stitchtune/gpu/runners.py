"""Runners: turn built programs into :class:`Measurement` values.

Contract (docs/INTERFACES.md, "Builder / Runner"):

* ``Runner.run(items) -> list[Measurement]``: one measurement per ``(program, build)`` item, in
  order. A candidate that faults, hangs or computes the wrong answer is *data*: status
  ``launch_error`` / ``timeout`` / ``wrong_result`` with the error text. Exceptions are bugs.
* Every output is checked against the numpy reference before any time counts: relative error
  ``||out - ref||_2 / ||ref||_2`` per output (max over outputs) below 1e-5 for float32 and 1e-2 for
  float16/bfloat16; any NaN or infinity where the reference is finite fails.
* ``estimated=True`` marks a time that was predicted (cost model), not measured on a GPU.

Implementations: :class:`EmulateRunner` (numpy SIMT emulator + cost-model time, CPU only),
:class:`FakeRunner` (programmable, for tests of search), and
:class:`stitchtune.gpu.runner.CudaRunner` (cuda-python on a real GPU, in a watchdog-guarded worker).
"""

from __future__ import annotations

import dataclasses
import logging
import math
import os
import threading
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, Protocol, runtime_checkable

import numpy as np

log = logging.getLogger(__name__)



class MeasureStatus(StrEnum):
    """How a run ended (``Measurement.status``; a member equals its string, as JSON and the database hold it)."""

    OK = "ok"
    LAUNCH_ERROR = "launch_error"
    TIMEOUT = "timeout"
    WRONG_RESULT = "wrong_result"


MEASURE_STATUSES: tuple[MeasureStatus, ...] = tuple(MeasureStatus)
TOLERANCE = {"float32": 1e-5, "float16": 1e-2, "bfloat16": 1e-2}
MAX_ERROR_CHARS = 4000


@dataclass(frozen=True)
class Measurement:
    """Result of running one program.

    ``median_us``: median time of the whole launch sequence (None unless ``ok``); ``samples_us``: all
    timed repetitions (empty for estimated times); ``max_rel_error``: worst relative error over the
    outputs (None when no output was produced); ``estimated``: the time is a prediction.
    """

    status: MeasureStatus   # a string naming one is turned into its member
    median_us: float | None = None
    samples_us: tuple[float, ...] = ()
    max_rel_error: float | None = None
    estimated: bool = False
    error: str = ""

    def __post_init__(self) -> None:
        if self.status not in MEASURE_STATUSES:
            raise ValueError(f"unknown measurement status {self.status!r}")
        object.__setattr__(self, "status", MeasureStatus(self.status))

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["samples_us"] = list(self.samples_us)
        return d

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Measurement:
        names = {f.name for f in dataclasses.fields(cls)}
        kw = {k: v for k, v in d.items() if k in names}
        kw["samples_us"] = tuple(float(x) for x in kw.get("samples_us", ()))
        return cls(**kw)


@runtime_checkable
class Runner(Protocol):
    """Runs a batch of built programs; one :class:`Measurement` per item, in order. ``close`` releases
    what the runner holds (a worker process, files); the runner is not used afterwards."""

    def run(self, items: list[tuple[Any, Any]]) -> list[Measurement]: ...

    def close(self) -> None: ...


# --------------------------------------------------------------------------------------------
# checking against the reference (shared with the CUDA worker: numpy only)


@dataclass(frozen=True)
class CheckResult:
    ok: bool
    max_rel_error: float | None
    error: str


def to_float64(arr: np.ndarray, dtype: str) -> np.ndarray:
    """Values of ``arr`` as float64; ``bfloat16`` may arrive as ml_dtypes.bfloat16 or as uint16 bits."""
    a = np.asarray(arr)
    if dtype == "bfloat16" and a.dtype == np.uint16:
        return (a.astype(np.uint32) << 16).view(np.float32).astype(np.float64)
    return a.astype(np.float64)


_CHUNK = 1 << 18  # elements per piece of the chunked comparison (2 MiB of float64 differences: cache-sized)
_local = threading.local()
_pool_lock = threading.Lock()
_pool: tuple[int, ThreadPoolExecutor] | None = None  # (pid that made it, pool), kept between checks


def _check_pool() -> ThreadPoolExecutor:
    """One thread pool per process for the pieces (made on first use; a forked child makes its own)."""
    global _pool
    with _pool_lock:
        if _pool is None or _pool[0] != os.getpid():
            _pool = (os.getpid(), ThreadPoolExecutor(max_workers=os.cpu_count() or 1,
                                                     thread_name_prefix="stitchtune-check"))
        return _pool[1]


def _error_sums(o: np.ndarray, r: np.ndarray) -> tuple[float, float] | None:
    """(sum of squared differences, sum of squared reference values) over one piece, or None when the
    piece has a non-finite output where the reference is finite, or a non-finite reference value that
    the output does not reproduce exactly."""
    o = o.astype(np.float64, copy=False)
    r = r.astype(np.float64, copy=False)
    finite = np.isfinite(r)
    if finite.all():
        if not np.isfinite(o).all():
            return None
        d = o - r
        return float(np.dot(d, d)), float(np.dot(r, r))
    if not np.all(np.isfinite(o[finite])):
        return None
    nf = ~finite
    if not np.array_equal(o[nf], r[nf], equal_nan=True):
        return None
    d = o[finite] - r[finite]
    return float(np.dot(d, d)), float(np.dot(r[finite], r[finite]))


def _piece_sums(o: np.ndarray, r: np.ndarray) -> tuple[float, float] | None:
    """:func:`_error_sums` of one piece, computed in one pass into a per-thread buffer when it can be:
    both sums finite means every reference and output value of the piece is finite (a NaN or infinity
    in either makes its sum NaN or infinite, and finite float32/float16 outputs cannot overflow a
    float64 sum of squares); anything else is decided by :func:`_error_sums`."""
    if o.dtype.kind != "f" or r.dtype.kind != "f":  # e.g. ml_dtypes.bfloat16: widen it first
        return _error_sums(o, r)
    buf = getattr(_local, "buf", None)
    if buf is None or buf.size < o.size:
        buf = _local.buf = np.empty(max(o.size, _CHUNK), dtype=np.float64)
    d = buf[: o.size]
    with np.errstate(all="ignore"):
        np.subtract(o, r, out=d, dtype=np.float64)  # the same values as o.astype(float64) - r
        dd = float(np.dot(d, d))
        rr = float(np.dot(r, r))
    if math.isfinite(dd) and math.isfinite(rr):
        return dd, rr
    return _error_sums(o, r)


def relative_error(out: np.ndarray, ref: np.ndarray) -> float:
    """``||out - ref|| / ||ref||`` (2-norms, float64); ``inf`` if ``out`` has NaN/inf where ``ref`` is finite.

    Large arrays are compared in cache-sized pieces on a thread pool (numpy releases the GIL), one
    pass per piece, so checking a 256 MiB output costs a fraction of a second on a many-core host."""
    o = np.asarray(out).ravel()
    r = np.asarray(ref).ravel()
    if o.shape != r.shape:
        return float("inf")
    if o.size <= _CHUNK:
        parts = [_piece_sums(o, r)]
    else:
        bounds = [(i, min(i + _CHUNK, o.size)) for i in range(0, o.size, _CHUNK)]
        parts = list(_check_pool().map(lambda b: _piece_sums(o[b[0]:b[1]], r[b[0]:b[1]]), bounds))
    sums = [p for p in parts if p is not None]
    if len(sums) < len(parts):
        return float("inf")
    diff = math.sqrt(sum(p[0] for p in sums))
    denom = math.sqrt(sum(p[1] for p in sums))
    if denom == 0.0:
        return diff  # all-zero reference: absolute error
    return diff / denom


#: graph dtypes whose outputs must equal the reference exactly
EXACT_DTYPES = frozenset({"int32", "int64", "bool"})


def check_outputs(
    outputs: Mapping[str, np.ndarray],
    expected: Mapping[str, np.ndarray],
    dtypes: Mapping[str, str],
) -> CheckResult:
    """Compare every expected output: int and bool outputs (:data:`EXACT_DTYPES`) exactly, float ones
    within the tolerance of their graph dtype."""
    worst = 0.0
    problems = []
    for name, ref in expected.items():
        if name not in outputs:
            problems.append(f"output {name!r} missing")
            worst = float("inf")
            continue
        dt = dtypes.get(name, "float32")
        raw = np.asarray(outputs[name])
        # bfloat16 bits -> float32 values; other dtypes are widened piecewise inside relative_error
        out = (raw.astype(np.uint32) << 16).view(np.float32) if dt == "bfloat16" and raw.dtype == np.uint16 \
            else raw
        if out.size != np.asarray(ref).size:
            problems.append(f"output {name!r} has {out.size} elements, expected {np.asarray(ref).size}")
            worst = float("inf")
            continue
        if np.asarray(ref).size and not np.isfinite(np.asarray(ref)).any():
            problems.append(f"output {name!r}: the reference has no finite value, so the check cannot tell "
                            "a right result from a wrong one (inputs outside an op's domain?)")
            worst = float("inf")
            continue
        if dt in EXACT_DTYPES:   # int and bool values are right or wrong: no tolerance
            n_diff = int(np.count_nonzero(out.reshape(np.shape(ref)).astype(np.int64) != np.asarray(ref).astype(np.int64)))
            if n_diff:
                problems.append(f"output {name!r} ({dt}): {n_diff} value(s) differ from the reference (exact)")
                worst = float("inf")
            continue
        err = relative_error(out.reshape(np.shape(ref)), ref)
        worst = max(worst, err)
        tol = TOLERANCE.get(dt, 1e-5)
        if not err < tol:
            n_bad = int(np.count_nonzero(~np.isfinite(out)))
            what = f"{n_bad} non-finite values" if n_bad else f"relative error {err:.3g}"
            problems.append(f"output {name!r} ({dt}): {what} (tolerance {tol:g})")
    return CheckResult(not problems, worst if expected else None, "; ".join(problems))


def clip_error(text: str) -> str:
    text = text.strip()
    return text if len(text) <= MAX_ERROR_CHARS else text[:MAX_ERROR_CHARS] + " ...[truncated]"


def reference_outputs(graph: Any, inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The numpy reference's value for each graph output (float64)."""
    from stitchtune.graph.reference import run_reference

    ref = run_reference(graph, dict(inputs))
    if isinstance(ref, Mapping):
        return {o: np.asarray(ref[o], dtype=np.float64) for o in graph.outputs}
    return {o: np.asarray(r, dtype=np.float64) for o, r in zip(graph.outputs, ref, strict=True)}


def output_dtypes(graph: Any) -> dict[str, str]:
    return {o: graph.spec(o).dtype for o in graph.outputs}


# --------------------------------------------------------------------------------------------
# emulator backend


class EmulateRunner:
    """Checks each program with the numpy SIMT emulator; the time is the fitted cost model's prediction
    (:func:`stitchtune.cost.fitted.predict_program`, device time, the same model the search prunes with),
    made with what the build says: ptxas' registers and, where the cubin can be read in SASS, its compiled
    facts (``compiled_facts(build) -> {kernel: CompiledFacts} | None``, default the process's
    :func:`stitchtune.gpu.build_facts.shared_reader`, which reads each cubin once and returns None without
    cuobjdump: the time is then predicted from the IR features, as the pipeline's ``predicted_from`` says).

    Inputs are ``random_inputs(graph, seed)`` (``graph`` should be a small variant: the emulator
    runs every thread). An :class:`~stitchtune.emulate.emulator.EmulatorFault` (out of bounds, unwritten
    read, race, grid-barrier deadlock) becomes ``launch_error`` with the fault's text. Every
    measurement has ``estimated=True`` and empty ``samples_us``.
    ``emulate``/``predict`` (``predict(program, device, registers=None, compiled=None)``)/``compiled_facts``/
    ``inputs``/``expected`` can be
    injected (tests; ``fault_types`` then
    lists the exceptions that mean "the kernel faulted"); by default the real modules are used.
    """

    def __init__(
        self,
        graph: Any,
        device: Any,
        seed: int = 0,
        *,
        emulate: Callable[..., Mapping[str, np.ndarray]] | None = None,
        predict: Callable[..., Any] | None = None,
        inputs: Mapping[str, np.ndarray] | None = None,
        expected: Mapping[str, np.ndarray] | None = None,
        fault_types: tuple[type[BaseException], ...] = (),
        compiled_facts: Callable[[Any], Mapping[str, Any] | None] | None = None,
    ) -> None:
        self.graph = graph
        self.fault_types = tuple(fault_types)
        self.device = device
        self.seed = seed
        if inputs is None:
            from stitchtune.graph.reference import random_inputs

            inputs = random_inputs(graph, seed)
        self.inputs = dict(inputs)
        self.expected = dict(expected) if expected is not None else reference_outputs(graph, self.inputs)
        self.dtypes = output_dtypes(graph)
        self._emulate = emulate
        self._predict = predict
        self._compiled_facts = compiled_facts

    def _fns(self) -> tuple[Callable[..., Any], Callable[..., Any], tuple[type[BaseException], ...]]:
        emulate: Callable[..., Any] | None = self._emulate
        predict: Callable[..., Any] | None = self._predict
        faults = self.fault_types
        if emulate is None:
            from stitchtune.emulate.emulator import EmulatorFault, emulate_program

            emulate, faults = emulate_program, (*faults, EmulatorFault)
        if predict is None:
            from stitchtune.cost.fitted import predict_program

            predict = predict_program
        return emulate, predict, faults

    def _facts(self, build: Any) -> Mapping[str, Any] | None:
        """The compiled facts of ``build`` (None: predict from the IR features)."""
        if self._compiled_facts is None:
            from stitchtune.gpu.build_facts import shared_reader

            self._compiled_facts = shared_reader()
        return self._compiled_facts(build) or None

    def coresident_limit(self, program: Any, build: Any) -> Callable[[Any], int]:
        """``kernel -> blocks that fit on the device at once`` (the emulator's grid-barrier check),
        from ptxas' register counts when the build has them, else lowering's estimate."""
        return emulator_limits(self.device, program, _build_registers(build))[0]

    def close(self) -> None:
        """Nothing to release (the emulator runs in this process)."""

    def run(self, items: list[tuple[Any, Any]]) -> list[Measurement]:
        emulate, predict, faults = self._fns()
        out = []
        for program, build in items:
            try:
                limit, climit = emulator_limits(self.device, program, _build_registers(build))
                outputs = emulate(program, self.inputs, coresident_limit=limit, cluster_limit=climit)
            except faults as exc:
                out.append(Measurement(MeasureStatus.LAUNCH_ERROR, estimated=True, error=clip_error(f"emulator fault: {exc}")))
                continue
            chk = check_outputs(outputs, self.expected, self.dtypes)
            if not chk.ok:
                out.append(Measurement(MeasureStatus.WRONG_RESULT, max_rel_error=chk.max_rel_error, estimated=True,
                                       error=clip_error(chk.error)))
                continue
            regs = dict(getattr(build, "registers", None) or {}) if getattr(build, "status", "ok") == "ok" else {}
            pred = predict(program, self.device, registers=regs or None, compiled=self._facts(build))
            out.append(Measurement(MeasureStatus.OK, median_us=float(pred.time_us), samples_us=(),
                                   max_rel_error=chk.max_rel_error, estimated=True))
        return out


# --------------------------------------------------------------------------------------------
# fake backend (tests of search / pipeline)


class FakeRunner:
    """Programmable runner for tests.

    ``statuses`` are consumed in order (cycled); ``time_fn(program) -> us`` (default: ``times_us``
    cycled) gives the time of an ``ok`` item. Non-ok items carry ``error="fake <status>"``.
    ``calls`` records every item run.
    """

    def __init__(
        self,
        statuses: Sequence[str] = ("ok",),
        times_us: Sequence[float] = (10.0,),
        time_fn: Callable[[Any], float] | None = None,
        estimated: bool = True,
    ) -> None:
        for s in statuses:
            if s not in MEASURE_STATUSES:
                raise ValueError(f"unknown measurement status {s!r}")
        self.statuses = list(statuses)
        self.times_us = list(times_us)
        self.time_fn = time_fn
        self.estimated = estimated
        self.calls: list[tuple[Any, Any]] = []
        self._i = 0

    def close(self) -> None:
        """Nothing to release."""

    def run(self, items: list[tuple[Any, Any]]) -> list[Measurement]:
        out = []
        for program, build in items:
            self.calls.append((program, build))
            status = self.statuses[self._i % len(self.statuses)]
            t = self.time_fn(program) if self.time_fn else self.times_us[self._i % len(self.times_us)]
            self._i += 1
            if status == MeasureStatus.OK:
                out.append(Measurement(MeasureStatus.OK, median_us=float(t), samples_us=(float(t),), max_rel_error=0.0,
                                       estimated=self.estimated))
            else:
                out.append(Measurement(MeasureStatus(status), estimated=self.estimated, error=f"fake {status}"))
        return out


def _build_registers(build: Any) -> dict[str, int]:
    """ptxas' registers per kernel of a successful build (empty otherwise)."""
    return dict(getattr(build, "registers", None) or {}) if getattr(build, "status", "") == "ok" else {}


def emulator_limits(device: Any, program: Any, registers: Mapping[str, int | None]
                    ) -> tuple[Callable[[Any], int], Callable[[Any], int]]:
    """The emulator's residency checks for ``program`` on ``device``: ``kernel -> blocks resident at
    once`` (grid barriers) and ``kernel -> clusters resident at once`` (cluster kernels), from
    ``registers`` (ptxas' counts by kernel name, where known) else lowering's estimate (else 32)."""
    from stitchtune.hardware.occupancy import max_active_clusters, max_resident_blocks

    est = {k.name: k.est_registers for k in getattr(program.profile, "kernels", ())}

    def regs(kernel: Any) -> int:
        return int(registers.get(kernel.name) or est.get(kernel.name) or 32)

    def limit(kernel: Any) -> int:
        return max_resident_blocks(device, kernel.block, regs(kernel), int(kernel.smem_bytes))

    def climit(kernel: Any) -> int:
        return max_active_clusters(device, kernel.block, regs(kernel), int(kernel.smem_bytes), kernel.cluster)

    return limit, climit
