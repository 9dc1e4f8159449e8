"""stitchtune.importers.torch_regions: memory-intensive regions of ATen fx graphs."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from stitchtune.graph.reference import run_reference  # noqa: E402
from stitchtune.importers.torch_regions import find_regions  # noqa: E402


def _assert_emulates(graph: Any) -> None:
    """The heuristic schedule and a sampled one of ``graph`` emulate like its reference (1e-5)."""
    import random

    from helpers.lowering import DEV, emulated_errors

    from stitchtune.cost.heuristic import heuristic_schedule
    from stitchtune.graph.reference import random_inputs
    from stitchtune.plan.planner import make_plan
    from stitchtune.space import SearchSpace

    plan = make_plan(graph)
    space = SearchSpace.for_plan(plan, DEV)
    inputs = random_inputs(graph, 3)
    ref = run_reference(graph, inputs)
    for s in (heuristic_schedule(plan, DEV, space), space.sample(random.Random(0))):
        assert max(emulated_errors(graph, plan, space, s, inputs, ref).values()) < 1e-5


def _aten(fn: Any, *args: Any) -> Any:
    from torch.fx.experimental.proxy_tensor import make_fx

    return make_fx(fn, tracing_mode="fake")(*args)


def _ln_mm_gelu(x: Any, w: Any, g: Any, b: Any) -> Any:
    h = torch.nn.functional.layer_norm(x + 1.0, (x.shape[-1],), g, b)
    y = h @ w
    return torch.nn.functional.gelu(y * 0.5).softmax(-1)


def _args() -> tuple[Any, ...]:
    torch.manual_seed(0)
    return torch.randn(6, 16), torch.randn(16, 8), torch.randn(16), torch.randn(16)


def test_regions_stop_at_compute_ops_and_map_what_pytorch_computes() -> None:
    args = _args()
    gm = _aten(_ln_mm_gelu, *args)
    split = find_regions(gm)
    assert len(split.regions) == 2
    first, second = split.regions
    assert "aten.native_layer_norm" in first.ops and "aten.add" in first.ops
    assert {"aten.gelu", "aten._softmax", "aten.mul"} <= set(second.ops)
    assert any(d.what == "op aten.mm" and "compute" in d.reason for d in split.declined)
    # the first region's graph computes what PyTorch computes for its fx inputs
    x, w, g, b = args
    ins = {name: t.numpy() for (name, _), t in zip(first.graph.inputs, [x, g, b])}
    assert [n.name for n in first.inputs] == ["x_1", "g_1", "b_1"]
    out = run_reference(first.graph, ins)[first.graph.outputs[0]]
    want = torch.nn.functional.layer_norm(x + 1.0, (16,), g, b).numpy()
    assert np.abs(out - want).max() < 1e-5


def test_an_unmappable_node_splits_the_region_and_is_declined_with_its_reason() -> None:
    def f(x: Any) -> Any:
        y = (x * 2.0).exp()
        z = y.flip(0)   # flip: not a graph.json op
        return z.softmax(-1) + 1.0

    gm = _aten(f, torch.randn(4, 8))
    split = find_regions(gm)
    assert [r.ops for r in split.regions] == [("aten.mul", "aten.exp"), ("aten._softmax", "aten.add")]
    assert any(d.what == "op aten.flip" for d in split.declined)


def test_a_transpose_stays_inside_its_region() -> None:
    def f(x: Any) -> Any:
        return (x * 2.0).exp().transpose(0, 1).contiguous().softmax(-1) + 1.0

    x = torch.randn(4, 8)
    [r] = find_regions(_aten(f, x)).regions
    assert "aten.transpose" in r.ops and any(n.op == "transpose" for n in r.graph.nodes)
    out = run_reference(r.graph, {r.graph.inputs[0][0]: x.numpy()})[r.graph.outputs[0]]
    assert np.abs(out - f(x).numpy()).max() < 1e-5


def test_non_convex_groups_are_split() -> None:
    def f(x: Any, w: Any) -> Any:
        a = x.relu()
        b = a @ w            # a -> mm -> c and a -> c: {a, c} is not convex
        return (a * 2.0) + b

    gm = _aten(f, torch.randn(4, 4), torch.randn(4, 4))
    split = find_regions(gm)
    for r in split.regions:
        inside = set(r.nodes)
        for n in r.inputs:
            assert n not in inside
    assert len(split.regions) == 2


def test_the_planner_can_refuse_a_region() -> None:
    gm = _aten(lambda x: (x.exp() * 3.0).sum(0, keepdim=True) + x.sum(1, keepdim=True), torch.randn(4, 8))
    split = find_regions(gm, accept=lambda g: "refused for the test")
    assert split.regions == ()
    assert any(d.what.startswith("region ") and d.reason == "refused for the test" for d in split.declined)


def test_integer_tensors_are_mapped_and_symbolic_shapes_mapped_at_their_examples() -> None:
    i = torch.ones(4, 8, dtype=torch.int64)
    [r] = find_regions(_aten(lambda x, i: x.exp() + i.float(), torch.randn(4, 8), i)).regions
    assert sorted(s.dtype for _, s in r.graph.inputs) == ["float32", "int64"]   # an integer input, cast
    [r] = find_regions(_aten(lambda x, i: x.exp() + (i + 1).float(), torch.randn(4, 8), i)).regions
    assert any(n.op == "add" and n.dtype == "int64" for n in r.graph.nodes)   # integer arithmetic is stitched
    from torch.fx.experimental.proxy_tensor import make_fx

    gm = make_fx(lambda x: (x.exp() * 2.0).softmax(-1), tracing_mode="symbolic")(torch.randn(4, 8))
    [r] = find_regions(gm).regions   # mapped at the example shapes, re-mapped per shape at run time
    assert r.dynamic and r.graph.spec(r.graph.outputs[0]).shape == (4, 8)
    from stitchtune.importers.torch_symbolic import map_at_shapes

    graph, index, shapes = map_at_shapes(r.module, [torch.randn(3, 8)], "again")
    assert graph.spec(graph.outputs[0]).shape == (3, 8) and index == [0] and shapes == ((3, 8),)


def test_a_refusal_naming_a_node_declines_that_node_and_keeps_the_rest() -> None:
    def f(x: Any) -> Any:   # row sums and a column sum in one group: the planner takes one kind
        return x * x.sum(-1, keepdim=True) + (x * 2.0).sum(0, keepdim=True)

    gm = _aten(f, torch.randn(4, 8))
    split = find_regions(gm)
    assert split.regions, split.declined
    # the column sum is read by the add: a cross reduction must be an output (stitchtune.plan.cross)
    assert any(d.what.startswith("op aten.sum") and ("other axes" in d.reason or "over the rows" in d.reason)
               for d in split.declined)
    assert not any(d.what.startswith("region ") for d in split.declined)


def test_outputs_may_differ_from_pytorch_in_leading_ones_only() -> None:
    gm = _aten(lambda x: (x.exp() * 2.0).view(1, 4, 8) + 1.0, torch.randn(4, 8))
    [r] = find_regions(gm).regions
    assert r.output_shapes == ((1, 4, 8),)
    assert r.graph.spec(r.graph.outputs[0]).shape == (4, 8)
    x = torch.randn(4, 8)
    gm = _aten(lambda x: (x.exp() * 2.0).view(8, 4) + 1.0, x)   # moves rows: a reshape inside the region
    [r] = find_regions(gm).regions
    assert r.output_shapes == ((8, 4),) and "aten.view" in r.ops
    assert r.graph.spec(r.graph.outputs[0]).shape == (8, 4)
    out = run_reference(r.graph, {r.graph.inputs[0][0]: x.numpy()})[r.graph.outputs[0]]
    assert np.abs(out - ((x.exp() * 2.0).view(8, 4) + 1.0).numpy()).max() < 1e-5
    # a view that only leaves the region is PyTorch's (free): the region returns its base
    split = find_regions(_aten(lambda x: (x.exp() * 2.0).view(8, 4), x))
    assert split.regions[0].output_shapes == ((4, 8),) and [n.name for n in split.free] == ["view"]


def test_masks_map_onto_comparisons_and_where() -> None:
    def f(scores: Any, keep: Any) -> Any:
        s = scores.masked_fill(~keep, float("-inf")) * 0.5
        s = torch.where(scores > 3.0, s, s - 1.0)
        return s.softmax(-1)

    scores, keep = torch.randn(2, 2, 4, 8), torch.rand(2, 1, 1, 8) > 0.3
    keep[..., 0] = True
    gm = _aten(f, scores, keep)
    [r] = find_regions(gm).regions
    assert {"aten.masked_fill", "aten.where", "aten.gt", "aten.bitwise_not", "aten._softmax"} <= set(r.ops)
    assert [s.dtype for _, s in r.graph.inputs] == ["bool", "float32"]   # in order of first use
    out = run_reference(r.graph, {"in0": keep.numpy(), "in1": scores.numpy()})[r.graph.outputs[0]]
    assert np.abs(out - f(scores, keep).numpy()).max() < 1e-6


def test_a_bool_output_joins_its_region_with_pytorchs_values() -> None:
    """A mask the function returns (a bool output, one byte per element as torch.bool) is computed
    by the region that also computes the float result read from it."""
    def f(x: Any) -> Any:
        y = x.exp()
        return (y > 0.5) & (y < 2), y * 2.0

    x = torch.randn(4, 8)
    split = find_regions(_aten(f, x))
    [r] = split.regions
    assert not split.declined and [r.graph.spec(o).dtype for o in r.graph.outputs] == ["bool", "float32"]
    out = run_reference(r.graph, {r.graph.inputs[0][0]: x.numpy()})
    mask, y = f(x)
    assert out[r.graph.outputs[0]].dtype == np.bool_ and np.array_equal(out[r.graph.outputs[0]], mask.numpy())
    assert np.abs(out[r.graph.outputs[1]] - y.numpy()).max() < 1e-5


def test_parts_split_by_stage_are_joined_again_where_the_union_stays_convex() -> None:
    def f(x: Any, ids: Any, t: Any, w: Any) -> Any:
        b = (x * 2.0).exp()
        y = b + torch.nn.functional.embedding(ids + 1, t)   # ids + 1: integer op, a later stage
        return (y @ w) + b.sum(-1, keepdim=True)            # the matmul leaves y's group and re-enters

    args = (torch.randn(4, 8), torch.zeros(4, dtype=torch.int64), torch.randn(6, 8), torch.randn(8, 8))
    split = find_regions(_aten(f, *args), accept=None)
    ops = [set(r.ops) for r in split.regions]
    assert {"aten.exp", "aten.embedding", "aten.add", "aten.sum"} <= ops[0]
    assert len(split.regions) == 2 and ops[1] == {"aten.add"}
    gather = [n for n in split.regions[0].graph.nodes if n.op == "gather"]
    assert len(gather) == 1 and split.regions[0].graph.spec(gather[0].args[1]).dtype == "int64"


def test_views_and_no_ops_at_a_boundary_are_left_to_the_framework_and_dead_groups_dropped() -> None:
    def f(x: Any, w: Any) -> Any:
        y = (x * 2.0).exp()
        t = y.view(4, 2, 4).transpose(0, 1)   # head split: a non-contiguous view read by a matmul
        (x + 1.0).tanh()                      # nothing reads it
        return t @ w[:4], y

    gm = _aten(f, torch.randn(4, 8), torch.randn(8, 3))
    split = find_regions(gm, accept=None)
    [r] = split.regions
    assert r.ops == ("aten.mul", "aten.exp") and [o.name for o in r.outputs] == ["exp"]
    assert {n.name for n in split.free} >= {"view", "transpose"}
    assert any([n.name for n in g] == ["add", "tanh"] for g in split.dropped)
    assert not any("tanh" in d.what or "transpose" in d.what or "contiguous" in d.reason for d in split.declined)


def _masked_attention(s: Any, keep: Any, v: Any) -> Any:
    """The transformers mask chain: constant aranges index the padding mask, ``&`` a constant causal
    mask, ``where`` against 0-d constants, added to the scores of two attention layers."""
    n = s.shape[-1]
    rows, cols = torch.arange(n), torch.arange(n)
    causal = (cols[None, None, None, :] <= rows[None, None, :, None]) & torch.ones((), dtype=torch.bool)
    pad = keep[torch.arange(1)[:, None, None, None], cols[None, None, None, :]]   # aten.index, a view
    mask = torch.where(causal & pad, torch.zeros(()), torch.finfo(torch.float32).min)
    p = (s * 0.5 + mask).softmax(-1)
    return ((p @ v) + mask).softmax(-1)


def test_constant_subgraphs_are_folded_and_an_index_by_constant_grids_is_a_view() -> None:
    torch.manual_seed(0)
    s, v = torch.randn(1, 2, 4, 4), torch.randn(1, 2, 4, 4)
    keep = torch.tensor([[True, True, False, True]])
    gm = _aten(_masked_attention, s, keep, v)
    split = find_regions(gm)
    assert [d.what for d in split.declined] == ["op aten.bmm"], split.declined
    first, second = split.regions
    assert {"aten.index", "aten.bitwise_and", "aten.where", "aten._softmax"} <= set(first.ops)
    assert any(n.target is torch.ops.aten.arange.start_step or "arange" in str(n.target) for n in split.constants)
    # 0-d constants are scalars of the graph; the causal mask is computed in each region that reads it
    # (iotas compared in int registers), not a constant input that PyTorch computes in a kernel of its own
    for r in split.regions:
        assert not [x.name for x in r.inputs if x in split.constants], r.inputs
        assert {"iota", "le", "where"} <= {n.op for n in r.graph.nodes}
    env = {n: t for n, t in zip([n for n in gm.graph.nodes if n.op == "placeholder"], (s, keep, v))}
    from torch.fx import Interpreter

    class _Record(Interpreter):
        def run_node(self, n: Any) -> Any:
            env[n] = out = super().run_node(n)
            return out

    want = _Record(gm).run(s, keep, v)
    for r in split.regions:
        ins = {name: env[x].numpy() for (name, _), x in zip(r.graph.inputs, r.inputs)}
        got = run_reference(r.graph, ins)
        for o, name in zip(r.outputs, r.graph.outputs):
            assert np.abs(got[name].reshape(env[o].shape) - env[o].numpy()).max() < 1e-5
    assert np.isfinite(want.numpy()).all()


def test_an_index_that_gathers_is_declined_with_its_reason() -> None:
    gm = _aten(lambda x: x[torch.tensor([1, 0, 2])].exp() * 2.0, torch.randn(3, 4))
    split = find_regions(gm)
    assert any(d.what == "op aten.index" and "gather" in d.reason for d in split.declined), split.declined
    assert split.regions and "aten.index" not in split.regions[0].ops


def test_an_output_pytorch_keeps_permuted_is_stored_row_major_and_a_no_op_output_is_an_alias() -> None:
    def f(x: Any, w: Any) -> Any:
        q = (x @ w).view(2, 4, 2, 4).transpose(1, 2)   # heads: [2, 2, 4, 4], strided
        r = q * 2.0 + 1.0                               # PyTorch keeps q's memory order
        c = r.clone()                                   # a no-op, read inside the region and outside
        # (read outside through views only: a contiguous copy for a bmm would be stored by the region)
        return r.transpose(1, 2).reshape(8, 8) @ w, c.transpose(1, 2).reshape(8, 8) @ w, (c * 3.0).sum(-1)

    x, w = torch.randn(8, 8), torch.randn(8, 8)
    gm = _aten(f, x, w)
    [r] = [r for r in find_regions(gm).regions if "aten.add" in r.ops]
    [perm] = [p for p in r.output_perms if p is not None]
    assert perm == (0, 2, 1, 3) and [(a.name, b.name) for a, b in r.aliases] == [("clone", "add")]
    y = (x @ w).view(2, 4, 2, 4).transpose(1, 2)
    [[name, _]] = [i for i in r.graph.inputs]
    got = run_reference(r.graph, {name: (x @ w).numpy()})   # the view and transpose are in the region
    stored = got[r.graph.outputs[r.output_perms.index(perm)]]
    want = y * 2.0 + 1.0
    assert stored.shape == (2, 4, 2, 4) and torch.allclose(torch.from_numpy(stored).permute(r.restore_perm(0)), want)


def test_contiguous_copies_of_a_permuted_result_for_two_matmuls_are_stored_by_the_region() -> None:
    """``r @ w`` of a strided ``r`` makes PyTorch copy it contiguous (expand, clone) for each bmm:
    the region stores the first copy row-major and the second as a copy of it, not ``r`` permuted
    for Inductor to copy twice."""
    def f(x: Any, w: Any) -> Any:
        r = (x @ w).view(2, 4, 2, 4).transpose(1, 2) * 2.0 + 1.0
        return r @ w[:4, :4], r @ w[4:, 4:]

    x, w = torch.randn(8, 8), torch.randn(8, 8)
    [r] = find_regions(_aten(f, x, w)).regions
    assert r.ops.count("aten.clone") == 2 and r.output_perms == (None, None) and not r.aliases, r
    got = run_reference(r.graph, {r.graph.inputs[0][0]: (x @ w).numpy()})
    want = ((x @ w).view(2, 4, 2, 4).transpose(1, 2) * 2.0 + 1.0).contiguous().numpy()
    assert all(np.abs(got[o] - want).max() < 1e-6 for o in r.graph.outputs)


def test_rotary_tables_computed_in_a_region_use_sin_and_cos_and_emulate_correctly() -> None:
    """The torch.compile case: the frequencies are a graph input, so cos/sin are computed in-kernel."""
    def f(q: Any, freqs: Any) -> Any:
        emb = torch.cat((freqs, freqs), -1)
        x1, x2 = q[..., :4], q[..., 4:]
        return q * emb.cos() + torch.cat((-x2, x1), -1) * emb.sin()

    q, freqs = torch.randn(2, 2, 6, 8), torch.randn(6, 4) * 3.0
    [r] = find_regions(_aten(f, q, freqs)).regions
    assert {"sin", "cos"} <= {n.op for n in r.graph.nodes}
    env = {"q_1": q, "freqs_1": freqs}
    ins = {name: env[x.name].numpy() for (name, _), x in zip(r.graph.inputs, r.inputs)}
    got = run_reference(r.graph, ins)[r.graph.outputs[0]]
    assert np.abs(got - f(q, freqs).numpy()).max() < 1e-5
    _assert_emulates(r.graph)


def test_a_refusal_naming_a_graph_input_declines_the_first_node_reading_it() -> None:
    def refuse_two_inputs(g: Any) -> str | None:   # as the planner does: "the largest, 'in1', does not"
        return "no tensor spans all axes (the largest, 'in1', does not)" if len(g.inputs) > 1 else None

    split = find_regions(_aten(lambda a, b: (a.exp() * 2.0) + b, torch.randn(4, 6), torch.randn(4, 6)),
                         accept=refuse_two_inputs)
    assert [r.ops for r in split.regions] == [("aten.exp", "aten.mul")]
    assert [d.what for d in split.declined] == ["op aten.add"] and "'in1'" in split.declined[0].reason


@pytest.mark.parametrize("how", ["gather", "take_along_dim"])
def test_a_gather_along_the_classes_is_gather_elements_and_its_index_view_stays_outside(how: str) -> None:
    def f(x: Any, t: Any) -> Any:
        lp = torch.log_softmax(x, -1)
        p = torch.gather(lp, 1, t.unsqueeze(1)) if how == "gather" else torch.take_along_dim(lp, t.unsqueeze(1), 1)
        return -p.mean()

    x, t = torch.randn(6, 20), torch.randint(0, 20, (6,))
    split = find_regions(_aten(f, x, t))
    [region] = split.regions
    assert "gather_elements" in {n.op for n in region.graph.nodes}
    # the index is computed by PyTorch (a view; take_along_dim also wraps negative indices: remainder)
    assert {d.what for d in split.declined} <= {"op aten.unsqueeze", "op aten.remainder"}, split.declined
    ins = {name: a.numpy() for (name, _), a in zip(region.graph.inputs, [x, t.unsqueeze(1)])}
    out = run_reference(region.graph, ins)[region.graph.outputs[0]]
    assert abs(float(out.ravel()[0]) - float(f(x, t))) < 1e-5


def test_the_backward_primitives_of_inductors_decompositions_join_their_region() -> None:
    """``prims.convert_element_type`` (dropout's mask made float in a backward graph) and Inductor's
    ``fma`` (softmax's backward) map, so they no longer cut a backward region in two."""
    import torch._inductor.inductor_prims  # noqa: F401  (registers prims.fma)

    def f(g: Any, y: Any, keep: Any) -> Any:
        gy = g * y
        dx = torch.ops.prims.fma(-y, gy.sum(-1, keepdim=True), gy)
        return dx * torch.ops.prims.convert_element_type(keep, torch.float32) * 1.25

    torch.manual_seed(0)
    g, y, keep = torch.randn(2, 4, 8), torch.randn(2, 4, 8).softmax(-1), torch.rand(2, 4, 8) > 0.2
    split = find_regions(_aten(f, g, y, keep))
    [r] = split.regions
    assert {"prims.fma", "prims.convert_element_type", "aten.sum"} <= set(r.ops) and not split.declined
    ins = {"g_1": g, "y_1": y, "keep_1": keep}
    out = run_reference(r.graph, {name: ins[n.name].numpy() for (name, _), n in zip(r.graph.inputs, r.inputs)})
    assert np.abs(out[r.graph.outputs[0]] - f(g, y, keep).numpy()).max() < 1e-5


def test_a_training_dropouts_mask_product_joins_its_region() -> None:
    """Training dropout as AOTAutograd leaves it: ``rand`` (no graph.json op) and the mask ``gt``
    that compares it stay outside (Inductor draws the numbers in the kernel that compares them: a
    1-byte mask rather than 4-byte numbers handed to the region); ``mask * x`` and the rescale join
    the region around them, the mask read as a bool input and cast."""
    def f(x: Any, r: Any) -> Any:
        keep = r > 0.1
        return (keep * x.softmax(-1)) * (1 / 0.9) + 1.0, keep

    torch.manual_seed(0)
    x, r = torch.randn(2, 4, 8), torch.rand(2, 4, 8)
    gm = _aten(lambda x: f(x, torch.rand(2, 4, 8)), x)
    split = find_regions(gm)
    [reg] = split.regions
    assert {"aten._softmax", "aten.mul", "aten.add"} <= set(reg.ops) and "aten.gt" not in reg.ops
    assert {d.what for d in split.declined} == {"op aten.rand", "op aten.gt"}
    assert "random numbers" in next(d.reason for d in split.declined if d.what == "op aten.gt")
    assert sorted(s.dtype for _, s in reg.graph.inputs) == ["bool", "float32"]
    keep = r > 0.1
    feed = {name: (keep if s.dtype == "bool" else x).numpy() for name, s in reg.graph.inputs}
    out = run_reference(reg.graph, feed)[reg.graph.outputs[0]]
    assert np.abs(out - f(x, r)[0].numpy()).max() < 1e-5


def test_a_region_of_bool_outputs_only_is_left_to_inductor() -> None:
    """A mask and nothing else (an embedding backward's index checks): Inductor computes it inside
    the kernel that reads it, where a region would be one more launch."""
    split = find_regions(_aten(lambda x: (x > 0) & (x < 2), torch.randn(4, 8)))
    assert not split.regions and split.declined
    assert all("bool outputs only" in d.reason for d in split.declined)


def test_two_regions_reading_one_value_join_when_the_planner_takes_their_union() -> None:
    """A column sum of the gradient (a bias gradient) and the row-wise work on the same gradient
    are not linked by an edge; they become one region (the planner combines the column sum
    across blocks), emulated like PyTorch, instead of two kernels reading the gradient twice."""
    def f(g: Any, y: Any) -> Any:
        return (g * y).softmax(-1), g.sum(0, keepdim=True)

    torch.manual_seed(0)
    g, y = torch.randn(16, 8), torch.randn(16, 8)
    split = find_regions(_aten(f, g, y))
    [r] = split.regions
    assert {"aten._softmax", "aten.sum"} <= set(r.ops)
    ins = {"g_1": g, "y_1": y}
    out = run_reference(r.graph, {name: ins[n.name].numpy() for (name, _), n in zip(r.graph.inputs, r.inputs)})
    want = dict(zip([n.name for n in r.outputs], f(g, y)))
    for o, n in zip(r.graph.outputs, r.outputs):
        assert np.abs(out[o].reshape(want[n.name].shape) - want[n.name].numpy()).max() < 1e-5



def _rotary_backward(g: Any, cos: Any, sin: Any) -> Any:
    """What AOTAutograd makes of rotary's backward: ``rotate_half``'s slices scattered into zeros
    (``slice_backward``), added, then the head permute."""
    gs = g * sin
    lo = torch.slice_scatter(torch.zeros(g.shape), -gs[..., :4], 3, 4)
    hi = torch.slice_scatter(torch.zeros(g.shape), gs[..., 4:], 3, 0, 4)
    return (lo + hi + g * cos).permute(0, 2, 1, 3).contiguous()


def test_rotary_backwards_slices_scattered_into_zeros_are_one_region() -> None:
    """``slice_scatter`` into a constant of zeros read by ``add``: one concat, no zeros made or
    read; the region (slices, neg, scatters, adds, permute) emulates like PyTorch."""
    torch.manual_seed(0)
    args = (torch.randn(1, 2, 8, 8), torch.randn(1, 1, 8, 8), torch.randn(1, 1, 8, 8))
    split = find_regions(_aten(_rotary_backward, *args))
    [r] = split.regions
    assert r.ops.count("aten.slice_scatter") == 2 and not split.declined, split.declined
    assert len(r.inputs) == 3 and "concat" in {n.op for n in r.graph.nodes}   # the zeros are no input
    env = dict(zip(("g_1", "cos_1", "sin_1"), args))
    out = run_reference(r.graph, {name: env[x.name].numpy() for (name, _), x in zip(r.graph.inputs, r.inputs)})
    assert np.abs(out[r.graph.outputs[0]] - _rotary_backward(*args).numpy()).max() < 1e-5
    _assert_emulates(r.graph)


def _rotary_backward_full(g: Any, cos: Any, sin: Any, w: Any) -> Any:
    """Rotary's backward as AOTAutograd writes it in a model: the zeros are ``aten.full`` nodes (pulled
    into the region as numbers) and the gradient goes on through a view to a matmul."""
    gs = g * sin
    zeros = [torch.ops.aten.full(list(g.shape), 0.0) for _ in range(2)]
    lo = torch.ops.aten.slice_scatter(zeros[0], -gs[..., :4], 3, 4)
    hi = torch.ops.aten.slice_scatter(zeros[1], gs[..., 4:], 3, 0, 4)
    d = (lo + hi + g * cos).permute(0, 2, 1, 3).contiguous()
    return d, d.view(8, -1) @ w


def test_slices_scattered_into_a_full_of_zeros_the_region_computes_are_one_concat() -> None:
    """A ``full`` of zeros that the region computes itself (a number of the graph) is a base of
    zeros like a folded constant: the whole rotary backward is one region that emulates like
    PyTorch (before, its scatters were refused as reading a constant, which left the slices, the
    ``neg`` and the scatters to Inductor: three kernels where there is one)."""
    torch.manual_seed(0)
    args = (torch.randn(1, 2, 8, 8), torch.randn(1, 1, 8, 8), torch.randn(1, 1, 8, 8), torch.randn(16, 3))
    split = find_regions(_aten(_rotary_backward_full, *args))
    [r] = split.regions
    assert r.ops.count("aten.slice_scatter") == 2 and "aten.neg" in r.ops
    assert [d.what for d in split.declined] == ["op aten.mm"], split.declined
    assert len(r.inputs) == 3 and "concat" in {n.op for n in r.graph.nodes}
    env = dict(zip(("g_1", "cos_1", "sin_1"), args))
    out = run_reference(r.graph, {name: env[x.name].numpy() for (name, _), x in zip(r.graph.inputs, r.inputs)})
    want = _rotary_backward_full(*args)[0].numpy()
    assert np.abs(out[r.graph.outputs[0]].reshape(want.shape) - want).max() < 1e-5
    _assert_emulates(r.graph)


def test_a_slice_scattered_into_a_full_of_ones_is_refused() -> None:
    """Only zeros are a :class:`Padded` base: a ``full`` of another value is refused by name."""
    def f(g: Any) -> Any:
        base = torch.ops.aten.full([4, 8], 1.0)
        return torch.ops.aten.slice_scatter(base, g.exp(), 1, 0, 4) + g.sum()

    split = find_regions(_aten(f, torch.randn(4, 4)))
    assert all("aten.slice_scatter" not in r.ops for r in split.regions)
    assert any("not zeros" in d.reason or "aten.slice_scatter" in d.what for d in split.declined), split.declined


def _gqa_rotary_backward(b: Any, cos: Any, sin: Any, w: Any, keepdim: bool = True) -> Any:
    """A grouped-query key's gradient as a Llama training graph has it: the batched matmul's
    ``[H, D, S]`` gradient viewed per head, transposed, split into (key heads, heads per key) and
    summed over the heads that share a key, then rotary's backward and the matmul it feeds."""
    v = b.view(1, 4, 8, 8).permute(0, 1, 3, 2).reshape(1, 2, 2, 8, 8)
    g = v.sum(2, keepdim=True).squeeze(2) if keepdim else v.sum(2)
    return _rotary_backward_full(g, cos, sin, w)


@pytest.mark.parametrize("keepdim", [True, False])
def test_a_gqa_sum_before_rotarys_backward_is_unrolled_into_one_region(keepdim: bool) -> None:
    """The planner refuses a reduction of a reshaped tensor next to slice / concat; the sum over the
    2 heads that share a key (an axis a view split off) is mapped again as adds of its slices, and
    the head sum, rotary's backward and the head permute are one element-wise region that emulates
    like PyTorch (before: the sum was left to Inductor, a kernel of its own)."""
    torch.manual_seed(0)
    args = (torch.randn(4, 8, 8), torch.randn(1, 1, 8, 8), torch.randn(1, 1, 8, 8), torch.randn(16, 3))
    def f(b: Any, cos: Any, sin: Any, w: Any) -> Any:
        return _gqa_rotary_backward(b, cos, sin, w, keepdim)

    split = find_regions(_aten(f, *args))
    [r] = split.regions
    assert [d.what for d in split.declined] == ["op aten.mm"], split.declined
    assert "aten.sum" in r.ops and not any(n.op.startswith("reduce") for n in r.graph.nodes)
    assert sum(n.op == "slice" for n in r.graph.nodes) >= 2 + 2   # the two heads' slices, rotary's halves
    env = dict(zip(("b_1", "cos_1", "sin_1"), args))
    out = run_reference(r.graph, {name: env[x.name].numpy() for (name, _), x in zip(r.graph.inputs, r.inputs)})
    want = _gqa_rotary_backward(*args, keepdim=keepdim)[0].numpy()
    assert np.abs(out[r.graph.outputs[0]].reshape(want.shape) - want).max() < 1e-5
    _assert_emulates(r.graph)


@pytest.mark.slow  # nvcc
def test_the_unrolled_gqa_rotary_backward_region_compiles_for_sm90(tmp_path: Any) -> None:
    """The region of the unrolled head sum and rotary's backward (at a Llama-like head dim of 64,
    4 query heads per key, 16 positions) emulates over sampled schedules and builds with nvcc."""
    from helpers.lowering import check_emulates
    from helpers.nvcc import check_compiles_sm90

    from stitchtune.gpu.build import nvcc_found

    def f(b: Any, cos: Any, sin: Any, w: Any) -> Any:
        v = b.view(1, 8, 64, 16).permute(0, 1, 3, 2).reshape(1, 2, 4, 16, 64)
        g = v.sum(2, keepdim=True).squeeze(2)
        zeros = [torch.ops.aten.full(list(g.shape), 0.0) for _ in range(2)]
        gs = g * sin
        lo = torch.ops.aten.slice_scatter(zeros[0], -gs[..., :32], 3, 32)
        hi = torch.ops.aten.slice_scatter(zeros[1], gs[..., 32:], 3, 0, 32)
        return (lo + hi + g * cos).permute(0, 2, 1, 3).contiguous().view(16, -1) @ w

    split = find_regions(_aten(f, torch.randn(8, 64, 16), torch.randn(1, 1, 16, 64), torch.randn(1, 1, 16, 64),
                               torch.randn(128, 3)))
    [r] = split.regions
    check_emulates(r.graph, 2)
    if not nvcc_found():
        pytest.skip("nvcc not installed")
    check_compiles_sm90(r.graph, 1, tmp_path)


def test_a_column_sum_the_planner_refuses_is_not_unrolled() -> None:
    """Only a sum over an axis that a view split off is unrolled: a column sum over the rows of a
    tensor as it is (a bias gradient next to a concat) grows with the data, and stays declined."""
    from stitchtune.importers.torch_regions import _unrollable

    def f(a: Any, b: Any) -> Any:
        c = torch.cat((a, b), -1)
        return c * 2.0, c.sum(0, keepdim=True)

    gm = _aten(f, torch.randn(4, 8), torch.randn(4, 8))
    sums = [n for n in gm.graph.nodes if n.op == "call_function" and "sum" in str(n.target)]
    assert sums and not any(_unrollable(n) for n in sums)
    gqa = _aten(lambda b, cos, sin, w: _gqa_rotary_backward(b, cos, sin, w), torch.randn(4, 8, 8), torch.randn(1, 1, 8, 8), torch.randn(1, 1, 8, 8),
                torch.randn(16, 3))
    assert [_unrollable(n) for n in gqa.graph.nodes if n.op == "call_function" and "sum" in str(n.target)] == [True]


def test_rotary_angles_also_returned_are_still_computed_again_in_each_region() -> None:
    """A training forward returns the angles (saved for the backward): q's and k's rotary are still
    one region each that computes cos / sin itself; the returned angles stay PyTorch's."""
    def f(q: Any, k: Any, pos: Any, inv: Any) -> Any:
        ang = pos[:, None] * inv[None, :]
        emb = ang[:, None, :].expand(6, 2, 4).reshape(6, 8)   # (Llama's cat of the angles with themselves)
        cos, sin = emb.cos()[None, None], emb.sin()[None, None]

        def rot(x: Any) -> Any:
            return x * cos + torch.cat((-x[..., 4:], x[..., :4]), -1) * sin
        return rot(q), rot(k), cos, sin

    args = (torch.randn(1, 4, 6, 8), torch.randn(1, 2, 6, 8), torch.arange(6.0), torch.rand(4))
    split = find_regions(_aten(f, *args))
    rot = [r for r in split.regions if "aten.cat" in r.ops and "aten.neg" in r.ops]
    assert len(rot) == 2 and all({"aten.cos", "aten.sin"} <= set(r.ops) for r in rot), [r.ops for r in split.regions]
    assert not [d for d in split.declined if d.reason.startswith("planner")], split.declined


def test_a_clone_both_returned_is_stored_by_the_region_as_a_second_output() -> None:
    """A ``clone`` of a region's output when the graph returns both (the user may write to either: PyTorch's
    copy semantics): the region stores the clone too (a second tensor), rather than leaving a copy kernel
    to Inductor."""
    def f(s: Any, v: Any) -> Any:
        p = (s * 0.5).softmax(-1)
        c = p.clone()
        return p, c, c @ v

    s, v = torch.randn(2, 8, 8), torch.randn(2, 8, 4)
    split = find_regions(_aten(f, s, v))
    [r] = split.regions
    assert r.ops[-1] == "aten.clone" and len(r.outputs) == 2 and not r.aliases, r.ops
    out = run_reference(r.graph, {r.graph.inputs[0][0]: s.numpy()})
    want = (s * 0.5).softmax(-1).numpy()
    assert all(np.abs(out[o] - want).max() < 1e-6 for o in r.graph.outputs)


def test_a_clone_that_may_share_its_tensor_is_left_out_of_the_region() -> None:
    """A ``clone`` read only inside the graph (attention dropout at p = 0 before a matmul) may share the
    region output's tensor (importers.torch_saved.may_share): the region stores one output, the clone is
    left to the backend's rewrite (its readers read the kernel's tensor)."""
    def f(s: Any, v: Any) -> Any:
        p = (s * 0.5).softmax(-1)
        c = p.clone()
        return p, c @ v

    split = find_regions(_aten(f, torch.randn(2, 8, 8), torch.randn(2, 8, 4)))
    [r] = split.regions
    assert "aten.clone" not in r.ops and len(r.outputs) == 1, r.ops


def test_saved_outputs_are_marked_and_may_share() -> None:
    """In a training step's forward graph the outputs from ``num_forward`` on are saved for the backward:
    marked (importers.torch_saved.mark_saved_outputs); the softmax and its dropout-0 clone, both only saved,
    may share one tensor; with the user's output position they may not."""
    from torch._dynamo.backends.common import aot_autograd
    from torch._functorch.aot_autograd import make_boxed_func

    from stitchtune.importers.torch_saved import SAVED_FROM, mark_saved_outputs, may_share, returned, user_visible

    seen: list[Any] = []

    def fw(gm: Any, inputs: Any) -> Any:
        seen.append((gm, mark_saved_outputs(gm)))
        return make_boxed_func(gm.forward)

    def f(s: Any, v: Any) -> Any:
        p = (s * 0.5).softmax(-1)
        return torch.nn.functional.dropout(p, 0.0, training=True) @ v

    s, v = torch.randn(2, 8, 8, requires_grad=True), torch.randn(2, 8, 4, requires_grad=True)
    torch._dynamo.reset()
    try:
        g = torch.compile(f, backend=aot_autograd(fw_compiler=fw, bw_compiler=lambda gm, i: make_boxed_func(gm.forward)))
        g(s, v).sum().backward()
    finally:
        torch._dynamo.reset()
    [(gm, frm)] = seen
    out = next(n for n in gm.graph.nodes if n.op == "output")
    assert frm == 1 and out.meta[SAVED_FROM] == 1
    soft = next(n for n in gm.graph.nodes if "softmax" in str(n.target))
    clone = next(n for n in gm.graph.nodes if "clone" in str(n.target))
    assert returned(soft) and returned(clone) and not user_visible(soft) and not user_visible(clone)
    assert may_share(soft, clone)
    del out.meta[SAVED_FROM]   # unmarked: every output is the user's
    assert user_visible(clone) and not may_share(soft, clone)


def test_a_slice_scattered_into_zeros_read_by_anything_but_add_is_declined() -> None:
    def f(g: Any) -> Any:
        return torch.slice_scatter(torch.zeros(4, 8), g.exp(), 1, 0, 4) * 2.0

    split = find_regions(_aten(f, torch.randn(4, 4)))
    assert [r.ops for r in split.regions] == [("aten.exp",)]
    assert any("aten.slice_scatter" in d.what or "aten.mul" in d.what for d in split.declined), split.declined


def _reshaped(x: Any, g: Any) -> Any:   # a reshape to symbolic sizes, then a region reading it
    return ((x * g).reshape(x.shape[0], 1, x.shape[1], 8) + 1.0).softmax(-1)


def _merged(x: Any, g: Any) -> Any:   # a reshape to a product of symbols
    return ((x * g).reshape(x.shape[0] * x.shape[1], 8) + 1.0).softmax(-1)


def _symbolic_regions(fn: Any) -> Any:
    from torch.fx.experimental.proxy_tensor import make_fx

    return find_regions(make_fx(fn, tracing_mode="symbolic")(torch.randn(3, 4, 8), torch.randn(8))).regions


def test_symbolic_dims_are_named_in_the_regions_graph() -> None:
    from stitchtune.importers.torch_symbolic import symbolic_dims, symbolic_region

    first, second = _symbolic_regions(_reshaped)
    a, b = symbolic_dims(first.inputs)[0][:2]
    assert isinstance(a, str) and isinstance(b, str) and a != b
    assert symbolic_dims(first.inputs) == ((a, b, 8), (8,)) and symbolic_dims(second.inputs) == ((a, 1, b, 8),)
    sym = symbolic_region(second.module, symbolic_dims(second.inputs), [torch.float32], second.name)
    # named by first appearance, not by dynamo's symbols
    assert sym.names == ("d0", "d1") and sym.where == (("d0", 0, 0), ("d1", 0, 2)) and sym.index == (0,)
    assert sym.template["inputs"] == {"in0": {"shape": ["d0", 1, "d1", 8], "dtype": "float32"}}
    assert [n["op"] for n in sym.template["nodes"]][:2] == ["add", "reduce_max"]
    assert sym.extents([(5, 1, 7, 8)]) == {"d0": 5, "d1": 7}
    assert sym.shapes_at({"d0": 5, "d1": 7}) == ((5, 1, 7, 8),) == sym.graph_output_shapes({"d0": 5, "d1": 7})
    assert sym.graph_json({"d0": (2, 64), "d1": (2, 9)})["dynamic"] == {"d0": {"min": 2, "max": 64},
                                                                       "d1": {"min": 2, "max": 9}}
    # the template at concrete extents is the region's graph mapped at those shapes
    from stitchtune.importers.torch_symbolic import map_at_shapes

    graph, _, _ = map_at_shapes(second.module, [torch.empty(5, 1, 7, 8)], second.name)
    at = graph.to_dict()
    assert sym.template["nodes"] == at["nodes"] and at["inputs"]["in0"]["shape"] == [5, 1, 7, 8]


def test_a_region_without_a_symbolic_graph_says_why(monkeypatch: pytest.MonkeyPatch) -> None:
    from stitchtune.errors import StitchtuneError
    from stitchtune.importers import torch_symbolic
    from stitchtune.importers.torch_symbolic import symbolic_dims, symbolic_region

    _, merged = _symbolic_regions(_merged)
    dims = symbolic_dims(merged.inputs)
    assert dims[0][0] is None and dims[0][1] == 8   # s0*s1 rows: an expression
    with pytest.raises(StitchtuneError, match="expression of symbols"):
        symbolic_region(merged.module, dims, [torch.float32], merged.name)
    _, second = _symbolic_regions(_reshaped)
    with pytest.raises(StitchtuneError, match="no symbolic input dim"):
        symbolic_region(second.module, [(5, 1, 7, 8)], [torch.float32], second.name)
    # a probe that equals a static dim (8) names it in one mapping only: the two graphs differ
    monkeypatch.setattr(torch_symbolic, "_PROBES", ((8, 9), (1051, 1061)))
    with pytest.raises(StitchtuneError, match="other than through shapes"):
        symbolic_region(second.module, symbolic_dims(second.inputs), [torch.float32], second.name)


def _ce_decomposed(x: Any, t: Any) -> Any:
    """``F.cross_entropy(x, t, ignore_index=-100)`` as Inductor's decompositions write it."""
    from torch._inductor.decomposition import select_decomp_table
    from torch.fx.experimental.proxy_tensor import make_fx

    def f(x: Any, t: Any) -> Any:
        return torch.nn.functional.cross_entropy(x, t, ignore_index=-100)

    return make_fx(f, decomposition_table=select_decomp_table(), tracing_mode="fake")(x, t)


def test_rank1_per_row_values_are_held_as_rows() -> None:
    """Cross entropy's target ``[B]``, its mask and the picked loss (squeezed from a ``[B, 1]`` gather)
    are held as ``[B, 1]``: one region whose index is computed, whose sums are over the rows, and
    whose reference (inputs fed as ``[B, 1]``, same bytes) gives PyTorch's loss."""
    from stitchtune.importers.torch_aten import row_vectors

    x, t = torch.randn(12, 30), torch.randint(0, 30, (12,))
    t[[2, 7]] = -100
    gm = _ce_decomposed(x, t)
    ph = [n.name for n in gm.graph.nodes if n.op == "placeholder"]
    assert ph[1] in row_vectors(gm) and ph[0] not in row_vectors(gm)
    [r] = find_regions(gm).regions
    assert sorted(tuple(s.shape) for _, s in r.graph.inputs) == [(12, 1), (12, 30)]
    [pick] = [n for n in r.graph.nodes if n.op == "gather_elements"]
    assert pick.args[1] not in dict(r.graph.inputs)   # the index where(t != -100, t, 0) is computed
    feeds = {name: (x if spec.dtype == "float32" else t).numpy().reshape(spec.shape) for name, spec in r.graph.inputs}
    got = float(run_reference(r.graph, feeds)[r.graph.outputs[0]].ravel()[0])
    assert abs(got - float(torch.nn.functional.cross_entropy(x, t, ignore_index=-100))) < 1e-5


def test_a_rank1_value_also_read_along_the_columns_is_not_lifted() -> None:
    """``v[:, None]`` says per row but ``v[None, :]`` per column: ``v`` keeps its own shape."""
    from stitchtune.importers.torch_aten import row_vectors

    def f(x: Any, v: Any) -> Any:
        w = v * 2.0
        return x + w[:, None] + w[None, :]

    gm = _aten(f, torch.randn(8, 8), torch.randn(8))
    assert row_vectors(gm) == frozenset()


def _qkv_grads(dq: Any, dk: Any, dv: Any, w: Any) -> Any:
    """GPT-2's backward at the fused q/k/v projection: the heads' gradients transposed back, the
    concat, the input gradient (a matmul) and the bias gradient (a column sum of the concat)."""
    def heads(t: Any) -> Any:
        return t.permute(0, 2, 1, 3).contiguous().view(1, 8, 32)

    g = torch.cat([heads(dq), heads(dk.transpose(-1, -2)), heads(dv)], 2).view(8, 96)
    return g @ w, g.sum(0, keepdim=True)


def test_a_column_sum_next_to_a_concat_is_one_region_with_it() -> None:
    """The transposes and the concat of the q/k/v gradients and the bias gradient (the column sum of
    the concat) are one region: a column kernel evaluates a concat along its columns
    (plan.col_remap); before, the planner refused it, the column sum was declined (one kernel of the
    framework's) and the concat stayed a region of its own."""
    torch.manual_seed(0)
    args = (torch.randn(1, 4, 8, 8), torch.randn(1, 4, 8, 8), torch.randn(1, 4, 8, 8), torch.randn(96, 32))
    split = find_regions(_aten(_qkv_grads, *args))
    [r] = split.regions
    assert "aten.cat" in r.ops and "aten.sum" in r.ops
    assert not [d for d in split.declined if d.what == "op aten.sum"]
    ins = dict(zip(("dq_1", "dk_1", "dv_1", "w_1"), args))
    out = run_reference(r.graph, {name: ins[n.name].numpy() for (name, _), n in zip(r.graph.inputs, r.inputs)})
    dq, dk, dv, _ = args
    want = torch.cat([t.permute(0, 2, 1, 3).reshape(1, 8, 32) for t in (dq, dk.transpose(-1, -2), dv)], 2)
    got = {tuple(out[o].shape): out[o] for o in r.graph.outputs}
    [cat] = [v for v in got.values() if v.size == 8 * 96]
    [bias] = [v for v in got.values() if v.size == 96]
    assert np.abs(cat.reshape(8, 96) - want.reshape(8, 96).numpy()).max() < 1e-6
    assert np.abs(bias.reshape(96) - want.reshape(8, 96).sum(0).numpy()).max() < 1e-5


def _swin_shift(x: Any, g: Any, b: Any) -> Any:
    """Swin's shifted block start: LayerNorm of ``[B, H*W, C]``, viewed ``[B, H, W, C]``, a pad of nothing
    (``maybe_pad`` where the windows tile the image), the roll by -2 along H and W, the window partition."""
    h = torch.nn.functional.layer_norm(x, (x.shape[-1],), g, b).view(1, 8, 8, 8)
    h = torch.nn.functional.pad(h, (0, 0, 0, 0, 0, 0))
    h = torch.roll(h, shifts=(-2, -2), dims=(1, 2))
    return h.view(1, 2, 4, 2, 4, 8).permute(0, 1, 3, 2, 4, 5).contiguous().view(-1, 16, 8)


def test_a_layernorm_a_pad_of_nothing_and_the_roll_are_one_region() -> None:
    torch.manual_seed(0)
    args = (torch.randn(1, 64, 8), torch.randn(8), torch.randn(8))
    from torch.fx.experimental.proxy_tensor import make_fx

    from stitchtune.deploy.torch_rest import decompositions as _decompositions

    split = find_regions(make_fx(_swin_shift, decomposition_table=_decompositions(), tracing_mode="fake")(*args))
    (region,) = split.regions   # (the roll: two ``index`` of rotated constant indices)
    assert {"aten.native_layer_norm", "aten.constant_pad_nd", "aten.index", "aten.permute"} <= set(region.ops)
    from stitchtune.plan.planner import make_plan

    assert (make_plan(region.graph).family, make_plan(region.graph).N) == ("row", 8)   # one row kernel
    _assert_emulates(region.graph)
    # a pad of something is no region node (graph.json has no pad)
    padded = find_regions(_aten(lambda x: torch.nn.functional.pad(x.exp(), (0, 1)), torch.randn(4, 8)))
    assert any(d.what == "op aten.constant_pad_nd" and "no graph.json equivalent" in d.reason for d in padded.declined)
