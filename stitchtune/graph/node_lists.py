"""Node lists of common computations, for the graph builders of tests and scripts (which cannot import
each other's helpers): a list of graph-JSON nodes (``{"id", "op", "args", ...}``) that a caller puts into
a graph's ``"nodes"`` with its own inputs and outputs.

* :func:`layernorm_rows`: LayerNorm over the innermost axis (a training step's forward);
* :func:`layernorm_backward_rows`: its input gradient (BERT's embedding backward before its scatters;
  ``tests/lower/test_scatter_*.py``, ``scripts/gpu_scatter_variants.py``).
"""

from __future__ import annotations

from typing import Any

__all__ = ["layernorm_backward_rows", "layernorm_rows"]


def layernorm_rows(x: str, eps: float = 1e-5) -> list[dict[str, Any]]:
    """LayerNorm over the innermost axis of ``x`` (weight ``g``, bias ``b`` over that axis), result ``xb``;
    the mean is ``m``, 1/std ``rs`` (what a training step's forward saves)."""
    return [{"id": "m", "op": "reduce_mean", "args": [x], "axes": [-1], "keepdims": True},
            {"id": "xc", "op": "sub", "args": [x, "m"]},
            {"id": "sq", "op": "mul", "args": ["xc", "xc"]},
            {"id": "var", "op": "reduce_mean", "args": ["sq"], "axes": [-1], "keepdims": True},
            {"id": "ve", "op": "add", "args": ["var", eps]},
            {"id": "rs", "op": "rsqrt", "args": ["ve"]},
            {"id": "xn", "op": "mul", "args": ["xc", "rs"]},
            {"id": "xg", "op": "mul", "args": ["xn", "g"]},
            {"id": "xb", "op": "add", "args": ["xg", "b"]}]


def layernorm_backward_rows() -> list[dict[str, Any]]:
    """LayerNorm's input gradient over the innermost axis, from the inputs ``dy``, ``xn`` (the normalised
    input), ``gamma`` and ``rstd`` (1/std, one per row): ``dx = (g - mean(g) - xn * mean(g * xn)) * rstd`` with
    ``g = dy * gamma`` (BERT's embedding backward before its scatters). A new list on every call."""
    return [{"id": "g", "op": "mul", "args": ["dy", "gamma"]},
            {"id": "m1", "op": "reduce_mean", "args": ["g"], "axes": [-1], "keepdims": True},
            {"id": "gx", "op": "mul", "args": ["g", "xn"]},
            {"id": "m2", "op": "reduce_mean", "args": ["gx"], "axes": [-1], "keepdims": True},
            {"id": "a", "op": "sub", "args": ["g", "m1"]},
            {"id": "b", "op": "mul", "args": ["xn", "m2"]},
            {"id": "c", "op": "sub", "args": ["a", "b"]},
            {"id": "dx", "op": "mul", "args": ["c", "rstd"]}]
