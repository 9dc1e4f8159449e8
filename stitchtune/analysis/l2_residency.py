"""How much of a model region's input is still in the L2 when the region starts (an estimate, for the audit).

Contract
--------
* :func:`producer_inputs(region) -> tuple[ProducedInput, ...]`: for each input of a captured
  :class:`~stitchtune.importers.torch_regions.TorchRegion` that an FX op computed (not a parameter or a model
  input), its bytes and the bytes moved between its producer and the region: what the FX ops in between read
  and write (their outputs and their inputs other than this one; views, ``getitem`` and the region's own
  nodes move nothing). Bytes come from the nodes' ``meta["val"]``: a tensor's, the sum over a tuple or list of
  them (an op with several outputs, e.g. ``sort``), 0 where a node has none. An input the region reads twice
  (one FX node behind two of its inputs) is one entry: the L2 holds it once.
* :func:`resident_bytes(region, capacity) -> float`: the bytes of those inputs an LRU cache of ``capacity``
  bytes would still hold: ``sum(max(0, min(S, capacity - D)))`` over them (S an input's bytes, D the bytes
  moved since). A CPU estimate, never a measurement: the GPU's L2 is not strictly LRU, and the GEMM that
  wrote the input also reads its operands.
* :func:`credited_us(time_us, resident, device, coefficients) -> float`: the sum over a region's occurrences
  (``resident``: each one's resident bytes) of ``time_us`` less that occurrence's resident bytes at the fitted
  bandwidth ceiling (``bw_efficiency`` x copy bandwidth), never below ``min(time_us, ramp_us)``: the fitted model's
  time if those bytes came from the L2 instead of DRAM (an upper bound of the saving: a kernel below the ceiling
  saves less). PREDICTED.

Why: the fitted cost model counts every unique byte of a launch as a DRAM byte (its rows were timed after an L2
flush), while in a model the GEMM just before a region often leaves the region's input in the 60 MiB L2 of an
H200; Inductor's kernels of BERT's training step read 4.0-4.5 TB/s of region bytes that way
(results/cost-fit-2026-12-07-s13/README.md).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

from stitchtune.cost.fitted import Coefficients
from stitchtune.hardware.device import Device

__all__ = ["ProducedInput", "credited_us", "producer_inputs", "resident_bytes"]

#: FX ops that move no data (views, tuple access): not counted between a producer and its reader
NO_TRAFFIC = frozenset({"view", "_unsafe_view", "permute", "expand", "t", "transpose", "alias", "select", "slice",
                        "unsqueeze", "squeeze", "reshape", "as_strided", "getitem", "detach"})


@dataclass(frozen=True)
class ProducedInput:
    """An input of a region computed by an FX op: its bytes and the bytes moved since it was written."""

    name: str
    nbytes: float
    moved_since: float


def _val_bytes(val: Any) -> float:
    """The bytes of a node's ``meta["val"]``: a tensor, or a tuple / list of them (other values: 0)."""
    if isinstance(val, (tuple, list)):
        return sum(_val_bytes(v) for v in val)
    if not (hasattr(val, "numel") and hasattr(val, "element_size")):
        return 0.0
    return float(val.numel() * val.element_size())


def _bytes(node: Any) -> float:
    return _val_bytes(getattr(node, "meta", {}).get("val"))


def _op(node: Any) -> str:
    """``aten.mm.default`` -> ``mm``; ``operator.getitem`` -> ``getitem``."""
    parts = str(getattr(node.target, "__name__", node.target)).split(".")
    return parts[0] if len(parts) < 3 else parts[-2]


def producer_inputs(region: Any) -> tuple[ProducedInput, ...]:
    """See the module docstring. ``region``: a captured region with ``nodes`` and ``inputs`` (FX nodes)."""
    if not region.nodes:
        return ()
    nodes = list(region.nodes[0].graph.nodes)
    order = {n: i for i, n in enumerate(nodes)}
    first, own = order[region.nodes[0]], set(region.nodes)
    out = []
    for inp in dict.fromkeys(region.inputs):   # one node behind two inputs is one tensor in the L2
        if getattr(inp, "op", "") != "call_function" or inp not in order:
            continue
        moved = 0.0
        for n in nodes[order[inp] + 1:first]:
            if n.op != "call_function" or n in own or _op(n) in NO_TRAFFIC:
                continue
            moved += _bytes(n) + sum(_bytes(a) for a in n.all_input_nodes if a is not inp)
        out.append(ProducedInput(str(inp.name), _bytes(inp), moved))
    return tuple(out)


def resident_bytes(region: Any, capacity: float) -> float:
    """See the module docstring."""
    return float(sum(max(0.0, min(p.nbytes, capacity - p.moved_since)) for p in producer_inputs(region)))


def credited_us(time_us: float, resident: Sequence[float], device: Device, coefficients: Coefficients) -> float:
    """See the module docstring."""
    cap_gbs = coefficients.bw_efficiency * device.effective_copy_bandwidth_gbs()   # bytes per ns
    floor = min(time_us, coefficients.ramp_us)
    return float(sum(max(floor, time_us - r / cap_gbs / 1000.0) for r in resident))
