"""CUDA graphs for the torch backend: ``mode="reduce-overhead"`` or ``options={"cudagraphs": True}``.

The stitched regions are captured the way Inductor captures its own kernels: by Inductor's CUDA-graph
trees (``torch._inductor.cudagraph_trees``), over the whole compiled graph, the ``stitchtune::region``
calls included. A region call is capturable: after its first call on a stream (the trees' warm-up run,
on the stream they capture on) it only allocates its outputs through torch's caching allocator (the
graph's private pool during a capture) and enqueues launches; the gathers' error flags are mapped host
memory, written by the replayed kernels and read after each call of the compiled graph
(:mod:`~stitchtune.deploy.torch_flags`). Generic kernels of dynamic shapes are captured per shape, as
the trees record one graph per distinct set of sizes.

Contract
--------
* :class:`GraphMode` is the choice of one ``torch.compile`` call, shared by its forward and backward
  compilers (``on``; ``dynamo_inputs``: how many inputs dynamo's graph has, which gives the number of
  parameters and buffers that lead AOTAutograd's forward inputs, kept at fixed addresses; the device
  index the forward found, which the backward reuses).
* :meth:`GraphMode.inductor_kwargs` is what ``compile_fx_inner`` gets for the rest of the graph
  (``fallback="inductor"``): ``cudagraphs`` and ``static_input_idxs`` as Inductor's own
  ``compile_fx`` passes them.
* :meth:`GraphMode.wrap` wraps a boxed callable that runs the graph without Inductor
  (``fallback="eager"``, or Inductor failed) in ``cudagraphify_impl``, as dynamo's ``cudagraphs``
  backend does; a graph the trees cannot capture (CPU tensors, an input mutation, an incompatible op)
  runs as it is (logged at info level, with the reason).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

__all__ = ["GraphMode"]

if TYPE_CHECKING:
    from torch._inductor.cudagraph_utils import BoxedDeviceIndex

log = logging.getLogger(__name__)


@dataclass
class GraphMode:
    """Whether and how one compile's graphs are captured in CUDA graphs (see module docstring)."""

    on: bool
    dynamo_inputs: int = 0
    _device: BoxedDeviceIndex | None = field(default=None, repr=False)

    def _fixed(self, gm: Any, inputs: Sequence[Any], kind: str) -> int:
        """How many leading inputs keep their addresses (parameters, buffers; the backward's tangents count)."""
        from torch._inductor.utils import count_tangents, num_fw_fixed_arguments

        if kind == "backward":
            return int(count_tangents(gm))
        return int(num_fw_fixed_arguments(self.dynamo_inputs, len(inputs)))

    def _static(self, gm: Any, inputs: Sequence[Any], kind: str) -> list[int]:
        """The inputs the trees keep at fixed addresses (not copied at each replay), as Inductor's
        ``compile_fx`` chooses them: the parameters and buffers (AOTAutograd's static input indices)."""
        from torch._inductor.compile_fx import get_static_input_idxs

        fixed = self._fixed(gm, inputs, kind)
        return list(range(fixed)) if kind == "backward" else list(get_static_input_idxs(fixed))

    def device_index(self) -> BoxedDeviceIndex:
        """The BoxedDeviceIndex shared by the forward and backward compilers."""
        if self._device is None:
            from torch._inductor.cudagraph_utils import BoxedDeviceIndex

            self._device = BoxedDeviceIndex(None)
        return self._device

    def inductor_kwargs(self, gm: Any, inputs: Sequence[Any], kind: str) -> dict[str, Any]:
        """``compile_fx_inner``'s CUDA-graph arguments (none when off)."""
        if not self.on:
            return {}
        from torch._inductor.utils import BoxedBool

        return {"cudagraphs": BoxedBool(True), "static_input_idxs": self._static(gm, inputs, kind),
                "boxed_forward_device_index": self.device_index()}

    def wrap(self, run: Any, gm: Any, inputs: Sequence[Any], kind: str) -> Any:
        """``run`` (boxed: takes the list of inputs) captured and replayed by Inductor's CUDA-graph trees,
        or ``run`` itself when off or when the graph cannot be captured (logged)."""
        if not self.on:
            return run
        from torch._dynamo.backends.cudagraphs import (
            check_for_skip,
            find_input_mutations,
            get_device_index,
            get_stack_traces,
        )
        from torch._inductor.cudagraph_trees import cudagraphify_impl
        from torch._inductor.cudagraph_utils import get_placeholder_info

        fixed = self._fixed(gm, inputs, kind)
        skip = check_for_skip(gm, fixed)
        if skip:
            log.info("stitchtune: the %s graph is not captured in a CUDA graph: %s", kind, skip)
            return run
        index = get_device_index(gm)
        self.device_index().set(index)
        out = cudagraphify_impl(run, list(inputs), self._static(gm, inputs, kind), device_index=index,
                                is_backward=kind == "backward", is_inference=kind == "inference",
                                stack_traces=get_stack_traces(gm), placeholders=get_placeholder_info(gm.graph),
                                mutated_input_idxs=find_input_mutations(gm.graph))
        out._boxed_call = True  # type: ignore[attr-defined]
        return out
