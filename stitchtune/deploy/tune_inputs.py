"""``stitchtune tune`` and ``stitchtune import torch``: the example inputs of the model, and the checks
that run before anything is traced or compiled (a mistake in the model or in ``--shapes`` is the user's:
one error line, not a trace from ``torch.compile`` minutes later).

Contract
--------
* :func:`example_inputs(fn, shapes, dtype_text)` -> the example tensors, positional, in the order
  :func:`~stitchtune.importers.torch_import.input_order` gives (the order ``import torch`` uses too; every
  problem with ``--shapes`` and ``--dtype`` in one :class:`~stitchtune.errors.StitchtuneError`). Floats are
  seeded standard-normal values, ``int64`` inputs zeros and ones (token ids), on the CPU. Before any
  tensor is allocated, :func:`check_example_bytes` bounds their total size.
* :func:`check_example_bytes(shapes, dtypes)`: the inputs' total bytes at most
  :data:`EXAMPLE_MEMORY_FRACTION` of this host's memory (``tune`` runs the model on them eagerly and under
  ``torch.compile``, whose activations are many times larger); over it, one error giving both numbers.
* :func:`check_runs(fn, inputs)`: calls ``fn`` once eagerly on ``inputs`` (no grad; an ``nn.Module`` as
  it is, in eval mode after loading); an exception is one error line naming its type and first line.
  ``KeyboardInterrupt`` passes through.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from stitchtune.errors import StitchtuneError

__all__ = ["EXAMPLE_MEMORY_FRACTION", "check_example_bytes", "check_runs", "example_inputs"]

#: the share of host memory the example inputs may take
EXAMPLE_MEMORY_FRACTION = 1 / 8
#: assumed host memory where the platform does not say
_UNKNOWN_HOST_BYTES = 16 * 2**30
_ITEMSIZE = {"float32": 4, "float16": 2, "bfloat16": 2, "int64": 8}


def check_example_bytes(shapes: Mapping[str, Sequence[int]], dtypes: Mapping[str, str],
                        host_bytes: int | None = None) -> int:
    """The example inputs' total bytes; a StitchtuneError when over the bound (module docstring)."""
    from stitchtune.graph.reference import host_memory_bytes

    host = host_bytes or host_memory_bytes() or _UNKNOWN_HOST_BYTES
    total = sum(math.prod(s) * _ITEMSIZE.get(dtypes.get(n, "float32"), 4) for n, s in shapes.items())
    if total > EXAMPLE_MEMORY_FRACTION * host:
        raise StitchtuneError(
            f"--shapes: the example inputs take {total} bytes ({total / 2**30:.1f} GiB); this host has "
            f"{host / 2**30:.1f} GiB and stitchtune keeps them to {EXAMPLE_MEMORY_FRACTION:.1%} of it (tune at "
            "smaller shapes: a schedule is chosen by the nearest tuned shape)")
    return total


def example_inputs(fn: Any, shapes: Mapping[str, tuple[int, ...]], dtype_text: str | None) -> list[Any]:
    """Example tensors for ``fn``'s positional parameters named in ``shapes`` (module docstring)."""
    import torch

    from stitchtune.graph.values import FLOAT_DTYPES
    from stitchtune.importers.builder import parse_dtypes
    from stitchtune.importers.torch_import import input_order

    names = list(shapes)
    problems: list[str] = []
    try:
        dtypes = parse_dtypes(dtype_text, names, allowed=(*FLOAT_DTYPES, "int64"))
    except StitchtuneError as exc:  # reported together with the --shapes problems below
        problems, dtypes = list(exc.problems), {}
    try:
        order = input_order(fn, names)
    except StitchtuneError as exc:
        problems += exc.problems
    if problems:
        raise StitchtuneError(problems=problems)
    check_example_bytes(shapes, dtypes)
    gen = torch.Generator().manual_seed(0)
    out = []
    for n in order:
        if dtypes[n] == "int64":
            out.append(torch.randint(0, 2, shapes[n], generator=gen))
        else:
            out.append(torch.randn(shapes[n], generator=gen).to(getattr(torch, dtypes[n])))
    return out


def check_runs(fn: Any, inputs: Sequence[Any]) -> None:
    """Call ``fn(*inputs)`` once eagerly; its failure is one StitchtuneError line (module docstring)."""
    import torch

    from stitchtune.importers.torch_import import first_line

    try:
        with torch.no_grad():
            fn(*inputs)
    except Exception as exc:  # noqa: BLE001 - the user's model failed: their mistake, said in one line
        shapes = ", ".join("x".join(map(str, t.shape)) + f":{str(t.dtype).removeprefix('torch.')}" for t in inputs)
        raise StitchtuneError(f"the model fails when called on the example inputs ({shapes}), before anything is "
                              f"traced: {type(exc).__name__}: {first_line(exc)}") from None
