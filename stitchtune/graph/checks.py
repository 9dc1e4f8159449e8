"""graph.json validation below the nodes: limits, problem messages, single-value checks, top-level sections.

:mod:`stitchtune.graph.parse` builds the :class:`~stitchtune.graph.parse.Graph` and parses the nodes; this
module holds what it checks around them:

* the size limits (``MAX_*``) and :data:`NAME_RE`, re-exported by :mod:`stitchtune.graph.parse`;
* the problem list (one ``"<json path>: <what is wrong>"`` line each, at most ``MAX_PROBLEMS`` then a
  summary line) and the escaping of JSON values in messages;
* the checks of single values: names, shapes (rank, positive dimensions, elements), dtypes, constants;
* the top-level document: its keys and ``name``, ``inputs``, the ``nodes`` list, ``outputs``, and, of
  an otherwise valid graph, liveness and the total byte limit.

Nothing here parses a node or builds a graph; :mod:`stitchtune.graph.parse` is the entry point.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field
from typing import Any, TypeGuard

from stitchtune.errors import GraphError
from stitchtune.graph.values import DTYPES, Node, TensorSpec

__all__ = [
    "NAME_RE",
    "MAX_NODES",
    "MAX_INPUTS",
    "MAX_OUTPUTS",
    "MAX_FILE_BYTES",
    "MAX_ELEMENTS",
    "MAX_TOTAL_BYTES",
    "MAX_RANK",
    "MAX_PROBLEMS",
]

NAME_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,63}")

MAX_NODES = 4096
MAX_INPUTS = 256
MAX_OUTPUTS = 256
MAX_FILE_BYTES = 4 * 1024 * 1024
MAX_ELEMENTS = 2**31 - 1
MAX_TOTAL_BYTES = 64 * 1024**3
MAX_RANK = 6
MAX_PROBLEMS = 100  # further problems are summarised in one line

_FLOAT32_MAX = 3.4028234663852886e38
_TOP_KEYS = ("name", "inputs", "nodes", "outputs")
_TOP_OPTIONAL = ("description",)


# ---------------------------------------------------------------------------- problem messages
def _show(v: Any) -> str:
    """A short, one-line, escaped description of a JSON value for problem messages."""
    if isinstance(v, str):
        return ascii(v) if len(v) <= 40 else ascii(v[:40] + "...")
    if isinstance(v, bool) or v is None:
        return json.dumps(v)
    if isinstance(v, int):
        t = str(v) if abs(v) < 10**30 else "a huge integer"
        return t
    if isinstance(v, float):
        return repr(v)
    if isinstance(v, dict):
        return "an object"
    if isinstance(v, list):
        return "a list"
    return type(v).__name__


def _key_path(prefix: str, key: str) -> str:
    """JSON path of ``prefix.key`` (``prefix['odd key']`` when the key is not an identifier)."""
    if isinstance(key, str) and NAME_RE.fullmatch(key):
        return f"{prefix}.{key}" if prefix else key
    return f"{prefix}[{_show(key)}]"


def _type_name(v: Any) -> str:
    if isinstance(v, bool):
        return "a boolean"
    if isinstance(v, str):
        return "a string"
    if isinstance(v, (int, float)):
        return "a number"
    if v is None:
        return "null"
    if isinstance(v, list):
        return "a list"
    if isinstance(v, dict):
        return "an object"
    return type(v).__name__


class _DupDict(dict):  # type: ignore[type-arg]
    """A JSON object that remembers keys that appeared more than once."""

    duplicates: tuple[str, ...] = ()


def _pairs_hook(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    d = _DupDict()
    dups = []
    for k, v in pairs:
        if k in d:
            dups.append(k)
        d[k] = v
    if dups:
        d.duplicates = tuple(dups)
    return d


class _Problems:
    def __init__(self) -> None:
        self.items: list[str] = []
        self.cycle_checks = 0  # bounded: each check may walk the whole graph

    def add(self, path: str, msg: str) -> None:
        self.items.append(f"{path}: {msg}" if path else msg)

    def __bool__(self) -> bool:
        return bool(self.items)

    def raise_if_any(self) -> None:
        if self.items:
            items = self.items
            if len(items) > MAX_PROBLEMS:
                items = items[:MAX_PROBLEMS] + [f"... and {len(items) - MAX_PROBLEMS} more problems"]
            raise GraphError(problems=items)


def _check_dups(obj: Any, path: str, p: _Problems) -> None:
    for k in getattr(obj, "duplicates", ()):
        p.add(path or "(top level)", f"duplicate key {_show(k)}")


def _check_name(v: Any, path: str, p: _Problems, what: str) -> TypeGuard[str]:
    """Whether ``v`` is a valid name (a problem added to ``p`` when not)."""
    if not isinstance(v, str):
        p.add(path, f"{what} must be a string, got {_type_name(v)}")
        return False
    if not NAME_RE.fullmatch(v):
        p.add(path, f"invalid {what} {_show(v)}: names must match [A-Za-z_][A-Za-z0-9_]{{0,63}}")
        return False
    return True


def _check_shape(v: Any, path: str, p: _Problems) -> tuple[int, ...] | None:
    if not isinstance(v, list):
        p.add(path, f"shape must be a list of positive integers, got {_type_name(v)}")
        return None
    if not 1 <= len(v) <= MAX_RANK:
        p.add(path, f"rank {len(v)} is not supported (ranks 1..{MAX_RANK})")
        return None
    ok = True
    for i, d in enumerate(v):
        if isinstance(d, bool) or not isinstance(d, int):
            p.add(f"{path}[{i}]", f"dimension must be an integer, got {_show(d)}")
            ok = False
        elif d <= 0:
            p.add(f"{path}[{i}]", f"dimension must be positive, got {_show(d)}")
            ok = False
    if not ok:
        return None
    shape = tuple(v)
    if math.prod(shape) > MAX_ELEMENTS:
        p.add(path, f"too large: {_show(math.prod(shape))} elements (limit {MAX_ELEMENTS})")
        return None
    return shape


def _check_dtype(v: Any, path: str, p: _Problems) -> str | None:
    if not isinstance(v, str) or v not in DTYPES:
        p.add(path, f"unsupported dtype {_show(v)} (supported: {', '.join(DTYPES)})")
        return None
    return v


def _constant(v: Any, path: str, p: _Problems) -> float | None:
    if isinstance(v, bool):
        p.add(path, "a boolean is not a valid argument (use a number or a tensor name)")
        return None
    try:
        c = float(v)
    except OverflowError:
        p.add(path, "constant is too large")
        return None
    if math.isnan(c):
        p.add(path, "NaN is not allowed as a constant")
        return None
    if math.isfinite(c) and abs(c) > _FLOAT32_MAX:
        p.add(path, f"constant {_show(v)} is outside float32 range (use Infinity explicitly)")
        return None
    return c


@dataclass
class _Scope:
    """The names validation has met so far, in file order (inputs, then nodes)."""

    specs: dict[str, TensorSpec] = field(default_factory=dict)  # valid tensors defined so far
    defined_at: dict[str, str] = field(default_factory=dict)    # every defined name -> its JSON path
    failed: set[str] = field(default_factory=set)  # names whose definition is invalid (uses not reported again)


def _check_top(obj: dict[str, Any], p: _Problems) -> Any:
    """Check the top-level keys, ``description`` and ``name``; return the name (``graph`` if absent)."""
    _check_dups(obj, "", p)
    for k in obj:
        if k not in _TOP_KEYS and k not in _TOP_OPTIONAL:
            p.add(_key_path("", k), f"unknown key (expected {', '.join(_TOP_KEYS)})")
    for k in _TOP_KEYS:
        if k not in obj:
            p.add(k, "missing")
    if "description" in obj and not isinstance(obj["description"], str):
        p.add("description", "must be a string")
    name = obj.get("name", "graph")
    if "name" in obj:
        _check_name(name, "name", p, "graph name")
    return name


def _parse_inputs(obj: dict[str, Any], scope: _Scope, p: _Problems) -> list[tuple[str, TensorSpec]]:
    """The valid inputs in file order; each valid input name is entered in ``scope``."""
    input_list: list[tuple[str, TensorSpec]] = []
    raw_inputs = obj.get("inputs", {})
    if not isinstance(raw_inputs, dict):
        p.add("inputs", f"must be an object mapping names to {{shape, dtype}}, got {_type_name(raw_inputs)}")
        raw_inputs = {}
    elif len(raw_inputs) > MAX_INPUTS:
        p.add("inputs", f"too many inputs: {len(raw_inputs)} (limit {MAX_INPUTS})")
        raw_inputs = {}
    _check_dups(raw_inputs, "inputs", p)
    for iname, ispec in raw_inputs.items():
        path = _key_path("inputs", iname)
        good = _check_name(iname, path, p, "input name")
        if not isinstance(ispec, dict):
            p.add(path, f"must be an object {{\"shape\": [...], \"dtype\": ...}}, got {_type_name(ispec)}")
            continue
        spec = _input_spec(ispec, path, p)
        if good and spec is not None:
            scope.specs[iname] = spec
            input_list.append((iname, spec))
        if good:
            scope.defined_at[iname] = path
            if iname not in scope.specs:
                scope.failed.add(iname)
    return input_list


def _input_spec(ispec: dict[str, Any], path: str, p: _Problems) -> TensorSpec | None:
    """The ``{shape, dtype}`` of one input, or None when it is invalid."""
    _check_dups(ispec, path, p)
    for k in ispec:
        if k not in ("shape", "dtype"):
            p.add(_key_path(path, k), "unknown key (expected shape, dtype)")
    shape = _check_shape(ispec["shape"], f"{path}.shape", p) if "shape" in ispec else None
    if "shape" not in ispec:
        p.add(f"{path}.shape", "missing")
    dtype = _check_dtype(ispec["dtype"], f"{path}.dtype", p) if "dtype" in ispec else None
    if "dtype" not in ispec:
        p.add(f"{path}.dtype", "missing")
    return TensorSpec(shape, dtype) if shape is not None and dtype is not None else None


def _raw_nodes(obj: dict[str, Any], p: _Problems) -> list[Any]:
    """The ``nodes`` list (empty when it is not a list or too long)."""
    raw_nodes = obj.get("nodes", [])
    if not isinstance(raw_nodes, list):
        p.add("nodes", f"must be a list, got {_type_name(raw_nodes)}")
        return []
    if len(raw_nodes) > MAX_NODES:
        p.add("nodes", f"too many nodes: {len(raw_nodes)} (limit {MAX_NODES})")
        return []
    if not raw_nodes:
        p.add("nodes", "empty: a graph needs at least one node")
    return raw_nodes


def _parse_outputs(obj: dict[str, Any], scope: _Scope, p: _Problems) -> list[str]:
    """The valid output names in file order."""
    raw_out = obj.get("outputs", [])
    outputs: list[str] = []
    if not isinstance(raw_out, list):
        p.add("outputs", f"must be a list of tensor names, got {_type_name(raw_out)}")
        raw_out = []
    elif not raw_out and "outputs" in obj:
        p.add("outputs", "empty: a graph needs at least one output")
    elif len(raw_out) > MAX_OUTPUTS:
        p.add("outputs", f"too many outputs: {len(raw_out)} (limit {MAX_OUTPUTS})")
        raw_out = []
    seen_out: set[str] = set()
    for j, o in enumerate(raw_out):
        path = f"outputs[{j}]"
        if not isinstance(o, str):
            p.add(path, f"must be a tensor name, got {_type_name(o)}")
        elif o in seen_out:
            p.add(path, f"duplicate output {_show(o)}")
        elif o in scope.specs:
            seen_out.add(o)
            outputs.append(o)
        elif o not in scope.failed:
            p.add(path, f"unknown tensor {_show(o)}")
    return outputs


def _check_live_and_size(inputs: list[tuple[str, TensorSpec]], nodes: list[Node], outputs: list[str],
                         scope: _Scope, p: _Problems) -> None:
    """Of an otherwise valid graph: every node reaches an output; inputs + outputs fit the byte limit."""
    live: set[str] = set(outputs)
    for n in reversed(nodes):
        if n.id in live:
            live.update(n.tensor_args)
    for i, n in enumerate(nodes):
        if n.id not in live:
            p.add(f"nodes[{i}]", f"node {_show(n.id)} does not contribute to any output "
                                  "(remove it or list it in outputs)")
    total = sum(s.nbytes for _, s in inputs)
    total += sum(scope.specs[o].nbytes for o in outputs)
    if total > MAX_TOTAL_BYTES:
        p.add("(top level)", f"too large: inputs + outputs need {total} bytes "
                             f"(limit {MAX_TOTAL_BYTES})")
