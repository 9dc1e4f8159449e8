"""The region op reads an input that PyTorch holds permuted (a convolution's channels-last output seen
as NCHW) in place: the kernel gets the permuted view of its memory (no copy kernel), on the CPU paths
and the launch path, and the torch backend's ConvNeXt regions copy none of their inputs."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

torch = pytest.importorskip("torch")

from stitchtune.deploy import torch_backend, torch_ops  # noqa: E402
from stitchtune.deploy.compiled import compile as compile_graph  # noqa: E402
from stitchtune.deploy.torch_ops import RegionKernel  # noqa: E402
from stitchtune.importers.torch_regions import find_regions  # noqa: E402

C = 8


def _ln_residual(y: Any, g: Any, b: Any) -> Any:
    """ConvNeXt's block end: a channels-last layer norm of ``y`` (NCHW view) plus ``y`` itself in NCHW."""
    z = torch.nn.functional.layer_norm(y.permute(0, 2, 3, 1), (C,), g, b)
    return z.permute(0, 3, 1, 2) * 0.5 + y


def _channels_last(h: int = 4, w: int = 4, seed: int = 0) -> Any:
    return torch.randn(1, h, w, C, generator=torch.Generator().manual_seed(seed)).permute(0, 3, 1, 2)


@pytest.fixture(scope="module")
def region() -> Any:
    from torch.fx.experimental.proxy_tensor import make_fx

    gm = make_fx(_ln_residual, tracing_mode="fake")(_channels_last(), torch.randn(C), torch.randn(C))
    [r] = find_regions(gm).regions
    assert r.input_perms[0] == (0, 2, 3, 1)
    return r


def _args(r: Any, y: Any) -> tuple[list[Any], Any]:
    """(the region's inputs for ``y``, in its input order; eager's result on them)."""
    g = torch.Generator().manual_seed(1)
    by_name = {"y": y, "g": torch.randn(C, generator=g), "b": torch.randn(C, generator=g)}
    return [by_name[n.name.split("_")[0]] for n in r.inputs], _ln_residual(*by_name.values())


@pytest.mark.parametrize("cpu", ["emulate", "reference"])
def test_the_kernel_reads_the_permuted_view_and_equals_eager(region: Any, cpu: str,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """No copy of the strided input (the kernel reads a view of its storage), PyTorch's value; an input
    arriving with other strides than the region was found with (contiguous NCHW) is copied into the
    memory order the graph declares, and gives the same value."""
    cg = compile_graph(region.graph, db=None, device="h200", build=False)
    k = RegionKernel(region.name, region.ops, cg, cpu=cpu, out_shapes=region.output_shapes,
                     in_perms=region.input_perms)
    read: list[list[Any]] = []
    as_read = RegionKernel.as_read
    monkeypatch.setattr(RegionKernel, "as_read", lambda self, ins: read.append(as_read(self, ins)) or read[-1])
    y = _channels_last(seed=4)
    args, want = _args(region, y)
    for inputs in (args, [t.contiguous() for t in args]):
        [out] = k(inputs)
        restored = out.permute(region.restore_perm(0))
        assert restored.shape == want.shape and torch.allclose(restored, want, atol=1e-5)
    assert k.copies(args) == 0 and k.copies([t.contiguous() for t in args]) == 1
    strided = read[0][[n.name.startswith("y") for n in region.inputs].index(True)]
    assert strided.is_contiguous() and strided.data_ptr() == y.data_ptr() and strided.shape == (1, 4, 4, C)


def test_the_launch_path_binds_the_strided_inputs_own_pointer(region: Any) -> None:
    """Over the fake driver: the kernels are launched with the channels-last tensor's own storage
    pointer (no copy made before the launch)."""
    from stitchtune.gpu.fake_driver import FakeDriver

    cg = compile_graph(region.graph, db=None, device="h200", build=False)
    drv = FakeDriver()
    k = RegionKernel(region.name, region.ops, dataclasses.replace(cg, cubin=b"FAKE"), driver=drv,
                     out_shapes=region.output_shapes, in_perms=region.input_perms)
    y = _channels_last(seed=5)
    args, _ = _args(region, y)
    [out] = k(args)
    i = [n.name.startswith("y") for n in region.inputs].index(True)
    name = region.graph.inputs[i][0]
    bufs = {b.name: b.tensor for b in cg.program.buffers}
    bound = {bufs.get(a): v for ln, spec in zip(drv.launches, cg.program.launches) for a, v in zip(spec.args, ln.args)}
    assert drv.launches and bound[name] == y.data_ptr()
    assert bound[region.graph.outputs[0]] == out.data_ptr()


class _Block(torch.nn.Module):
    """A ConvNeXt block in small: the stem's channels-last layer norm viewed back as NCHW, a depthwise
    convolution (its output channels-last in memory), the layer norm after its permute, and the
    residual sum in NCHW."""

    def __init__(self) -> None:
        super().__init__()
        self.stem = torch.nn.LayerNorm(C)
        self.dw = torch.nn.Conv2d(C, C, 3, padding=1, groups=C)
        self.norm = torch.nn.LayerNorm(C)

    def forward(self, x: Any) -> Any:          # x: [1, H, W, C]
        h = self.stem(x).permute(0, 3, 1, 2)
        y = self.norm(self.dw(h).permute(0, 2, 3, 1))
        return y.permute(0, 3, 1, 2) + h


def test_a_compiled_channels_last_block_copies_no_region_input(fresh_backend: Any,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """Under ``torch.compile(backend="stitchtune")`` (emulated kernels) every input a region's kernel
    reads is a view of the tensor the graph handed it, and the result equals eager."""
    copied: list[str] = []
    as_read = RegionKernel.as_read

    def spy(self: Any, inputs: Any) -> Any:
        out = as_read(self, inputs)
        copied.extend(self.name for t, o in zip(inputs, out) if o.data_ptr() != t.data_ptr())
        return out

    monkeypatch.setattr(RegionKernel, "as_read", spy)
    torch.manual_seed(0)
    model = _Block().eval()
    x = torch.randn(1, 5, 6, C)
    torch_backend.LAST_REPORTS.clear()
    compiled = torch.compile(model, backend=torch_backend.stitchtune_backend,
                             options={"db": None, "fallback": "eager", "cpu": "emulate"})
    with torch.no_grad():
        got, want = compiled(x), model(x)
    assert torch.allclose(got, want, atol=1e-5)
    stitched = [s for r in torch_backend.LAST_REPORTS for s in r.stitched]
    assert len(stitched) >= 2 and not copied, (stitched, copied)


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["inference", "train"])
def test_convnexts_regions_copy_no_inputs(mode: str) -> None:
    """The small ConvNeXt of the kernel counts: every region of its inference graph, and of its training
    step's forward and backward, reads its channels-last inputs in place (``GuardedRegion.copies`` is 0
    for every call of the stitched graphs), and no region is declined for it."""
    import importlib.util
    from pathlib import Path

    from stitchtune.deploy.model_tuning import capture_graphs

    path = Path(__file__).resolve().parents[2] / "scripts" / "model_coverage.py"
    spec = importlib.util.spec_from_file_location("model_coverage", path)
    assert spec is not None and spec.loader is not None
    mc = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mc)
    model, args, _ = mc.build_model("convnext")
    model.train(mode == "train")
    opts = torch_backend.BackendOptions.from_options({"db": None, "cpu": "reference"})
    strided = copies = 0
    for g in capture_graphs(model, args, mode):
        gm, report = torch_backend.stitch_graph(g.module, list(g.example_inputs), opts, g.kind)
        assert report.stitched and not [d for d in report.declined if d.what.startswith("region")], report
        for node in gm.graph.nodes:
            if node.op == "call_function" and node.target is torch.ops.stitchtune.region.default:
                vals = [a.meta["val"] for a in node.args[1]]
                strided += sum(not v.is_contiguous() for v in vals)
                copies += torch_ops.lookup(node.args[0]).copies(vals)
    # (train: 11 since a slice of a region's input read outside it is an alias of that input, not an output)
    assert strided >= (4 if mode == "inference" else 11) and copies == 0
