"""No dead reuse caches (issue 39): a cache is filled only where a later sweep reads it back.

The attention softmax + mask region of BERT at the GPU script's shape (batch 8, 12 heads, 512 x 512)
took 128 KB of shared memory per block under the heuristic before: every full-size tensor of the chain
``scores -> sc -> z -> d -> e`` was a cache, half of them written and never read (with ``e`` cached the
output sweep never reads ``d``). Now the heuristic caches ``z`` and ``e`` in registers and no shared
memory, and the lowering drops from any schedule the caches no sweep reads back.
"""

from __future__ import annotations

import random
import re

import pytest

from stitchtune.cost.heuristic import heuristic_schedule
from stitchtune.cost.reuse import tensors_to_cache
from stitchtune.graph.parse import load_graph, parse_graph
from stitchtune.hardware.device import get_device
from stitchtune.ir import kir
from stitchtune.lower.entry import lower
from stitchtune.plan.planner import make_plan
from stitchtune.space import ReuseLevel, Schedule, SearchSpace

from helpers.common import REPO
from helpers.lowering import check_emulates

DEV = get_device("H200")


def attention_softmax(heads: int = 12, seq: int = 512) -> kir.Program:
    """BERT's attention scores scaled, masked and softmaxed ([8, heads, seq, seq], fp32)."""
    return parse_graph({
        "name": "attn_softmax",
        "inputs": {"scores": {"shape": [8, heads, seq, seq], "dtype": "float32"},
                   "mask": {"shape": [8, 1, 1, seq], "dtype": "float32"}},
        "nodes": [{"id": "sc", "op": "mul", "args": ["scores", 0.125]},
                  {"id": "z", "op": "add", "args": ["sc", "mask"]},
                  {"id": "m", "op": "reduce_max", "args": ["z"], "axes": [-1], "keepdims": True},
                  {"id": "d", "op": "sub", "args": ["z", "m"]},
                  {"id": "e", "op": "exp", "args": ["d"]},
                  {"id": "s", "op": "reduce_sum", "args": ["e"], "axes": [-1], "keepdims": True},
                  {"id": "y", "op": "div", "args": ["e", "s"]}],
        "outputs": ["y"]})


def unread_caches(k: kir.Kernel) -> set[str]:
    """The shared buffers and local arrays of ``k`` that are written and never read."""
    written, read = set(), set()
    for st in kir.walk(k.body):
        if isinstance(st, kir.StoreVec):
            written.add(st.buf)
        elif isinstance(st, kir.SetLocal):
            written.add(st.array)
        for e in kir.exprs(st):
            if isinstance(e, kir.Load):
                read.add(e.buf)
            elif isinstance(e, kir.LocalRef):
                read.add(e.array)
    caches = ({b.name for b in k.shared if re.fullmatch(r"sc\d+", b.name)}
              | {a.name for a in k.locals if re.fullmatch(r"rc\d+", a.name)})
    return (caches & written) - read | (caches - written)


def test_attention_softmax_heuristic_has_no_dead_cache_and_no_shared_memory() -> None:
    g = attention_softmax()
    plan = make_plan(g)
    space = SearchSpace.for_plan(plan, DEV)
    s = heuristic_schedule(plan, DEV, space)
    levels = dict(zip(plan.reuse_candidates, s.reuse))
    assert {c for c, lvl in levels.items() if lvl in (ReuseLevel.REGISTER, ReuseLevel.SHARED)} == {"z", "e"}
    prog = lower(g, plan, s, DEV, space)
    assert [k.smem_bytes for k in prog.kernels] == [0]   # was 131072 (four 32 KB caches, two never read)
    assert all(not unread_caches(k) for k in prog.kernels)


def test_every_cache_the_lowering_keeps_is_read_back() -> None:
    """All candidates shared (the schedule that took 128 KB): only the caches a later sweep reads remain."""
    g = attention_softmax()
    plan = make_plan(g)
    space = SearchSpace.for_plan(plan, DEV)
    s = Schedule(16, 256, 1, 4, 1, 0, ("local", "local"), (ReuseLevel.SHARED,) * len(plan.reuse_candidates))
    prog = lower(g, plan, s, DEV, space)
    (k,) = prog.kernels
    assert not unread_caches(k)
    # z (read by sweep 2) and e (read by the output sweep), 32 KB each; was 131072 with sc and d never read
    # (scores, mask, sc: only sweep 1 computes them once z is cached; d: only sweep 2 once e is)
    assert k.smem_bytes == 65536 and {b.name for b in k.shared} == {"sc3", "sc6"}  # z, e


@pytest.mark.parametrize("name", ["softmax_small.json", "masked_softmax_small.json", "layernorm_small.json",
                                  "layernorm_backward_small.json", "group_norm_silu_small.json",
                                  "embed_add_layernorm_small.json", "colsum_sigmoid_scale_small.json"])
def test_sampled_schedules_keep_no_unread_cache(name: str) -> None:
    g = load_graph(REPO / "examples" / name)
    plan = make_plan(g)
    space = SearchSpace.for_plan(plan, DEV)
    for i in range(12):
        s = space.sample(random.Random(i))
        for k in lower(g, plan, s, DEV, space).kernels:
            assert not unread_caches(k), (name, s.to_json(), k.name)


def test_tensors_to_cache_leaves_out_dead_and_cheap_tensors() -> None:
    def picks(name: str) -> frozenset[str]:
        return tensors_to_cache(make_plan(load_graph(REPO / "examples" / name)))
    assert picks("softmax.json") == {"x", "e"}            # d = x - max: unread once e is cached
    assert picks("layernorm.json") == {"x"}               # xc = x - mean: one subtraction, recomputed
    assert picks("masked_softmax.json") == {"z", "e"}     # z saves the mask's loads; exp not recomputed


def test_attention_softmax_small_emulates() -> None:
    check_emulates(attention_softmax(heads=2, seq=64), n_samples=4)
