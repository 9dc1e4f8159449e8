"""The cost of generic kernels (cost model item 8) and scripts/generic_vs_specialised.py's CPU parts."""

from __future__ import annotations

import contextlib
import dataclasses
import importlib.util
import io
import json
from pathlib import Path
from typing import Any

import numpy as np

from helpers.common import EXAMPLES_DIR, REPO
from helpers.lowering import DEV
from stitchtune.cost.heuristic import heuristic_schedule
from stitchtune.cost.model import explain, predict
from stitchtune.gpu.fake_driver import FakeDriver
from stitchtune.graph.dynamic import Bucket, BucketKey, load_dynamic, parse_dynamic
from stitchtune.graph.reference import random_inputs
from stitchtune.ir import kir
from stitchtune.lower.dynamic import RowFit, fit_rows, generic_profile, lower_dynamic, runtime_divs
from stitchtune.lower.entry import lower
from stitchtune.plan.planner import make_plan


def _script() -> Any:
    spec = importlib.util.spec_from_file_location("generic_vs_specialised",
                                                  REPO / "scripts" / "generic_vs_specialised.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _generic(name: str, lo: int, hi: int) -> tuple[RowFit, Any, kir.Program]:
    dg = load_dynamic(EXAMPLES_DIR / "dynamic" / f"{name}.json")
    fit = fit_rows(dg, BucketKey((Bucket("seq", lo, hi),)))
    assert isinstance(fit, RowFit)
    s = heuristic_schedule(fit.plan, DEV)
    prog = lower_dynamic(fit, s, DEV)
    assert isinstance(prog, kir.Program)
    return fit, s, prog


def test_runtime_divisions_are_counted_and_priced() -> None:
    fit, s, prog = _generic("embed_add_layernorm_seq", 129, 256)
    # the round count over gridDim.x and the position embedding's r % seq: runtime divisors
    assert all(k.runtime_divs >= 2 for k in prog.profile.kernels)
    terms = explain(prog.profile, DEV)
    assert any(t.get("runtime_index", 0) > 0 for t in (terms if isinstance(terms, list) else [terms]))
    without = dataclasses.replace(prog.profile, kernels=tuple(dataclasses.replace(k, runtime_divs=0)
                                                                for k in prog.profile.kernels))
    assert predict(prog.profile, DEV).time_us > predict(without, DEV).time_us
    # a static kernel has none (and its prediction has no such term)
    g = fit.graph
    static = lower(g, make_plan(g), s, DEV)
    assert all(k.runtime_divs == 0 for k in static.profile.kernels)
    assert runtime_divs(static.kernels[0], 3) == 0


def test_generic_profile_is_the_specialised_one_plus_index_arithmetic() -> None:
    fit, s, prog = _generic("layernorm_seq", 129, 256)
    prof = generic_profile(fit, s, DEV, prog, {"seq": 131})
    assert prof is not None
    g = fit.dgraph.at({"seq": 131})
    static = lower(g, make_plan(g), s, DEV).profile
    assert [k.grid for k in prof.kernels] == [k.grid for k in static.kernels]
    assert [k.dram_read_bytes for k in prof.kernels] == [k.dram_read_bytes for k in static.kernels]
    assert prof.kernels[0].runtime_divs > 0
    assert predict(prof, DEV).time_us >= predict(static, DEV).time_us


def test_script_prints_labelled_predictions() -> None:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert _script().main(["--examples", "layernorm_seq", "--extents", "17,1537"]) == 0
    text = out.getvalue()
    assert "PREDICTED" in text and "seq=1025..2048" in text and "predicted generic/specialised" in text
    assert "meas" not in text


def test_script_times_a_generic_program_with_its_extents(tmp_path: Path) -> None:
    """The --measure path over the fake driver: the generic program's launches get the extent as their
    last argument and the grid of that extent."""
    obj = json.loads((EXAMPLES_DIR / "dynamic" / "layernorm_seq.json").read_text())
    dg = parse_dynamic(obj)
    fit = fit_rows(dg, dg.key_of({"seq": 1500}))
    assert isinstance(fit, RowFit)
    prog = lower_dynamic(fit, heuristic_schedule(fit.plan, DEV), DEV)
    assert isinstance(prog, kir.Program) and prog.dynamic is not None
    drv = FakeDriver()
    ins = random_inputs(dg.at({"seq": 1100}), 0)
    t, outs = _script().time_program(drv, prog, b"FAKE cubin", ins, {"seq": 1100}, iters=3,
                                    warmup=1)
    assert t >= 0 and outs["y"].size == 2 * 1100 * 256
    assert len(drv.launches) == 4
    assert {ln.args[-1] for ln in drv.launches} == {1100}
    assert {ln.grid for ln in drv.launches} == {(prog.dynamic.grid(0, {"seq": 1100}), 1, 1)}
    assert prog.dynamic.grid(0, {"seq": 1100}) < prog.launches[0].grid
    assert np.isfinite(t)
