"""A tiny Phi-3 (transformers ``Phi3Config``: hidden 32, 2 heads, 1 key/value head, 1 layer, eager
attention, random weights, nothing downloaded) under ``torch.compile(backend="stitchtune")`` on the
CPU (emulated kernels): the rotary of q and of k is stitched, k's together with its slice of the fused
``qkv_proj`` output and its head split (one chain of the region's input), v's slice with its head split
and repeat is a region too, and the output equals eager within 1e-5. In the region the finder first tries, q's, k's and v's
slices share one view of the projection with different head counts: the planner refuses naming the
chains to keep apart (``SeparateRegionsError``) and the finder cuts q's chain, then k's, off that view
(``torch_cuts.chain_cut``), so no permute is left to PyTorch and no region is declined. A training
step stitches regions in the forward and the backward graph, none declined whole, and its gradients
equal eager's within 1e-4."""

from __future__ import annotations

from typing import Any

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from helpers.torch_models import explain_with_eager  # noqa: E402

from stitchtune.deploy import torch_backend  # noqa: E402

pytestmark = pytest.mark.slow


def _phi3() -> tuple[Any, Any]:
    torch.manual_seed(0)
    cfg = transformers.Phi3Config(hidden_size=32, num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1,
                                  intermediate_size=64, vocab_size=64, max_position_embeddings=16, pad_token_id=0,
                                  bos_token_id=0, eos_token_id=0)
    cfg._attn_implementation, cfg.use_cache = "eager", False
    return transformers.Phi3Model(cfg), torch.randint(0, 64, (2, 8))


def test_the_rotary_after_the_fused_qkv_split_is_stitched() -> None:
    model, ids = _phi3()
    e, out = explain_with_eager(model.eval(), ids)
    want = out.last_hidden_state
    rotary = [s for s in e.stitched if {"aten.neg", "aten.cat", "aten.mul", "aten.add"} <= set(s.ops)]
    assert sum(s.ops.count("aten.neg") for s in rotary) == 2, str(e)   # q's and k's rotate_half
    assert any({"aten.slice", "aten.view", "aten.neg"} <= set(s.ops) for s in rotary), str(e)   # k with its split
    assert any("aten.slice" in s.ops and s.ops[s.ops.index("aten.slice"):][:3] == ("aten.slice", "aten.view", "aten.permute")
               and "aten.neg" not in s.ops for s in e.stitched), str(e)   # v's split and repeat
    assert not [d for d in e.declined if d.reason.startswith("planner")], str(e)   # q's chain cut off, not given up
    assert (e.outputs.last_hidden_state - want).abs().max().item() < 1e-5


def test_a_training_step_stitches_the_backward_and_matches_eager() -> None:
    """The backward's ``up_states`` gradient (a view of a matmul's output times the saved ``silu``,
    concatenated with the gate's into the fused ``gate_up`` gradient) is a region's node: it is not
    pulled into the region that reads it as a broadcast source (which once left the rewritten graph
    without the view it reads, ``KeyError``, and declined every region of the backward)."""
    model, ids = _phi3()
    model.train()
    torch._dynamo.reset()
    torch_backend.LAST_REPORTS.clear()
    compiled = torch.compile(model, backend=torch_backend.stitchtune_backend,
                             options={"db": None, "fallback": "eager", "cpu": "emulate"})
    try:
        got = compiled(ids).last_hidden_state
        (got ** 2).mean().backward()
        reports = list(torch_backend.LAST_REPORTS)
    finally:
        torch._dynamo.reset()
    g_got = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    model.zero_grad(set_to_none=True)
    want = model(ids).last_hidden_state
    (want ** 2).mean().backward()
    g_want = {n: p.grad for n, p in model.named_parameters() if p.grad is not None}
    assert len(reports) == 2, reports   # forward and backward
    for r in reports:
        assert r.stitched, r
        assert not [d for d in r.declined if d.what.startswith("region")], r.declined
    assert (got - want).abs().max().item() < 1e-4
    assert g_got.keys() == g_want.keys()
    scale = max(g.abs().max().item() for g in g_want.values())
    assert max((g_got[k] - g_want[k]).abs().max().item() for k in g_want) <= 1e-4 * scale
