"""Single-pass statistics in kernel IR: the per-thread running state of a
:class:`~stitchtune.plan.single_pass.SinglePassCandidate` and its merge (``schedule.single_pass``).

* ``welford``: the state is ``(n, mean, M2, c)``: count, running mean of ``x - c``, sum of squared
  deviations, and a shift ``c`` (the first element the state saw; the row's mean is ``c + mean``). One
  element ``x``: ``y = x - c; n += 1; d = y - mean; mean += d / n; M2 += d * (y - mean)`` (Welford);
  a sweep folds in one vector of ``vec`` elements at a time (a vector is valid or masked as a whole):
  its mean ``g`` and ``M2`` about ``g``, merged by the formula below, one division per vector
  (:func:`update_vector`; for ``vec`` 1 this is exactly Welford's step).
  Two states: ``d = (mb + (cb - ca)) - ma; n = na + nb; mean = ma + d * nb / n; M2 = Ma + Mb + d^2 *
  na * nb / n`` (the parallel-variance formula of Chan, Golub and LeVeque), ``n`` clamped to >= 1 in
  the division, and an empty ``a`` taking ``b`` whole. The shift keeps every mean and difference near
  0: with rows around ``1e4`` a float32 mean near ``1e4`` rounds by ~5e-4 at every update and merge,
  and M2 inherits that error (3-5e-5 relative variance error on 64 x 1000 rows of 1e4 + N(0, 1)
  without the shift; ~1e-7 with it, below the two-pass kernels' ~1e-6). The results are ``c + mean`` (``K x`` that for a ``reduce_sum``) and ``M2 / K``
  (``M2`` for a ``reduce_sum``).
* ``online_softmax``: the state is ``(m, s)``, the running max and the sum of ``exp(x - m)``. One
  element: if ``x > m`` then ``s = s * exp(m - x) + 1; m = x`` else ``s += exp(x - m)`` (one ``exp``
  per element; a ``-inf`` element adds nothing). Two states: ``m = max(ma, mb)``, ``s = sa * exp(ma -
  m) + sb * exp(mb - m)`` with ``m`` taken as 0 in the exponents when both are ``-inf`` (empty). The
  results are ``m`` and ``s``.

The functions return statement lists for the row lowering to place (sweep body, exchange, partials);
the merge reads the other state into fresh variables first, so ``other`` may be shuffles or loads.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

from stitchtune.ir import kir
from stitchtune.ir.kir import F32, Assign, Bin, Const, MathOp, Select, Var
from stitchtune.graph.parse import Graph
from stitchtune.plan.planner import StitchPlan, TensorClass
from stitchtune.plan.single_pass import WELFORD, SinglePassCandidate
from stitchtune.lower.state import VarMaker

NEG_INF = Const(float("-inf"), F32)
ZERO = Const(0.0, F32)
ONE = Const(1.0, F32)


@dataclass(frozen=True)
class OnlineState:
    """The per-thread running state of one candidate: ``vars`` = ``(n, mean, M2, c)`` or ``(m, s)``."""

    cand: SinglePassCandidate
    vars: tuple[Var, ...]

    @property
    def welford(self) -> bool:
        return self.cand.kind == WELFORD

    @property
    def stored(self) -> tuple[Var, ...]:
        """The variables a block's partial keeps in scratch (``part<first>``, ``part<second>`` and for
        Welford ``pshift<first>``): the count of a Welford partial is not stored, it follows from the
        split (:func:`split_count`)."""
        return self.vars[1:] if self.welford else self.vars

    # -- the ReductionState interface (stitchtune.lower.state) ------------------------------------------
    def identity(self) -> tuple[kir.Expr, ...]:
        return identity(self)

    def merge(self, other: tuple[kir.Expr, ...], var: VarMaker) -> list[kir.Stmt]:
        return merge(self, other, var)

    def partial(self, count: kir.Expr, loaded: tuple[kir.Expr, ...]) -> tuple[kir.Expr, ...]:
        return partial(self, count, loaded)

    def part_names(self, red_idx: Mapping[str, int]) -> tuple[str, ...]:
        """``part<first>``, ``part<second>`` and for Welford ``pshift<first>`` (the order of :attr:`stored`)."""
        names = [f"part{red_idx[self.cand.first]}", f"part{red_idx[self.cand.second]}"]
        if self.welford:
            names.append(f"pshift{red_idx[self.cand.first]}")
        return tuple(names)

    def finish(self, K: int | kir.Expr, var: VarMaker) -> tuple[list[kir.Stmt], tuple[tuple[str, Var], ...]]:
        """The pair's two results, each in a fresh variable (``K`` a constant: a generic kernel with a
        dynamic row length has no single pass, :func:`stitchtune.lower.dynamic.check_schedule`)."""
        assert isinstance(K, int), "single-pass statistics need a static row length"
        stmts: list[kir.Stmt] = []
        out = []
        for r, e in zip((self.cand.first, self.cand.second), results(self, K)):
            v = var("acc", F32)
            stmts.append(Assign(v, e))
            out.append((r, v))
        return stmts, tuple(out)


def new_state(cand: SinglePassCandidate, var: VarMaker) -> OnlineState:
    """A state of fresh variables (``var(prefix)`` makes one)."""
    names = ("wn", "wmean", "wm2", "wc") if cand.kind == WELFORD else ("om", "os")
    return OnlineState(cand, tuple(var(n) for n in names))


def identity(st: OnlineState) -> tuple[Const, ...]:
    """The empty state: ``(0, 0, 0, 0)`` or ``(-inf, 0)``."""
    return (ZERO, ZERO, ZERO, ZERO) if st.welford else (NEG_INF, ZERO)


def reset(st: OnlineState) -> list[kir.Stmt]:
    """``state = empty``."""
    return [Assign(v, c) for v, c in zip(st.vars, identity(st))]


def update(st: OnlineState, x: kir.Expr, valid: kir.Expr, var: VarMaker) -> list[kir.Stmt]:
    """Online softmax: fold element ``x`` into ``(m, s)`` where ``valid`` (unchanged elsewhere)."""
    m, s = st.vars
    ok, big, e = var("ov", kir.BOOL), var("ob", kir.BOOL), var("oe")
    return [Assign(ok, Bin("&&", valid, Bin("!=", x, NEG_INF))), Assign(big, Bin(">", x, m)),
            Assign(e, MathOp("exp", (Select(big, Bin("-", m, x), Bin("-", x, m)),))),
            Assign(s, Select(ok, Select(big, Bin("+", Bin("*", s, e), ONE), Bin("+", s, e)), s)),
            Assign(m, Select(Bin("&&", ok, big), x, m))]


def update_vector(st: OnlineState, xs: list[kir.Expr], valid: kir.Expr, var: VarMaker) -> list[kir.Stmt]:
    """Fold the ``vec`` elements ``xs`` of one vector (all valid or all masked) into the state."""
    if not st.welford:
        return [a for x in xs for a in update(st, x, valid, var)]
    n, mean, m2, c = st.vars
    ys = [var("wy") for _ in xs]
    g, m2g, nt, d, f = var("wg"), var("wq"), var("wn"), var("wd"), var("wf")
    out: list[kir.Stmt] = [Assign(c, Select(Bin("&&", valid, Bin("==", n, ZERO)), xs[0], c))]
    out += [Assign(y, Bin("-", x, c)) for y, x in zip(ys, xs)]
    total: kir.Expr = ys[0]
    for y in ys[1:]:
        total = Bin("+", total, y)
    out.append(Assign(g, Bin("*", total, Const(1.0 / len(xs), F32)) if len(xs) > 1 else total))
    sq: kir.Expr = ZERO
    if len(ys) > 1:  # the vector's own M2 about its mean (0 for a single element)
        terms = [Bin("*", Bin("-", y, g), Bin("-", y, g)) for y in ys]
        sq = terms[0]
        for t in terms[1:]:
            sq = Bin("+", sq, t)
    out.append(Assign(m2g, sq))
    k = Const(float(len(xs)), F32)
    out += [Assign(nt, Bin("+", n, k)), Assign(d, Bin("-", g, mean)), Assign(f, Bin("/", k, nt)),
            Assign(mean, Select(valid, Bin("+", mean, Bin("*", d, f)), mean)),
            Assign(m2, Select(valid, Bin("+", Bin("+", m2, m2g), Bin("*", Bin("*", Bin("*", d, d), n), f)), m2)),
            Assign(n, Select(valid, nt, n))]
    return out


def merge(st: OnlineState, other: tuple[kir.Expr, ...], var: VarMaker) -> list[kir.Stmt]:
    """``state = merge(state, other)``; ``other`` (same layout as ``st.vars``) is read into fresh
    variables before the state changes."""
    tmp = tuple(var("wo" if st.welford else "oo") for _ in other)
    out: list[kir.Stmt] = [Assign(t, o) for t, o in zip(tmp, other)]
    if st.welford:
        n, mean, m2, c = st.vars
        nb, mb, m2b, cb = tmp
        take, nt, d, f = var("wt", kir.BOOL), var("wn"), var("wd"), var("wf")
        out += [Assign(take, Bin("==", n, ZERO)), Assign(nt, Bin("+", n, nb)),
                Assign(d, Bin("-", Bin("+", mb, Bin("-", cb, c)), mean)),
                Assign(f, Bin("/", nb, Bin("max", nt, ONE))),
                Assign(mean, Select(take, mb, Bin("+", mean, Bin("*", d, f)))),
                Assign(m2, Select(take, m2b, Bin("+", Bin("+", m2, m2b), Bin("*", Bin("*", Bin("*", d, d), n), f)))),
                Assign(c, Select(take, cb, c)), Assign(n, nt)]
        return out
    m, s = st.vars
    mb, sb = tmp
    mt, ms = var("om"), var("oz")
    out += [Assign(mt, Bin("max", m, mb)), Assign(ms, Select(Bin("==", mt, NEG_INF), ZERO, mt)),
            Assign(s, Bin("+", Bin("*", s, MathOp("exp", (Bin("-", m, ms),))),
                          Bin("*", sb, MathOp("exp", (Bin("-", mb, ms),))))),
            Assign(m, mt)]
    return out


def partial(st: OnlineState, count: kir.Expr, loaded: tuple[kir.Expr, ...]) -> tuple[kir.Expr, ...]:
    """The state of a stored partial: ``loaded`` are the values of :attr:`OnlineState.stored`,
    ``count`` the elements of its row piece (Welford only)."""
    return (count, *loaded) if st.welford else loaded


def split_count(n: int, chunk: int, q: int) -> int:
    """Elements of a row of ``n`` that split block ``q`` (pieces of ``chunk``) covers."""
    return max(0, min(chunk, n - q * chunk))


def split_count_expr(n: int, chunk: int, q: kir.Expr) -> kir.Expr:
    """:func:`split_count` for a run-time ``q`` (as a float)."""
    def i(v: int) -> Const:
        return Const(int(v), kir.I32)

    c = Bin("min", Bin("max", Bin("-", i(n), Bin("*", q, i(chunk))), i(0)), i(chunk))
    return kir.Cast(c, F32)


def results(st: OnlineState, K: int) -> tuple[kir.Expr, kir.Expr]:
    """The values of the candidate's two reductions from a complete state."""
    if not st.welford:
        return st.vars[0], st.vars[1]
    _, mean, m2, c = st.vars
    first = Bin("+", c, mean)
    first = Bin("*", first, Const(float(K), F32)) if st.cand.first_is_sum else first
    second = m2 if st.cand.second_is_sum else Bin("*", m2, Const(1.0 / K, F32))
    return first, second


def single_sweep_candidates(graph: Graph, plan: StitchPlan) -> frozenset[str]:
    """The reuse candidates that only one sweep reads once every candidate pair is merged: the sweep
    of a pair's second stage is gone (its ``d``, ``d * d``, ``exp(x - max)`` are then first needed by
    the output sweep), so caching them would fill registers or shared memory nobody reads again."""
    cls = dict(plan.classes)
    by_id = {nd.id: nd for nd in graph.nodes}
    needs: dict[str, set[int]] = {n: set() for n in cls}
    gone = {c.stage + 1 for c in plan.single_pass}

    def mark(name: str, sweep: int) -> None:
        if cls[name] is not TensorClass.FULL or sweep in needs[name]:
            return
        needs[name].add(sweep)
        nd = by_id.get(name)
        for a in (nd.args if nd is not None else ()):
            if isinstance(a, str):
                mark(a, sweep)

    for i, st in enumerate(plan.stages):
        if i not in gone:
            for r in st:
                mark(str(by_id[r].args[0]), i)
    for o in graph.outputs:
        mark(o, plan.nstages)
    return frozenset(c for c in plan.reuse_candidates if len(needs[c]) < 2)
