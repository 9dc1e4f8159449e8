"""Per-column inputs held in registers across a row kernel's tasks (the column cache).

A row kernel whose blocks take several tasks one after another (a persistent grid, or several tasks per
block) with its rows unsplit gives each thread the same columns in every task: element
``k = (i * tpr + lane) * vec + j`` of every row. A *per-column* input (``TensorClass.PER_REDUCED``:
gamma, beta, a bias; it varies along the row only) then has the same values in every task and every
sweep, yet a sweep loads them per row: BERT's layer-norm backward (``region_view_50``, 4096 x 768,
persistent, 2 sweeps) loaded gamma 12 times per row (12 ``LDG.128`` of 256 per row: 25 MB of requests
that the L1 serves, for 3 KB of data). With the column cache the thread loads its piece of each such
input once, before the task loop, into a local array ``cw<t>`` (registers: every sweep that reads it is
unrolled), and the sweeps read the array.

Contract
--------
* :func:`cached_columns(low, rounds)` -> the per-column inputs of ``low``'s kernels that are cached:
  float inputs of class ``PER_REDUCED`` read through no index map of their own (``partial_cols`` or a
  scalar vector mode) in a static, unsplit row program whose kernel runs more than one round, with
  at most :data:`MAX_CACHED_FLOATS` floats per thread over all of them (first inputs first); empty
  otherwise (a one-task kernel reads each value once per sweep anyway), and empty under a ``min_blocks``
  register cap below the device's per-thread maximum (Llama's embedding-backward region ``view_102``,
  pinned to two blocks per SM, 128 registers: 68 bytes spilled with the cache, none without; sm_90).
* :func:`load_columns(low, lane, names)` -> the statements that fill ``cw<t>`` for ``names`` before the
  task loop: the same vectors, guard (``k < N``, zeros beyond) and lane as a sweep's.
* :func:`column_array(low, name)` -> the array's name. Values are the same as the per-row loads give
  (same addresses, same conversion), so results are bitwise unchanged.
"""

from __future__ import annotations

from stitchtune.ir import kir
from stitchtune.ir.kir import F32, I32, Assign, Bin
from stitchtune.lower.base import Ctx, I, Lowerer, add, mul
from stitchtune.plan.planner import TensorClass

#: the most floats per thread the column cache holds (all its inputs together): BERT's layer-norm backward
#: at 32 threads per row holds 24 (gamma's 768 / 32); more would take registers from the loads in flight
MAX_CACHED_FLOATS = 32


def column_array(low: Lowerer, name: str) -> str:
    """The local array of per-column input ``name``."""
    return f"cw{low.tid_of[name]}"


def cached_columns(low: Lowerer, rounds: int) -> tuple[str, ...]:
    """The per-column inputs held in registers across the tasks (module docstring)."""
    s, p = low.s, low.p
    if low.sym is not None or s.split != 1 or rounds <= 1 or low.iters > 8:
        return ()
    if s.min_blocks and low.dev.regs_per_sm // (s.block * s.min_blocks) < low.dev.max_regs_per_thread:
        return ()   # under a register cap the cache's registers come out of the loads in flight: spills
    out: list[str] = []
    floats = 0
    for name in p.input_names:
        if (low.cls.get(name) is not TensorClass.PER_REDUCED or name not in low.in_buf or name in low.int_regs
                or not low.g.spec(name).dtype.startswith(("float", "bfloat"))):
            continue
        m = p.imap(name)
        if m.partial_cols or m.vector_mode(s.vec) == "scalar":
            continue
        if floats + low.per_thread > MAX_CACHED_FLOATS:
            break
        out.append(name)
        floats += low.per_thread
    return tuple(out)


def load_columns(low: Lowerer, cx: Ctx, lane: kir.Expr, names: tuple[str, ...]) -> list[kir.Stmt]:
    """The loop that loads this thread's piece of each of ``names`` into its column array (``cx``: the
    kernel's variables)."""
    if not names:
        return []
    s = low.s
    it, k = cx.var("ic", I32), cx.var("kc", I32)
    valid = cx.var("vc", kir.BOOL)
    body: list[kir.Stmt] = [Assign(k, mul(add(mul(it, I(s.tpr)), lane), I(s.vec))),
                            Assign(valid, Bin("<", k, low.n_expr()))]
    for name in names:
        tix = low.tid_of[name]
        dsts = tuple(cx.var(f"c{tix}_", F32) for _ in range(s.vec))
        body += [*(Assign(d, kir.Const(0.0)) for d in dsts), kir.LoadVec(dsts, low.in_buf[name], k, valid)]
        body += [kir.SetLocal(column_array(low, name), add(mul(it, I(s.vec)), I(j)), dsts[j]) for j in range(s.vec)]
    return [kir.For(it, I(0), I(low.iters), 1, tuple(body), unroll=True)]
