"""The CLI's input arguments read: ``--schedule`` (inline JSON or ``@FILE``) and ``--inputs`` (.npz).

Contract: every problem is a :class:`~stitchtune.errors.StitchtuneError` with one line naming the argument
(the CLI prints it and exits 2). A module of its own (re-exported by :mod:`stitchtune.cli`) so that
:mod:`stitchtune.cli.dynamic` reads them without importing the package that imports it.
"""

from __future__ import annotations

import json
from typing import Any

import numpy as np

from stitchtune.cli import checks
from stitchtune.errors import StitchtuneError

__all__ = ["load_inputs_npz", "parse_schedule_arg"]


def parse_schedule_arg(text: str | None) -> dict[str, Any] | None:
    """``--schedule`` value: inline JSON, or ``@FILE`` holding JSON; returns the decoded object."""
    if text is None:
        return None
    src = "--schedule"
    if text.startswith("@"):
        path = text[1:]
        src = ascii(path)
        why = checks.in_file(path)
        if why:
            raise StitchtuneError(f"schedule file {src}: {why}")
        try:
            with open(path, "rb") as f:
                raw = f.read(4 * 1024 * 1024 + 1)
        except OSError as e:
            raise StitchtuneError(f"cannot read schedule file {src}: {e.strerror or e}") from None
        if len(raw) > 4 * 1024 * 1024:
            raise StitchtuneError(f"schedule file {src} is too large")
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError:
            raise StitchtuneError(f"schedule file {src} is not UTF-8") from None
    try:
        obj = json.loads(text)
    except (ValueError, RecursionError) as e:  # ValueError: also integers over Python's digit limit
        why = getattr(e, "msg", None) or (str(e).split(";")[0] if isinstance(e, ValueError) else "nested too deeply")
        raise StitchtuneError(f"{src}: not JSON ({why})") from None
    if not isinstance(obj, dict):
        raise StitchtuneError(f"{src}: a schedule must be a JSON object")
    return obj


def load_inputs_npz(path: str, graph: Any) -> dict[str, np.ndarray]:
    """Arrays by name from an .npz (no pickles). bfloat16 arrays saved by numpy come back as
    2-byte void (``|V2``); for bfloat16 inputs they are reinterpreted as ``ml_dtypes.bfloat16``."""
    from stitchtune.graph.reference import numpy_dtype

    import zipfile

    try:
        z = np.load(path, allow_pickle=False)
        if not hasattr(z, "files"):  # a bare .npy array has no names
            raise ValueError("an .npy array, not an .npz archive of named arrays")
        with z:
            arrays = {k: z[k] for k in z.files}
    except ValueError as e:
        why = "not an .npz archive of arrays (numpy.savez)" if "pickle" in str(e) else str(e)
        raise StitchtuneError(f"cannot read inputs {ascii(path)}: {why}") from None
    except (OSError, EOFError, zipfile.BadZipFile) as e:
        raise StitchtuneError(f"cannot read inputs {ascii(path)}: damaged or not an .npz archive "
                              f"({getattr(e, 'strerror', None) or e})") from None
    specs = dict(graph.inputs)
    for k, a in arrays.items():
        spec = specs.get(k)
        if spec is not None and spec.dtype == "bfloat16" and a.dtype.kind == "V" and a.dtype.itemsize == 2:
            arrays[k] = a.view(numpy_dtype("bfloat16"))
    return arrays
