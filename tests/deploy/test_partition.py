"""The joint-graph partition of a training step (``torch_rest.partition``, Inductor's min-cut): the
forward saves what a fused backward cannot recompute for free, no more.

A tanh-GELU MLP (GPT-2's ``NewGELUActivation``: mul, pow, add, tanh) saves only its pre-activation for
the GELU's backward (AOTAutograd's default partition saved three more [rows, 4 x hidden] tensors that
the forward region wrote and the backward region read again); rotary cos / sin are saved, not
recomputed (the backward's rotary kernels would inline sin / cos and their range-reduction slow path);
the backend's gradients still equal eager's, in both cases."""

from __future__ import annotations

import math
from typing import Any

import pytest

torch = pytest.importorskip("torch")

from stitchtune.deploy.model_tuning import capture_graphs  # noqa: E402
from stitchtune.importers.torch_saved import SAVED_FROM  # noqa: E402


class _TanhGeluMlp(torch.nn.Module):
    """GPT-2's MLP: c_fc, tanh-GELU written out (as transformers' NewGELUActivation), c_proj."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = torch.nn.Linear(16, 64)
        self.proj = torch.nn.Linear(64, 16)

    def forward(self, x: Any) -> Any:
        h = self.fc(x)
        g = 0.5 * h * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (h + 0.044715 * torch.pow(h, 3.0))))
        return self.proj(g)


class _Rotary(torch.nn.Module):
    """Llama's rotary embedding of a projection: angles from positions, cos / sin, rotate_half."""

    def __init__(self) -> None:
        super().__init__()
        self.q = torch.nn.Linear(16, 16)
        self.register_buffer("inv_freq", 1.0 / 10000 ** (torch.arange(0, 16, 2).float() / 16), persistent=False)

    def forward(self, x: Any) -> Any:
        pos = torch.arange(x.shape[1], dtype=torch.float32)
        emb = torch.cat([pos[:, None] * self.inv_freq[None, :]] * 2, dim=-1)
        cos, sin = emb.cos(), emb.sin()
        q = self.q(x)
        half = q.shape[-1] // 2
        rotated = torch.cat([-q[..., half:], q[..., :half]], dim=-1)
        return q * cos + rotated * sin


_VIEWS = {torch.ops.aten.view.default, torch.ops.aten.reshape.default, torch.ops.aten._unsafe_view.default}


def _saved(fw: Any) -> list[Any]:
    """The tensors a captured forward graph computes and saves for the backward (its outputs from
    SAVED_FROM on; graph inputs and views of another value left out)."""
    out = next(n for n in fw.graph.nodes if n.op == "output")
    saved = [n for n in out.args[0][out.meta[SAVED_FROM]:] if n is not None]
    return [n for n in saved if n.op == "call_function" and n.target not in _VIEWS]


def _graphs(model: Any, x: Any) -> dict[str, Any]:
    return {g.kind: g.module for g in capture_graphs(model, [x], "train")}


def test_tanh_gelu_saves_only_its_pre_activation() -> None:
    torch.manual_seed(0)
    g = _graphs(_TanhGeluMlp(), torch.randn(4, 8, 16))
    wide = [n for n in _saved(g["forward"]) if n.meta["val"].shape[-1] == 64]
    # the pre-activation alone (the mm's output + bias); the backward recomputes tanh from it
    assert len(wide) == 1, [n.name for n in wide]
    assert any(n.target == torch.ops.aten.tanh.default for n in g["backward"].graph.nodes)


def test_rotary_cos_sin_are_saved_not_recomputed() -> None:
    torch.manual_seed(0)
    g = _graphs(_Rotary(), torch.randn(2, 8, 16))
    trig = {torch.ops.aten.sin.default, torch.ops.aten.cos.default}
    assert not [n for n in g["backward"].graph.nodes if n.target in trig]
    assert any(n.target in trig for n in g["forward"].graph.nodes)


@pytest.mark.parametrize("make", [_TanhGeluMlp, _Rotary], ids=["tanh-gelu", "rotary"])
def test_backend_gradients_equal_eager(make: Any, fresh_backend: None) -> None:
    x = torch.randn(2, 8, 16, generator=torch.Generator().manual_seed(1))
    grads = []
    for compiled in (False, True):
        torch.manual_seed(0)
        m = make()
        call = torch.compile(m, backend="stitchtune") if compiled else m
        out = call(x)
        (out * out).sum().backward()
        grads.append({n: p.grad.detach().clone() for n, p in m.named_parameters()})
    want, got = grads
    scale = max(float(w.abs().max()) for w in want.values())
    for n in want:
        assert float((got[n] - want[n]).abs().max()) <= 1e-5 * scale, n


def _tiny(name: str) -> Any:
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    if name == "gpt2":
        cfg = transformers.GPT2Config(n_embd=64, n_layer=2, n_head=4, vocab_size=128, n_positions=64, resid_pdrop=0.0,
                                      embd_pdrop=0.0, attn_pdrop=0.0, bos_token_id=0, eos_token_id=0)
        model = transformers.GPT2Model(cfg)
    else:
        cfg = transformers.LlamaConfig(hidden_size=64, num_attention_heads=4, num_key_value_heads=2,
                                       intermediate_size=96, num_hidden_layers=2, vocab_size=128,
                                       max_position_embeddings=64)
        model = transformers.LlamaModel(cfg)
    cfg._attn_implementation = "eager"
    cfg.use_cache = False
    return model


@pytest.mark.slow
@pytest.mark.parametrize("name", ["gpt2", "llama"])
def test_every_training_region_emulates_equal_to_float64(name: str) -> None:
    """The regions of a training step as the new partition cuts them (the forward's GELU / SiLU without
    saved intermediates, the backward's recomputation, rotary with saved cos / sin), each lowered with its
    heuristic schedule and emulated, against the float64 reference (1e-5 of each output's largest value)."""
    import numpy as np

    from stitchtune.cost.heuristic import heuristic_schedule
    from stitchtune.deploy.model_tuning import capture_regions
    from stitchtune.emulate.emulator import emulate_program
    from stitchtune.graph.reference import random_inputs, run_reference
    from stitchtune.hardware.device import get_device
    from stitchtune.lower.entry import lower
    from stitchtune.lower.resources import legal_space
    from stitchtune.plan.planner import make_plan

    dev = get_device("h200")
    regions = capture_regions(_tiny(name), (torch.randint(0, 128, (2, 32)),), "train")
    assert len(regions) > 10
    for r in regions:
        g = r.graph
        plan = make_plan(g)
        space = legal_space(g, plan, dev)
        x = random_inputs(g, 1)
        out = emulate_program(lower(g, plan, heuristic_schedule(plan, dev, space), dev, space), x,
                              coresident_limit=lambda k: 1 << 30)
        for o, want in run_reference(g, x).items():
            got = np.asarray(out[o]).reshape(want.shape).astype(np.float64)
            scale = max(1e-30, float(np.abs(want.astype(np.float64)).max()))
            assert float(np.abs(got - want.astype(np.float64)).max()) <= 1e-5 * scale, (r.name, o)


def _dynamic_step(f: Any, shapes: list[tuple[Any, ...]]) -> tuple[int, list[int]]:
    """``f`` compiled with dynamic shapes through AOTAutograd and the backend's partition (graphs run
    eagerly), a training step at each of ``shapes`` (x's shape; t its first dim of class indices):
    how many forward graphs were compiled, and how many nodes each partition marked must-save."""
    from torch._dynamo.backends.common import aot_autograd
    from torch._functorch.aot_autograd import make_boxed_func
    from torch.utils.checkpoint import CheckpointPolicy

    from stitchtune.deploy.torch_rest import decompositions, partition

    forwards: list[Any] = []
    marked: list[int] = []

    def part(joint: Any, joint_inputs: Any, **kwargs: Any) -> Any:
        nodes = list(joint.graph.nodes)
        out = partition()(joint, joint_inputs, **kwargs)
        marked.append(sum(n.meta.get("recompute") == CheckpointPolicy.MUST_SAVE for n in nodes))
        return out

    def fw(gm: Any, _: Any) -> Any:
        forwards.append(gm)
        return make_boxed_func(gm.forward)

    backend = aot_autograd(fw_compiler=fw, bw_compiler=lambda gm, _: make_boxed_func(gm.forward),
                           decompositions=decompositions(), partition_fn=part)
    torch._dynamo.reset()
    try:
        step = torch.compile(f, backend=backend, dynamic=True)
        for shape in shapes:
            x = torch.randn(*shape, requires_grad=True)
            step(x, torch.randint(0, shape[-1], shape[:1])).backward()
    finally:
        torch._dynamo.reset()
    return len(forwards), marked


def test_dynamic_shapes_compile_once_and_the_loss_count_is_still_saved() -> None:
    """Under ``dynamic=True`` the partition decides its must-save marks without guarding a symbolic
    size (an ``int()`` of a SymInt specialised the batch: every new batch size recompiled the step), and
    the one-element count of a label-smoothed cross-entropy (a full reduction of the symbolic rows) is
    still marked."""
    def loss(x: Any, t: Any) -> Any:
        return torch.nn.functional.cross_entropy(torch.tanh(x) * 2.0, t, label_smoothing=0.1)

    compiled, marked = _dynamic_step(loss, [(4, 8), (6, 8), (9, 8)])
    assert compiled == 1
    assert marked and all(m >= 1 for m in marked), marked


def _dropout_times(x: Any, w: Any) -> Any:
    return torch.nn.functional.dropout(torch.tanh(x), 0.5, training=True) * w


def test_dropout_mask_is_not_redrawn_under_aggressive_recomputation(fresh_backend: None) -> None:
    """min-cut bans recomputing dropout's ``rand`` only through its allowlist; under
    ``aggressive_recomputation`` it recomputed ``rand`` in the backward (a new mask: w's gradient was not the
    forward's kept values, up to 2.0 off). The partition marks random ops must-save: no draw in the
    backward, and the gradient of ``dropout(tanh(x)) * w`` at ``w = 1`` is exactly the forward's output, with
    the graphs run eagerly and with the backend."""
    import torch._functorch.config as functorch_config
    from torch._dynamo.backends.common import aot_autograd
    from torch._functorch.aot_autograd import make_boxed_func

    from stitchtune.deploy.torch_rest import decompositions, partition

    graphs: dict[str, Any] = {}

    def keep(kind: str) -> Any:
        def compile_(gm: Any, _: Any) -> Any:
            graphs[kind] = gm
            return make_boxed_func(gm.forward)
        return compile_

    eager = aot_autograd(fw_compiler=keep("forward"), bw_compiler=keep("backward"),
                         decompositions=decompositions(), partition_fn=partition())
    x = torch.randn(64, 32)
    with functorch_config.patch(aggressive_recomputation=True):
        for backend in (eager, "stitchtune"):
            torch._dynamo.reset()
            w = torch.ones(64, 32, requires_grad=True)
            y = torch.compile(_dropout_times, backend=backend)(x, w)
            y.sum().backward()
            assert 0.3 < float((y != 0).float().mean()) < 0.7
            assert torch.equal(w.grad, y.detach()), backend
    torch._dynamo.reset()
    rand = [n.name for n in graphs["backward"].graph.nodes
            if torch.Tag.nondeterministic_seeded in getattr(n.target, "tags", ())]
    assert not rand
