"""Greedy decoding with a KV cache through ``torch.compile(model, backend="stitchtune", dynamic=True)``
(issue 41, item 6): GPT-2, Llama, Qwen2, Phi-3 and Mistral (tiny transformers configs, 2 layers, random
weights, nothing downloaded; emulated kernels on the CPU), a 5-token prompt and 2 greedy steps with
the dynamic cache (the static cache for Llama). scripts/decode_matrix.py runs the same with 32 steps.

What holds today, asserted: the tokens equal eager's; dynamo compiles at most 3 graphs (the prompt,
the first step, the steps after it with the past length symbolic); no stitched region is declined or
runs its ATen ops; every norm of a decode step is stitched (no ``native_layer_norm``, RMSNorm ``mean``
/ ``pow`` / ``rsqrt`` among the declined ops: those were left out at batch 1 and one position); the
planner refuses no op (the rotary and the key / value cache concat of the Llama family plan: issue 41,
item 2); none of float64 scalar arithmetic (dynamo's symbolic floats), GPT-2's ``split`` or a decode
step's or a prompt's static-cache ``index_put`` is left out (items 2-3: written in place,
``deploy/torch_put``); no ``add`` reading a SymInt value (a decode step's positions, read through a bound
input: :mod:`stitchtune.importers.torch_symvalues`); and nothing memory-intensive is left out at all, with
either cache (ops reading SymInts as sizes, the prompt's ``iota(S)``, a static cache's ``full`` of a symbolic
shape, a mask's ``iota`` over the cache, read them from a carrier: :mod:`stitchtune.importers.torch_symsizes`)."""

from __future__ import annotations

import sys
from typing import Any

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from helpers.common import REPO  # noqa: E402

sys.path.insert(0, str(REPO / "scripts"))
import decode_matrix  # noqa: E402

pytestmark = [pytest.mark.usefixtures("fresh_backend"), pytest.mark.slow]

NORM_OPS = ("aten.native_layer_norm", "aten.mean", "aten.pow", "aten.rsqrt", "aten.var_mean")
SCALAR_OPS = ("prims.convert_element_type", "aten.true_divide", "aten.sqrt", "aten.split")


def _declined_op(what: str) -> str:
    return what.removeprefix("op ").split(" ")[0]


@pytest.mark.parametrize("model,cache", [("gpt2", "dynamic"), ("llama", "dynamic"), ("qwen2", "dynamic"),
                                         ("phi3", "dynamic"), ("mistral", "dynamic"), ("llama", "static")])
def test_greedy_decoding_is_stitched_and_equal_to_eager(model: str, cache: str) -> None:
    row: dict[str, Any] = decode_matrix.run_model(model, steps=2, prompt_len=5, cache_kind=cache, cpu="emulate",
                                                  shown=1000)
    assert row["tokens_equal"], row
    assert row["graphs"] <= 3, row
    assert row["stitched"] > 0 and row["eager"] == 0, row
    regions = [r for r in row["reasons"] if r.startswith("region ")]
    assert not regions, regions
    norms = [r for r in row["reasons"] if _declined_op(r) in NORM_OPS]
    assert not norms, norms
    planner = [r for r in row["reasons"] if "planner:" in r]
    assert not planner, planner
    left = [k for k in row["left_out"] if k.split(" ")[0] in SCALAR_OPS or "float64" in k
            or k.startswith("aten.index_put")]   # the static cache's writes, prompt and decode: in place
    assert not left, row["left_out"]
    # SymInt values (a decode step's positions arange(1) + past) are bound region inputs (torch_symvalues)
    sym = [k for k in row["left_out"] if k.startswith("aten.add ")]
    assert not sym, row["left_out"]
    # GPT-2's position embedding, the Llama family's iota(S), the static cache's lazy zeros, its mask and
    # its writes (in place): nothing memory-intensive left out, with either cache
    assert not row["left_out"], row["left_out"]


def test_phi3_decode_builds_one_generic_kernel_per_bucket() -> None:
    """Phi-3's rotary + cache region outputs the rotated query beside the key cache concat (an output
    stored once per row repeat): it runs generically, not a kernel per past length (5 builds of that
    region over 6 steps, eager after 8, when the generic kernel refused such outputs)."""
    row: dict[str, Any] = decode_matrix.run_model("phi3", steps=6, prompt_len=5, cache_kind="dynamic",
                                                  cpu="emulate", shown=0)
    assert row["tokens_equal"], row
    assert row["eager"] == 0 and row["max_builds"] <= 2, row
