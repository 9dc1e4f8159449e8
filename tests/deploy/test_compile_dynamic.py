"""Graphs with dynamic dims end to end: `stitchtune compile` writes every bucket, `run` takes any extent in
range (emulated, equal to the reference), `search --dynamic` -> `compile` uses the tuned records, and the
Python API (`stitchtune.compile(path)` -> DynamicCompiledGraph; write / load)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import stitchtune
from helpers.common import EXAMPLES_DIR
from helpers.lowering import DEV
from stitchtune import cli
from stitchtune.deploy.compiled_dynamic import DynamicCompiledGraph, RefusedBucket, compile_buckets
from stitchtune.deploy.dynamic import CompiledBucket
from stitchtune.errors import GraphError, StitchtuneError
from stitchtune.graph.dynamic import parse_dynamic
from stitchtune.graph.reference import random_inputs, run_reference

EXAMPLES = sorted(p.stem for p in (EXAMPLES_DIR / "dynamic").glob("*.json"))
HI = 48                    # each example's seq bound, cut from 2048 so the emulator runs in a second
EXTENTS = (1, 29, HI)      # the smallest, an odd one, the largest


def small(name: str, tmp_path: Path, hi: int = HI) -> Path:
    obj = json.loads((EXAMPLES_DIR / "dynamic" / f"{name}.json").read_text())
    obj["dynamic"]["seq"] = {"min": 1, "max": hi}
    p = tmp_path / f"{name}.json"
    p.write_text(json.dumps(obj))
    return p


def _cli(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    rc = cli.main(argv)
    out, err = capsys.readouterr()
    return rc, out, err


def _close(got: dict[str, Any], ref: dict[str, Any]) -> None:
    assert set(got) == set(ref)
    for k in ref:
        assert got[k].shape == ref[k].shape
        assert np.allclose(got[k].astype(np.float64), ref[k], rtol=1e-4, atol=1e-5), k


def test_examples_are_all_covered() -> None:
    assert len(EXAMPLES) >= 7 and "layernorm_seq" in EXAMPLES


@pytest.mark.parametrize("name", EXAMPLES)
def test_compile_writes_every_bucket_and_run_equals_the_reference(name: str, tmp_path: Path,
                                                                  capsys: pytest.CaptureFixture[str],
                                                                  caplog: pytest.LogCaptureFixture) -> None:
    g = small(name, tmp_path)
    out = tmp_path / "out"
    db = str(tmp_path / "db")
    rc, so, se = _cli(["compile", str(g), "--no-cubin", "-o", str(out), "--db", db, "--device", "h200"], capsys)
    assert rc == 0, se
    m = json.loads((out / "manifest.json").read_text())
    assert m["kind"] == "dynamic" and m["dims"][0]["name"] == "seq" and m["dims"][0]["max"] == HI
    labels = [b["label"] for b in m["buckets"]]
    assert labels[0] == "seq=1..1" and labels[-1] == f"seq=33..{HI}" and len(labels) == len(m["dims"][0]["buckets"])
    assert m["extent_args"]["args"] == [{"param": "ext0", "dim": "seq"}]
    for b in m["buckets"]:
        if b["generic"]:
            src = (out / b["dir"] / "kernels.cu").read_text()
            assert "const int ext0" in src and b["choice"]["source"] == "heuristic"
            assert all(k["args"][-1] == {"param": "ext0", "dim": "seq", "dtype": "int32", "role": "extent"}
                       for k in b["kernels"])
            assert f"  {b['label']}: schedule {b['schedule_key']} (heuristic)" in so
        else:
            assert b["refusal"] and f"  {b['label']}: no generic kernel" in so
    assert "0 of" in so and "search --dynamic seq=1.." in so          # the buckets left to the heuristic, said once
    assert len([r for r in caplog.records if r.levelname == "WARNING"]) == 1    # one summary, not one per bucket
    dg = parse_dynamic(json.loads(g.read_text()))
    for e in EXTENTS:
        res = tmp_path / f"y{e}.npz"
        rc, so, se = _cli(["run", str(g), "--backend", "emulate", "--random-inputs", str(e), "--dynamic", f"seq={e}",
                           "-o", str(res), "--db", db, "--device", "h200"], capsys)
        if name == "attention_softmax_seq" and e == 1:
            # softmax over one key: no plan for a row of one yet (issue 41 item 1); one line naming the bucket
            if rc == 2:
                lines = se.strip().splitlines()
                assert len(lines) == 1 and "at seq=1: reduction 'm'" in lines[0] and "error:" in lines[0], se
                assert "bucket seq=1..1: no generic kernel" in so
                continue
        assert rc == 0, se
        assert f"extents seq={e}: bucket seq=" in so
        ge = dg.at({"seq": e})
        with np.load(res) as z:
            got = {k: z[k] for k in z.files}
        _close(got, run_reference(ge, random_inputs(ge, e)))


def test_run_reads_the_extents_from_the_inputs(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    g = small("embed_add_layernorm_seq", tmp_path)
    dg = parse_dynamic(json.loads(g.read_text()))
    ge = dg.at({"seq": 23})
    ins = random_inputs(ge, 5)
    np.savez(tmp_path / "in.npz", **ins)
    rc, so, se = _cli(["run", str(g), "--backend", "emulate", "--inputs", str(tmp_path / "in.npz"),
                       "-o", str(tmp_path / "y.npz"), "--db", str(tmp_path / "db"), "--device", "h200"], capsys)
    assert rc == 0, se
    assert "extents seq=23: bucket seq=17..32" in so
    with np.load(tmp_path / "y.npz") as z:
        _close({k: z[k] for k in z.files}, run_reference(ge, ins))
    # the reference backend at the same extents
    rc, so, se = _cli(["run", str(g), "--inputs", str(tmp_path / "in.npz"), "-o", str(tmp_path / "r.npz")], capsys)
    assert rc == 0 and "bucket seq=17..32" in so, se


def test_search_then_compile_and_run_use_each_buckets_record(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                              caplog: pytest.LogCaptureFixture) -> None:
    path = small("layernorm_seq", tmp_path)
    obj = json.loads(path.read_text())
    obj["dynamic"]["seq"]["buckets"] = [16, 48]    # the graph declares the buckets search tunes: all agree
    path.write_text(json.dumps(obj))
    g, db = str(path), str(tmp_path / "db")
    rc, so, se = _cli(["search", g, "--dynamic", "seq=1..48:16,48", "--trials", "2", "--db", db, "--backend",
                       "emulate", "--no-build", "--jobs", "1", "--no-progress", "--device", "h200", "--seed", "1"], capsys)
    assert rc == 0, se
    caplog.clear()
    rc, so, se = _cli(["compile", g, "--no-cubin", "-o", str(tmp_path / "c"), "--db", db, "--device", "h200"], capsys)
    assert rc == 0, se
    assert "seq=1..16: schedule" in so and "seq=17..48: schedule" in so and so.count("(tuned)") == 2
    assert "2 of 2 bucket(s) tuned\n" in so and not [r for r in caplog.records if r.levelname == "WARNING"]
    m = json.loads((tmp_path / "c" / "manifest.json").read_text())
    assert [b["choice"]["source"] for b in m["buckets"]] == ["tuned", "tuned"]
    # other buckets (power-of-two): those without a record are said to fall back, in one line each
    rc, so, se = _cli(["compile", g, "--dynamic", "seq=1..48", "--no-cubin", "-o", str(tmp_path / "c2"), "--db", db,
                       "--device", "h200"], capsys)
    assert rc == 0 and "seq=2..2: schedule" in so and "(heuristic)" in so and "without a record of their bucket" in so
    rc, so, se = _cli(["run", g, "--backend", "emulate", "--random-inputs", "0", "--dynamic", "seq=17",
                       "-o", str(tmp_path / "y.npz"), "--db", db, "--device", "h200"], capsys)
    assert rc == 0 and "(tuned:" in so, se


# ---------------------------------------------------------------------------- the Python API
def test_stitchtune_compile_of_a_dynamic_file_runs_at_any_extent_and_round_trips(tmp_path: Path) -> None:
    g = small("softmax_seq", tmp_path, hi=40)
    cg = stitchtune.compile(g, db=None, device=DEV, build=False)
    assert isinstance(cg, DynamicCompiledGraph)
    assert [b.key.label() for b in cg.buckets][-1] == "seq=33..40" and "softmax_seq" in repr(cg)
    dg = cg.dgraph
    for e in (1, 17, 40):
        ge = dg.at({"seq": e})
        ins = random_inputs(ge, e)
        _close(cg.emulate(**ins), run_reference(ge, ins))
    with pytest.raises(GraphError, match="outside 1..40"):
        cg.emulate(**random_inputs(dg.at_unchecked({"seq": 41}), 0))
    (tmp_path / "f").write_text("mine")
    with pytest.raises(StitchtuneError, match="is a file, not a directory"):
        cg.write(tmp_path / "f")
    paths = cg.write(tmp_path / "c")
    assert (tmp_path / "c" / "seq-33-40" / "kernels.cu") in paths
    back = DynamicCompiledGraph.load(tmp_path / "c")
    assert [b.key for b in back.buckets] == [b.key for b in cg.buckets]
    ge = dg.at({"seq": 35})
    ins = random_inputs(ge, 2)
    _close(back.emulate(**ins), run_reference(ge, ins))
    # a source this stitchtune would not generate: refused
    k = tmp_path / "c" / "seq-33-40" / "kernels.cu"
    k.write_text(k.read_text() + "// edited\n")
    with pytest.raises(StitchtuneError, match="recompile"):
        DynamicCompiledGraph.load(tmp_path / "c")
    # a bucket's schedule with a key this stitchtune's space does not know: refused, naming the manifest and bucket
    m = json.loads((tmp_path / "c" / "manifest.json").read_text())
    m["buckets"][-1]["schedule"]["unroll"] = 2
    (tmp_path / "c" / "manifest.json").write_text(json.dumps(m))
    with pytest.raises(StitchtuneError, match=r"not a stitchtune manifest \(bucket seq=33\.\.40: .*unknown key 'unroll'"):
        DynamicCompiledGraph.load(tmp_path / "c")
    del m["buckets"][-1]["schedule"]   # a generic bucket without its schedule: the same line, not a KeyError
    (tmp_path / "c" / "manifest.json").write_text(json.dumps(m))
    with pytest.raises(StitchtuneError, match=r"not a stitchtune manifest \(bucket seq=33\.\.40: no schedule\)"):
        DynamicCompiledGraph.load(tmp_path / "c")
    # a dict with "dynamic" is a dynamic graph too
    assert isinstance(stitchtune.compile(json.loads(g.read_text()), db=None, device=DEV, build=False),
                      DynamicCompiledGraph)


def test_a_built_bucket_lists_its_registers_and_the_static_loader_points_to_the_dynamic_one(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from stitchtune.deploy.compiled import CompiledGraph
    from stitchtune.gpu.build import nvcc_found

    dg = parse_dynamic(json.loads(small("layernorm_seq", tmp_path).read_text()))
    build = nvcc_found()
    cg = compile_buckets(dg, db=None, device=DEV, keys=[dg.key_of({"seq": 20})], build=build)
    [k] = cg.manifest["buckets"][0]["kernels"]
    if build:
        assert isinstance(k["registers"], int) and k["registers"] > 0
        assert cg.manifest["buckets"][0]["cubin"] == "seq-17-32/kernels.cubin"
    else:
        assert k["registers"] is None
    cg.write(tmp_path / "c")
    with pytest.raises(StitchtuneError, match="DynamicCompiledGraph.load reads it"):
        CompiledGraph.load(tmp_path / "c")
    back = DynamicCompiledGraph.load(tmp_path / "c")
    assert (back.buckets[0].cubin is not None) == build
    # the static loader's limits hold here too (deploy/manifest_io.py): an oversized manifest is not parsed
    from stitchtune.deploy import manifest_io
    monkeypatch.setattr(manifest_io, "MAX_MANIFEST_BYTES", 100)
    with pytest.raises(StitchtuneError, match="manifest.json is too large"):
        DynamicCompiledGraph.load(tmp_path / "c")


def test_a_device_call_runs_its_buckets_kernel_with_the_extent_and_the_grid_of_its_rule(tmp_path: Path) -> None:
    """cg(**arrays) over the in-package FakeDriver: the call's bucket is launched (no rebuild), its last kernel
    argument is the extent, its grid the manifest's rule at that extent, and the outputs are shaped for it."""
    from stitchtune.deploy.compiled import DeviceRun
    from stitchtune.gpu.fake_driver import FakeDriver

    dg = parse_dynamic(json.loads(small("layernorm_seq", tmp_path).read_text()))
    cg = compile_buckets(dg, db=None, device=DEV, build=False)
    drv = FakeDriver()
    for b in cg.buckets:
        assert not isinstance(b, RefusedBucket)
        b._state["run"] = DeviceRun(b.program, b"FAKE", drv)
    for e in (1, 29, HI):
        n = len(drv.launches)
        out = cg(**random_inputs(dg.at({"seq": e}), e))
        assert out["y"].shape == (2, e, 256)
        [ln] = drv.launches[n:]
        b = cg.bucket_for({"seq": e})
        assert isinstance(b, CompiledBucket)
        assert ln.args[-1] == e and ln.grid[0] == b.program.dynamic.grid(0, {"seq": e})
    assert len({ln.grid[0] for ln in drv.launches}) == 3        # 1, 2 and 3 blocks: the grid follows the extent


def test_a_bucket_the_generic_kernel_refuses_is_compiled_per_extent() -> None:
    obj: dict[str, Any] = {"name": "cs", "dynamic": {"seq": {"min": 1, "max": 64}},
                           "inputs": {"x": {"shape": ["seq", 64], "dtype": "float32"}},
                           "nodes": [{"id": "c", "op": "reduce_sum", "args": ["x"], "axes": [0], "keepdims": True}],
                           "outputs": ["c"]}
    dg = parse_dynamic(obj)
    cg = compile_buckets(dg, db=None, device=DEV, keys=[dg.key_of({"seq": 40})], build=False)
    [b] = cg.buckets
    assert isinstance(b, RefusedBucket) and b.refusal.part == "family col"
    assert cg.manifest["buckets"][0]["generic"] is False and "family col" in cg.manifest["buckets"][0]["refusal"]
    ge = dg.at({"seq": 40})
    ins = random_inputs(ge, 1)
    _close(cg.emulate(**ins), run_reference(ge, ins))
    with pytest.raises(GraphError, match="was not compiled"):
        cg.emulate(**random_inputs(dg.at({"seq": 3}), 0))
