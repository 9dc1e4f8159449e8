"""A tiny Phi-3 (transformers ``Phi3Config``: hidden 32, 2 heads, 1 key/value head, 1 layer, vocabulary
64, random weights, nothing downloaded) exported with the legacy (TorchScript) exporter and imported:
its fused ``qkv_proj`` is sliced into q, k and v, each viewed as heads; q and k are rotated
(``cat([rotated, q[..., rotary_dim:]])`` with an empty pass-through piece, which the import drops), k
and v are repeated for the grouped-query heads. Every imported subgraph plans (no refusal), matches
onnxruntime through the reference executor, and the head-split subgraphs emulate like the reference."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from helpers.lowering import check_emulates  # noqa: E402
from helpers.onnx_models import check_onnx_numerics  # noqa: E402
from stitchtune.importers.onnx_import import import_onnx  # noqa: E402
from stitchtune.plan.planner import make_plan  # noqa: E402

pytestmark = pytest.mark.slow   # the export (~10 s on the shared machine)


class _Hidden(torch.nn.Module):
    """The model's ``last_hidden_state`` for (ids, attention mask): a given mask keeps the export off
    the packed-sequence check (``torch.diff``, which the legacy exporter lacks)."""

    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        return self.model(input_ids=ids, attention_mask=mask).last_hidden_state


def _export(path, kv: int) -> dict[str, np.ndarray]:
    torch.manual_seed(0)
    cfg = transformers.Phi3Config(hidden_size=32, num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=kv,
                                  intermediate_size=64, vocab_size=64, max_position_embeddings=16, pad_token_id=0,
                                  bos_token_id=0, eos_token_id=0)
    cfg._attn_implementation, cfg.use_cache = "eager", False
    ids, mask = torch.randint(0, 64, (2, 8)), torch.ones(2, 8, dtype=torch.int64)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(_Hidden(transformers.Phi3Model(cfg).eval()), (ids, mask), str(path), dynamo=False,
                          input_names=["ids", "mask"], output_names=["y"])
    return {"ids": ids.numpy(), "mask": mask.numpy()}


@pytest.mark.parametrize("kv", [1, 2])
def test_every_subgraph_plans_and_matches_onnxruntime(tmp_path, kv: int) -> None:
    path = tmp_path / "phi3.onnx"
    feeds = _export(path, kv)
    res = import_onnx(path)
    for sg in res.subgraphs:
        make_plan(sg.graph)   # raises UnsupportedGraphError naming the problem on a refusal
    assert check_onnx_numerics(res, onnx.load(str(path)), feeds, tol=1e-5) >= len(res.subgraphs)
    split = [sg.graph for sg in res.subgraphs if {"slice", "reshape"} <= {n.op for n in sg.graph.nodes}]
    rotary = [g for g in split if {"neg", "concat", "mul"} <= {n.op for n in g.nodes}]
    assert len(rotary) == 2, [sorted({n.op for n in g.nodes}) for g in split]   # q's and k's, each one region
    for g in split:
        check_emulates(g, 1, 3)
