"""The schedule space of one plan on one device: :class:`SearchSpace`.

Domains, constraints and the reuse rules are data (the space file, ``search_spaces/stitch.json``,
see :mod:`stitchtune.space.space_file`); the options are declared once in
:mod:`stitchtune.space.options`, the schemes (their legality among them) in :mod:`stitchtune.space.schemes`. This module interprets both: the domains of
one plan on one device, optuna suggestion (define-by-run and flat) and the repair of a suggested point,
seeded sampling, the variants of a point and the exhaustive grid. Every option is handled by walking the
:class:`OptionTable` in its order.

Legality is the space's rules (:meth:`SearchSpace.rule_violations`: the derived names constraints read,
the checks and the early check of a thread mapping alone live in :mod:`stitchtune.space.legality`, whose
:class:`~stitchtune.space.legality.SpaceRules` the space inherits) and, in a space given a resource check
(:meth:`SearchSpace.with_resources`; the check is built above this room, where the lowering sizes the
kernels: ``stitchtune.lower.resources.legal_space``), that the device can run every kernel.
"""

from __future__ import annotations

import copy
import dataclasses
import itertools
import math
import random
from enum import StrEnum
from pathlib import Path
from typing import Any, Callable

from stitchtune.errors import ScheduleError, StitchtuneError
from stitchtune.plan.family import Family
from stitchtune.plan.planner import StitchPlan, TensorClass
from stitchtune.plan.row_vectors import row_vector_inputs
from stitchtune.space.constraints import names_used, safe_eval
from stitchtune.space.legality import CORE_SCALARS, MappingRules, ResourceCheck, SpaceRules
from stitchtune.space.option_values import CrossCombine
from stitchtune.space.options import CROSS_COMBINE, OPTIONS, Option, OptionTable, plain_value
from stitchtune.space.levels import ReuseLevel, uncached_level
from stitchtune.space.schedule import PERSISTENT, Schedule
from stitchtune.space.schemes import SCHEMES, SchemeTable
from stitchtune.space.space_file import load_space_file, params_as_of

Choose = Callable[[str, list[Any]], Any]
"""``choose(parameter name, domain) -> value``: how a decision walk asks for each value."""


def _never(name: str) -> bool:
    return False


def _fixed_params(trial: Any) -> frozenset[str]:
    """The parameter names an enqueued optuna trial fixes (``enqueue_trial``; optuna keeps them in the
    trial's system attrs ``fixed_params``); empty for a trial that fixes none or is not optuna's."""
    study, number = getattr(trial, "study", None), getattr(trial, "number", None)
    if study is None or number is None:
        return frozenset()
    for t in study.get_trials(deepcopy=False):
        if t.number == number:
            return frozenset((getattr(t, "system_attrs", None) or {}).get("fixed_params") or ())
    return frozenset()


def _core_name(param: str) -> str:
    """The core field an optuna parameter name decides (``block_t32`` -> ``block``)."""
    for f in ("min_blocks", "tasks_per_block", "tpr", "block", "split", "vec"):
        if param == f or param.startswith(f + "_"):
            return f
    raise KeyError(param)


class SearchSpace(SpaceRules):
    """The schedule space of one plan on one device (domains from the space file, options from ``table``,
    schemes from ``schemes``).

    Every option of ``table`` must have a domain ``params[<name>]["choices"]`` in ``data`` that holds its
    default, and every scheme the space file offers must be declared in ``schemes`` (else
    :class:`~stitchtune.errors.StitchtuneError`).
    """

    def __init__(self, plan: StitchPlan, device: Any, data: dict[str, Any], table: OptionTable = OPTIONS,
                 schemes: SchemeTable = SCHEMES) -> None:
        self.plan = plan
        self.device = device
        self.data = data
        self.table = table
        self.schemes = schemes
        self.version: str = str(data["version"])
        #: earlier space versions whose records selection still reads, each re-validated in this space
        self.compatible_versions: tuple[str, ...] = tuple(str(v) for v in data.get("compatible_versions", ()))
        #: the space version whose draws this space makes (see as_of): its own, unless a copy for an earlier study
        self.drawn_as: str = self.version
        self.resources: ResourceCheck | None = None  # see with_resources
        self.flat = False  # plain parameter names (see flat_mode)
        self.deterministic = False  # only bitwise-reproducible points (see deterministic_only)
        p = data["params"]
        self.domains: dict[str, list[Any]] = {k: list(v["choices"]) for k, v in p.items()}
        #: legal values a search never draws (a heuristic's or a user's): asked under their own parameter name
        self.undrawn: dict[str, list[Any]] = {k: list(v["undrawn"]) for k, v in p.items() if v.get("undrawn")}
        params_as_of(data, "0")   # refuses malformed 'before' entries
        if "scheme_rules" in data:
            raise StitchtuneError("search space file: 'scheme_rules' is not read any more; a scheme's legality "
                                  "is declared with the scheme (stitchtune.space.schemes)")
        undeclared = [x for x in self.domains["scheme"] if x not in schemes]
        if undeclared:
            raise StitchtuneError(f"search space offers undeclared scheme(s) {undeclared} "
                                  f"(declared: {', '.join(schemes.names)})")
        self.reuse_rules: dict[str, str] = data["reuse_rules"]
        self.constraints: list[dict[str, str]] = data["constraints"]
        for opt in table:
            if opt.name not in self.domains or opt.default not in self.domains[opt.name]:
                raise StitchtuneError(f"search space option {opt.name!r} needs a domain params.{opt.name}.choices "
                                      f"that holds its default {opt.default!r}")
            if isinstance(opt.default, StrEnum):
                unknown = [v for v in self.domains[opt.name] if v not in set(type(opt.default))]
                if unknown:
                    raise StitchtuneError(f"search space option {opt.name!r} offers unknown value(s) {unknown} "
                                          f"(known: {', '.join(type(opt.default))})")
        # the options each constraint reads: an option's own rule is not reported again when one fails
        self._constraint_options = [frozenset(names_used(c["expr"])) & frozenset(table.names)
                                    for c in self.constraints]
        self._constraint_exprs = tuple(c["expr"] for c in self.constraints)  # checked in one evaluation
        # every tensor accessed with vector loads/stores (full-size ones, and the per-column operands
        # that are contiguous along the vector) must fit 16 bytes: the widest element type decides
        vec_cls = ({TensorClass.FULL, TensorClass.PER_KEPT} if plan.family == Family.COL
                   else {TensorClass.FULL, TensorClass.PER_REDUCED})
        vectored = [n for n, c in plan.classes if c in vec_cls]
        self.elem_bytes = max((2 if plan.dtype(n) != "float32" else 4) for n in vectored) if vectored else 4
        self._mappings = MappingRules(plan, device, self.elem_bytes, self.constraints)  # shared by copies
        # full-size inputs: each takes one row piece of prefetch registers (schedule.prefetch)
        self.n_full_inputs = sum(1 for n, c in plan.classes if c is TensorClass.FULL and n in plan.input_names)
        #: the inputs a column kernel can load several rows per access (option row_vectors)
        self.row_vector_inputs: tuple[str, ...] = row_vector_inputs(plan)
        # the cross reductions (plan.cross) as the option rules read them
        cross = getattr(plan, "cross", ())
        self._cross_point = {"ncross": len(cross), "ncross_k": sum(c.kind == "per_reduced" for c in cross),
                             "ncross_s": sum(c.kind == "scalar" for c in cross),
                             "cross_f32": all(plan.dtype(c.node) == "float32" for c in cross),
                             # float atomic adds combine sums and means stored as they are (no max / min,
                             # no scalar epilogue reading a complete result)
                             "cross_atomic": all(getattr(c, "combine", "+") == "+" and getattr(c, "output", True)
                                                 for c in cross) and not getattr(plan, "epilogue", ())}
        # thread-block clusters: the scheme comes with the cluster option, on devices that have them, for
        # row reductions long enough to give every thread of a cluster of two smallest blocks an element
        self.max_cluster = (int(device.max_cluster_size) if "cluster" in table and getattr(device, "supports_clusters", False)
                            else 1)
        if plan.family != Family.ROW or plan.K < 2 * min(self.domains["block"]):  # too short for a cluster of two
            self.max_cluster = 1
        if self.max_cluster <= 1:
            self.domains["scheme"] = [x for x in self.domains["scheme"] if not schemes[x].cluster]
        # vec choices above 16 bytes are never legal: drop them from the domain up front
        self.domains["vec"] = [v for v in self.domains["vec"] if v * self.elem_bytes <= 16]
        if plan.family == Family.ROW:
            self.domains["tpr"] = [t for t in self.domains["tpr"] if t >= 4]
        elif plan.family == Family.ELEMENTWISE:  # any threads per row; short rows are packed into a block
            pass
        else:  # column tiles at least 8 threads wide
            self.domains["tpr"] = [t for t in self.domains["tpr"] if t * 8 <= max(self.domains["block"])]

    @classmethod
    def for_plan(cls, plan: StitchPlan, device: Any, path: Path | None = None,
                 table: OptionTable = OPTIONS, schemes: SchemeTable = SCHEMES) -> "SearchSpace":
        """The space of ``plan`` on ``device`` from the space file at ``path`` (default: the installed one)."""
        return cls(plan, device, load_space_file(path), table, schemes)

    # -- decisions --------------------------------------------------------------------------------
    def _decide_options(self, point: dict[str, Any], ask: Callable[[Option[Any]], Any],
                        asks_undrawn: Callable[[str], bool] = _never) -> dict[str, Any]:
        """Each option in table order: ``ask(option)`` where it applies to ``point`` (which grows with
        every decided option, so later rules see earlier values), its default elsewhere; an option with
        ``drawn=False`` is asked only where ``asks_undrawn(name)`` (the trial fixes it); where the
        option's ``fixed`` rule forces a value (``cluster``: the split), that value, never asked."""
        values: dict[str, Any] = {}
        for opt in self.table:
            value = opt.default
            if opt.applies(point):
                forced = opt.fixed(point)
                if forced is not None:
                    value = forced
                elif opt.drawn or asks_undrawn(opt.name):
                    value = ask(opt)
            point[opt.name] = values[opt.name] = value
        return values

    def _legal_schemes(self, names: dict[str, Any]) -> list[str]:
        """The schemes this space offers that are legal for the mapping ``names``, in domain order."""
        return [x for x in self.domains["scheme"] if safe_eval(self.schemes[x].rule, names)]

    def _reuse_domain(self, cand: str) -> list[str]:
        is_input = cand in set(self.plan.input_names)
        return [r for r in self.domains["reuse"] if safe_eval(self.reuse_rules[r], {"is_input": is_input})]

    def _decide(self, choose: Choose, asks_undrawn: Callable[[str], bool] = _never) -> Schedule:
        """Walk the space's decisions in order, asking ``choose(name, domain)`` for each value.

        Parameters whose legal values depend on earlier ones get a name that carries those earlier
        values (e.g. ``block_t32``), so that every optuna parameter has one fixed domain while most
        suggested points satisfy the space's constraints; forced values are not parameters at all.
        The options come last, in table order, each under its own name and only where it applies.
        """
        plan, d = self.plan, self.domains
        fam = plan.family
        tpr = choose("tpr", d["tpr"])
        vec = choose("vec", d["vec"])
        if fam == Family.COL:
            split = choose("split", d["split"])
            blocks = [b for b in d["block"] if b >= tpr and b // tpr >= 8 and b // tpr * vec <= max(plan.P, vec)]
            block = choose(f"block_t{tpr}_v{vec}", blocks or [max(d["block"])])
        else:
            max_split = max(1, math.ceil(plan.K / (tpr * vec)))
            splits = [x for x in d["split"] if x <= max_split] or [1]
            split = choose(f"split_t{tpr}_v{vec}", splits) if tpr >= 32 else 1
            if split > 1 or tpr >= max(d["block"]):  # element-wise too: several short rows per block
                block = tpr
            else:
                block = choose(f"block_t{tpr}", [b for b in d["block"] if b >= max(tpr, 32)])
        if asks_undrawn(f"min_blocks_all_b{block}"):   # an undrawn value (the heuristic's pin): its own name
            mbs = [m for m in self.legal_values("min_blocks") if m * block <= self.device.max_threads_per_sm]
            min_blocks = choose(f"min_blocks_all_b{block}", mbs)
        else:
            mbs = [m for m in d["min_blocks"] if m * block <= self.device.max_threads_per_sm]
            min_blocks = choose(f"min_blocks_b{block}", mbs)
        tasks = choose("tasks_per_block", d["tasks_per_block"])
        names = {"family": fam, "tpr": tpr, "split": split, "block": block, "max_cluster": self.max_cluster}
        legal = self._legal_schemes(names)
        kind = self.schemes.decision_kind(legal, split)
        schemes = tuple(choose(f"scheme_{i}_{kind}", legal) for i in range(plan.nstages))
        reuse = tuple(choose(f"reuse_{i}", self._reuse_domain(c)) for i, c in enumerate(plan.reuse_candidates))
        point = self._core_point(tpr, block, split, vec, tasks, min_blocks, schemes, reuse)
        options = self._decide_options(point, lambda opt: choose(opt.name, d[opt.name]), asks_undrawn)
        return Schedule(tpr, block, split, vec, tasks, min_blocks, schemes, reuse, options, table=self.table)

    def _decide_flat(self, choose: Choose, asks_undrawn: Callable[[str], bool] = _never) -> Schedule:
        """Every parameter under its plain name with its full domain (``flat`` mode), then repaired
        towards the legal point it most resembles: a legal point maps to itself, so
        :meth:`params_of` stays the identity. For samplers that model a fixed set of parameters
        (GP, CMA-ES), which fall back to random sampling on conditional parameter names. Each option is
        asked where its ``flat`` rule holds, and after the repair keeps its value where it applies."""
        plan, d = self.plan, self.domains
        fam = plan.family
        tpr = choose("tpr", d["tpr"])
        vec = choose("vec", d["vec"])
        split = choose("split", d["split"])
        block = choose("block", d["block"])
        # "min_blocks" is asked by every trial, so that the samplers' fixed parameter set (the intersection over
        # the study's trials) keeps it; a trial that fixes an undrawn value then asks it too, and repairs through them
        min_blocks = choose("min_blocks", d["min_blocks"])
        mb_undrawn = asks_undrawn("min_blocks_all")
        mb_dom = self.legal_values("min_blocks") if mb_undrawn else d["min_blocks"]
        if mb_undrawn:
            min_blocks = choose("min_blocks_all", mb_dom)
        tasks = choose("tasks_per_block", d["tasks_per_block"])
        schemes = [choose(f"scheme_{i}", d["scheme"]) for i in range(plan.nstages)]
        reuse = tuple(choose(f"reuse_{i}", self._reuse_domain(c)) for i, c in enumerate(plan.reuse_candidates))
        raw = self._core_point(tpr, block, split, vec, tasks, min_blocks, tuple(schemes), reuse)
        picked: dict[str, Any] = {}
        for opt in self.table:
            asked = opt.flat_asks(raw) and (opt.drawn or asks_undrawn(opt.name))
            raw[opt.name] = picked[opt.name] = choose(opt.name, d[opt.name]) if asked else opt.default
        if fam == Family.COL:
            block = min(max(block, tpr * 8), max(d["block"]))
        else:
            if tpr < 32:
                split = 1
            block = tpr if (split > 1 or tpr >= max(d["block"])) else max(block, tpr, 32)
        while min_blocks and min_blocks * block > self.device.max_threads_per_sm:
            min_blocks = max((m for m in mb_dom if m < min_blocks), default=0)   # a fresh trial: drawn values only
        names = {"family": fam, "tpr": tpr, "split": split, "block": block, "max_cluster": self.max_cluster}
        legal = self._legal_schemes(names)
        fixed = tuple(self.schemes.repair(x, legal) for x in schemes)
        # the options that apply keep their picked value, the others take their default
        point = self._core_point(tpr, block, split, vec, tasks, min_blocks, fixed, reuse)
        options = self._decide_options(point, lambda opt: picked[opt.name], asks_undrawn)
        return Schedule(tpr, block, split, vec, tasks, min_blocks, fixed, reuse, options, table=self.table)

    def deterministic_only(self) -> "SearchSpace":
        """A copy of this space without the float-atomic choices (``cross_combine`` atomic): every point
        it suggests, samples, repairs to or varies to is bitwise reproducible (``Schedule.deterministic``);
        :meth:`violations` also refuses a non-deterministic point. The same space where nothing is atomic."""
        other = copy.copy(self)
        other.domains = {**self.domains, "cross_combine": [v for v in self.domains["cross_combine"] if v != CrossCombine.ATOMIC]}
        other.deterministic = True
        return other

    def with_resources(self, check: ResourceCheck) -> "SearchSpace":
        """A copy of this space that offers only points ``check`` passes (the kernels fit the device):
        :meth:`violations` reports its reason, so :meth:`sample` draws again, :meth:`grid` and
        :meth:`variants` leave such points out and :meth:`suggest` repairs them (:meth:`fit`)."""
        other = copy.copy(self)
        other.resources = check
        return other

    def flat_mode(self) -> "SearchSpace":
        """A copy of this space whose :meth:`suggest` / :meth:`params_of` use plain parameter names
        (see :meth:`_decide_flat`)."""
        other = copy.copy(self)
        other.flat = True
        return other

    def as_of(self, version: str) -> "SearchSpace":
        """This space drawing what space version ``version`` drew (the space file's ``before`` entries:
        :func:`~stitchtune.space.space_file.params_as_of`): the domains an optuna study created in that
        version resumes with, and the seeded samples of goldens recorded then. Rules, options and legal
        values are this space's (a version changes what is drawn, never what is legal), ``version`` too;
        ``drawn_as`` is ``version``. ``self`` where both draw what this space's own version draws."""
        params = params_as_of(self.data, version)
        if params is self.data["params"] and self.drawn_as == self.version:
            return self
        other = type(self)(self.plan, self.device, {**self.data, "params": params}, self.table, self.schemes)
        other.data, other.drawn_as = self.data, str(version)
        other.resources, other.flat = self.resources, self.flat
        return other.deterministic_only() if self.deterministic else other

    def suggest(self, trial: Any) -> Schedule:
        """Ask an optuna trial for a schedule (define-by-run). Constraints that the decision order
        cannot rule out (register and shared-memory budgets) are *not* enforced by the walk: in a space
        with a resource check (:meth:`with_resources`) an illegal point is repaired (:meth:`fit`);
        without one it is returned as asked (check it with :meth:`violations`: the search prunes a
        violated point without compiling)."""
        decide = self._decide_flat if self.flat else self._decide
        fixed: list[frozenset[str]] = []  # looked up once, the first time an undrawn option applies

        def asks_undrawn(name: str) -> bool:
            if not fixed:
                fixed.append(_fixed_params(trial))
            return name in fixed[0]

        s = decide(lambda name, dom: trial.suggest_categorical(name, list(dom)), asks_undrawn)
        return self.fit(s)

    def _rebuilt(self, s: Schedule, **core: Any) -> Schedule:
        """``s`` with the core fields ``core`` changed, each option keeping its value where it still
        applies (its default elsewhere, the value a forced option takes)."""
        f = {n: core.get(n, getattr(s, n)) for n in CORE_SCALARS + ("schemes", "reuse")}
        point = self._core_point(f["tpr"], f["block"], f["split"], f["vec"], f["tasks_per_block"], f["min_blocks"],
                                 tuple(f["schemes"]), tuple(f["reuse"]))
        stored = self._point(s)
        options = self._decide_options(point, lambda opt: stored[opt.name], lambda name: True)
        return Schedule(f["tpr"], f["block"], f["split"], f["vec"], f["tasks_per_block"], f["min_blocks"],
                        tuple(f["schemes"]), tuple(f["reuse"]), options, table=self.table)

    def _fit_steps(self, s: Schedule) -> list[Callable[[Schedule], Schedule]]:
        """The changes :meth:`fit` tries, mildest first: a persistent grid (co-resident by construction),
        the cross reductions combined by a second kernel instead of a grid barrier, kernel boundaries
        instead of grid barriers, nothing cached on chip, the smallest block the mapping allows."""
        steps: list[Callable[[Schedule], Schedule]] = []
        if PERSISTENT in self.domains["tasks_per_block"]:
            steps.append(lambda x: self._rebuilt(x, tasks_per_block=PERSISTENT))
        if "cross_combine" in self.table and CrossCombine.KERNEL in self.domains["cross_combine"]:
            by_kernel: dict[str, Any] = {"cross_combine": CrossCombine.KERNEL}
            steps.append(lambda x: dataclasses.replace(x, table=self.table, **by_kernel)
                         if x.option(CROSS_COMBINE) == CrossCombine.GRID else x)
        boundary = sorted((sc.repair_rank if sc.repair_rank is not None else 99, sc.name)
                          for sc in self.schemes if sc.kernel_boundary and sc.name in self.domains["scheme"])
        if boundary:
            steps.append(lambda x: self._rebuilt(x, schemes=tuple(
                boundary[0][1] if self.schemes[sc].grid_barrier else sc for sc in x.schemes)))
        inputs = set(self.plan.input_names)
        steps.append(lambda x: self._rebuilt(x, reuse=tuple(
            uncached_level(c in inputs) if ReuseLevel(r).cached else r for c, r in zip(self.plan.reuse_candidates, x.reuse))))
        if s.block > s.tpr:
            smallest = min((b for b in self.domains["block"] if b >= max(s.tpr, 32)), default=s.block)
            steps.append(lambda x: self._rebuilt(x, block=smallest))
        return steps

    def fit(self, s: Schedule) -> Schedule:
        """``s`` when it is legal, else a legal point near it, deterministically: each of
        :meth:`_fit_steps` alone, then all of them one after the other (the first legal result); failing
        these, a point sampled with ``s.key()`` as the seed. :meth:`suggest` returns its points through
        here, so a space with a resource check never suggests a point its kernels do not fit; the
        trial's parameters then describe the point before the repair (as in flat mode)."""
        if self.resources is None or not self.violations(s):
            return s
        steps = self._fit_steps(s)
        tried = []
        for step in steps:
            tried.append(step(s))
        x = s
        for step in steps:
            x = step(x)
            tried.append(x)
        for cand in tried:
            if cand != s and not self.violations(cand):
                return cand
        return self.sample(random.Random(s.key()))

    def params_of(self, s: Schedule) -> dict[str, Any]:
        """The optuna parameter dict of ``s`` (for ``study.enqueue_trial``); the names, and their order,
        are those :meth:`suggest` would use for the same point."""
        out: dict[str, Any] = {}
        point = self._point(s)

        def choose(name: str, dom: list[Any]) -> Any:
            if name in self.table:
                v = point[name]
            elif name.startswith("scheme_"):
                v = s.schemes[int(name.split("_")[1])]
            elif name.startswith("reuse_"):
                v = s.reuse[int(name.split("_")[1])]
            else:
                v = point[_core_name(name)]
                if name == "min_blocks" and v not in dom:   # flat: an undrawn value, asked as min_blocks_all too
                    v = min(dom, key=lambda m: (abs(m - v), -m))
            out[name] = plain_value(v)   # as suggest gets it from the domain (a flag: 0 / 1)
            return v

        def undrawn(name: str) -> bool:
            if name.startswith("min_blocks_all"):
                return point["min_blocks"] not in self.domains["min_blocks"]
            return bool(point[name] != self.table[name].default)

        (self._decide_flat if self.flat else self._decide)(choose, undrawn)
        return out

    # -- sets of points ---------------------------------------------------------------------------
    def variants(self, s: Schedule) -> list[Schedule]:
        """The legal points that differ from ``s`` in one option the cost model ranks least reliably:
        for each option with ``vary`` (in table order), each other value of its domain, with the options
        in its ``vary_resets`` at their default (the alternate ``order`` switches ``prefetch`` off). The
        search measures them next to its best point, so every search compares them side by side."""
        out: list[Schedule] = []
        point = self._point(s)
        for opt in self.table:
            if not opt.vary:
                continue
            for value in self.domains[opt.name]:
                if value == point[opt.name]:
                    continue
                changes = {r: self.table[r].default for r in opt.vary_resets}
                changes[opt.name] = value
                cand = dataclasses.replace(s, table=self.table, **changes)
                if cand != s and cand not in out and not self.violations(cand):
                    out.append(cand)
        return out

    def sample(self, rng: random.Random, max_tries: int = 20000) -> Schedule:
        """A drawn *legal* schedule: the mapping, schemes and reuse levels uniformly (rejection sampling),
        then each option in table order uniformly among its values where it applies to that point (its
        default elsewhere). The draws (one ``rng.choice`` per value, in this order) are a contract:
        seeded samples are recorded in ``tests/lower/golden/kernel_hashes.json``."""
        impossible = self._mapping_is_impossible  # draws nothing: seeded samples stay the same
        if impossible is not None:
            raise ScheduleError(f"no legal schedule: the space is empty for this graph ({impossible})")
        d = self.domains
        reuse_doms = [self._reuse_domain(c) for c in self.plan.reuse_candidates]  # the same lists every draw
        for _ in range(max_tries):
            tpr = rng.choice(d["tpr"])
            block = rng.choice(d["block"])
            split = rng.choice(d["split"])
            vec = rng.choice(d["vec"])
            tasks = rng.choice(d["tasks_per_block"])
            min_blocks = rng.choice(d["min_blocks"])
            schemes = tuple(rng.choice(d["scheme"]) for _ in range(self.plan.nstages))
            reuse = tuple(rng.choice(dom) for dom in reuse_doms)
            point = self._core_point(tpr, block, split, vec, tasks, min_blocks, schemes, reuse)
            options = self._decide_options(point, lambda opt: rng.choice(d[opt.name]))
            if self._mappings.breaks(tpr, block, split, vec, tasks, min_blocks) is not None:
                continue  # a violation by the mapping alone (known without building the point)
            s = Schedule(tpr, block, split, vec, tasks, min_blocks, schemes, reuse, options, table=self.table)
            if not self.violations(s):
                return s
        raise ScheduleError("no legal schedule found by sampling; the space is empty for this graph")

    def grid(self) -> list[Schedule]:
        """Every legal point (for the grid sampler and exhaustive sweeps; can be large): the product of
        the core domains, schemes, reuse levels and the option domains (table order), filtered by
        :meth:`violations`, in that product's order.

        An option is enumerated over its domain only where it applies to the point decided so far;
        elsewhere only its default is tried (any other value there is a violation, and a default outside
        the domain too), so the points skipped are illegal ones and the result is the same."""
        d = self.domains
        out = []
        reuse_doms = [self._reuse_domain(c) for c in self.plan.reuse_candidates]
        for tpr, block, split, vec, tasks, mb in itertools.product(
                d["tpr"], d["block"], d["split"], d["vec"], d["tasks_per_block"], d["min_blocks"]):
            for schemes in itertools.product(d["scheme"], repeat=self.plan.nstages):
                for reuse in itertools.product(*reuse_doms):
                    core = self._core_point(tpr, block, split, vec, tasks, mb, tuple(schemes), tuple(reuse))
                    for values in self._option_values(core):
                        s = Schedule(tpr, block, split, vec, tasks, mb, tuple(schemes), tuple(reuse), values,
                                     table=self.table)
                        if not self.violations(s):
                            out.append(s)
        return out

    def _option_values(self, core: dict[str, Any]) -> list[dict[str, Any]]:
        """The option values :meth:`grid` tries at the mapping ``core``: in table order, an option's whole
        domain where it applies to the point decided so far, else its default (if in its domain)."""
        combos: list[tuple[dict[str, Any], dict[str, Any]]] = [({}, core)]
        for opt in self.table:
            dom = self.domains[opt.name]
            grown = []
            for values, point in combos:
                tries = dom if opt.applies(point) else [v for v in (opt.default,) if v in dom]
                grown += [({**values, opt.name: v}, {**point, opt.name: v}) for v in tries]
            combos = grown
        return [values for values, _ in combos]
