"""Region calls without torch's dispatcher: an AOTAutograd graph run as it is calls
:func:`~stitchtune.deploy.torch_ops.region_op` directly (:func:`direct_calls`), and Inductor's generated
wrapper is made to (:func:`inductor_direct_calls`). Apart from :mod:`stitchtune.deploy.torch_fast`
(the thin per-call path itself), which :mod:`~stitchtune.deploy.torch_ops` uses: this module sits above
both."""

from __future__ import annotations

from typing import Any

from stitchtune.deploy.torch_ops import region_op


def direct_calls(gm: Any) -> Any:
    """A copy of ``gm`` (a graph after AOTAutograd, run as it is: the ``fallback="eager"`` path) whose
    ``stitchtune::region`` calls call :func:`~stitchtune.deploy.torch_ops.region_op` directly, without
    torch's dispatcher: at run time nothing is left to dispatch (autograd and functionalization were
    traced by AOTAutograd, fake tensors only meet the op while tracing), and the dispatcher's boxing
    would cost as much as the region's thin path. ``gm`` itself is untouched (CUDA-graph capture
    inspects its ops); a graph without region calls is returned as it is. Not applied to Inductor's
    output (its wrapper calls ``torch.ops.stitchtune.region.default``)."""
    import torch

    op = torch.ops.stitchtune.region.default
    if not any(n.op == "call_function" and n.target is op for n in gm.graph.nodes):
        return gm
    graph = torch.fx.Graph()
    graph.set_codegen(gm.graph._codegen)
    out = graph.graph_copy(gm.graph, {})
    graph.output(out)
    for n in graph.nodes:
        if n.op == "call_function" and n.target is op:
            n.target = region_op
    return torch.fx.GraphModule(gm, graph)


#: the name the Inductor-generated wrapper calls :func:`~stitchtune.deploy.torch_ops.region_op` by
DIRECT_NAME = "stitchtune_region_op"


def inductor_direct_calls() -> bool:
    """Make Inductor's Python wrapper call :func:`~stitchtune.deploy.torch_ops.region_op` directly for
    each ``stitchtune::region`` call (``stitchtune_region_op(key, [inputs])``, imported once at the top
    of the generated module) instead of ``torch.ops.stitchtune.region.default`` through the dispatcher,
    through Inductor's registry of custom extern-kernel codegen. Idempotent; False (the dispatcher path
    stays) where this torch has no such registry."""
    try:
        from torch._inductor.codegen import custom_extern_kernel_codegen as custom
        from torch._inductor.codegen.wrapper import ExternKernelAllocLine
        from torch._inductor.virtualized import V
    except ImportError:
        return False
    registry = getattr(custom, "CUSTOM_EXTERN_KERNEL_CODEGEN", None)
    if registry is None:
        return False
    name = "torch.ops.stitchtune.region.default"
    if name in registry:
        return True

    def codegen(node: Any, writeline: Any) -> None:
        wrapper = V.graph.wrapper_code
        wrapper.add_import_once(f"from stitchtune.deploy.torch_ops import region_op as {DIRECT_NAME}")
        node.python_kernel_name = DIRECT_NAME
        writeline(ExternKernelAllocLine(wrapper, node))

    registry[name] = custom.CustomCodegen(python=codegen)
    return True
