"""Cross entropy's backward in torch regions: 0-d inputs (the incoming gradient, the count) as ``[1]``
graph inputs that broadcast like PyTorch's 0-d tensors, and ``scatter(full(0), 1, index, value)`` as a
one-hot ``where(iota == index, value, base)`` (no gather, no constant tensor read from memory: the
base of one value is a number of the graph, folded or not). Each region's reference on the eager values
of its inputs equals eager (``_check_regions``)."""

from __future__ import annotations

from typing import Any

import pytest

torch = pytest.importorskip("torch")

from test_torch_int_ops import _aten, _check_regions  # noqa: E402


def _ce_backward(b: int, c: int) -> Any:
    """The ATen ops of AOTAutograd's cross-entropy backward (mean, ``ignore_index=-100``)."""
    def f(g: Any, count: Any, t: Any, logp: Any) -> Any:
        tt = t.unsqueeze(1)
        scale = g / count
        onehot = torch.full((b, c), 0.0).scatter(1, torch.where(tt != -100, tt, 0), -1.0)
        gl = onehot * torch.where(tt != -100, scale, 0.0)
        return gl - logp.exp() * gl.sum(1, keepdim=True)
    return f


@pytest.mark.parametrize("b,c", [(8, 40), (64, 1100)])   # the zeros folded, and too large to fold
def test_cross_entropy_backward_is_one_region_reading_no_constant_tensor(b: int, c: int) -> None:
    torch.manual_seed(0)
    t = torch.randint(0, c, (b,))
    t[1] = -100
    args = (torch.tensor(1.5), torch.tensor(float(b - 1)), t, torch.randn(b, c).log_softmax(1))
    split = _check_regions(_aten(_ce_backward(b, c), *args), *args)
    [r] = split.regions
    assert split.declined == ()
    assert sorted(spec.shape for _, spec in r.graph.inputs) == [(1,), (1,), (b, 1), (b, c)]
    ops = [n.op for n in r.graph.nodes]
    assert {"iota", "eq", "where"} <= set(ops) and "gather_elements" not in ops


def test_the_region_is_what_the_backend_receives() -> None:
    """Through AOTAutograd with the backend's decompositions: the backward graph is one region."""
    from stitchtune.deploy.model_tuning import capture_graphs
    from stitchtune.importers.torch_regions import find_regions

    class Head(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.w = torch.nn.Parameter(torch.randn(8, 40))

        def forward(self, t: Any) -> Any:
            return torch.nn.functional.cross_entropy(self.w, t)

    [bwd] = [g for g in capture_graphs(Head(), [torch.randint(0, 40, (8,))], "train") if g.kind == "backward"]
    split = find_regions(bwd.module)
    [r] = split.regions
    assert split.declined == () and {"aten.scatter", "aten.div", "aten.sum", "aten.exp"} <= set(r.ops)


@pytest.mark.parametrize("case,why", [("wide index", "size 1 along dim 1"), ("reduce", "without reduce"),
                                      ("src", "scatter of a number")])
def test_other_scatters_are_declined_with_a_reason(case: str, why: str) -> None:
    def f(x: Any, t: Any) -> Any:
        base = torch.full((4, 10), 0.0)
        if case == "wide index":
            s = base.scatter(1, t.repeat(1, 2), 1.0)
        elif case == "reduce":
            s = base.scatter(1, t, 1.0, reduce="add")
        else:
            s = base.scatter(1, t, x[:, :1])
        return (x * s).exp()

    gm = _aten(f, torch.randn(4, 10), torch.randint(0, 10, (4, 1)))
    from stitchtune.importers.torch_regions import find_regions

    split = find_regions(gm)
    assert any(d.what == "op aten.scatter" and why in d.reason for d in split.declined), split.declined


class _CausalLMHead(torch.nn.Module):
    """transformers' causal-LM loss on logits ``[2, 8, 50]`` (its label shift, flatten and cross entropy;
    with ``num_items_in_batch``, a sum over a 0-d count)."""

    def __init__(self) -> None:
        super().__init__()
        self.logits = torch.nn.Parameter(torch.randn(2, 8, 50))

    def forward(self, labels: Any, *items: Any) -> Any:
        from transformers.loss.loss_utils import ForCausalLMLoss

        return ForCausalLMLoss(self.logits, labels, 50, num_items_in_batch=items[0] if items else None)


@pytest.mark.parametrize("items", [(), (torch.tensor(13),)])
def test_a_causal_lm_loss_head_is_one_region_forward_and_one_backward(items: tuple[Any, ...]) -> None:
    """The logits ``[B, S, V]`` read as ``[B*S, V]`` (the region declares the input at the shape its
    reshape gives), the shifted labels' copy and view left to PyTorch with the shift itself (pad and
    slice), held per row: one region each way, no reshape node in either."""
    pytest.importorskip("transformers")
    from stitchtune.deploy.model_tuning import capture_graphs
    from stitchtune.importers.torch_regions import find_regions

    labels = torch.randint(0, 50, (2, 8))
    labels[0, :3] = -100
    graphs = capture_graphs(_CausalLMHead(), [labels, *items], "train")
    assert [g.kind for g in graphs] == ["forward", "backward"]
    fwd, bwd = (find_regions(g.module) for g in graphs)
    [f] = fwd.regions
    [b] = bwd.regions
    assert "aten.gather" in f.ops and "aten.scatter" in b.ops
    assert sorted(s.shape for _, s in f.graph.inputs) == sorted([(16, 1), (16, 50)] + [(1,)] * len(items))
    assert not [n for r in (f, b) for n in r.graph.nodes if n.op == "reshape"]
    assert {d.what for d in fwd.declined} == {"op aten.constant_pad_nd", "op aten.slice"} and bwd.declined == ()


def test_a_view_and_its_view_back_are_the_value_itself() -> None:
    def f(x: Any) -> Any:
        return (x.view(2, 8, 4).view(16, 4) * 2.0).exp()

    x = torch.randn(16, 4)
    [r] = _check_regions(_aten(f, x), x).regions
    assert [n.op for n in r.graph.nodes] == ["mul", "exp"]
