"""The audit's SASS reading (stitchtune/gpu/sass.py) and the Triton peer (triton_peer.py).

The parser tests need no tool; the cubin tests need nvcc and cuobjdump (pip nvidia-cuda-cuobjdump), the
peer tests triton (the ``audit`` extra), and skip without them."""

from __future__ import annotations

import importlib.util
import json

import pytest

from helpers.common import EXAMPLES_DIR
from helpers.lowering import DEV
from stitchtune.gpu.sass import find_cuobjdump, parse_res_usage, parse_sass, read_cubin
from stitchtune.gpu.build import NvccBuilder, nvcc_found
from stitchtune.gpu.render import preamble, render_kernel
from stitchtune.ir import kir
from stitchtune.ir.kir import Bin, Const, Load, Param, Special, StoreVec

SASS = """
\tcode for sm_90
\t\tFunction : st_k0
        /*0000*/                   LDC R1, c[0x0][0x28] ;                                  /* 0x00000a00ff017b82 */
        /*0010*/                   LDG.E.128.CONSTANT R12, desc[UR6][R18.64] ;             /* 0x00000006120ca981 */
        /*0020*/              @!P2 LDG.E R8, desc[UR6][R16.64] ;                           /* 0x00000006120ca981 */
        /*0030*/                   STS [R3], R12 ;                                         /* 0x0 */
        /*0040*/                   FADD R4, R13, R8 ;                                      /* 0x0 */
        /*0050*/                   LDG.E.64 R20, desc[UR6][R16.64+0x10] ;                  /* 0x0 */
        /*0060*/                   MUFU.RCP R5, R4 ;                                       /* 0x0 */
        /*0070*/                   FCHK P0, R4, R5 ;                                       /* 0x0 */
        /*0080*/                   MUFU.EX2 R6, R5 ;                                       /* 0x0 */
        /*0090*/                   BAR.SYNC.DEFER_BLOCKING 0x0 ;                           /* 0x0 */
        /*00a0*/                   STL [R1], R6 ;                                          /* 0x0 */
        /*00b0*/                   CALL.REL.NOINC 0x200 ;                                  /* 0x0 */
        /*00c0*/                   STG.E.128 desc[UR6][R18.64], R20 ;                      /* 0x0 */
        /*00d0*/                   EXIT ;                                                  /* 0x0 */
\t\tFunction : other
        /*0000*/                   EXIT ;                                                  /* 0x0 */
"""

RES = """
Resource usage:
 Common:
  GLOBAL:0
 Function st_k0:
  REG:96 STACK:8 SHARED:1024 LOCAL:4 CONSTANT[0]:552 TEXTURE:0 SURFACE:0 SAMPLER:0
 Function other:
  REG:8 STACK:0 SHARED:0 LOCAL:0 CONSTANT[0]:352 TEXTURE:0 SURFACE:0 SAMPLER:0
"""


def test_parse_sass_counts_widths_mufu_division_barriers_spills_and_loads_in_flight():
    m = parse_sass(SASS)
    assert set(m) == {"st_k0", "other"} and m["other"].instructions == 1
    k = m["st_k0"]
    assert k.ldg == {128: 1, 32: 1, 64: 1} and k.stg == {128: 1}
    assert (k.sts, k.lds, k.barriers, k.spill_stores, k.spill_loads) == (1, 0, 1, 1, 0)
    assert k.mufu == {"RCP": 1, "EX2": 1} and k.fchk == 1 and k.calls == 1 and k.division_slow_path
    # the 128-bit and the 32-bit load are both pending until the FADD reads R13 and R8
    assert k.max_loads_in_flight == 2 and k.max_bytes_in_flight == 20


def test_parse_res_usage():
    r = parse_res_usage(RES)
    assert r["st_k0"]["REG"] == 96 and r["st_k0"]["STACK"] == 8 and r["other"]["REG"] == 8


needs_tools = pytest.mark.skipif(not nvcc_found() or find_cuobjdump() is None,
                                 reason="needs nvcc and cuobjdump (pip install nvidia-cuda-cuobjdump)")


def _kernel(divide: bool) -> kir.Kernel:
    i = Bin("+", Bin("*", Special("bid"), Special("bdim")), Special("tid"))
    x, d = Load("x", i), Load("d", i)
    v = Bin("/", x, d) if divide else Bin("*", x, d)
    return kir.Kernel("k", (Param("x", "float32", 4096, "input"), Param("d", "float32", 4096, "input"),
                            Param("y", "float32", 4096, "output")), (StoreVec("y", i, (v,)),), 128)


def _sass_of(kernel: kir.Kernel, tmp_path):
    res = NvccBuilder(jobs=1, cache_dir=tmp_path).build([preamble([kernel]) + render_kernel(kernel)], "sm_90")[0]
    assert res.status == "ok", res.error
    return read_cubin(res.cubin_path)[kernel.name]


@needs_tools
def test_a_per_element_division_shows_the_slow_path_and_a_product_does_not(tmp_path):
    div, mul = _sass_of(_kernel(True), tmp_path), _sass_of(_kernel(False), tmp_path)
    assert div.division_slow_path and div.mufu.get("RCP", 0) >= 1 and div.registers > 0
    assert not mul.division_slow_path and mul.ldg == {32: 2} and mul.stg == {32: 1}


needs_triton = pytest.mark.skipif(importlib.util.find_spec("triton") is None or find_cuobjdump() is None,
                                  reason="needs triton and cuobjdump (pip install 'stitchtune[audit]')")


def test_peer_choices_follow_inductors_persistent_reduction_rules():
    from stitchtune.analysis.triton_peer import reduction_choices

    assert reduction_choices(98304, 512) == (2, 512, 1)     # BERT's attention softmax rows
    assert reduction_choices(4096, 768) == (1, 1024, 1)     # a layer norm of 768
    assert reduction_choices(64, 512) == (1, 512, 4)        # few rows: one row, R // 128 warps


def test_region_kinds_of_the_examples():
    from stitchtune.analysis.triton_peer import region_kind
    from stitchtune.graph.parse import load_graph
    from stitchtune.plan.planner import make_plan

    for name, kind in [("masked_softmax_small", "softmax"), ("layernorm_small", "layernorm"),
                       ("rmsnorm_small", "rmsnorm"), ("bias_gelu_small", "gelu"), ("cross_entropy_small", None)]:
        g = load_graph(str(EXAMPLES_DIR / f"{name}.json"))
        assert region_kind(g, make_plan(g)) == kind, name


@needs_triton
def test_the_triton_softmax_peer_has_no_shared_memory_no_division_slow_path_and_128_bit_accesses():
    from stitchtune.analysis.triton_peer import peer_audit
    from stitchtune.graph.parse import load_graph
    from stitchtune.plan.planner import make_plan

    g = load_graph(str(EXAMPLES_DIR / "masked_softmax.json"))   # 65536 rows of 512: two rows per 1-warp program
    notes: list[str] = []
    p = peer_audit(g, make_plan(g), DEV, notes)
    assert p is not None, notes
    s = p["sass"]
    assert p["kind"] == "softmax" and p["block"] == 32 and s["fchk"] == 0 and s["lds"] == s["sts"] == 0
    assert set(s["ldg"]) == {"128"} and s["mufu"].get("EX2", 0) > 0 and s["mufu"].get("RCP", 0) <= 2


def test_a_head_split_copy_gets_a_pointwise_peer_and_a_k_transpose_none(tmp_path):
    from stitchtune.analysis.triton_peer import peer_kernel
    from stitchtune.graph.parse import load_graph
    from stitchtune.plan.planner import make_plan

    def graph(perm):
        p = tmp_path / f"g{''.join(map(str, perm))}.json"
        p.write_text(json.dumps({"name": "hs", "inputs": {"x": {"shape": [2, 16, 4, 8], "dtype": "float32"}},
                                 "nodes": [{"id": "r", "op": "reshape", "args": ["x"], "shape": [2, 16, 4, 8]},
                                           {"id": "t", "op": "transpose", "args": ["r"], "perm": perm},
                                           {"id": "y", "op": "mul", "args": ["t", 1.0]}], "outputs": ["y"]}))
        g = load_graph(str(p))
        return g, make_plan(g)

    peer = peer_kernel(*graph([0, 2, 1, 3]))
    assert peer is not None and peer.kind == "copy" and dict(peer.constants)["S"] == 16
    assert dict(peer.constants)["H"] == 4 and peer.xnumel == 2 * 16 * 4 * 8 and peer.num_warps == 4
    k = peer_kernel(*graph([0, 2, 3, 1]))      # K transposed: Inductor's 32 x 32 tiles
    assert k is not None and k.kind == "transpose" and (k.xnumel, k.ynumel) == (16, 2 * 4 * 8)
    assert k.grid == 1 * 2 and peer_kernel(*graph([0, 3, 1, 2])) is None


@needs_triton
def test_the_transpose_peer_stages_its_tile_through_shared_memory_with_128_bit_accesses(tmp_path):
    from stitchtune.analysis.triton_peer import compile_peer, peer_kernel
    from stitchtune.graph.parse import load_graph
    from stitchtune.plan.planner import make_plan

    p = tmp_path / "k.json"
    p.write_text(json.dumps({"name": "k", "inputs": {"x": {"shape": [2, 512, 12, 64], "dtype": "float32"}},
                             "nodes": [{"id": "t", "op": "transpose", "args": ["x"], "perm": [0, 2, 3, 1]},
                                       {"id": "y", "op": "mul", "args": ["t", 1.0]}], "outputs": ["y"]}))
    g = load_graph(str(p))
    m = compile_peer(peer_kernel(g, make_plan(g)))
    assert m.ldg == {128: 2} and m.stg == {128: 2} and m.sts > 0 and m.lds > 0 and m.barriers >= 1
    assert m.shared_bytes > 0


def test_sass_metrics_survive_their_json():
    from stitchtune.gpu.sass import SassMetrics

    k = parse_sass(SASS)["st_k0"]
    assert SassMetrics.from_dict(json.loads(json.dumps(k.to_dict()))) == k


def test_a_tanh_alone_is_not_a_gelu(tmp_path):
    from stitchtune.analysis.triton_peer import region_kind
    from stitchtune.graph.parse import load_graph
    from stitchtune.plan.planner import make_plan

    p = tmp_path / "t.json"
    p.write_text(json.dumps({"name": "t", "inputs": {"x": {"shape": [8, 768], "dtype": "float32"}},
                             "nodes": [{"id": "y", "op": "tanh", "args": ["x"]}], "outputs": ["y"]}))
    g = load_graph(str(p))
    assert region_kind(g, make_plan(g)) is None
