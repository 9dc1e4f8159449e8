"""Convolutional-network ops in the torch importer (stitchtune.importers.torch_cnn): eval batch norm,
in-place residual adds and ReLUs, 1x1 adaptive average pooling, pooling windows left to the framework.
Regions of tiny ResNet-style blocks (torch.export and make_fx graphs) are planned, emulated (heuristic
schedule) and compared with eager PyTorch's values of the same fx nodes."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from helpers.lowering import DEV, emulated_errors  # noqa: E402

from stitchtune.cost.heuristic import heuristic_schedule  # noqa: E402
from stitchtune.errors import StitchtuneError  # noqa: E402
from stitchtune.graph.reference import run_reference  # noqa: E402
from stitchtune.importers.torch_import import import_torch  # noqa: E402
from stitchtune.importers.torch_regions import find_regions  # noqa: E402
from stitchtune.plan.planner import make_plan  # noqa: E402
from stitchtune.space import SearchSpace  # noqa: E402


class ResBlock(torch.nn.Module):
    """conv-bn-relu_-conv-bn, += identity, relu_, max pool, adaptive average pool to 1x1."""

    def __init__(self, c: int = 4) -> None:
        super().__init__()
        self.c1, self.c2 = (torch.nn.Conv2d(c, c, 3, padding=1, bias=False) for _ in range(2))
        self.b1, self.b2 = torch.nn.BatchNorm2d(c), torch.nn.BatchNorm2d(c)
        self.relu = torch.nn.ReLU(inplace=True)
        self.pool, self.avg = torch.nn.MaxPool2d(3, 2, 1), torch.nn.AdaptiveAvgPool2d(1)

    def forward(self, x: Any) -> Any:
        y = self.b2(self.c2(self.relu(self.b1(self.c1(x)))))
        y += x
        return self.avg(self.pool(self.relu(y)))


def _block() -> tuple[Any, Any]:
    torch.manual_seed(0)
    m = ResBlock()
    for bn in (m.b1, m.b2):   # running statistics and affine parameters that are not the identity
        bn.running_mean.uniform_(-1, 1)
        bn.running_var.uniform_(0.5, 2)
        bn.weight.data.uniform_(0.5, 1.5)
        bn.bias.data.uniform_(-1, 1)
    return m.eval(), torch.randn(1, 4, 8, 8)


def _values(gm: Any, args: list[Any]) -> dict[Any, Any]:
    """Every fx node's eager value (cloned when computed: in-place ops mutate them later)."""
    env: dict[Any, Any] = {}

    class _Record(torch.fx.Interpreter):
        def run_node(self, n: Any) -> Any:
            out = super().run_node(n)
            env[n] = out.clone() if isinstance(out, torch.Tensor) else out
            return out

    with torch.no_grad():
        _Record(gm).run(*args)
    return env


def _check_regions(split: Any, env: dict[Any, Any]) -> None:
    """Each region, planned and emulated on its fx inputs' eager values, gives its outputs' eager values."""
    for r in split.regions:
        g = r.graph
        plan = make_plan(g)
        space = SearchSpace.for_plan(plan, DEV)
        inputs = {name: env[n].numpy() for (name, _), n in zip(g.inputs, r.inputs)}
        ref = {o: env[n].numpy() for o, n in zip(g.outputs, r.outputs)}
        errs = emulated_errors(g, plan, space, heuristic_schedule(plan, DEV, space), inputs, ref)
        assert max(errs.values()) < 1e-5, (r.name, errs)


def _export_args(ep: Any, x: Any) -> list[Any]:
    from torch.export.graph_signature import InputKind

    return [x if s.kind == InputKind.USER_INPUT else ep.state_dict[s.target] for s in ep.graph_signature.input_specs]


def test_exported_resnet_block_is_three_regions_emulated_like_eager() -> None:
    m, x = _block()
    ep = torch.export.export(m, (x,), strict=False)
    split = find_regions(ep.graph_module)
    assert [r.ops for r in split.regions] == [("aten.batch_norm", "aten.relu_"),
                                              ("aten.batch_norm", "aten.add_", "aten.relu_"),
                                              ("aten.adaptive_avg_pool2d",)]
    declined = {d.what: d.reason for d in split.declined}
    assert set(declined) == {"op aten.conv2d", "op aten.max_pool2d"}
    assert "windowed op" in declined["op aten.max_pool2d"]
    bn = split.regions[0].graph
    assert sum(n.op == "reshape" for n in bn.nodes) == 3   # mean, scale, bias viewed as [C, 1, 1]
    assert [n.op for n in split.regions[2].graph.nodes] == ["reduce_mean"]
    _check_regions(split, _values(ep.graph_module, _export_args(ep, x)))
    # the region modules hold the functional ops: running one mutates none of its inputs
    mod = split.regions[1].module
    assert not any(str(n.target).split(".")[1].endswith("_") for n in mod.graph.nodes if n.op == "call_function")


def test_make_fx_resnet_block_native_batch_norm_and_unused_outputs() -> None:
    from torch.fx.experimental.proxy_tensor import make_fx

    m, x = _block()
    gm = make_fx(m)(x)
    split = find_regions(gm)
    assert [r.ops[:2] for r in split.regions] == [("aten.native_batch_norm", "aten.relu_"),
                                                  ("aten.native_batch_norm", "aten.add_"), ("aten.mean",)]
    # make_fx's unused ``empty`` reserve tensors are dead code, not declines
    assert {d.what for d in split.declined} == {"op aten.convolution", "op aten.max_pool2d_with_indices"}
    _check_regions(split, _values(gm, [x]))


class BnAddPool(torch.nn.Module):
    """No convolution: batch norm (1-d and 2-d), in-place add and ReLU, 1x1 average pool."""

    def __init__(self) -> None:
        super().__init__()
        self.bn = torch.nn.BatchNorm2d(3)
        self.bn1 = torch.nn.BatchNorm1d(3, affine=False)

    def forward(self, x: Any, r: Any) -> Any:
        y = self.bn(x)
        y += r
        y = torch.relu_(y)
        return torch.nn.functional.adaptive_avg_pool2d(y, (1, 1)) + self.bn1(x.mean((2, 3)))[:, :, None, None]


@pytest.mark.parametrize("method", ["export", "make_fx"])
def test_whole_import_batch_norm_in_place_and_pool_match_eager(method: str, monkeypatch: Any) -> None:
    if method == "make_fx":
        def broken(*a: Any, **k: Any) -> Any:
            raise RuntimeError("export unavailable")

        monkeypatch.setattr(torch.export, "export", broken)
    torch.manual_seed(0)
    m = BnAddPool()
    m.bn.running_var.uniform_(0.5, 2)
    m.bn1.running_mean.uniform_(-1, 1)
    m.eval()
    res = import_torch(m, {"x": ((2, 3, 5, 5), "float32"), "r": ((2, 3, 5, 5), "float32")})
    assert res.method == method
    x, r = torch.randn(2, 3, 5, 5), torch.randn(2, 3, 5, 5)
    feeds = {"x": x.numpy(), "r": r.numpy(), **dict(res.params)}
    out = run_reference(res.graph, feeds)[res.graph.outputs[0]]
    with torch.no_grad():
        want = m(x, r).numpy()
    assert np.abs(out.reshape(want.shape) - want).max() < 1e-5


def _declines(fn: Any, *args: Any) -> dict[str, str]:
    from torch.fx.experimental.proxy_tensor import make_fx

    return {d.what: d.reason for d in find_regions(make_fx(fn)(*args)).declined}


def test_declines_name_their_reason() -> None:
    x = torch.randn(1, 3, 4, 4)
    why = _declines(lambda x: torch.nn.functional.adaptive_avg_pool2d(x.exp(), (2, 2)) * 2.0, x)
    assert "windowed average" in why["op aten._adaptive_avg_pool2d"]
    why = _declines(lambda x: torch.nn.functional.batch_norm(x.exp(), None, None, training=True), x)
    assert "batch statistics" in why["op aten.native_batch_norm"]


def test_in_place_ops_whose_mutation_is_observable_stay_outside() -> None:
    def read_after(x: Any) -> Any:
        y = x.exp()
        v = y.view(16)           # a view of y, read after the mutation: it sees the new values
        y.add_(1.0)
        return v * 2.0

    def on_input(x: Any) -> Any:
        x.mul_(2.0)
        return x.exp()

    assert "read afterwards" in _declines(read_after, torch.randn(4, 4))["op aten.add_"]
    assert "graph input" in _declines(on_input, torch.randn(4, 4))["op aten.mul_"]
    with pytest.raises(StitchtuneError, match="read afterwards"):
        import_torch(read_after, {"x": ((4, 4), "float32")})


def test_training_batch_norm_statistics_join_the_normalisation_in_one_region() -> None:
    """Training-mode batch norm as the backend's decompositions leave it (``var_mean`` over N, H, W,
    then the normalisation): one region, the batch statistics computed in it (batch 2: the reduced
    axes are not contiguous), emulated like eager; the unbiased variance form scales by n / (n - 1)."""
    from torch.fx.experimental.proxy_tensor import make_fx

    from stitchtune.deploy.torch_rest import decompositions as _decompositions

    def f(x: Any, w: Any, b: Any) -> Any:
        y = torch.nn.functional.batch_norm(x, None, None, w, b, training=True, eps=1e-5)
        var, mean = torch.var_mean(x, (0, 2, 3), keepdim=True)   # unbiased: correction 1
        return torch.relu(y) + (var * 2.0 + mean)

    torch.manual_seed(0)
    args = [torch.randn(2, 4, 5, 6) * 3 + 1, torch.rand(4) + 0.5, torch.randn(4)]
    gm = make_fx(f, decomposition_table=_decompositions())(*args)
    split = find_regions(gm)
    [r] = split.regions
    assert r.ops.count("aten.var_mean") == 2 and "aten.relu" in r.ops and not split.declined
    _check_regions(split, _values(gm, args))
