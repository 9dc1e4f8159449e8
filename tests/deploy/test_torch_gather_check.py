"""Out-of-range gather indices in the torch paths (issue 17: "a defined result and a flagged error"):
the custom op ``stitchtune::region`` raises a RegionError naming the gather on every path -- the
emulator, the float64 reference, and the launch path, where the kernels' error flag is read back
through the driver (here the fake driver running the emulator on its memory)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from helpers.lowering import emulator_kernels  # noqa: E402

from stitchtune.deploy.compiled import compile as compile_graph  # noqa: E402
from stitchtune.deploy.torch_ops import RegionError, RegionKernel  # noqa: E402

ROWS, V, H = 6, 10, 16


def _embed_ln(ids, table, pos):
    x = torch.nn.functional.embedding(ids, table) + pos
    return torch.nn.functional.layer_norm(x, (H,))


@pytest.fixture(scope="module")
def region():
    from torch.fx.experimental.proxy_tensor import make_fx

    from stitchtune.importers.torch_regions import find_regions

    gm = make_fx(_embed_ln, tracing_mode="fake")(torch.zeros(ROWS, dtype=torch.long), torch.randn(V, H),
                                                 torch.randn(ROWS, H))
    [r] = find_regions(gm).regions
    assert any(n.op == "gather" for n in r.graph.nodes), [n.op for n in r.graph.nodes]
    order = [n.name for n in gm.graph.nodes if n.op == "placeholder"]
    return r, [order.index(n.name) for n in r.inputs]   # region input j is the function's argument order[j]


def _args(bad: int | None):
    g = torch.Generator().manual_seed(3)
    ids = torch.randint(0, V, (ROWS,), generator=g)
    if bad is not None:
        ids[2] = bad
    return [ids, torch.randn(V, H, generator=g), torch.randn(ROWS, H, generator=g)]


@pytest.mark.parametrize("cpu", ["emulate", "reference"])
@pytest.mark.parametrize("bad", [-1, V, 2**31 - 1])
def test_cpu_paths_raise_naming_the_gather(region, cpu: str, bad: int) -> None:
    region, order = region
    cg = compile_graph(region.graph, db=None, device="h200", build=False)
    k = RegionKernel(region.name, region.ops, cg, cpu=cpu)
    [good] = k([_args(None)[i] for i in order])
    assert torch.allclose(good, _embed_ln(*_args(None)), atol=1e-5)
    with pytest.raises(RegionError, match=r"gather '[^']+': index out of range"):
        k([_args(bad)[i] for i in order])


def _launch(region, ids: np.ndarray, check: bool):
    """(kernel over a fake driver whose kernels run the emulator on its memory, the driver, the
    pointers: region inputs then the output, the ids' pointer)."""
    from stitchtune.gpu.fake_driver import FakeDriver

    region, order = region

    cg = compile_graph(region.graph, db=None, device="h200", build=False)
    drv = FakeDriver(kernels=emulator_kernels(cg.program))
    k = RegionKernel(region.name, region.ops, dataclasses.replace(cg, cubin=b"FAKE"), driver=drv, check_gather=check)
    rng = np.random.default_rng(0)
    arrays = [ids.astype(np.int64), rng.standard_normal((V, H)).astype(np.float32),
              rng.standard_normal((ROWS, H)).astype(np.float32)]
    ptrs = []
    for i in order:
        ptrs.append(drv.mem_alloc(arrays[i].nbytes))
        drv.buffer(ptrs[-1])[:arrays[i].nbytes] = arrays[i].view(np.uint8).ravel()
    out = drv.mem_alloc(ROWS * H * 4)
    return k, drv, (*ptrs, out), ptrs[order.index(0)]


def _stalls(drv) -> list:
    """The calls that stall the host or copy device memory to it."""
    return [c for c in drv.calls if c[0] in ("synchronize", "event_synchronize", "memcpy_dtoh")]


def _set_ids(drv, ids_ptr, ids) -> None:
    drv.buffer(ids_ptr)[:ids.nbytes] = ids.astype(np.int64).view(np.uint8)


def test_launch_path_reports_a_bad_index_at_the_next_call_without_stalling(region) -> None:
    ids = np.arange(ROWS) % V
    k, drv, ptrs, ids_ptr = _launch(region, ids, check=True)
    k.launch_pointers(-1, ptrs, stream=0)                      # good indices: no error
    bad = ids.copy()
    bad[1] = V + 3
    _set_ids(drv, ids_ptr, bad)
    k.launch_pointers(-1, ptrs, stream=0)                      # the kernels set the flag; nothing waits for it
    out = drv.buffer(ptrs[-1])[:ROWS * H * 4].view(np.float32).reshape(ROWS, H)
    assert np.isfinite(out).all()                              # a defined result (LayerNorm of the zero row + pos)
    _set_ids(drv, ids_ptr, ids)
    with pytest.raises(Exception, match=r"gather '[^']+' reading region input \d \('in\d', int64 \[6\]\): "
                                        r"index out of range.*at its next call"):
        k.launch_pointers(-1, ptrs, stream=0)                  # the next call raises, naming region and input
    k.launch_pointers(-1, ptrs, stream=0)                      # the flag was zeroed: no stale error
    assert _stalls(drv) == []                                  # no synchronisation, no device-to-host copy
    assert ("host_alloc_mapped", 4) in drv.calls               # the flag lives in mapped host memory


def test_check_all_reports_the_last_calls_flag(region) -> None:
    from stitchtune.deploy import torch_flags

    bad = np.arange(ROWS) % V
    bad[3] = -1
    k, drv, ptrs, _ = _launch(region, bad, check=True)
    k.launch_pointers(-1, ptrs, stream=0)
    with pytest.raises(Exception, match=r"stitched region region_embedding .*index out of range.*check_errors"):
        torch_flags.check_all()
    torch_flags.check_all()                                    # zeroed


def test_check_gather_sync_raises_at_the_call_itself(region) -> None:
    bad = np.arange(ROWS) % V
    bad[0] = V
    k, drv, ptrs, _ = _launch(region, bad, check="sync")
    with pytest.raises(Exception, match=r"index out of range.*right after its launch"):
        k.launch_pointers(-1, ptrs, stream=0)
    assert ("synchronize",) in drv.calls and not [c for c in drv.calls if c[0] == "memcpy_dtoh"]


def test_check_gather_false_never_reads_the_flag(region) -> None:
    bad = np.arange(ROWS) % V
    bad[0] = -5
    k, drv, ptrs, _ = _launch(region, bad, check=False)
    k.launch_pointers(-1, ptrs, stream=0)
    k.launch_pointers(-1, ptrs, stream=0)
    assert _stalls(drv) == [] and not [c for c in drv.calls if c[0] == "host_alloc_mapped"]


def test_backend_option_is_validated() -> None:
    from stitchtune.deploy.torch_backend import BackendOptions
    from stitchtune.errors import StitchtuneError

    assert BackendOptions.from_options({"check_gather": False}).check_gather is False
    assert BackendOptions.from_options({"check_gather": "sync"}).check_gather == "sync"
    with pytest.raises(StitchtuneError, match="check_gather"):
        BackendOptions.from_options({"check_gather": "yes"})

