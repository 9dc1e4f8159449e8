"""End to end: a tiny BERT (transformers config, random weights, nothing downloaded) compiled once with
torch.compile(dynamic=True, backend="stitchtune") and called at 12 sequence lengths over 3 buckets
(2-32, 33-64, 65-128): no recompile, the output equal to eager at every length (emulated
kernels on the CPU), and one kernel per region per bucket, the embedding region (word-embedding
gather by the ids, position and type embeddings, layer norm) included. scripts/dynamic_shapes.py runs
the same over 100 lengths in 1..2048."""

from __future__ import annotations

from typing import Any

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

import stitchtune.torch as st_torch  # noqa: E402
from stitchtune.deploy import torch_ops  # noqa: E402
from stitchtune.deploy.torch_region_dynamic import DynamicRegionKernel  # noqa: E402

pytestmark = pytest.mark.usefixtures("fresh_backend")

LENGTHS = (2, 3, 5, 9, 16, 17, 24, 31, 33, 47, 64, 65)
BUCKETS = 3


@pytest.mark.slow
def test_a_dynamic_bert_builds_one_kernel_per_region_and_bucket_and_matches_eager() -> None:
    torch.manual_seed(0)
    cfg = transformers.BertConfig(hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64,
                                  vocab_size=64, max_position_embeddings=128)
    model = transformers.BertModel(cfg).eval()
    before = list(torch_ops._registry)
    c = torch.compile(model, backend="stitchtune", dynamic=True, options={"db": None, "fallback": "eager"})
    torch._dynamo.utils.counters.clear()
    with torch.no_grad():
        for n in LENGTHS:
            ids = torch.randint(0, 64, (1, n))
            got, want = c(ids).last_hidden_state, model(ids).last_hidden_state
            assert got.shape == want.shape and (got - want).abs().max().item() < 1e-5, n
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] == 1   # one graph for every length
    s = st_torch.stats()
    dynamic = [r for r in s.regions if r.dynamic]
    assert len(dynamic) >= 4 and s.eager == 0
    kernels: dict[str, Any] = {key.split("#")[0]: g.kernel for key, g in torch_ops._registry.items()
                               if key not in before and isinstance(g.kernel, DynamicRegionKernel)}
    for r in dynamic:
        entries = kernels[r.region].entries()
        assert r.selections == r.builds + 1 and r.builds + r.hits == len(LENGTHS)
        assert all(e is not None and e.generic for _, _, e in entries), r
        assert r.builds == len(entries) == BUCKETS, r
    assert any("aten.embedding" in r.ops for r in dynamic)   # the embedding region is one of them
