"""scripts/kernel_counts.py on one tiny model: kernels per step (stitched + Inductor's for the rest)
against Inductor alone, and the ideal count of convex memory-intensive regions."""

from __future__ import annotations

import importlib.util
from typing import Any

import pytest

from helpers.common import REPO

torch = pytest.importorskip("torch")


def _script() -> Any:
    spec = importlib.util.spec_from_file_location("kernel_counts", REPO / "scripts" / "kernel_counts.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


class Residual(torch.nn.Module):
    """ln -> linear -> (+ ln's output) -> gelu: the residual add reads a value from before the matmul,
    yet the ideal is two regions (ln; add+gelu), never one (a region around a matmul is not convex)."""

    def __init__(self) -> None:
        super().__init__()
        self.ln = torch.nn.LayerNorm(32)
        self.fc = torch.nn.Linear(32, 32)

    def forward(self, x: Any) -> Any:
        h = self.ln(x * 2.0)
        return torch.nn.functional.gelu(self.fc(h) + h)


def test_ideal_regions_are_convex_and_views_are_free() -> None:
    from stitchtune.deploy.model_tuning import capture_graphs

    kc = _script()
    (g,) = capture_graphs(Residual(), (torch.randn(4, 8, 32),), "inference")
    assert g.kind == "inference"
    assert kc.ideal_regions(g.module) == 2


def test_a_node_of_graph_inputs_only_joins_the_region_it_feeds_after_a_matmul() -> None:
    """``r * 0.9`` reads only a graph input: it can run as late as the add after the matmul, so the
    ideal is one region of it, the add and the exp, and two when a matmul lies between them."""
    from torch.fx.experimental.proxy_tensor import make_fx

    kc = _script()
    x, w, r = torch.randn(4, 8), torch.randn(8, 8), torch.randn(4, 8)
    late = make_fx(lambda x, w, r: ((x @ w) + r * 0.9).exp())(x, w, r)
    assert kc.ideal_regions(late) == 1
    cut = make_fx(lambda x, w, r: ((r * 0.9) @ w + r.exp()).exp())(x, w, r)
    assert kc.ideal_regions(cut) == 2   # r * 0.9 feeds the matmul; the rest is one region


def test_aten_fallbacks_of_memory_intensive_ops_count_as_kernels_and_library_calls_do_not() -> None:
    from types import SimpleNamespace

    kc = _script()

    def extern(name: str) -> Any:
        return SimpleNamespace(node=SimpleNamespace(python_kernel_name=name))

    assert kc._fallback_kernel(extern("torch.ops.aten.rand.default"))       # dropout's rand, eagerly
    assert kc._fallback_kernel(extern("aten.randint.low_out"))              # Inductor's seeds
    for name in ("extern_kernels.mm", "torch.ops.aten.convolution_backward.default",
                 "torch.ops.stitchtune.region.default", ""):
        assert not kc._fallback_kernel(extern(name)), name


def test_strided_region_inputs_count_as_copies_unless_read_in_memory_order() -> None:
    """The region op makes a strided input contiguous before it launches (one copy kernel) unless its
    graph declares that input in its memory order (``input_perms``: a free permuted view): counted per
    registered kernel by the strides of the graph's fake values; contiguous inputs and other calls not."""
    import dataclasses

    import torch.fx
    from torch.fx.experimental.proxy_tensor import make_fx

    from stitchtune.deploy import torch_ops
    from stitchtune.deploy.torch_guard import GuardedRegion
    from stitchtune.deploy.compiled import compile as compile_graph
    from stitchtune.importers.torch_regions import find_regions

    kc = _script()
    nchw = torch.empty(1, 4, 4, 8).permute(0, 3, 1, 2)   # NCHW view of channels-last memory
    gm = make_fx(lambda y: torch.nn.functional.layer_norm(y.permute(0, 2, 3, 1), (8,)), tracing_mode="fake")(nchw)
    [region] = find_regions(gm).regions
    assert region.input_perms == ((0, 2, 3, 1),)
    cg = compile_graph(region.graph, db=None, device="h200", build=False)
    reads = torch_ops.RegionKernel(region.name, region.ops, cg, in_perms=region.input_perms)
    torch_ops.register("k-reads", GuardedRegion(reads, region.module, (None,)))
    torch_ops.register("k-copies", GuardedRegion(dataclasses.replace(reads, in_perms=()), region.module,
                                                           (None,)))
    g = torch.fx.Graph()
    a, b = g.placeholder("a"), g.placeholder("b")
    a.meta["val"], b.meta["val"] = nchw, torch.empty(1, 8, 4, 4)
    r1 = g.call_function(torch.ops.stitchtune.region.default, ("k-copies", [a]))
    r2 = g.call_function(torch.ops.stitchtune.region.default, ("k-reads", [a]))
    r3 = g.call_function(torch.ops.stitchtune.region.default, ("k-copies", [b]))
    other = g.call_function(torch.ops.aten.add.Tensor, (a, b))
    g.output((r1, r2, r3, other))
    assert kc.input_copies(torch.fx.GraphModule(torch.nn.Module(), g)) == 1


@pytest.mark.slow
def test_counts_of_one_step_add_up() -> None:
    """Inductor's kernels come from its scheduler (one per fused loop nest that code is generated
    for); the backend's are its stitched kernels plus Inductor's for what is left."""
    kc = _script()
    torch.manual_seed(0)
    row = {"model": "residual", "mode": "inference", "status": "ran",
           **kc.count_step(Residual().eval(), (torch.randn(4, 8, 32),), "inference")}
    assert row["graphs"] == ["inference"] and row["ideal"] == 2
    assert row["regions"] == 2 and row["stitched"] == 2        # ln (with x * 2) and add + gelu
    assert row["backend"] == row["stitched"] + row["rest"] + row["copies"] and row["rest"] == 0
    assert row["copies"] == 0   # every region input is contiguous here
    assert row["inductor"] >= 2 and row["cpp_functions"]["inductor"] >= 1
    lines = kc.markdown([row, {"model": "m", "mode": "train", "status": "failed", "reason": "why"}])
    assert lines[2].startswith("| ") and "failed: why" in lines[3]
    assert kc.main(["--models", "bert,t5"]) == 2


def test_the_labels_variants_return_the_causal_lm_loss() -> None:
    """``--models gpt2-labels,llama-labels``: the causal LM with its head called with ``labels=`` (the
    first three ignored), its output the 0-d loss; no other model has the variant."""
    pytest.importorskip("transformers")
    kc = _script()
    assert kc.LABELS_MODELS == ("gpt2-labels", "llama-labels") and not set(kc.LABELS_MODELS) & set(kc.MODELS)
    build = kc._coverage().build_model
    model, (ids, labels), names = build("gpt2", labels=True)
    assert names == ["input_ids", "labels"] and (labels[:, :3] == -100).all()
    with torch.no_grad():
        loss = model(ids, labels)
    assert loss.dim() == 0 and bool(torch.isfinite(loss))
    with pytest.raises(ValueError, match="gpt2 and llama only"):
        build("bert", labels=True)
    assert kc.main(["--models", "bert-labels"]) == 2


def test_phi3_and_swin_are_counted_by_default() -> None:
    """Phi-3 (fused ``qkv_proj`` / ``gate_up_proj``, split in the graph) and Swin (4x4 windows, the second
    block shifted) are in the default list; ``build_model`` makes them small, and they run."""
    pytest.importorskip("transformers")
    kc = _script()
    assert {"phi3", "swin"} <= set(kc.MODELS)
    build = kc._coverage().build_model
    phi3, args, names = build("phi3")
    assert names == ["input_ids", "attention_mask"] and hasattr(phi3.m.layers[0].self_attn, "qkv_proj")
    swin, pixels, names = build("swin")
    assert names == ["pixel_values"]
    blocks = swin.m.encoder.layers[0].blocks
    assert len(blocks) == 2 and blocks[0].shift_size == 0 and blocks[1].shift_size > 0
    with torch.no_grad():
        for model, a in ((phi3, args), (swin, pixels)):
            out = model(*a)
            assert out.shape[0] == 1 and bool(torch.isfinite(out).all())
