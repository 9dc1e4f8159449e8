"""ONNX importer on two blocks the planner used to refuse, exported with the legacy (TorchScript)
exporter: a Qwen3-style attention input (q and k projections, a per-head RMSNorm of q and k, the
rotary, k repeated for grouped-query heads) and a Swin-style shifted-window input (a projection
viewed as ``[B, H, W, C]``, ``roll`` exported as slice + concat along H and W, the window partition).
Every imported subgraph plans (no refusal), matches onnxruntime through the reference executor and
emulates like the reference. Then HF's Swin itself (two blocks, the second shifted): every subgraph
plans; its LayerNorm right before the roll (with the residual sum before it and the zero ``Pad``) is
one subgraph, the roll pushed below the LayerNorm (stitchtune/plan/row_moves.py), and so is the roll
back after the attention with the window reverse, the residual sum and ``layernorm_after``, planned in
the rows' own layout (stitchtune/plan/row_views.py)."""

from __future__ import annotations

import warnings
from typing import Any

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
torch = pytest.importorskip("torch")

from helpers.lowering import check_emulates  # noqa: E402
from helpers.onnx_models import check_onnx_numerics  # noqa: E402
from stitchtune.importers.onnx_import import import_onnx  # noqa: E402
from stitchtune.plan.planner import make_plan  # noqa: E402

nn = torch.nn
B, S, D, H, KV = 1, 8, 32, 4, 2
DH = D // H


class QKNormRotary(nn.Module):
    """Qwen3's attention input: q / k projections split into heads, RMSNorm over each head's dim,
    transposed to ``[B, heads, S, DH]``, rotated (cos / sin ``[S, DH]``), k repeated for the q heads."""

    def __init__(self) -> None:
        super().__init__()
        self.q, self.k = nn.Linear(D, H * DH, bias=False), nn.Linear(D, KV * DH, bias=False)
        self.gq, self.gk = nn.Parameter(torch.rand(DH) + 0.5), nn.Parameter(torch.rand(DH) + 0.5)

    @staticmethod
    def rms(x: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
        return g * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6))

    @staticmethod
    def rot(x: torch.Tensor) -> torch.Tensor:
        half = x.shape[-1] // 2
        return torch.cat((-x[..., half:], x[..., :half]), -1)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        q = self.rms(self.q(x).view(B, S, H, DH), self.gq).transpose(1, 2)
        k = self.rms(self.k(x).view(B, S, KV, DH), self.gk).transpose(1, 2)
        q = q * cos + self.rot(q) * sin
        k = k * cos + self.rot(k) * sin
        return q @ k.repeat_interleave(H // KV, 1).transpose(-1, -2)


class ShiftedWindows(nn.Module):
    """Swin's shifted-window input: a projection of the tokens viewed as ``[1, 8, 8, C]``, rolled by
    ``(-2, -2)`` along H and W, partitioned into 4x4 windows ``[4, 16, C]``, then the qkv projection."""

    def __init__(self, C: int = 16) -> None:
        super().__init__()
        self.proj, self.qkv = nn.Linear(C, C), nn.Linear(C, 3 * C)
        self.C = C

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.roll(self.proj(x).view(1, 8, 8, self.C), shifts=(-2, -2), dims=(1, 2))
        h = h.view(1, 2, 4, 2, 4, self.C).permute(0, 1, 3, 2, 4, 5).contiguous().view(-1, 16, self.C)
        return self.qkv(h)


def _export(kind: str, path) -> dict[str, np.ndarray]:
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(0)
    if kind == "qk_norm_rotary":
        module: nn.Module = QKNormRotary().eval()
        ang = torch.rand(S, DH, generator=g) * 3
        args, names = (torch.randn(B, S, D, generator=g), ang.cos(), ang.sin()), ["x", "cos", "sin"]
    else:
        module = ShiftedWindows().eval()
        args, names = (torch.randn(1, 64, 16, generator=g),), ["x"]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(module, args, str(path), dynamo=False, input_names=names, output_names=["y"])
    return {n: a.numpy() for n, a in zip(names, args)}


@pytest.mark.slow  # the torch exports (~6 s each on the shared machine)
@pytest.mark.parametrize("kind,wanted", [("qk_norm_rotary", ("reduce_mean", "transpose", "slice", "concat")),
                                         ("shifted_windows", ("reshape", "slice", "concat", "transpose"))])
def test_every_subgraph_plans_and_matches_onnxruntime(tmp_path, kind: str, wanted: tuple[str, ...]) -> None:
    path = tmp_path / f"{kind}.onnx"
    feeds = _export(kind, path)
    res = import_onnx(path)
    ops = [{n.op for n in sg.graph.nodes} for sg in res.subgraphs]
    # q's and k's norm + rotary (k with its repeat), or the roll with the window partition, in one subgraph each
    assert sum(set(wanted) <= o for o in ops) == (2 if kind == "qk_norm_rotary" else 1), ops
    for sg in res.subgraphs:
        make_plan(sg.graph)   # raises UnsupportedGraphError naming the problem on a refusal
    assert check_onnx_numerics(res, onnx.load(str(path)), feeds, tol=1e-5) >= len(res.subgraphs)
    for sg in res.subgraphs:
        if set(wanted) <= {n.op for n in sg.graph.nodes}:
            check_emulates(sg.graph, 1, 3)


@pytest.mark.slow  # the export of a whole (tiny) model (~10 s on the shared machine)
def test_swin_shifted_block_plans_with_its_rolls_in_one_subgraph_each(tmp_path) -> None:
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    cfg = transformers.SwinConfig(image_size=32, patch_size=4, num_channels=3, embed_dim=16, depths=[2], num_heads=[2],
                                  window_size=4, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0,
                                  drop_path_rate=0.0)
    model = transformers.SwinModel(cfg).eval()

    class Hidden(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.m = model

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.m(pixel_values=x).last_hidden_state

    x = torch.randn(1, 3, 32, 32, generator=torch.Generator().manual_seed(0))
    path = tmp_path / "swin.onnx"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(Hidden(), (x,), str(path), dynamo=False, input_names=["x"], output_names=["y"])
    res = import_onnx(path)
    rolled = [sg for sg in res.subgraphs if {"slice", "concat", "reduce_mean", "rsqrt"} <= {n.op for n in sg.graph.nodes}]
    plans = {id(sg): make_plan(sg.graph) for sg in res.subgraphs}   # every subgraph plans (no refusal)
    # before the attention: LayerNorm + roll + partition; after it: the window reverse, the roll back, the
    # residual sum and layernorm_after (plan/row_views.py), each one subgraph
    def rolls_first(sg: Any) -> bool:
        ops = [n.op for n in sg.graph.nodes]
        return ops.index("slice") < ops.index("reduce_mean")

    (before,) = [sg for sg in rolled if not rolls_first(sg)]
    (after,) = [sg for sg in rolled if rolls_first(sg)]
    assert {"reshape", "transpose", "add", "mul"} <= {n.op for n in before.graph.nodes}
    assert (plans[id(before)].family, plans[id(before)].M, plans[id(before)].N) == ("row", 64, 16)
    assert (plans[id(after)].family, plans[id(after)].M, plans[id(after)].N) == ("row", 64, 16)
    assert plans[id(after)].moved_rows and "transpose" in {n.op for n in after.graph.nodes}
    assert check_onnx_numerics(res, onnx.load(str(path)), {"x": x.numpy()}, tol=1e-5) >= len(res.subgraphs)
    check_emulates(before.graph, 1, 3)
    check_emulates(after.graph, 1, 3)
