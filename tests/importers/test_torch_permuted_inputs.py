"""Region inputs that PyTorch holds permuted (a convolution's channels-last output seen as NCHW) are
declared by the region's graph in their memory order and read through a transpose (none when the
model permutes them back: ConvNeXt's layer norm), so the region op hands the kernel a free view."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from helpers.lowering import DEV, emulated_errors  # noqa: E402
from helpers.nvcc import compile_programs_sm90  # noqa: E402
from stitchtune.cost.heuristic import heuristic_schedule  # noqa: E402
from stitchtune.graph.reference import random_inputs, run_reference  # noqa: E402
from stitchtune.importers.builder import GraphBuilder, ImportError_  # noqa: E402
from stitchtune.importers.torch_regions import find_regions  # noqa: E402
from stitchtune.lower.entry import lower  # noqa: E402
from stitchtune.plan.planner import make_plan  # noqa: E402
from stitchtune.space import SearchSpace  # noqa: E402

C = 8


def _nchw_of_nhwc(seed: int = 0, h: int = 4, w: int = 4) -> Any:
    """A ``[1, C, h, w]`` tensor whose memory is channels-last (what a convolution of a permuted
    activation returns)."""
    g = torch.Generator().manual_seed(seed)
    return torch.randn(1, h, w, C, generator=g).permute(0, 3, 1, 2)


def _aten(fn: Any, *args: Any) -> Any:
    from torch.fx.experimental.proxy_tensor import make_fx

    return make_fx(fn, tracing_mode="fake")(*args)


def _ln_channels_last(y: Any, g: Any, b: Any) -> Any:   # ConvNeXt: dwconv output -> permute -> LayerNorm
    return torch.nn.functional.layer_norm(y.permute(0, 2, 3, 1), (C,), g, b)


def _softmax_channels(y: Any) -> Any:                   # read in its own (NCHW) axes: a row of memory
    return (y * 2.0).softmax(1)


def _spatial_mean(y: Any) -> Any:                       # a reduction over H and W of channels-last memory
    return y - y.mean(dim=(2, 3), keepdim=True)


def _memory_order(x: Any, perm: tuple[int, ...]) -> np.ndarray:
    return x.permute(perm).contiguous().numpy()


def test_a_channels_last_input_permuted_to_channels_last_is_read_without_a_transpose() -> None:
    """ConvNeXt's pattern: the input is declared ``[1, H, W, C]`` (its memory), the model's permute
    cancels the read's transpose (no layout node), and the graph computes PyTorch's value from the
    input's memory."""
    y, g, b = _nchw_of_nhwc(), torch.randn(C), torch.randn(C)
    [region] = find_regions(_aten(_ln_channels_last, y, g, b)).regions
    assert region.input_perms == ((0, 2, 3, 1), None, None)
    assert [tuple(s.shape) for _, s in region.graph.inputs] == [(1, 4, 4, C), (C,), (C,)]
    assert not [n for n in region.graph.nodes if n.op in ("transpose", "reshape")]
    names = [n for n, _ in region.graph.inputs]
    out = run_reference(region.graph, dict(zip(names, [_memory_order(y, (0, 2, 3, 1)), g.numpy(), b.numpy()])))
    np.testing.assert_allclose(out[region.graph.outputs[0]].reshape(1, 4, 4, C),
                               _ln_channels_last(y, g, b).numpy(), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("fn", [_softmax_channels, _spatial_mean])
def test_a_permuted_input_read_in_its_own_axes_goes_through_a_transpose(fn: Any) -> None:
    y = _nchw_of_nhwc()
    [region] = find_regions(_aten(fn, y)).regions
    assert region.input_perms == ((0, 2, 3, 1),)
    [(name, spec)] = region.graph.inputs
    assert tuple(spec.shape) == (1, 4, 4, C)
    assert any(n.op == "transpose" and n.args == (name,) for n in region.graph.nodes), region.graph.nodes
    out = run_reference(region.graph, {name: _memory_order(y, (0, 2, 3, 1))})[region.graph.outputs[0]]
    want = fn(y)
    perm = region.output_perms[0]   # an element-wise result of channels-last memory is channels-last too
    want = want if perm is None else want.permute(perm)
    np.testing.assert_allclose(out.reshape(want.shape), want.numpy(), rtol=1e-5, atol=1e-5)


def _programs(graph: Any, samples: int) -> tuple[Any, SearchSpace, list[Any]]:
    plan = make_plan(graph)
    space = SearchSpace.for_plan(plan, DEV)
    scheds = [heuristic_schedule(plan, DEV, space)] + [space.sample(random.Random(i)) for i in range(samples)]
    return plan, space, scheds


def test_permuted_inputs_emulate_like_the_reference_and_build_for_sm90(tmp_path: Path) -> None:
    """Every region above, at a shape with odd sizes too: the heuristic and two sampled schedules run
    in the emulator (which faults on any out-of-bounds read) within 1e-5 of the float64 reference,
    and all their programs build for sm_90 in one nvcc call."""
    programs = []
    cases = [(_ln_channels_last, (_nchw_of_nhwc(1, 3, 5), torch.randn(C), torch.randn(C))),
             (_softmax_channels, (_nchw_of_nhwc(2),)), (_spatial_mean, (_nchw_of_nhwc(3, 5, 3),))]
    for fn, args in cases:
        [region] = find_regions(_aten(fn, *args)).regions
        assert region.input_perms[0] == (0, 2, 3, 1)
        g = region.graph
        plan, space, scheds = _programs(g, 2)
        inputs = random_inputs(g, 5)
        ref = run_reference(g, inputs)
        for s in scheds:
            errs = emulated_errors(g, plan, space, s, inputs, ref)
            assert max(errs.values()) < 1e-5, (fn.__name__, s.to_json(), errs)
        programs += [lower(g, plan, s, DEV, space) for s in scheds[:2]]
    compile_programs_sm90(programs, tmp_path)


def test_strided_inputs_that_are_no_permutation_keep_their_axes() -> None:
    """A sliced view (gaps in memory) is no permutation of a dense tensor: declared as PyTorch's
    shape (the region op copies it); a contiguous input has no permutation either."""
    x = torch.randn(4, 32)[:, ::2]
    [region] = find_regions(_aten(lambda t, u: (t * u).softmax(-1), x, torch.randn(4, 16))).regions
    assert region.input_perms == (None, None)
    assert [tuple(s.shape) for _, s in region.graph.inputs] == [(4, 16), (4, 16)]


def test_a_region_refused_with_its_permuted_read_is_mapped_again_in_pytorchs_axes() -> None:
    """Reading in memory order never costs a region: where ``accept`` refuses the graph that reads a
    permuted input through a transpose, the region reads it in PyTorch's axes (copied), as before."""
    def no_transposed_inputs(graph: Any) -> str | None:
        names = {n for n, _ in graph.inputs}
        bad = [n.id for n in graph.nodes if n.op == "transpose" and set(n.args) & names]
        return f"a transposed input in {bad}" if bad else None

    y = _nchw_of_nhwc()
    [region] = find_regions(_aten(_softmax_channels, y), accept=no_transposed_inputs).regions
    assert region.input_perms == (None,)
    assert [tuple(s.shape) for _, s in region.graph.inputs] == [(1, C, 4, 4)]
    [region] = find_regions(_aten(_ln_channels_last, y, torch.randn(C), torch.randn(C)),
                            accept=no_transposed_inputs).regions
    assert region.input_perms[0] == (0, 2, 3, 1)          # (its transposes cancel: nothing refused)


def test_int_and_bool_inputs_keep_pytorchs_axes() -> None:
    """A gather's indices must be a graph input: int and bool inputs are never read through a transpose."""
    mask = torch.rand(1, 4, 4, C).permute(0, 3, 1, 2) > 0.5
    [region] = find_regions(_aten(lambda t, m: t.masked_fill(m, 0.0).softmax(1), torch.randn(1, C, 4, 4),
                                  mask)).regions
    assert all(p is None for p in region.input_perms)


def test_regions_with_symbolic_sizes_declare_no_permuted_input() -> None:
    """Their kernels are mapped again at contiguous shapes per bucket, so their graph keeps PyTorch's
    axes (and the region op copies such an input)."""
    from torch.fx.experimental.proxy_tensor import make_fx

    y, g, b = _nchw_of_nhwc(0, 4, 6), torch.randn(C), torch.randn(C)
    gm = make_fx(_ln_channels_last, tracing_mode="symbolic")(y, g, b)
    [region] = find_regions(gm).regions
    assert region.dynamic and all(p is None for p in region.input_perms)


def test_the_builder_composes_transposes_and_cancels_inverse_ones() -> None:
    b = GraphBuilder("t")
    x = b.add_input("x", (2, 3, 4, 5), "float32")
    t1 = b.transpose(x, (0, 3, 1, 2), "t1")
    assert t1.shape == (2, 5, 3, 4)
    t2 = b.transpose(t1, (0, 2, 3, 1), "t2")
    assert t2 == x                                        # inverse permutations: the source itself
    t3 = b.transpose(t1, (1, 0, 2, 3), "t3")              # composed: one transpose of x
    assert t3.shape == (5, 2, 3, 4)
    g = b.graph([t3])
    [node] = g.nodes
    assert node.op == "transpose" and node.args == ("x",) and tuple(node.perm) == (3, 0, 1, 2)
    with pytest.raises(ImportError_, match="not a permutation"):
        b.transpose(x, (0, 1, 1, 2), "bad")
