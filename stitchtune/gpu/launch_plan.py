"""The plain data that travels from the CUDA runner to its worker: launch plan and per-graph problem.

Contract
--------
* :func:`launch_plan` turns a :class:`stitchtune.ir.kir.Program` (duck-typed) into a frozen
  :class:`LaunchPlan` of :class:`PlanBuffer` and :class:`PlanLaunch` (plain data, picklable): every
  buffer with its byte size, role (``input``/``output``/``scratch``/``barrier``), graph tensor and
  whether it starts zeroed (barriers always do); every launch with its kernel name, grid and block as
  3-tuples, dynamic shared memory and argument buffer names. An inconsistent program (a lowering bug)
  raises ``ValueError``.
* :class:`Problem` is what the worker keeps per graph: inputs (bfloat16 as uint16, see
  :func:`_travel`), input dtypes, the float64 reference per output and output dtypes.
  :func:`_check_plan` raises ``ValueError`` when a plan's input/output buffers do not match the
  graph tensors they are bound to, or a graph output has no buffer.
* :func:`write_problem` puts a Problem's arrays into nameless files (raw bytes, one file per array):
  anonymous memory files (``memfd_create``) on Linux, else files unlinked as soon as they are
  created; either way they exist only while an open descriptor or memory map refers to them, so
  nothing is left behind when the owner is killed. It returns a
  :class:`ProblemFiles` (plain data: descriptor numbers, dtypes, shapes; picklable) and the
  descriptors, which the owner closes with :func:`close_fds`. :meth:`ProblemFiles.open` maps the
  files read-only (in any process that holds the descriptors, e.g. a child started with
  ``pass_fds``) and returns a :class:`Problem` whose arrays are those maps.
* ``DEFAULT_SMEM_LIMIT`` is the dynamic shared memory a launch gets without opting in (48 KiB);
  ``ELEM_BYTES`` the element size per dtype.

Pure numpy; no GPU library is imported here. Used by :mod:`stitchtune.gpu.runner` (parent side),
:mod:`stitchtune.gpu.worker` (worker side) and the cupy launcher of :mod:`stitchtune.bench.launch`.
"""

from __future__ import annotations

import mmap
import os
import tempfile
from dataclasses import dataclass
from typing import Any

import numpy as np

DEFAULT_SMEM_LIMIT = 48 * 1024
ELEM_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2}


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
    """Extract the launch plan of a :class:`stitchtune.ir.kir.Program` (duck-typed).

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
# the problem in files (the worker maps them instead of receiving hundreds of MiB through a socket)


@dataclass(frozen=True)
class ArrayFile:
    """One array in an unlinked file: the open descriptor, numpy dtype name and shape (C order)."""

    fd: int
    dtype: str
    shape: tuple[int, ...]

    @property
    def nbytes(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64)) * np.dtype(self.dtype).itemsize

    def open(self) -> np.ndarray:
        """A read-only array mapped from the file (the map keeps the file alive on its own)."""
        if self.nbytes == 0:
            return np.zeros(self.shape, dtype=self.dtype)
        mm = mmap.mmap(self.fd, self.nbytes, access=mmap.ACCESS_READ)
        return np.frombuffer(mm, dtype=self.dtype).reshape(self.shape)


@dataclass(frozen=True)
class ProblemFiles:
    """Where a :class:`Problem`'s arrays lie (see :func:`write_problem`); plain, picklable data."""

    inputs: dict[str, ArrayFile]
    input_dtypes: dict[str, str]
    expected: dict[str, ArrayFile]
    output_dtypes: dict[str, str]

    def fds(self) -> tuple[int, ...]:
        return tuple(f.fd for f in (*self.inputs.values(), *self.expected.values()))

    def nbytes(self) -> int:
        return sum(f.nbytes for f in (*self.inputs.values(), *self.expected.values()))

    def open(self) -> Problem:
        """The problem, its arrays mapped read-only from the files."""
        return Problem({k: f.open() for k, f in self.inputs.items()}, dict(self.input_dtypes),
                       {k: f.open() for k, f in self.expected.items()}, dict(self.output_dtypes))


def _new_file(directory: str, tag: str) -> int:
    """A new nameless file: an anonymous memory file (``memfd_create``: RAM like any array, no disk,
    no size limit of a mount) where the platform has one, else a file under ``directory`` unlinked
    before anything is written to it."""
    if hasattr(os, "memfd_create"):
        try:
            return os.memfd_create(tag, getattr(os, "MFD_CLOEXEC", 0))
        except OSError:
            pass
    fd, path = tempfile.mkstemp(prefix="array-", suffix=".bin", dir=directory)
    os.unlink(path)  # before any byte is written: a kill from here on leaves nothing behind
    return fd


def _write_array(arr: np.ndarray, directory: str, tag: str, fds: list[int]) -> ArrayFile:
    a = np.ascontiguousarray(arr)
    fd = _new_file(directory, tag)
    fds.append(fd)
    view = memoryview(a.reshape(-1).view(np.uint8))
    done = 0
    while done < len(view):
        done += os.write(fd, view[done:done + (1 << 30)])
    return ArrayFile(fd, a.dtype.str, tuple(int(n) for n in a.shape))


def write_problem(problem: Problem, directory: str) -> tuple[ProblemFiles, list[int]]:
    """Write every array of ``problem`` into its own nameless file (see :func:`_new_file`; the files
    are named after ``directory``'s last component where the platform shows names, e.g. in
    ``/proc/PID/fd``).

    Returns the :class:`ProblemFiles` and the open descriptors (the caller owns them: pass them to
    the worker with ``pass_fds`` and close them with :func:`close_fds`). An ``OSError`` (e.g. no space
    left) closes what was opened and propagates."""
    fds: list[int] = []
    base = os.path.basename(os.path.normpath(directory))
    try:
        inputs = {k: _write_array(v, directory, f"{base}:input:{k}", fds) for k, v in problem.inputs.items()}
        expected = {k: _write_array(np.asarray(v, dtype=np.float64), directory, f"{base}:expected:{k}", fds)
                    for k, v in problem.expected.items()}
    except BaseException:
        close_fds(fds)
        raise
    return ProblemFiles(inputs, dict(problem.input_dtypes), expected, dict(problem.output_dtypes)), fds


def close_fds(fds: list[int]) -> None:
    """Close descriptors from :func:`write_problem` (a file is freed once no map refers to it either)."""
    while fds:
        try:
            os.close(fds.pop())
        except OSError:
            pass
