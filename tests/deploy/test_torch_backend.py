"""torch.compile(backend="stitchtune"): partitioning, the custom op on CPU (emulator / reference), the
CUDA launch path against the fake driver, declines, explain, and small transformers blocks."""

from __future__ import annotations

import dataclasses
import logging
import operator
import tomllib
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")

from stitchtune.deploy import torch_backend, torch_region_compile, torch_rest  # noqa: E402
from stitchtune.errors import StitchtuneError  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True)
def _reset() -> Any:
    torch_backend.register()
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


class Block(torch.nn.Module):
    """LayerNorm -> Linear -> GELU -> residual softmax: two memory-intensive regions around a matmul."""

    def __init__(self, h: int = 16) -> None:
        super().__init__()
        self.ln = torch.nn.LayerNorm(h)
        self.fc = torch.nn.Linear(h, h)

    def forward(self, x: Any) -> Any:
        y = self.fc(self.ln(x * 2.0 + 1.0))
        return torch.nn.functional.gelu(y).softmax(-1) * 3.0


def _compile(model: Any, **options: Any) -> Any:
    return torch.compile(model, backend="stitchtune", options={"db": None, **options})


def _refuse(monkeypatch: pytest.MonkeyPatch, owner: Any, attr: str, message: str) -> None:
    """Make ``owner.attr`` raise ``RuntimeError(message)`` for the test."""
    def refuse(*a: Any, **k: Any) -> Any:
        raise RuntimeError(message)

    monkeypatch.setattr(owner, attr, refuse)


def _stitched() -> int:
    return sum(len(r.stitched) for r in torch_backend.LAST_REPORTS)


@pytest.mark.parametrize("cpu,fallback", [("emulate", "eager"), ("reference", "inductor")])
def test_block_matches_eager(cpu: str, fallback: str) -> None:
    torch.manual_seed(0)
    m, x = Block().eval(), torch.randn(2, 4, 16)
    torch_backend.LAST_REPORTS.clear()
    with torch.no_grad():
        got = _compile(m, cpu=cpu, fallback=fallback)(x)
        want = m(x)
    assert torch.allclose(got, want, atol=1e-5, rtol=1e-5)
    assert _stitched() == 2


def test_explain_lists_stitched_regions_and_declines_and_prints_a_table() -> None:
    torch.manual_seed(0)
    e = torch_backend.explain(Block().eval(), torch.randn(2, 4, 16), db=None, fallback="eager")
    assert len(e.stitched) == 2
    ln = e.stitched[0]
    assert "aten.native_layer_norm" in ln.ops and ln.dtype == "float32" and ln.source == "heuristic"
    assert (2, 4, 16) in ln.shapes
    assert any("addmm" in d.what and "compute" in d.reason for d in e.declined)
    text = str(e)
    assert "native_layer_norm" in text and "heuristic" in text and "compute-intensive" in text
    import stitchtune

    assert stitchtune.torch.explain is not None


def test_training_forward_and_backward_match_eager() -> None:
    torch.manual_seed(0)
    m = Block()
    x = torch.randn(2, 4, 16, requires_grad=True)
    torch_backend.LAST_REPORTS.clear()
    got = _compile(m, cpu="reference", fallback="eager")(x)
    got.sum().backward()
    g_got, w_got = x.grad.clone(), m.fc.weight.grad.clone()
    x.grad = None
    m.zero_grad()
    want = m(x)
    want.sum().backward()
    assert torch.allclose(got, want, atol=1e-5)
    assert torch.allclose(g_got, x.grad, atol=1e-4) and torch.allclose(w_got, m.fc.weight.grad, atol=1e-4)
    kinds = {r.graph: len(r.stitched) for r in torch_backend.LAST_REPORTS}
    assert kinds.get("forward", 0) > 0 and kinds.get("backward", 0) > 0


def test_a_region_that_fails_to_compile_is_declined_and_the_model_still_runs(
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    real = torch_backend._compile_region

    def flaky(region: Any, *a: Any) -> Any:
        if "aten.native_layer_norm" in region.ops:
            raise StitchtuneError("boom in planning")
        return real(region, *a)

    monkeypatch.setattr(torch_backend, "_compile_region", flaky)
    torch.manual_seed(0)
    m, x = Block().eval(), torch.randn(2, 4, 16)
    torch_backend.LAST_REPORTS.clear()
    with caplog.at_level(logging.INFO, logger="stitchtune.deploy.torch_backend"), torch.no_grad():
        got = _compile(m, cpu="reference", fallback="eager")(x)
        want = m(x)
    assert torch.allclose(got, want, atol=1e-5)
    assert _stitched() == 1
    assert any("boom in planning" in r.getMessage() for r in caplog.records)


@pytest.mark.parametrize("strict", [True, False])
def test_strict_raises_a_bug_that_would_decline_a_region(strict: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    """strict (on in the tests): a region whose compilation raises an error that is not a StitchtuneError
    fails torch.compile; without it the region is declined with the error as its reason and the model
    runs. A StitchtuneError (a refusal) is declined either way (the test above)."""
    real = torch_backend._compile_region

    def buggy(region: Any, *a: Any) -> Any:
        if "aten.native_layer_norm" in region.ops:
            raise KeyError("a bug in compiling")
        return real(region, *a)

    monkeypatch.setattr(torch_backend, "_compile_region", buggy)
    torch.manual_seed(0)
    m, x = Block().eval(), torch.randn(2, 4, 16)
    torch_backend.LAST_REPORTS.clear()
    with torch.no_grad():
        if strict:
            with pytest.raises(Exception, match="a bug in compiling"):
                _compile(m, cpu="reference", fallback="eager", strict=True)(x)
            return
        got = _compile(m, cpu="reference", fallback="eager", strict=False)(x)
        want = m(x)
    assert torch.allclose(got, want, atol=1e-5)
    reasons = [d.reason for r in torch_backend.LAST_REPORTS for d in r.declined]
    assert any("KeyError" in r and "a bug in compiling" in r for r in reasons)


def test_a_kernel_failure_at_run_time_declines_the_region_once_and_runs_its_aten_ops(
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    from stitchtune.deploy.torch_ops import RegionKernel

    calls = []

    def broken(self: Any, inputs: Any) -> Any:
        calls.append(self.name)
        raise ValueError("emulator says no")

    monkeypatch.setattr(RegionKernel, "run_cpu", broken)
    torch.manual_seed(0)
    m, x = Block().eval(), torch.randn(2, 4, 16)
    with caplog.at_level(logging.WARNING, logger="stitchtune.deploy.torch_ops"), torch.no_grad():
        e = torch_backend.explain(m, x, db=None, fallback="eager")
        again = torch.compile(m, backend="stitchtune", options={"db": None, "fallback": "eager"})(x)
        want = m(x)
    assert torch.allclose(e.outputs, want, atol=1e-5) and torch.allclose(again, want, atol=1e-5)
    assert not e.stitched
    failed = [d for d in e.declined if "failed at run time" in d.reason]
    assert len(failed) == 2 and all("emulator says no" in d.reason for d in failed)
    warned = [r for r in caplog.records if "emulator says no" in r.getMessage()]
    assert len(warned) == 2 and len(calls) == 2   # once per region: then its ATen ops run


def test_a_wrong_fake_result_is_caught_before_the_graph_runs(monkeypatch: pytest.MonkeyPatch) -> None:
    """A fake (meta) result of another shape than PyTorch's declines its region at compile time."""
    from stitchtune.deploy.torch_ops import RegionKernel

    real = RegionKernel.fake

    def wrong(self: Any, inputs: Any, device: Any = None) -> Any:
        outs = real(self, inputs, device)
        return [o.reshape(1, *o.shape) for o in outs] if "aten.native_layer_norm" in self.ops else outs

    monkeypatch.setattr(RegionKernel, "fake", wrong)
    torch.manual_seed(0)
    m, x = Block().eval(), torch.randn(2, 4, 16)
    with torch.no_grad():
        e = torch_backend.explain(m, x, db=None, fallback="eager")
        want = m(x)
    assert torch.allclose(e.outputs, want, atol=1e-5)
    assert len(e.stitched) == 1 and "aten.native_layer_norm" not in e.stitched[0].ops
    [d] = [d for d in e.declined if "fake" in d.reason]
    assert "native_layer_norm" in d.what and "[1, 2, 4, 16]" in d.reason


@pytest.mark.parametrize("op", ["add", "sub", "mul", "div", "pow", "maximum", "minimum", "atan2", "lerp", "bce"])
def test_backward_of_broadcasting_binary_ops_matches_eager(op: str) -> None:
    """Gradients of operands that broadcast (a sum over the broadcast axes in the backward; a 0-d loss)."""
    fns = {"add": torch.add, "sub": torch.sub, "mul": torch.mul, "div": lambda a, b: a / (b.abs() + 1),
           "pow": lambda a, b: a.abs() ** b, "maximum": torch.maximum, "minimum": torch.minimum,
           "atan2": torch.atan2, "lerp": lambda a, b: torch.lerp(a, b, 0.3),
           "bce": lambda a, b: torch.nn.functional.binary_cross_entropy_with_logits(a, b.sigmoid().expand(4, 8))}
    f = fns[op]
    torch.manual_seed(0)
    a, b = torch.randn(4, 8, requires_grad=True), torch.randn(8, requires_grad=True)
    got = _compile(f, fallback="eager", cpu="reference")(a, b)
    got.sum().backward()   # a 0-d output (bce) is the loss itself: its tangent has its shape
    ga, gb = a.grad.clone(), b.grad.clone()
    a.grad = b.grad = None
    want = f(a, b)
    want.sum().backward()
    assert got.shape == want.shape and torch.allclose(got, want, atol=1e-5)
    assert torch.allclose(ga, a.grad, atol=1e-4) and torch.allclose(gb, b.grad, atol=1e-4)


def test_batch_norm_training_step_matches_eager() -> None:
    torch.manual_seed(0)
    m, x = torch.nn.BatchNorm1d(8), torch.randn(4, 8, requires_grad=True)
    got = _compile(m, fallback="eager", cpu="reference")(x)
    (got * got.detach()).sum().backward()
    gx, gw = x.grad.clone(), m.weight.grad.clone()
    x.grad, m.weight.grad = None, None
    want = m(x)
    (want * want.detach()).sum().backward()
    assert torch.allclose(got, want, atol=1e-5)
    assert torch.allclose(gx, x.grad, atol=1e-4) and torch.allclose(gw, m.weight.grad, atol=1e-4)


def test_static_shapes_recompile_and_symbolic_shapes_get_a_kernel_per_bucket() -> None:
    from stitchtune.deploy import torch_ops
    from stitchtune.deploy.torch_region_dynamic import DynamicRegionKernel

    torch.manual_seed(0)
    m = Block().eval()
    c = _compile(m, cpu="reference", fallback="eager")
    with torch.no_grad():
        for shape in [(2, 4, 16), (3, 4, 16)]:
            x = torch.randn(*shape)
            assert torch.allclose(c(x), m(x), atol=1e-5)
    torch._dynamo.reset()
    torch_backend.LAST_REPORTS.clear()
    c = torch.compile(m, backend="stitchtune", dynamic=True, options={"db": None, "fallback": "eager",
                                                                      "cpu": "reference"})
    with torch.no_grad():
        for b in (5, 6, 5):
            x = torch.randn(b, 4, 16)
            assert torch.allclose(c(x), m(x), atol=1e-5)
    [report] = torch_backend.LAST_REPORTS
    assert len(report.stitched) == 2 and all(s.source.endswith("per bucket") for s in report.stitched)
    dyn = [k.kernel for k in torch_ops._registry.values()
           if isinstance(getattr(k, "kernel", None), DynamicRegionKernel)][-2:]
    assert [len(k.entries()) for k in dyn] == [1, 1]   # 5 and 6 rows: one generic kernel of one bucket
    assert all(b is not None and b.generic for k in dyn for _, _, b in k.entries())


def test_a_shape_the_region_cannot_take_runs_its_aten_ops(monkeypatch: pytest.MonkeyPatch) -> None:
    from stitchtune.importers import torch_symbolic

    def refuse(*a: Any, **k: Any) -> Any:
        raise StitchtuneError("not at these shapes")

    monkeypatch.setattr(torch_symbolic, "map_at_shapes", refuse)
    torch.manual_seed(0)
    m = Block().eval()
    c = torch.compile(m, backend="stitchtune", dynamic=True, options={"db": None, "fallback": "eager"})
    with torch.no_grad():
        x = torch.randn(7, 4, 16)
        assert torch.allclose(c(x), m(x), atol=1e-5)
    from stitchtune.deploy import torch_ops
    from stitchtune.deploy.torch_region_dynamic import DynamicRegionKernel

    dyn = [k.kernel for k in torch_ops._registry.values()
           if isinstance(getattr(k, "kernel", None), DynamicRegionKernel)][-2:]
    assert len(dyn) == 2 and all([b for _, _, b in k.entries()] == [None] for k in dyn)


def test_options_are_checked() -> None:
    with pytest.raises(StitchtuneError, match="unknown stitchtune backend option"):
        torch_backend.BackendOptions.from_options({"dbb": None})
    with pytest.raises(StitchtuneError, match="fallback"):
        torch_backend.BackendOptions.from_options({"fallback": "xla"})
    with pytest.raises(StitchtuneError, match="cpu"):
        torch_backend.BackendOptions.from_options({"cpu": "gpu"})


def test_the_entry_point_names_the_backend() -> None:
    meta = tomllib.loads((ROOT / "pyproject.toml").read_text())
    target = meta["project"]["entry-points"]["torch_dynamo_backends"]["stitchtune"]
    mod, _, attr = target.partition(":")
    import importlib

    assert getattr(importlib.import_module(mod), attr) is torch_backend.stitchtune_backend
    from torch._dynamo.backends.registry import lookup_backend

    assert lookup_backend("stitchtune") is torch_backend.stitchtune_backend


def test_cuda_path_launches_on_the_given_stream_and_packs_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """The custom op's CUDA path over the fake driver: the Launcher is made once, arguments are packed
    once per set of pointers, and a repeated call only launches (no allocation, copy or sync)."""
    from stitchtune.deploy.compiled import compile as compile_graph
    from stitchtune.deploy.torch_ops import RegionKernel
    from stitchtune.gpu.fake_driver import FakeDriver
    from stitchtune.importers.torch_regions import find_regions
    from torch.fx.experimental.proxy_tensor import make_fx

    gm = make_fx(lambda x, g: torch.nn.functional.layer_norm(x, (16,), g), tracing_mode="fake")(
        torch.randn(8, 16), torch.randn(16))
    [region] = find_regions(gm).regions
    cg = compile_graph(region.graph, db=None, device="h200", build=False)
    drv = FakeDriver()
    k = RegionKernel(region.name, region.ops, dataclasses.replace(cg, cubin=b"FAKE cubin"), driver=drv)
    ins = [drv.mem_alloc(8 * 16 * 4), drv.mem_alloc(16 * 4)]
    outs = [drv.mem_alloc(8 * 16 * 4)]
    ptrs = (*ins, *outs)
    k.launch_pointers(0, ptrs, stream=0x77)
    n = len(cg.program.launches)
    before = len(drv.calls)
    for _ in range(3):
        k.launch_pointers(0, ptrs, stream=0x77)
    later = [c[0] for c in drv.calls[before:]]
    assert later == ["launch"] * (3 * n)
    assert len(drv.launches) == 4 * n and {ln.stream for ln in drv.launches} == {0x77}
    assert len(k._launchers[(0, 0x77)][1]) == 1          # one packed argument set
    other = drv.mem_alloc(8 * 16 * 4)
    k.launch_pointers(0, (ins[0], ins[1], other), stream=0x77)
    assert len(k._launchers[(0, 0x77)][1]) == 1          # the same set, its output pointer rewritten
    assert other in drv.launches[-1].args and outs[0] not in drv.launches[-1].args
    k.launch_pointers(0, ptrs, stream=0x77)
    assert outs[0] in drv.launches[-1].args and other not in drv.launches[-1].args
    assert sum(1 for c in drv.calls if c[0] == "load_module") == 1


def test_the_custom_op_goes_through_the_launch_path_with_tensor_pointers() -> None:
    """torch.ops.stitchtune.region with a driver given: outputs from torch.empty, the kernels launched
    with the tensors' own pointers (inputs, then outputs), no host copy."""
    from stitchtune.deploy import torch_ops
    from stitchtune.deploy.torch_region_dynamic import DynamicRegionKernel
    from stitchtune.deploy.compiled import compile as compile_graph
    from stitchtune.gpu.fake_driver import FakeDriver
    from stitchtune.importers.torch_regions import find_regions
    from torch.fx.experimental.proxy_tensor import make_fx

    gm = make_fx(lambda x: (x * 2.0).softmax(-1), tracing_mode="fake")(torch.randn(4, 32))
    [region] = find_regions(gm).regions
    cg = compile_graph(region.graph, db=None, device="h200", build=False)
    drv = FakeDriver()
    torch_ops.register("test-launch", torch_ops.RegionKernel(region.name, region.ops,
                                                            dataclasses.replace(cg, cubin=b"FAKE"), driver=drv))
    x = torch.randn(4, 32)
    [y] = torch.ops.stitchtune.region("test-launch", [x])
    assert y.shape == (4, 32) and y.dtype == torch.float32
    io = {b.tensor: b.name for b in cg.program.buffers if b.role in ("input", "output")}
    ptr = {region.graph.inputs[0][0]: x.data_ptr(), region.graph.outputs[0]: y.data_ptr()}
    checked = set()
    assert len(drv.launches) == len(cg.program.launches)
    for ln, spec in zip(drv.launches, cg.program.launches):
        for value, arg in zip(ln.args, spec.args):
            for tensor, buf in io.items():
                if buf == arg:
                    assert value == ptr[tensor]
                    checked.add(tensor)
    assert checked == set(ptr)
    assert not [c for c in drv.calls if c[0] in ("memcpy_htod", "memcpy_dtoh", "synchronize")]


def test_when_inductor_fails_on_the_rest_it_runs_eagerly(monkeypatch: pytest.MonkeyPatch,
                                                         caplog: pytest.LogCaptureFixture) -> None:
    import torch._inductor.compile_fx as cfx

    _refuse(monkeypatch, cfx, "compile_fx_inner", "inductor is down")
    torch.manual_seed(0)
    m, x = Block().eval(), torch.randn(2, 4, 16)
    with caplog.at_level(logging.WARNING, logger="stitchtune.deploy.torch_rest"), torch.no_grad():
        got = _compile(m, cpu="reference", strict=False)(x)   # strict would raise Inductor's RuntimeError
        want = m(x)
    assert torch.allclose(got, want, atol=1e-5)
    assert any("inductor is down" in r.getMessage() and "eagerly" in r.getMessage() for r in caplog.records)


def test_dropout_in_training_goes_to_inductor_with_the_regions(caplog: pytest.LogCaptureFixture) -> None:
    """The forward graph of a training step with dropout (``aten.rand``) compiles with Inductor (its
    random ops replaced by Inductor's, as its own joint-graph pass does), not eagerly after an
    Inductor failure."""
    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.LayerNorm(16), torch.nn.Linear(16, 16), torch.nn.GELU(), torch.nn.Dropout(0.25))
    x = torch.randn(4, 16, requires_grad=True)
    torch_backend.LAST_REPORTS.clear()
    from torch._inductor.utils import run_and_get_code

    with caplog.at_level(logging.WARNING, logger="stitchtune.deploy.torch_rest"):
        y, codes = run_and_get_code(lambda: _compile(m, cpu="reference")(x))
        y.sum().backward()
    assert not [r for r in caplog.records if "Inductor failed" in r.getMessage()], caplog.text
    # Inductor makes the random numbers in the kernel that compares them (no ATen rand launch)
    assert codes and not any("aten.rand." in c for c in codes) and any("randint" in c for c in codes)
    assert {r.graph for r in torch_backend.LAST_REPORTS} == {"forward", "backward"} and _stitched() > 0
    kept = (y != 0).float().mean().item()   # about 3/4 of the values survive dropout
    assert 0.5 < kept < 0.95 and x.grad is not None and torch.isfinite(x.grad).all()


def test_dropouts_mask_product_is_stitched_and_a_training_step_matches_the_same_masks_eagerly() -> None:
    """Training dropout's numbers, its comparison and ``mask * x`` (forward) and the mask cast of its
    backward are stitched into the regions around them (the region draws the numbers:
    ``stitchtune::rand``, graph.json's ``uniform``); with the same seed and the rest run eagerly the
    step equals AOTAutograd's graphs run eagerly with the same draws (``seed_rands``: the same seeds
    from the same ``randint``, hashed by torch, so the same masks bit for bit)."""
    from torch._dynamo.backends.common import aot_autograd
    from torch._functorch.aot_autograd import make_boxed_func

    from stitchtune.importers.torch_random import seed_rands

    def step(backend: Any) -> tuple[Any, Any]:
        torch.manual_seed(1)
        m = torch.nn.Sequential(torch.nn.LayerNorm(16), torch.nn.Linear(16, 16), torch.nn.GELU(),
                                torch.nn.Dropout(0.25), torch.nn.LayerNorm(16))
        x = torch.randn(4, 16, requires_grad=True)
        torch._dynamo.reset()
        y = torch.compile(m, backend=backend)(x)
        (y * torch.linspace(-1.0, 2.0, 16)).sum().backward()   # a layer norm's plain sum has no gradient
        return y.detach(), x.grad

    eager = aot_autograd(fw_compiler=lambda gm, _: make_boxed_func((seed_rands(gm) or gm).forward),
                         decompositions=torch_rest.decompositions())
    want_y, want_g = step(eager)
    torch_backend.LAST_REPORTS.clear()
    got_y, got_g = step(lambda gm, inputs: torch_backend.stitchtune_backend(gm, inputs, options={
        "db": None, "fallback": "eager"}))   # the rest eagerly: PyTorch's rand, not Inductor's
    assert torch.allclose(got_y, want_y, atol=1e-5) and torch.allclose(got_g, want_g, atol=1e-4)
    assert want_g.abs().max() > 1e-2
    ops = {r.graph: [o for s in r.stitched for o in s.ops] for r in torch_backend.LAST_REPORTS}
    declined = [d.what for r in torch_backend.LAST_REPORTS for d in r.declined]
    assert "op aten.mul" not in declined and "op prims.convert_element_type" not in declined
    assert "prims.convert_element_type" in ops["backward"] and ops["forward"].count("aten.mul") >= 2
    assert {"stitchtune.rand", "aten.gt"} <= set(ops["forward"])   # drawn and compared in the region


def test_a_mask_saved_for_the_backward_is_a_bool_output_of_its_region() -> None:
    """A dropout-like mask of a value the region computes (``noise * layer_norm(x) > 0.1``, the noise an
    input): AOTAutograd saves the bool mask for the backward; the forward's region computes it with
    the masked product (a bool output, emulated kernels), and the step's values and gradients equal
    eager PyTorch's for the same noise, the mask bit for bit."""
    def f(x: Any, w: Any, noise: Any) -> tuple[Any, Any]:
        h = torch.nn.functional.layer_norm(x, (16,)) * w
        keep = h * noise > 0.1
        return torch.where(keep, h, 0.0) * (1 / 0.9), keep

    torch.manual_seed(0)
    x, noise = torch.randn(4, 16), torch.rand(4, 16)
    w_eager = torch.linspace(0.5, 1.5, 16).requires_grad_()
    w_comp = w_eager.detach().clone().requires_grad_()
    want_y, want_keep = f(x, w_eager, noise)
    (want_y * torch.linspace(-1.0, 2.0, 16)).sum().backward()
    torch_backend.LAST_REPORTS.clear()
    got_y, got_keep = _compile(f, fallback="eager")(x, w_comp, noise)
    (got_y * torch.linspace(-1.0, 2.0, 16)).sum().backward()
    assert got_keep.dtype == torch.bool and torch.equal(got_keep, want_keep) and 0 < int(want_keep.sum()) < 64
    assert torch.allclose(got_y, want_y, atol=1e-5) and torch.allclose(w_comp.grad, w_eager.grad, atol=1e-4)
    fw = [r for r in torch_backend.LAST_REPORTS if r.graph == "forward"]
    assert fw and any("aten.gt" in s.ops for r in fw for s in r.stitched)
    assert not [d for r in fw for d in r.declined if "bool" in d.reason]


def test_a_failure_of_the_whole_stitching_step_leaves_the_graph_to_the_fallback(
        monkeypatch: pytest.MonkeyPatch) -> None:
    _refuse(monkeypatch, torch_backend, "stitch_graph", "stitching is down")
    torch.manual_seed(0)
    m, x = Block().eval(), torch.randn(2, 4, 16)
    with torch.no_grad():  # strict=False: the lenient default declines even a bug (a RuntimeError here)
        e = torch_backend.explain(m, x, db=None, fallback="eager", strict=False)
        want = m(x)
    assert torch.allclose(e.outputs, want, atol=1e-6) and not e.stitched
    assert [d.what for d in e.declined] == ["graph"] and "stitching is down" in e.declined[0].reason


def test_a_masked_softmax_with_a_bool_mask_is_one_emulated_region() -> None:
    def f(scores: Any, keep: Any) -> Any:
        return (scores * 0.25).masked_fill(~keep, float("-inf")).softmax(-1)

    torch.manual_seed(0)
    scores, keep = torch.randn(1, 2, 4, 8), torch.rand(1, 1, 1, 8) > 0.3
    keep[..., 0] = True
    torch_backend.LAST_REPORTS.clear()
    got = _compile(f, fallback="eager", cpu="emulate")(scores, keep)
    assert torch.allclose(got, f(scores, keep), atol=1e-6)
    [report] = torch_backend.LAST_REPORTS
    assert len(report.stitched) == 1 and {"aten.where", "aten._softmax"} <= set(report.stitched[0].ops)


def test_a_region_with_an_int64_output_passes_the_fake_check_and_matches_eager_exactly() -> None:
    """Cross entropy's ``where(target != ignore_index, target, 0)``: a region whose output is int64
    (its fake result and its emulated run both carry the int dtype), not declined."""
    def f(x: Any, t: Any) -> Any:
        safe = torch.where(t != -100, t, 0)
        return x * 2.0 + 1.0, safe

    torch.manual_seed(0)
    x, t = torch.randn(16, 8), torch.randint(0, 8, (16,))
    t[3] = -100
    torch_backend.LAST_REPORTS.clear()
    got = _compile(f, fallback="eager", cpu="emulate")(x, t)
    want = f(x, t)
    assert got[1].dtype == torch.int64 and torch.equal(got[1], want[1])
    assert torch.allclose(got[0], want[0], atol=1e-6)
    [report] = torch_backend.LAST_REPORTS
    int_regions = [r for r in report.stitched if {"aten.ne", "aten.where"} <= set(r.ops)]
    assert int_regions, (report.stitched, report.declined)
    assert not [d for d in report.declined if "fake" in str(d)], report.declined


def test_cubins_are_built_in_one_batch_and_a_failed_build_declines_its_region(monkeypatch: pytest.MonkeyPatch) -> None:
    """The CUDA compile path without a GPU: the builder gets every region's source at once; a source
    it fails on declines that region only."""
    from types import SimpleNamespace as NS

    import stitchtune.gpu.build as build
    from stitchtune.deploy.torch_ops import RegionKernel
    from stitchtune.importers.torch_regions import find_regions
    from torch.fx.experimental.proxy_tensor import make_fx

    batches: list[int] = []

    class FakeBuilder:
        def build(self, sources: list[str], arch: str) -> list[Any]:
            batches.append(len(sources))
            return [NS(status="ok", cubin_path=str(cubin), error="") if i == 0 else
                    NS(status="compile_error", cubin_path=None, error="ptxas says no") for i in range(len(sources))]

    cubin = ROOT / "pyproject.toml"   # any file: its bytes stand for a cubin
    monkeypatch.setattr(build, "NvccBuilder", FakeBuilder)
    gm = make_fx(lambda x: Block().eval()(x), tracing_mode="fake")(torch.randn(2, 4, 16))
    regions = find_regions(gm).regions
    opts = torch_backend.BackendOptions(db=None)
    kernels = [torch_backend._compile_region(r, opts, torch_region_compile.device_for(opts)) for r in regions]
    failed = torch_region_compile.attach_cubins(kernels, "sm_90", opts)
    assert batches == [2] and list(failed) == [1] and "ptxas says no" in failed[1]
    assert isinstance(kernels[0], RegionKernel) and kernels[0].compiled.cubin == cubin.read_bytes()


@pytest.mark.parametrize("kernels", ["work", "fail at run time"])
def test_permuted_outputs_and_no_op_aliases_match_eager(kernels: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Rotary-style heads: a region output PyTorch keeps in transposed memory order is written
    row-major and viewed back; a same-dtype clone read inside and outside the region is an alias.
    When the kernels fail at run time, the regions' ATen ops give the same layout."""
    if kernels != "work":
        from stitchtune.deploy.torch_ops import RegionKernel

        _refuse(monkeypatch, RegionKernel, "run_cpu", "emulator says no")

    def f(x: Any, w: Any) -> Any:
        q = (x @ w).view(2, 4, 2, 4).transpose(1, 2)
        r = q * 2.0 + 1.0
        c = r.clone()
        return (r @ r.transpose(-1, -2)).view(2, -1), c @ w[:4, :4], (c * 3.0).sum(-1)

    torch.manual_seed(0)
    x, w = torch.randn(8, 8), torch.randn(8, 8)
    torch_backend.LAST_REPORTS.clear()
    got = _compile(f, fallback="eager", cpu="emulate")(x, w)
    for g, e in zip(got, f(x, w)):
        assert g.shape == e.shape and g.stride() == e.stride() and torch.allclose(g, e, atol=1e-5)
    stitched = any("aten.add" in s.ops for r in torch_backend.LAST_REPORTS for s in r.stitched)
    assert stitched == (kernels == "work")


class ResBlock(torch.nn.Module):
    """conv -> batch norm -> ReLU -> conv -> batch norm, += x, ReLU, max pool, 1x1 average pool."""

    def __init__(self, c: int = 4) -> None:
        super().__init__()
        self.c1, self.c2 = (torch.nn.Conv2d(c, c, 3, padding=1, bias=False) for _ in range(2))
        self.b1, self.b2 = torch.nn.BatchNorm2d(c), torch.nn.BatchNorm2d(c)
        self.pool, self.avg = torch.nn.MaxPool2d(3, 2, 1), torch.nn.AdaptiveAvgPool2d(1)

    def forward(self, x: Any) -> Any:
        y = self.b2(self.c2(torch.relu(self.b1(self.c1(x)))))
        y += x
        return self.avg(self.pool(torch.relu(y)))


@pytest.mark.parametrize("cpu,fallback", [("emulate", "eager"),
                                          pytest.param("reference", "inductor", marks=pytest.mark.slow)])
def test_a_resnet_block_stitches_batch_norm_relu_and_the_residual_add(cpu: str, fallback: str) -> None:
    torch.manual_seed(0)
    m = ResBlock()
    for bn in (m.b1, m.b2):
        bn.running_mean.uniform_(-1, 1)
        bn.running_var.uniform_(0.5, 2)
    m.eval()
    x = torch.randn(1, 4, 8, 8)
    with torch.no_grad():
        e = torch_backend.explain(m, x, db=None, fallback=fallback, cpu=cpu)
        want = m(x)
    bn = "aten._native_batch_norm_legit_no_training"
    assert [s.ops for s in e.stitched] == [(bn, "aten.relu"), (bn, "aten.add", "aten.relu"), ("aten.mean",)]
    assert any("max_pool2d" in d.what and "windowed" in d.reason for d in e.declined)
    assert (e.outputs - want).abs().max().item() < 1e-5


def test_nll_of_log_softmax_is_one_stitched_region_and_matches_eager() -> None:
    """``-gather(log_softmax(x), 1, t[:, None]).mean()``: log-softmax, the target pick, the mean over
    rows and the negation are one region (one kernel launch under the grid combine; the heuristic's
    combine kernel makes two); forward value and ``torch.autograd.grad`` match eager."""
    def f(x: Any, t: Any) -> Any:
        return -torch.gather(torch.log_softmax(x, -1), 1, t.unsqueeze(1)).mean()

    torch.manual_seed(0)
    x, t = torch.randn(16, 1000, requires_grad=True), torch.randint(0, 1000, (16,))
    torch_backend.LAST_REPORTS.clear()
    got = _compile(f, fallback="eager", cpu="emulate")(x, t)
    (g_got,) = torch.autograd.grad(got, x)
    want = f(x, t)
    (g_want,) = torch.autograd.grad(want, x)
    assert abs(float(got) - float(want)) <= 1e-5 * abs(float(want))
    assert torch.allclose(g_got, g_want, atol=1e-6)
    fwd = [r for r in torch_backend.LAST_REPORTS if r.graph == "forward"]
    [region] = fwd[0].stitched
    assert set(region.ops) == {"aten._log_softmax", "aten.gather", "aten.mean", "aten.neg"}
    assert 1 <= region.kernels <= 2
    assert [d.what for d in fwd[0].declined] == ["op aten.unsqueeze"]   # a view PyTorch makes (no kernel)


@pytest.mark.parametrize("ignored", [[3], [], list(range(16))])
def test_cross_entropy_with_ignore_index_is_one_stitched_region(ignored: list[int]) -> None:
    """``F.cross_entropy(x, t, ignore_index=-100)``: the pick's index ``where(t != -100, t, 0)`` computed
    in the region, the rank-1 mask and picked loss held per row, the mean over the rows kept as the
    masked sum over the count: one region, nothing declined, matching eager (NaN when every row is
    ignored, as in PyTorch)."""
    def f(x: Any, t: Any) -> Any:
        return torch.nn.functional.cross_entropy(x, t, ignore_index=-100)

    torch.manual_seed(1)
    x, t = torch.randn(16, 100), torch.randint(0, 100, (16,))
    t[ignored] = -100
    torch_backend.LAST_REPORTS.clear()
    with torch.no_grad():
        got = _compile(f, fallback="eager", cpu="emulate")(x, t)
        want = f(x, t)
    if ignored == list(range(16)):
        assert torch.isnan(got) and torch.isnan(want)
    else:
        assert abs(float(got) - float(want)) <= 1e-5 * abs(float(want))
    [rep] = torch_backend.LAST_REPORTS
    [region] = rep.stitched
    assert {"aten._log_softmax", "aten.gather", "aten.where", "aten.sum", "aten.div"} <= set(region.ops)
    assert rep.declined == [] and 1 <= region.kernels <= 2


def test_a_constant_region_input_is_held_by_the_kernel_not_computed_by_the_graph() -> None:
    """A causal mask made from ``arange`` (folded at import time) is an input of the softmax region:
    the registered kernel holds its value, the region call does not pass it, and nothing in the
    rewritten graph computes it (Inductor would make a kernel for it per region); the result is
    PyTorch's."""
    from torch.fx.experimental.proxy_tensor import make_fx

    def f(s: Any) -> Any:
        i = torch.arange(8)
        return s.masked_fill(i[None, :] > i[:, None], float("-inf")).softmax(-1) * 2.0

    s = torch.randn(2, 8, 8)
    gm = make_fx(f)(s)
    opts = torch_backend.BackendOptions.from_options({"db": None, "cpu": "reference"})
    new_gm, report = torch_backend.stitch_graph(gm, [s], opts, "inference")
    [region] = report.stitched
    [call] = [n for n in new_gm.graph.nodes if n.target is torch.ops.stitchtune.region.default]
    assert [a.name for a in call.args[1]] == ["s_1"]   # the mask is not an argument
    computed = {str(n.target) for n in new_gm.graph.nodes if n.op == "call_function"}
    assert not any("arange" in t or "iota" in t or ".gt." in t for t in computed), computed
    assert torch.allclose(new_gm(s), f(s), atol=1e-6)


def test_a_clone_of_a_region_output_reads_the_output_itself() -> None:
    """Dropout of probability 0 after a softmax (ViT's attention) is a ``clone`` of the region's output:
    the matmul reads an output of the region's kernel (no copy left to Inductor); a clone that the graph
    returns is a tensor of its own (it must not alias another output)."""
    from torch.fx.experimental.proxy_tensor import make_fx

    def f(x: Any, w: Any) -> Any:
        p = torch.softmax(x * 2.0, -1)
        kept = torch.exp(x).clone()
        return p.clone() @ w, p, kept, kept.clone()

    x, w = torch.randn(4, 8), torch.randn(8, 8)
    gm = make_fx(f)(x, w)
    opts = torch_backend.BackendOptions(db=None, cpu="emulate")
    new_gm, report = torch_backend.stitch_graph(gm, [x, w], opts, "inference")
    assert report.stitched, report
    # the region stores the clones itself (a second output each) or the rewrite reads its output: either
    # way no clone is left that another op reads, and the matmul reads a region output
    clones = [n for n in new_gm.graph.nodes if n.target is torch.ops.aten.clone.default]
    assert all(u.op == "output" for c in clones for u in c.users)
    mm = next(n for n in new_gm.graph.nodes if n.target is torch.ops.aten.mm.default)
    assert mm.args[0].target is operator.getitem
    assert mm.args[0].args[0].target is torch.ops.stitchtune.region.default
    got, want = new_gm(x, w), f(x, w)
    for g, e in zip(got, want):
        assert torch.allclose(g, e, atol=1e-5)
    assert got[2].data_ptr() != got[3].data_ptr()


@pytest.mark.parametrize("layout", ["channels_last", "contiguous", "mixed"])
def test_backward_graphs_convolving_channels_last_tensors_are_recognised(layout: str) -> None:
    """Inductor compiles such a backward graph with its layout optimisation (else it copies a
    depthwise convolution's input and gradient into the weight gradient's order); NCHW ones, and a
    channels-last gradient of an NCHW input (ViT's patch embedding), without."""
    from torch.fx.experimental.proxy_tensor import make_fx

    def f(g: Any, x: Any, w: Any) -> Any:
        return torch.ops.aten.convolution_backward(g, x, w, [4], [1, 1], [3, 3], [1, 1], False, [0, 0], 4,
                                                   [True, True, True])

    cl, plain = torch.channels_last, torch.contiguous_format
    fmts = {"channels_last": (cl, cl), "contiguous": (plain, plain), "mixed": (cl, plain)}[layout]
    g, x = (torch.randn(1, 4, 8, 8).to(memory_format=f) for f in fmts)
    gm = make_fx(f, tracing_mode="fake")(g, x, torch.randn(4, 1, 7, 7))
    assert torch_rest.channels_last_conv_backward(gm) == (layout == "channels_last")


def test_a_permuted_view_read_inside_and_outside_a_region_is_stored_in_its_memory_order() -> None:
    """ConvNeXt's layer norm gradient, NHWC, viewed as NCHW for a convolution and read (permuted back)
    by the layer scale's gradient: one region that writes the view in its memory order, not two cut
    at the view."""
    from torch.fx.experimental.proxy_tensor import make_fx

    def f(x: Any, w: Any, g: Any) -> Any:
        y = (x * 2.0).exp()               # [1, 4, 4, 8], NHWC
        v = y.permute(0, 3, 1, 2)         # NCHW view, read by the convolution and below
        z = v.permute(0, 2, 3, 1) * g
        return torch.nn.functional.conv2d(v, w), z, z.sum((0, 1, 2))

    x, w, g = torch.randn(1, 4, 4, 8), torch.randn(8, 8, 1, 1), torch.randn(8)
    gm = make_fx(f)(x, w, g)
    opts = torch_backend.BackendOptions(db=None, cpu="emulate")
    new_gm, report = torch_backend.stitch_graph(gm, [x, w, g], opts, "inference")
    assert len(report.stitched) == 1, report
    assert not [d for d in report.declined if "aten.permute" in d.what], report
    for got, want in zip(new_gm(x, w, g), f(x, w, g)):
        assert got.shape == want.shape and torch.allclose(got, want, atol=1e-5)


@pytest.mark.parametrize("kw,ignored", [({}, [3]), ({}, list(range(16))), ({"reduction": "sum"}, [0, 5]),
                                        ({"reduction": "none"}, [7]), ({"label_smoothing": 0.1}, [3])])
def test_cross_entropy_backward_is_one_stitched_launch(kw: dict[str, Any], ignored: list[int]) -> None:
    """A training step's backward of ``F.cross_entropy(x, t, ignore_index=-100)``: the incoming 0-d
    gradient and count read as ``[1]`` inputs, the target's one-hot (``scatter`` of -1 into zeros) as
    ``iota == index``, log-softmax's backward: one region, one launch, gradients equal to eager (zero
    on ignored rows; all rows ignored: a NaN loss and zero gradients, as in PyTorch)."""
    def f(x: Any, t: Any) -> Any:
        return torch.nn.functional.cross_entropy(x, t, ignore_index=-100, **kw)

    torch.manual_seed(2)
    x, t = torch.randn(16, 100, requires_grad=True), torch.randint(0, 100, (16,))
    t[ignored] = -100
    torch_backend.LAST_REPORTS.clear()
    got = _compile(f, fallback="eager", cpu="emulate")(x, t)
    (gx,) = torch.autograd.grad(got.sum(), x)
    want = f(x, t)
    (wx,) = torch.autograd.grad(want.sum(), x)
    assert torch.allclose(got, want, atol=1e-5, equal_nan=True) and torch.allclose(gx, wx, atol=1e-5)
    assert bool((gx[ignored] == 0).all())
    fwd, bwd = (next(r for r in torch_backend.LAST_REPORTS if r.graph == kind) for kind in ("forward", "backward"))
    [region] = bwd.stitched
    assert bwd.declined == [] and region.kernels == 1 and "aten.scatter" in region.ops
    if "label_smoothing" not in kw:   # the forward too (reduction none: the per-row losses stored as [B, 1])
        [head] = fwd.stitched
        assert fwd.declined == [] and "aten.gather" in head.ops and head.kernels <= 2


def _loss_head_regions() -> tuple[Any, Any]:
    """(forward, backward) stitched regions of the loss head in :data:`torch_backend.LAST_REPORTS`:
    the one with the target's pick, the one with its one-hot."""
    [fwd] = [s for r in torch_backend.LAST_REPORTS if r.graph == "forward" for s in r.stitched if "aten.gather" in s.ops]
    [bwd] = [s for r in torch_backend.LAST_REPORTS if r.graph == "backward" for s in r.stitched if "aten.scatter" in s.ops]
    return fwd, bwd


@pytest.mark.parametrize("items", [None, torch.tensor(13)])
def test_a_causal_lm_loss_head_is_one_region_each_way_and_matches_eager(items: Any) -> None:
    """transformers' causal-LM loss (label shift, flatten, cross entropy with ignored labels) on logits:
    forward one region (the cross reductions' combine: at most two launches), backward one launch;
    with ``num_items_in_batch`` (as the Trainer passes it) the sum over that 0-d count too."""
    pytest.importorskip("transformers")
    from transformers.loss.loss_utils import ForCausalLMLoss

    def loss(x: Any, t: Any, n: Any) -> Any:
        return ForCausalLMLoss(x, t, 50, num_items_in_batch=n)

    torch.manual_seed(3)
    logits, labels = torch.randn(2, 8, 50, requires_grad=True), torch.randint(0, 50, (2, 8))
    labels[0, :3] = -100
    torch_backend.LAST_REPORTS.clear()
    got = _compile(loss, fallback="eager", cpu="emulate")(logits, labels, items)
    (g,) = torch.autograd.grad(got, logits)
    want = loss(logits, labels, items)
    (w,) = torch.autograd.grad(want, logits)
    assert abs(got.item() - want.item()) < 1e-5 and torch.allclose(g, w, atol=1e-6)
    fwd, bwd = _loss_head_regions()
    assert 1 <= fwd.kernels <= 2 and bwd.kernels == 1 and (16, 50) in fwd.shapes


@pytest.mark.slow
@pytest.mark.parametrize("family", ["gpt2", "llama"])
def test_a_language_model_training_step_with_labels(family: str) -> None:
    """A tiny GPT-2 / Llama (transformers configs, random weights) called with ``labels=``: the loss head
    is one region forward and one backward (one launch), loss and gradients equal eager within 1e-4."""
    tf = pytest.importorskip("transformers")
    torch.manual_seed(0)
    if family == "gpt2":
        cfg = tf.GPT2Config(vocab_size=100, n_positions=16, n_embd=32, n_layer=1, n_head=4, n_inner=64,
                            resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, bos_token_id=0, eos_token_id=0)
    else:
        cfg = tf.LlamaConfig(vocab_size=100, max_position_embeddings=16, num_key_value_heads=2, num_hidden_layers=1,
                             hidden_size=32, num_attention_heads=4, intermediate_size=64)
    cfg._attn_implementation, cfg.use_cache = "eager", False
    m = tf.AutoModelForCausalLM.from_config(cfg).train()
    ids = torch.randint(0, 100, (2, 8))
    labels = ids.clone()
    labels[0, :3] = -100
    torch_backend.LAST_REPORTS.clear()
    got = _compile(m, fallback="eager", cpu="emulate")(input_ids=ids, labels=labels).loss
    got.backward()
    grads = {k: p.grad.clone() for k, p in m.named_parameters()}
    m.zero_grad()
    want = m(input_ids=ids, labels=labels).loss
    want.backward()
    scale = max(float(p.grad.abs().max()) for p in m.parameters())
    assert abs(got.item() - want.item()) < 1e-4
    assert max(float((grads[k] - p.grad).abs().max()) for k, p in m.named_parameters()) <= 1e-4 * scale
    fwd, bwd = _loss_head_regions()
    assert 1 <= fwd.kernels <= 2 and bwd.kernels == 1


def test_a_dropout_zero_clone_saved_for_the_backward_shares_the_softmax_tensor() -> None:
    """Training attention with dropout at p = 0: the softmax and its ``clone`` are both only saved for the
    backward (importers.torch_saved), so the clone shares the kernel's tensor (no second store, no copy
    kernel); the loss and gradients equal eager."""
    def f(s: Any, v: Any) -> Any:
        p = (s * 0.5).softmax(-1)
        return (torch.nn.functional.dropout(p, 0.0, training=True) @ v).sum()

    torch.manual_seed(0)
    s, v = torch.randn(2, 8, 8, requires_grad=True), torch.randn(2, 8, 4, requires_grad=True)
    torch_backend.LAST_REPORTS.clear()
    got = _compile(f, fallback="eager", cpu="emulate")(s, v)
    got.backward()
    gs, gv = s.grad.clone(), v.grad.clone()
    s.grad = v.grad = None
    want = f(s, v)
    want.backward()
    assert abs(got.item() - want.item()) < 1e-5 and torch.allclose(gs, s.grad, atol=1e-6)
    assert torch.allclose(gv, v.grad, atol=1e-6)
    fwd = [x for r in torch_backend.LAST_REPORTS for x in r.stitched if x.graph == "forward"]
    assert fwd and all("aten.clone" not in x.ops for x in fwd), fwd
    assert any("aten._softmax" in x.ops for x in fwd), fwd
