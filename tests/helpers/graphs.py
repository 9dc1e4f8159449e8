"""Graph builders shared by several test rooms: the loss heads (``ce_graph``: cross entropy with integer
targets: log-softmax, a ``gather_elements`` pick, a scalar epilogue; ``ce_ignore_graph``, ``ce_items_graph``,
``ce_backward_graph``, ``int_next_to_pick_graph``), ``rotary_positions_graph``, ``embedding_dropout_graph``,
``head_merge_colsum`` (a column sum of an input read along its rows: row vectors). The LayerNorm node lists
(``layernorm_rows``, ``layernorm_backward_rows``) are in :mod:`stitchtune.graph.node_lists` (scripts use them too)."""

from __future__ import annotations

from typing import Any

from helpers.hostile import pick
from stitchtune.graph.parse import Graph, parse_graph


# ---------------------------------------------------------------------------- loss heads

def _keep_red(i: str, op: str, a: str, axes: list[int]) -> dict:
    return {"id": i, "op": op, "args": [a], "axes": axes, "keepdims": True}


def int_next_to_pick_graph(rows: int, cols: int) -> Graph:
    """Int registers (``t + 1`` cast to float) beside a pick whose index is the input ``t`` itself,
    plus a row sum: ``y = x[r, t[r]] + (t[r] + 1) + sum(x[r])``."""
    return parse_graph({
        "name": "g", "inputs": {"x": {"shape": [rows, cols], "dtype": "float32"},
                                "t": {"shape": [rows, 1], "dtype": "int64"}},
        "nodes": [{"id": "s", "op": "reduce_sum", "args": ["x"], "axes": [-1], "keepdims": True},
                  {"id": "p", "op": "gather_elements", "args": ["x", "t"], "axis": 1},
                  {"id": "ti", "op": "add", "args": ["t", 1]},
                  {"id": "tf", "op": "cast", "args": ["ti"], "to": "float32"},
                  {"id": "o", "op": "add", "args": ["p", "tf"]},
                  {"id": "y", "op": "add", "args": ["o", "s"]}],
        "outputs": ["y"]})


def ce_graph(rows: int = 16, cols: int = 1000, dtype: str = "float32", idx_shape: list[int] | None = None,
             axis: int = 1, outputs: tuple[str, ...] = ("loss",)) -> Graph:
    """Cross entropy: log-softmax, the target's log-probability picked, the mean over rows as a sum
    times ``1 / rows`` (the scalar epilogue)."""
    return parse_graph({
        "name": "ce", "inputs": {"logits": {"shape": [rows, cols], "dtype": dtype},
                                 "target": {"shape": idx_shape or [rows, 1], "dtype": "int64"}},
        "nodes": [_keep_red("mx", "reduce_max", "logits", [-1]), {"id": "sh", "op": "sub", "args": ["logits", "mx"]},
                  {"id": "e", "op": "exp", "args": ["sh"]}, _keep_red("se", "reduce_sum", "e", [-1]),
                  {"id": "ls", "op": "log", "args": ["se"]}, {"id": "logp", "op": "sub", "args": ["sh", "ls"]},
                  {"id": "picked", "op": "gather_elements", "args": ["logp", "target"], "axis": axis},
                  {"id": "nll", "op": "neg", "args": ["picked"]}, _keep_red("total", "reduce_sum", "nll", [0, 1]),
                  {"id": "loss", "op": "mul", "args": ["total", 1.0 / rows]}],
        "outputs": list(outputs)})


def ce_ignore_graph(rows: int = 16, cols: int = 100, ignore: int = -100, outputs: tuple[str, ...] = ("loss",)) -> Graph:
    """Cross entropy with ``ignore_index`` (``F.cross_entropy(x, t, ignore_index=ignore)``): the pick's index
    is computed in the region (``where(t != ignore, t, 0)``) and the loss is the mean over the rows kept,
    ``sum(where(valid, -picked, 0)) / sum(valid)`` (the scalar epilogue of two cross reductions)."""
    return parse_graph({
        "name": "cei", "inputs": {"logits": {"shape": [rows, cols], "dtype": "float32"},
                                  "target": {"shape": [rows, 1], "dtype": "int64"}},
        "nodes": [{"id": "valid", "op": "ne", "args": ["target", ignore]},
                  {"id": "tc", "op": "where", "args": ["valid", "target", 0]},
                  _keep_red("mx", "reduce_max", "logits", [-1]), {"id": "sh", "op": "sub", "args": ["logits", "mx"]},
                  {"id": "e", "op": "exp", "args": ["sh"]}, _keep_red("se", "reduce_sum", "e", [-1]),
                  {"id": "ls", "op": "log", "args": ["se"]}, {"id": "logp", "op": "sub", "args": ["sh", "ls"]},
                  {"id": "picked", "op": "gather_elements", "args": ["logp", "tc"], "axis": 1},
                  {"id": "nll", "op": "neg", "args": ["picked"]},
                  {"id": "nz", "op": "where", "args": ["valid", "nll", 0.0]},
                  _keep_red("total", "reduce_sum", "nz", [0, 1]), _keep_red("cnt", "reduce_sum", "valid", [0, 1]),
                  {"id": "loss", "op": "div", "args": ["total", "cnt"]}],
        "outputs": list(outputs)})


def ce_items_graph(rows: int = 16, cols: int = 100, dtype: str = "int64") -> Graph:
    """:func:`ce_ignore_graph` as transformers' causal-LM loss with ``num_items_in_batch``: the masked sum
    over a ``[1]`` input (PyTorch's 0-d count, cast to float when it is an int) in the scalar epilogue."""
    d = ce_ignore_graph(rows, cols).to_dict()
    d["inputs"]["items"] = {"shape": [1], "dtype": dtype}
    d["nodes"] = [nd for nd in d["nodes"] if nd["id"] not in ("cnt", "loss")]
    n = "items"
    if dtype != "float32":
        d["nodes"].append({"id": "items_f", "op": "cast", "args": ["items"], "to": "float32"})
        n = "items_f"
    d["nodes"].append({"id": "loss", "op": "div", "args": ["total", n]})
    return parse_graph(d)


def ce_backward_graph(rows: int = 16, cols: int = 100, ignore: int = -100) -> Graph:
    """Cross entropy's backward as the torch backend imports it (mean reduction, ``ignore_index``):
    ``g / count`` of two ``[1]`` inputs (PyTorch's 0-d incoming gradient and count), the target's
    one-hot ``where(iota == where(t != ignore, t, 0), -1, 0)`` (``scatter`` of a number into zeros),
    times the masked scale, minus ``softmax * rowsum`` (log-softmax's backward from the saved ``logp``)."""
    return parse_graph({
        "name": "ceb", "inputs": {"g": {"shape": [1], "dtype": "float32"}, "count": {"shape": [1], "dtype": "float32"},
                                  "target": {"shape": [rows, 1], "dtype": "int64"},
                                  "logp": {"shape": [rows, cols], "dtype": "float32"}},
        "nodes": [{"id": "scale", "op": "div", "args": ["g", "count"]},
                  {"id": "valid", "op": "ne", "args": ["target", ignore]},
                  {"id": "tc", "op": "where", "args": ["valid", "target", 0]},
                  {"id": "pos", "op": "iota", "args": [], "shape": [1, cols], "dtype": "int64", "axis": 1},
                  {"id": "hit", "op": "eq", "args": ["pos", "tc"]},
                  {"id": "onehot", "op": "where", "args": ["hit", -1.0, 0.0]},
                  {"id": "w", "op": "where", "args": ["valid", "scale", 0.0]},
                  {"id": "gl", "op": "mul", "args": ["onehot", "w"]},
                  {"id": "p", "op": "exp", "args": ["logp"]},
                  _keep_red("rs", "reduce_sum", "gl", [1]),
                  {"id": "pr", "op": "mul", "args": ["p", "rs"]},
                  {"id": "dx", "op": "sub", "args": ["gl", "pr"]}],
        "outputs": ["dx"]})


def rotary_positions_graph(batch: int = 2, seq: int = 8, dim: int = 16, start: int = 3,
                           from_slice: bool = False) -> Graph:
    """Rotary beside positions computed in the region: ``x * cos(a) + rotate_half(x) * sin(a)`` with
    ``a = float(iota(seq) + start) * f`` (int registers apart from rotate_half's slice / neg / concat).
    ``from_slice``: the positions are cast to int from a slice of ``x`` instead (int values computed
    from an index op's result)."""
    half = dim // 2
    pos: list[dict[str, Any]] = [{"id": "pos", "op": "iota", "args": [], "shape": [seq, 1], "axis": 0, "dtype": "int64"}]
    if from_slice:
        pos = [{"id": "x0", "op": "slice", "args": ["x"], "axis": 2, "start": 0, "stop": 1},
               {"id": "pos", "op": "cast", "args": ["x0"], "to": "int64"}]
    return parse_graph({
        "name": "rot", "inputs": {"x": {"shape": [batch, seq, dim], "dtype": "float32"},
                                  "f": {"shape": [dim], "dtype": "float32"}},
        "nodes": [*pos, {"id": "p1", "op": "add", "args": ["pos", start]},
                  {"id": "pf", "op": "cast", "args": ["p1"], "to": "float32"},
                  {"id": "ang", "op": "mul", "args": ["pf", "f"]},
                  {"id": "c", "op": "cos", "args": ["ang"]}, {"id": "s", "op": "sin", "args": ["ang"]},
                  {"id": "hi", "op": "slice", "args": ["x"], "axis": 2, "start": half, "stop": dim},
                  {"id": "lo", "op": "slice", "args": ["x"], "axis": 2, "start": 0, "stop": half},
                  {"id": "nh", "op": "neg", "args": ["hi"]},
                  {"id": "rh", "op": "concat", "args": ["nh", "lo"], "axis": 2},
                  {"id": "a", "op": "mul", "args": ["x", "c"]}, {"id": "b", "op": "mul", "args": ["rh", "s"]},
                  {"id": "y", "op": "add", "args": ["a", "b"]}],
        "outputs": ["y"]})


def embedding_dropout_graph(p: float = 0.1, S: int = 8, H: int = 32, V: int = 20) -> Any:
    """BERT's embeddings in its training step as the torch importer maps them (three gathers, their
    sum, a layer norm) with the embedding dropout drawn in the region (tests/plan/test_int_beside_gather.py): ``uniform(seed, counter)`` of
    an ``iota`` counter over ``[1, S, H]``, compared, cast and scaled."""
    i64, f32 = {"dtype": "int64"}, {"dtype": "float32"}
    return parse_graph({
        "name": "emb_dropout",
        "inputs": {"tok": {"shape": [1, S], **i64}, "wte": {"shape": [V, H], **f32},
                   "typ": {"shape": [1, S], **i64}, "tte": {"shape": [2, H], **f32},
                   "pos": {"shape": [1, S], **i64}, "wpe": {"shape": [S, H], **f32},
                   "gamma": {"shape": [H], **f32}, "beta": {"shape": [H], **f32}, "seed": {"shape": [1], **i64}},
        "nodes": [
            {"id": "e0", "op": "gather", "args": ["wte", "tok"], "axis": 0},
            {"id": "e1", "op": "gather", "args": ["tte", "typ"], "axis": 0},
            {"id": "e2", "op": "gather", "args": ["wpe", "pos"], "axis": 0},
            {"id": "s0", "op": "add", "args": ["e0", "e1"]}, {"id": "x", "op": "add", "args": ["s0", "e2"]},
            {"id": "mu", "op": "reduce_mean", "args": ["x"], "axes": [2], "keepdims": True},
            {"id": "xc", "op": "sub", "args": ["x", "mu"]}, {"id": "sq", "op": "mul", "args": ["xc", "xc"]},
            {"id": "var", "op": "reduce_mean", "args": ["sq"], "axes": [2], "keepdims": True},
            {"id": "ve", "op": "add", "args": ["var", 1e-12]}, {"id": "rs", "op": "rsqrt", "args": ["ve"]},
            {"id": "xn", "op": "mul", "args": ["xc", "rs"]}, {"id": "xg", "op": "mul", "args": ["xn", "gamma"]},
            {"id": "ln", "op": "add", "args": ["xg", "beta"]},
            {"id": "i2", "op": "iota", "args": [], "shape": [1, S, H], "dtype": "int32", "axis": 2},
            {"id": "i1", "op": "iota", "args": [], "shape": [1, S, H], "dtype": "int32", "axis": 1},
            {"id": "s1", "op": "mul", "args": ["i1", float(H)]}, {"id": "c1", "op": "add", "args": ["i2", "s1"]},
            {"id": "u", "op": "uniform", "args": ["seed", "c1"]},
            {"id": "keep", "op": "gt", "args": ["u", p]}, {"id": "kf", "op": "cast", "args": ["keep"], "to": "float32"},
            {"id": "m", "op": "mul", "args": ["kf", "ln"]}, {"id": "y", "op": "mul", "args": ["m", 1.0 / (1.0 - p)]}],
        "outputs": ["x", "mu", "rs", "keep", "y"]})


def head_merge_colsum(B: int = 2, H: int = 2, D: int = 8, S: int = 64, scale: bool = False, second: bool = False,
                      second_dtype: str = "float32") -> Graph:
    """``x [B*H, D, S]`` as ``[B*S, H*D]`` (BERT's attention-output gradient merged over the heads, training
    ``view_59``) and its column sums; with ``scale`` the merged values times a per-column weight ``w [H*D]``
    first; with ``second`` times ``y [B, H, S, D]`` merged the same way (another strided input, its rows ``D``
    apart: read one row per access beside row vectors; of ``second_dtype``, cast to float32 after the merge).
    Outputs: the product and its sums."""
    nodes: list[dict[str, Any]] = [
        {"id": "v", "op": "reshape", "args": ["x"], "shape": [B, H, D, S]},
        {"id": "p", "op": "transpose", "args": ["v"], "perm": [0, 3, 1, 2]},
        {"id": "m", "op": "reshape", "args": ["p"], "shape": [B * S, H * D]}]
    inputs: dict[str, list[int]] = {"x": [B * H, D, S]}
    y = "m"
    if scale:
        inputs["w"] = [H * D]
        nodes.append({"id": "y", "op": "mul", "args": ["m", "w"]})
        y = "y"
    if second:
        inputs["y2"] = [B, H, S, D]
        nodes += [{"id": "yt", "op": "transpose", "args": ["y2"], "perm": [0, 2, 1, 3]},
                  {"id": "ym", "op": "reshape", "args": ["yt"], "shape": [B * S, H * D]}]
        if second_dtype != "float32":
            nodes.append({"id": "yc", "op": "cast", "args": ["ym"], "to": "float32"})
        nodes.append({"id": "z", "op": "mul", "args": [y, "ym" if second_dtype == "float32" else "yc"]})
        y = "z"
    nodes.append({"id": "s", "op": "reduce_sum", "args": [y], "axes": [0], "keepdims": True})
    return parse_graph({"name": "head_merge_colsum",
                        "inputs": {k: {"shape": v, "dtype": second_dtype if k == "y2" else "float32"}
                                   for k, v in inputs.items()},
                        "nodes": nodes, "outputs": [y, "s"]})
