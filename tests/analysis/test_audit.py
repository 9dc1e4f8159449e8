"""The kernel audit (stitchtune/analysis/audit.py, sectors.py): sectors per request from the emulator's
trace, dead shared memory from the IR, the floor-ready criteria, and the emulator's slice and trace hooks.

Hand-built kernels keep the audit's own checks independent of what code generation does today; the
example graphs check the whole path (plan, heuristic, lowering, slice)."""

from __future__ import annotations

import numpy as np
import pytest

from helpers.common import EXAMPLES_DIR
from helpers.lowering import DEV
from stitchtune.analysis.audit import Criteria, audit_graph, dead_shared
from stitchtune.analysis.sectors import kernel_sectors, slice_blocks
from stitchtune.emulate.emulator import MemoryAccess, emulate_kernel
from stitchtune.graph.parse import load_graph
from stitchtune.ir import kir
from stitchtune.ir.kir import Assign, Bin, Const, Load, LoadVec, Param, Special, StoreVec, Var

I = lambda v: Const(v, "i32")  # noqa: E731
ROWS, COLS = 64, 256     # a [64, 256] float32 matrix


def _gidx() -> kir.Expr:
    return Bin("+", Bin("*", Special("bid"), Special("bdim")), Special("tid"))


def copy_kernel(width: int = 1) -> kir.Kernel:
    """out[i] = in[i], ``width`` consecutive floats per thread (a coalesced copy)."""
    i = Bin("*", _gidx(), I(width))
    vs = tuple(Var(f"v{k}") for k in range(width))
    body = (LoadVec(vs, "x", i), StoreVec("y", i, vs))
    return kir.Kernel("copy", (Param("x", "float32", ROWS * COLS, "input"),
                               Param("y", "float32", ROWS * COLS, "output")), body, 128)


def transpose_kernel() -> kir.Kernel:
    """y[c, r] = x[r, c]: thread i reads x[i] (coalesced) and stores at a stride of ROWS floats."""
    i = _gidx()
    r, c = Bin("/", i, I(COLS)), Bin("%", i, I(COLS))
    v = Var("v")
    body = (Assign(v, Load("x", i)), StoreVec("y", Bin("+", Bin("*", c, I(ROWS)), r), (v,)))
    return kir.Kernel("transpose", (Param("x", "float32", ROWS * COLS, "input"),
                                    Param("y", "float32", ROWS * COLS, "output")), body, 128)


def _buffers() -> dict[str, np.ndarray]:
    return {"x": np.arange(ROWS * COLS, dtype=np.float32), "y": np.zeros(ROWS * COLS, np.float32)}


@pytest.mark.parametrize("width", [1, 4])
def test_a_coalesced_copy_reads_and_writes_its_ideal_sectors(width):
    grid = ROWS * COLS // (128 * width)
    r = kernel_sectors(copy_kernel(width), grid, _buffers(), max_blocks=2)
    assert r.error == "" and r.blocks == 2
    assert {(a.op, a.buf) for a in r.accesses} == {("load", "x"), ("store", "y")}
    for a in r.accesses:
        assert a.ratio == 1.0
        assert a.requests == 2 * 4            # 2 blocks x 4 warps
        assert a.sectors == a.requests * width * 4   # 32 lanes x 4 B x width = 4 x width sectors
        assert a.active_lanes == 1.0
        assert a.access_bits == 32 * width


def test_a_strided_transpose_store_takes_eight_times_its_sectors():
    r = kernel_sectors(transpose_kernel(), ROWS * COLS // 128, _buffers(), max_blocks=4)
    by = {(a.op, a.buf): a for a in r.accesses}
    assert by["load", "x"].ratio == 1.0
    assert by["store", "y"].ratio == pytest.approx(8.0)   # one 32-byte sector per 4-byte lane


def test_the_slice_sees_the_full_launch_addresses_of_its_blocks():
    """gridDim.x stays the launch's: a grid-stride kernel's first blocks touch what they would in the full run."""
    k = kir.Kernel("stride", (Param("x", "float32", 4096, "input"), Param("y", "float32", 4096, "output")),
                   (StoreVec("y", Bin("+", Bin("*", Special("gdim"), Special("tid")), Special("bid")),
                             (Load("x", _gidx()),)),), 32)
    part: list[MemoryAccess] = []
    whole: list[MemoryAccess] = []
    emulate_kernel(k, 128, _small(), blocks=2, trace=part)
    emulate_kernel(k, 128, _small(), trace=whole)
    seen = [a.elements for a in part if a.op == "store"]
    full = [a.elements for a in whole if a.op == "store"]
    np.testing.assert_array_equal(seen[0], full[0][:64])
    assert seen[0].max() > 2 * 32            # addressed with gdim 128, not 2
    with pytest.raises(ValueError, match="slice"):
        emulate_kernel(k, 128, _small(), blocks=129)


def _small() -> dict[str, np.ndarray]:
    return {"x": np.ones(4096, np.float32), "y": np.zeros(4096, np.float32)}


def test_slice_blocks_keeps_whole_clusters():
    k = kir.Kernel("c", copy_kernel().params, copy_kernel().body, 128, cluster=4)
    assert slice_blocks(k, 64, 6) == 4 and slice_blocks(k, 64, 1) == 4 and slice_blocks(copy_kernel(), 3, 8) == 3


def test_a_shared_array_stored_and_never_loaded_is_dead():
    v = Var("v")
    body = (Assign(v, Load("x", _gidx())),
            StoreVec("live", Special("tid"), (v,)), StoreVec("dead", Special("tid"), (v,)), kir.Barrier(),
            StoreVec("y", _gidx(), (Load("live", Special("tid")),)))
    k = kir.Kernel("k", copy_kernel().params, body, 128,
                   shared=(kir.SharedBuf("live", 128), kir.SharedBuf("dead", 128)))
    assert dead_shared(k) == ("dead",)
    assert dead_shared(copy_kernel()) == ()


def _tiny_transpose(tmp_path):
    g = tmp_path / "tr.json"
    g.write_text('{"name": "tr", "inputs": {"x": {"shape": [2, 64, 4, 64], "dtype": "float32"}}, '
                 '"nodes": [{"id": "t", "op": "transpose", "args": ["x"], "perm": [0, 2, 3, 1]}, '
                 '{"id": "y", "op": "mul", "args": ["t", 1.0]}], "outputs": ["y"]}')
    return load_graph(str(g))


def test_audit_of_an_example_reports_floor_occupancy_and_sectors():
    a = audit_graph(load_graph(str(EXAMPLES_DIR / "layernorm_small.json")), DEV, sass=False)
    assert a.unique_bytes > 0 and a.floor_us == pytest.approx(a.unique_bytes / (DEV.dram_bandwidth_gbs * 1e3))
    assert a.predicted_us is not None and a.kernels
    for k in a.kernels:
        assert k.accesses and k.slice_error == "" and k.sass is None and k.registers_from == "estimate"
        assert k.blocks_per_sm >= 1 and k.waves > 0
        assert 0 < k.unique_bytes <= a.unique_bytes * 2
    d = a.to_dict()
    assert d["kernels"][0]["accesses"][0]["ratio"] >= 1.0
    assert any("slice" in n for n in a.notes) and any("SASS" in n for n in a.notes)


def test_problems_name_the_criteria_a_kernel_misses(tmp_path):
    """A transposed copy (whatever code generation does with it) is judged by the same criteria: a
    stricter sector bound can only add problems, and every problem names a criterion."""
    g = _tiny_transpose(tmp_path)
    loose = audit_graph(g, DEV, sass=False, criteria=Criteria(max_sector_ratio=100.0, min_waves=0.0,
                                                              min_active_lanes=0.0, dram_latency_ns=0.0))
    strict = audit_graph(g, DEV, sass=False, criteria=Criteria(max_sector_ratio=1.0))
    worst = max(k.worst_sector_ratio or 1.0 for k in strict.kernels)
    assert all("ideal sectors" not in p for k in loose.kernels for p in k.problems)
    assert any("ideal sectors" in p for k in strict.kernels for p in k.problems) == (worst > 1.0)


def test_an_audit_survives_its_json(tmp_path):
    import json

    from stitchtune.analysis.audit import RegionAudit
    from stitchtune.analysis.audit_report import audit_markdown

    a = audit_graph(load_graph(str(EXAMPLES_DIR / "softmax_small.json")), DEV, sass=False)
    back = RegionAudit.from_dict(json.loads(json.dumps(a.to_dict())))
    assert back == a and audit_markdown([back]) == audit_markdown([a])


def test_bank_wavefronts_of_shared_accesses():
    """A stride of one word is conflict-free, a stride of two words two-way, a broadcast free; a 4-wide
    store counts as four scalar requests per warp (the renderer splits it)."""
    tid, v = Special("tid"), Var("v")
    body = (Assign(v, Load("x", _gidx())),
            StoreVec("s", tid, (v,)),                                   # stride 1
            StoreVec("s", Bin("+", Bin("*", tid, I(2)), I(512)), (v,)),  # stride 2
            StoreVec("s", Bin("+", Bin("*", tid, I(4)), I(1024)), (v, v, v, v)),
            kir.Barrier(),
            StoreVec("y", _gidx(), (Bin("+", Load("s", I(0)), Load("s", tid)),)))
    k = kir.Kernel("banks", copy_kernel().params, body, 128, shared=(kir.SharedBuf("s", 1536),))
    r = kernel_sectors(k, ROWS * COLS // 128, _buffers(), max_blocks=2)
    assert r.error == ""
    by = {(a.op, a.width, a.ratio) for a in r.shared}
    stores = sorted((a.width, a.ratio, a.requests) for a in r.shared if a.op == "store")
    assert stores == [(1, 1.0, 8), (1, 2.0, 8), (4, 4.0, 32)], by
    (load,) = [a for a in r.shared if a.op == "load"]      # s[0] (a broadcast) and s[tid], one statement
    assert load.ratio == 1.0 and load.requests == 2 * 8


def test_the_fitted_time_reads_the_compiled_facts_of_the_cubin(monkeypatch):
    # a fake cubin whose every kernel keeps one 4-byte load in flight and spills: the post-build prediction is
    # slower than the IR walk's (whose loads in flight the fake SASS contradicts)
    import stitchtune.analysis.audit as audit
    from stitchtune.gpu.sass import SassMetrics

    g = load_graph(str(EXAMPLES_DIR / "layernorm_small.json"))
    plain = audit_graph(g, DEV, sass=False)

    def fake_sass(program, arch, notes):
        return {k.name: SassMetrics(k.name, 100, registers=32, max_loads_in_flight=1, max_bytes_in_flight=4)
                for k in program.kernels}

    monkeypatch.setattr(audit, "_sass_of", fake_sass)
    compiled = audit_graph(g, DEV, sass=True)
    assert compiled.fitted_us > plain.fitted_us
    assert any("compiled code's bytes in flight" in n for n in compiled.notes)


def test_audit_model_regions_filter_audits_only_the_named_workloads() -> None:
    """``audit_model(regions=...)`` audits only the named workloads (a script's quick look at one region)."""
    torch = pytest.importorskip("torch")
    from stitchtune.analysis.audit import audit_model

    class TwoRegions(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.w = torch.nn.Parameter(torch.randn(64, 64))

        def forward(self, x: "torch.Tensor") -> "torch.Tensor":
            h = torch.nn.functional.layer_norm(x * 2.0, (64,)) @ self.w
            return torch.softmax(h + 1.0, dim=-1)

    model, inputs = TwoRegions(), (torch.randn(32, 64),)
    every, _ = audit_model(model, inputs, DEV, sass=False, peer=False)
    assert len(every) >= 2
    first = every[0].graph
    only, skipped = audit_model(model, inputs, DEV, regions={first}, sass=False, peer=False)
    assert [a.graph for a in only] == [first] and skipped == []
    assert audit_model(model, inputs, DEV, regions=set(), sass=False, peer=False) == ([], [])


def test_a_gathered_table_counts_its_gathered_rows_in_the_floor_and_the_kernel():
    """Issue 39: 10 of the 50 rows of the table are gathered; the floor counted all 50."""
    g = load_graph(str(EXAMPLES_DIR / "embed_gather_layernorm_small.json"))
    a = audit_graph(g, DEV, sass=False)
    assert a.unique_bytes == g.min_bytes() == g.io_bytes() - 40 * 32 * 4
    (k,) = a.kernels
    assert k.unique_bytes == g.min_bytes()   # ids + 10 rows + pos + gamma + beta + the output
    assert k.read_bytes == g.min_bytes() - 10 * 32 * 4
