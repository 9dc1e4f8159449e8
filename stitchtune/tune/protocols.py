"""What the search loop needs of the stages it is given (:class:`~stitchtune.tune.config.Components`).

The real classes (``space.SearchSpace``, ``hardware.Device``, ``graph.Graph``, ``plan.StitchPlan``)
and the fakes of ``tests/helpers/search_fakes.py`` implement these Protocols, as runners and builders implement
``gpu.runners.Runner`` and ``gpu.build.Builder``; ``tests/tune/test_protocols.py`` checks both, so
the loop and the pipeline call every member directly (no ``hasattr`` for a member a fake might lack).
"""

from __future__ import annotations

import random
from typing import Any, Protocol, runtime_checkable

__all__ = ["DeviceLike", "GraphLike", "PlanLike", "ScheduleLike", "SpaceLike"]


@runtime_checkable
class ScheduleLike(Protocol):
    """A point of the space: a stable key and a JSON form (``type(s).from_dict`` reads it back)."""

    def key(self) -> str: ...

    def to_dict(self) -> dict[str, Any]: ...

    def flat(self) -> dict[str, Any]: ...

    @property
    def deterministic(self) -> bool:
        """Bitwise reproducible (no float atomics)."""

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> ScheduleLike: ...


@runtime_checkable
class SpaceLike(Protocol):
    """The schedule space of one plan on one device."""

    @property
    def version(self) -> str: ...

    @property
    def deterministic(self) -> bool:
        """Only bitwise-reproducible points (see :meth:`deterministic_only`)."""

    def suggest(self, trial: Any) -> Any: ...

    def params_of(self, s: Any) -> dict[str, Any]:
        """The optuna parameters that make ``suggest`` return ``s`` (for enqueued trials)."""

    def sample(self, rng: random.Random) -> Any: ...

    def grid(self) -> list[Any]: ...

    def variants(self, s: Any) -> list[Any]:
        """Points next to ``s`` worth measuring beside it (may be empty)."""

    def deterministic_only(self) -> SpaceLike:
        """The same space without points that are not bitwise reproducible."""

    def flat_mode(self) -> SpaceLike:
        """The same space with a fixed parameter set (for the gp and cmaes samplers)."""

    def as_of(self, version: str) -> SpaceLike:
        """The same space drawing what space version ``version`` drew (a study created then resumes with it)."""


@runtime_checkable
class GraphLike(Protocol):
    @property
    def name(self) -> str: ...

    def workload_key(self) -> str: ...

    def structure_key(self) -> str: ...

    def min_bytes(self) -> int:
        """Bytes of the inputs read once (a gathered table: at most the rows gathered) and the outputs
        written once: the DRAM floor."""


@runtime_checkable
class PlanLike(Protocol):
    @property
    def cross(self) -> tuple[Any, ...]:
        """The reductions combined across blocks (their combine is a searched, possibly atomic, choice)."""


@runtime_checkable
class DeviceLike(Protocol):
    @property
    def key(self) -> str: ...

    @property
    def name(self) -> str: ...

    @property
    def arch(self) -> str: ...

    @property
    def compute_capability(self) -> tuple[int, int]: ...

    def effective_copy_bandwidth_gbs(self) -> float:
        """The copy bandwidth the floor time is computed with (GB/s)."""
