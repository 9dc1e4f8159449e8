"""The real runner: one worker process that owns the GPU (cuda-python), guarded by a watchdog.

Contract
--------
* :func:`cuda_available` is True when the worker's driver binding (cuda-python, else pycuda: see
  :func:`~stitchtune.gpu.worker_driver.worker_driver`) imports and finds GPU ``$STITCHTUNE_CUDA_DEVICE``
  (default 0; checked in a short subprocess that releases what it retained, cached); it never raises.
* :class:`CudaRunner` implements ``Runner.run(items) -> list[Measurement]``. Per item it sends the
  cubin bytes and a plain-data :class:`~stitchtune.gpu.launch.LaunchPlan` to the worker
  (:mod:`stitchtune.gpu.worker`) and waits. The worker sends a heartbeat after every synchronised
  launch sequence; ``timeout_s`` without one means a kernel hangs (e.g. a grid barrier whose blocks
  are not co-resident): the worker is killed, the item is ``timeout``, and the next item starts a
  fresh worker. A CUDA error (illegal address, bad launch configuration, module load failure) is
  ``launch_error`` with the driver's text; the worker then exits (the context may be dead) and is
  restarted for the next item.
* The runner computes the graph's inputs (``random_inputs(graph, seed)``, random normal, never zeros)
  and float64 reference outputs once, and writes them into nameless files
  (:func:`~stitchtune.gpu.problem.write_problem`: anonymous memory files on Linux, else files under
  a per-runner ``tempfile.mkdtemp`` directory, unlinked at once): they live only while the runner
  or its worker holds a descriptor or map of them, so nothing is left behind when the process is
  killed (``kill -9`` included: the worker dies with its parent). The worker gets the descriptors
  (``pass_fds``) and maps the files read-only on every start, restarts included: a start costs no
  copy of the problem through the socket. :meth:`CudaRunner.close` (also on ``__del__`` and at
  interpreter exit) closes them and removes the directory; a closed runner cannot run again.
  ``CudaRunner.problem`` is the parent's read-only map of the same files.
* How the worker checks and times each program (poisoned outputs, L2 flush, CUDA events, ``warmup`` +
  ``repeats``, every output checked against the float64 reference before any time counts and again
  after timing) is the contract of :mod:`stitchtune.gpu.worker`. ``median_us`` and all
  ``samples_us`` are kept; ``estimated=False``.
* ``backend="cuda"`` (default): the worker launches through :mod:`stitchtune.gpu.launch` over
  cuda-python, which is imported only inside the worker; ``driver="pycuda"`` (or
  ``$STITCHTUNE_CUDA_DRIVER``) makes it use pycuda instead (the worker is a process of its own on the
  legacy default stream: nothing there needs cuda-python's foreign streams or capture).
* ``backend="fake"`` (or ``STITCHTUNE_CUDA_BACKEND=fake``) runs the same worker protocol with a numpy
  stand-in for the GPU (see :mod:`stitchtune.gpu.worker`), so the watchdog/restart logic is tested
  without one.

The launch plan types and :func:`launch_plan` live in :mod:`stitchtune.gpu.launch`, the problem in
:mod:`stitchtune.gpu.problem`, the worker in :mod:`stitchtune.gpu.worker`.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib.util
import logging
import multiprocessing.connection
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import weakref
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from stitchtune.errors import ToolchainError
from stitchtune.gpu.driver import DRIVER_ENV, DRIVERS
from stitchtune.gpu.launch import LaunchPlan, launch_plan
from stitchtune.gpu.problem import Problem, _check_plan, _travel, close_fds, write_problem
from stitchtune.gpu.worker import worker_entry
from stitchtune.gpu.runners import (
    Measurement,
    MeasureStatus,
    clip_error,
    output_dtypes,
    reference_outputs,
)

__all__ = ["BACKEND_ENV", "CudaRunner", "cuda_available", "worker_entry"]

log = logging.getLogger(__name__)

BACKEND_ENV = "STITCHTUNE_CUDA_BACKEND"


# --------------------------------------------------------------------------------------------
# availability


_PROBE = (
    "import sys\n"
    "from stitchtune.gpu.worker_driver import worker_driver\n"
    "worker_driver().close()\n"
    "sys.exit(0)\n"
)


def _child_pythonpath() -> str:
    """Our ``sys.path`` for a child interpreter, so it imports the same stitchtune and cuda-python."""
    return os.pathsep.join(p or os.getcwd() for p in sys.path)


@functools.lru_cache(maxsize=1)
def cuda_available() -> bool:
    """True when cuda-python imports and sees at least one GPU. Never raises; cached per process."""
    try:
        if importlib.util.find_spec("cuda") is None and importlib.util.find_spec("pycuda") is None:
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
# parent side


def _release_files(tmpdir: str, fds: list[int]) -> None:
    """Close the problem's descriptors and remove the runner's directory (idempotent)."""
    close_fds(fds)
    shutil.rmtree(tmpdir, ignore_errors=True)


def _problem_nbytes(problem: Problem) -> int:
    return sum(int(np.asarray(a).nbytes) for a in (*problem.inputs.values(), *problem.expected.values()))


@dataclasses.dataclass(frozen=True)
class _Exited:
    """The worker process died; ``code`` is its exit status (None if unknown)."""

    code: int | None


class CudaRunner:
    """Runner on a real GPU (see module docstring). Use as a context manager or call :meth:`close`.

    ``device`` is the :class:`stitchtune.hardware.device.Device` the search targets; a warning is logged
    when the GPU found has a different compute capability. ``device_info`` describes the GPU the
    worker found (after the first start).
    """

    def __init__(self, graph: Any, device: Any = None, repeats: int = 20, warmup: int = 3,
                 timeout_s: float = 10.0, seed: int = 0, *, start_timeout_s: float = 180.0,
                 backend: str | None = None, driver: str | None = None) -> None:
        from stitchtune.graph.reference import random_inputs

        inputs = random_inputs(graph, seed)
        expected = reference_outputs(graph, inputs)
        in_dtypes = {name: spec.dtype for name, spec in graph.inputs}
        problem = Problem({k: _travel(v) for k, v in inputs.items()}, in_dtypes, expected, output_dtypes(graph))
        self._setup(problem, device, repeats, warmup, timeout_s, start_timeout_s, backend, driver)

    @classmethod
    def for_arrays(cls, inputs: Mapping[str, np.ndarray], input_dtypes: Mapping[str, str],
                   expected: Mapping[str, np.ndarray], output_dtypes: Mapping[str, str], device: Any = None,
                   repeats: int = 20, warmup: int = 3, timeout_s: float = 10.0, *,
                   start_timeout_s: float = 180.0, backend: str | None = None,
                   driver: str | None = None) -> CudaRunner:
        """A runner for hand-written kernels: explicit inputs and expected outputs (float64)."""
        self = cls.__new__(cls)
        problem = Problem({k: _travel(v) for k, v in inputs.items()}, dict(input_dtypes),
                          {k: np.asarray(v, dtype=np.float64) for k, v in expected.items()}, dict(output_dtypes))
        self._setup(problem, device, repeats, warmup, timeout_s, start_timeout_s, backend, driver)
        return self

    def _setup(self, problem: Problem, device: Any, repeats: int, warmup: int, timeout_s: float,
               start_timeout_s: float, backend: str | None, driver: str | None = None) -> None:
        self._proc: subprocess.Popen[bytes] | None = None
        self._conn: multiprocessing.connection.Connection | None = None
        self._closed = False
        self.device = device
        self.repeats = int(repeats)
        self.warmup = int(warmup)
        self.timeout_s = float(timeout_s)
        self.start_timeout_s = float(start_timeout_s)
        self.backend = backend or os.environ.get(BACKEND_ENV, "cuda")
        if self.backend not in ("cuda", "fake"):
            raise ToolchainError(f"unknown CUDA runner backend {self.backend!r} (cuda or fake)")
        if driver is not None and driver not in DRIVERS:
            raise ToolchainError(f"unknown CUDA driver binding {driver!r} ({' or '.join(DRIVERS)})")
        self.driver = driver
        if self.repeats < 1 or self.warmup < 0 or self.timeout_s <= 0:
            raise ValueError("repeats >= 1, warmup >= 0 and timeout_s > 0 required")
        self.device_info: dict[str, Any] | None = None
        self._starts = 0
        self._tmpdir = tempfile.mkdtemp(prefix="stitchtune-cuda-")
        fds: list[int] = []
        # closes the descriptors and removes the directory on close(), garbage collection or exit
        self._release = weakref.finalize(self, _release_files, self._tmpdir, fds)
        try:
            self._files, written = write_problem(problem, self._tmpdir)
        except OSError as exc:
            self._release()
            raise ToolchainError(f"cannot write the CUDA runner's inputs and reference outputs "
                                 f"({_problem_nbytes(problem) / 2**20:.0f} MiB): {exc}") from None
        fds.extend(written)
        self.problem: Problem = self._files.open()  # read-only maps: the arrays are not held twice

    # -- worker lifecycle ---------------------------------------------------------------------

    def _start(self) -> None:
        # A plain subprocess (not multiprocessing): nothing of the caller's __main__ is re-imported,
        # and it can be killed at any moment. It talks over one end of a socket pair.
        if self._closed:
            raise RuntimeError("this CudaRunner is closed")
        ours, theirs = socket.socketpair()
        env = dict(os.environ)
        env["PYTHONPATH"] = _child_pythonpath()
        if self.driver is not None:
            env[DRIVER_ENV] = self.driver
        code = f"from stitchtune.gpu.runner import worker_entry; worker_entry({theirs.fileno()})"
        try:
            proc = subprocess.Popen(  # noqa: S603 - fixed program text, no user input
                [sys.executable, "-c", code], pass_fds=(theirs.fileno(), *self._files.fds()), env=env,
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
            msg = self._recv(proc, conn)
            if isinstance(msg, _Exited):
                raise ToolchainError(f"CUDA worker exited during start-up (exit code {msg.code})")
            if msg[0] == "hello" and not setup_sent:
                try:
                    conn.send(("setup", self.backend, self._files, self.repeats, self.warmup))
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
            raise ToolchainError(f"cannot use the GPU through cuda-python: {last}")

    @property
    def restarts(self) -> int:
        """How many times the worker was started again (after a timeout, fault or crash)."""
        return max(0, self._starts - 1)

    def _check_device(self, info: dict[str, Any]) -> None:
        self.device_info = info
        log.info("CUDA worker ready: %s", info)
        want = getattr(self.device, "compute_capability", None)
        if info.get("backend") == "cuda" and isinstance(want, tuple) and len(want) == 2:
            if f"{want[0]}.{want[1]}" != info.get("cc"):
                log.warning("target device %s has compute capability %s.%s but the GPU found is %s (cc %s)",
                            getattr(self.device, "name", "?"), want[0], want[1], info.get("name"), info.get("cc"))

    def _recv(self, proc: Any, conn: Any) -> Any:
        """The worker's next message, or :class:`_Exited` (worker cleaned up) when it died."""
        try:
            return conn.recv()
        except (EOFError, OSError):
            try:
                proc.wait(5)
            except subprocess.TimeoutExpired:
                pass
            code = proc.returncode
            self._kill()
            return _Exited(code)

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
        """Stop the worker (politely, then by force) and free the problem's files."""
        if self._proc is not None and self._conn is not None and self._proc.poll() is None:
            try:
                self._conn.send(("stop",))
                self._proc.wait(5)
            except (OSError, ValueError, subprocess.TimeoutExpired):
                pass
        self._kill()
        self._closed = True
        release = getattr(self, "_release", None)
        if release is not None:
            release()
            # the parent's maps hold the (unlinked) files too: drop them, keeping names and dtypes
            p = getattr(self, "problem", None)
            if p is not None:
                self.problem = Problem({}, p.input_dtypes, {}, p.output_dtypes)

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
        if self._closed:
            raise RuntimeError("this CudaRunner is closed")
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
            return Measurement(MeasureStatus.LAUNCH_ERROR, error=f"CUDA worker unreachable: {exc}")
        deadline = time.monotonic() + self.timeout_s
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                self._kill()
                return Measurement(MeasureStatus.TIMEOUT, error=(f"no progress within {self.timeout_s:g} s (kernel hung, "
                                                     "e.g. a grid barrier deadlock); worker killed and restarted"))
            if not conn.poll(left):
                continue
            msg = self._recv(proc, conn)
            if isinstance(msg, _Exited):
                return Measurement(MeasureStatus.LAUNCH_ERROR, error=f"CUDA worker died (exit code {msg.code})")
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
