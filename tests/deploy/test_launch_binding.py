"""The deploy paths' use of the launch path over the in-package FakeDriver (the same paths over the real
cuda-python binding and a stub libcuda are in tests/gpu/test_stub_driver.py): the manifest's shared
memory, a replaced device runner closed, misaligned device arrays refused or copied, and torch_entry's
gather check on the launch stream."""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace as NS

import numpy as np
import pytest

import stitchtune
from helpers.common import EXAMPLES_DIR
from stitchtune.deploy.compiled import build_manifest
from stitchtune.errors import StitchtuneError
from stitchtune.gpu.fake_driver import FakeDriver
from stitchtune.graph.reference import random_inputs

LN = EXAMPLES_DIR / "layernorm_small.json"


@pytest.fixture(scope="module")
def cg():
    return stitchtune.compile(LN, db=None, device="h200", build=False)


def test_manifest_static_shared_memory_is_ptxas_not_the_dynamic_size(cg) -> None:
    m = build_manifest(cg.graph, cg.device, cg.choice, cg.program, "1", "1",
                       NS(registers={}, spill_bytes={}, smem_bytes={ln.kernel: 16 for ln in cg.program.launches},
                          cubin_path="k.cubin"))
    assert [k["static_smem_bytes"] for k in m["kernels"]] == [16] * len(cg.program.launches)
    assert [k["dynamic_smem_bytes"] for k in m["kernels"]] == [ln.smem_bytes for ln in cg.program.launches]
    assert all(k["static_smem_bytes"] is None for k in cg.manifest["kernels"])   # not built: unknown


def test_a_replaced_device_runner_is_closed(cg) -> None:
    first, second = FakeDriver(), FakeDriver()
    built = dataclasses.replace(cg, cubin=b"FAKE", _state={})
    built.device_runner(first)
    built(**random_inputs(cg.graph, 0))
    assert first.memory
    built.device_runner(second)
    assert not first.memory and ("unload_module",) in first.calls    # nothing of the first one leaks
    assert first.active == 0 and second.active == 0


def test_a_misaligned_device_array_is_refused_with_one_line_per_input(cg) -> None:
    drv = FakeDriver()
    built = dataclasses.replace(cg, cubin=b"FAKE", _state={})
    built.device_runner(drv)
    x = random_inputs(cg.graph, 0)
    first = cg.graph.inputs[0][0]
    ptr = drv.mem_alloc(x[first].nbytes + 4) + 4
    arr = NS(__cuda_array_interface__={"shape": x[first].shape, "typestr": "<f4", "data": (ptr, False),
                                       "version": 3})
    n = len(drv.launches)
    with pytest.raises(StitchtuneError, match=rf"input '{first}': device pointer 0x[0-9a-f]+ is not 16-byte aligned"):
        built(**dict(x, **{first: arr}))
    assert len(drv.launches) == n                    # nothing was launched


def test_torch_entry_reads_the_gather_flag_and_resets_it_on_the_launch_stream() -> None:
    torch = pytest.importorskip("torch")
    from stitchtune.deploy.torch_entry import StitchedFunction
    from stitchtune.gpu.launch import Launcher, launch_plan
    from stitchtune.lower.gather import gather_flag_buffers

    cg = stitchtune.compile(EXAMPLES_DIR / "embed_gather_layernorm_small.json", db=None, device="h200", build=False)
    [flag] = gather_flag_buffers(cg.program)
    sf = StitchedFunction(cg, tuple(n for n, _ in cg.graph.inputs), ())
    drv = FakeDriver()
    lau = Launcher(drv, launch_plan(cg.program), b"FAKE", stream=0x77)
    tensors = {}
    for n, spec in cg.graph.inputs:
        size = int(np.prod(spec.shape))
        tensors[n] = torch.zeros(size + 1, dtype=torch.int32 if "int" in spec.dtype else torch.float32)[1:]
    for o in cg.graph.outputs:
        tensors[o] = torch.empty(int(np.prod(cg.graph.spec(o).shape)))
    assert all(t.data_ptr() % 16 for n, t in tensors.items() if n not in cg.graph.outputs)   # offset views
    sf.launch_tensors(lau, {}, tensors, 0x77)
    assert all(a % 16 == 0 for ln in drv.launches for a in ln.args)   # they were copied
    drv.buffer(lau.scratch[flag])[:4] = np.frombuffer(np.float32(1.0).tobytes(), np.uint8)
    before = len(drv.calls)
    with pytest.raises(StitchtuneError, match="index out of range"):
        sf.launch_tensors(lau, {}, tensors, 0x77)
    [reset] = [c for c in drv.calls[before:] if c[0] == "memset_d8" and c[1] == lau.scratch[flag]]
    assert reset[2:4] == (0, 4)
    assert reset[4] == 0x77
