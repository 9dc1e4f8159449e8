"""stitchtune: autotuning of stitch schedules for memory-intensive GPU subgraphs."""

from __future__ import annotations

__version__ = "0.1.0"


def __getattr__(name: str):  # noqa: ANN202 - lazy public API (PEP 562): heavy modules load on first use
    if name == "compile":
        from stitchtune.deploy.compiled import compile

        return compile
    raise AttributeError(f"module 'stitchtune' has no attribute {name!r}")
