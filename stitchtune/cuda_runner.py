"""The real runner: pycuda in one worker process that owns the GPU, guarded by a watchdog.

Contract
--------
* :func:`cuda_available` is True when pycuda imports and finds a GPU (checked in a short
  subprocess, cached); it never raises.
* :class:`CudaRunner` implements ``Runner.run(items) -> list[Measurement]``. Per item it sends the
  cubin bytes and a plain-data :class:`LaunchPlan` to the worker and waits. The worker sends a
  heartbeat after every synchronised launch sequence; ``timeout_s`` without one means a kernel
  hangs (e.g. a grid barrier whose blocks are not co-resident): the worker is killed, the item is
  ``timeout``, and the next item starts a fresh worker. A CUDA error (illegal address, bad launch
  configuration, module load failure) is ``launch_error`` with the driver's text; the worker then
  exits (the context may be dead) and is restarted for the next item.
* Inside the worker, per graph (once per worker start): inputs are uploaded
  (``random_inputs(graph, seed)``, random normal, never zeros), outputs allocated, and an L2 flush
  buffer of twice the L2 size is allocated. Per program: scratch buffers with ``zero_init`` are
  zeroed once before the first launch (others are poisoned with 0xFF), outputs are poisoned (0xFF
  bytes = NaN in every float type), the launch sequence runs once and every output is checked
  against the numpy reference (``wrong_result`` with the error before any time counts); then
  ``warmup`` untimed runs, then ``repeats`` timed runs: outputs poisoned, L2 flushed (memset, not
  timed), CUDA events around the whole launch sequence. Outputs are checked again after the last
  repetition (catches programs whose scratch is not reusable across launches). ``median_us`` and
  all ``samples_us`` are kept; ``estimated=False``.
* Dynamic shared memory above 48 KiB sets ``MAX_DYNAMIC_SHARED_SIZE_BYTES`` on the function.
* pycuda is imported only inside the worker. bfloat16 arrays travel as uint16 views.
* ``backend="fake"`` (or ``STITCHTUNE_CUDA_BACKEND=fake``) runs the same worker protocol with a numpy
  stand-in for the GPU, so the watchdog/restart logic is tested without one. A fake "cubin" is
  ``b"FAKE:<mode>[:<time_us>]"`` with mode ``ok`` (writes the reference), ``wrong``, ``nan``
  (writes nothing), ``hang`` (sleeps forever), ``fault`` (raises a launch error), ``crash``
  (the worker process dies), ``once`` (right only on the first launch).
"""

from __future__ import annotations

import functools
import importlib.util
import logging
import multiprocessing.connection
import os
import signal
import socket
import statistics
import subprocess
import sys
import threading
import time
import traceback
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from stitchtune.errors import ToolchainError
from stitchtune.runners import (
    Measurement,
    check_outputs,
    clip_error,
    output_dtypes,
    reference_outputs,
)

log = logging.getLogger(__name__)

BACKEND_ENV = "STITCHTUNE_CUDA_BACKEND"
DEVICE_ENV = "STITCHTUNE_CUDA_DEVICE"
DEFAULT_SMEM_LIMIT = 48 * 1024
ELEM_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2}


# --------------------------------------------------------------------------------------------
# availability


_PROBE = (
    "import sys\n"
    "import pycuda.driver as d\n"
    "d.init()\n"
    "sys.exit(0 if d.Device.count() > 0 else 3)\n"
)


def _child_pythonpath() -> str:
    """Our ``sys.path`` for a child interpreter, so it imports the same stitchtune and pycuda."""
    return os.pathsep.join(p or os.getcwd() for p in sys.path)


@functools.lru_cache(maxsize=1)
def cuda_available() -> bool:
    """True when pycuda imports and sees at least one GPU. Never raises; cached per process."""
    try:
        if importlib.util.find_spec("pycuda") is None:
            return False
        env = dict(os.environ)
        env["PYTHONPATH"] = _child_pythonpath()
        proc = subprocess.run(  # noqa: S603 - fixed program text, no user input
            [sys.executable, "-c", _PROBE], capture_output=True, timeout=120, env=env, check=False
        )
        if proc.returncode != 0:
            log.debug("no usable GPU: %s", proc.stderr.decode("utf-8", "replace")[-500:])
        return proc.returncode == 0
    except Exception as exc:  # noqa: BLE001 - contract: never raises
        log.debug("cuda_available probe failed: %s", exc)
        return False


# --------------------------------------------------------------------------------------------
# plain-data launch plan (what travels to the worker)


@dataclass(frozen=True)
class PlanBuffer:
    """One global buffer: ``tensor`` names the graph input/output it is bound to ('' for scratch)."""

    name: str
    dtype: str
    nbytes: int
    role: str
    zero_init: bool
    tensor: str


@dataclass(frozen=True)
class PlanLaunch:
    kernel: str
    grid: tuple[int, int, int]
    block: tuple[int, int, int]
    smem_bytes: int
    args: tuple[str, ...]


@dataclass(frozen=True)
class LaunchPlan:
    buffers: tuple[PlanBuffer, ...]
    launches: tuple[PlanLaunch, ...]


def _dim3(v: Any) -> tuple[int, int, int]:
    if isinstance(v, (tuple, list)):
        t = tuple(int(x) for x in v) + (1, 1, 1)
        return (t[0], t[1], t[2])
    return (int(v), 1, 1)


def _buffer_nbytes(b: Any) -> int:
    nb = getattr(b, "nbytes", None)
    if isinstance(nb, int):
        return nb
    return int(b.size) * (4 if b.role == "barrier" else ELEM_BYTES[b.dtype])


def launch_plan(program: Any) -> LaunchPlan:
    """Extract the launch plan of a :class:`stitchtune.kir.Program` (duck-typed).

    Raises ``ValueError`` for an inconsistent program (a lowering bug): unknown buffer in a launch,
    an input/output buffer without a graph tensor, an unknown role.
    """
    bufs = []
    names = set()
    for b in program.buffers:
        role = str(b.role)
        if role not in ("input", "output", "scratch", "barrier"):
            raise ValueError(f"buffer {b.name!r}: unknown role {role!r}")
        tensor = str(getattr(b, "tensor", "") or "")
        if role in ("input", "output") and not tensor:
            raise ValueError(f"{role} buffer {b.name!r} is not bound to a graph tensor")
        zero = bool(getattr(b, "zero_init", False)) or role == "barrier"
        bufs.append(PlanBuffer(str(b.name), str(b.dtype), _buffer_nbytes(b), role, zero, tensor))
        names.add(str(b.name))
    launches = []
    for ln in program.launches:
        missing = [a for a in ln.args if a not in names]
        if missing:
            raise ValueError(f"launch of {ln.kernel!r} names unknown buffers {missing}")
        launches.append(
            PlanLaunch(str(ln.kernel), _dim3(ln.grid), _dim3(ln.block), int(getattr(ln, "smem_bytes", 0) or 0),
                       tuple(str(a) for a in ln.args))
        )
    return LaunchPlan(tuple(bufs), tuple(launches))


@dataclass(frozen=True)
class Problem:
    """Per-graph data the worker keeps for its lifetime (plain numpy; bfloat16 as uint16)."""

    inputs: dict[str, np.ndarray]
    input_dtypes: dict[str, str]
    expected: dict[str, np.ndarray]  # float64 reference per output
    output_dtypes: dict[str, str]

    def output_nbytes(self, name: str) -> int:
        return int(self.expected[name].size) * ELEM_BYTES[self.output_dtypes[name]]


def _travel(arr: np.ndarray) -> np.ndarray:
    a = np.ascontiguousarray(arr)
    if a.dtype.name == "bfloat16":
        return a.view(np.uint16)
    return a


def _check_plan(plan: LaunchPlan, problem: Problem) -> None:
    """Input/output buffers must match the graph tensors they are bound to (else a lowering bug)."""
    for b in plan.buffers:
        if b.role == "input":
            arr = problem.inputs.get(b.tensor)
            if arr is None:
                raise ValueError(f"input buffer {b.name!r} bound to unknown graph input {b.tensor!r}")
            if b.nbytes != arr.nbytes or b.dtype != problem.input_dtypes[b.tensor]:
                raise ValueError(f"input buffer {b.name!r}: {b.nbytes} B {b.dtype}, graph input "
                                 f"{b.tensor!r} is {arr.nbytes} B {problem.input_dtypes[b.tensor]}")
        elif b.role == "output":
            if b.tensor not in problem.expected:
                raise ValueError(f"output buffer {b.name!r} bound to unknown graph output {b.tensor!r}")
            if b.nbytes != problem.output_nbytes(b.tensor) or b.dtype != problem.output_dtypes[b.tensor]:
                raise ValueError(f"output buffer {b.name!r} does not match graph output {b.tensor!r}")
    bound = {b.tensor for b in plan.buffers if b.role == "output"}
    missing = set(problem.expected) - bound
    if missing:
        raise ValueError(f"program writes no buffer for graph outputs {sorted(missing)}")


# --------------------------------------------------------------------------------------------
# worker side


class WorkerLaunchError(Exception):
    """A CUDA error inside the worker (the context may be unusable)."""


class _PycudaBackend:
    """The GPU, through pycuda. Only ever constructed inside the worker process."""

    def __init__(self, problem: Problem) -> None:
        import pycuda.driver as drv

        self.drv = drv
        drv.init()
        self.dev = drv.Device(int(os.environ.get(DEVICE_ENV, "0")))
        self.ctx = self.dev.make_context()
        self.host_inputs = problem.inputs
        self.inputs = {name: drv.mem_alloc(max(arr.nbytes, 1)) for name, arr in problem.inputs.items()}
        self.restore_inputs()
        self.outputs = {n: drv.mem_alloc(max(problem.output_nbytes(n), 1)) for n in problem.expected}
        self.out_nbytes = {n: problem.output_nbytes(n) for n in problem.expected}
        l2 = int(self.dev.get_attribute(drv.device_attribute.L2_CACHE_SIZE))
        self.flush_nbytes = max(2 * l2, 1 << 20)
        self.flush_buf = drv.mem_alloc(self.flush_nbytes)
        self.start, self.end = drv.Event(), drv.Event()
        self.module: Any = None
        self.scratch: dict[str, Any] = {}
        self.calls: list[tuple[Any, tuple[int, int, int], tuple[int, int, int], int, list[int]]] = []
        self._flush_value = 0

    def restore_inputs(self) -> None:
        """(Re-)upload the inputs (after a candidate that may have scribbled over them)."""
        for name, arr in self.host_inputs.items():
            if arr.nbytes:
                self.drv.memcpy_htod(int(self.inputs[name]), arr)

    def info(self) -> dict[str, Any]:
        drv = self.drv
        major, minor = self.dev.compute_capability()
        return {
            "backend": "pycuda",
            "name": self.dev.name(),
            "cc": f"{major}.{minor}",
            "sm_count": int(self.dev.get_attribute(drv.device_attribute.MULTIPROCESSOR_COUNT)),
            "l2_bytes": int(self.dev.get_attribute(drv.device_attribute.L2_CACHE_SIZE)),
            "driver_version": int(drv.get_driver_version()),
        }

    def is_launch_error(self, exc: BaseException) -> bool:
        return isinstance(exc, self.drv.Error)

    def load(self, cubin: bytes, plan: LaunchPlan) -> None:
        drv = self.drv
        self.module = drv.module_from_buffer(cubin)
        ptrs: dict[str, int] = {}
        for b in plan.buffers:
            if b.role == "input":
                ptrs[b.name] = int(self.inputs[b.tensor])
            elif b.role == "output":
                ptrs[b.name] = int(self.outputs[b.tensor])
            else:
                mem = drv.mem_alloc(max(b.nbytes, 1))
                self.scratch[b.name] = (mem, b.nbytes, b.zero_init)
                ptrs[b.name] = int(mem)
        funcs: dict[tuple[str, int], Any] = {}
        self.calls = []
        for ln in plan.launches:
            key = (ln.kernel, len(ln.args))
            if key not in funcs:
                f = self.module.get_function(ln.kernel)
                f.prepare("P" * len(ln.args))
                funcs[key] = f
            f = funcs[key]
            if ln.smem_bytes > DEFAULT_SMEM_LIMIT:
                f.set_attribute(drv.function_attribute.MAX_DYNAMIC_SHARED_SIZE_BYTES, ln.smem_bytes)
            self.calls.append((f, ln.grid, ln.block, ln.smem_bytes, [ptrs[a] for a in ln.args]))

    def init_scratch(self) -> None:
        for mem, nbytes, zero in self.scratch.values():
            if nbytes:
                self.drv.memset_d8(int(mem), 0 if zero else 0xFF, nbytes)

    def poison_outputs(self) -> None:
        for name, mem in self.outputs.items():
            if self.out_nbytes[name]:
                self.drv.memset_d8(int(mem), 0xFF, self.out_nbytes[name])

    def launch_all(self) -> None:
        for f, grid, block, smem, args in self.calls:
            f.prepared_call(grid, block, *args, shared_size=smem)

    def sync(self) -> None:
        self.drv.Context.synchronize()

    def flush_l2(self) -> None:
        self._flush_value ^= 0x5A  # a different value each time: no chance of a no-op memset
        self.drv.memset_d8(int(self.flush_buf), self._flush_value, self.flush_nbytes)

    def time_launches(self) -> float:
        self.start.record()
        self.launch_all()
        self.end.record()
        self.end.synchronize()
        return float(self.start.time_till(self.end)) * 1000.0

    def read_outputs(self) -> dict[str, np.ndarray]:
        out = {}
        for name, mem in self.outputs.items():
            host = np.empty(self.out_nbytes[name], dtype=np.uint8)
            if host.size:
                self.drv.memcpy_dtoh(host, int(mem))
            out[name] = host
        return out

    def unload(self) -> None:
        for mem, _, _ in self.scratch.values():
            try:
                mem.free()
            except Exception:  # noqa: BLE001 - a dead context cannot free; the worker exits anyway
                pass
        self.scratch = {}
        self.calls = []
        self.module = None

    def close(self) -> None:
        try:
            self.ctx.pop()
        except Exception:  # noqa: BLE001
            pass


class _FakeBackend:
    """A numpy stand-in for the GPU, to test the worker protocol on CPU (see module docstring)."""

    def __init__(self, problem: Problem) -> None:
        self.problem = problem
        self.out_nbytes = {n: problem.output_nbytes(n) for n in problem.expected}
        self.outputs = {n: np.zeros(nb, dtype=np.uint8) for n, nb in self.out_nbytes.items()}
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
        for a in self.outputs.values():
            a[:] = 0xFF

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
        for name, ref in self.problem.expected.items():
            vals = ref + 1.0 if mode == "wrong" or (mode == "once" and self.launches > 1) else ref
            self.outputs[name][:] = self._encode(name, vals)

    def sync(self) -> None:
        pass

    def flush_l2(self) -> None:
        pass

    def time_launches(self) -> float:
        self.launch_all()
        return self.time_us

    def read_outputs(self) -> dict[str, np.ndarray]:
        return {n: a.copy() for n, a in self.outputs.items()}

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
        first = backend.read_outputs()
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
        last = backend.read_outputs()
        # the kernels are deterministic (no atomics in reductions): bit-identical outputs need no second
        # float64 comparison, which costs about a second per candidate on 256 MiB outputs
        same = set(last) == set(first) and all(np.array_equal(last[n], first[n]) for n in first)
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


def _serve(conn: multiprocessing.connection.Connection) -> None:
    """Worker protocol. Child sends ("hello",); parent sends ("setup", backend, problem, repeats,
    warmup); child answers ("ready", info) or ("fatal", traceback). Then per item the parent sends
    ("run", cubin, plan) and the child answers ("beat",)* then ("result", fields, restart) or
    ("crash", traceback); ("stop",) or a closed connection ends the worker."""
    conn.send(("hello",))
    try:
        _, backend_name, problem, repeats, warmup = conn.recv()
    except EOFError:
        return
    try:
        backend = _PycudaBackend(problem) if backend_name == "pycuda" else _FakeBackend(problem)
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


# --------------------------------------------------------------------------------------------
# parent side


class CudaRunner:
    """Runner on a real GPU (see module docstring). Use as a context manager or call :meth:`close`.

    ``device`` is the :class:`stitchtune.device.Device` the search targets; a warning is logged
    when the GPU found has a different compute capability. ``device_info`` describes the GPU the
    worker found (after the first start).
    """

    def __init__(self, graph: Any, device: Any = None, repeats: int = 20, warmup: int = 3,
                 timeout_s: float = 10.0, seed: int = 0, *, start_timeout_s: float = 180.0,
                 backend: str | None = None) -> None:
        from stitchtune.reference import random_inputs

        inputs = random_inputs(graph, seed)
        expected = reference_outputs(graph, inputs)
        in_dtypes = {name: spec.dtype for name, spec in graph.inputs}
        problem = Problem({k: _travel(v) for k, v in inputs.items()}, in_dtypes, expected, output_dtypes(graph))
        self._setup(problem, device, repeats, warmup, timeout_s, start_timeout_s, backend)

    @classmethod
    def for_arrays(cls, inputs: Mapping[str, np.ndarray], input_dtypes: Mapping[str, str],
                   expected: Mapping[str, np.ndarray], output_dtypes: Mapping[str, str], device: Any = None,
                   repeats: int = 20, warmup: int = 3, timeout_s: float = 10.0, *,
                   start_timeout_s: float = 180.0, backend: str | None = None) -> CudaRunner:
        """A runner for hand-written kernels: explicit inputs and expected outputs (float64)."""
        self = cls.__new__(cls)
        problem = Problem({k: _travel(v) for k, v in inputs.items()}, dict(input_dtypes),
                          {k: np.asarray(v, dtype=np.float64) for k, v in expected.items()}, dict(output_dtypes))
        self._setup(problem, device, repeats, warmup, timeout_s, start_timeout_s, backend)
        return self

    def _setup(self, problem: Problem, device: Any, repeats: int, warmup: int, timeout_s: float,
               start_timeout_s: float, backend: str | None) -> None:
        self.problem = problem
        self.device = device
        self.repeats = int(repeats)
        self.warmup = int(warmup)
        self.timeout_s = float(timeout_s)
        self.start_timeout_s = float(start_timeout_s)
        self.backend = backend or os.environ.get(BACKEND_ENV, "pycuda")
        if self.backend not in ("pycuda", "fake"):
            raise ToolchainError(f"unknown CUDA runner backend {self.backend!r} (pycuda or fake)")
        if self.repeats < 1 or self.warmup < 0 or self.timeout_s <= 0:
            raise ValueError("repeats >= 1, warmup >= 0 and timeout_s > 0 required")
        self.device_info: dict[str, Any] | None = None
        self._starts = 0
        self._proc: subprocess.Popen[bytes] | None = None
        self._conn: multiprocessing.connection.Connection | None = None

    # -- worker lifecycle ---------------------------------------------------------------------

    def _start(self) -> None:
        # A plain subprocess (not multiprocessing): nothing of the caller's __main__ is re-imported,
        # and it can be killed at any moment. It talks over one end of a socket pair.
        ours, theirs = socket.socketpair()
        env = dict(os.environ)
        env["PYTHONPATH"] = _child_pythonpath()
        code = f"from stitchtune.cuda_runner import worker_entry; worker_entry({theirs.fileno()})"
        try:
            proc = subprocess.Popen(  # noqa: S603 - fixed program text, no user input
                [sys.executable, "-c", code], pass_fds=(theirs.fileno(),), env=env,
                stdin=subprocess.DEVNULL, start_new_session=True,
            )
        finally:
            theirs.close()
        conn = multiprocessing.connection.Connection(ours.detach())
        self._proc, self._conn = proc, conn
        self._starts += 1
        deadline = time.monotonic() + self.start_timeout_s
        setup_sent = False
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                self._kill()
                raise ToolchainError(f"CUDA worker did not start within {self.start_timeout_s:g} s")
            if not conn.poll(min(left, 1.0)):
                continue
            try:
                msg = conn.recv()
            except (EOFError, OSError):
                try:
                    proc.wait(5)
                except subprocess.TimeoutExpired:
                    pass
                rc = proc.returncode
                self._kill()
                raise ToolchainError(f"CUDA worker exited during start-up (exit code {rc})") from None
            if msg[0] == "hello" and not setup_sent:
                try:
                    conn.send(("setup", self.backend, self.problem, self.repeats, self.warmup))
                except OSError as exc:
                    self._kill()
                    raise ToolchainError(f"CUDA worker exited during start-up: {exc}") from None
                setup_sent = True
                continue
            if msg[0] == "ready":
                self._check_device(msg[1])
                return
            self._kill()
            last = str(msg[1]).strip().splitlines()[-1] if len(msg) > 1 and msg[1] else "unknown error"
            raise ToolchainError(f"cannot use the GPU through pycuda: {last}")

    @property
    def restarts(self) -> int:
        """How many times the worker was started again (after a timeout, fault or crash)."""
        return max(0, self._starts - 1)

    def _check_device(self, info: dict[str, Any]) -> None:
        self.device_info = info
        log.info("CUDA worker ready: %s", info)
        want = getattr(self.device, "compute_capability", None)
        if info.get("backend") == "pycuda" and isinstance(want, tuple) and len(want) == 2:
            if f"{want[0]}.{want[1]}" != info.get("cc"):
                log.warning("target device %s has compute capability %s.%s but the GPU found is %s (cc %s)",
                            getattr(self.device, "name", "?"), want[0], want[1], info.get("name"), info.get("cc"))

    def _kill(self) -> None:
        proc, conn = self._proc, self._conn
        self._proc = self._conn = None
        if conn is not None:
            conn.close()
        if proc is not None:
            if proc.poll() is None:
                try:
                    os.killpg(proc.pid, signal.SIGKILL)
                except (ProcessLookupError, PermissionError):
                    proc.kill()
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                log.warning("CUDA worker %d did not exit after SIGKILL", proc.pid)

    def close(self) -> None:
        """Stop the worker (politely, then by force)."""
        if self._proc is not None and self._conn is not None and self._proc.poll() is None:
            try:
                self._conn.send(("stop",))
                self._proc.wait(5)
            except (OSError, ValueError, subprocess.TimeoutExpired):
                pass
        self._kill()

    def __enter__(self) -> CudaRunner:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:  # noqa: BLE001 - interpreter shutdown
            pass

    # -- running ------------------------------------------------------------------------------

    def run(self, items: list[tuple[Any, Any]]) -> list[Measurement]:
        out = []
        for program, build in items:
            if getattr(build, "status", None) != "ok" or not getattr(build, "cubin_path", None):
                raise ValueError("CudaRunner.run needs successful builds with a cubin_path")
            plan = launch_plan(program)
            _check_plan(plan, self.problem)
            cubin = Path(build.cubin_path).read_bytes()
            out.append(self._run_one(cubin, plan))
        return out

    def _run_one(self, cubin: bytes, plan: LaunchPlan) -> Measurement:
        if self._proc is None or self._proc.poll() is not None:
            self._kill()
            self._start()
        conn, proc = self._conn, self._proc
        assert conn is not None and proc is not None
        try:
            conn.send(("run", cubin, plan))
        except (OSError, ValueError) as exc:
            self._kill()
            return Measurement("launch_error", error=f"CUDA worker unreachable: {exc}")
        deadline = time.monotonic() + self.timeout_s
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                self._kill()
                return Measurement("timeout", error=(f"no progress within {self.timeout_s:g} s (kernel hung, "
                                                     "e.g. a grid barrier deadlock); worker killed and restarted"))
            if not conn.poll(left):
                continue
            try:
                msg = conn.recv()
            except (EOFError, OSError):
                try:
                    proc.wait(5)
                except subprocess.TimeoutExpired:
                    pass
                code = proc.returncode
                self._kill()
                return Measurement("launch_error", error=f"CUDA worker died (exit code {code})")
            kind = msg[0]
            if kind == "beat":
                deadline = time.monotonic() + self.timeout_s
                continue
            if kind == "result":
                fields, restart = msg[1], msg[2]
                if restart:
                    self._kill()
                fields = dict(fields)
                if "error" in fields:
                    fields["error"] = clip_error(fields["error"])
                return Measurement(estimated=False, **fields)
            if kind == "crash":
                self._kill()
                raise RuntimeError(f"bug in the CUDA worker:\n{msg[1]}")
            raise RuntimeError(f"unexpected message from the CUDA worker: {kind!r}")
