"""gpu/build_facts: the compiled facts of a built cubin, read once per cubin, None without cuobjdump; the
emulate runner's time uses them."""

from __future__ import annotations

import dataclasses
import logging
from pathlib import Path
from typing import Any

import pytest

from stitchtune.errors import ToolchainError
from stitchtune.gpu import build_facts
from stitchtune.gpu.build import BuildResult, NvccBuilder, nvcc_found
from stitchtune.gpu.build_facts import SassFactsReader
from stitchtune.gpu.sass import SassMetrics, find_cuobjdump

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def _build(path: Path | None, status: str = "ok") -> BuildResult:
    return BuildResult(status, "h", None if path is None else str(path), "sm_90", registers={"st_k0": 40})


def _metrics(name: str = "st_k0") -> dict[str, SassMetrics]:
    return {name: SassMetrics(name, 10, registers=40, spill_loads=1, spill_stores=2, max_loads_in_flight=3,
                              max_bytes_in_flight=48)}


def test_facts_of_a_cubin_are_read_once_per_cubin_bytes(tmp_path: Path) -> None:
    calls: list[str] = []

    def read(path: str, tool: str) -> dict[str, SassMetrics]:
        calls.append(path)
        return _metrics()

    a, b, c = tmp_path / "a.cubin", tmp_path / "b.cubin", tmp_path / "c.cubin"
    a.write_bytes(b"cubin one")
    b.write_bytes(b"cubin one")      # the same bytes under another name (another cache key): one read
    c.write_bytes(b"cubin two")
    reader = SassFactsReader(tool="/fake/cuobjdump", read=read, cache_dir=tmp_path / "cache")
    f = reader(_build(a))
    assert f is not None and f["st_k0"].registers == 40 and f["st_k0"].bytes_in_flight == 48.0
    assert f["st_k0"].loads_in_flight == 3.0 and f["st_k0"].spill_instructions == 3
    assert reader(_build(b)) == f and reader(_build(a)) == f
    assert reader(_build(c)) == f and calls == [str(a), str(c)] and reader.reads == 2


def test_facts_are_stored_on_disk_so_another_process_reads_no_sass(tmp_path: Path) -> None:
    (tmp_path / "a.cubin").write_bytes(b"cubin one")
    first = SassFactsReader(tool="/fake/cuobjdump", read=lambda p, t: _metrics(), cache_dir=tmp_path / "cache")
    f = first(_build(tmp_path / "a.cubin"))
    stored = list((tmp_path / "cache").rglob("*.json"))
    assert len(stored) == 1 and stored[0].parent.parent.name == f"sass-facts-v{build_facts.FACTS_VERSION}"
    again = SassFactsReader(tool="/fake/cuobjdump", read=lambda p, t: pytest.fail("read from disk"),
                            cache_dir=tmp_path / "cache")
    assert again(_build(tmp_path / "a.cubin")) == f and again.reads == 0
    stored[0].write_text("{not json")                 # a torn or foreign file is a miss, not an error
    third = SassFactsReader(tool="/fake/cuobjdump", read=lambda p, t: _metrics(), cache_dir=tmp_path / "cache")
    assert third(_build(tmp_path / "a.cubin")) == f and third.reads == 1


def test_no_facts_for_a_failed_build_or_a_build_without_a_cubin(tmp_path: Path) -> None:
    reader = SassFactsReader(tool="/fake/cuobjdump", read=lambda p, t: pytest.fail("nothing to read"),
                             cache_dir=tmp_path / "cache")
    assert reader(_build(None)) is None
    assert reader(BuildResult("compile_error", "h", None, "sm_90", error="x")) is None
    assert reader(_build(tmp_path / "missing.cubin")) is None


def test_an_unreadable_cubin_is_none_once_with_a_warning(tmp_path: Path, caplog: Any) -> None:
    def read(path: str, tool: str) -> dict[str, SassMetrics]:
        raise ToolchainError("cuobjdump -sass failed: bad cubin")

    (tmp_path / "a.cubin").write_bytes(b"junk")
    reader = SassFactsReader(tool="/fake/cuobjdump", read=read, cache_dir=tmp_path / "cache")
    with caplog.at_level(logging.WARNING, logger="stitchtune.gpu.build_facts"):
        assert reader(_build(tmp_path / "a.cubin")) is None
        assert reader(_build(tmp_path / "a.cubin")) is None
    assert reader.reads == 1 and len([r for r in caplog.records if "bad cubin" in r.getMessage()]) == 1
    assert not list((tmp_path / "cache").rglob("*.json"))     # a failure is not stored


def test_without_cuobjdump_none_and_one_note(tmp_path: Path, monkeypatch: Any, caplog: Any) -> None:
    monkeypatch.setattr(build_facts, "find_cuobjdump", lambda: None)
    monkeypatch.setattr(build_facts, "_noted_missing", False)
    (tmp_path / "a.cubin").write_bytes(b"cubin")
    reader = SassFactsReader(read=lambda p, t: pytest.fail("no tool: nothing is run"), cache_dir=tmp_path)
    with caplog.at_level(logging.INFO, logger="stitchtune.gpu.build_facts"):
        assert reader(_build(tmp_path / "a.cubin")) is None
        assert SassFactsReader(cache_dir=tmp_path)(_build(tmp_path / "a.cubin")) is None
    assert len([r for r in caplog.records if "cuobjdump not found" in r.getMessage()]) == 1


def _layernorm() -> tuple[Any, Any, Any]:
    from stitchtune.cost.heuristic import heuristic_schedule
    from stitchtune.graph.parse import load_graph
    from stitchtune.hardware.device import get_device
    from stitchtune.lower.entry import lower
    from stitchtune.plan.planner import make_plan
    from stitchtune.space import SearchSpace

    g = load_graph(EXAMPLES / "layernorm_small.json")
    plan = make_plan(g)
    dev = get_device("h200")
    space = SearchSpace.for_plan(plan, dev)
    return g, dev, lower(g, plan, heuristic_schedule(plan, dev, space), dev, space)


def test_the_emulate_runners_time_uses_the_compiled_facts() -> None:
    from stitchtune.cost.compiled import CompiledFacts
    from stitchtune.cost.fitted import predict_program
    from stitchtune.gpu.build import FakeBuilder
    from stitchtune.gpu.render import render
    from stitchtune.gpu.runners import EmulateRunner

    g, dev, prog = _layernorm()
    (build,) = FakeBuilder(registers=32).build([render(prog)])
    facts = {k.name: CompiledFacts(registers=40, bytes_in_flight=4.0, loads_in_flight=1.0, spill_instructions=50)
             for k in prog.kernels}
    regs = dict(build.registers)
    (with_facts,) = EmulateRunner(g, dev, compiled_facts=lambda b: facts).run([(prog, build)])
    (without,) = EmulateRunner(g, dev, compiled_facts=lambda b: None).run([(prog, build)])
    assert with_facts.status == "ok" and with_facts.estimated
    assert with_facts.median_us == pytest.approx(predict_program(prog, dev, registers=regs, compiled=facts).time_us)
    assert without.median_us == pytest.approx(predict_program(prog, dev, registers=regs).time_us)
    assert with_facts.median_us > 1.05 * without.median_us


@pytest.mark.skipif(not nvcc_found() or find_cuobjdump() is None, reason="needs nvcc and cuobjdump")
def test_a_real_build_reads_as_facts_with_ptxas_registers(tmp_path: Path) -> None:
    from stitchtune.gpu.render import render

    _, _, prog = _layernorm()
    (build,) = NvccBuilder(cache_dir=tmp_path).build([render(prog)], "sm_90")
    assert build.status == "ok", build.error
    reader = SassFactsReader(cache_dir=tmp_path)
    facts = reader(build)
    assert facts is not None and set(facts) == set(build.registers)
    for name, f in facts.items():
        assert f.registers == build.registers[name] and f.bytes_in_flight > 0
    assert reader(dataclasses.replace(build)) is facts and reader.reads == 1
