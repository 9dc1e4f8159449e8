"""The CLI's output files: written whole, never over one of the command's own inputs.

Contract
--------
* :func:`write_whole(path, write)` writes one output file: ``write(tmp)`` fills a new temporary file in
  the same folder (a hidden ``.<name>.<pid>.<random>.tmp<ext>``, keeping ``path``'s extension), which then
  replaces ``path`` in one ``os.replace``. A reader never sees a half-written file, and a failed or
  interrupted write leaves the old file as it was and no temporary file behind. Missing parent folders
  are created (the path checks of :mod:`stitchtune.cli.checks` already found them creatable). An
  ``OSError`` is one :class:`~stitchtune.errors.StitchtuneError` line naming the path.
* An output that is also one of the command's inputs is refused before any work, by
  :func:`stitchtune.cli.checks.preflight` (``checks.same_file``).
* :func:`no_cubin_line(no_cubin)`: ``compile``'s line when it wrote no cubin, saying why (``--no-cubin``, or
  why no nvcc was found: a ``$STITCHTUNE_NVCC`` that is not an executable file is named).
* :func:`save_outputs_npz` writes a ``run`` command's output arrays (through :func:`write_whole`).
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Callable, Mapping

import numpy as np

from stitchtune.errors import StitchtuneError
from stitchtune.graph.npz import save_npz

__all__ = ["no_cubin_line", "save_outputs_npz", "write_whole"]


def write_whole(path: str, write: Callable[[str], object]) -> None:
    """Write the file ``path`` at once through ``write(tmp)`` (module docstring)."""
    parent, name = os.path.split(os.path.abspath(path))
    tmp = os.path.join(parent, f".{name[:100]}.{os.getpid()}.{uuid.uuid4().hex[:12]}.tmp{os.path.splitext(name)[1]}")
    try:
        os.makedirs(parent, exist_ok=True)
        write(tmp)
        os.replace(tmp, path)
    except OSError as e:
        raise StitchtuneError(f"cannot write {ascii(path)}: {e.strerror or e}") from None
    finally:
        if os.path.lexists(tmp):
            os.unlink(tmp)


def save_outputs_npz(path: str, outputs: Mapping[str, np.ndarray]) -> None:
    """Write arrays to ``path`` (.npz; bfloat16 is stored as 2-byte void, see ``load_inputs_npz``)."""
    write_whole(path, lambda tmp: save_npz(tmp, outputs))


def no_cubin_line(no_cubin: bool) -> str:
    """``compile``'s line for a program written without a cubin (module docstring)."""
    if no_cubin:
        return "  no cubin (--no-cubin)"
    from stitchtune.errors import ToolchainError
    from stitchtune.gpu.build import find_nvcc

    try:
        find_nvcc()
    except ToolchainError as e:
        return f"  no cubin ({e})"
    return "  no cubin (nvcc not found or --no-cubin)"
