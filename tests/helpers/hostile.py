"""Hypothesis strategies for hostile graph files: ``hostile_names``, ``json_values``, ``malformed_graph``
(strategies built once at import, not per draw); ``pick(draw, items)`` draws one of a sequence that
changes per example without building a ``sampled_from`` for it; ``SMALL_GRAPHS`` (one of the small
examples, as a dict: copy before changing it); ``LOWER`` (a-z)."""

from __future__ import annotations

import json
import math
from typing import Any

from hypothesis import strategies as st

from helpers.common import SMALL_DICTS
from stitchtune.graph.parse import DTYPES, MAX_RANK, NAME_RE
from stitchtune.graph.ops import OPS


# ---------------------------------------------------------------------------- hostile graph files
HOSTILE_CHARS = ['"', "'", "\n", "\r", "*/", "/*", ";", "\\", " ", "-", "$(", "`", "\x00", "é",
                 "\u2028", "{", "}", "#", "%", "."]
#: ``[a-z]{0,n}`` and ``[0-9][A-Za-z0-9_]{0,6}`` as plain text strategies over those alphabets: the same
#: strings as ``st.from_regex`` draws, at a third of its cost per example (the fuzzers draw thousands)
LOWER = "abcdefghijklmnopqrstuvwxyz"
_WORD_CHARS = LOWER + LOWER.upper() + "0123456789_"
hostile_names = st.one_of(
    st.builds(lambda a, c, b: a + c + b, st.text(LOWER, max_size=5),
              st.sampled_from(HOSTILE_CHARS), st.text(max_size=8)),
    st.builds(lambda a, b: a + b, st.sampled_from("0123456789"), st.text(_WORD_CHARS, max_size=6)),
    st.just(""), st.just("a" * 65), st.text(min_size=1, max_size=12),
).filter(lambda s: not NAME_RE.fullmatch(s))

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=True) | st.text(max_size=10),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=6), children, max_size=4),
    max_leaves=12,
)
not_a_list = st.none() | st.booleans() | st.integers() | st.text(max_size=5) | \
    st.dictionaries(st.text(max_size=3), st.integers(), max_size=2)
not_a_dict = st.none() | st.booleans() | st.integers() | st.text(max_size=5) | st.lists(st.integers(), max_size=2)


def _defined(d: dict[str, Any]) -> set[str]:
    return set(d["inputs"]) | {n["id"] for n in d["nodes"]}


# Strategies that malformed_graph draws from, built once: a strategy made inside a draw is a new object
# each time, validated and labelled again on every example.
SMALL_GRAPHS = st.sampled_from(SMALL_DICTS)
_MUTATIONS = st.sampled_from([
    "node_id", "input_name", "graph_name", "dim", "dtype", "op", "drop_top", "drop_node_key",
    "unknown_arg", "arity", "axes", "constant", "extra_key", "output", "swap", "top_type",
    "nodes_type", "inputs_type", "node_type", "shape_type", "dup_id", "cast_to", "rank",
])
_GRAPH_NAMES = hostile_names | st.integers() | st.none()
_BAD_DIMS = (st.integers(max_value=0) | st.floats() | st.text(max_size=3) | st.booleans() | st.none()
             | st.integers(min_value=2**31))
_NOT_DTYPES = json_values.filter(lambda v: v not in DTYPES)
_NOT_OPS = json_values.filter(lambda v: not (isinstance(v, str) and v in OPS))
_TOP_KEYS = st.sampled_from(["name", "inputs", "nodes", "outputs"])
_NODE_KEYS = st.sampled_from(["id", "op", "args"])
_NOT_ARG_NAMES = st.none() | st.booleans() | st.lists(st.integers(), max_size=2)
_BAD_AXES: st.SearchStrategy[Any] = (
    st.lists(st.integers(min_value=4) | st.integers(max_value=-5), min_size=1, max_size=3) | not_a_list | st.just([]))
_BAD_CONSTANTS: st.SearchStrategy[Any] = st.sampled_from([True, False, math.nan, 1e39, -1e300, None, {}, [1.0]])
_EXTRA_TARGETS = st.sampled_from(["top", "node", "input"])
_KNOWN_KEYS = ("id", "op", "args", "axes", "keepdims", "to", "name", "inputs", "nodes", "outputs", "description",
               "shape", "dtype")
_EXTRA_KEYS = st.text(max_size=8).filter(lambda k: k not in _KNOWN_KEYS)
_NOT_A_LIST_OR_EMPTY: st.SearchStrategy[Any] = not_a_list | st.just([])
_NOT_A_DICT_NOR_DICT = not_a_dict.filter(lambda v: not isinstance(v, dict))
_BAD_RANKS = st.lists(st.integers(1, 3), min_size=MAX_RANK + 1, max_size=MAX_RANK + 3)


def pick(draw: st.DrawFn, items: Any) -> Any:
    """One of ``items`` (a non-empty sequence), drawn as ``st.sampled_from(items)`` draws it (an index),
    without building a new strategy per call."""
    return items[draw(st.integers(0, len(items) - 1))]


@st.composite
def malformed_graph(draw: st.DrawFn) -> dict[str, Any]:
    """A small example with one mutation that certainly makes it invalid."""
    d = json.loads(json.dumps(draw(SMALL_GRAPHS)))
    nodes = d["nodes"]
    i = draw(st.integers(0, len(nodes) - 1))
    node = nodes[i]
    kind = draw(_MUTATIONS)
    if kind == "node_id":
        node["id"] = draw(hostile_names)
    elif kind == "input_name":
        k = pick(draw, sorted(d["inputs"]))
        d["inputs"][draw(hostile_names)] = d["inputs"].pop(k)
    elif kind == "graph_name":
        d["name"] = draw(_GRAPH_NAMES)
    elif kind == "dim":
        spec = d["inputs"][pick(draw, sorted(d["inputs"]))]
        j = draw(st.integers(0, len(spec["shape"]) - 1))
        spec["shape"][j] = draw(_BAD_DIMS)
    elif kind == "dtype":
        spec = d["inputs"][pick(draw, sorted(d["inputs"]))]
        spec["dtype"] = draw(_NOT_DTYPES)
    elif kind == "op":
        node["op"] = draw(_NOT_OPS)
    elif kind == "drop_top":
        del d[draw(_TOP_KEYS)]
    elif kind == "drop_node_key":
        del node[draw(_NODE_KEYS)]
    elif kind == "unknown_arg":
        defined = _defined(d)
        node["args"][0] = draw(st.text(max_size=10).filter(lambda s: s not in defined) | _NOT_ARG_NAMES)
    elif kind == "arity":
        node["args"] = node["args"] + draw(st.lists(st.sampled_from(sorted(d["inputs"])) | st.floats(0, 1),
                                                    min_size=1, max_size=3))
    elif kind == "axes":
        red = [n for n in nodes if n["op"].startswith("reduce_")]
        if red:
            red[0]["axes"] = draw(_BAD_AXES)
        else:
            node["axes"] = [0]  # not a reduction
    elif kind == "constant":
        consts = [(n, j) for n in nodes for j, a in enumerate(n["args"]) if not isinstance(a, str)]
        bad = draw(_BAD_CONSTANTS)
        if consts:
            n, j = consts[0]
            n["args"][j] = bad
        else:
            node["args"][0] = bad
    elif kind == "extra_key":
        target = draw(_EXTRA_TARGETS)
        key = draw(_EXTRA_KEYS)
        if target == "top":
            d[key] = draw(json_values)
        elif target == "node":
            node[key] = draw(json_values)
        else:
            d["inputs"][sorted(d["inputs"])[0]][key] = draw(json_values)
    elif kind == "output":
        defined = _defined(d)
        d["outputs"] = draw(st.lists(st.text(max_size=8).filter(lambda s: s not in defined),
                                     min_size=1, max_size=3) | _NOT_A_LIST_OR_EMPTY)
    elif kind == "swap":
        # move the last node (which reads an earlier node) to the front: a forward reference
        nodes.insert(0, nodes.pop())
        if all(a in d["inputs"] or not isinstance(a, str) for a in nodes[0]["args"]):
            nodes[0]["args"][0] = nodes[-1]["id"]
    elif kind == "top_type":
        d = draw(not_a_dict)
    elif kind == "nodes_type":
        d["nodes"] = draw(_NOT_A_LIST_OR_EMPTY)
    elif kind == "inputs_type":
        d["inputs"] = draw(_NOT_A_DICT_NOR_DICT)
    elif kind == "node_type":
        nodes[i] = draw(not_a_dict)
    elif kind == "shape_type":
        spec = d["inputs"][sorted(d["inputs"])[0]]
        spec["shape"] = draw(_NOT_A_LIST_OR_EMPTY)
    elif kind == "dup_id":
        node["id"] = pick(draw, sorted(_defined(d) - {node["id"]}))
    elif kind == "cast_to":
        node["op"], node["args"], node["to"] = "cast", node["args"][:1], draw(
            _NOT_DTYPES)
        node.pop("axes", None)
        node.pop("keepdims", None)
        if isinstance(node["args"][0], (int, float)):
            node["args"][0] = "x"
    elif kind == "rank":
        spec = d["inputs"][sorted(d["inputs"])[0]]
        spec["shape"] = draw(_BAD_RANKS)
    return d
