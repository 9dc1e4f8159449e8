"""Files written whole: a reader never sees half a file, a failed write leaves the old one.

Contract
--------
* :func:`write_atomic(path, data)` writes ``data`` (bytes) to ``path``: missing parent folders are created,
  the bytes go to a hidden temporary file in the same folder (``.<name>.*.tmp``), flushed and fsync'ed, which
  then replaces ``path`` in one ``os.replace``. On any failure (an ``OSError``, an interrupt) the temporary
  file is removed and the error propagates; ``path`` is as it was. Returns ``path`` as a ``Path``.
  Used by the nvcc cubin cache (:mod:`stitchtune.gpu.build`) and the fitted model's calibration files
  (:mod:`stitchtune.cost.fitted_store`).
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

__all__ = ["write_atomic"]


def write_atomic(path: str | os.PathLike[str], data: bytes) -> Path:
    """Write ``data`` to ``path`` through a temporary file and a rename (module docstring)."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, target)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    return target
