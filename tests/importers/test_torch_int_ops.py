"""Int values in torch regions: ``arange``, int ``add``/``sub``/``mul``, comparisons of ints, ``where``
with int branches, ``_to_copy`` between int, bool and float, a bool ``sum`` as a count; the Llama-style
position ids and causal mask, through the importer and through ``torch.compile(backend="stitchtune")``,
matching eager exactly (ints bit for bit)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from stitchtune.graph.reference import run_reference  # noqa: E402
from stitchtune.importers.torch_regions import find_regions  # noqa: E402


def _aten(fn: Any, *args: Any) -> Any:
    from torch.fx.experimental.proxy_tensor import make_fx

    return make_fx(fn, tracing_mode="fake")(*args)


def llama_mask(scores: Any, attn: Any, past: Any) -> Any:
    """Llama's cache positions, position ids, causal + padding mask into a softmax, and the count of
    real tokens (as transformers builds them, on runtime values)."""
    s = scores.shape[-1]
    cache_position = torch.arange(s) + past
    position_ids = cache_position.unsqueeze(0) * 1
    causal = torch.arange(s)[None, :] <= cache_position[:, None]
    keep = causal[None, None] & attn[:, None, None, :].bool()
    probs = scores.masked_fill(~keep, float("-inf")).softmax(-1)
    return probs, position_ids - 0, (attn != 0).sum(-1, keepdim=True)


def _llama_args() -> tuple[Any, ...]:
    attn = torch.ones(2, 8, dtype=torch.int64)
    attn[1, 5:] = 0
    return torch.randn(2, 2, 8, 8), attn, torch.tensor(3)


def _check_regions(gm: Any, *args: Any) -> Any:
    """Every region's reference on the eager values of its input nodes equals the eager values of its
    output nodes: int and bool outputs bit for bit, float ones within 1e-6 (relative to the largest
    value). Returns the split."""
    from torch.fx.interpreter import Interpreter

    env: dict[str, Any] = {}

    class Record(Interpreter):
        def run_node(self, n: Any) -> Any:
            env[n.name] = super().run_node(n)
            return env[n.name]
    Record(gm).run(*args)
    split = find_regions(gm)
    assert split.regions
    for r in split.regions:
        # (a rank-1 value held per row is fed as [B, 1], as the region op reshapes it: same bytes)
        feeds = {name: env[n.name].numpy().reshape(spec.shape) for (name, spec), n in zip(r.graph.inputs, r.inputs)}
        out = run_reference(r.graph, feeds)
        for o, n in zip(r.graph.outputs, r.outputs):
            want = env[n.name].numpy()
            got = out[o].reshape(want.shape)
            assert got.dtype == want.dtype, (o, got.dtype, want.dtype)
            if want.dtype.kind in "ib":
                assert np.array_equal(got, want), o
            else:
                assert np.abs(got - want).max() <= 1e-6 * max(1.0, float(np.abs(want).max())), o
    return split


def test_int_regions_map_and_their_reference_matches_eager() -> None:
    def f(ids: Any, x: Any) -> Any:
        pos = ids * 3 - 7                              # int64 arithmetic
        big = pos > 4                                  # comparison of ints
        w = torch.where(big, pos, -pos)                # where with int branches
        n = big.sum(-1, keepdim=True)                  # a count
        return w, n, x * w.float(), (x * 10).to(torch.int32), (ids.to(torch.int32) + (2**31 - 20) + 100)   # wraps

    ids = torch.randint(-50, 50, (4, 8))
    split = _check_regions(_aten(f, ids, torch.randn(4, 8)), ids, torch.randn(4, 8))
    assert not [d for d in split.declined if "int" in d.reason], split.declined
    ops = {o for r in split.regions for o in r.ops}
    assert {"aten.mul", "aten.sub", "aten.gt", "aten.where", "aten.sum", "aten._to_copy"} <= ops


def test_llama_mask_and_positions_map_onto_int_ops() -> None:
    args = _llama_args()
    split = _check_regions(_aten(llama_mask, *args), *args)
    ops = {o for r in split.regions for o in r.ops}
    assert {"aten.le", "aten.mul", "aten.ne", "aten.sum", "aten._softmax"} <= ops
    nodes = [n for r in split.regions for n in r.graph.nodes]
    assert any(n.op == "le" and n.dtype == "bool" for n in nodes)
    assert any(n.op == "reduce_sum" for n in nodes) and any(n.op == "cast" and n.to == "int64" for n in nodes)
    assert split.declined == ()   # the 0-d ``past`` is a [1] input of the region that reads it


def test_arange_too_large_to_fold_maps_onto_iota() -> None:
    def f(x: Any) -> Any:   # 2**17 positions: beyond constant folding (torch_consts.MAX_ELEMENTS)
        return x * torch.arange(3, 3 + 2 * x.shape[-1], 2).float(), torch.arange(x.shape[-1], dtype=torch.int32) * 5

    x = torch.randn(2, 2**17)
    split = _check_regions(_aten(f, x), x)
    nodes = [n for r in split.regions for n in r.graph.nodes]
    assert any(n.op == "iota" for n in nodes) and not [n for r in split.regions for n, _ in r.graph.inputs
                                                        if n != "in0"]


@pytest.mark.slow
def test_backend_runs_llama_mask_exactly() -> None:
    import stitchtune.torch  # noqa: F401  (registers the backend)

    torch._dynamo.reset()
    args = _llama_args()
    got = torch.compile(llama_mask, backend="stitchtune")(*args)
    want = llama_mask(*args)
    assert got[0].dtype == torch.float32 and (got[0] - want[0]).abs().max().item() < 1e-6
    assert torch.equal(got[1], want[1]) and torch.equal(got[2], want[2])
    assert got[1].dtype == torch.int64 and got[2].dtype == torch.int64


def test_prims_iota_masks_fold_and_prims_casts_map() -> None:
    """What AOTAutograd's decompositions hand the backend: ``prims.iota`` position chains are folded
    into constants (shapes are static), so the causal mask joins the softmax's region, and
    ``prims.convert_element_type`` of an int tensor is a cast inside a region."""
    def f(scores: Any, attn: Any) -> Any:
        s = scores.shape[-1]
        i = torch.ops.prims.iota(s, start=0, step=1, dtype=torch.int64, device="cpu", requires_grad=False)
        causal = i[None, :] <= i[:, None]
        keep = causal & torch.ops.prims.convert_element_type(attn, torch.bool)[:, None, None, :]
        pos = torch.ops.prims.convert_element_type(attn * 2 + 1, torch.float32)
        return scores.masked_fill(~keep, float("-inf")).softmax(-1), pos * scores.sum(-1)

    scores, attn, _ = _llama_args()
    split = _check_regions(_aten(f, scores, attn), scores, attn)
    ops = [o for r in split.regions for o in r.ops]
    assert "prims.iota" not in ops and "aten._softmax" in ops and "prims.convert_element_type" in ops
    assert not split.declined or all("int" not in d.reason for d in split.declined), split.declined
