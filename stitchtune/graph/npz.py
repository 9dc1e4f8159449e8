"""Tensor values in ``.npz`` files: one member ``<name>.npy`` per tensor (what ``np.load`` reads).

:func:`save_npz` writes the members itself instead of calling ``np.savez(path, **arrays)``, which
takes a tensor named ``file`` or ``allow_pickle`` (both valid graph names) as its own argument, and
which appends ``.npz`` to a path without it. The file is written exactly at ``path``.
"""

from __future__ import annotations

import os
import zipfile
from typing import IO, Mapping

import numpy as np

__all__ = ["save_npz"]


def save_npz(path: str | os.PathLike[str] | IO[bytes], arrays: Mapping[str, np.ndarray]) -> None:
    """Write ``arrays`` to the uncompressed archive ``path`` (a file name or a binary file open for
    writing; no pickled objects); raises OSError."""
    with zipfile.ZipFile(path, "w", zipfile.ZIP_STORED, allowZip64=True) as zf:
        for name, a in arrays.items():
            with zf.open(f"{name}.npy", "w", force_zip64=True) as f:
                np.lib.format.write_array(f, np.asanyarray(a), allow_pickle=False)
