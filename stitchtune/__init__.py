"""stitchtune: autotuning of stitch schedules for memory-intensive GPU subgraphs.

The public Python entry points load lazily (PEP 562), so ``import stitchtune`` costs nothing heavy:

* ``stitchtune.compile(graph_or_path, db=..., device=...)`` -> ``CompiledGraph``
  (:mod:`stitchtune.deploy.compiled`);
* ``stitchtune.torch`` -> the PyTorch entry point (:mod:`stitchtune.torch`, re-exporting
  :mod:`stitchtune.deploy.torch_entry`), e.g. ``stitchtune.torch.compile(fn, example_inputs=...)``;
  ``import stitchtune.torch`` and ``import stitchtune`` + the attribute give the same module.

The package's rooms (subpackages) and the one direction their imports go are drawn in README.md.
"""

from __future__ import annotations

import importlib
from typing import Any

from stitchtune._version import __version__


def __getattr__(name: str) -> Any:
    if name == "compile":
        from stitchtune.deploy.compiled import compile

        return compile
    if name == "torch":
        return importlib.import_module("stitchtune.torch")
    raise AttributeError(f"module 'stitchtune' has no attribute {name!r}")
