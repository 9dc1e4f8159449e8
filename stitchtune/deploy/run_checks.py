"""The checks around a compiled graph's run: its input arrays, and the gathers' out-of-range index flags.

Contract
--------
* :func:`read_gather_flags` reads (and re-zeroes) the gather error flags of a program in device memory;
  :func:`check_launch_gathers` waits for a :class:`~stitchtune.gpu.launch.Launcher`'s launches and
  raises for a set flag; :func:`check_gather_flags` raises :func:`gather_error` naming every gather
  whose flag is set; :func:`check_gather_indices` checks the index inputs on the host (the float64
  reference's equivalent). ``_check_arrays`` raises listing every missing, extra, mis-shaped or
  mis-typed input (numpy arrays or ``__cuda_array_interface__`` device arrays).
* Every problem raises :class:`~stitchtune.errors.StitchtuneError`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from stitchtune.errors import StitchtuneError
from stitchtune.lower.gather import gather_flag_buffers

if TYPE_CHECKING:
    from stitchtune.gpu.driver import Driver
    from stitchtune.gpu.launch import Launcher
    from stitchtune.graph.parse import Graph, TensorSpec
    from stitchtune.ir.kir import Program


def read_gather_flags(driver: Driver, scratch: Mapping[str, int], program: Program, stream: int = 0) -> dict[str, float]:
    """Flag buffer name -> value of each gather error flag of ``program`` in device memory (``scratch``:
    buffer name -> device pointer, as a :class:`~stitchtune.gpu.launch.Launcher` holds them), read
    through ``driver`` after the launches completed; a set flag is zeroed again for the next launch,
    on ``stream`` (the stream the next launch goes on: a reset on another stream could land after it)."""
    out: dict[str, float] = {}
    for name in gather_flag_buffers(program):
        host = np.zeros(1, np.float32)
        driver.memcpy_dtoh(host, scratch[name])
        out[name] = float(host[0])
        if host[0]:
            driver.memset_d8(scratch[name], 0, 4, stream)
    return out


def check_launch_gathers(launcher: Launcher, program: Program, stream: int = 0) -> None:
    """After ``program``'s launches through ``launcher`` (a :class:`~stitchtune.gpu.launch.Launcher`) on
    ``stream``: wait for them (``driver.synchronize()``), read the gathers' error flags (a set one is
    reset on ``stream``) and raise :class:`StitchtuneError` naming each gather that met an
    out-of-range index. A no-op (no synchronisation) for a program without gathers."""
    if not gather_flag_buffers(program):
        return
    with launcher.driver.activate():
        launcher.driver.synchronize()
        flags = read_gather_flags(launcher.driver, launcher.scratch, program, stream)
    check_gather_flags(program, flags)


def gather_error(nodes: Sequence[str]) -> StitchtuneError:
    """The error for gathers ``nodes`` (node ids) that met an out-of-range index."""
    return StitchtuneError(problems=[f"gather {n!r}: index out of range (the table has fewer rows, or the "
                                     "index is negative); those output rows are zeros" for n in nodes])


def check_gather_flags(program: Program, flags: Mapping[str, float]) -> None:
    """Raise :class:`StitchtuneError` naming every gather whose error flag (``flags``: flag buffer
    name -> value after the run) is set: some index was out of range (its output rows are zeros)."""
    nodes = gather_flag_buffers(program)
    bad = [nodes[b] for b, v in flags.items() if b in nodes and v]
    if bad:
        raise gather_error(bad)


def check_emulated_gathers(program: Program, scratch: Mapping[str, Any]) -> None:
    """:func:`check_gather_flags` over the scratch buffers an emulated run of ``program`` left
    (``emulate_program(..., scratch_out=scratch)``)."""
    flags = gather_flag_buffers(program)
    check_gather_flags(program, {b: float(a[0]) for b, a in scratch.items() if b in flags})


def check_gather_indices(graph: Graph, arrays: Mapping[str, Any]) -> None:
    """What the kernels' error flags report, checked on the host for the float64 reference: raise
    :class:`StitchtuneError` naming every gather of ``graph`` whose index input in ``arrays`` holds a
    value outside ``[0, rows of its table)``."""
    bad = []
    for node in graph.nodes:
        if node.op in ("gather", "gather_elements"):
            table, idx = (str(a) for a in node.args)
            rows = graph.spec(table).shape[node.axis or 0]
            if idx in arrays:
                a = np.asarray(arrays[idx])
                if a.size and (int(a.min()) < 0 or int(a.max()) >= rows):
                    bad.append(node.id)
    if bad:
        raise gather_error(bad)


def _device_array_problem(name: str, a: Any, spec: TensorSpec) -> list[str]:
    """What is wrong with device array ``a`` (``__cuda_array_interface__``) as input ``name``."""
    try:
        cai = a.__cuda_array_interface__
        shape, dt = tuple(int(d) for d in cai["shape"]), np.dtype(cai["typestr"])
    except Exception as exc:  # noqa: BLE001 - e.g. torch refuses the interface for bfloat16 tensors
        return [f"input {name!r}: its __cuda_array_interface__ is unusable ({type(exc).__name__}: {exc})"]
    out = []
    if shape != tuple(spec.shape):
        out.append(f"input {name!r}: shape {list(shape)}, expected {list(spec.shape)}")
    from stitchtune.graph.reference import numpy_dtype

    # bfloat16 has no typestr: its raw 2-byte bits (e.g. a uint16/int16 view) are taken as they are
    ok = dt.itemsize == 2 and dt.kind in "uiV" if spec.dtype == "bfloat16" else dt == numpy_dtype(spec.dtype)
    if not ok:
        out.append(f"input {name!r}: dtype {dt}, expected {spec.dtype}")
    return out


def _check_arrays(graph: Any, arrays: Mapping[str, Any]) -> None:
    """Raise StitchtuneError listing every missing, extra, mis-shaped or mis-typed input."""
    from stitchtune.graph.reference import numpy_dtype

    specs = dict(graph.inputs)
    problems = [f"input {n!r}: missing (expected shape {list(s.shape)}, dtype {s.dtype})"
                for n, s in graph.inputs if n not in arrays]
    problems += [f"input {n!a}: not an input of graph {graph.name!r}" for n in arrays if n not in specs]
    for n, a in arrays.items():
        s = specs.get(n)
        if s is None:
            continue
        if isinstance(a, np.ndarray):
            if tuple(a.shape) != s.shape:
                problems.append(f"input {n!r}: shape {list(a.shape)}, expected {list(s.shape)}")
            if a.dtype != numpy_dtype(s.dtype):
                problems.append(f"input {n!r}: dtype {a.dtype}, expected {s.dtype}")
        elif hasattr(a, "__cuda_array_interface__"):
            problems += _device_array_problem(n, a, s)
        else:
            problems.append(f"input {n!r}: a numpy array or a device array with __cuda_array_interface__, "
                            f"not {type(a).__name__}")
    if problems:
        raise StitchtuneError(problems=problems)
