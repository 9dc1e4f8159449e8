"""A tiny Phi-3 (transformers ``Phi3Config``: hidden 32, 2 heads, 1 key/value head, 1 layer, eager
attention, random weights, nothing downloaded) under ``torch.compile(backend="stitchtune")`` on the
CPU (emulated kernels): the rotary of q and of k is stitched, k's together with its slice of the fused
``qkv_proj`` output and its head split (one chain of the region's input), v's slice with its head split
and repeat is a region too, and the output equals eager within 1e-5. q's head permute still runs in
PyTorch: in the region the finder first tries, q's, k's and v's slices share one view of the
projection with different head counts, which the planner refuses naming q's permute."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from helpers import explain_with_eager  # noqa: E402

pytestmark = pytest.mark.slow


def test_the_rotary_after_the_fused_qkv_split_is_stitched() -> None:
    torch.manual_seed(0)
    cfg = transformers.Phi3Config(hidden_size=32, num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1,
                                  intermediate_size=64, vocab_size=64, max_position_embeddings=16, pad_token_id=0,
                                  bos_token_id=0, eos_token_id=0)
    cfg._attn_implementation, cfg.use_cache = "eager", False
    model, ids = transformers.Phi3Model(cfg).eval(), torch.randint(0, 64, (2, 8))
    e, out = explain_with_eager(model, ids)
    want = out.last_hidden_state
    rotary = [s for s in e.stitched if {"aten.neg", "aten.cat", "aten.mul", "aten.add"} <= set(s.ops)]
    assert sum(s.ops.count("aten.neg") for s in rotary) == 2, str(e)   # q's and k's rotate_half
    assert any({"aten.slice", "aten.view", "aten.neg"} <= set(s.ops) for s in rotary), str(e)   # k with its split
    assert any(s.ops[:3] == ("aten.slice", "aten.view", "aten.permute") and "aten.neg" not in s.ops
               for s in e.stitched), str(e)   # v's split and repeat
    assert not [d for d in e.declined if d.reason.startswith("planner") and "permute_1" not in d.reason], str(e)
    assert (e.outputs.last_hidden_state - want).abs().max().item() < 1e-5
