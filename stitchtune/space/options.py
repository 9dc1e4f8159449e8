"""The option table: every schedule *option* declared once.

An option is a small choice a schedule makes after its mapping, schemes and reuse levels are fixed
(the sweep ``order``, ``prefetch``, how a split row ``combine``\\ s its partials). Each is one frozen
:class:`Option`: its name, default, where it applies, the flat-mode rule, its variant rule, the names it
adds for the space file's constraints, the registers it costs, and its JSON form. Its *domain* is data:
``params[<name>]["choices"]`` of the space file (``search_spaces/stitch.json``), read by
:class:`~stitchtune.space.search_space.SearchSpace`.

Everything that handles options reads the table, in its order: ``SearchSpace.suggest`` (define-by-run
and flat), ``sample``, the flat repair, ``violations``/``derived``, ``params_of``, ``variants``, ``grid``,
and ``Schedule.to_dict``/``from_dict``/``flat``. Adding an option is one :class:`Option` appended to
:data:`OPTIONS` (never inserted before an existing one: the table's order is the order in which
``suggest`` asks and ``sample`` draws, so resumed studies and seeded samples depend on it), its domain
in the space file, and the lowering that implements it (reading ``schedule.option(<NAME>)``).

Rules read a :data:`Point`: a mapping with the plan's ``family``, ``nstages`` and
``single_pass_candidates`` (the number of its single-pass stage pairs), the mapping
(``tpr``, ``block``, ``split``, ``vec``, ``tasks_per_block``, ``min_blocks``), ``schemes`` and ``reuse``
(tuples), and the values of the options declared *before* the one asking.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from enum import StrEnum
from typing import Any, Callable, Generic, Iterable, Iterator, Mapping, TypeVar

from stitchtune.space.levels import ReuseLevel
from stitchtune.space.option_values import Combine, CrossCombine, Order
from stitchtune.space.schemes import SCHEMES, SchemeTable
from stitchtune.plan.family import Family

T = TypeVar("T")

Point = Mapping[str, Any]
"""What an option's rules read (see the module docstring)."""

CORE_FIELDS: tuple[str, ...] = ("tpr", "block", "split", "vec", "tasks_per_block", "min_blocks", "schemes", "reuse")
"""The fields every schedule has (its mapping, schemes and reuse levels); options come after them."""

RESERVED: frozenset[str] = frozenset(CORE_FIELDS) | {
    "family", "nstages", "single_pass_candidates", "scheme_table", "max_cluster", "options", "table", "option", "to_dict", "from_dict", "to_json", "from_json", "key", "flat",
    "persistent", "deterministic", "transposable", "row_vector_rows", "row_vectorable", "row_vector_inputs", "ncross", "ncross_k", "ncross_s", "cross_f32", "cross_atomic",
}
"""Names an option may not take: the core fields, the point's plan names and the Schedule's own attributes
(``tests/space`` checks that this covers every public attribute of :class:`~stitchtune.space.Schedule`)."""


def _no_names(point: Point) -> Mapping[str, Any]:
    return {}


def _no_registers(names: Point) -> int:
    return 0


def _not_fixed(point: Point) -> None:
    return None


def flag(value: Any) -> bool:
    """A 0/1 flag option's value (``prefetch``, ``single_pass``, ``exact_math``) from its JSON, database
    or optuna form (0 / 1, or a bool): a ``bool``; ``ValueError`` / ``TypeError`` for anything else."""
    if isinstance(value, bool):
        return value
    v = int(value)
    if v not in (0, 1):
        raise ValueError(f"a 0/1 flag, not {value!r}")
    return bool(v)


def plain_value(value: Any) -> Any:
    """An option value as JSON, the database and optuna hold it: a ``StrEnum`` member as its plain
    string, a flag (``bool``) as 0 / 1 (so a schedule's JSON and :meth:`key` stay as they were)."""
    if isinstance(value, bool):
        return int(value)
    return str(value) if isinstance(value, str) else value


@dataclass(frozen=True)
class Option(Generic[T]):
    """One schedule option, declared once.

    * ``name``: the JSON key, the ``p_<name>`` database column,
      the optuna parameter name, and the key of its domain in the space file's ``params``.
    * ``default``: the value wherever the option does not apply; also what every schedule did before the
      option existed, so the JSON leaves the option out at its default (old schedules keep their JSON
      and ``key()``). It must be in the domain.
    * ``decode``: the JSON form: the value itself (an int or a string), turned back by ``decode`` (e.g.
      ``int``, or a :class:`~enum.StrEnum` of :mod:`stitchtune.space.option_values`); it raises
      ``TypeError``/``ValueError`` on a malformed one. An option whose default is a ``StrEnum`` member
      stores members: :meth:`OptionTable.normalized` turns a string into one.
    * ``applies(point)``: where the option can matter, over the point decided so far. Only there is it a
      parameter (suggest asks it, sample draws it, the repair keeps it); elsewhere it takes its default,
      and a non-default value there is a violation.
    * ``where``: ``applies`` in words (for violation messages and docs).
    * ``flat_asks(point)``: whether flat mode (one fixed parameter set, for GP / CMA-ES) asks it; the point
      is the one chosen so far, *before* the repair, so the rule may only read what is fixed per space
      (``family``, ``nstages``). The repair then keeps the asked value where ``applies`` holds.
    * ``vary``: whether :meth:`SearchSpace.variants` tries this option's other values (in domain
      order) next to a point; ``vary_resets``: options put back to their default in that variant (an
      option that the new value excludes, e.g. ``prefetch`` for the alternate ``order``).
    * ``derive(point)``: extra names the option adds for the space file's constraints (e.g.
      ``rereads``), computed over the whole point.
    * ``registers(names)``: register-cached floats per thread the option's value costs, added to
      ``reg_cache_elems``; ``names`` is the point plus the derived names and ``n_full_inputs``.
    * ``fixed(point)``: a value the point decided so far forces where the option applies (then it is no
      parameter of its own: suggest does not ask it, sample does not draw it); None (the default rule):
      asked / drawn from its domain.
    * ``drawn``: whether ``suggest`` asks it and ``sample`` draws it wherever it applies. An option
      declared with ``drawn=False`` is asked only by trials that fix it (an enqueued variant, grid point
      or stored schedule: :meth:`SearchSpace.params_of` names it only at a non-default value) and
      never drawn by ``sample``; ``variants`` and ``grid`` still try it. So an option added after
      studies and seeded samples were recorded changes none of them (a later space version may
      switch it to ``drawn=True``).
    """

    name: str
    default: T
    decode: Callable[[Any], T]
    applies: Callable[[Point], bool]
    where: str
    flat_asks: Callable[[Point], bool]
    vary: bool = True
    vary_resets: tuple[str, ...] = ()
    derive: Callable[[Point], Mapping[str, Any]] = _no_names
    registers: Callable[[Point], int] = _no_registers
    drawn: bool = True
    fixed: Callable[[Point], Any] = _not_fixed


@dataclass(frozen=True)
class OptionTable:
    """The options of a space, in decision order (an ``Iterable[Option]`` with lookup by name).

    Invariants (checked here): names are identifiers, unique, outside :data:`RESERVED`, not starting
    with ``_``, ``scheme_`` or ``reuse_`` (those are parameter names of their own); ``vary_resets``
    name declared options.
    """

    options: tuple[Option[Any], ...]
    _by_name: dict[str, Option[Any]] = field(init=False, repr=False, compare=False, hash=False)

    def __post_init__(self) -> None:
        by_name: dict[str, Option[Any]] = {}
        for opt in self.options:
            n = opt.name
            if (not n.isidentifier() or n in RESERVED or n.startswith(("_", "scheme_", "reuse_"))
                    or n in by_name):
                raise ValueError(f"option name {n!r} is reserved, repeated or not an identifier")
            by_name[n] = opt
        for opt in self.options:
            for r in opt.vary_resets:
                if r not in by_name:
                    raise ValueError(f"option {opt.name!r} resets undeclared option {r!r}")
        object.__setattr__(self, "_by_name", by_name)

    def __iter__(self) -> Iterator[Option[Any]]:
        return iter(self.options)

    def __len__(self) -> int:
        return len(self.options)

    def __contains__(self, name: object) -> bool:
        return name in self._by_name

    def __getitem__(self, name: str) -> Option[Any]:
        """The option called ``name`` (``KeyError`` if undeclared)."""
        return self._by_name[name]

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(self._by_name)

    def extended(self, *more: Option[Any]) -> "OptionTable":
        """This table with ``more`` appended (decided after the existing options)."""
        return OptionTable(self.options + tuple(more))

    def normalized(self, values: Mapping[str, Any]) -> tuple[tuple[str, Any], ...]:
        """The canonical stored form of option ``values``: the (name, value) pairs that differ from their
        default, sorted by name (so equal schedules compare and hash equal whichever table built them).
        An undeclared name is a ``TypeError``, like an unknown keyword argument; the value of an option
        with a ``StrEnum`` default becomes its member (``ValueError`` for a string that is none), the value of
        a 0/1 flag (a ``bool`` default) a ``bool`` (:func:`flag`)."""
        out = []
        for n, v in values.items():
            opt = self._by_name.get(n)
            if opt is None:
                raise TypeError(f"unknown schedule option {n!r} (declared: {', '.join(self._by_name)})")
            if isinstance(opt.default, (StrEnum, bool)) and not isinstance(v, type(opt.default)):
                v = opt.decode(v)
            if v != opt.default:
                out.append((n, v))
        return tuple(sorted(out))


# ------------------------------------------------------------------------------------------------
# the options of the stitch space
# ------------------------------------------------------------------------------------------------

def rereads(schemes: Iterable[str], reuse: Iterable[str], table: SchemeTable = SCHEMES) -> bool:
    """Whether a schedule reads some full-size tensor from memory in more than one sweep: a reuse
    level ``global`` (an input re-read) or ``recompute`` (its inputs re-read), or a kernel boundary
    (a stage whose scheme has one, ``independent``: nothing cached survives it). Only then does the
    sweep ``order`` matter."""
    return any(r in (ReuseLevel.GLOBAL, ReuseLevel.RECOMPUTE) for r in reuse) or table.any(schemes, lambda sc: sc.kernel_boundary)


def _schemes_of(p: Point) -> SchemeTable:
    """The scheme table of the space a point belongs to."""
    table = p.get("scheme_table", SCHEMES)
    assert isinstance(table, SchemeTable)
    return table


def prefetchable(family: str, split: int, tasks_per_block: int) -> bool:
    """Whether ``prefetch`` can matter: a row reduction (an element-wise graph has one sweep, with no
    reduction to overlap the next task's loads with) with whole rows per block (split 1) and blocks
    that take several tasks in turn (``tasks_per_block`` 0 = persistent, or >= 2)."""
    return family == Family.ROW and split == 1 and tasks_per_block != 1


def _order_applies(p: Point) -> bool:
    return rereads(p["schemes"], p["reuse"], _schemes_of(p))


def _order_names(p: Point) -> Mapping[str, Any]:
    return {"rereads": rereads(p["schemes"], p["reuse"], _schemes_of(p))}


def _has_stages(p: Point) -> bool:
    return int(p["nstages"]) > 0


def _prefetch_applies(p: Point) -> bool:
    return prefetchable(p["family"], p["split"], p["tasks_per_block"]) and p["order"] == Order.FORWARD


def _prefetch_names(p: Point) -> Mapping[str, Any]:
    return {"prefetchable": prefetchable(p["family"], p["split"], p["tasks_per_block"])}


def _prefetch_registers(n: Point) -> int:
    """One row piece (``per_thread`` floats) per full-size input, row family only."""
    return n["per_thread"] * n["prefetch"] * n["n_full_inputs"] if n["family"] != Family.COL else 0


def _is_row(p: Point) -> bool:
    return bool(p["family"] == Family.ROW)


def _combine_applies(p: Point) -> bool:
    # a split row with a stage whose partials go through global scratch: on a legal split point every
    # scheme but a cluster one (sample asks this before the legality check, so the rule reads "not a
    # cluster scheme" for its seeded draws to stay as recorded)
    return p["family"] == Family.ROW and p["split"] > 1 and _schemes_of(p).any(p["schemes"], lambda sc: not sc.cluster)


ORDER: Option[Order] = Option(
    "order", Order.FORWARD, Order, _order_applies, "something is re-read (rereads)", _has_stages,
    vary_resets=("prefetch",), derive=_order_names)
"""Sweep order of the re-reads of full-size tensors: ``forward``, or ``alternate`` (every other sweep
that reads them from memory runs backwards, so that a re-read starts with what the last read left in L2)."""

PREFETCH: Option[bool] = Option(
    "prefetch", False, flag, _prefetch_applies, "prefetchable and order == 'forward'", _is_row,
    derive=_prefetch_names, registers=_prefetch_registers)
"""True (1 in JSON): a block loads the full-size inputs of its next task into registers right after the current task's
first sweep (row reductions with split 1 and several tasks per block, forward order)."""

COMBINE: Option[Combine] = Option(
    "combine", Combine.THREAD, Combine, _combine_applies, "family == 'row' and split > 1 (a stage not of a cluster scheme)",
    _is_row)
"""How a row split over several blocks combines its partials: ``thread`` (every thread loads all of them)
or ``warp`` (each warp loads them together and reduces by shuffles)."""

def _has_cross(p: Point) -> bool:
    return int(p.get("ncross", 0)) > 0


def _cross_names(p: Point) -> Mapping[str, Any]:
    return {"ncross": p.get("ncross", 0), "cross_f32": p.get("cross_f32", True),
            "cross_atomic": p.get("cross_atomic", True)}


def _cross_registers(n: Point) -> int:
    """The per-column accumulators: one row piece (``per_thread`` floats) per per-column cross reduction."""
    return n["per_thread"] * n.get("ncross_k", 0) if n["family"] == Family.ROW else 0


def cross_smem_floats(tpr: int, block: int, chunk: int, ncross_k: int, ncross_s: int) -> int:
    """Shared floats per block of the cross-reduction exchange: one row piece (``chunk``) per warp row
    group ``block // max(tpr, 32)`` when there are several (after shuffles merge the sub-warp rows of
    a warp), which the per-column reductions use one after another; one float per warp per scalar
    reduction."""
    groups = block // max(tpr, 32)
    per_col = groups * chunk if groups > 1 and ncross_k else 0
    scal = ncross_s * (block // 32) if block > 32 else 0
    return per_col + scal


CROSS_COMBINE: Option[CrossCombine] = Option(
    "cross_combine", CrossCombine.KERNEL, CrossCombine, _has_cross, "the plan has cross reductions (ncross > 0)", _has_cross,
    derive=_cross_names, registers=_cross_registers)
"""How the blocks' partials of the cross reductions (column sums, losses: :mod:`stitchtune.plan.cross`)
are combined: ``atomic`` (float atomic adds into the output, zeroed by a small kernel first: not
bitwise reproducible), ``grid`` (per-block partials in scratch, a grid barrier, then ordered sums of
the partials: the grid must be co-resident, which the space's resource check and the cost model check
as for the global scheme) or
``kernel`` (partials, then a small second kernel sums them in order)."""


def deterministic(schedule: Any) -> bool:
    """Whether ``schedule``'s results are bitwise reproducible run to run: no float atomics anywhere
    (``cross_combine`` atomic is the only option that adds floats atomically; every other reduction
    combines in a fixed order)."""
    table = getattr(schedule, "table", None)
    if table is None or "cross_combine" not in table:
        return True
    return bool(schedule.option(CROSS_COMBINE) != CrossCombine.ATOMIC)



def _single_pass_applies(p: Point) -> bool:
    return _is_row(p) and int(p.get("single_pass_candidates", 0)) > 0


def _single_pass_names(p: Point) -> Mapping[str, Any]:
    return {"single_pass_candidates": p.get("single_pass_candidates", 0)}


SINGLE_PASS: Option[bool] = Option(
    "single_pass", False, flag, _single_pass_applies, "the plan has single-pass candidates (row family)", _is_row,
    derive=_single_pass_names)
"""True (1 in JSON): every single-pass candidate of the plan (:mod:`stitchtune.plan.single_pass`: mean then variance,
max then sum of exp(x - max)) is computed in one sweep (Welford / online softmax, merged across lanes,
warps and split blocks); the merged stage takes the first stage's scheme. Drawn and asked like any option;
:data:`RECORDED_OPTIONS` holds it undrawn (as it was when the golden files of before were recorded), and
``variants`` also try it next to every best point."""



def _cluster_applies(p: Point) -> bool:
    return p["family"] == Family.ROW and _schemes_of(p).any(p["schemes"], lambda sc: sc.cluster)


def _never(p: Point) -> bool:
    return False


def _cluster_of_split(p: Point) -> int:
    return int(p["split"])


CLUSTER: Option[int] = Option(
    "cluster", 1, int, _cluster_applies, "a stage's scheme is 'cluster' (row reductions on sm_90)",
    _never, vary=False, fixed=_cluster_of_split)
"""Blocks per thread-block cluster of a stage with the ``cluster`` scheme (sm_90): the split blocks of a row
form one cluster and combine their partials through distributed shared memory after a cluster barrier, so
the size is the split (``split == cluster``; searched through ``split`` and the scheme, which the space
offers only where the device has clusters and ``split <= max_cluster``); 1 = no cluster."""

def _transposable(p: Point) -> bool:
    return bool(p.get("transposable", False))


def _transpose_names(p: Point) -> Mapping[str, Any]:
    return {"transposable": bool(p.get("transposable", False))}


TRANSPOSE: Option[int] = Option(
    "transpose", 0, int, _transposable,
    "the plan has transposed outputs (an element-wise region whose output's contiguous axis is a row axis)",
    _transposable, derive=_transpose_names)
"""The edge ``E`` of the shared-memory tile the transposed outputs of an element-wise region go through
(:mod:`stitchtune.lower.transpose`: ``E`` x ``E`` elements loaded along the view's columns, stored along the
outputs' contiguous row axis, rows padded to ``E + 1`` floats against bank conflicts), or 0: stored
one strided element per lane, as every element-wise kernel stores (only where ``plan.transpose``)."""


def _always(p: Point) -> bool:
    return True


EXACT_MATH: Option[bool] = Option(
    "exact_math", False, flag, _always, "always", _always, vary=False, drawn=False)
"""True (1 in JSON): the kernels compute ``exp``, divisions, ``sigmoid`` and ``silu`` as the graph says, with CUDA's accurate
``expf`` and IEEE division; 0 (the default): fast forms (:mod:`stitchtune.graph.fast_ops`: ``__expf``,
``__fdividef``, one IEEE reciprocal per row and a multiply for a division by a per-row value), within the
tolerance ``docs/fast-math.md`` states. Never drawn, asked or varied by a search (it does not change the
memory traffic a schedule is tuned for): a user's choice, set in a schedule's JSON (``"exact_math": 1``)."""

def exact_math(schedule: Any) -> bool:
    """Whether ``schedule`` asks for exact arithmetic (:data:`EXACT_MATH`; a table without the option: no)."""
    table = getattr(schedule, "table", None)
    return table is not None and "exact_math" in table and schedule.option(EXACT_MATH)


def _row_vectorable(p: Point) -> bool:
    return bool(p["family"] in (Family.COL, Family.ELEMENTWISE) and p.get("row_vectorable", False))


def _row_vector_plan(p: Point) -> bool:
    """Flat mode asks ``row_vectors`` of a column plan with row-vector inputs, or of an element-wise plan with
    transposed inputs it can load rows at a time (``plan.vector_rows``; fixed per space)."""
    return bool(p["family"] in (Family.COL, Family.ELEMENTWISE) and int(p.get("row_vector_rows", 1)) > 1)


def _row_vector_names(p: Point) -> Mapping[str, Any]:
    return {"row_vectorable": bool(p.get("row_vectorable", False)), "row_vector_rows": int(p.get("row_vector_rows", 1))}


#: the column sweep's unrolling, as :func:`stitchtune.lower.col.sweep_unroll` decides it (its ``SWEEP_UNROLL``
#: and ``SWEEP_UNROLL_FLOATS``; ``tests/lower/test_row_vector_registers.py`` checks that they are equal)
SWEEP_UNROLL_ROWS, SWEEP_UNROLL_FLOATS = 8, 64


def row_vector_registers(rows: int, vec: int, per_thread: int, full_inputs: int) -> int:
    """Registers per thread a column sweep with row vectors (``rows`` view rows per iteration) holds beyond
    what :func:`~stitchtune.lower.entry.estimate_registers` counts for its loads (``2 x vec x 4``): the
    floats of its unrolled iterations in flight at once. An iteration loads ``rows x vec`` floats of each
    of the ``full_inputs`` full-size inputs; the sweep's ``per_thread / (vec x rows)`` iterations are
    unrolled whole up to ``SWEEP_UNROLL_ROWS`` of them, else by the largest power of two whose iterations
    load at most ``SWEEP_UNROLL_FLOATS`` floats (the lowering's rule), and ptxas issues their loads
    together. 0 for ``rows <= 1``. Against ptxas (sm_90, -O3, the heuristic's launch bounds) the estimate
    with this term is within the margin ``tests/lower/test_row_vector_registers.py`` states."""
    if rows <= 1:
        return 0
    per_iter = rows * vec * max(1, full_inputs)
    iters = max(1, per_thread // max(1, vec * rows))
    n = iters
    if iters > SWEEP_UNROLL_ROWS:
        n = 1
        while n * 2 <= SWEEP_UNROLL_ROWS and n * 2 * per_iter <= SWEEP_UNROLL_FLOATS:
            n *= 2
    return max(0, n * per_iter - 2 * vec * 4)


def elementwise_row_vector_registers(rows: int, vec: int, loads: int) -> int:
    """Floats per thread an element-wise row kernel with row vectors (``rows`` view rows per sweep iteration,
    :mod:`stitchtune.lower.row_vectors`) holds beyond one row's: the other ``rows - 1`` rows' ``vec`` values of
    each of its ``loads`` row-vector loads per element (``plan.vector_loads``), loaded with the first row's and
    held until their rows use them (the other tensors are read a row at a time). 0 for ``rows <= 1``. Against
    ptxas (sm_90, the heuristic's launch bounds dropped): GPT-2's training concat (1 load) 56 -> 50 registers
    (68 under a 2-block bound), estimated 56 -> 68; Llama's rotary gradient (4 chains x 3 column shifts = 12
    loads) 96 -> 188 (128 under a 2-block bound: 336 bytes spilled), estimated 56 -> 200; with its column shifts
    taken from other lanes (:func:`stitchtune.plan.lane_shifts.loads_with`: 4 loads) 88 (heuristic, no bound)."""
    return 0 if rows <= 1 else (rows - 1) * vec * max(1, loads)


def _row_vector_option_registers(n: Point) -> int:
    if n["family"] == Family.ELEMENTWISE and n.get("row_vectors"):
        return elementwise_row_vector_registers(int(n.get("row_vector_rows", 1)), int(n["vec"]),
                                                int(n.get("row_vector_inputs", 1)))
    if n["family"] != Family.COL or not n.get("row_vectors"):
        return 0
    return row_vector_registers(int(n.get("row_vector_rows", 1)), int(n["vec"]), int(n["per_thread"]),
                                int(n.get("n_full_inputs", 0)))


ROW_VECTORS: Option[bool] = Option(
    "row_vectors", False, flag, _row_vectorable,
    "row_vectorable (a column plan with an input read along its rows, and rows that split into whole groups of "
    "row_vector_rows per thread)", _row_vector_plan, derive=_row_vector_names, registers=_row_vector_option_registers)
"""True (1 in JSON): a column-family thread takes ``row_vector_rows`` (4 for float32) consecutive view rows of
its columns per sweep iteration, so an input whose stride-1 axis is the view's innermost row axis is loaded
4 rows per 128-bit access (:mod:`stitchtune.lower.row_vectors`); the other tensors are then accessed one row
at a time at rows 4 apart, which can cost them sectors: the heuristic weighs both
(:func:`stitchtune.lower.row_vectors.row_vector_sectors`). Only where the plan has such an input
(:mod:`stitchtune.plan.row_vectors`) and the rows split into whole groups (``M % (split * tpr * 4) == 0``);
0 (the default): one row per iteration, as every schedule of space version 3 and before."""


RECORDED_OPTIONS = OptionTable((ORDER, PREFETCH, COMBINE, CROSS_COMBINE, replace(SINGLE_PASS, drawn=False)))
"""The options of the space the golden files of before the cluster scheme were recorded with, ``single_pass``
undrawn as it was then
(``tests/lower/golden/kernel_hashes*.json``, ``tests/space/golden/suggest_params*.json`` but the ``*_cluster``
ones): a space built with this table asks and draws exactly what it did then (no ``cluster`` scheme, which
comes with the ``cluster`` option: a new scheme on the H200 necessarily changes seeded draws)."""

OPTIONS = OptionTable((ORDER, PREFETCH, COMBINE, CROSS_COMBINE, SINGLE_PASS, CLUSTER, TRANSPOSE, EXACT_MATH,
                       ROW_VECTORS))
"""The stitch space's options, in decision order (append new ones at the end)."""
