"""Facts of a kernel's compiled code (its sm_XX SASS) that the fitted cost model reads beside the IR features.

Contract
--------
* :class:`CompiledFacts` (frozen): per kernel, ``registers`` (ptxas), ``bytes_in_flight`` (per thread:
  the most bytes of global loads issued and not yet used at once, walking the SASS in program order:
  the loads nvcc actually batches, e.g. 19 loads of a rolled loop it unrolled, or 1 where a spill or a
  reused destination register serialises them), ``loads_in_flight`` (the same in loads) and
  ``spill_instructions`` (``LDL`` + ``STL``). Read from a cubin by
  :func:`stitchtune.gpu.sass.compiled_facts` (cuobjdump; optional tool); this module needs no tool.
* :func:`with_compiled(features, facts) -> tuple[KernelFeatures, ...]`: ``features`` with
  ``compiled_bytes_in_flight`` and ``spill_instructions`` set from ``facts`` (kernel name -> facts);
  a kernel without facts keeps 0 (the model then uses the IR walk's bytes in flight, see
  :mod:`stitchtune.cost.fitted`). Registers are not changed here: pass ``facts[k].registers`` as the
  ``registers`` of :func:`~stitchtune.cost.features.program_features` (:func:`registers_of`).
* Compiled facts exist only after a build: the search's pre-build ranking predicts from the IR alone
  (never compiles a candidate to rank it); a post-build prediction, ``stitchtune audit`` and the cost fit's
  dataset (``scripts/sass_dataset.py``) may add them.
* :class:`PredictedFrom` names what a recorded prediction read (the database's ``predicted_from``
  column): ``ir`` (the IR features: before a build, or after one whose cubin could not be read in SASS)
  or ``compiled`` (the IR features with the compiled facts of the built cubin).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from enum import StrEnum
from typing import TYPE_CHECKING, Any, Mapping, Sequence

if TYPE_CHECKING:  # a type only: the search's pipeline imports PredictedFrom without the feature walk
    from stitchtune.cost.features import KernelFeatures

__all__ = ["CompiledFacts", "PredictedFrom", "registers_of", "with_compiled"]


class PredictedFrom(StrEnum):
    """What a prediction read (module docstring); a member equals its stored string."""

    IR = "ir"
    COMPILED = "compiled"


@dataclass(frozen=True)
class CompiledFacts:
    """What one kernel's compiled code says (module docstring)."""

    registers: int
    bytes_in_flight: float
    loads_in_flight: float
    spill_instructions: int

    def to_dict(self) -> dict[str, Any]:
        return {"registers": self.registers, "bytes_in_flight": self.bytes_in_flight,
                "loads_in_flight": self.loads_in_flight, "spill_instructions": self.spill_instructions}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> CompiledFacts:
        return cls(int(d["registers"]), float(d["bytes_in_flight"]), float(d["loads_in_flight"]),
                   int(d["spill_instructions"]))


def registers_of(facts: Mapping[str, CompiledFacts]) -> dict[str, int]:
    """Kernel name -> compiled registers (those > 0), for ``program_features(..., registers=)``."""
    return {k: f.registers for k, f in facts.items() if f.registers > 0}


def with_compiled(features: Sequence[KernelFeatures], facts: Mapping[str, CompiledFacts]) -> tuple[KernelFeatures, ...]:
    """``features`` with their compiled facts set (module docstring)."""
    out = []
    for f in features:
        c = facts.get(f.name)
        out.append(f if c is None else replace(f, compiled_bytes_in_flight=float(max(c.bytes_in_flight, 0.0)),
                                               spill_instructions=float(c.spill_instructions)))
    return tuple(out)
