"""The rest of a graph the torch backend stitched (what no region took): Inductor's decompositions
without the composite ops the importer maps whole (:func:`decompositions`), the forward / backward
partitioner of a training step (:func:`partition`, Inductor's min-cut), and :func:`compile_rest`,
which compiles the rest with Inductor (re-decomposed, dropout's random ops made Inductor's own, the
channels-last layout optimisation for a backward graph that convolves channels-last tensors:
:func:`channels_last_conv_backward`) or runs it eagerly (``fallback="eager"``, or when Inductor fails:
logged as a warning).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

from stitchtune.deploy.backend_options import BackendOptions

log = logging.getLogger(__name__)


def decompositions(keep_whole: bool = True) -> dict[Any, Any]:
    """Inductor's decompositions, without the composite ops the importer maps whole."""
    import torch
    from torch._inductor.decomposition import select_decomp_table

    aten = torch.ops.aten
    keep = {aten.native_layer_norm.default, aten._softmax.default, aten._log_softmax.default,
            aten.gelu.default, aten.silu.default, aten.rms_norm.default, aten.softmax.int,
            aten.log_softmax.int, aten.layer_norm.default, aten._native_batch_norm_legit_no_training.default,
            # windowed ops stay whole (the framework's; Inductor's max-pool decomposition also
            # needs torch._inductor.lowering imported, which only compile_fx does)
            aten.max_pool2d_with_indices.default, aten.max_pool3d_with_indices.default}
    table = select_decomp_table()
    return {k: v for k, v in table.items() if not (keep_whole and k in keep)}


def partition() -> Any:
    """The joint-graph partitioner both the backend and the capture use (AOTAutograd ``partition_fn``).

    Inductor's ``min_cut_rematerialization_partition``: it saves the fewest bytes for the backward and
    recomputes cheap element-wise steps there, so a forward region does not write (nor a backward
    region read) intermediates that a fused kernel recomputes for free. AOTAutograd's default saves
    every intermediate: GPT-2's tanh-GELU saved three 50 MB tensors beside its pre-activation, Llama's
    SiLU-gate one 46 MB tensor (results/train-gap-2026-12-07-s14). Exceptions, saved and never recomputed
    (:func:`_save_not_recompute`): the ops of :data:`SAVED_NOT_RECOMPUTED`, one-element reductions and random
    ops (dropout's ``rand``: recomputed, the backward would draw a new mask). (Where
    the backward needs nothing from the forward, min-cut hands over to the default partitioner, which saves
    those marked values anyway: a few bytes.)"""
    from torch._functorch.partitioners import min_cut_rematerialization_partition

    def partition_fn(joint: Any, joint_inputs: Any, **kwargs: Any) -> Any:
        _save_not_recompute(joint)
        return min_cut_rematerialization_partition(joint, joint_inputs, **kwargs)

    return partition_fn


#: ATen ops whose values the backward reads from the forward rather than recomputing them: ``sin`` /
#: ``cos`` need a range-reduction slow path (a local-memory array: spills in every kernel that inlines
#: them) and are taken of small tensors (Llama's rotary tables, [batch, seq, head_dim]: 1 MB), so saving
#: them costs next to nothing while recomputing them puts sin/cos into each backward rotary kernel.
SAVED_NOT_RECOMPUTED = ("sin", "cos")


def _save_not_recompute(joint: Any) -> int:
    """Mark nodes of ``joint`` must-save for the partitioner (``meta["recompute"]``, the activation-
    checkpointing policy it honours) and return how many: every op of :data:`SAVED_NOT_RECOMPUTED`, and
    every one-element value reduced from a larger tensor (a loss's count of kept targets): saving it
    costs a few bytes, while recomputing it puts a reduction over every row in front of the backward
    region's per-row values, which no one-launch row kernel computes (the cross-entropy backward with
    label smoothing); and every random op (``nondeterministic_seeded``: dropout's ``rand``). min-cut bans
    those only while ``ban_recompute_not_in_allowlist`` holds; under ``torch._functorch.config``'s
    ``aggressive_recomputation`` (or an ``activation_memory_budget`` low enough for its aggressive pass) it
    recomputed them in the backward, which drew a new dropout mask: gradients of a mask the forward never
    applied (Inductor does the same). A budget of 0 saves only the graph's inputs whatever is marked:
    random ops are recomputed there still."""
    import torch
    from torch.utils.checkpoint import CheckpointPolicy

    targets = {getattr(torch.ops.aten, name).default for name in SAVED_NOT_RECOMPUTED}
    marked = 0
    for node in joint.graph.nodes:
        if node.op != "call_function" or "recompute" in node.meta:
            continue
        if node.target in targets or _scalar_of_tensor(node) or _random(node):
            node.meta["recompute"] = CheckpointPolicy.MUST_SAVE
            marked += 1
    return marked


def _random(node: Any) -> bool:
    """``node`` draws random numbers (an op tagged ``nondeterministic_seeded``: ``rand``, ``bernoulli``, ...)."""
    import torch

    return torch.Tag.nondeterministic_seeded in getattr(node.target, "tags", ())


def _numel(value: Any) -> Any:
    """Elements of a node's (fake) tensor value (an int, or a SymInt under dynamic shapes); None for
    anything else. Never ``int()`` of a SymInt: that guards the symbolic size to its example value, so a
    training step compiled with dynamic shapes would recompile for every new size."""
    import torch

    return value.numel() if isinstance(value, torch.Tensor) else None


def _scalar_of_tensor(node: Any) -> bool:
    """``node``'s value has one element and one of its tensor arguments more (a full reduction); sizes
    decided without guards (``statically_known_true``): a symbolic count not known to be 1 (or more) is not."""
    from torch.fx.experimental.symbolic_shapes import statically_known_true

    n = _numel(node.meta.get("val"))
    if n is None or not statically_known_true(n == 1):
        return False
    sizes = [_numel(a.meta.get("val")) for a in node.args if hasattr(a, "meta")]
    return any(m is not None and statically_known_true(m > 1) for m in sizes)


def _redecompose(gm: Any, example_inputs: Sequence[Any]) -> Any:
    """``gm`` traced again with all of Inductor's decompositions (what compile_fx_inner expects)."""
    from torch._guards import detect_fake_mode
    from torch.fx.experimental.proxy_tensor import make_fx

    table = decompositions(keep_whole=False)
    if not any(getattr(n, "target", None) in table for n in gm.graph.nodes):
        return gm
    fake = detect_fake_mode(example_inputs)
    import contextlib

    with fake if fake is not None else contextlib.nullcontext():
        return make_fx(gm, decomposition_table=table)(*example_inputs)


def _inductor_random(gm: Any, example_inputs: Sequence[Any]) -> None:
    """Replace ``gm``'s ATen random ops (dropout's ``rand``) by Inductor's seeded ones in place, as
    Inductor's joint-graph passes do (none when ``fallback_random`` is set)."""
    from torch._guards import detect_fake_mode
    from torch._inductor.fx_passes.replace_random import replace_random_passes
    from torch._inductor.virtualized import V
    from torch._subclasses.fake_tensor import FakeTensorMode

    import torch

    if not any(torch.Tag.nondeterministic_seeded in getattr(n.target, "tags", ())
               for n in gm.graph.nodes if n.op == "call_function"):
        return
    with V.set_fake_mode(detect_fake_mode(example_inputs) or FakeTensorMode()):
        changed = replace_random_passes(gm)
    if changed:
        gm.graph.lint()
        gm.recompile()


def channels_last_conv_backward(gm: Any) -> bool:
    """Whether ``gm`` has a 2-D ``convolution_backward`` whose gradient and input PyTorch both holds
    channels-last (ConvNeXt's, whose layer norms run over NHWC; not ViT's patch embedding, whose
    input is the NCHW image: there the layout optimisation would copy the image instead of the
    gradient, and the weight gradient back). Inductor decides its layout
    optimisation from forward convolutions only, so a backward graph never gets it; without it, its
    lowering orders a convolution's input and gradient by the stride order of the weight gradient
    (for a depthwise weight ``[C, 1, k, k]`` the size-1 dim ties and the order is none of the
    tensors'): copies of the input and the gradient before the library call and of its result
    after it, two to four kernels per convolution. With it, channels-last tensors are taken as
    they are."""
    import torch

    def channels_last(v: Any) -> bool:
        return (isinstance(v, torch.Tensor) and v.dim() == 4 and not v.is_contiguous()
                and v.is_contiguous(memory_format=torch.channels_last))

    return any(n.op == "call_function" and n.target is torch.ops.aten.convolution_backward.default
               and all(channels_last(getattr(a, "meta", {}).get("val")) for a in n.args[:2])
               for n in gm.graph.nodes)


def compile_rest(gm: Any, example_inputs: Sequence[Any], opts: BackendOptions, graphs: Any,
                 kind: str, n_stitched: int) -> Any:
    """The callable (boxed) that runs ``gm``: Inductor, or eager (also when Inductor fails); captured in
    CUDA graphs as ``graphs`` (a :class:`~stitchtune.deploy.torch_graphs.GraphMode`; None: not) says."""
    from torch._functorch.aot_autograd import make_boxed_func

    from stitchtune.deploy.torch_graphs import GraphMode

    graphs = graphs if graphs is not None else GraphMode(False)

    if opts.fallback == "inductor":
        try:
            from torch._inductor.compile_fx import compile_fx_inner

            from torch._inductor import config as inductor_config

            from stitchtune.deploy.torch_direct import inductor_direct_calls

            inductor_direct_calls()   # its wrapper calls the regions without the dispatcher

            rest = _redecompose(gm, example_inputs)
            kwargs: dict[str, Any] = {"is_backward": kind == "backward", "is_inference": kind == "inference"}
            layout = kind == "backward" and channels_last_conv_backward(rest)
            kwargs.update(graphs.inductor_kwargs(rest, example_inputs, kind))
            # dropout's rand: Inductor replaces it by its own random op in its joint-graph passes,
            # which run before a backend's graph compilers; that pass runs here, so the random
            # numbers are made inside the kernel that reads them (the mask), as Inductor alone
            # does, not by an ATen launch per dropout. No layout optimisation: the backward graph
            # was traced with the forward's strides (a channels-last activation saved by the
            # forward breaks its views); but a backward graph that convolves channels-last
            # tensors takes it (channels_last_conv_backward: its inputs' layouts are fixed)
            with inductor_config.patch(layout_optimization=layout, force_layout_optimization=layout):
                _inductor_random(rest, example_inputs)
                return compile_fx_inner(rest, example_inputs, **kwargs)
        except Exception as exc:  # noqa: BLE001 - never break a model: run the rest eagerly
            opts.reraise(exc)
            log.warning("stitchtune: Inductor failed on the %s graph (%s: %s); running it eagerly",
                        kind, type(exc).__name__, str(exc).splitlines()[0] if str(exc) else "")
    from stitchtune.deploy.torch_direct import direct_calls

    return graphs.wrap(make_boxed_func(direct_calls(gm).forward), gm, example_inputs, kind)
