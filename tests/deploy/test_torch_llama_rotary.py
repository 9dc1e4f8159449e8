"""A tiny grouped-query Llama (transformers LlamaConfig: 2 layers, hidden 32, 4 heads, 2 key/value
heads, eager attention, random weights, nothing downloaded) under torch.compile(backend="stitchtune")
on the CPU (emulated kernels): each rotary embedding is one region (the angles computed again in
it, the head permute, rotate_half, mul / add), the key / value repeat of ``repeat_kv`` is stored by
the region that makes k (or permutes v), nothing in between is declined by the planner, and the
outputs equal eager within 1e-5. About 25 s on the shared 2-core machine (dynamo tracing)."""

from __future__ import annotations

from typing import Any

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from stitchtune.deploy import torch_backend  # noqa: E402

pytestmark = pytest.mark.slow


def _llama() -> tuple[Any, Any]:
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                                   intermediate_size=64, vocab_size=64, max_position_embeddings=16)
    cfg._attn_implementation = "eager"
    cfg.use_cache = False
    return transformers.LlamaModel(cfg).eval(), torch.randint(0, 64, (1, 8))


def test_rotary_is_one_region_per_tensor_and_repeat_kv_is_stitched() -> None:
    model, ids = _llama()
    with torch.no_grad():
        want = model(ids).last_hidden_state
        try:
            e = torch_backend.explain(model, ids, db=None, fallback="eager", cpu="emulate")
        finally:
            torch._dynamo.reset()
    rotary = [s for s in e.stitched if "aten.cat" in s.ops and "aten.cos" in s.ops]
    # q and k of each layer: cos / sin, the head permute, rotate_half (slice, neg, cat), mul / add
    assert len(rotary) == 4, str(e)
    for s in rotary:
        assert {"aten.sin", "aten.permute", "aten.slice", "aten.neg", "aten.mul", "aten.add"} <= set(s.ops), s.ops
    # k's rotary stores the grouped copy (expand + clone) for the scores; v's head permute does too
    assert sorted(s.ops.count("aten.expand") for s in rotary) == [1, 1, 2, 2], str(e)  # angles (+ k's copy)
    assert sum({"aten.permute", "aten.expand"} <= set(s.ops) and "aten.cat" not in s.ops for s in e.stitched) == 2
    assert not [d for d in e.declined if d.reason.startswith("planner")], str(e)
    assert not [d for d in e.declined if "aten.expand" in d.what or "aten.clone" in d.what], str(e)
    got = e.outputs.last_hidden_state
    assert got.shape == want.shape
    assert (got - want).abs().max().item() < 1e-5
