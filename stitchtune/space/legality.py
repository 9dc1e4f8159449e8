"""What makes a point of the schedule space legal: the names the space file's constraints read, the
rules of the space, and the early check of a thread mapping alone.

Contract
--------
* :class:`MappingRules`: the space file's constraints that read only the thread mapping (the six core
  scalars, with the plan and the device): ``names(mapping)`` the names they read, ``breaks(mapping)``
  the first one a mapping breaks (None: it passes them; remembered per mapping), ``impossible(domains)``
  why no mapping of the core domains passes them (None: some mapping does). A point breaks every rule
  its mapping breaks: :meth:`SpaceRules.derived` gives it the same names.
* :class:`SpaceRules`: the half of :class:`~stitchtune.space.search_space.SearchSpace` that judges a
  point (a mixin; the space sets every attribute it declares): ``derived(s)`` (the names constraint
  expressions read), ``rule_violations(s)`` (domains, constraints, options where they do not apply,
  scheme and reuse rules), ``violations(s)`` (those, then the resource check of ``with_resources``),
  ``check(s)`` (``s`` or :class:`~stitchtune.errors.ScheduleError`), and the points the rules read.
  Pure: nothing here changes the space or the schedule it judges (but the memo of :class:`MappingRules`).
"""

from __future__ import annotations

import functools
import itertools
import math
from typing import Any, Callable

from stitchtune.errors import ScheduleError
from stitchtune.plan.family import Family
from stitchtune.plan.lane_shifts import loads_with
from stitchtune.plan.planner import StitchPlan
from stitchtune.plan.row_vectors import ROW_VECTOR_ROWS, row_groups_fit
from stitchtune.space.constraints import names_used, safe_eval, safe_eval_all
from stitchtune.space.levels import ReuseLevel
from stitchtune.space.options import SINGLE_PASS, OptionTable, cross_smem_floats, plain_value
from stitchtune.space.schedule import Schedule, row_chunk
from stitchtune.space.schemes import SchemeTable

__all__ = ["CORE_SCALARS", "MappingRules", "ResourceCheck", "SpaceRules"]

CORE_SCALARS = ("tpr", "block", "split", "vec", "tasks_per_block", "min_blocks")
"""The core fields that make a thread mapping (a schedule's scalars, before its schemes and reuse levels)."""

ResourceCheck = Callable[[Schedule], "str | None"]
"""``check(schedule) -> reason | None``: why the device cannot run the kernels of a schedule that satisfies
the space's rules (None: it can). Built above this room, where the lowering sizes the kernels
(``stitchtune.lower.resources.resource_check``), and given to
:meth:`~stitchtune.space.search_space.SearchSpace.with_resources`."""


class MappingRules:
    """The space file's ``constraints`` that read only what the thread mapping decides with ``plan`` and
    ``device`` (``elem_bytes``: the widest element of the vectored tensors). Copies of a space share one
    (they keep the plan, the device and the core domains), and so its memo."""

    def __init__(self, plan: StitchPlan, device: Any, elem_bytes: int, constraints: list[dict[str, str]]) -> None:
        self.plan = plan
        self.device = device
        self.elem_bytes = elem_bytes
        self.constraints = constraints
        self._memo: dict[tuple[int, ...], dict[str, str] | None] = {}  # see breaks

    def names(self, tpr: int, block: int, split: int, vec: int, tasks: int, min_blocks: int) -> dict[str, Any]:
        """The names of :meth:`SpaceRules.derived` that the thread mapping alone decides (with the plan and
        the device): the six core fields, ``family``, ``elem_bytes``, ``K``, ``P``, ``chunk``, ``per_thread``,
        ``vec_ok``, ``max_split``, ``smem_limit`` and ``max_threads_per_sm``. ``tasks`` and ``min_blocks``
        only pass through (no other name depends on them: :meth:`impossible` relies on it)."""
        plan = self.plan
        K, P = plan.K, plan.P
        if plan.family == Family.COL:
            chunk = math.ceil(K / split)
            per_thread = math.ceil(chunk / max(tpr, 1)) * vec
            vec_ok = P % vec == 0
            max_split = K
        else:
            chunk = row_chunk(K, split, tpr, vec)
            per_thread = chunk // tpr
            vec_ok = K % vec == 0
            max_split = max(1, math.ceil(K / (tpr * vec)))
        return {"family": plan.family, "tpr": tpr, "block": block, "split": split, "vec": vec,
                "tasks_per_block": tasks, "min_blocks": min_blocks, "elem_bytes": self.elem_bytes, "K": K, "P": P,
                "chunk": chunk, "per_thread": per_thread, "smem_limit": int(self.device.smem_per_block_optin),
                "vec_ok": vec_ok, "max_split": max_split, "max_threads_per_sm": int(self.device.max_threads_per_sm)}

    @functools.cached_property
    def rules(self) -> tuple[dict[str, str], ...]:
        """The constraints that read only :meth:`names` (in file order)."""
        known = set(self.names(1, 1, 1, 1, 0, 0))
        return tuple(c for c in self.constraints if set(names_used(c["expr"])) <= known)

    def breaks(self, tpr: int, block: int, split: int, vec: int, tasks: int,
               min_blocks: int) -> dict[str, str] | None:
        """The first of :attr:`rules` this thread mapping breaks (None: it passes them): a point with this
        mapping breaks it too (:meth:`SpaceRules.derived` gives it the same names). Remembered per mapping."""
        key = (tpr, block, split, vec, tasks, min_blocks)
        if key not in self._memo:
            rules = self.rules
            passed = safe_eval_all(tuple(c["expr"] for c in rules), self.names(*key))
            self._memo[key] = next((c for c, ok in zip(rules, passed) if not ok), None)
        return self._memo[key]

    def impossible(self, domains: dict[str, list[Any]]) -> str | None:
        """Why no point of a space with these core ``domains`` can be legal, judged on the thread mapping
        alone (None: some mapping passes, which does not prove a legal point exists): every mapping of the
        core domains breaks one of :attr:`rules`. Exact for what it judges (it never calls a non-empty
        space empty) and cheap (a few thousand mappings at most, without drawing)."""
        d = domains
        empty = [n for n in CORE_SCALARS if not d[n]]
        if empty:
            return f"no value of {', '.join(empty)} is offered for this plan"
        used = {n for c in self.rules for n in names_used(c["expr"])}
        # tasks and min_blocks only pass through: one value stands for all where no rule reads them
        tasks_dom = d["tasks_per_block"] if "tasks_per_block" in used else d["tasks_per_block"][:1]
        mb_dom = d["min_blocks"] if "min_blocks" in used else d["min_blocks"][:1]
        broken: set[str] = set()
        for mapping in itertools.product(d["tpr"], d["block"], d["split"], d["vec"], tasks_dom, mb_dom):
            bad = self.breaks(*mapping)
            if bad is None:
                break
            broken.add(f"{bad['reason']} ({bad['expr']})")
        else:
            return "every thread mapping breaks a rule: " + "; ".join(sorted(broken))
        return None


class SpaceRules:
    """The rules of a :class:`~stitchtune.space.search_space.SearchSpace`: what a point is, the names its
    constraints read, and every reason a point is outside the space. A mixin: the space's ``__init__``
    sets the attributes declared here (see there)."""

    plan: StitchPlan
    device: Any
    table: OptionTable
    schemes: SchemeTable
    domains: dict[str, list[Any]]
    undrawn: dict[str, list[Any]]
    constraints: list[dict[str, str]]
    reuse_rules: dict[str, str]
    resources: ResourceCheck | None
    max_cluster: int
    n_full_inputs: int
    row_vector_inputs: tuple[str, ...]
    _cross_point: dict[str, Any]
    _constraint_options: list[frozenset[str]]
    _constraint_exprs: tuple[str, ...]
    _mappings: MappingRules

    def legal_values(self, name: str) -> list[Any]:
        """Every legal value of core parameter ``name``: its drawn domain, then its ``undrawn`` values
        (legal, never drawn by sampling or fresh trials: ``min_blocks`` 3), sorted."""
        return sorted(self.domains[name] + self.undrawn.get(name, []))

    # -- points -----------------------------------------------------------------------------------
    def _core_point(self, tpr: int, block: int, split: int, vec: int, tasks: int, min_blocks: int,
                    schemes: tuple[str, ...], reuse: tuple[str, ...]) -> dict[str, Any]:
        """The :data:`~stitchtune.space.options.Point` of a mapping, before any option is decided."""
        return {"family": self.plan.family, "nstages": self.plan.nstages,
                "single_pass_candidates": len(self.plan.single_pass), "tpr": tpr, "block": block,
                "split": split, "vec": vec, "tasks_per_block": tasks, "min_blocks": min_blocks,
                "schemes": tuple(schemes), "reuse": tuple(reuse), "max_cluster": self.max_cluster,
                "scheme_table": self.schemes, "transposable": self.plan.transpose is not None,
                **self._row_vector_point(tpr, split, vec), **self._cross_point}

    def _row_vector_point(self, tpr: int, split: int, vec: int) -> dict[str, Any]:
        """The plan's row-vector names (:mod:`stitchtune.plan.row_vectors`) as option ``row_vectors``
        reads them: ``row_vector_rows`` (rows per access, 1 without row-vector inputs: fixed per space),
        ``row_vector_inputs`` (how many inputs; an element-wise plan's loads per element, the column shifts a
        mapping takes from another lane not loaded: :func:`~stitchtune.plan.lane_shifts.loads_with`) and
        ``row_vectorable`` (the mapping's rows split into whole groups)."""
        if self.plan.family == Family.ELEMENTWISE:   # transposed inputs R rows a thread (plan.adjacent.vector_rows)
            R = self.plan.vector_rows or 1
            loads = loads_with(self.plan.vector_loads, self.plan.vector_visits, tpr, vec,
                               int(self.device.warp_size)) if split == 1 else \
                self.plan.vector_loads
            return {"row_vector_rows": R, "row_vector_inputs": loads if R > 1 else 0,
                    "row_vectorable": R > 1 and split == 1 and self.plan.M % R == 0}
        R = ROW_VECTOR_ROWS if self.row_vector_inputs else 1
        return {"row_vector_rows": R, "row_vector_inputs": len(self.row_vector_inputs),
                "row_vectorable": row_groups_fit(self.plan.M, R, tpr, split)}

    def _point(self, s: Schedule) -> dict[str, Any]:
        """The whole point of ``s``: its core and every option of this space's table (an option ``s``
        does not store reads as the table's default)."""
        point = self._core_point(s.tpr, s.block, s.split, s.vec, s.tasks_per_block, s.min_blocks, s.schemes,
                                 s.reuse)
        stored = dict(s.options)
        for opt in self.table:
            point[opt.name] = stored.get(opt.name, opt.default)
        return point

    # -- derived quantities and checks ------------------------------------------------------------
    def derived(self, s: Schedule) -> dict[str, Any]:
        """The names constraint expressions may use, for schedule ``s``: the mapping, the plan's sizes,
        the budgets below, each option's value and the names its ``derive`` adds; ``reg_cache_elems``
        includes the registers each option's value costs."""
        plan = self.plan
        fam = plan.family
        cached_reg = [c for c, r in zip(plan.reuse_candidates, s.reuse) if r == ReuseLevel.REGISTER]
        cached_smem = [c for c, r in zip(plan.reuse_candidates, s.reuse) if r == ReuseLevel.SHARED]
        names = self._mappings.names(s.tpr, s.block, s.split, s.vec, s.tasks_per_block, s.min_blocks)
        chunk, per_thread = names["chunk"], names["per_thread"]
        if fam == Family.COL:
            cols_per_block = (s.block // max(s.tpr, 1)) * s.vec
            smem_cache = 4 * chunk * cols_per_block * len(cached_smem)
            smem_red = 4 * s.block * max(1, s.vec) if plan.nstages else 0
        else:
            rpb = max(1, s.block // s.tpr)
            smem_cache = 4 * rpb * chunk * len(cached_smem)
            slots = max(1, plan.nstages)
            if "single_pass" in self.table and s.option(SINGLE_PASS):
                # a merged pair exchanges its whole running state: (n, mean, M2, shift) or (max, sum)
                slots = max([slots] + [4 if c.kind == "welford" else 2 for c in plan.single_pass])
            smem_red = 4 * max(1, rpb) * max(1, s.tpr // 32) * slots if plan.nstages else 0
        names.update({
            "reg_cache_elems": per_thread * len(cached_reg), "smem_cache_bytes": smem_cache,
            "smem_red_bytes": smem_red,
            "cross_smem_bytes": 4 * cross_smem_floats(s.tpr, s.block, chunk, self._cross_point["ncross_k"],
                                                      self._cross_point["ncross_s"]) if fam == Family.ROW else 0,
        })
        point = self._point(s)
        for opt in self.table:
            names[opt.name] = point[opt.name]
            names.update(opt.derive(point))
        names.update(self._cluster_names(s, names))
        names.setdefault("transpose", 0)   # a space whose table lacks the option (RECORDED_OPTIONS)
        context = {**point, **names, "n_full_inputs": self.n_full_inputs}
        names["reg_cache_elems"] += sum(opt.registers(context) for opt in self.table)
        return names

    @functools.cached_property
    def _mapping_is_impossible(self) -> str | None:
        """Why no point of this space can be legal, judged on the thread mapping alone
        (:meth:`MappingRules.impossible`), so :meth:`~stitchtune.space.search_space.SearchSpace.sample`
        refuses such a space at once instead of after ``max_tries`` rejected draws. Computed once per space."""
        return self._mappings.impossible(self.domains)

    def _cluster_names(self, s: Schedule, names: dict[str, Any]) -> dict[str, Any]:
        """The names of the cluster constraints: ``max_cluster``, ``cluster_stages`` and ``cluster_fits``,
        and ``cluster`` = 1 in a space whose table lacks the option. ``cluster_fits``: one cluster's blocks
        fit on the device's largest GPC by threads, block slots and shared memory per SM (a coarse form of
        the occupancy rules, read from the device description: this room sits below ``hardware``; the cost
        model applies the full rules, registers included, once they are known)."""
        cluster = int(names.get("cluster", 1))
        fits = True
        if cluster > 1 and self.max_cluster > 1:
            dev = self.device
            smem = int(names["smem_cache_bytes"]) + int(names["smem_red_bytes"]) + 4 * 8 * max(1, self.plan.nstages)
            unit = int(dev.smem_alloc_unit)
            alloc = -(-(smem + int(dev.smem_reserved_per_block)) // unit) * unit
            per_sm = min(int(dev.max_threads_per_sm) // s.block, int(dev.max_blocks_per_sm),
                         int(dev.smem_per_sm) // max(alloc, 1))
            fits = per_sm * max(dev.gpc_sms, default=0) >= cluster
        return {"cluster": cluster, "max_cluster": self.max_cluster,
                "cluster_stages": self.schemes.count(s.schemes, lambda sc: sc.cluster), "cluster_fits": fits}

    def _domain_violations(self, s: Schedule) -> list[str]:
        """Values outside their domains, undeclared options, and scheme/reuse counts that do not fit the plan."""
        out: list[str] = []
        for name in CORE_SCALARS:
            if getattr(s, name) not in self.legal_values(name):
                out.append(f"{name}={getattr(s, name)} not in {self.legal_values(name)}")
        stored = dict(s.options)
        for opt in self.table:
            value = stored.get(opt.name, opt.default)
            if value not in self.domains[opt.name]:
                out.append(f"{opt.name}={value} not in {self.domains[opt.name]}")
        out += [f"option {n}={v} is not declared by this space" for n, v in s.options if n not in self.table]
        if len(s.schemes) != self.plan.nstages:
            out.append(f"{len(s.schemes)} schemes for {self.plan.nstages} stages")
        if len(s.reuse) != len(self.plan.reuse_candidates):
            out.append(f"{len(s.reuse)} reuse levels for {len(self.plan.reuse_candidates)} candidates")
        return out

    def violations(self, s: Schedule) -> list[str]:
        """Every reason ``s`` is outside the space (empty when it is a legal point): :meth:`rule_violations`,
        then, when they pass and the space has a resource check (:meth:`with_resources`), why the device
        cannot run its kernels."""
        out = self.rule_violations(s)
        if not out and self.resources is not None:
            reason = self.resources(s)
            if reason is not None:
                out.append(f"does not fit {getattr(self.device, 'name', 'the device')}: {reason}")
        return out

    def rule_violations(self, s: Schedule) -> list[str]:
        """Every reason ``s`` breaks the space's rules: domains, the space file's constraints, each option
        at a non-default value where it does not apply (unless a failed constraint already names that
        option), then the scheme and reuse rules."""
        out = self._domain_violations(s)
        if out:
            return out
        names = self.derived(s)
        failed_options: set[str] = set()
        passed = safe_eval_all(self._constraint_exprs, names)
        for c, options, ok in zip(self.constraints, self._constraint_options, passed):
            if not ok:
                out.append(f"{c['reason']} ({c['expr']})")
                failed_options |= options
        point = self._point(s)
        for opt in self.table:
            value = point[opt.name]
            if value != opt.default and opt.name not in failed_options and not opt.applies(point):
                out.append(f"option {opt.name}={plain_value(value)} where it does not apply (only where {opt.where})")
        for i, sch in enumerate(s.schemes):
            scheme = self.schemes.get(sch)
            if scheme is None:
                out.append(f"unknown scheme {sch!r}")
            elif not safe_eval(scheme.rule, names):
                out.append(f"scheme {sch} is not legal for stage {i + 1} with this mapping ({scheme.rule})")
        inputs = set(self.plan.input_names)
        reuse_names = dict(names)
        for cand, r in zip(self.plan.reuse_candidates, s.reuse):
            rule = self.reuse_rules.get(r)
            reuse_names["is_input"] = cand in inputs
            if rule is None:
                out.append(f"unknown reuse level {r!r}")
            elif not safe_eval(rule, reuse_names):
                out.append(f"reuse level {r} is not legal for {'an input' if cand in inputs else 'an intermediate'}")
        return out

    def check(self, s: Schedule) -> Schedule:
        """Return ``s`` if legal, else raise :class:`ScheduleError` listing every violation."""
        v = self.violations(s)
        if v:
            raise ScheduleError("illegal schedule: " + "; ".join(v), problems=v)
        return s
