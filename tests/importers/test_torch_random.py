"""stitchtune.importers.torch_random: dropout's random numbers drawn by the regions that read them."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from stitchtune.graph.ops import uniform  # noqa: E402
from stitchtune.graph.reference import run_reference  # noqa: E402
from stitchtune.importers.torch_random import seed_rands, uniform_torch, unseed_rands  # noqa: E402
from stitchtune.importers.torch_regions import find_regions  # noqa: E402


def _dropout_ln(x: Any, h: Any) -> Any:
    keep = torch.rand(4, 16) > 0.25
    return torch.nn.functional.layer_norm(x + keep * h * (1 / 0.75), (16,)), keep


def _gm() -> Any:
    from torch.fx.experimental.proxy_tensor import make_fx

    return make_fx(_dropout_ln, tracing_mode="fake")(torch.randn(4, 16), torch.randn(4, 16))


def test_torchs_numbers_are_the_graph_ops_bit_for_bit() -> None:
    seeds = [0, 1, -1, 2**62 + 12345, -(2**63)]
    idx = np.arange(5000)
    for s in seeds:
        want = uniform(np.int64(s), idx)
        got = uniform_torch(torch.tensor(s, dtype=torch.int64), torch.from_numpy(idx)).numpy()
        assert got.dtype == np.float32 and np.array_equal(got, want)


def _targets(gm: Any) -> list[str]:
    return [str(n.target) for n in gm.graph.nodes if n.op == "call_function"]


def test_a_rand_becomes_a_region_draw_and_the_region_maps_it_as_uniform() -> None:
    gm = _gm()
    seeded = seed_rands(gm)
    assert seeded is not None and "aten.rand.default" in _targets(gm)   # the original is left as it was
    assert "aten.rand.default" not in _targets(seeded) and "stitchtune.rand.default" in _targets(seeded)
    [r] = find_regions(seeded).regions
    assert {"stitchtune.rand", "aten.gt", "aten.native_layer_norm"} <= set(r.ops)
    assert any(nd.op == "uniform" for nd in r.graph.nodes)
    # the region's graph, run by the reference on the seed PyTorch draws, gives the op's own numbers
    torch.manual_seed(3)
    x, h = torch.randn(4, 16), torch.randn(4, 16)
    ins = {"x_1": x, "h_1": h}
    seeds = torch.randint(2**62, (1,))
    feeds = {}
    for (name, spec), n in zip(r.graph.inputs, r.inputs):
        feeds[name] = seeds.numpy() if spec.dtype == "int64" else ins[n.name].numpy()
    out = run_reference(r.graph, feeds)
    keep = torch.ops.stitchtune.rand(seeds, 0, [4, 16]) > 0.25
    want = torch.nn.functional.layer_norm(x + keep * h * (1 / 0.75), (16,))
    got = {n.name: out[o] for o, n in zip(r.graph.outputs, r.outputs)}
    assert np.array_equal(got["gt"].reshape(4, 16).astype(bool), keep.numpy())
    ln = next(v for k, v in got.items() if v.dtype != bool and v.size == 64)
    assert np.abs(ln.reshape(4, 16) - want.numpy()).max() < 1e-5


def test_draws_no_region_took_go_back_to_inductors_random_op() -> None:
    seeded = seed_rands(_gm())
    back = unseed_rands(seeded)
    targets = _targets(back)
    assert "stitchtune.rand.default" not in targets and "aten.slice.Tensor" not in targets
    assert "prims.inductor_random.default" in targets and "prims.inductor_lookup_seed.default" in targets
    assert seed_rands(back) is None   # nothing left to draw in regions


def test_each_draws_seed_is_a_16_byte_aligned_view_of_inductors_seeds() -> None:
    """Every other seed: ``seeds[2k:2k + 1]`` starts 16 bytes apart (a region's launch would copy a
    misaligned input first)."""
    def two(x: Any) -> Any:
        return (torch.rand(4, 16) > 0.5) * x, (torch.rand(4, 16) > 0.25) * x

    from torch.fx.experimental.proxy_tensor import make_fx

    seeded = seed_rands(make_fx(two, tracing_mode="fake")(torch.randn(4, 16)))
    seeds = [n for n in seeded.graph.nodes if str(n.target) == "prims.inductor_seeds.default"]
    starts = [n.args[2] for n in seeded.graph.nodes if str(n.target) == "aten.slice.Tensor"]
    assert len(seeds) == 1 and seeds[0].args[0] == 4 and starts == [0, 2]
