"""Fast arithmetic inside kernels: the kernel operators the lowering uses where ``exact_math`` is 0.

What the GPU computes, and how the emulator models it (float32 throughout, so that the emulator's error
against the float64 reference is the GPU's; ``tests/lower/test_fast_math.py`` measures it per example):

* ``fast_exp`` (``exp``): ``st_exp(x)`` = ``ex2.approx.ftz.f32(x * log2(e))`` (inline PTX, :data:`FAST_CUDA_HELPERS`):
  one FMUL and one MUFU.EX2 (an accurate ``expf`` is a range reduction, two FMAs and a MUFU.EX2 with a scale
  fix-up; ``__expf`` without ``-ftz=true`` adds an FSETP and two predicated FMULs for subnormal results).
  Modelled as float32 ``exp2`` of the float32 product, results below the smallest normal flushed to 0.
* ``fast_div`` (a per-element ``a / b``): ``st_fdiv(a, b)`` = ``div.approx.ftz.f32`` = ``a * rcp.approx(b)``:
  one MUFU.RCP and one FMUL, no FCHK and no slow-path call (0 for ``2^126 < |b| < 2^128``). Modelled as
  ``float32(a * float32(1 / b))`` with that range giving 0 and a subnormal quotient flushed to zero.
* ``fast_sigmoid``, ``fast_silu``: the same two in ``1 / (1 + exp(-x))`` and ``x / (1 + exp(-x))``.
* ``fast_tanh``: ``st_tanh(x)``, ``tanhf`` without branches: an odd polynomial below ``|x| = 0.125``,
  ``1 - 2 / (1 + exp(2|x|))`` with x's sign above, both computed and one selected (FSEL, no branch).
* ``fast_gelu_tanh``: GELU's tanh form as ``x / (1 + exp(-2u))`` with the same two (``tanhf`` has branches,
  behind which ptxas does not hoist a thread's later loads).

* ``fast_rcp``: ``st_fdiv(1, x)``, the reciprocal of a per-row value (softmax's sum, a norm's scale),
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
    """``st_fdiv(a, b)`` (``div.approx.ftz.f32``) in float32 (see the module docstring)."""
    a32, b32 = _f32(a), _f32(b)
    with np.errstate(over="ignore", under="ignore", invalid="ignore", divide="ignore"):
        r = (a32 * (np.float32(1.0) / b32)).astype(np.float32)
        big = (np.abs(b32) > _RCP_ZERO) & np.isfinite(b32) & np.isfinite(a32)
    r = np.where(np.abs(r) < _TINY, np.float32(0.0) * r, r)   # ftz: a subnormal quotient is a signed zero
    return np.where(big, np.float32(0.0) * a32, r).astype(np.float32)


def fast_sigmoid(x: object) -> np.ndarray:
    return fast_div(np.float32(1.0), (np.float32(1.0) + fast_exp(-_f32(x))).astype(np.float32))


def fast_silu(x: object) -> np.ndarray:
    return fast_div(x, (np.float32(1.0) + fast_exp(-_f32(x))).astype(np.float32))


def fast_gelu_tanh(x: object) -> np.ndarray:
    """GELU's tanh form as ``x * sigmoid(2u)`` (``0.5 (1 + tanh u) = sigmoid(2u)``, ``u = sqrt(2/pi) (x + 0.044715
    x^3)``): ``st_fdiv(x, 1 + st_exp(-2u))``, no ``tanhf`` (whose branches keep a thread's later loads
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
    """``st_fdiv(1, x)`` in float32: the per-row reciprocal of fast arithmetic."""
    return fast_div(np.float32(1.0), x)


#: kernel operator -> (the graph op it stands for, its CUDA template, its numpy model); :mod:`stitchtune.graph.ops`
#: declares each in ``KERNEL_OPS`` with the graph op's arity and costs
FAST_KERNEL_OPS: dict[str, tuple[str, str, Callable[..., np.ndarray]]] = {
    "fast_exp": ("exp", "st_exp({0})", fast_exp),
    "fast_div": ("div", "st_fdiv({0}, {1})", fast_div),
    "fast_rcp": ("reciprocal", "st_fdiv(1.0f, {0})", fast_rcp),
    "fast_sigmoid": ("sigmoid", "st_fdiv(1.0f, (1.0f + st_exp((-{0}))))", fast_sigmoid),
    "fast_silu": ("silu", "st_fdiv({0}, (1.0f + st_exp((-{0}))))", fast_silu),
    "fast_tanh": ("tanh", "st_tanh({0})", fast_tanh),
    "fast_gelu_tanh": ("gelu_tanh", "st_fdiv({0}, (1.0f + st_exp((-1.5957692f * ({0} + (0.044715f * {0} * {0} * {0}))))))",
                       fast_gelu_tanh),
}

#: the CUDA helpers the fast templates call (``st_exp``, ``st_fdiv``, ``st_tanh``), rendered ahead of a kernel
#: that uses one (:func:`stitchtune.gpu.render.preamble`). ``ex2.approx.ftz.f32`` and ``div.approx.ftz.f32``
#: in inline PTX: ``__expf`` / ``__fdividef`` without ``-ftz=true`` compile to the non-flushing forms, whose
#: subnormal fix-ups cost an FSETP and two predicated FMULs per ``exp`` (what the numpy models above assume is
#: the flushing form). ``st_tanh`` computes both arms and selects with no branch (nvcc turned the ternary of
#: the two into a branch per element, with BSSY/BSYNC).
FAST_CUDA_HELPERS = r"""
// fast arithmetic (exact_math 0; stitchtune/graph/fast_ops.py models each in float32): flush-to-zero forms
__device__ __forceinline__ float st_ex2(float x) { float y; asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x)); return y; }
__device__ __forceinline__ float st_exp(float x) { return st_ex2(x * 1.4426950408889634f); }
__device__ __forceinline__ float st_fdiv(float a, float b) { float y; asm("div.approx.ftz.f32 %0, %1, %2;" : "=f"(y) : "f"(a), "f"(b)); return y; }
__device__ __forceinline__ float st_tanh(float x) {
  float a = fabsf(x), x2 = x * x;
  float poly = x * (1.0f + x2 * (-0.33333334f + x2 * (0.13333334f + x2 * -0.053968254f)));
  float big = copysignf(1.0f - st_fdiv(2.0f, 1.0f + st_exp(2.0f * a)), x);
  return a < 0.125f ? poly : big;
}
"""

#: graph operator -> its fast kernel operator (per-element use; ``exact_math`` 1 keeps the graph's)
FAST_FORM: dict[str, str] = {"exp": "fast_exp", "div": "fast_div", "sigmoid": "fast_sigmoid", "silu": "fast_silu",
                             "gelu_tanh": "fast_gelu_tanh", "tanh": "fast_tanh"}
