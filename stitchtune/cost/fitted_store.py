"""Where the fitted cost model's coefficients are read from and written to.

Contract
--------
* :func:`data_name(device) -> str`: ``fitted_<device key, unsafe characters as _>.json``, the file name
  of one device's coefficients, in the package (``stitchtune/cost/``, written by
  ``scripts/fit_cost_model.py --write-package``) and in the user's folder alike.
* :func:`user_dir() -> Path`: ``$STITCHTUNE_DATA_DIR`` when set and not empty, else
  ``platformdirs.user_data_dir("stitchtune")`` (e.g. ``~/.local/share/stitchtune`` on Linux); read at
  each call. :func:`user_path(device) -> Path` is the user's file of ``device`` there: ``stitchtune
  calibrate`` writes it, :func:`stitchtune.cost.fitted.coefficients_for` reads it before the package's.
* :func:`write_json_atomic(path, data)`: the JSON text written to a temporary file in ``path``'s
  folder (created when missing), flushed and synced, then renamed over ``path`` (``os.replace``): a
  crash or an error leaves the previous file as it was and no temporary file behind.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any

from stitchtune.graph.files import write_atomic
from stitchtune.hardware.device import Device

__all__ = ["DATA_DIR_ENV", "data_name", "user_dir", "user_path", "write_json_atomic"]

#: environment variable naming the folder of the user's fitted coefficients
DATA_DIR_ENV = "STITCHTUNE_DATA_DIR"


def data_name(device: Device | str) -> str:
    """``fitted_<device key, unsafe characters as _>.json``."""
    key = device if isinstance(device, str) else device.key
    return "fitted_" + re.sub(r"[^A-Za-z0-9_.-]", "_", key) + ".json"


def user_dir() -> Path:
    """``$STITCHTUNE_DATA_DIR``, else the platform's user data folder of stitchtune."""
    env = os.environ.get(DATA_DIR_ENV)
    if env:
        return Path(env)
    import platformdirs

    return Path(platformdirs.user_data_dir("stitchtune", appauthor=False))


def user_path(device: Device | str) -> Path:
    """The user's fitted coefficients of ``device`` (the file may not exist)."""
    return user_dir() / data_name(device)


def write_json_atomic(path: str | os.PathLike[str], data: Any) -> Path:
    """Write ``data`` as JSON to ``path`` through a temporary file and a rename (module docstring)."""
    return write_atomic(path, (json.dumps(data, indent=1, sort_keys=True) + "\n").encode("utf-8"))
