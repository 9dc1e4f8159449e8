"""``import stitchtune.torch``: the PyTorch entry point, importable as a module (``stitchtune.torch.compile``).

The same functions as the attribute ``stitchtune.torch`` (see :mod:`stitchtune`); they live in
:mod:`stitchtune.deploy.torch_entry`, documented there. Importing this module does not import PyTorch
(the functions do, when called): inside the package, ``import torch`` means the PyTorch package.
"""

from __future__ import annotations

from stitchtune.deploy.torch_entry import (
    StitchedFunction,
    TensorRefused,
    backend,
    check_errors,
    compile,
    explain,
    register_backend,
    reset_stats,
    stats,
)

__all__ = ["StitchedFunction", "TensorRefused", "backend", "check_errors", "compile", "explain", "register_backend",
           "reset_stats", "stats"]
