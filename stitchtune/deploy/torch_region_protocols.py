"""The protocols of what the torch backend registers and runs per region (issue 43: typed seams).

:class:`RegisteredRegion` is what ``torch.ops.stitchtune.region`` runs for a key;
:class:`GuardedKernel` is what a :class:`~stitchtune.deploy.torch_guard.GuardedRegion` calls on
its kernel. Both are satisfied structurally by the kernel classes
(:class:`~stitchtune.deploy.torch_ops.RegionKernel`,
:class:`~stitchtune.deploy.torch_region_dynamic.DynamicRegionKernel`), which import the modules that
use the protocols: declaring them here, a module that imports nothing of stitchtune at run time,
keeps every import downward (no module circle, ``TYPE_CHECKING`` imports included).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from stitchtune.deploy.compiled_graph import CompiledGraph
    from stitchtune.deploy.dynamic import CompiledBucket
    from stitchtune.deploy.torch_stats import RegionCounter

__all__ = ["GuardedKernel", "RegisteredRegion"]


class RegisteredRegion(Protocol):
    """What ``torch.ops.stitchtune.region`` runs for a key: a
    :class:`~stitchtune.deploy.torch_ops.RegionKernel`, a
    :class:`~stitchtune.deploy.torch_region_dynamic.DynamicRegionKernel` or the
    :class:`~stitchtune.deploy.torch_guard.GuardedRegion` around one."""

    def __call__(self, inputs: Sequence[Any]) -> list[Any]: ...
    def fake(self, inputs: Sequence[Any]) -> list[Any]: ...


class GuardedKernel(Protocol):
    """What a :class:`~stitchtune.deploy.torch_guard.GuardedRegion` calls on its kernel: a
    :class:`~stitchtune.deploy.torch_ops.RegionKernel` or a
    :class:`~stitchtune.deploy.torch_region_dynamic.DynamicRegionKernel`. ``compiled``: what
    :func:`~stitchtune.deploy.torch_backend.explain` reports (None: none built at the example shapes);
    ``fake`` and ``__call__`` take the region's inputs (held constants and bound SymInt values
    included) and the device the region runs on (None: the first input's); ``copies``: how many
    inputs a call copies before its launch; ``fast_path``: the thin path for later calls whose inputs
    are like ``first``, or None (then every call takes the full path); ``flag_sets``: the gathers'
    error flags, one set per launcher (:mod:`~stitchtune.deploy.torch_flags`); ``counter``: the
    region's :class:`~stitchtune.deploy.torch_stats.RegionCounter` where the kernel counts its own
    calls (a dynamic kernel's), else None. mypy checks the real kernels against all of it; a test stub
    implements all of it too."""

    @property
    def compiled(self) -> CompiledGraph | CompiledBucket | None: ...
    def describe(self) -> str: ...
    def fake(self, inputs: Sequence[Any], device: Any = None) -> list[Any]: ...
    def copies(self, inputs: Sequence[Any]) -> int: ...
    def __call__(self, inputs: Sequence[Any], device: Any = None) -> list[Any]: ...
    def fast_path(self, device: Any, held: Sequence[tuple[int, Any]], first: Sequence[Any]) -> Any: ...
    @property
    def flag_sets(self) -> list[Any]: ...
    @property
    def counter(self) -> RegionCounter | None: ...
