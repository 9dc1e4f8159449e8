"""Schedules and the search space.

A :class:`Schedule` is one point of the stitch schedule space: a frozen, hashable value with a JSON
round trip and a stable key. The space itself (parameter domains, constraints between parameters,
which stitching scheme is legal for which mapping) is data, in ``search_spaces/stitch.json``;
this module only interprets it. Constraint expressions are evaluated by a tiny evaluator that
accepts names, numbers, strings, arithmetic, comparisons and ``and``/``or``/``not`` only.
"""

from __future__ import annotations

import ast
import copy
import dataclasses
import functools
import hashlib
import json
import math
import os
import importlib.resources
import random
from dataclasses import asdict, dataclass
from pathlib import Path
from types import CodeType
from typing import Any

from stitchtune.errors import ScheduleError, StitchtuneError
from stitchtune.plan.planner import StitchPlan, TensorClass

SPACE_FILE = "stitch.json"

#: ``Schedule.tasks_per_block`` of a persistent grid (the JSON value): as many blocks as the device
#: holds at once, each taking tasks in turn until none are left (see :attr:`Schedule.persistent`)
PERSISTENT = 0


def default_space_file() -> Any:
    """Where the schedule space is read from: ``$STITCHTUNE_SPACES/stitch.json`` when that variable is
    set; else the copy installed as package data ``stitchtune.search_spaces`` (a wheel, or an editable
    install, maps the repository's top-level ``search_spaces/`` there); else, in a source checkout put
    on ``PYTHONPATH`` without installing, the repository's ``search_spaces/stitch.json``. Returns a
    ``Path`` or an ``importlib.resources`` Traversable (both have ``read_text``)."""
    env = os.environ.get("STITCHTUNE_SPACES")
    if env:
        return Path(env) / SPACE_FILE
    try:
        return importlib.resources.files("stitchtune.search_spaces") / SPACE_FILE
    except ModuleNotFoundError:
        return Path(__file__).resolve().parents[2] / "search_spaces" / SPACE_FILE


@dataclass(frozen=True)
class Schedule:
    """One point of the space. See ``search_spaces/stitch.json`` for what each field means."""

    tpr: int
    block: int
    split: int
    vec: int
    tasks_per_block: int       # PERSISTENT (0): a grid sized to the device
    min_blocks: int
    schemes: tuple[str, ...]   # one per reduction stage
    reuse: tuple[str, ...]     # one per plan.reuse_candidates entry
    order: str = "forward"     # sweep order of re-reads: forward, or alternate (every other re-read reversed)
    prefetch: int = 0          # 1: load the next task's inputs while the current one reduces (row family)
    combine: str = "thread"    # split rows: every thread loads all partials, or each warp loads them together

    @property
    def persistent(self) -> bool:
        """Whether the grid is persistent (``tasks_per_block == PERSISTENT``): sized to the blocks that
        fit on the device at once rather than to ``tasks / tasks_per_block``."""
        return self.tasks_per_block == PERSISTENT

    def to_dict(self) -> dict[str, Any]:
        """The JSON form. ``order``, ``prefetch`` and ``combine`` are left out at their defaults
        (``forward``, 0, ``thread``: what every schedule did before they were parameters), so such a
        schedule's JSON and :meth:`key` are those it had then."""
        d = asdict(self)
        d["schemes"] = list(self.schemes)
        d["reuse"] = list(self.reuse)
        if self.order == "forward":
            del d["order"]
        if self.prefetch == 0:
            del d["prefetch"]
        if self.combine == "thread":
            del d["combine"]
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "Schedule":
        """Build from a dict (e.g. parsed JSON); raise :class:`ScheduleError` on a malformed one."""
        try:
            return cls(tpr=int(d["tpr"]), block=int(d["block"]), split=int(d.get("split", 1)),
                       vec=int(d.get("vec", 1)), tasks_per_block=int(d.get("tasks_per_block", 1)),
                       min_blocks=int(d.get("min_blocks", 0)),
                       schemes=tuple(str(s) for s in d.get("schemes", ())),
                       reuse=tuple(str(r) for r in d.get("reuse", ())),
                       order=str(d.get("order", "forward")), prefetch=int(d.get("prefetch", 0)),
                       combine=str(d.get("combine", "thread")))
        except (KeyError, TypeError, ValueError, OverflowError) as exc:
            raise ScheduleError(f"malformed schedule: {exc!r}") from None

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), sort_keys=True, separators=(",", ":"))

    @classmethod
    def from_json(cls, text: str) -> "Schedule":
        try:
            d = json.loads(text)
        except (ValueError, RecursionError) as exc:  # also over-long integers, deep nesting
            raise ScheduleError(f"schedule is not JSON: {str(exc).split(';')[0] or 'nested too deeply'}") from None
        if not isinstance(d, dict):
            raise ScheduleError("schedule JSON must be an object")
        return cls.from_dict(d)

    def key(self) -> str:
        """Stable short hash of the schedule."""
        return hashlib.sha256(self.to_json().encode()).hexdigest()[:16]

    def flat(self) -> dict[str, Any]:
        """Flat scalar columns (``schemes``/``reuse`` as ``scheme_<i>``/``reuse_<i>``)."""
        d: dict[str, Any] = {k: v for k, v in self.to_dict().items() if k not in ("schemes", "reuse")}
        d["order"] = self.order
        d["prefetch"] = self.prefetch
        d["combine"] = self.combine
        for i, s in enumerate(self.schemes):
            d[f"scheme_{i}"] = s
        for i, r in enumerate(self.reuse):
            d[f"reuse_{i}"] = r
        return d


def rereads(schemes: tuple[str, ...] | list[str], reuse: tuple[str, ...] | list[str]) -> bool:
    """Whether a schedule reads some full-size tensor from memory in more than one sweep: a reuse
    level ``global`` (an input re-read) or ``recompute`` (its inputs re-read), or a kernel boundary
    (an ``independent`` stage: nothing cached survives it). Only then does the sweep ``order`` matter."""
    return any(r in ("global", "recompute") for r in reuse) or "independent" in schemes


def _pick_options(choose: Any, domains: dict[str, list[Any]], family: str, split: int, tasks_per_block: int,
                  schemes: tuple[str, ...] | list[str], reuse: tuple[str, ...] | list[str]) -> tuple[str, int, str]:
    """(order, prefetch, combine) of a point: each asked of ``choose(name, domain)`` only where it
    applies (the sweep order where something is re-read; prefetch for a row reduction with whole rows
    and several tasks per block, forward order; combine for a split row), its default elsewhere."""
    order = choose("order", domains["order"]) if rereads(schemes, reuse) else "forward"
    prefetch = (choose("prefetch", domains["prefetch"])
                if prefetchable(family, split, tasks_per_block) and order == "forward" else 0)
    combine = choose("combine", domains["combine"]) if family == "row" and split > 1 else "thread"
    return order, prefetch, combine


def prefetchable(family: str, split: int, tasks_per_block: int) -> bool:
    """Whether ``prefetch`` can matter: a row reduction (an element-wise graph has one sweep, with no
    reduction to overlap the next task's loads with) with whole rows per block (split 1) and blocks
    that take several tasks in turn (``tasks_per_block`` :data:`PERSISTENT`, or >= 2)."""
    return family == "row" and split == 1 and tasks_per_block != 1


# ------------------------------------------------------------------------------------------------
# a tiny safe expression evaluator for the constraints in the space file
# ------------------------------------------------------------------------------------------------

_ALLOWED = (ast.Expression, ast.BoolOp, ast.And, ast.Or, ast.UnaryOp, ast.Not, ast.USub, ast.BinOp,
            ast.Add, ast.Sub, ast.Mult, ast.FloorDiv, ast.Mod, ast.Div, ast.Compare, ast.Eq, ast.NotEq,
            ast.Lt, ast.LtE, ast.Gt, ast.GtE, ast.Name, ast.Load, ast.Constant, ast.In, ast.NotIn,
            ast.Tuple, ast.List)


@functools.lru_cache(maxsize=1024)
def _compiled(expr: str) -> tuple[CodeType, tuple[str, ...]]:
    """The checked, compiled form of a constraint expression and the names it uses (cached: the
    space's few expressions are evaluated for every point checked)."""
    tree = ast.parse(expr, mode="eval")
    used = []
    for node in ast.walk(tree):
        if not isinstance(node, _ALLOWED):
            raise StitchtuneError(f"search space constraint {expr!r} uses {type(node).__name__}")
        if isinstance(node, ast.Name) and node.id not in ("True", "False"):
            used.append(node.id)
    return compile(tree, "<constraint>", "eval"), tuple(dict.fromkeys(used))


def safe_eval(expr: str, names: dict[str, Any]) -> Any:
    """Evaluate a constraint expression over ``names``; anything but plain arithmetic/logic is refused."""
    code, used = _compiled(expr)
    for n in used:
        if n not in names:
            raise StitchtuneError(f"search space constraint {expr!r} uses unknown name {n!r}")
    return eval(code, {"__builtins__": {}}, dict(names))  # noqa: S307


def load_space_file(path: Path | None = None) -> dict[str, Any]:
    p = Path(path) if path else default_space_file()
    try:
        return json.loads(p.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise StitchtuneError(f"cannot read search space {p}: {exc}") from None


class SearchSpace:
    """The schedule space of one plan on one device (domains from the space file)."""

    def __init__(self, plan: StitchPlan, device: Any, data: dict[str, Any]) -> None:
        self.plan = plan
        self.device = device
        self.data = data
        self.version: str = str(data["version"])
        self.flat = False  # plain parameter names (see flat_mode)
        p = data["params"]
        self.domains: dict[str, list[Any]] = {k: list(v["choices"]) for k, v in p.items()}
        self.scheme_rules: dict[str, str] = data["scheme_rules"]
        self.reuse_rules: dict[str, str] = data["reuse_rules"]
        self.constraints: list[dict[str, str]] = data["constraints"]
        # every tensor accessed with vector loads/stores (full-size ones, and the per-column operands
        # that are contiguous along the vector) must fit 16 bytes: the widest element type decides
        vec_cls = ({TensorClass.FULL, TensorClass.PER_KEPT} if plan.family == "col"
                   else {TensorClass.FULL, TensorClass.PER_REDUCED})
        vectored = [n for n, c in plan.classes if c in vec_cls]
        self.elem_bytes = max((2 if plan.dtype(n) != "float32" else 4) for n in vectored) if vectored else 4
        # full-size inputs: each takes one row piece of prefetch registers (schedule.prefetch)
        self.n_full_inputs = sum(1 for n, c in plan.classes if c is TensorClass.FULL and n in plan.input_names)
        # vec choices above 16 bytes are never legal: drop them from the domain up front
        self.domains["vec"] = [v for v in self.domains["vec"] if v * self.elem_bytes <= 16]
        if plan.family == "row":
            self.domains["tpr"] = [t for t in self.domains["tpr"] if t >= 4]
        elif plan.family == "elementwise":  # whole blocks along the row
            self.domains["tpr"] = [t for t in self.domains["tpr"] if t >= 32]
        else:  # column tiles at least 8 threads wide
            self.domains["tpr"] = [t for t in self.domains["tpr"] if t * 8 <= max(self.domains["block"])]

    @classmethod
    def for_plan(cls, plan: StitchPlan, device: Any, path: Path | None = None) -> "SearchSpace":
        return cls(plan, device, load_space_file(path))

    # -- derived quantities and checks ------------------------------------------------------------
    def derived(self, s: Schedule) -> dict[str, Any]:
        """The names constraint expressions may use, for schedule ``s``."""
        plan = self.plan
        K, P = plan.K, plan.P
        fam = plan.family
        cached_reg = [c for c, r in zip(plan.reuse_candidates, s.reuse) if r == "register"]
        cached_smem = [c for c, r in zip(plan.reuse_candidates, s.reuse) if r == "shared"]
        if fam == "col":
            chunk = math.ceil(K / s.split)
            rows_per_thread = math.ceil(chunk / max(s.tpr, 1))
            per_thread = rows_per_thread * s.vec
            reg = per_thread * len(cached_reg)
            cols_per_block = (s.block // max(s.tpr, 1)) * s.vec
            smem_cache = 4 * chunk * cols_per_block * len(cached_smem)
            smem_red = 4 * s.block * max(1, s.vec) if plan.nstages else 0
            vec_ok = P % s.vec == 0
            max_split = K
        else:
            step = s.tpr * s.vec
            chunk = math.ceil(math.ceil(K / s.split) / step) * step
            per_thread = chunk // s.tpr
            reg = per_thread * (len(cached_reg) + s.prefetch * self.n_full_inputs)
            rpb = max(1, s.block // s.tpr)
            smem_cache = 4 * rpb * chunk * len(cached_smem)
            smem_red = 4 * max(1, rpb) * max(1, s.tpr // 32) * max(1, plan.nstages) if plan.nstages else 0
            vec_ok = K % s.vec == 0
            max_split = max(1, math.ceil(K / (s.tpr * s.vec)))
        return {
            "family": fam, "tpr": s.tpr, "block": s.block, "split": s.split, "vec": s.vec,
            "tasks_per_block": s.tasks_per_block, "min_blocks": s.min_blocks,
            "elem_bytes": self.elem_bytes, "K": K, "P": P, "chunk": chunk, "per_thread": per_thread,
            "reg_cache_elems": reg, "smem_cache_bytes": smem_cache, "smem_red_bytes": smem_red,
            "smem_limit": int(self.device.smem_per_block_optin), "vec_ok": vec_ok, "max_split": max_split,
            "max_threads_per_sm": int(self.device.max_threads_per_sm),
            "order": s.order, "rereads": rereads(s.schemes, s.reuse), "prefetch": s.prefetch,
            "prefetchable": prefetchable(fam, s.split, s.tasks_per_block), "combine": s.combine,
        }

    def violations(self, s: Schedule) -> list[str]:
        """Every reason ``s`` is outside the space (empty when it is a legal point)."""
        out: list[str] = []
        for name, dom in (("tpr", self.domains["tpr"]), ("block", self.domains["block"]),
                          ("split", self.domains["split"]), ("vec", self.domains["vec"]),
                          ("tasks_per_block", self.domains["tasks_per_block"]),
                          ("min_blocks", self.domains["min_blocks"]), ("order", self.domains["order"]),
                          ("prefetch", self.domains["prefetch"]), ("combine", self.domains["combine"])):
            if getattr(s, name) not in dom:
                out.append(f"{name}={getattr(s, name)} not in {dom}")
        if len(s.schemes) != self.plan.nstages:
            out.append(f"{len(s.schemes)} schemes for {self.plan.nstages} stages")
        if len(s.reuse) != len(self.plan.reuse_candidates):
            out.append(f"{len(s.reuse)} reuse levels for {len(self.plan.reuse_candidates)} candidates")
        if out:
            return out
        names = self.derived(s)
        for c in self.constraints:
            if not safe_eval(c["expr"], names):
                out.append(f"{c['reason']} ({c['expr']})")
        for i, sch in enumerate(s.schemes):
            rule = self.scheme_rules.get(sch)
            if rule is None:
                out.append(f"unknown scheme {sch!r}")
            elif not safe_eval(rule, names):
                out.append(f"scheme {sch} is not legal for stage {i + 1} with this mapping ({rule})")
        inputs = set(self.plan.input_names)
        for cand, r in zip(self.plan.reuse_candidates, s.reuse):
            rule = self.reuse_rules.get(r)
            if rule is None:
                out.append(f"unknown reuse level {r!r}")
            elif not safe_eval(rule, {**names, "is_input": cand in inputs}):
                out.append(f"reuse level {r} is not legal for {'an input' if cand in inputs else 'an intermediate'}")
        return out

    def check(self, s: Schedule) -> Schedule:
        """Return ``s`` if legal, else raise :class:`ScheduleError` listing every violation."""
        v = self.violations(s)
        if v:
            raise ScheduleError("illegal schedule: " + "; ".join(v), problems=v)
        return s

    # -- sampling -------------------------------------------------------------------------------
    def _reuse_domain(self, cand: str) -> list[str]:
        is_input = cand in set(self.plan.input_names)
        return [r for r in self.domains["reuse"] if safe_eval(self.reuse_rules[r], {"is_input": is_input})]

    def _decide(self, choose: Any) -> Schedule:
        """Walk the space's decisions in order, asking ``choose(name, domain)`` for each value.

        Parameters whose legal values depend on earlier ones get a name that carries those earlier
        values (e.g. ``block_t32``), so that every optuna parameter has one fixed domain while most
        suggested points satisfy the space's constraints; forced values are not parameters at all.
        """
        plan, d = self.plan, self.domains
        fam = plan.family
        tpr = choose("tpr", d["tpr"])
        vec = choose("vec", d["vec"])
        if fam == "col":
            split = choose("split", d["split"])
            blocks = [b for b in d["block"] if b >= tpr and b // tpr >= 8 and b // tpr * vec <= max(plan.P, vec)]
            block = choose(f"block_t{tpr}_v{vec}", blocks or [max(d["block"])])
        else:
            max_split = max(1, math.ceil(plan.K / (tpr * vec)))
            splits = [x for x in d["split"] if x <= max_split] or [1]
            split = choose(f"split_t{tpr}_v{vec}", splits) if tpr >= 32 else 1
            if split > 1 or fam == "elementwise" or tpr >= max(d["block"]):
                block = tpr
            else:
                block = choose(f"block_t{tpr}", [b for b in d["block"] if b >= max(tpr, 32)])
        mbs = [m for m in d["min_blocks"] if m * block <= self.device.max_threads_per_sm]
        min_blocks = choose(f"min_blocks_b{block}", mbs)
        tasks = choose("tasks_per_block", d["tasks_per_block"])
        names = {"family": fam, "tpr": tpr, "split": split, "block": block}
        legal = [x for x in d["scheme"] if safe_eval(self.scheme_rules[x], names)]
        kind = "split" if split > 1 else ("warp" if "local" in legal else "block")
        schemes = tuple(choose(f"scheme_{i}_{kind}", legal) for i in range(plan.nstages))
        reuse = tuple(choose(f"reuse_{i}", self._reuse_domain(c)) for i, c in enumerate(plan.reuse_candidates))
        options = _pick_options(choose, d, fam, split, tasks, schemes, reuse)
        return Schedule(tpr, block, split, vec, tasks, min_blocks, schemes, reuse, *options)

    def _decide_flat(self, choose: Any) -> Schedule:
        """Every parameter under its plain name with its full domain (``flat`` mode), then repaired
        towards the legal point it most resembles: a legal point maps to itself, so
        :meth:`params_of` stays the identity. For samplers that model a fixed set of parameters
        (GP, CMA-ES), which fall back to random sampling on conditional parameter names."""
        plan, d = self.plan, self.domains
        fam = plan.family
        tpr = choose("tpr", d["tpr"])
        vec = choose("vec", d["vec"])
        split = choose("split", d["split"])
        block = choose("block", d["block"])
        min_blocks = choose("min_blocks", d["min_blocks"])
        tasks = choose("tasks_per_block", d["tasks_per_block"])
        schemes = [choose(f"scheme_{i}", d["scheme"]) for i in range(plan.nstages)]
        reuse = tuple(choose(f"reuse_{i}", self._reuse_domain(c)) for i, c in enumerate(plan.reuse_candidates))
        picked = {"order": choose("order", d["order"]) if plan.nstages else "forward",
                  "prefetch": choose("prefetch", d["prefetch"]) if fam == "row" else 0,
                  "combine": choose("combine", d["combine"]) if fam == "row" else "thread"}
        if fam == "col":
            block = min(max(block, tpr * 8), max(d["block"]))
        else:
            if tpr < 32:
                split = 1
            block = tpr if (split > 1 or fam == "elementwise" or tpr >= max(d["block"])) else max(block, tpr, 32)
        while min_blocks and min_blocks * block > self.device.max_threads_per_sm:
            min_blocks = max((m for m in d["min_blocks"] if m < min_blocks), default=0)
        names = {"family": fam, "tpr": tpr, "split": split, "block": block}
        legal = [x for x in d["scheme"] if safe_eval(self.scheme_rules[x], names)]
        prefer = ("regional", "global", "independent", "local")
        schemes = [x if x in legal else next(y for y in prefer if y in legal) for x in schemes]
        # the options that apply keep their picked value, the others take their default
        options = _pick_options(lambda name, dom: picked[name], d, fam, split, tasks, schemes, reuse)
        return Schedule(tpr, block, split, vec, tasks, min_blocks, tuple(schemes), reuse, *options)

    def flat_mode(self) -> "SearchSpace":
        """A copy of this space whose :meth:`suggest` / :meth:`params_of` use plain parameter names
        (see :meth:`_decide_flat`)."""
        other = copy.copy(self)
        other.flat = True
        return other

    def suggest(self, trial: Any) -> Schedule:
        """Ask an optuna trial for a schedule (define-by-run). Constraints that the decision order
        cannot rule out (register and shared-memory budgets) are *not* enforced here: check the
        result with :meth:`violations` (a violated point is pruned without compiling)."""
        decide = self._decide_flat if self.flat else self._decide
        return decide(lambda name, dom: trial.suggest_categorical(name, list(dom)))

    def params_of(self, s: Schedule) -> dict[str, Any]:
        """The optuna parameter dict of ``s`` (for ``study.enqueue_trial``); the names are those
        :meth:`suggest` would use for the same point."""
        values = {"tpr": s.tpr, "vec": s.vec, "split": s.split, "block": s.block, "min_blocks": s.min_blocks,
                  "tasks_per_block": s.tasks_per_block, "order": s.order, "prefetch": s.prefetch,
                  "combine": s.combine}
        out: dict[str, Any] = {}

        def choose(name: str, dom: list[Any]) -> Any:
            if name.startswith("scheme_"):
                v = s.schemes[int(name.split("_")[1])]
            elif name.startswith("reuse_"):
                v = s.reuse[int(name.split("_")[1])]
            else:
                v = values[name.split("_t")[0].split("_b")[0].split("_v")[0] if not name.startswith(
                    ("min_blocks", "tasks_per_block")) else ("min_blocks" if name.startswith("min_blocks") else
                                                             "tasks_per_block")]
            out[name] = v
            return v

        (self._decide_flat if self.flat else self._decide)(choose)
        return out

    def variants(self, s: Schedule) -> list[Schedule]:
        """The legal points that differ from ``s`` in one option the cost model ranks least reliably
        (the sweep ``order``; ``prefetch``, switched off where it blocks the alternate order; how a
        split row ``combine``s its partials). The
        search measures them next to its best point, so every search compares them side by side."""
        out: list[Schedule] = []
        flip_order = "alternate" if s.order == "forward" else "forward"
        flip_combine = "warp" if s.combine == "thread" else "thread"
        for cand in (Schedule.from_dict({**s.to_dict(), "order": flip_order, "prefetch": 0}),
                     Schedule.from_dict({**s.to_dict(), "prefetch": 1 - s.prefetch}),
                     Schedule.from_dict({**s.to_dict(), "combine": flip_combine})):
            if cand != s and cand not in out and not self.violations(cand):
                out.append(cand)
        return out

    def sample(self, rng: random.Random, max_tries: int = 20000) -> Schedule:
        """A drawn *legal* schedule: the mapping, schemes and reuse levels uniformly (rejection sampling),
        then each option (``order``, ``prefetch``, ``combine``) uniformly among its values where it
        applies to that point (its default elsewhere)."""
        fam = self.plan.family
        for _ in range(max_tries):
            s = Schedule(
                tpr=rng.choice(self.domains["tpr"]), block=rng.choice(self.domains["block"]),
                split=rng.choice(self.domains["split"]), vec=rng.choice(self.domains["vec"]),
                tasks_per_block=rng.choice(self.domains["tasks_per_block"]),
                min_blocks=rng.choice(self.domains["min_blocks"]),
                schemes=tuple(rng.choice(self.domains["scheme"]) for _ in range(self.plan.nstages)),
                reuse=tuple(rng.choice(self._reuse_domain(c)) for c in self.plan.reuse_candidates))
            order, prefetch, combine = _pick_options(lambda name, dom: rng.choice(dom), self.domains, fam, s.split,
                                                     s.tasks_per_block, s.schemes, s.reuse)
            s = dataclasses.replace(s, order=order, prefetch=prefetch, combine=combine)
            if not self.violations(s):
                return s
        raise ScheduleError("no legal schedule found by sampling; the space is empty for this graph")

    def grid(self) -> list[Schedule]:
        """Every legal point (for the grid sampler and exhaustive sweeps; can be large)."""
        import itertools

        out = []
        reuse_doms = [self._reuse_domain(c) for c in self.plan.reuse_candidates]
        for tpr, block, split, vec, tasks, mb in itertools.product(
                self.domains["tpr"], self.domains["block"], self.domains["split"], self.domains["vec"],
                self.domains["tasks_per_block"], self.domains["min_blocks"]):
            for schemes in itertools.product(self.domains["scheme"], repeat=self.plan.nstages):
                for reuse in itertools.product(*reuse_doms):
                    for order, pf, comb in itertools.product(self.domains["order"], self.domains["prefetch"],
                                                             self.domains["combine"]):
                        s = Schedule(tpr, block, split, vec, tasks, mb, tuple(schemes), tuple(reuse), order, pf,
                                     comb)
                        if not self.violations(s):
                            out.append(s)
        return out
