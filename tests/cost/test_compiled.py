"""Compiled-code facts in the fitted cost model (stitchtune/cost/compiled.py, stitchtune/cost/fitted.py) and the
L2 request term of scratch loads (issue 39 item 3). Every time here is a prediction of the model."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from stitchtune.gpu.sass import compiled_facts, parse_sass
from stitchtune.cost.compiled import CompiledFacts, registers_of, with_compiled
from stitchtune.cost.features import KernelFeatures, kernel_features
from stitchtune.cost.fitted import Coefficients, kernel_device_us, kernel_terms_us, predict_program
from stitchtune.hardware.device import get_device
from stitchtune.ir import kir
from stitchtune.ir.kir import Assign, Bin, Const, For, Kernel, Load, Param, Special, StoreVec, Var

H200 = get_device("h200")
FIXTURE = Path(__file__).parent / "data" / "fit_fixture.json"
NAMES = {f.name for f in dataclasses.fields(KernelFeatures)}
TID = Special("tid")
I32 = kir.I32


def _kernel(**over: float) -> KernelFeatures:
    row = json.loads(FIXTURE.read_text())["rows"][0]
    return dataclasses.replace(KernelFeatures(**{k: v for k, v in row["kernels"][0].items() if k in NAMES}), **over)


def test_with_compiled_sets_the_facts_of_the_kernels_it_knows() -> None:
    a, b = _kernel(name="st_k0"), _kernel(name="st_k1")
    facts = {"st_k0": CompiledFacts(registers=40, bytes_in_flight=76.0, loads_in_flight=19.0, spill_instructions=3)}
    fa, fb = with_compiled((a, b), facts)
    assert (fa.compiled_bytes_in_flight, fa.spill_instructions) == (76.0, 3.0)
    assert fb == b and fb.compiled_bytes_in_flight == 0.0        # no facts: the IR walk's bytes in flight stay
    assert registers_of(facts) == {"st_k0": 40}
    assert CompiledFacts.from_dict(facts["st_k0"].to_dict()) == facts["st_k0"]


def test_the_compiled_bytes_in_flight_replace_the_walks() -> None:
    # 3 blocks of 256 threads, a rolled loop the walk takes for one load in flight (st_xsum of BERT's training
    # step: nvcc unrolled it and keeps 19 loads in flight): latency-bound, so the bytes in flight set the time
    f = _kernel(grid=3, block=256, blocks_per_sm=8, registers=32, active_lanes=1.0, bytes_in_flight_per_thread=4.0,
                unique_bytes=1_200_000, sector_bytes=1_200_000.0, excess_sector_bytes=0.0, serial_rounds=0.0,
                scratch_loads=0.0, grid_barriers=0.0)
    c = dataclasses.replace(Coefficients.defaults(H200), inflight_reg_share=1.0)
    walked = kernel_terms_us(f, H200, c)["memory"]
    compiled = kernel_terms_us(dataclasses.replace(f, compiled_bytes_in_flight=76.0), H200, c)["memory"]
    assert compiled < walked / 10
    same = kernel_terms_us(dataclasses.replace(f, bytes_in_flight_per_thread=76.0), H200, c)["memory"]
    assert compiled == pytest.approx(same)


def test_spills_add_time_per_wave() -> None:
    f = _kernel()
    c = dataclasses.replace(Coefficients.defaults(H200), spill_ns=200.0)
    t = kernel_terms_us(dataclasses.replace(f, spill_instructions=10.0), H200, c)
    waves = -(-f.grid // (max(f.blocks_per_sm, 1) * H200.sm_count))
    assert t["spills"] == pytest.approx(waves * 10 * 0.2)
    assert kernel_device_us(dataclasses.replace(f, spill_instructions=10.0), H200, c) == pytest.approx(
        kernel_device_us(f, H200, c) + t["spills"])


def _combine(index: kir.Expr, role: str) -> KernelFeatures:
    i, acc = Var("i", I32), Var("acc")
    body = (Assign(acc, Const(0.0)),
            For(i, Const(0, I32), Const(64, I32), 1, (Assign(acc, Bin("+", acc, Load("part0", index))),)),
            StoreVec("out0", TID, (acc,)))
    k = Kernel("k", (Param("in0", "float32", 128, "input"), Param("out0", "float32", 128, "output"),
                     Param("part0", "float32", 64 * 128, role)), body, 128)
    return kernel_features(k, 4096, H200, registers=32)


def test_scratch_loads_are_l2_requests_and_limit_a_kernel_of_many_partials() -> None:
    broadcast = _combine(Var("i", I32), "scratch")        # every lane of a warp reads the same partial
    assert broadcast.l2_requests == 64 * 4                # 64 trips x 4 warps per block
    assert _combine(Var("i", I32), "input").l2_requests == 0   # an input is read through L1
    c = dataclasses.replace(Coefficients.defaults(H200), l2_request_ns=13.0)
    t = kernel_terms_us(broadcast, H200, c)
    assert t["l2_requests"] == pytest.approx(4096 * 256 / H200.sm_count * 13.0 / 1000.0)
    assert t["body"] >= t["l2_requests"]


def test_predict_program_reads_compiled_facts_after_a_build() -> None:
    from stitchtune.graph.parse import load_graph
    from stitchtune.lower.entry import lower
    from stitchtune.lower.resources import legal_space
    from stitchtune.cost.heuristic import heuristic_schedule
    from stitchtune.plan.planner import make_plan

    g = load_graph(Path(__file__).parents[2] / "examples" / "layernorm.json")
    plan = make_plan(g)
    space = legal_space(g, plan, H200)
    prog = lower(g, plan, heuristic_schedule(plan, H200, space), H200, space)
    before = predict_program(prog, H200)
    facts = {k.name: CompiledFacts(registers=32, bytes_in_flight=4.0, loads_in_flight=1.0, spill_instructions=50)
             for k in prog.kernels}
    after = predict_program(prog, H200, compiled=facts)
    assert after.time_us > before.time_us        # one 4-byte load in flight and 50 spills per thread: slower
    assert predict_program(prog, H200, compiled={}).time_us == pytest.approx(before.time_us)


SASS = """
        Function : st_k0
        /*0000*/                   LDC R1, c[0x0][0x28] ;
        /*0010*/                   LDG.E.128 R4, desc[UR4][R2.64] ;
        /*0020*/                   LDG.E.128 R8, desc[UR4][R2.64+0x10] ;
        /*0030*/                   STL [R1], R4 ;
        /*0040*/                   LDL R12, [R1] ;
        /*0050*/                   FADD R13, R8, R12 ;
        /*0060*/                   EXIT ;
"""


def test_compiled_facts_of_sass_text() -> None:
    f = compiled_facts(parse_sass(SASS)["st_k0"])
    assert f.bytes_in_flight == 32.0 and f.loads_in_flight == 2.0 and f.spill_instructions == 2


def _script(name: str):  # type: ignore[no-untyped-def]
    import importlib.util

    spec = importlib.util.spec_from_file_location(name, Path(__file__).parents[2] / "scripts" / f"{name}.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_the_dataset_scripts_fingerprint_programs_as_the_dataset_keys_them() -> None:
    # scripts/measured_sources.py records, scripts/sass_dataset.py checks: both must equal
    # gpu.render.program_fingerprint, else the check "source hashes to source_sha256" means nothing
    from stitchtune.cost.heuristic import heuristic_schedule
    from stitchtune.gpu.render import program_fingerprint, render
    from stitchtune.graph.parse import load_graph
    from stitchtune.lower.entry import lower
    from stitchtune.lower.resources import legal_space
    from stitchtune.plan.planner import make_plan

    g = load_graph(Path(__file__).parents[2] / "examples" / "layernorm.json")
    plan = make_plan(g)
    space = legal_space(g, plan, H200)
    prog = lower(g, plan, heuristic_schedule(plan, H200, space), H200, space)
    src = render(prog)
    launches = [[ln.kernel, ln.grid, ln.block, ln.smem_bytes, list(ln.args)] for ln in prog.launches]
    assert _script("measured_sources").fingerprint(prog, src) == program_fingerprint(prog)
    sd = _script("sass_dataset")
    assert sd.fingerprint(src, launches) == program_fingerprint(prog)
    assert sd.fingerprint(src + " ", launches) != program_fingerprint(prog)
    rows = [{"group": "db:x", "label": "x", "source_sha256": program_fingerprint(prog), "kernels": []}]
    bad = {program_fingerprint(prog): {"source": src + "// edited\n", "launches": launches}}
    _, problems = sd.facts_of_rows(rows, {}, 1)
    assert problems and "not in the sources" in problems[0]
    assert any("do not hash" in p for p in sd.facts_of_rows([], bad, 1)[1])
