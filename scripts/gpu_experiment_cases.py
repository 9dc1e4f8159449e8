"""The kernels of ``scripts/gpu_experiments.py`` (issue 44 prep): one table of cases, each a graph at the GPU's
shape and at a small shape (the emulator's check), a schedule (the heuristic's, or a change of it), and how it is
timed.

Contract
--------
* :class:`Case`: ``experiment`` (one of :data:`EXPERIMENTS`), ``name`` (unique), ``graph(small) -> Graph``,
  ``changes`` (schedule fields / options set over the heuristic's point, ``()``: the heuristic), ``schedule``
  (a full schedule instead of the heuristic, e.g. the latency sweep's fixed one), ``small_changes`` (the changes at
  the small shape where the GPU's do not apply there), ``protocols`` (names in :data:`PROTOCOLS`), ``gemm_input``
  (the input a GEMM writes before the kernel under the ``after_gemm*`` protocols), ``params`` (what the fit reads:
  rows, bytes per block, grid ...) and ``render`` (:data:`RENDERS`: how atomic adds are written, the program
  otherwise the same). Pure data; nothing here needs a GPU.
* :func:`cases(sm_count) -> list[Case]`: every case, in the order of value within each experiment; grid sizes of
  the latency sweep are multiples of ``sm_count`` (the device's, so that "one wave" means one wave there).
* :func:`schedule_for(case, graph, device, small) -> (Schedule, violations)`: the case's schedule for ``graph``
  on ``device`` and the space's objections to it (empty: legal).

The timing protocols (run by ``gpu_experiments.py``, only on a GPU): ``flushed`` (a buffer of 4x the L2 zeroed
before each call: the tuner's protocol, the fit dataset's), ``clean_read`` (flushed, then every input read once by
``torch.sum``: its lines clean in the L2), ``after_gemm`` (flushed, then a GEMM writes ``gemm_input``: its lines
dirty in the L2, as in a model step), ``after_big_gemm`` (as ``after_gemm``, then a GEMM whose operand is 2x the L2:
does a GEMM's operand stream evict what the kernel reads next?).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Callable

EXPERIMENTS = ("l2", "latency", "ab", "scatter")
PROTOCOLS = ("flushed", "clean_read", "after_gemm", "after_big_gemm")
#: how float32 atomic adds are rendered: ``red`` (PTX reductions, as shipped), ``atom`` (CUDA's ``atomicAdd``, as
#: before: a returning ``ATOMG`` ahead of a grid barrier's fence; stitchtune/gpu/render_atomics.py)
RENDERS = ("red", "atom")
HIDDEN = 768
L2_ROWS = (1024, 4096, 16384, 32768)        # x [rows, 768] fp32: 3.1, 12.6, 50, 101 MB
LATENCY_ROW = 16384                          # floats per block in the fixed-bytes-per-block sweep (64 KiB)
LATENCY_TOTAL = 8 * 1024 * 1024              # floats in the fixed-total sweep (32 MiB)
LATENCY_BLOCK = 256                          # threads per block (one row per block, 128-bit loads)


@dataclass(frozen=True)
class Case:
    """One kernel of one experiment (module docstring)."""

    experiment: str
    name: str
    graph: Callable[[bool], Any]
    changes: tuple[tuple[str, Any], ...] = ()
    schedule: dict[str, Any] | None = None
    small_changes: tuple[tuple[str, Any], ...] | None = None
    protocols: tuple[str, ...] = ("flushed",)
    gemm_input: str | None = None
    params: dict[str, Any] = field(default_factory=dict)
    render: str = "red"

    def __post_init__(self) -> None:
        if self.experiment not in EXPERIMENTS or any(p not in PROTOCOLS for p in self.protocols):
            raise ValueError(f"Case {self.name}: experiment in {EXPERIMENTS}, protocols in {PROTOCOLS}")
        if self.render not in RENDERS:
            raise ValueError(f"Case {self.name}: render in {RENDERS}")


def _parse(doc: dict[str, Any]) -> Any:
    from stitchtune.graph.parse import parse_graph

    return parse_graph(doc)


def _f32(shape: list[int]) -> dict[str, Any]:
    return {"shape": shape, "dtype": "float32"}


def elementwise(rows: int, n: int = HIDDEN) -> Any:
    """``y = x * 2 + 1`` over ``x [rows, n]``: a kernel that streams (read once, write once)."""
    return _parse({"name": "exp_ew", "inputs": {"x": _f32([rows, n])},
                   "nodes": [{"id": "a", "op": "mul", "args": ["x", 2.0]}, {"id": "y", "op": "add", "args": ["a", 1.0]}],
                   "outputs": ["y"]})


def layernorm(rows: int, n: int = HIDDEN) -> Any:
    """LayerNorm over the rows of ``x [rows, n]`` (``g``, ``b`` per column)."""
    from stitchtune.graph.node_lists import layernorm_rows

    return _parse({"name": "exp_ln", "inputs": {"x": _f32([rows, n]), "g": _f32([n]), "b": _f32([n])},
                   "nodes": layernorm_rows("x"), "outputs": ["xb"]})


def row_sum(rows: int, n: int) -> Any:
    """``s = sum(x, axis=1)`` of ``x [rows, n]``: the simplest load-reduce kernel."""
    return _parse({"name": "exp_rowsum", "inputs": {"x": _f32([rows, n])},
                   "nodes": [{"id": "s", "op": "reduce_sum", "args": ["x"], "axes": [1], "keepdims": True}],
                   "outputs": ["s"]})


def gpt2_embedding_backward(rows: int = 4096, n: int = HIDDEN, vocab: int = 32000) -> Any:
    """GPT-2's training ``region_view_82`` (tests/cost/test_tail_free.py's graph): a layer norm's ``dx`` plus the
    residual gradient, ``g * xhat`` (dgamma's rows) and ``dx`` added into the word table by ``scatter_add``."""
    f32 = {"dtype": "float32"}
    inputs = {"g": {"shape": [rows, n], **f32}, "x": {"shape": [rows, n], **f32},
              "mu": {"shape": [rows, 1], **f32}, "rs": {"shape": [rows, 1], **f32}, "w": {"shape": [n], **f32},
              "r": {"shape": [rows, n], **f32}, "ids": {"shape": [rows], "dtype": "int64"}}
    nodes = [{"id": "xc", "op": "sub", "args": ["x", "mu"]}, {"id": "xh", "op": "mul", "args": ["xc", "rs"]},
             {"id": "gw", "op": "mul", "args": ["g", "w"]}, {"id": "gwn", "op": "mul", "args": ["gw", float(n)]},
             {"id": "s1", "op": "reduce_sum", "args": ["gw"], "axes": [1], "keepdims": True},
             {"id": "gx", "op": "mul", "args": ["gw", "xh"]},
             {"id": "s2", "op": "reduce_sum", "args": ["gx"], "axes": [1], "keepdims": True},
             {"id": "xs", "op": "mul", "args": ["xh", "s2"]}, {"id": "a", "op": "sub", "args": ["gwn", "s1"]},
             {"id": "b", "op": "sub", "args": ["a", "xs"]}, {"id": "k", "op": "div", "args": ["rs", float(n)]},
             {"id": "dxn", "op": "mul", "args": ["k", "b"]}, {"id": "dg", "op": "mul", "args": ["g", "xh"]},
             {"id": "dx", "op": "add", "args": ["r", "dxn"]}, {"id": "ge", "op": "ge", "args": ["ids", 0.0]},
             {"id": "lt", "op": "lt", "args": ["ids", float(vocab)]},
             {"id": "ok", "op": "logical_and", "args": ["ge", "lt"]},
             {"id": "ok2", "op": "reshape", "args": ["ok"], "shape": [rows, 1]},
             {"id": "v", "op": "where", "args": ["ok2", "dx", 0.0]},
             {"id": "dw", "op": "scatter_add", "args": ["v", "ids"], "shape": [vocab, n]}]
    return _parse({"name": "gpt2_view_82", "inputs": inputs, "nodes": nodes, "outputs": ["dg", "dx", "dw"]})


def llama_embedding_backward(b: int = 8, s: int = 512, h: int = 1024, vocab: int = 32000) -> Any:
    """Llama's training ``region_view_102``: the first RMS-norm's backward (three gradients added, ``dx`` and the
    weight's column sum) with ``dx`` added into the word table by ``scatter_add``; its heuristic zeroes the table
    and combines the column sum behind grid barriers, in one launch (the captured region's nodes)."""
    bsh, bs1 = [b, s, h], [b, s, 1]
    nodes = [{"id": "a0", "op": "reshape", "args": ["in0"], "shape": bsh},
             {"id": "a1", "op": "reshape", "args": ["in1"], "shape": bsh},
             {"id": "a2", "op": "reshape", "args": ["in2"], "shape": bsh},
             {"id": "s01", "op": "add", "args": ["a0", "a1"]}, {"id": "g", "op": "add", "args": ["s01", "a2"]},
             {"id": "gw", "op": "mul", "args": ["g", "in3"]}, {"id": "xr", "op": "mul", "args": ["in4", "in5"]},
             {"id": "gxr", "op": "mul", "args": ["g", "xr"]},
             {"id": "dw", "op": "reduce_sum", "args": ["gxr"], "axes": [0, 1], "keepdims": True},
             {"id": "gwx", "op": "mul", "args": ["gw", "in4"]}, {"id": "gwr", "op": "mul", "args": ["gw", "in5"]},
             {"id": "sg", "op": "reduce_sum", "args": ["gwx"], "axes": [2], "keepdims": True},
             {"id": "d0", "op": "add", "args": ["in6", "gwr"]}, {"id": "r3", "op": "pow", "args": ["in5", 3.0]},
             {"id": "m0", "op": "mul", "args": ["sg", -0.5]}, {"id": "m1", "op": "mul", "args": ["m0", "r3"]},
             {"id": "m2", "op": "div", "args": ["m1", float(h)]}, {"id": "x2", "op": "mul", "args": ["in4", 2.0]},
             {"id": "m3", "op": "mul", "args": ["m2", "x2"]}, {"id": "dx", "op": "add", "args": ["d0", "m3"]},
             {"id": "ge", "op": "ge", "args": ["ids", 0.0]}, {"id": "lt", "op": "lt", "args": ["ids", float(vocab)]},
             {"id": "ok", "op": "logical_and", "args": ["ge", "lt"]},
             {"id": "ok1", "op": "reshape", "args": ["ok"], "shape": bs1},
             {"id": "v", "op": "where", "args": ["ok1", "dx", 0.0]},
             {"id": "dt", "op": "scatter_add", "args": ["v", "ids"], "shape": [vocab, h]}]
    inputs = {"in0": _f32([b * s, h]), "in1": _f32([b * s, h]), "in2": _f32([b * s, h]), "in3": _f32([h]),
              "in4": _f32(bsh), "in5": _f32(bs1), "in6": _f32(bsh), "ids": {"shape": [b, s], "dtype": "int64"}}
    return _parse({"name": "llama_view_102", "inputs": inputs, "nodes": nodes, "outputs": ["dw", "dt"]})


def bert_embedding_backward(tokens: int = 4096, width: int = HIDDEN, vocab: int = 32000) -> Any:
    """BERT's training ``region_view_92``: the embedding layer norm's ``dx`` scattered into the word and
    token-type tables (scripts/gpu_scatter_variants.py's ``word+type`` graph)."""
    from gpu_scatter_variants import region_graph

    return region_graph("word+type", tokens, width, vocab, 2)


def bert_ln_backward(b: int = 8, s: int = 512, h: int = HIDDEN) -> Any:
    """BERT's training ``region_view_50`` (tests/lower/test_norm_backward_rows.py's graph): dy = two gradients
    added, the layer norm's dx, three column sums (dgamma, dbeta, the next bias's gradient): ``st_xsum``'s region."""
    def red(i: str, a: str, axes: list[int], keep: bool) -> dict[str, Any]:
        return {"id": i, "op": "reduce_sum", "args": [a], "axes": axes, "keepdims": keep}

    nodes = [
        {"id": "v50", "op": "reshape", "args": ["in0"], "shape": [b, s, h]},
        {"id": "add_9", "op": "add", "args": ["in1", "v50"]}, {"id": "sub_4", "op": "sub", "args": ["in2", "in3"]},
        {"id": "mul_18", "op": "mul", "args": ["sub_4", "in4"]}, {"id": "mul_19", "op": "mul", "args": ["add_9", "in5"]},
        {"id": "mul_20", "op": "mul", "args": ["mul_19", float(h)]}, red("sum_8", "mul_19", [2], True),
        {"id": "mul_21", "op": "mul", "args": ["mul_19", "mul_18"]}, red("sum_9", "mul_21", [2], True),
        {"id": "mul_22", "op": "mul", "args": ["mul_18", "sum_9"]}, {"id": "sub_5", "op": "sub", "args": ["mul_20", "sum_8"]},
        {"id": "sub_6", "op": "sub", "args": ["sub_5", "mul_22"]}, {"id": "div_1", "op": "div", "args": ["in4", float(h)]},
        {"id": "mul_23", "op": "mul", "args": ["div_1", "sub_6"]}, {"id": "mul_24", "op": "mul", "args": ["add_9", "mul_18"]},
        red("sum_10", "mul_24", [0, 1], False), red("sum_11", "add_9", [0, 1], False),
        {"id": "v51", "op": "reshape", "args": ["mul_23"], "shape": [b * s, h]}, red("sum_12", "v51", [0], True)]
    shapes = {"in0": [b * s, h], "in1": [b, s, h], "in2": [b, s, h], "in3": [b, s, 1], "in4": [b, s, 1], "in5": [h]}
    return _parse({"name": "bert_view_50", "inputs": {k: _f32(v) for k, v in shapes.items()}, "nodes": nodes,
                   "outputs": ["mul_23", "sum_10", "sum_11", "v51", "sum_12"]})


def bert_head_merge_colsum(B: int = 8, H: int = 12, D: int = 64, S: int = 512) -> Any:
    """BERT's training ``view_59``: ``x [B*H, D, S]`` merged over the heads as ``[B*S, H*D]`` and its column sums
    (the one model region with a row-vector input)."""
    nodes = [{"id": "v", "op": "reshape", "args": ["x"], "shape": [B, H, D, S]},
             {"id": "p", "op": "transpose", "args": ["v"], "perm": [0, 3, 1, 2]},
             {"id": "m", "op": "reshape", "args": ["p"], "shape": [B * S, H * D]},
             {"id": "s", "op": "reduce_sum", "args": ["m"], "axes": [0], "keepdims": True}]
    return _parse({"name": "bert_view_59", "inputs": {"x": _f32([B * H, D, S])}, "nodes": nodes, "outputs": ["m", "s"]})


def bert_gelu_backward_colsum(m: int = 4096, n: int = 3072) -> Any:
    """BERT's training ``view_47``: ``dx = dy * gelu'(x)`` (erf form) and its column sum ``sum(dx, 0)``."""
    nodes = [
        {"id": "x1", "op": "mul", "args": ["x", 0.7071067811865476]}, {"id": "e", "op": "erf", "args": ["x1"]},
        {"id": "e1", "op": "add", "args": ["e", 1.0]}, {"id": "cdf", "op": "mul", "args": ["e1", 0.5]},
        {"id": "x2", "op": "mul", "args": ["x", "x"]}, {"id": "x3", "op": "mul", "args": ["x2", -0.5]},
        {"id": "p", "op": "exp", "args": ["x3"]}, {"id": "p1", "op": "mul", "args": ["p", 0.3989422804014327]},
        {"id": "xp", "op": "mul", "args": ["x", "p1"]}, {"id": "g", "op": "add", "args": ["cdf", "xp"]},
        {"id": "dx", "op": "mul", "args": ["dy", "g"]},
        {"id": "s", "op": "reduce_sum", "args": ["dx"], "axes": [0], "keepdims": True}]
    return _parse({"name": "bert_view_47", "inputs": {"dy": _f32([m, n]), "x": _f32([m, n])}, "nodes": nodes,
                   "outputs": ["dx", "s"]})


def llama_rotary_backward(B: int = 8, KV: int = 4, S: int = 512, D: int = 64) -> Any:
    """Llama's training ``view_68``: the rotary gradient of k, its 4 query-head groups summed, read from
    ``in0 [B*4*KV, D, S]`` (transposed), rotate_half's two column shifts, stored ``[B, S, KV, D]``."""
    h = D // 2
    nodes: list[dict[str, Any]] = [
        {"id": "v68", "op": "reshape", "args": ["in0"], "shape": [B, 4 * KV, D, S]},
        {"id": "p45", "op": "transpose", "args": ["v68"], "perm": [0, 1, 3, 2]},
        {"id": "v71", "op": "reshape", "args": ["p45"], "shape": [B, KV, 4, S, D]}]
    for i in range(4):
        nodes += [{"id": f"s{i}", "op": "slice", "args": ["v71"], "axis": 2, "start": i, "stop": i + 1},
                  {"id": f"s{i}v", "op": "reshape", "args": [f"s{i}"], "shape": [B, KV, S, D]}]
    nodes += [
        {"id": "a0", "op": "add", "args": ["s0v", "s1v"]}, {"id": "a1", "op": "add", "args": ["a0", "s2v"]},
        {"id": "a2", "op": "add", "args": ["a1", "s3v"]}, {"id": "m48", "op": "mul", "args": ["a2", "in1"]},
        {"id": "x1", "op": "slice", "args": ["m48"], "axis": 3, "start": 0, "stop": h},
        {"id": "x2", "op": "slice", "args": ["m48"], "axis": 3, "start": h, "stop": D},
        {"id": "n", "op": "neg", "args": ["x1"]},
        {"id": "g0", "op": "slice", "args": ["in2"], "axis": 3, "start": 0, "stop": h},
        {"id": "ss", "op": "concat", "args": ["g0", "n"], "axis": 3},
        {"id": "t1", "op": "slice", "args": ["in2"], "axis": 3, "start": h, "stop": D},
        {"id": "ss1", "op": "concat", "args": ["x2", "t1"], "axis": 3},
        {"id": "a23", "op": "add", "args": ["ss", "ss1"]}, {"id": "m49", "op": "mul", "args": ["a2", "in3"]},
        {"id": "a24", "op": "add", "args": ["a23", "m49"]},
        {"id": "out", "op": "transpose", "args": ["a24"], "perm": [0, 2, 1, 3]}]
    shapes = {"in0": [B * 4 * KV, D, S], "in1": [1, 1, S, D], "in2": [B, KV, S, D], "in3": [1, 1, S, D]}
    return _parse({"name": "llama_view_68", "inputs": {k: _f32(v) for k, v in shapes.items()}, "nodes": nodes,
                   "outputs": ["out"]})


def gpt2_qkv_bias(B: int = 8, S: int = 512, nh: int = 12, D: int = 64) -> Any:
    """GPT-2's training ``region_view_2`` since the backend adds c_attn's bias after the q / k / v slices
    (importers/torch_bias.column_slices): ``qkv [B*S, 3H]`` sliced, each slice plus its slice of ``b [3H]``,
    split into heads; q, v ``[B, nh, S, D]``, k transposed ``[B, nh, D, S]`` (the tiled transpose)."""
    H = nh * D
    nodes: list[dict[str, Any]] = [{"id": "v3", "op": "reshape", "args": ["qkv"], "shape": [B, S, 3 * H]}]
    for i, (out, perm) in enumerate((("q", [0, 2, 1, 3]), ("k", [0, 2, 3, 1]), ("v", [0, 2, 1, 3]))):
        nodes += [{"id": f"s{i}", "op": "slice", "args": ["v3"], "axis": 2, "start": i * H, "stop": (i + 1) * H},
                  {"id": f"b{i}", "op": "slice", "args": ["b"], "axis": 0, "start": i * H, "stop": (i + 1) * H},
                  {"id": f"a{i}", "op": "add", "args": [f"s{i}", f"b{i}"]},
                  {"id": f"h{i}", "op": "reshape", "args": [f"a{i}"], "shape": [B, S, nh, D]},
                  {"id": out, "op": "transpose", "args": [f"h{i}"], "perm": perm}]
    return _parse({"name": "gpt2_view_2", "inputs": {"qkv": _f32([B * S, 3 * H]), "b": _f32([3 * H])},
                   "nodes": nodes, "outputs": ["q", "k", "v"]})


LATENCY_SCHEDULE = {"tpr": LATENCY_BLOCK, "block": LATENCY_BLOCK, "split": 1, "vec": 4, "tasks_per_block": 1,
                    "min_blocks": 0, "schemes": ["regional"], "reuse": []}


def _l2_cases() -> list[Case]:
    out = []
    for kind, fn in (("ew", elementwise), ("ln", layernorm)):
        for rows in L2_ROWS:
            out.append(Case("l2", f"l2-{kind}-{rows}", (lambda small, fn=fn, rows=rows: fn(8 if small else rows, 64 if small else HIDDEN)),
                            protocols=PROTOCOLS, gemm_input="x", params={"kind": kind, "rows": rows, "n": HIDDEN,
                                                                          "input_bytes": rows * HIDDEN * 4}))
    # the most telling first: the 12.6 MB pair (BERT's activation size), then the sizes around the L2's
    order = {4096: 0, 16384: 1, 32768: 2, 1024: 3}
    return sorted(out, key=lambda c: (order[c.params["rows"]], c.params["kind"]))


def latency_grids(sm_count: int) -> tuple[list[int], list[int]]:
    """The grids of the fixed-bytes-per-block and the fixed-total sweeps (blocks = rows, one row each)."""
    per_block = [4, 16, sm_count // 2, sm_count, 2 * sm_count, 4 * sm_count, 8 * sm_count, 16 * sm_count,
                 64 * sm_count]
    total = [16, sm_count // 2, sm_count, 2 * sm_count, 4 * sm_count, 8 * sm_count, 32 * sm_count]
    return per_block, total


def _latency_cases(sm_count: int) -> list[Case]:
    per_block, total = latency_grids(sm_count)
    unit = 4                                    # a row is whole 128-bit loads (a last partial sweep of the block: some lanes idle)
    out = []
    for grid in per_block:
        out.append(Case("latency", f"lat-block-{grid}", (lambda small, g=grid: row_sum(5 if small else g, 2048 if small
                                                                                            else LATENCY_ROW)),
                        schedule=LATENCY_SCHEDULE, params={"sweep": "per_block", "grid": grid, "n": LATENCY_ROW,
                                                            "bytes": grid * LATENCY_ROW * 4}))
    for grid in total:
        n = max(unit, LATENCY_TOTAL // grid // unit * unit)
        out.append(Case("latency", f"lat-total-{grid}", (lambda small, g=grid, n=n: row_sum(3 if small else g,
                                                                                           3072 if small else n)),
                        schedule=LATENCY_SCHEDULE, params={"sweep": "total", "grid": grid, "n": n, "bytes": grid * n * 4}))
    return out


def _ab_cases() -> list[Case]:
    tpb1 = (("tasks_per_block", 1), ("min_blocks", 0))
    tpb2 = (("tasks_per_block", 2),)
    gpt2 = lambda small: gpt2_embedding_backward(40, 64, 50) if small else gpt2_embedding_backward()  # noqa: E731
    bert = lambda small: bert_embedding_backward(64, 64, 300) if small else bert_embedding_backward()  # noqa: E731
    ln = lambda small: bert_ln_backward(2, 8, 64) if small else bert_ln_backward()  # noqa: E731
    hm = lambda small: bert_head_merge_colsum(2, 4, 16, 64) if small else bert_head_merge_colsum()  # noqa: E731
    hm_small = (("tpr", 8), ("split", 2), ("block", 64))
    llama = lambda small: llama_embedding_backward(2, 8, 64, 50) if small else llama_embedding_backward()  # noqa: E731
    red = {"question": "red vs atom", "region": "llama view_102"}
    rot = lambda small: llama_rotary_backward(2, 2, 32, 16) if small else llama_rotary_backward()  # noqa: E731
    rot_q = {"question": "row vectors, column shifts from other lanes", "region": "llama view_68"}
    qkv = lambda small: gpt2_qkv_bias(2, 64, 2, 32) if small else gpt2_qkv_bias()  # noqa: E731
    qkv_q = {"question": "64 x 64 tile at 54 registers (1.45 waves) vs 32 x 32 (2.91 waves)", "region": "gpt2 view_2"}
    gelu = lambda small: bert_gelu_backward_colsum(256, 384) if small else bert_gelu_backward_colsum()  # noqa: E731
    inflight = {"question": "bytes in flight above Little's law", "region": "bert view_47"}
    return [
        Case("ab", "llama-view_102/heuristic", llama, params=red),
        Case("ab", "llama-view_102/atom", llama, params=red, render="atom"),
        Case("ab", "gpt2-view_82/heuristic", gpt2, params={"question": "rule 5e", "region": "gpt2 view_82"}),
        Case("ab", "gpt2-view_82/tpb1", gpt2, tpb1, params={"question": "rule 5e", "region": "gpt2 view_82"}),
        Case("ab", "gpt2-view_82/tpb2", gpt2, tpb2, params={"question": "rule 5e", "region": "gpt2 view_82"}),
        Case("ab", "bert-view_92/heuristic", bert, params={"question": "rule 5e", "region": "bert view_92"}),
        Case("ab", "bert-view_92/tpb1", bert, tpb1, params={"question": "rule 5e", "region": "bert view_92"}),
        Case("ab", "bert-view_92/tpb2", bert, tpb2, params={"question": "rule 5e", "region": "bert view_92"}),
        Case("ab", "bert-view_50/heuristic", ln, params={"question": "st_xsum fused", "region": "bert view_50"}),
        Case("ab", "bert-view_50/kernel", ln, (("cross_combine", "kernel"),),
             params={"question": "st_xsum fused", "region": "bert view_50"}),
        Case("ab", "bert-view_50/grid", ln, (("cross_combine", "grid"),),
             params={"question": "st_xsum fused", "region": "bert view_50"}),
        Case("ab", "bert-view_50/atomic", ln, (("cross_combine", "atomic"),),
             params={"question": "st_xsum fused", "region": "bert view_50"}),
        Case("ab", "bert-view_59/heuristic", hm, params={"question": "row vectors", "region": "bert view_59"}),
        Case("ab", "bert-view_59/rv1", hm, (("row_vectors", True),), small_changes=hm_small + (("row_vectors", True),),
             params={"question": "row vectors", "region": "bert view_59"}),
        Case("ab", "bert-view_59/rv0", hm, (("row_vectors", False),), small_changes=hm_small + (("row_vectors", False),),
             params={"question": "row vectors", "region": "bert view_59"}),
        # 28 LDG.128 + 32 SHFL, 88 registers (heuristic) vs 4 LDG.128 + 48 LDG.32, 78 registers (the earlier one)
        Case("ab", "llama-view_68/heuristic", rot, params=rot_q),
        Case("ab", "llama-view_68/rv0", rot, (("row_vectors", False), ("min_blocks", 2)), params=rot_q),
        # the tiled transpose's edge where the bias slices raise the 64-tile's registers: the heuristic (rule 8)
        # takes the 32 tile (32 registers, 2.91 waves); the 64 tile 54 registers, 1.45 waves
        Case("ab", "gpt2-view_2/heuristic", qkv, params=qkv_q),
        Case("ab", "gpt2-view_2/t64", qkv, (("transpose", 64),), params=qkv_q),
        # codegen 7, sm_90: min_blocks 3 (the pin) 80 registers, 96 B in flight per thread; 4: 64 B; 0: 40 registers, 32 B
        Case("ab", "bert-view_47/heuristic", gelu, params=inflight),
        Case("ab", "bert-view_47/mb4", gelu, (("min_blocks", 4),), params=inflight),
        Case("ab", "bert-view_47/mb0", gelu, (("min_blocks", 0),), params=inflight),
    ]


def cases(sm_count: int) -> list[Case]:
    """Every case (module docstring); the ``scatter`` experiment is scripts/gpu_scatter_variants.py's own."""
    return _l2_cases() + _latency_cases(sm_count) + _ab_cases()


def schedule_for(case: Case, graph: Any, device: Any, small: bool) -> tuple[Any, list[str]]:
    """The case's schedule for ``graph`` on ``device`` and the space's violations of it (empty: legal)."""
    from stitchtune.cost.heuristic import heuristic_schedule
    from stitchtune.lower.resources import legal_space
    from stitchtune.plan.planner import make_plan
    from stitchtune.space import Schedule

    plan = make_plan(graph)
    space = legal_space(graph, plan, device)
    if case.schedule is not None:
        s = Schedule.from_dict(case.schedule)
    else:
        s = heuristic_schedule(plan, device, space)
    changes = case.small_changes if small and case.small_changes is not None else case.changes
    if changes:
        s = dataclasses.replace(s, **dict(changes))
    return s, list(space.violations(s))
