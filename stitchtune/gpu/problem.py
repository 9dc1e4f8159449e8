"""The per-graph data the CUDA runner hands to its worker: the :class:`Problem` and its files.

Contract
--------
* :class:`Problem` is what the worker keeps per graph: inputs (bfloat16 as uint16, see
  :func:`_travel`), input dtypes, the float64 reference per output and output dtypes.
  :func:`_check_plan` raises ``ValueError`` when a :class:`~stitchtune.gpu.launch.LaunchPlan`'s
  input/output buffers do not match the graph tensors they are bound to, or a graph output has no
  buffer.
* :func:`write_problem` puts a Problem's arrays into nameless files (raw bytes, one file per array):
  anonymous memory files (``memfd_create``) on Linux, else files unlinked as soon as they are
  created; either way they exist only while an open descriptor or memory map refers to them, so
  nothing is left behind when the owner is killed. It returns a
  :class:`ProblemFiles` (plain data: descriptor numbers, dtypes, shapes; picklable) and the
  descriptors, which the owner closes with :func:`close_fds`. :meth:`ProblemFiles.open` maps the
  files read-only (in any process that holds the descriptors, e.g. a child started with
  ``pass_fds``) and returns a :class:`Problem` whose arrays are those maps.

Pure numpy; no GPU library is imported here. Used by :mod:`stitchtune.gpu.runner` (parent side) and
:mod:`stitchtune.gpu.worker` (worker side). The launch plan itself is in :mod:`stitchtune.gpu.launch`.
"""

from __future__ import annotations

import mmap
import os
import tempfile
from dataclasses import dataclass
import numpy as np

from stitchtune.gpu.launch import ELEM_BYTES, LaunchPlan



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
    view = a.reshape(-1).view(np.uint8).data
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
