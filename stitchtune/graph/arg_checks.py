"""graph.json, per node: the types of an op's arguments (:func:`check_arg_types`: float, bool and int
tensors where the op takes them, int constants of int ops within their dtype's range) and the result dtype
of int arithmetic (:func:`promote_ints`). Called by :mod:`stitchtune.graph.parse_node`.
"""

from __future__ import annotations

import math

from stitchtune.graph.checks import _Problems, _show
from stitchtune.graph.ops import OpInfo
from stitchtune.graph.values import INPUT_ONLY_DTYPES, INT_DTYPES, TensorSpec

#: op kinds that take a tensor of any dtype (bool, float, int): they convert it (cast) or only move
#: its elements (index maps); their result keeps the dtype (cast: gives ``to``)
_ANY_DTYPE_KINDS = frozenset(("cast", "slice", "concat", "layout"))
_INT_READERS = ("an int tensor is read by the int ops (add sub mul neg abs maximum minimum, the comparisons, "
                "where's branches), cast, the layout and index ops, and as the index of gather, gather_elements and scatter_add")
#: the largest integer constant an int op takes (constants are held as float64: exact up to here)
MAX_INT_CONSTANT = 2**53
_INT_RANGE = {"int32": (-2**31, 2**31 - 1), "int64": (-2**63, 2**63 - 1)}


def check_arg_types(path: str, info: OpInfo, values: list[str | float], specs: list[TensorSpec],
                    p: _Problems) -> bool:
    """Whether every tensor argument has the type ``info.arg_types`` asks for (cast, slice, concat and
    the layout ops take any dtype); a problem naming the argument and its dtype is added for each one
    that does not. Where ``info.ints``, the ``f`` arguments may all be int tensors instead (their
    constants then integers in the result dtype's range); ``reduce_sum`` also takes a bool tensor (a
    count). Any other int tensor is accepted only by the ops above and as gather's index."""
    ok, k = True, 0
    numeric = [specs[i].dtype for i, v in enumerate(a for a in values if isinstance(a, str))
               if info.arg_type(_tensor_position(values, i)) == "f"]
    int_mode = info.ints and any(d in INT_DTYPES for d in numeric)
    if int_mode and any(d not in INT_DTYPES for d in numeric):
        shown = ", ".join(f"{_show(v)} ({specs[i].dtype})" for i, v in enumerate(a for a in values if isinstance(a, str))
                          if info.arg_type(_tensor_position(values, i)) == "f")
        p.add(f"{path}.args", f"{info.name} cannot mix int and non-int tensors: {shown}; cast one of them first")
        return False
    for j, v in enumerate(values):
        if not isinstance(v, str):
            if int_mode and info.arg_type(j) == "f":
                ok = _check_int_constant(f"{path}.args[{j}]", info, v, promote_ints(numeric), p) and ok
            continue
        dtype = specs[k].dtype
        k += 1
        want = info.arg_type(j)
        if dtype in INPUT_ONLY_DTYPES and info.kind != "cast":
            p.add(f"{path}.args[{j}]", f"{info.name} cannot take {_show(v)} ({dtype}): a {dtype} input is read "
                                       "only by cast (to float32, float16 or bfloat16)")
            ok = False
            continue
        if want == "i" and info.kind == "binary" and dtype not in INT_DTYPES:   # uniform's seed and counter
            p.add(f"{path}.args[{j}]", f"{info.name} needs an int tensor here; {_show(v)} is {dtype}")
            ok = False
            continue
        if want == "i" or info.kind in _ANY_DTYPE_KINDS:  # gather's own check names the index's dtype
            continue
        if info.name == "reduce_sum" and dtype == "bool":  # a count (float32, see _node_spec)
            continue
        if dtype in INT_DTYPES:
            if int_mode and want == "f":
                continue
            p.add(f"{path}.args[{j}]", f"{info.name} cannot take {_show(v)} ({dtype}): {_INT_READERS}; "
                                       "cast it first")
            ok = False
            continue
        want_bool = want == "b"
        if want_bool and dtype != "bool":
            p.add(f"{path}.args[{j}]", f"{info.name} needs a bool tensor here; {_show(v)} is {dtype}")
            ok = False
        elif not want_bool and dtype == "bool":
            what = "float or int" if info.ints else "float"
            p.add(f"{path}.args[{j}]", f"{info.name} needs a {what} tensor here; {_show(v)} is bool "
                                       f"(cast it to a {what} dtype first)")
            ok = False
    return ok


def _tensor_position(values: list[str | float], i: int) -> int:
    """The argument position of the ``i``-th tensor argument in ``values``."""
    return [j for j, v in enumerate(values) if isinstance(v, str)][i]


def promote_ints(dtypes: list[str]) -> str:
    """int64 if any of ``dtypes`` is int64, else int32 (the result dtype of int arithmetic)."""
    return "int64" if "int64" in dtypes else "int32"


def _check_int_constant(path: str, info: OpInfo, c: float, dtype: str, p: _Problems) -> bool:
    """Whether constant ``c`` of an int op is an integer within ``dtype``'s range and within
    +-:data:`MAX_INT_CONSTANT` (a problem is added if not)."""
    lo, hi = _INT_RANGE[dtype]
    if not math.isfinite(c) or c != int(c):
        p.add(path, f"{info.name} on int tensors needs an integer constant, got {_show(c)}")
        return False
    if not max(lo, -MAX_INT_CONSTANT) <= int(c) <= min(hi, MAX_INT_CONSTANT):
        p.add(path, f"constant {int(c)} is outside the range of {dtype} (or beyond 2**53)")
        return False
    return True
