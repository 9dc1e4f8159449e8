"""Issue 40: ``mode="reduce-overhead"`` / ``options={"cudagraphs": True}`` (stitchtune.deploy.torch_graphs).
Capture itself needs a GPU (scripts/gpu_models.py checks replay against eager and times both modes;
tests/gpu/test_stub_driver.py drives a region's capture and replay through the stub libcuda); here the
CPU parts: the option, what Inductor and Inductor's CUDA-graph trees are handed, and that a graph they
cannot capture (CPU tensors) runs as it is."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from stitchtune.deploy import torch_backend, torch_graphs  # noqa: E402
from stitchtune.deploy.torch_backend import BackendOptions  # noqa: E402
from stitchtune.errors import StitchtuneError  # noqa: E402


class _Net(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.ln = torch.nn.LayerNorm(16)

    def forward(self, x):
        return torch.relu(self.ln(x)) * 2


def test_the_option_is_validated() -> None:
    assert BackendOptions.from_options({"cudagraphs": True}).cudagraphs is True
    assert BackendOptions.from_options({}).cudagraphs is None
    with pytest.raises(StitchtuneError, match="cudagraphs"):
        BackendOptions.from_options({"cudagraphs": "yes"})


@pytest.mark.parametrize("how", ["eager", "inductor", "mode"])
def test_reduce_overhead_hands_the_stitched_graph_to_the_cudagraph_trees(how, fresh_backend, monkeypatch) -> None:
    """With CPU tensors the trees would skip the graph; here check_for_skip is told it may capture and
    cudagraphify_impl records what it gets: the stitched graph (its region call inside), the fixed
    (parameter) inputs, inference. Inductor gets cudagraphs=True and the parameters as static inputs."""
    import torch._dynamo.backends.cudagraphs as dyn_cg
    import torch._inductor.compile_fx as cfx
    import torch._inductor.cudagraph_trees as trees

    seen = {}

    def fake_cudagraphify(run, inputs, static, **kw):
        seen.update(run=run, n=len(inputs), static=list(static), **kw)
        def call(args):
            seen["calls"] = seen.get("calls", 0) + 1
            return run(args)
        return call

    inner = cfx.compile_fx_inner

    def spy_inner(gm, inputs, **kw):
        seen.update(inductor={k: kw[k] for k in ("cudagraphs", "static_input_idxs") if k in kw})
        kw.pop("cudagraphs", None)   # CPU: compile without capture
        return inner(gm, inputs, **kw)

    monkeypatch.setattr(trees, "cudagraphify_impl", fake_cudagraphify)
    monkeypatch.setattr(dyn_cg, "check_for_skip", lambda gm, fixed: None)
    monkeypatch.setattr(dyn_cg, "get_device_index", lambda gm: 0)
    monkeypatch.setattr(cfx, "compile_fx_inner", spy_inner)
    net = _Net().eval()
    x = torch.randn(4, 16)
    if how == "mode":   # torch.compile takes a mode or options, not both: the mode alone turns it on
        compiled = torch.compile(net, backend="stitchtune", mode="reduce-overhead")
    else:
        compiled = torch.compile(net, backend="stitchtune", options={"db": None, "fallback": how, "cudagraphs": True})
    with torch.no_grad():
        assert torch.allclose(compiled(x), net(x), atol=1e-5)
        compiled(x)
    assert sum(len(r.stitched) for r in torch_backend.LAST_REPORTS) >= 1
    if how == "eager":
        assert seen["calls"] == 2 and seen["is_inference"] and not seen["is_backward"]
        assert seen["device_index"] == 0 and seen["n"] == 3 and seen["static"] == [0, 1]   # weight, bias
    else:
        assert bool(seen["inductor"]["cudagraphs"]) and list(seen["inductor"]["static_input_idxs"]) == [0, 1]


def test_cpu_graphs_are_not_captured_and_run(fresh_backend, caplog) -> None:
    net = _Net().eval()
    x = torch.randn(4, 16)
    compiled = torch.compile(net, backend="stitchtune", options={"db": None, "fallback": "eager", "cudagraphs": True})
    with caplog.at_level("INFO", logger=torch_graphs.__name__), torch.no_grad():
        assert torch.allclose(compiled(x), net(x), atol=1e-5)
    assert "not captured in a CUDA graph" in caplog.text


def test_off_by_default() -> None:
    assert torch_graphs.GraphMode(False).wrap("run", None, [], "inference") == "run"
    assert torch_graphs.GraphMode(False).inductor_kwargs(None, [], "forward") == {}


@pytest.mark.slow
def test_gpu_models_graphs_phase_dry_run_on_the_cpu(tmp_path, capsys) -> None:
    """scripts/gpu_models.py --phases graphs: its CPU dry run (nothing captured) compares the replayed
    output with eager for both variants and writes a table row for each."""
    import importlib.util
    import json

    pytest.importorskip("transformers")
    from helpers.common import REPO

    spec = importlib.util.spec_from_file_location("gpu_models", REPO / "scripts" / "gpu_models.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    assert mod.main(["--cpu", "--phases", "graphs", "--time-models", "bert", "--modes", "inference",
                     "--iters", "2", "--out", str(tmp_path)]) == 0
    rows = [json.loads(x) for x in (tmp_path / "gpu_models.jsonl").read_text().splitlines()]
    assert [r["variant"] for r in rows] == ["stitchtune", "stitchtune+cudagraphs"]
    assert all(r["ok"] and r["stitched"] > 0 and r["median_us"] > 0 for r in rows), rows
    assert "| bert | inference | stitchtune+cudagraphs | pass |" in (tmp_path / "gpu_models.md").read_text()
