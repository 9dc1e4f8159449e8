"""What the IR walk (:mod:`stitchtune.cost.ir_walk`) assumes about loops: which iterations' loads nvcc keeps in
flight together, whether a loop stages through shared memory, and a block's task loop.

Contract (pure functions, no device):

* :func:`rolled_unroll(loop, trips, bytes_per_iteration, static) -> int`: the number of a rolled loop's iterations
  (at least 1, at most its trip count) whose global loads one load group holds, for a loop whose body ends no load
  group (no barrier, branch, shuffle or chain inside it) and whose loads do not read a value loaded in the body (the
  next iteration would wait on it), nor, while :data:`GUARDED_LOADS_WAIT`, a guarded vector load (the walker checks
  these and else counts one iteration per group). ``static``: the trip count is known when the kernel is compiled
  (:func:`static_expr` of both bounds). The walker applies it only while :data:`UNROLL_ROLLED` is true.
* :func:`stores_shared(stmts, shared) -> bool`: whether the statements store to one of the shared arrays.
* :func:`task_trips(top_loops, accesses) -> float`: a block's tasks, from the walk's top-level loops.

The unrolling rule, read from sm_90 SASS (nvcc 13, ``-O3``; :mod:`stitchtune.gpu.sass`'s loads in flight of small
loops ``acc += a[p * N + c]``; results/cost-fit-2026-12-07-s14-unroll/README.md):

* ``#pragma unroll n`` (``For.unroll_by``): ``n`` iterations (SASS: 4 x 4-byte loads, runtime or constant count);
* otherwise nvcc unrolls a loop of independent loads until about :data:`UNROLL_BYTES` bytes are in flight per
  thread: 16 x 4-byte loads (64 B), 8 x two 4-byte loads (SASS 72 B), 4 x 16-byte loads (64 B), whether the trip
  count is a runtime value or a constant (a constant count of 4-byte loads keeps 22-23 in flight, 88-92 B: the
  rule's 64 B is within 1.45x of it);
* a runtime trip count under :data:`RUNTIME_MIN_TRIPS` runs in the remainder loop, one iteration at a time (1); a
  constant one is unrolled whole (``for p < 3``: 3 loads in flight);
* not unrolled into one group (the walker's checks): a loop-carried address (a pointer chase: SASS 1). A guarded
  vector load ``if (pred) { v = load }`` as code generator versions <= 4 rendered it kept the previous iteration's
  value where the guard was false, so nvcc copied that loaded value into the next load's destination first (``MOV
  R20, R12`` before ``@P0 LDG.E.128 R20``: SASS 1, BERT training's region_view_56 combine loop, as measured). Since
  CODEGEN_VERSION 5 such a load in a loop renders into fresh zeroed registers (``stitchtune.gpu.render_guarded``)
  or its destinations were zeroed just before: no wait (:data:`GUARDED_LOADS_WAIT` False; SASS of today's kernels:
  results/walk-guarded-2026-12-07-s15/). A guarded scalar load is ``pred ? load : 0`` and never waited.

**Off** (:data:`UNROLL_ROLLED` False, one iteration per group as before): the rule brings the walk closer to the
SASS of the 245 measured kernels that have both (within 1.25x: 125 -> 129), but the model refitted on it scores
worse held out (pre-build 112 -> 106 of 153), so it is not in the shipped features (the README above).
"""

from __future__ import annotations

from typing import Mapping, Sequence

from stitchtune.ir import kir

#: whether the walk applies :func:`rolled_unroll` (False: one iteration of a rolled loop per load group, the
#: features the shipped coefficients were fitted on)
UNROLL_ROLLED = False
#: whether a guarded vector load in a rolled loop waits for the previous iteration's (one iteration per group; read
#: only while UNROLL_ROLLED): true of kernels rendered by code generator versions <= 4 (the cost fit's measured
#: kernels: a dataset rebuilt from them with UNROLL_ROLLED sets it), false of today's renderer (module docstring)
GUARDED_LOADS_WAIT = False
#: bytes of loads per thread up to which nvcc unrolls a rolled loop of independent loads (sm_90 SASS: 64-92 B)
UNROLL_BYTES = 64.0
#: the unrolled body's iterations below which a runtime trip count runs in nvcc's remainder loop (one at a time)
RUNTIME_MIN_TRIPS = 4


def static_expr(e: kir.Expr, defs: Mapping[str, kir.Expr | None], depth: int = 0) -> bool:
    """Whether ``e`` is known when the kernel is compiled: constants and arithmetic of constants, through the
    variables' definitions ``defs`` (a thread or block index, an extent, a value from memory is not)."""
    if depth > 64:
        return False
    match e:
        case kir.Const():
            return True
        case kir.Var():
            d = defs.get(e.name)
            return d is not None and static_expr(d, defs, depth + 1)
        case kir.Bin():
            return static_expr(e.a, defs, depth + 1) and static_expr(e.b, defs, depth + 1)
        case kir.Select():
            return all(static_expr(x, defs, depth + 1) for x in (e.cond, e.a, e.b))
        case kir.Cast():
            return static_expr(e.expr, defs, depth + 1)
        case _:
            return False


def rolled_unroll(loop: kir.For, trips: float, bytes_per_iteration: float, static: bool) -> int:
    """The iterations of the rolled ``loop`` (``trips`` per thread, ``bytes_per_iteration`` of global loads per
    thread and iteration) whose loads are in flight together (module docstring)."""
    n = max(1, int(round(trips)))
    if loop.unroll_by > 1:
        return max(1, min(n, loop.unroll_by))
    if not static and n < RUNTIME_MIN_TRIPS:
        return 1
    per = max(1, int(UNROLL_BYTES // max(bytes_per_iteration, 1.0)))
    return max(1, min(n, per))


def stores_shared(stmts: tuple[kir.Stmt, ...], shared: set[str]) -> bool:
    """Whether ``stmts`` (nested statements included) store to one of the ``shared`` arrays."""
    for s in stmts:
        if isinstance(s, kir.StoreVec) and s.buf in shared:
            return True
        if isinstance(s, kir.For) and stores_shared(s.body, shared):
            return True
        if isinstance(s, kir.If) and (stores_shared(s.then, shared) or stores_shared(s.orelse, shared)):
            return True
    return False


def task_trips(top_loops: Sequence[tuple[float, int]], accesses: int) -> float:
    """A block's tasks: the trip count of the one top-level loop (``top_loops``: trip count, global accesses inside)
    that holds all ``accesses`` of the kernel (a persistent grid's or a block's task loop; its mean trips over the
    blocks where it reads the block index), else 1. The data a block reads and reads again lies within one
    iteration of that loop (the fitted model's reuse window, ``Coefficients.reuse_tasks``)."""
    inside = [n for n, acc in top_loops if acc == accesses and acc > 0]
    return max(1.0, float(inside[0])) if len(inside) == 1 else 1.0
