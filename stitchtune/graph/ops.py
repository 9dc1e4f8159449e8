"""The op table: every operator a graph.json may use, with its semantics in two languages.

Contract
--------
``OPS[name]`` is a frozen :class:`OpInfo`. For each op:

* ``np_fn`` is the numpy semantics. It accepts float32 *and* float64 arrays (and, for binary and ternary ops,
  a Python float scalar as any float operand) and returns an array of the same float dtype. The
  reference executor (``reference.py``) calls it on float64 arrays.
  For reductions ``np_fn(x, axis=tuple, keepdims=bool)`` (``np.sum``/``np.mean``/``np.max``/``np.min``).
  For ``cast`` it is the identity; the rounding is done by the caller, who knows the target dtype.
* ``cuda`` is a ``str.format`` template over fp32 operand expressions ``{0}``, ``{1}`` that gives a
  fully parenthesised fp32 CUDA expression using float intrinsics only (``expf``, ``rsqrtf``, ...)
  and ``f``-suffixed literals. Operands must be *atoms*: identifiers, calls, literals from
  :func:`format_float_literal`, or parenthesised expressions, because a template may use an operand
  more than once and may put a unary minus in front of it. For a reduction ``cuda`` is the
  per-element transform (``{0}``) and ``cuda_combine`` merges two partial results; for ``cast`` it is
  ``{0}`` (values are fp32 in registers; rounding happens at the store).
* ``arg_types`` gives the type each argument must have, one letter per argument: ``f`` a float
  tensor (or a constant where the op takes constants: binary and ternary ops), ``b`` a ``bool`` tensor;
  empty means every argument is ``f``; ``i`` an int tensor (``uniform``, gather's index). ``result`` is
  ``"float"`` (the promoted dtype of the float arguments), ``"bool"`` or ``"float32"`` (``uniform``). Bool values are 0.0 / 1.0 inside ``np_fn`` and inside kernels (fp32
  registers; see ``graph/parse.py`` for the dtype rules): comparisons return 1.0 for true, logical ops
  and ``where`` treat any non-zero value as true. Comparisons are IEEE: NaN compares false, except
  ``ne`` (true). ``clamp(x, lo, hi)`` is ``minimum(maximum(x, lo), hi)`` with NaN propagated from any
  argument (``lo > hi`` gives ``hi``, as numpy and torch do).
* ``flops`` / ``sfu`` are approximate per-element counts of fp32 ALU operations and special-function
  unit operations (MUFU: ex2, lg2, rsq, rcp, sqrt, tanh) for the cost model.
* Reductions also carry ``identity`` (the neutral element), ``combine_op`` (the binary operator
  merging two partials, ``+``/``max``/``min``: the kernel IR's ``Bin``; ``cuda_combine`` is its CUDA
  form), ``np_combine`` (a numpy ufunc, e.g. for combining partial results in the emulator) and
  ``is_mean`` (the result is divided by the number of reduced elements after combining).

* The index ops (``kind`` ``slice``, ``concat``, ``gather``) move elements without arithmetic:
  ``slice(x)`` with the node's ``axis``/``start``/``stop`` (step 1), ``concat(a, b, ...)`` along
  ``axis`` (two or more tensors, ``arity`` 0 = variadic), ``gather(table, idx)`` along axis 0:
  ``out[i..., :] = table[idx[i...], :]``, and a row of zeros where ``idx`` is out of range (``< 0`` or
  ``>= table.shape[0]``; kernels also raise an error flag there). ``idx`` (``arg_types`` ``i``) is an
  ``int32``/``int64`` graph input. ``gather_elements(x, idx)`` along ``axis`` (any): ``torch.gather`` /
  ONNX ``GatherElements``, ``out[p] = x[p with p[axis] := idx[p]]``, result shape ``idx.shape``, and
  0 where ``idx`` is out of ``[0, x.shape[axis])`` (flagged by kernels as for ``gather``). Their
  ``np_fn`` take the node's attributes as keywords.
* ``scatter_add(v, idx)`` (kind ``scatter``, the node's ``shape`` is the table's): an embedding's
  gradient, ``out = zeros(shape); out[idx[i...], ...] += v[i..., ...]`` along axis 0 (an index out of
  range adds nothing); ``np_fn`` is :func:`scatter_add`.

* ``ints``: the op also takes int tensors, when *all* its ``f`` arguments are ints (add, sub, mul,
  neg, abs, maximum, minimum, the comparisons, where's branches). ``np_fn`` is then exact on int64
  arrays (the reference wraps int32 results); kernels compute at the int width with wrapping
  arithmetic (:data:`INT_CUDA`). ``iota`` (kind ``iota``, no arguments) is :func:`iota`.

Nothing here knows about graphs; ``graph/parse.py`` checks arity and attributes against this table.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

from stitchtune.graph.fast_ops import FAST_KERNEL_OPS

__all__ = [
    "OpInfo",
    "OPS",
    "UNARY",
    "BINARY",
    "TERNARY",
    "REDUCTIONS",
    "COMMUTATIVE",
    "BOOL_RESULT",
    "format_float_literal",
    "get_op",
]

_SQRT1_2 = 0.7071067811865476  # 1/sqrt(2)
_SQRT_2_OVER_PI = 0.7978845608028654  # sqrt(2/pi)


@dataclass(frozen=True)
class OpInfo:
    """Static description of one operator (see the module docstring for the contract)."""

    name: str
    kind: str  # 'unary' | 'binary' | 'ternary' | 'reduce' | 'cast' | 'layout'
    arity: int
    np_fn: Callable[..., Any]
    cuda: str
    flops: int
    sfu: int
    commutative: bool = False
    identity: float | None = None
    combine_op: str | None = None  # the binary operator merging two partials: '+', 'max' or 'min'
    np_combine: Any = None  # numpy ufunc for reductions
    is_mean: bool = False
    arg_types: str = ""  # one of 'f' / 'b' per argument; '' = all float
    result: str = "float"  # 'float' | 'bool' | 'float32'
    ints: bool = False  # the 'f' arguments may instead all be int tensors (see "Integer values")

    def arg_type(self, i: int) -> str:
        """``'f'`` (float tensor or constant), ``'b'`` (bool tensor) or ``'i'`` (int tensor) for argument ``i``."""
        return self.arg_types[i] if self.arg_types and i < len(self.arg_types) else "f"

    def render(self, *operands: str) -> str:
        """The CUDA expression for this op applied to operand atoms (see module docstring)."""
        if len(operands) != self.arity:
            raise ValueError(f"{self.name} takes {self.arity} operand(s), got {len(operands)}")
        return self.cuda.format(*operands)

    @property
    def cuda_combine(self) -> str | None:
        """The CUDA form of :attr:`combine_op` over ``{0}`` and ``{1}`` (None for a non-reduction)."""
        return None if self.combine_op is None else _CUDA_COMBINE[self.combine_op]

    def combine(self, a: str, b: str) -> str:
        """The CUDA expression combining two partial reduction results (reductions only)."""
        if self.cuda_combine is None:
            raise ValueError(f"{self.name} is not a reduction")
        return self.cuda_combine.format(a, b)


#: how each combine operator renders in CUDA (the kernel IR renders its ``Bin`` nodes the same way)
_CUDA_COMBINE = {"+": "({0} + {1})", "max": "fmaxf({0}, {1})", "min": "fminf({0}, {1})"}


# ---------------------------------------------------------------------------- numpy semantics
def _rsqrt(x: np.ndarray) -> np.ndarray:
    out: np.ndarray = np.reciprocal(np.sqrt(x))
    return out


def _reciprocal(x: np.ndarray) -> np.ndarray:
    out: np.ndarray = np.reciprocal(x)
    return out


def _relu(x: np.ndarray) -> np.ndarray:
    x = np.asarray(x)
    out: np.ndarray = np.maximum(x, x.dtype.type(0))
    return out


def _erf(x: np.ndarray) -> np.ndarray:
    from scipy.special import erf  # scipy loads on first use only (0.25 s; validate/space never need it)

    out: np.ndarray = erf(x)
    return out


def _expit(x: np.ndarray) -> np.ndarray:
    from scipy.special import expit

    out: np.ndarray = expit(x)
    return out


def _gelu(x: np.ndarray) -> np.ndarray:
    x = np.asarray(x)
    t = x.dtype.type
    out: np.ndarray = t(0.5) * x * (t(1) + _erf(x * t(_SQRT1_2)))
    return out


def _gelu_tanh(x: np.ndarray) -> np.ndarray:
    x = np.asarray(x)
    t = x.dtype.type
    inner = t(_SQRT_2_OVER_PI) * (x + t(0.044715) * x * x * x)
    out: np.ndarray = t(0.5) * x * (t(1) + np.tanh(inner))
    return out


def _silu(x: np.ndarray) -> np.ndarray:
    out: np.ndarray = x * _expit(x)
    return out


def _identity(x: np.ndarray) -> np.ndarray:
    return x


def _float_dtype(*args: Any) -> np.dtype:
    """The float dtype of the first float array among ``args`` (float64 when there is none)."""
    for a in args:
        dt = getattr(a, "dtype", None)
        if isinstance(dt, np.dtype) and dt.kind == "f":
            return dt
    return np.dtype(np.float64)


def _cmp(ufunc: Any) -> Callable[..., Any]:
    """A comparison giving 1.0 / 0.0 in the operands' float dtype (IEEE: NaN compares false but ``!=``)."""
    def fn(a: Any, b: Any) -> np.ndarray:
        return np.asarray(ufunc(a, b)).astype(_float_dtype(a, b))
    fn.__name__ = ufunc.__name__
    return fn


def _logical(ufunc: Any) -> Callable[..., Any]:
    """A logical op on 0/1 values (non-zero is true), giving 1.0 / 0.0."""
    def fn(*xs: Any) -> np.ndarray:
        return np.asarray(ufunc(*(np.asarray(x) != 0 for x in xs))).astype(_float_dtype(*xs))
    fn.__name__ = ufunc.__name__
    return fn


def _where(c: Any, a: Any, b: Any) -> np.ndarray:
    if all(np.asarray(x).dtype.kind == "i" for x in (a, b)):  # int branches stay exact
        return np.asarray(np.where(np.asarray(c) != 0, a, b))
    return np.asarray(np.where(np.asarray(c) != 0, a, b)).astype(_float_dtype(a, b, c))


def _clamp(x: Any, lo: Any, hi: Any) -> np.ndarray:
    return np.asarray(np.minimum(np.maximum(x, lo), hi)).astype(_float_dtype(x, lo, hi))


def _to_bool(x: Any) -> np.ndarray:
    out: np.ndarray = (np.asarray(x) != 0).astype(_float_dtype(x))
    return out


# ---------------------------------------------------------------------------- the table
_TRUE_FALSE = " ? 1.0f : 0.0f)"


def _c(name: str, fn: Any, cop: str) -> OpInfo:
    """A comparison of two floats (or a float and a constant) giving a bool."""
    return OpInfo(name=name, kind="binary", arity=2, np_fn=_cmp(fn), cuda="(({0} " + cop + " {1})" + _TRUE_FALSE,
                  flops=1, sfu=0, commutative=name in ("eq", "ne"), arg_types="ff", result="bool", ints=True)


def _l(name: str, fn: Any, cuda: str, arity: int) -> OpInfo:
    """A logical op on bool tensors giving a bool."""
    return OpInfo(name=name, kind="unary" if arity == 1 else "binary", arity=arity, np_fn=_logical(fn),
                  cuda=cuda, flops=arity, sfu=0, commutative=arity == 2, arg_types="b" * arity, result="bool")


def _u(name: str, fn: Callable[..., Any], cuda: str, flops: int, sfu: int, ints: bool = False) -> OpInfo:
    return OpInfo(name=name, kind="unary", arity=1, np_fn=fn, cuda=cuda, flops=flops, sfu=sfu, ints=ints)


def _b(name: str, fn: Callable[..., Any], cuda: str, flops: int, sfu: int, comm: bool,
       ints: bool = False) -> OpInfo:
    return OpInfo(name=name, kind="binary", arity=2, np_fn=fn, cuda=cuda, flops=flops, sfu=sfu,
                  commutative=comm, ints=ints)


def _r(name: str, fn: Callable[..., Any], identity: float, combine: str, np_combine: Any,
       is_mean: bool = False) -> OpInfo:
    return OpInfo(name=name, kind="reduce", arity=1, np_fn=fn, cuda="{0}", flops=1, sfu=0,
                  identity=identity, combine_op=combine, np_combine=np_combine, is_mean=is_mean)


_TABLE: tuple[OpInfo, ...] = (
    # unary
    _u("neg", np.negative, "(-{0})", 1, 0, ints=True),
    _u("abs", np.abs, "fabsf({0})", 1, 0, ints=True),
    _u("exp", np.exp, "expf({0})", 2, 1),
    _u("log", np.log, "logf({0})", 2, 1),
    _u("sqrt", np.sqrt, "sqrtf({0})", 1, 1),
    _u("rsqrt", _rsqrt, "rsqrtf({0})", 1, 1),
    _u("reciprocal", _reciprocal, "(1.0f / {0})", 1, 1),
    _u("square", np.square, "({0} * {0})", 1, 0),
    _u("tanh", np.tanh, "tanhf({0})", 2, 1),
    # sinf/cosf: full-range argument reduction (no fast-math), rotary embeddings' cos/sin tables
    _u("sin", np.sin, "sinf({0})", 4, 1),
    _u("cos", np.cos, "cosf({0})", 4, 1),
    _u("sigmoid", _expit, "(1.0f / (1.0f + expf((-{0}))))", 4, 2),
    _u("relu", _relu, "fmaxf({0}, 0.0f)", 1, 0),
    _u("erf", _erf, "erff({0})", 10, 0),
    _u("gelu", _gelu, "(0.5f * {0} * (1.0f + erff(({0} * 0.70710677f))))", 14, 0),
    _u("gelu_tanh", _gelu_tanh,
       "(0.5f * {0} * (1.0f + tanhf((0.7978846f * ({0} + (0.044715f * {0} * {0} * {0}))))))", 9, 1),
    _u("silu", _silu, "({0} / (1.0f + expf((-{0}))))", 4, 2),
    # binary
    _b("add", np.add, "({0} + {1})", 1, 0, True, ints=True),
    _b("sub", np.subtract, "({0} - {1})", 1, 0, False, ints=True),
    _b("mul", np.multiply, "({0} * {1})", 1, 0, True, ints=True),
    _b("div", np.divide, "({0} / {1})", 2, 1, False),
    _b("maximum", np.maximum, "fmaxf({0}, {1})", 1, 0, True, ints=True),
    _b("minimum", np.minimum, "fminf({0}, {1})", 1, 0, True, ints=True),
    _b("pow", np.power, "powf({0}, {1})", 4, 2, False),
    # comparisons (float, float -> bool) and logical ops (bool -> bool)
    _c("lt", np.less, "<"),
    _c("le", np.less_equal, "<="),
    _c("gt", np.greater, ">"),
    _c("ge", np.greater_equal, ">="),
    _c("eq", np.equal, "=="),
    _c("ne", np.not_equal, "!="),
    _l("logical_and", np.logical_and, "((({0} != 0.0f) && ({1} != 0.0f))" + _TRUE_FALSE, 2),
    _l("logical_or", np.logical_or, "((({0} != 0.0f) || ({1} != 0.0f))" + _TRUE_FALSE, 2),
    _l("logical_not", np.logical_not, "(({0} == 0.0f)" + _TRUE_FALSE, 1),
    # ternary: where(cond bool, a, b), clamp(x, lo, hi); a, b, lo, hi may be constants
    OpInfo(name="where", kind="ternary", arity=3, np_fn=_where, cuda="(({0} != 0.0f) ? {1} : {2})",
           flops=1, sfu=0, arg_types="bff", ints=True),
    OpInfo(name="clamp", kind="ternary", arity=3, np_fn=_clamp,
           cuda="(((({0} != {0}) || ({1} != {1})) || ({2} != {2})) ? ({0} + {1} + {2}) : fminf(fmaxf({0}, {1}), {2}))",
           flops=5, sfu=0, arg_types="fff"),
    # reductions
    _r("reduce_sum", np.sum, 0.0, "+", np.add),
    _r("reduce_mean", np.mean, 0.0, "+", np.add, is_mean=True),
    _r("reduce_max", np.max, -math.inf, "max", np.maximum),
    _r("reduce_min", np.min, math.inf, "min", np.minimum),
    # cast
    OpInfo(name="cast", kind="cast", arity=1, np_fn=_identity, cuda="{0}", flops=0, sfu=0),
    # layout (index maps inside a region: the element moves, the value does not change; the
    # reference applies ``np.transpose(x, perm)`` / ``x.reshape(shape)`` / ``np.broadcast_to(x, shape)``,
    # see graph/reference.py; ``expand`` grows size-1 dims and may add leading dims, as numpy's
    # ``broadcast_to``: a broadcast, zero stride along the grown dims)
    OpInfo(name="transpose", kind="layout", arity=1, np_fn=_identity, cuda="{0}", flops=0, sfu=0),
    OpInfo(name="reshape", kind="layout", arity=1, np_fn=_identity, cuda="{0}", flops=0, sfu=0),
    OpInfo(name="expand", kind="layout", arity=1, np_fn=_identity, cuda="{0}", flops=0, sfu=0),
)

OPS: dict[str, OpInfo] = {op.name: op for op in _TABLE}
TERNARY: tuple[str, ...] = tuple(o.name for o in _TABLE if o.kind == "ternary")
BOOL_RESULT: frozenset[str] = frozenset(o.name for o in _TABLE if o.result == "bool")
UNARY: tuple[str, ...] = tuple(o.name for o in _TABLE if o.kind == "unary")
BINARY: tuple[str, ...] = tuple(o.name for o in _TABLE if o.kind == "binary")
REDUCTIONS: tuple[str, ...] = tuple(o.name for o in _TABLE if o.kind == "reduce")
COMMUTATIVE: frozenset[str] = frozenset(o.name for o in _TABLE if o.commutative)


def _slice(x: np.ndarray, *, axis: int, start: int, stop: int) -> np.ndarray:
    idx = [slice(None)] * x.ndim
    idx[axis] = slice(start, stop)
    return x[tuple(idx)]


def _concat(*xs: np.ndarray, axis: int) -> np.ndarray:
    return np.concatenate(xs, axis=axis)


def gather_rows(table: np.ndarray, idx: np.ndarray) -> np.ndarray:
    """``table[idx]`` along axis 0 with a zero row wherever ``idx`` is out of ``[0, len(table))``."""
    idx = np.asarray(idx, dtype=np.int64)
    ok = (idx >= 0) & (idx < table.shape[0])
    out = table[np.where(ok, idx, 0)]
    out[~ok] = 0
    return out


def _gather(table: np.ndarray, idx: np.ndarray, *, axis: int = 0) -> np.ndarray:
    return gather_rows(table, idx)


def gather_elements(x: np.ndarray, idx: np.ndarray, *, axis: int) -> np.ndarray:
    """``out[p] = x[p with p[axis] := idx[p]]`` (``torch.gather`` / ONNX ``GatherElements``; ``idx``
    no larger than ``x`` along the other axes), 0 wherever ``idx`` is out of ``[0, x.shape[axis])``."""
    idx = np.asarray(idx, dtype=np.int64)
    ok = (idx >= 0) & (idx < x.shape[axis])
    part = x[tuple(slice(0, d) if k != axis else slice(None) for k, d in enumerate(idx.shape))]
    out = np.take_along_axis(part, np.where(ok, idx, 0), axis=axis)
    out[~ok] = 0
    return out


def iota(shape: tuple[int, ...], axis: int) -> np.ndarray:
    """``iota``'s value (int64): each element's coordinate along ``axis`` of ``shape``."""
    line = np.arange(shape[axis], dtype=np.int64).reshape([-1 if d == axis else 1 for d in range(len(shape))])
    return np.broadcast_to(line, shape)


#: ``iota`` (kind ``iota``, no arguments): an int tensor of the node's ``shape`` and ``dtype`` whose
#: element is its coordinate along ``axis`` (``torch.arange`` broadcast); ``np_fn`` is :func:`iota`
IOTA = OpInfo(name="iota", kind="iota", arity=0, np_fn=iota, cuda="{0}", flops=0, sfu=0)
OPS[IOTA.name] = IOTA

_M32 = 0xFFFFFFFF


def uniform(seed: Any, idx: Any) -> np.ndarray:
    """``uniform``'s value (float32 in ``[0, 1)``, 24 random bits): a counter-based hash of the int64
    ``seed`` and the int32 element counter ``idx`` (murmur3's finaliser over ``idx * 0x9E3779B1 + lo``
    with ``hi`` mixed in, ``lo`` / ``hi`` the seed's 32-bit halves), then its top 24 bits times 2**-24.
    Kernels compute the same bits (:data:`UNIFORM` ``cuda``); torch's ``stitchtune::rand`` too."""
    s = np.asarray(seed).astype(np.int64).astype(np.uint64)
    i = np.asarray(idx).astype(np.int64).astype(np.uint64) & np.uint64(_M32)
    m = np.uint64(_M32)
    lo, hi = s & m, (s >> np.uint64(32)) & m
    h = (i * np.uint64(0x9E3779B1) + lo) & m
    h ^= h >> np.uint64(16)
    h = (h * np.uint64(0x85EBCA6B)) & m
    h ^= hi
    h ^= h >> np.uint64(13)
    h = (h * np.uint64(0xC2B2AE35)) & m
    h ^= h >> np.uint64(16)
    return ((h >> np.uint64(8)).astype(np.float64) * 2.0**-24).astype(np.float32)


#: ``uniform(seed, idx)`` (kind ``binary``, two int tensors, result float32): a random number in
#: ``[0, 1)`` per element, :func:`uniform` of the int64 seed and the int32 counter (a region's dropout
#: draws ``rand`` with it: the counter is the element's flat index). Its CUDA form is a device lambda
#: called in place (one expression, operands used once).
UNIFORM = OpInfo(
    name="uniform", kind="binary", arity=2, np_fn=uniform, flops=16, sfu=0, arg_types="ii", result="float32",
    cuda=("([](unsigned long long s, unsigned int i) -> float {{ unsigned int h = i * 0x9E3779B1u + "
          "(unsigned int)s; h ^= h >> 16; h *= 0x85EBCA6Bu; h ^= (unsigned int)(s >> 32); h ^= h >> 13; "
          "h *= 0xC2B2AE35u; h ^= h >> 16; return (float)(h >> 8) * 5.9604644775390625e-08f; }}"
          "((unsigned long long)({0}), (unsigned int)({1})))"))
OPS[UNIFORM.name] = UNIFORM

_INDEX_OPS: tuple[OpInfo, ...] = (
    OpInfo(name="slice", kind="slice", arity=1, np_fn=_slice, cuda="{0}", flops=0, sfu=0),
    OpInfo(name="concat", kind="concat", arity=0, np_fn=_concat, cuda="{0}", flops=0, sfu=0),
    OpInfo(name="gather", kind="gather", arity=2, np_fn=_gather, cuda="{0}", flops=0, sfu=0, arg_types="fi"),
    OpInfo(name="gather_elements", kind="gather_elements", arity=2, np_fn=gather_elements, cuda="{0}", flops=0,
           sfu=0, arg_types="fi"),
)
OPS.update({op.name: op for op in _INDEX_OPS})
#: the op kinds that only move elements (index remaps inside a region)
INDEX_KINDS: frozenset[str] = frozenset(("slice", "concat", "gather", "gather_elements"))
#: the op kinds that read a runtime int index tensor (an error flag for an out-of-range index)
GATHER_KINDS: frozenset[str] = frozenset(("gather", "gather_elements"))


def scatter_add(v: np.ndarray, idx: np.ndarray, *, shape: tuple[int, ...]) -> np.ndarray:
    """``out = zeros(shape); out[idx[i...], ...] += v[i..., ...]`` along axis 0 of the table (an embedding's
    gradient): ``v.shape == idx.shape + shape[1:]``; an index out of ``[0, shape[0])`` adds nothing."""
    idx = np.asarray(idx, dtype=np.int64)
    v = np.asarray(v)
    out = np.zeros(shape, dtype=v.dtype)
    ok = (idx >= 0) & (idx < shape[0])
    np.add.at(out, idx[ok], v[ok])
    return out


#: ``scatter_add(v, idx)`` (kind ``scatter``) with the node's ``shape`` (the table's): the rows of ``v``
#: added into a table of zeros at the rows ``idx`` names (:func:`scatter_add`); ``idx`` an
#: ``int32``/``int64`` graph input, ``v`` float. Kernels add with float atomics into the zeroed table.
SCATTER_ADD = OpInfo(name="scatter_add", kind="scatter", arity=2, np_fn=scatter_add, cuda="{0}", flops=1, sfu=0,
                     arg_types="fi")
OPS[SCATTER_ADD.name] = SCATTER_ADD


def _round_to(dtype_name: str) -> Callable[[np.ndarray], np.ndarray]:
    def fn(x: np.ndarray) -> np.ndarray:
        if dtype_name == "bfloat16":
            import ml_dtypes

            return np.asarray(x).astype(ml_dtypes.bfloat16).astype(np.asarray(x).dtype)
        return np.asarray(x).astype(np.float16).astype(np.asarray(x).dtype)
    return fn


#: Kernel-internal operators (never valid in graph.json, so not in :data:`OPS`): the rounding of a
#: float32 register value to a 16-bit type and back, which is what a ``cast`` to that type means
#: inside a kernel whose arithmetic is float32.
KERNEL_OPS: dict[str, OpInfo] = {
    "round_float16": OpInfo(name="round_float16", kind="unary", arity=1, np_fn=_round_to("float16"),
                            cuda="__half2float(__float2half_rn({0}))", flops=2, sfu=0),
    "round_bfloat16": OpInfo(name="round_bfloat16", kind="unary", arity=1, np_fn=_round_to("bfloat16"),
                             cuda="__bfloat162float(__float2bfloat16_rn({0}))", flops=2, sfu=0),
    # a cast to bool inside a kernel: bools are 0.0f / 1.0f in fp32 registers, NaN is true (non-zero)
    "to_bool": OpInfo(name="to_bool", kind="unary", arity=1, np_fn=_to_bool,
                      cuda="(({0} != 0.0f)" + _TRUE_FALSE, flops=1, sfu=0),
}


# the fast forms of exp / div / sigmoid / silu (stitchtune.graph.fast_ops): the graph op's arity and costs
KERNEL_OPS.update({name: OpInfo(name=name, kind=OPS[of].kind, arity=OPS[of].arity, np_fn=fn, cuda=cuda,
                                flops=OPS[of].flops, sfu=OPS[of].sfu)
                   for name, (of, cuda, fn) in FAST_KERNEL_OPS.items()})


def kernel_op(name: str) -> OpInfo:
    """The :class:`OpInfo` of an operator that may appear in a kernel: a graph op or a kernel op."""
    return OPS[name] if name in OPS else KERNEL_OPS[name]


def get_op(name: str) -> OpInfo:
    """The :class:`OpInfo` for ``name``; ``KeyError`` if unknown (graph validation reports it first)."""
    return OPS[name]


def format_float_literal(x: float) -> str:
    """A CUDA fp32 literal *atom* for the constant ``x`` (rounded to float32 first).

    The decimal is the shortest one that reads back as exactly ``float32(x)``, so the literal is
    exact: ``1e-05`` -> ``1e-05f``, ``2`` -> ``2.0f``, ``-0.5`` -> ``(-0.5f)``,
    ``inf`` -> ``INFINITY``, ``-inf`` -> ``(-INFINITY)``, ``nan`` -> ``NAN``. Finite values beyond
    float32 range raise ``ValueError`` (graph validation rejects such constants).
    """
    x = float(x)
    if math.isnan(x):
        return "NAN"
    if math.isinf(x):
        return "INFINITY" if x > 0 else "(-INFINITY)"
    with np.errstate(over="ignore"):
        f = np.float32(x)
    if math.isinf(float(f)):
        raise ValueError(f"constant {x!r} is outside float32 range")
    neg = math.copysign(1.0, float(f)) < 0
    text = str(np.float32(abs(float(f))))
    if not any(c in text for c in ".e"):
        text += ".0"
    lit = text + "f"
    return f"(-{lit})" if neg else lit
