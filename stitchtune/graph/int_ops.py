"""The int ops of kernels that hold int registers (:mod:`stitchtune.plan.ints`): their CUDA forms at one int
C type (:data:`INT_CUDA`, :data:`INT_CTYPES`), the numpy forms the reference and the emulator run
(:func:`int_np`: the op of :data:`stitchtune.graph.ops.OPS` at an int dtype, wrapping as the kernel does) and
the float -> int conversion of a cast (:func:`float_to_int`: truncation toward zero, NaN -> 0, saturating).
"""

from __future__ import annotations

from typing import Any, Callable

import numpy as np

from stitchtune.graph.ops import OPS

__all__ = ["INT_CUDA", "INT_CTYPES", "float_to_int", "int_np"]


#: The CUDA forms of the int ops on operands of one int C type: ``{s}`` is that signed type (``int`` /
#: ``long long``), ``{u}`` its unsigned twin; arithmetic goes through the unsigned type, so it wraps
#: (two's complement) where signed overflow would be undefined. ``from_float`` is a cast of a float32
#: value: truncation toward zero, NaN -> 0, saturating (``cvt.rzi``), ``{f2i}`` the intrinsic.
#: Comparisons and ``where`` use their float templates (C compares and selects ints alike).
INT_CUDA: dict[str, str] = {
    "add": "(({s})(({u}){0} + ({u}){1}))",
    "sub": "(({s})(({u}){0} - ({u}){1}))",
    "mul": "(({s})(({u}){0} * ({u}){1}))",
    "neg": "(({s})(-(({u}){0})))",
    "abs": "(({0} < 0) ? (({s})(-(({u}){0}))) : {0})",
    "maximum": "max({0}, {1})",
    "minimum": "min({0}, {1})",
    "from_float": "(({0} != {0}) ? (({s})0) : {f2i}({0}))",
}
#: the C types and float -> int intrinsic of each int width, as :data:`INT_CUDA` takes them
INT_CTYPES: dict[str, dict[str, str]] = {
    "int32": {"s": "int", "u": "unsigned int", "f2i": "__float2int_rz"},
    "int64": {"s": "long long", "u": "unsigned long long", "f2i": "__float2ll_rz"},
}


def float_to_int(x: Any, dtype: str) -> np.ndarray:
    """``x`` (float) converted to int ``dtype`` as kernels do (``from_float``): truncation toward zero,
    NaN -> 0, values beyond the range the nearest limit. Returns an array of that dtype."""
    info = np.iinfo(np.dtype(dtype))
    t = np.trunc(np.asarray(x, dtype=np.float64))
    lim = -float(info.min)  # 2**(bits - 1), exact in float64
    ok = np.isfinite(t) & (t >= info.min) & (t < lim)
    out = np.where(ok, t, 0).astype(np.int64)
    out = np.where(t >= lim, info.max, np.where(t < info.min, info.min, out))
    return np.asarray(out).astype(np.dtype(dtype))


def int_np(op: str, dtype: str) -> Callable[..., np.ndarray]:
    """The numpy form of int op ``op`` (a key of :data:`INT_CUDA`) at int ``dtype``: arguments are
    converted to that dtype and the result wraps as in the kernel."""
    dt = np.dtype(dtype)
    if op == "from_float":
        return lambda x: float_to_int(x, dtype)
    fn = OPS[op].np_fn

    def apply(*xs: Any) -> np.ndarray:
        with np.errstate(over="ignore"):
            return np.asarray(fn(*(np.asarray(x).astype(dt) for x in xs))).astype(dt)
    return apply
