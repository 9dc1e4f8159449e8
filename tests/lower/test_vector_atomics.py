"""Vector float atomics for embedding gradients (issue 39): ``atomicAdd`` of ``float4`` where the device has it.

An embedding's gradient (``scatter_add`` of a row's values into a table row) added one 32-bit atomic
per element: each lane's four adds ``vec`` elements from the next lane's, 4x the ideal sectors per
warp request. A device whose description says it adds float32 vectors atomically on global memory
(``Device.atomic_vector_width``: 4 on cc 9.x) gets one ``float4`` add per vector whose elements lie in
one table row; other devices (and rows that are not whole vectors) keep the scalar adds. The tables
equal the float64 reference either way; the zero fill stores 16 bytes at a time where the table allows.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest

from helpers.lowering import check_emulates, emulated_errors
from stitchtune.analysis.sectors import program_sectors
from stitchtune.cost.heuristic import heuristic_schedule
from stitchtune.gpu.build import nvcc_found
from stitchtune.gpu.render import render
from stitchtune.graph.parse import parse_graph
from stitchtune.graph.reference import random_inputs, run_reference
from stitchtune.hardware.device import Device, device_from_attributes, get_device
from stitchtune.ir import kir
from stitchtune.ir.verify import check
from stitchtune.lower.entry import lower
from stitchtune.plan.planner import make_plan
from stitchtune.space import SearchSpace

H200 = get_device("H200")


def embedding_grad(tokens: int = 64, width: int = 32, vocab: int = 10, dtype: str = "float32") -> Any:
    """``dw = scatter_add(where(ids valid, dy, 0), ids)`` of ``dy [tokens, width]`` into ``[vocab, width]``."""
    return parse_graph({
        "name": "emb_grad",
        "inputs": {"dy": {"shape": [tokens, width], "dtype": dtype}, "ids": {"shape": [tokens], "dtype": "int64"}},
        "nodes": [{"id": "g", "op": "mul", "args": ["dy", 2.0]},
                  {"id": "dw", "op": "scatter_add", "args": ["g", "ids"], "shape": [vocab, width]}],
        "outputs": ["dw"]})


def _program(g: Any, dev: Device) -> Any:
    plan = make_plan(g)
    space = SearchSpace.for_plan(plan, dev)
    return lower(g, plan, heuristic_schedule(plan, dev, space), dev, space)


def _atomics(prog: Any) -> list[kir.AtomicAdd]:
    return [s for k in prog.kernels for s in kir.walk(k.body) if isinstance(s, kir.AtomicAdd)
            and s.buf.startswith("sct")]


def test_the_device_description_says_which_devices_add_vectors() -> None:
    assert H200.atomic_vector_width == 4 and get_device("H100").atomic_vector_width == 4
    assert get_device("A100").atomic_vector_width == 1
    assert device_from_attributes("x", {"COMPUTE_CAPABILITY_MAJOR": 9, "COMPUTE_CAPABILITY_MINOR": 0}
                                  ).atomic_vector_width == 4
    assert device_from_attributes("x", {"COMPUTE_CAPABILITY_MAJOR": 8, "COMPUTE_CAPABILITY_MINOR": 0}
                                  ).atomic_vector_width == 1
    d = H200.to_dict()
    assert Device.from_dict(d) == H200
    del d["atomic_vector_width"]   # a description written before the field: scalar adds
    assert Device.from_dict(d).atomic_vector_width == 1


def test_float4_adds_at_the_ideal_sectors_on_sm90() -> None:
    g = embedding_grad(tokens=512, width=64)
    prog = _program(g, H200)
    adds = _atomics(prog)
    assert adds and all(a.width == 4 for a in adds)
    assert "st_red(sct0 + " in render(prog)   # a float4 PTX reduction (gpu/render_atomics.py)
    sl = program_sectors(prog, random_inputs(g, 0), 4)
    acc = [a for s in sl for a in s.accesses if a.op == "atomic"]
    assert acc and all(a.width == 4 and a.sectors == a.ideal for a in acc), acc  # scalar adds: 4.00x
    fills = [a for s in sl for a in s.accesses if a.buf == "sct0" and a.op == "store"]
    assert all(a.width == 4 for a in fills), fills


def test_a_device_without_vector_atomics_keeps_scalar_adds() -> None:
    old = dataclasses.replace(H200, atomic_vector_width=1)
    adds = _atomics(_program(embedding_grad(tokens=512, width=64), old))
    assert adds and all(a.width == 1 for a in adds)


@pytest.mark.parametrize("tokens,width", [(64, 32), (7, 6), (9, 5), (33, 12)])
def test_embedding_gradient_emulates_like_the_reference(tokens: int, width: int) -> None:
    """Rows of whole vectors (float4 / float2 adds) and odd rows (scalar adds), sampled schedules too;
    out-of-range indices add nothing (random_inputs draws ids across the table and beyond)."""
    check_emulates(embedding_grad(tokens, width), n_samples=4)


def test_vector_adds_only_to_float32_tables() -> None:
    g = embedding_grad(tokens=64, width=32, dtype="bfloat16")
    assert all(a.width == 1 for a in _atomics(_program(g, H200)))
    prog = _program(embedding_grad(tokens=512, width=64), H200)   # float4 adds; the table made float16
    half = dataclasses.replace(prog, kernels=tuple(dataclasses.replace(k, params=tuple(
        dataclasses.replace(q, dtype="float16") if q.name == "sct0" else q for q in k.params)) for k in prog.kernels),
        buffers=tuple(dataclasses.replace(b, dtype="float16") if b.name == "sct0" else b for b in prog.buffers))
    assert not check(prog)
    assert any("vector atomic add" in str(d) for d in check(half))


@pytest.mark.skipif(not nvcc_found(), reason="nvcc not found")
def test_float4_atomics_build_for_sm90(tmp_path: Path) -> None:
    from helpers.nvcc import check_compiles_sm90

    check_compiles_sm90(embedding_grad(tokens=512, width=64), 0, tmp_path)


def test_atomics_are_counted_per_instruction_in_the_profile_and_the_ir_walk() -> None:
    """``KernelProfile.atomics`` and the IR walk's ``atomics`` feature count atomic instructions: a float4
    add once, so the scalar program counts four times the vector one's, in both."""
    from stitchtune.cost.features import program_features

    g = embedding_grad(tokens=512, width=64)
    scalar_dev = dataclasses.replace(H200, atomic_vector_width=1)
    vec, scalar = _program(g, H200), _program(g, scalar_dev)
    (kv,) = [k for k in vec.profile.kernels if k.atomics]
    (ks,) = [k for k in scalar.profile.kernels if k.atomics]
    assert kv.atomics == kv.grid * kv.block and ks.atomics == 4 * kv.atomics
    fv = [f.atomics for f in program_features(vec, H200) if f.atomics]
    fs = [f.atomics for f in program_features(scalar, scalar_dev) if f.atomics]
    assert fv == [1.0] and fs == [4.0]   # per thread: one float4 add, four scalar adds
