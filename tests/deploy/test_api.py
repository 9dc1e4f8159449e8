"""stitchtune.compile / CompiledGraph, `stitchtune compile`, and stitchtune.deploy.torch_entry.compile.

CPU tests use the emulator (and the fake CUDA driver for the launch path); the tests marked ``gpu`` run
the kernels through cuda-python (numpy arrays and torch tensors) and are skipped without a GPU.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from helpers.common import EXAMPLES_DIR
from helpers.lowering import emulator_kernels

import stitchtune
from stitchtune import cli
from stitchtune.deploy.compiled import CompiledGraph
from stitchtune.gpu.build import find_nvcc
from stitchtune.gpu.fake_driver import FakeDriver
from stitchtune.gpu.runner import cuda_available
from stitchtune.errors import ScheduleError, StitchtuneError, ToolchainError
from stitchtune.graph.reference import numpy_dtype, random_inputs, run_reference
from stitchtune.gpu.runners import check_outputs, output_dtypes
from stitchtune.deploy.selection import clear_cache

LN = EXAMPLES_DIR / "layernorm_small.json"


@pytest.fixture(autouse=True)
def _fresh() -> None:
    clear_cache()


def _has_nvcc() -> bool:
    try:
        find_nvcc()
    except ToolchainError:
        return False
    return True


@pytest.fixture(scope="module")
def cg() -> CompiledGraph:
    return stitchtune.compile(LN, db=None, device="h200", build=False)


def test_compile_exported_lazily() -> None:
    from stitchtune.deploy.compiled import compile as api_compile

    assert stitchtune.compile is api_compile


def test_manifest_describes_launches(cg: CompiledGraph) -> None:
    m = cg.manifest
    assert m["choice"]["source"] == "heuristic" and cg.source == "heuristic"
    assert m["workload_key"] == cg.graph.workload_key() and m["device_key"] == "NVIDIA H200/sm_90"
    assert m["schedule"] == cg.schedule.to_dict()
    assert [k["kernel"] for k in m["kernels"]] == [ln.kernel for ln in cg.program.launches]
    bufs = {b["name"]: b for b in m["buffers"]}
    for k, ln in zip(m["kernels"], cg.program.launches):
        assert k["grid"] == [ln.grid, 1, 1] and k["block"] == [ln.block, 1, 1]
        assert k["dynamic_smem_bytes"] == ln.smem_bytes
        assert [a["buffer"] for a in k["args"]] == list(ln.args)
        for a in k["args"]:
            assert a["dtype"] == bufs[a["buffer"]]["dtype"] and a["role"] == bufs[a["buffer"]]["role"]
            assert f'{a["param"]}' in cg.sources
    assert {b["tensor"] for b in m["buffers"] if b["role"] == "input"} == {"x", "gamma", "beta"}
    assert all(b["zero_init"] for b in m["buffers"] if b["role"] == "barrier")
    assert m["cubin"] is None and cg.cubin is None
    json.dumps(m)  # plain JSON data


def test_manifest_round_trip(cg: CompiledGraph, tmp_path: Path) -> None:
    paths = cg.write(tmp_path / "out")
    assert sorted(p.name for p in paths) == ["kernels.cu", "manifest.json"]
    back = CompiledGraph.load(tmp_path / "out")
    assert back.manifest == cg.manifest
    assert back.sources == cg.sources and back.program == cg.program and back.schedule == cg.schedule
    assert back.graph == cg.graph and back.device == cg.device and back.source == cg.source


def test_load_refuses_changed_source(cg: CompiledGraph, tmp_path: Path) -> None:
    cg.write(tmp_path)
    (tmp_path / "kernels.cu").write_text(cg.sources + "\n// edited\n")
    with pytest.raises(StitchtuneError, match="recompile"):
        CompiledGraph.load(tmp_path)
    (tmp_path / "manifest.json").write_text("[]")
    with pytest.raises(StitchtuneError, match="not a stitchtune manifest"):
        CompiledGraph.load(tmp_path)
    with pytest.raises(StitchtuneError, match="cannot read"):
        CompiledGraph.load(tmp_path / "missing")


def test_compile_refuses_a_misspelt_schedule_key(cg: CompiledGraph) -> None:
    """``stitchtune.compile(graph, schedule=dict)``: a key the space does not know is a ScheduleError naming it
    (it was ignored: the graph compiled with that field at its default)."""
    with pytest.raises(ScheduleError, match="unknown key 'vec4' \\(did you mean 'vec'\\?\\)"):
        stitchtune.compile(LN, db=None, device="h200", build=False, schedule={**cg.schedule.to_dict(), "vec4": 4})


def test_load_refuses_a_schedule_key_it_does_not_know(cg: CompiledGraph, tmp_path: Path) -> None:
    """A manifest whose schedule has a key today's space does not know is refused (not loaded as the schedule
    without it); written by another code generator version, the message says to recompile."""
    from stitchtune.lower.entry import CODEGEN_VERSION

    cg.write(tmp_path)
    m = json.loads((tmp_path / "manifest.json").read_text())
    m["schedule"]["unroll"] = 2
    (tmp_path / "manifest.json").write_text(json.dumps(m))
    with pytest.raises(StitchtuneError, match="not a stitchtune manifest .*unknown key 'unroll'"):
        CompiledGraph.load(tmp_path)
    m["codegen_version"] = f"{CODEGEN_VERSION}9"
    (tmp_path / "manifest.json").write_text(json.dumps(m))
    with pytest.raises(StitchtuneError, match="code generator version .*recompile it"):
        CompiledGraph.load(tmp_path)


def test_emulate_matches_reference_and_checks_inputs(cg: CompiledGraph) -> None:
    x = random_inputs(cg.graph, 3)
    out = cg.emulate(**x)
    assert out["y"].shape == (256, 1024)
    res = check_outputs(out, run_reference(cg.graph, x), output_dtypes(cg.graph))
    assert res.ok, res.error
    with pytest.raises(StitchtuneError) as e:
        cg.emulate(x=x["x"][:8], gamma=x["gamma"].astype(np.float64))
    assert len(e.value.problems) == 3  # x shape, gamma dtype, beta missing


def test_given_schedule(cg: CompiledGraph) -> None:
    given = stitchtune.compile(cg.graph, db=None, device="h200", schedule=cg.schedule.to_dict(), build=False)
    assert given.source == "given" and given.sources == cg.sources
    bad = {**cg.schedule.to_dict(), "block": 3}
    with pytest.raises(ScheduleError):
        stitchtune.compile(cg.graph, db=None, device="h200", schedule=bad, build=False)


@pytest.mark.skipif(not _has_nvcc(), reason="nvcc not found")
def test_cli_compile_writes_cubin(tmp_path: Path, capsys: Any) -> None:
    out = tmp_path / "k"
    assert cli.main(["compile", str(LN), "--db", str(tmp_path / "db"), "-o", str(out), "--device", "h200"]) == 0
    text = capsys.readouterr().out
    assert "(heuristic)" in text and "registers" in text
    assert (out / "kernels.cubin").stat().st_size > 0
    back = CompiledGraph.load(out)
    assert back.cubin == (out / "kernels.cubin").read_bytes()
    assert all(isinstance(k["registers"], int) for k in back.manifest["kernels"])


def test_cli_compile_errors(tmp_path: Path, capsys: Any) -> None:
    assert cli.main(["compile", str(tmp_path / "none.json"), "--no-cubin", "-o", str(tmp_path / "o")]) == 2
    assert cli.main(["compile", str(LN), "--no-cubin", "-o", str(tmp_path / "o"), "--schedule", "{}"]) == 2
    err = capsys.readouterr().err
    assert err.count("stitchtune: error:") >= 2 and "Traceback" not in err


def test_call_without_a_gpu_is_a_toolchain_error(cg: CompiledGraph) -> None:
    if cuda_available():
        pytest.skip("a GPU is here")
    built = CompiledGraph(cg.graph, cg.device, cg.choice, cg.program, cg.sources, cg.manifest, b"not a cubin")
    with pytest.raises(ToolchainError, match="cuda-python"):
        built(**random_inputs(cg.graph, 0))


class _DeviceArray:
    """A device array as torch/cupy expose it: ``__cuda_array_interface__`` over fake device memory."""

    def __init__(self, drv: FakeDriver, host: np.ndarray) -> None:
        self.ptr = drv.mem_alloc(host.nbytes)
        drv.memcpy_htod(self.ptr, host)
        typestr = "<u2" if host.dtype.name == "bfloat16" else host.dtype.str
        self.__cuda_array_interface__ = {"shape": host.shape, "typestr": typestr, "data": (self.ptr, False),
                                         "strides": None, "version": 3}


@pytest.mark.parametrize("name", ["layernorm_small", "colsum_sigmoid_scale_small", "layernorm_bf16_small"])
def test_call_through_the_launch_path_with_a_fake_driver(name: str) -> None:
    """``cg(**arrays)``: pointers, argument order, scratch/barrier init, dtypes, device-array inputs,
    against the fake driver whose kernels run in the emulator."""
    cg = stitchtune.compile(EXAMPLES_DIR / f"{name}.json", db=None, device="h200", build=False)
    drv = FakeDriver(kernels=emulator_kernels(cg.program))
    built = dataclasses.replace(cg, cubin=b"FAKE", _state={})
    built.device_runner(drv)
    x = random_inputs(cg.graph, 2)
    expected = run_reference(cg.graph, x)
    for _ in range(2):  # the second call reuses the scratch, staging buffers and packed arguments
        out = built(**x)
        res = check_outputs(out, expected, output_dtypes(cg.graph))
        assert res.ok, res.error
        assert {k: (v.shape, v.dtype) for k, v in out.items()} == {
            o: (cg.graph.spec(o).shape, numpy_dtype(cg.graph.spec(o).dtype)) for o in cg.graph.outputs}
        n_mem = len(drv.memory)
    assert len(drv.memory) == n_mem
    assert [ln.kernel for ln in drv.launches] == [ln.kernel for ln in cg.program.launches] * 2
    assert {ln.stream for ln in drv.launches} == {0}
    # a device array (anything exposing __cuda_array_interface__) is used in place
    first = cg.graph.inputs[0][0]
    dev_x = dict(x, **{first: _DeviceArray(drv, x[first])})
    assert check_outputs(built(**dev_x), expected, output_dtypes(cg.graph)).ok
    assert any(dev_x[first].ptr in ln.args for ln in drv.launches[-len(cg.program.launches):])
    with pytest.raises(StitchtuneError, match="not an input"):
        built(**x, bogus=np.zeros(1))
    bad = dict(x, **{first: _DeviceArray(drv, x[first].reshape(-1))})
    with pytest.raises(StitchtuneError, match="shape"):
        built(**bad)
    with pytest.raises(StitchtuneError, match="a numpy array or a device array"):
        built(**dict(x, **{first: [1.0]}))


def test_call_reports_a_driver_error_with_the_graph(cg: CompiledGraph) -> None:
    from stitchtune.gpu.driver import DriverError

    drv = FakeDriver()
    built = dataclasses.replace(cg, cubin=b"FAKE", _state={})
    built.device_runner(drv)
    drv.pending = "CUDA_ERROR_ILLEGAL_ADDRESS"
    with pytest.raises(DriverError, match=r"cuCtxSynchronize failed: CUDA_ERROR_ILLEGAL_ADDRESS \(running "):
        built(**random_inputs(cg.graph, 0))


# ---------------------------------------------------------------------------- GPU
@pytest.mark.gpu
@pytest.mark.skipif(not cuda_available(), reason="no CUDA GPU through cuda-python")
def test_gpu_call_matches_reference(small_examples: list[Path]) -> None:
    from stitchtune.gpu.device_query import query_device

    dev = query_device()  # the GPU itself, never a preset: a failing query fails the test
    assert dev.source == "cuda"
    for path in small_examples:
        g = stitchtune.compile(path, db=None, device=dev, build=True)
        x = random_inputs(g.graph, 1)
        out = g(**x)
        res = check_outputs(out, run_reference(g.graph, x), output_dtypes(g.graph))
        assert res.ok, f"{path.name}: {res.error}"
        again = g(**x)  # scratch state reusable across calls
        assert check_outputs(again, run_reference(g.graph, x), output_dtypes(g.graph)).ok, path.name
        torch = pytest.importorskip("torch")
        if all(s.dtype != "bfloat16" for _, s in g.graph.inputs):  # device arrays (torch tensors) in place
            on_gpu = {n: torch.from_numpy(a).cuda() for n, a in x.items()}
            res = check_outputs(g(**on_gpu), run_reference(g.graph, x), output_dtypes(g.graph))
            assert res.ok, f"{path.name} (torch tensors): {res.error}"


# ---------------------------------------------------------------------------- stitchtune.deploy.torch_entry
def _torch_examples() -> Any:
    spec = importlib.util.spec_from_file_location("stitchtune_test_api_torch_modules",
                                                  EXAMPLES_DIR / "torch_modules.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _example_tensors(shape_spec: str, dtype: Any = None, seed: int = 0) -> list[Any]:
    torch = pytest.importorskip("torch")
    from stitchtune.importers.builder import parse_shapes

    gen = torch.Generator().manual_seed(seed)
    out = [torch.randn(tuple(s), generator=gen) for s in parse_shapes(shape_spec).values()]
    return [t.to(dtype) for t in out] if dtype is not None else out


@pytest.mark.parametrize("name", [
    "layernorm", "rmsnorm", "softmax", "bias_gelu", "colsum_sigmoid_scale", "log_softmax_manual", "RMSNormBlock",
    "LayerNormGelu",
    # bf16 x with float32 gamma/beta: the vector width is bounded by the widest vectored operand
    "layernorm_bf16",
])
def test_torch_compile_emulate_matches_fn(name: str) -> None:
    torch = pytest.importorskip("torch")
    import stitchtune.deploy.torch_entry as st_torch

    tm = _torch_examples()
    fn = getattr(tm, name)
    fn = fn() if isinstance(fn, type) else fn
    bf16 = name == "layernorm_bf16"
    args = _example_tensors(tm.SMALL_SHAPES[name])
    if bf16:
        args[0] = args[0].to(torch.bfloat16)
    f = st_torch.compile(fn, db=None, example_inputs=args, device="h200", emulate=True)
    assert f.source == "heuristic"
    fresh = _example_tensors(tm.SMALL_SHAPES[name], seed=1)  # other values than the examples
    if bf16:
        fresh[0] = fresh[0].to(torch.bfloat16)
    with torch.no_grad():
        want = fn(*fresh)
    got = f(*fresh)
    assert isinstance(got, torch.Tensor) and got.dtype == want.dtype and got.shape == want.shape
    err = float((got.double() - want.double()).abs().max() / want.double().abs().max().clamp_min(1e-3))
    assert err < (1e-2 if bf16 else 1e-5), f"{name}: rel err {err}"


def test_torch_compile_refuses_tensors_it_cannot_take() -> None:
    torch = pytest.importorskip("torch")
    import stitchtune.deploy.torch_entry as st_torch

    tm = _torch_examples()
    x, g, b = _example_tensors(tm.SMALL_SHAPES["layernorm"])
    emu = st_torch.compile(tm.layernorm, db=None, example_inputs=(x, g, b), device="h200", emulate=True)
    with pytest.raises(st_torch.TensorRefused) as e:
        emu(x.double(), g[:5], b.clone().requires_grad_())
    msgs = e.value.problems
    assert len(msgs) == 3
    assert "dtype torch.float64, compiled for torch.float32" in msgs[0]
    assert "shape [5], compiled for [96]" in msgs[1]
    assert "requires grad" in msgs[2]
    with pytest.raises(st_torch.TensorRefused, match="expected 3 tensor arguments"):
        emu(x, g)
    with pytest.raises(st_torch.TensorRefused, match="a torch.Tensor is needed"):
        emu(x, g, b.numpy())
    with torch.no_grad():  # requires_grad is fine without autograd
        emu(x, g, b.clone().requires_grad_())
    gpu = st_torch.StitchedFunction(emu.compiled, emu.arg_names, emu.params, emulate=False)
    with pytest.raises(st_torch.TensorRefused, match=r"on cpu; the stitched kernels run on CUDA tensors"):
        gpu(x, g, b)
    with pytest.raises(StitchtuneError, match="example_inputs"):
        st_torch.compile(tm.layernorm, db=None, example_inputs=(), emulate=True)


def test_torch_compile_uses_tuned_record(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    import stitchtune.deploy.torch_entry as st_torch
    from stitchtune.tune.database import TuningDB
    from stitchtune.hardware.device import get_device
    from stitchtune.lower.entry import CODEGEN_VERSION
    from stitchtune.tune.pipeline import context_row, schedule_columns

    tm = _torch_examples()
    args = _example_tensors(tm.SMALL_SHAPES["softmax"])
    first = st_torch.compile(tm.softmax, db=None, example_inputs=args, device="h200", emulate=True)
    dev = get_device("h200")
    s = first.compiled.schedule
    TuningDB(tmp_path).append([{**context_row(first.graph, dev), **schedule_columns(s), "backend": "cuda",
                                "space_version": first.compiled.manifest["space_version"],
                                "codegen_version": CODEGEN_VERSION, "estimated": False, "status": "ok",
                                "measured_us": 2.0, "study": "t", "trial_number": 0}])
    again = st_torch.compile(tm.softmax, db=tmp_path, example_inputs=args, device="h200", emulate=True)
    assert again.source == "tuned" and again.compiled.schedule == s


@pytest.mark.gpu
@pytest.mark.skipif(not cuda_available(), reason="needs a CUDA GPU and cuda-python")
def test_gpu_torch_compile_matches_fn_without_host_copies() -> None:
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("torch sees no GPU")
    import stitchtune.deploy.torch_entry as st_torch

    tm = _torch_examples()
    for name in ("layernorm", "rmsnorm", "softmax", "bias_gelu", "colsum_sigmoid_scale", "RMSNormBlock"):
        fn = getattr(tm, name)
        fn = fn().cuda() if isinstance(fn, type) else fn
        args = [t.cuda() for t in _example_tensors(tm.SMALL_SHAPES[name])]
        f = st_torch.compile(fn, db=None, example_inputs=args)
        with torch.no_grad():
            want = fn(*args)
        got = f(*args)
        torch.cuda.synchronize()
        assert got.device == args[0].device
        err = float((got - want).abs().max() / want.abs().max().clamp_min(1e-3))
        assert err < 1e-5, f"{name}: rel err {err}"
        with pytest.raises(st_torch.TensorRefused, match="on cpu"):
            f(*[a.cpu() for a in args])


def test_compile_refuses_a_graph_larger_than_the_device_memory() -> None:
    import dataclasses

    from stitchtune.deploy.compiled import compile as st_compile
    from stitchtune.hardware.device import DeviceError, get_device
    from stitchtune.graph.parse import load_graph

    small_gpu = dataclasses.replace(get_device("h200"), memory_bytes=1 << 20)  # 1 MiB
    g = load_graph(Path(__file__).resolve().parents[2] / "examples" / "layernorm_small.json")
    with pytest.raises(DeviceError, match="does not fit in device memory"):
        st_compile(g, db=None, device=small_gpu)
