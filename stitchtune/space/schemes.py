"""The scheme table: every stitching scheme declared once.

A stitching scheme says how the partial results of one reduction stage reach the threads that consume
them (AStitch's ``local`` / ``regional`` / ``global`` stitching, a kernel boundary, and the Hopper
``cluster`` exchange). Each is one frozen :class:`Scheme`: its name, where it is legal (an expression
over the mapping, evaluated by :func:`~stitchtune.space.constraints.safe_eval`), what it needs (a
block exchange through shared memory, a grid barrier, a kernel boundary, a thread-block cluster) and
so how a reduction state is exchanged, and the term the cost model adds for it.

Everything that handles schemes asks the table instead of comparing names: the space (legality,
decision names, the flat repair, the cluster gate), the options (``order``'s re-reads, ``combine``),
the lowering (the exchange path of :mod:`stitchtune.lower.exchange`, kernel boundaries, grid
barriers) and the heuristic. The space file lists which schemes a space offers
(``params.scheme.choices``, in decision order); adding a scheme is one :class:`Scheme` in a table
(:meth:`SchemeTable.extended`), its name in the space file's choices and its tests: see
``tests/space/test_schemes.py``, which adds one in the test alone.

The exchange a scheme declares, in the order the lowering runs it (every scheme starts with the warp
shuffles among the lanes of a row):

1. ``beyond_warp`` False (``local``): done; the row's lanes are one warp (or a thread owns the column).
2. the warps of a row meet in shared memory when the row has several warps, or always with
   ``block_exchange`` (``regional``);
3. ``cluster``: the split blocks of a row exchange through distributed shared memory;
4. ``partials``: each block stores its partial in global scratch; then with ``grid_barrier`` a grid
   barrier and every block combines the partials (``global``), or with ``kernel_boundary`` the next
   kernel does (``independent``).

Rules read the names ``family``, ``tpr``, ``block``, ``split`` and ``max_cluster`` (the largest
thread-block cluster the device launches in this space; 1 without clusters).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from typing import Callable, Iterable, Iterator


class SchemeName(StrEnum):
    """The names of the built-in schemes (strings: a schedule's JSON holds them as they are)."""

    LOCAL = "local"
    REGIONAL = "regional"
    GLOBAL = "global"
    INDEPENDENT = "independent"
    CLUSTER = "cluster"


@dataclass(frozen=True)
class Scheme:
    """One stitching scheme, declared once.

    * ``name``: the value in ``Schedule.schemes`` and the space file's ``params.scheme.choices``.
    * ``rule``: where the scheme is legal, an expression over ``family``, ``tpr``, ``block``, ``split``
      and ``max_cluster``; ``where`` is not needed: violation messages quote the rule.
    * ``beyond_warp``: whether partials leave the warp (False: the row's lanes are one warp).
    * ``block_exchange``: whether the warps of a block always meet in shared memory (also with one warp
      per row); any scheme with ``beyond_warp`` does it when a row has several warps.
    * ``cluster``: the split blocks of a row form one thread-block cluster (sm_90) and exchange through
      distributed shared memory; the space offers such a scheme only on devices with clusters.
    * ``partials``: per-block partials through global scratch; ``grid_barrier``: then a grid barrier
      (the grid must be co-resident: a resource, not a rule of the mapping, so the space's resource
      check and the cost model check it, see ``stitchtune.lower.resources``); ``kernel_boundary``: then a kernel
      boundary (the next kernel combines them; the stage's values are not known in this kernel).
    * ``repair_rank``: preference when the flat-mode repair replaces an illegal scheme (lowest first;
      None: never chosen by the repair).
    * ``cost_term``: the name of the cost model's term this scheme adds (``KernelProfile`` counts the
      events: block barriers, grid barriers, cluster barriers and remote loads, launches).
    """

    name: str
    rule: str
    beyond_warp: bool = True
    block_exchange: bool = False
    cluster: bool = False
    partials: bool = False
    grid_barrier: bool = False
    kernel_boundary: bool = False
    repair_rank: int | None = None
    cost_term: str = ""
    doc: str = ""

    def __post_init__(self) -> None:
        if self.grid_barrier and self.kernel_boundary:
            raise ValueError(f"scheme {self.name!r}: a grid barrier and a kernel boundary exclude each other")
        if (self.grid_barrier or self.kernel_boundary) != self.partials:
            raise ValueError(f"scheme {self.name!r}: partials go with exactly one of grid_barrier / kernel_boundary")
        if not self.beyond_warp and (self.block_exchange or self.cluster or self.partials):
            raise ValueError(f"scheme {self.name!r}: a warp-only scheme exchanges nothing beyond the warp")

    @property
    def result_in_kernel(self) -> bool:
        """Whether the stage's final values are known in the kernel that reduces it (all but a
        kernel boundary)."""
        return not self.kernel_boundary

    def exchanges_in_block(self, tpr: int) -> bool:
        """Whether a row of ``tpr`` threads combines its warps' partials through shared memory."""
        return self.beyond_warp and (tpr > 32 or self.block_exchange)


@dataclass(frozen=True)
class SchemeTable:
    """The schemes a space may offer, by name (an ``Iterable[Scheme]``); names are unique."""

    schemes: tuple[Scheme, ...]
    _by_name: dict[str, Scheme] = field(init=False, repr=False, compare=False, hash=False)

    def __post_init__(self) -> None:
        by_name: dict[str, Scheme] = {}
        for sc in self.schemes:
            if not sc.name.isidentifier() or sc.name in by_name:
                raise ValueError(f"scheme name {sc.name!r} is repeated or not an identifier")
            by_name[sc.name] = sc
        object.__setattr__(self, "_by_name", by_name)

    def __iter__(self) -> Iterator[Scheme]:
        return iter(self.schemes)

    def __contains__(self, name: object) -> bool:
        return name in self._by_name

    def __getitem__(self, name: str) -> Scheme:
        """The scheme called ``name`` (``KeyError`` if undeclared)."""
        return self._by_name[name]

    def get(self, name: str) -> Scheme | None:
        return self._by_name.get(name)

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(self._by_name)

    def extended(self, *more: Scheme) -> "SchemeTable":
        """This table with ``more`` added."""
        return SchemeTable(self.schemes + tuple(more))

    def any(self, names: Iterable[str], pred: Callable[[Scheme], bool]) -> bool:
        """Whether a scheme among ``names`` satisfies ``pred`` (undeclared names never do)."""
        return any(sc is not None and pred(sc) for sc in map(self.get, names))

    def count(self, names: Iterable[str], pred: Callable[[Scheme], bool]) -> int:
        """How many of ``names`` name a scheme that satisfies ``pred``."""
        return sum(1 for sc in map(self.get, names) if sc is not None and pred(sc))

    def decision_kind(self, legal: Iterable[str], split: int) -> str:
        """The suffix of the optuna parameter name of a stage's scheme (``scheme_<i>_<kind>``) given the
        legal schemes: one name per set of legal values, so every parameter has one fixed domain.
        ``cluster`` where a cluster scheme is legal, else ``split`` for a split row, ``warp`` where a
        warp-only scheme is legal, ``block`` otherwise."""
        legal = list(legal)
        if self.any(legal, lambda sc: sc.cluster):
            return "cluster"
        if split > 1:
            return "split"
        return "warp" if self.any(legal, lambda sc: not sc.beyond_warp) else "block"

    def repair(self, name: str, legal: list[str]) -> str:
        """``name`` where it is legal, else the legal scheme with the lowest ``repair_rank``."""
        if name in legal:
            return name
        ranked = sorted((sc.repair_rank, sc.name) for sc in map(self.get, legal)
                        if sc is not None and sc.repair_rank is not None)
        if not ranked:
            raise ValueError(f"no scheme the repair may choose among {legal}")
        return ranked[0][1]


SCHEMES = SchemeTable((
    Scheme(SchemeName.LOCAL, "split == 1 and (family == 'row' and tpr <= 32 or family == 'col' and tpr == 1)",
           beyond_warp=False, repair_rank=3,
           doc="one-to-one: shuffles among the row's lanes (one warp at most), or one thread owns the column"),
    Scheme(SchemeName.REGIONAL, "split == 1", block_exchange=True, repair_rank=0, cost_term="block_barriers",
           doc="one-to-many within a block: shared memory and __syncthreads"),
    Scheme(SchemeName.GLOBAL, "split > 1", partials=True, grid_barrier=True, repair_rank=1, cost_term="grid_barriers",
           doc="one-to-many across blocks: partials in global scratch, a grid barrier (the grid co-resident)"),
    Scheme(SchemeName.INDEPENDENT, "True", partials=True, kernel_boundary=True, repair_rank=2, cost_term="launch",
           doc="a kernel boundary: partials in global scratch, combined by the next kernel; always legal"),
    Scheme(SchemeName.CLUSTER, "family == 'row' and split > 1 and split <= max_cluster", cluster=True,
           cost_term="cluster_exchange",
           doc="sm_90: the split blocks of a row form a cluster and exchange through distributed shared memory"),
))
"""The built-in schemes (the order in which a space offers them comes from its space file)."""
