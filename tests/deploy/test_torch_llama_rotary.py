"""A tiny grouped-query Llama (transformers LlamaConfig: 2 layers, hidden 32, 4 heads, 2 key/value
heads, eager attention, random weights, nothing downloaded) under torch.compile(backend="stitchtune")
on the CPU (emulated kernels): the rotary embeddings of q and k of a layer are one region (the
angles computed in it, the head permutes, rotate_half, mul / add: q's 4 heads and k's 2 iterated by
one kernel, plan.chains.part_domains), the key / value repeat of ``repeat_kv`` is stored by the region
that makes k (or permutes v), nothing in between is declined by the planner, and the outputs equal
eager within 1e-5. About 25 s on the shared 2-core machine (dynamo tracing)."""

from __future__ import annotations

from typing import Any

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from helpers.torch_models import explain_with_eager  # noqa: E402
from stitchtune.deploy import torch_backend  # noqa: E402

pytestmark = pytest.mark.slow


def _llama() -> tuple[Any, Any]:
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                                   intermediate_size=64, vocab_size=64, max_position_embeddings=16)
    cfg._attn_implementation = "eager"
    cfg.use_cache = False
    return transformers.LlamaModel(cfg).eval(), torch.randint(0, 64, (1, 8))


def test_rotary_is_one_region_per_layer_and_repeat_kv_is_stitched() -> None:
    model, ids = _llama()
    e, out = explain_with_eager(model, ids)
    want = out.last_hidden_state
    rotary = [s for s in e.stitched if "aten.cat" in s.ops and "aten.cos" in s.ops]
    # q and k of each layer together: cos / sin, the head permutes, rotate_half (slice, neg, cat), mul / add
    assert len(rotary) == 2, str(e)
    for s in rotary:
        assert {"aten.sin", "aten.permute", "aten.slice", "aten.neg", "aten.mul", "aten.add"} <= set(s.ops), s.ops
        assert s.ops.count("aten.cat") == 2 and {(8, 32), (8, 16)} <= set(s.shapes), s   # q's and k's
    # the region stores k's grouped copy (expand + clone) for the scores; v's head permute does too
    assert [s.ops.count("aten.expand") for s in rotary] == [2, 2], str(e)  # angles + k's copy
    assert sum({"aten.permute", "aten.expand"} <= set(s.ops) and "aten.cat" not in s.ops for s in e.stitched) == 2
    assert not [d for d in e.declined if d.reason.startswith("planner")], str(e)
    assert not [d for d in e.declined if "aten.expand" in d.what or "aten.clone" in d.what], str(e)
    got = e.outputs.last_hidden_state
    assert got.shape == want.shape
    assert (got - want).abs().max().item() < 1e-5


def test_rotary_regions_run_under_dynamic_shapes(caplog: pytest.LogCaptureFixture) -> None:
    """With ``dynamic=True`` the rotary outputs are PyTorch's permuted ``[1, heads, s, 8]`` tensors
    (stored ``[1, s, heads, 8]``): the regions keep that layout for symbolic ``s`` (the traced
    length 8 equals the head dim, where a concrete re-trace ties), pass the fake check, and their
    kernels (emulated) run at two lengths with eager's outputs."""
    import logging

    model, ids = _llama()
    torch_backend.LAST_REPORTS.clear()
    try:
        compiled = torch.compile(model, backend="stitchtune", dynamic=True,
                                 options={"db": None, "fallback": "eager", "cpu": "emulate"})
        with torch.no_grad(), caplog.at_level(logging.WARNING, logger="stitchtune.deploy.torch_ops"):
            for n in (8, 11):
                x = torch.randint(0, 64, (1, n))
                got, want = compiled(x).last_hidden_state, model(x).last_hidden_state
                assert got.shape == want.shape and (got - want).abs().max().item() < 1e-5, n
    finally:
        torch._dynamo.reset()
    stitched = [s for r in torch_backend.LAST_REPORTS for s in r.stitched]
    # q and k apart, 2 layers: under dynamic shapes repeat_kv's expand reads a SymInt (declined), so
    # k's region has no grouped copy of q's size and the two parts are not joined (plan.axes)
    assert sum({"aten.cat", "aten.neg", "aten.permute"} <= set(s.ops) for s in stitched) == 4
    assert not [d for r in torch_backend.LAST_REPORTS for d in r.declined if "fake" in d.reason]
    assert not [m for m in caplog.messages if "no kernel" in m and "cat" in m], caplog.messages


def test_the_saved_rotary_angles_are_stored_by_a_rotary_region() -> None:
    """In a training step the forward returns the rotary angles (``cos`` / ``sin`` times the attention
    scaling, saved for the backward). The first rotary region, which computes them anyway, stores them
    as outputs: nothing of the angles is left to Inductor in the forward graph's rest (before, one
    kernel computed them once more), and the step's loss and gradients equal eager's."""
    from stitchtune.deploy.model_tuning import capture_graphs

    model, ids = _llama()
    model.train()
    (fwd,) = [g for g in capture_graphs(model, (ids,), "train") if g.kind == "forward"]
    model.zero_grad(set_to_none=True)   # (capturing ran the step)
    opts = torch_backend.BackendOptions.from_options({"db": None, "cpu": "reference"})
    gm, report = torch_backend.stitch_graph(fwd.module, list(fwd.example_inputs), opts, "forward")
    rest = {str(n.target) for n in gm.graph.nodes if n.op == "call_function"}
    assert not {"aten.cos.default", "aten.sin.default", "prims.iota.default"} & rest, sorted(rest)
    rotary = [s for s in report.stitched if "aten.cat" in s.ops and "aten.cos" in s.ops]
    assert len(rotary) == 2, [s.ops for s in report.stitched]
    torch._dynamo.reset()
    compiled = torch.compile(model, backend="stitchtune", options={"db": None, "fallback": "eager", "cpu": "emulate"})
    try:
        got = compiled(ids).last_hidden_state
        (got ** 2).mean().backward()
        g_got = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
        model.zero_grad(set_to_none=True)
        want = model(ids).last_hidden_state
        (want ** 2).mean().backward()
    finally:
        torch._dynamo.reset()
    assert (got - want).abs().max().item() < 1e-5
    scale = max(p.grad.abs().max().item() for p in model.parameters() if p.grad is not None)
    assert g_got and all((g_got[n] - p.grad).abs().max().item() <= 1e-4 * scale
                         for n, p in model.named_parameters() if n in g_got)
