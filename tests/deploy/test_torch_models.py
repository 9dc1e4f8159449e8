"""Small BERT, Llama and ViT blocks (transformers configs, random weights, nothing downloaded) under
torch.compile(backend="stitchtune") on the CPU: outputs match eager, regions are stitched (emulated).
Most of each test's time is dynamo tracing the transformers model (BERT ~7 s, Llama ~5 s, ViT ~2 s on
the shared 2-core machine); Inductor for the rest is covered by tests/deploy/test_torch_backend.py."""

from __future__ import annotations

from typing import Any

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from stitchtune.deploy import torch_backend  # noqa: E402


def _bert() -> tuple[Any, tuple[Any, ...]]:
    cfg = transformers.BertConfig(hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64,
                                  vocab_size=64, max_position_embeddings=16)
    return transformers.BertModel(cfg), (torch.randint(0, 64, (1, 8)),)


def _llama() -> tuple[Any, tuple[Any, ...]]:
    cfg = transformers.LlamaConfig(hidden_size=32, num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=2,
                                   intermediate_size=64, vocab_size=64, max_position_embeddings=16)
    return transformers.LlamaModel(cfg), (torch.randint(0, 64, (1, 8)),)


def _vit() -> tuple[Any, tuple[Any, ...]]:
    cfg = transformers.ViTConfig(hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64,
                                 image_size=16, patch_size=8, num_channels=3)
    return transformers.ViTModel(cfg), (torch.randn(1, 3, 16, 16),)


MODELS = {"bert": _bert, "llama": _llama, "vit": _vit}


@pytest.fixture(autouse=True)
def _reset() -> Any:
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


@pytest.mark.parametrize("name", [pytest.param("bert", marks=pytest.mark.slow),
                                  pytest.param("llama", marks=pytest.mark.slow), "vit"])
def test_model_matches_eager_with_stitched_regions(name: str) -> None:
    torch.manual_seed(0)
    model, args = MODELS[name]()
    model.eval()
    with torch.no_grad():
        want = model(*args).last_hidden_state
    e = torch_backend.explain(model, *args, db=None, fallback="eager", cpu="emulate")
    assert len(e.stitched) >= 3, str(e)
    assert all(s.source == "heuristic" for s in e.stitched)
    got = e.outputs.last_hidden_state   # what the compiled model returned
    assert got.shape == want.shape
    assert (got - want).abs().max().item() < 1e-4
