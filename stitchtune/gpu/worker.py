"""The CUDA worker process: measures programs on the GPU (cuda-python) or on a numpy stand-in (fake).

Contract
--------
* :func:`worker_entry` is the worker's entry point (started by :class:`stitchtune.gpu.runner.CudaRunner`
  as ``python -c``); :func:`_serve` speaks the protocol written in its docstring over the inherited
  socket, sending a heartbeat after every synchronised launch sequence. A CUDA error (illegal address,
  bad launch configuration, module load failure) is answered as a ``launch_error`` result with the
  driver's text and the worker exits (the context may be dead). The worker dies with its parent, even
  while stuck in a hung kernel.
* Per graph (once per worker start, restarts included): the problem (inputs and float64 reference
  outputs) is mapped read-only from the runner's files (:class:`~stitchtune.gpu.problem.ProblemFiles`,
  descriptors inherited from the parent; nothing large travels through the socket), inputs are
  uploaded, outputs allocated, two host buffers per output are allocated for the downloads
  (page-locked when the driver can, reused by every program), and an L2 flush buffer of twice the L2
  size. Per program (:func:`_measure`): scratch buffers with ``zero_init`` are zeroed once before the
  first launch (others are poisoned with 0xFF), outputs are poisoned (0xFF bytes = NaN in every float
  type), the launch sequence runs once and every output is downloaded and checked against the float64
  reference (``wrong_result`` with the error before any time counts); then ``warmup`` untimed runs,
  then ``repeats`` timed runs: outputs poisoned, L2 flushed (memset, not timed), CUDA events around
  the whole launch sequence. Outputs are downloaded again after the last repetition and must be
  bit-identical to the checked first ones, else they are checked against the reference again
  (catches programs whose scratch is not reusable across launches). ``median_us`` and all
  ``samples_us`` are returned. After a program that is not ``ok`` the inputs are uploaded again.
* Programs are loaded, their scratch initialised, bound and launched by the one launch path,
  :class:`stitchtune.gpu.launch.Launcher` (dynamic shared memory above 48 KiB opted in there); memory,
  copies, memsets and events go through the same :class:`~stitchtune.gpu.driver.Driver`.
  :class:`_DriverBackend` (backend ``cuda``) is that over :func:`~stitchtune.gpu.worker_driver.worker_driver`
  (cuda-python, or pycuda with ``$STITCHTUNE_CUDA_DRIVER=pycuda`` or when cuda-python is missing;
  imported only in the worker; the primary context of GPU ``STITCHTUNE_CUDA_DEVICE``, default 0,
  current on the worker's thread); a :class:`~stitchtune.gpu.driver.DriverError` is a launch error. Tests run it over the
  :class:`~stitchtune.gpu.fake_driver.FakeDriver`. bfloat16 arrays travel as uint16 views.
* :class:`_FakeBackend` runs the same protocol with a numpy stand-in for the GPU, so the watchdog/restart
  logic is tested without one. A fake "cubin" is ``b"FAKE:<mode>[:<time_us>]"`` with mode ``ok``
  (writes the reference), ``wrong``, ``nan`` (writes nothing), ``hang`` (sleeps forever), ``fault``
  (raises a launch error), ``crash`` (the worker process dies), ``once`` (right only on the first
  launch). Its launches and poisonings only record what the outputs hold; a download writes those
  bytes (encoded once per worker), so the fake costs the host what a GPU would, not more.
"""

from __future__ import annotations

import multiprocessing.connection
import os
import statistics
import threading
import time
import traceback
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from stitchtune.gpu.driver import DEVICE_ENV, Driver, DriverError
from stitchtune.gpu.launch import POISON, Bound, LaunchPlan, Launcher
from stitchtune.gpu.problem import Problem, ProblemFiles
from stitchtune.gpu.runners import check_outputs

__all__ = ["DEVICE_ENV", "WorkerLaunchError", "worker_entry"]


class WorkerLaunchError(Exception):
    """A CUDA error inside the worker (the context may be unusable)."""


class _DriverBackend:
    """The GPU through a :class:`~stitchtune.gpu.driver.Driver` (cuda-python in the worker; the
    :class:`~stitchtune.gpu.fake_driver.FakeDriver` in tests), programs through
    :class:`~stitchtune.gpu.launch.Launcher`. Everything runs on the legacy default stream (0)."""

    def __init__(self, problem: Problem, driver: Driver) -> None:
        self.drv = driver
        self.host_inputs = problem.inputs
        self.inputs: dict[str, int] = {}
        self.outputs: dict[str, int] = {}
        self.launcher: Launcher | None = None
        self.bound: Bound | None = None
        self.out_nbytes = {n: problem.output_nbytes(n) for n in problem.expected}
        self.inputs = {name: driver.mem_alloc(arr.nbytes) for name, arr in problem.inputs.items()}
        self.restore_inputs()
        self.outputs = {n: driver.mem_alloc(nb) for n, nb in self.out_nbytes.items()}
        self.host_out = [{n: self._host_buffer(nb) for n, nb in self.out_nbytes.items()} for _ in range(2)]
        self.flush_nbytes = max(2 * int(driver.attribute("L2_CACHE_SIZE")), 1 << 20)
        self.flush_buf = driver.mem_alloc(self.flush_nbytes)
        self.start, self.end = driver.event_create(), driver.event_create()
        self._flush_value = 0

    def _host_buffer(self, nbytes: int) -> np.ndarray:
        """A download buffer: page-locked (faster copies, no page faults per program) when it can be."""
        try:
            return self.drv.host_empty(nbytes)
        except DriverError:  # pinned memory is an optimisation: pageable works too
            return np.empty(nbytes, dtype=np.uint8)

    def restore_inputs(self) -> None:
        """(Re-)upload the inputs (after a candidate that may have scribbled over them)."""
        for name, arr in self.host_inputs.items():
            self.drv.memcpy_htod(self.inputs[name], arr)

    def info(self) -> dict[str, Any]:
        return self.drv.info()

    def is_launch_error(self, exc: BaseException) -> bool:
        return isinstance(exc, DriverError)

    def load(self, cubin: bytes, plan: LaunchPlan) -> None:
        self.launcher = Launcher(self.drv, plan, cubin)
        self.bound = self.launcher.bind({**self.inputs, **self.outputs})

    def init_scratch(self) -> None:
        assert self.launcher is not None
        self.launcher.init_scratch(0)

    def poison_outputs(self) -> None:
        for name, ptr in self.outputs.items():
            self.drv.memset_d8(ptr, POISON, self.out_nbytes[name], 0)

    def launch_all(self) -> None:
        assert self.launcher is not None and self.bound is not None
        self.launcher.launch(self.bound, 0)

    def sync(self) -> None:
        self.drv.synchronize()

    def flush_l2(self) -> None:
        self._flush_value ^= 0x5A  # a different value each time: no chance of a no-op memset
        self.drv.memset_d8(self.flush_buf, self._flush_value, self.flush_nbytes, 0)

    def time_launches(self) -> float:
        self.drv.event_record(self.start, 0)
        self.launch_all()
        self.drv.event_record(self.end, 0)
        self.drv.event_synchronize(self.end)
        return self.drv.event_elapsed_ms(self.start, self.end) * 1000.0

    def read_outputs(self, slot: int = 0) -> dict[str, np.ndarray]:
        """Download every output into host buffer set ``slot`` (0 or 1; valid until the next read of it)."""
        bufs = self.host_out[slot]
        for name, ptr in self.outputs.items():
            self.drv.memcpy_dtoh(bufs[name], ptr)
        return dict(bufs)

    def unload(self) -> None:
        if self.launcher is not None:
            self.launcher.close()
        self.launcher, self.bound = None, None

    def close(self) -> None:
        try:
            self.drv.close()
        except DriverError:
            pass


class _FakeBackend:
    """A numpy stand-in for the GPU, to test the worker protocol on CPU (see module docstring)."""

    def __init__(self, problem: Problem) -> None:
        self.problem = problem
        self.out_nbytes = {n: problem.output_nbytes(n) for n in problem.expected}
        self.host_out = [{n: np.empty(nb, dtype=np.uint8) for n, nb in self.out_nbytes.items()} for _ in range(2)]
        self.held = "poison"  # what the stand-in device outputs hold: poison | right | wrong
        self._bytes: dict[str, dict[str, np.ndarray]] = {}  # encoded outputs per state, made once
        self.mode = "ok"
        self.time_us = 1.0
        self.launches = 0

    def info(self) -> dict[str, Any]:
        return {"backend": "fake", "name": "fake device", "cc": "9.0", "sm_count": 1, "l2_bytes": 0,
                "driver_version": 0}

    def is_launch_error(self, exc: BaseException) -> bool:
        return isinstance(exc, WorkerLaunchError)

    def load(self, cubin: bytes, plan: LaunchPlan) -> None:
        parts = cubin.decode("ascii", "replace").split(":")
        if parts[0] != "FAKE" or len(parts) < 2:
            raise WorkerLaunchError("fake backend: not a fake cubin")
        self.mode = parts[1]
        self.time_us = float(parts[2]) if len(parts) > 2 else 1.0
        self.launches = 0

    def init_scratch(self) -> None:
        pass

    def restore_inputs(self) -> None:
        pass

    def poison_outputs(self) -> None:
        self.held = "poison"

    def _encode(self, name: str, values: np.ndarray) -> np.ndarray:
        dt = self.problem.output_dtypes[name]
        if dt == "bfloat16":
            import ml_dtypes

            return values.astype(ml_dtypes.bfloat16).view(np.uint8).ravel()
        return values.astype(dt).view(np.uint8).ravel()

    def launch_all(self) -> None:
        self.launches += 1
        mode = self.mode
        if mode == "hang":
            while True:
                time.sleep(3600)
        if mode == "fault":
            raise WorkerLaunchError("fake: an illegal memory access was encountered")
        if mode == "crash":
            os._exit(17)
        if mode == "nan":
            return
        self.held = "wrong" if mode == "wrong" or (mode == "once" and self.launches > 1) else "right"

    def sync(self) -> None:
        pass

    def flush_l2(self) -> None:
        pass

    def time_launches(self) -> float:
        self.launch_all()
        return self.time_us

    def read_outputs(self, slot: int = 0) -> dict[str, np.ndarray]:
        bufs = self.host_out[slot]
        if self.held == "poison":
            for b in bufs.values():
                b.fill(0xFF)
            return dict(bufs)
        if self.held not in self._bytes:
            self._bytes[self.held] = {n: self._encode(n, ref + 1.0 if self.held == "wrong" else ref)
                                      for n, ref in self.problem.expected.items()}
        for n, b in bufs.items():
            np.copyto(b, self._bytes[self.held][n])
        return dict(bufs)

    def unload(self) -> None:
        pass

    def close(self) -> None:
        pass


def _decode_outputs(raw: Mapping[str, np.ndarray], dtypes: Mapping[str, str]) -> dict[str, np.ndarray]:
    out = {}
    for name, b in raw.items():
        dt = dtypes[name]
        out[name] = b.view(np.uint16) if dt == "bfloat16" else b.view(np.dtype(dt))
    return out


def _same_bytes(a: np.ndarray, b: np.ndarray) -> bool:
    """Byte equality of two 1-D uint8 buffers, compared in 8-byte words where the size allows."""
    if a.nbytes != b.nbytes:
        return False
    dt = np.uint64 if a.nbytes % 8 == 0 else np.uint32 if a.nbytes % 4 == 0 else np.uint8
    return bool(np.array_equal(a.view(dt), b.view(dt)))


def _measure(backend: Any, cubin: bytes, plan: LaunchPlan, problem: Problem, repeats: int, warmup: int,
             beat: Callable[[], None]) -> dict[str, Any]:
    """Check, warm up and time one program (runs inside the worker). Returns Measurement fields."""
    backend.load(cubin, plan)
    try:
        backend.init_scratch()
        backend.poison_outputs()
        backend.launch_all()
        backend.sync()
        beat()
        first = backend.read_outputs(0)
        chk = check_outputs(_decode_outputs(first, problem.output_dtypes), problem.expected, problem.output_dtypes)
        if not chk.ok:
            return {"status": "wrong_result", "max_rel_error": chk.max_rel_error, "error": chk.error}
        for _ in range(warmup):
            backend.launch_all()
            backend.sync()
            beat()
        samples = []
        for _ in range(repeats):
            backend.poison_outputs()
            backend.flush_l2()
            samples.append(backend.time_launches())
            beat()
        last = backend.read_outputs(1)
        # the kernels are deterministic (no atomics in reductions): outputs bit-identical to the checked
        # first ones need no second float64 comparison with the reference
        same = set(last) == set(first) and all(_same_bytes(last[n], first[n]) for n in first)
        chk2 = chk if same else check_outputs(_decode_outputs(last, problem.output_dtypes), problem.expected,
                                              problem.output_dtypes)
        if not chk2.ok:
            return {"status": "wrong_result", "max_rel_error": chk2.max_rel_error,
                    "error": f"after {warmup + repeats + 1} launches (scratch not reusable?): {chk2.error}"}
        worst = max(x for x in (chk.max_rel_error, chk2.max_rel_error) if x is not None) \
            if problem.expected else None
        return {"status": "ok", "median_us": float(statistics.median(samples)) if samples else None,
                "samples_us": tuple(samples), "max_rel_error": worst}
    finally:
        backend.unload()


def _make_backend(name: str, problem: Problem) -> Any:
    """``cuda``: :class:`_DriverBackend` over :func:`~stitchtune.gpu.worker_driver.worker_driver` (cuda-python or
    pycuda) on GPU ``$STITCHTUNE_CUDA_DEVICE``; ``fake``: :class:`_FakeBackend`."""
    if name == "fake":
        return _FakeBackend(problem)
    from stitchtune.gpu.worker_driver import worker_driver

    return _DriverBackend(problem, worker_driver(int(os.environ.get(DEVICE_ENV, "0"))))


def _serve(conn: multiprocessing.connection.Connection) -> None:
    """Worker protocol. Child sends ("hello",); parent sends ("setup", backend, problem, repeats,
    warmup) where problem is a :class:`ProblemFiles` (mapped here; descriptors inherited) or a
    :class:`Problem`; child answers ("ready", info) or ("fatal", traceback). Then per item the parent sends
    ("run", cubin, plan) and the child answers ("beat",)* then ("result", fields, restart) or
    ("crash", traceback); ("stop",) or a closed connection ends the worker."""
    conn.send(("hello",))
    try:
        _, backend_name, problem, repeats, warmup = conn.recv()
    except EOFError:
        return
    try:
        if isinstance(problem, ProblemFiles):
            problem = problem.open()
        backend = _make_backend(backend_name, problem)
        conn.send(("ready", backend.info()))
    except BaseException:  # noqa: BLE001 - reported to the parent, which raises ToolchainError
        conn.send(("fatal", traceback.format_exc(limit=5)))
        return

    def beat() -> None:
        conn.send(("beat",))

    try:
        while True:
            try:
                msg = conn.recv()
            except EOFError:
                return
            if msg[0] == "stop":
                return
            _, cubin, plan = msg
            try:
                fields = _measure(backend, cubin, plan, problem, repeats, warmup, beat)
            except Exception as exc:  # noqa: BLE001 - classified below
                if backend.is_launch_error(exc):
                    conn.send(("result", {"status": "launch_error", "error": f"{type(exc).__name__}: {exc}"},
                               True))
                    return  # the context may be dead: the parent starts a fresh worker
                conn.send(("crash", traceback.format_exc(limit=8)))
                return
            if fields["status"] != "ok":
                backend.restore_inputs()  # a wrong program may have written over them
            conn.send(("result", fields, False))
    finally:
        backend.close()


def _exit_with_parent() -> None:
    """Die when the parent dies, even while the main thread is stuck in a hung kernel
    (an orphaned worker would otherwise spin on the GPU forever)."""
    ppid = os.getppid()

    def watch() -> None:
        while True:
            time.sleep(0.5)
            if os.getppid() != ppid:
                os._exit(3)

    threading.Thread(target=watch, name="parent-watch", daemon=True).start()


def worker_entry(fd: int) -> None:
    """Entry point of the worker process (``python -c``): serve on the inherited socket ``fd``."""
    _exit_with_parent()
    conn = multiprocessing.connection.Connection(fd)
    try:
        _serve(conn)
    finally:
        conn.close()
