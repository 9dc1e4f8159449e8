"""Fast arithmetic inside kernels: the kernel operators the lowering uses where ``exact_math`` is 0.

What the GPU computes, and how the emulator models it (float32 throughout, so that the emulator's error
against the float64 reference is the GPU's; ``tests/lower/test_fast_math.py`` measures it per example):

* ``fast_exp`` (``exp``): ``__expf(x)``, i.e. ``ex2.approx.ftz.f32(x * log2(e))``: one FMUL and one
  MUFU.EX2 (an accurate ``expf`` is a range reduction, two FMAs and a MUFU.EX2 with a scale fix-up).
  Modelled as float32 ``exp2`` of the float32 product, results below the smallest normal flushed to 0.
* ``fast_div`` (a per-element ``a / b``): ``__fdividef(a, b)`` = ``a * rcp.approx(b)``: one MUFU.RCP and
  one FMUL, no FCHK and no slow-path call (0 for ``2^126 < |b| < 2^128``). Modelled as
  ``float32(a * float32(1 / b))`` with that range giving 0.
* ``fast_sigmoid``, ``fast_silu``: the same two in ``1 / (1 + exp(-x))`` and ``x / (1 + exp(-x))``.
* ``fast_tanh``: ``tanhf`` without branches: an odd polynomial below ``|x| = 0.125``, ``1 - 2 / (1 + exp(2|x|))``
  with x's sign above, both computed and one selected.
* ``fast_gelu_tanh``: GELU's tanh form as ``x / (1 + exp(-2u))`` with the same two (``tanhf`` has branches,
  behind which ptxas does not hoist a thread's later loads).

* ``fast_rcp``: ``__fdividef(1, x)``, the reciprocal of a per-row value (softmax's sum, a norm's scale),
  taken once per row by the lowering, which multiplies each element by it
  (:class:`~stitchtune.lower.sweep_values.SweepValues`); a division by a constant multiplies by its float32
  reciprocal. The documented tolerance is in ``docs/fast-math.md``.
"""

from __future__ import annotations

from typing import Callable

import numpy as np


LOG2E = np.float32(1.4426950408889634)
_TINY = np.float32(np.finfo(np.float32).tiny)
_RCP_ZERO = np.float32(2.0 ** 126)


def _f32(x: object) -> np.ndarray:
    return np.asarray(x, dtype=np.float32)


def fast_exp(x: object) -> np.ndarray:
    """``ex2.approx.ftz(x * log2 e)`` in float32 (see the module docstring)."""
    with np.errstate(over="ignore", under="ignore", invalid="ignore"):
        r = np.exp2(_f32(x) * LOG2E).astype(np.float32)
    return np.where(np.abs(r) < _TINY, np.float32(0.0), r).astype(np.float32)


def fast_div(a: object, b: object) -> np.ndarray:
    """``__fdividef(a, b)`` in float32 (see the module docstring)."""
    a32, b32 = _f32(a), _f32(b)
    with np.errstate(over="ignore", under="ignore", invalid="ignore", divide="ignore"):
        r = (a32 * (np.float32(1.0) / b32)).astype(np.float32)
        big = (np.abs(b32) > _RCP_ZERO) & np.isfinite(b32) & np.isfinite(a32)
    return np.where(big, np.float32(0.0) * a32, r).astype(np.float32)


def fast_sigmoid(x: object) -> np.ndarray:
    return fast_div(np.float32(1.0), (np.float32(1.0) + fast_exp(-_f32(x))).astype(np.float32))


def fast_silu(x: object) -> np.ndarray:
    return fast_div(x, (np.float32(1.0) + fast_exp(-_f32(x))).astype(np.float32))


def fast_gelu_tanh(x: object) -> np.ndarray:
    """GELU's tanh form as ``x * sigmoid(2u)`` (``0.5 (1 + tanh u) = sigmoid(2u)``, ``u = sqrt(2/pi) (x + 0.044715
    x^3)``): ``__fdividef(x, 1 + __expf(-2u))``, no ``tanhf`` (whose branches keep a thread's later loads
    behind its first use)."""
    x32 = _f32(x)
    u = (np.float32(1.5957692) * (x32 + np.float32(0.044715) * x32 * x32 * x32)).astype(np.float32)
    return fast_div(x32, (np.float32(1.0) + fast_exp(-u)).astype(np.float32))


#: fast_tanh: below this |x| an odd polynomial (Taylor to x^7: truncation < 2e-9 relative), above it
#: ``1 - 2 / (1 + exp(2 |x|))`` with the sign of x; both computed, one selected: no branch
TANH_SMALL = np.float32(0.125)


def fast_tanh(x: object) -> np.ndarray:
    """``tanhf`` without its branches (see :data:`TANH_SMALL`), in float32."""
    x32 = _f32(x)
    x2 = (x32 * x32).astype(np.float32)
    poly = (x32 * (np.float32(1.0) + x2 * (np.float32(-0.33333334) + x2 * (np.float32(0.13333334)
                                                                            + x2 * np.float32(-0.053968254)))))
    big = np.float32(1.0) - fast_div(np.float32(2.0), (np.float32(1.0) + fast_exp(np.float32(2.0) * np.abs(x32))))
    out: np.ndarray = np.where(np.abs(x32) < TANH_SMALL, poly, np.copysign(big, x32)).astype(np.float32)
    return out


def fast_rcp(x: object) -> np.ndarray:
    """``__fdividef(1, x)`` in float32: the per-row reciprocal of fast arithmetic."""
    return fast_div(np.float32(1.0), x)


#: kernel operator -> (the graph op it stands for, its CUDA template, its numpy model); :mod:`stitchtune.graph.ops`
#: declares each in ``KERNEL_OPS`` with the graph op's arity and costs
FAST_KERNEL_OPS: dict[str, tuple[str, str, Callable[..., np.ndarray]]] = {
    "fast_exp": ("exp", "__expf({0})", fast_exp),
    "fast_div": ("div", "__fdividef({0}, {1})", fast_div),
    "fast_rcp": ("reciprocal", "__fdividef(1.0f, {0})", fast_rcp),
    "fast_sigmoid": ("sigmoid", "__fdividef(1.0f, (1.0f + __expf((-{0}))))", fast_sigmoid),
    "fast_silu": ("silu", "__fdividef({0}, (1.0f + __expf((-{0}))))", fast_silu),
    "fast_tanh": ("tanh", "(fabsf({0}) < 0.125f ? {0} * (1.0f + {0} * {0} * (-0.33333334f + {0} * {0} * (0.13333334f + "
                          "{0} * {0} * -0.053968254f))) : copysignf(1.0f - __fdividef(2.0f, 1.0f + __expf(2.0f * fabsf({0}))), "
                          "{0}))", fast_tanh),
    "fast_gelu_tanh": ("gelu_tanh", "__fdividef({0}, (1.0f + __expf((-1.5957692f * ({0} + (0.044715f * {0} * {0} * {0}))))))",
                       fast_gelu_tanh),
}

#: graph operator -> its fast kernel operator (per-element use; ``exact_math`` 1 keeps the graph's)
FAST_FORM: dict[str, str] = {"exp": "fast_exp", "div": "fast_div", "sigmoid": "fast_sigmoid", "silu": "fast_silu",
                             "gelu_tanh": "fast_gelu_tanh", "tanh": "fast_tanh"}
