"""Gathers and picks by a row's index (row family): the round's index of a ``gather`` / pick node
(:func:`gather_index`), the value of a pick (:func:`pick_value`) and the error flags of a program's
gathers (:func:`gather_flag_buffers`). A ``gather``'s table elements are loaded by the sweep's remaps
(:mod:`stitchtune.lower.remap`).

A pick (``gather_elements`` along the view's column axis, :func:`pick_value`) is a per-row value: the
row kernel computes it with the per-row nodes once the per-row values its source reads are known,
from one predicated scalar load per input at column ``idx[row]`` (read once per round by
:func:`gather_index`, with the node's error flag as for ``gather``), 0.0 for an out-of-range index.

An out-of-range index raises the node's error flag: buffer ``gerr<k>``, a zero-initialised float32
scratch whose ``tensor`` is the node's id, to which the row's first lane adds 1.
"""

from __future__ import annotations

from stitchtune.graph.parse import Node
from stitchtune.ir import kir
from stitchtune.ir.kir import F32, I32, Assign, Bin, BufferRole, Const, Load, Select
from stitchtune.lower.base import I, Lowerer, add
from stitchtune.lower.builder import RowKernelBuilder
from stitchtune.lower.index_chain import node_axis
from stitchtune.plan.chains import domain_of
from stitchtune.plan.pick import pick_leaves
from stitchtune.plan.planner import TensorClass

__all__ = ["gather_flag_buffers", "gather_index", "pick_value"]


def gather_flag_buffers(program: kir.Program) -> dict[str, str]:
    """Error-flag buffer name -> gather node id of a lowered program (empty without gathers)."""
    return {b.name: b.tensor for b in program.buffers if b.role == BufferRole.SCRATCH and b.name.startswith("gerr")}


def gather_index(k: RowKernelBuilder, nd: Node, bound: int) -> kir.Var:
    """The round's index of gather / pick ``nd`` for the task's row (once per kernel round): its index
    input read by :class:`~stitchtune.ir.kir.IndexLoad` (``-1`` outside ``[0, bound)``), and the
    node's error flag raised by the row's first lane for an out-of-range index."""
    return k.gather_row(nd.id, lambda: _read_index(k, nd, bound))


def _read_index(k: RowKernelBuilder, nd: Node, bound: int) -> kir.Var:
    """:func:`gather_index`'s variable, its statements emitted (the first time a round asks for it)."""
    low = k.low
    idx = str(nd.args[1])
    gi = k.var("gi", I32)
    if idx in low.nodes:  # a per-row int register the region computed (plan.pick.check_pick_indices)
        v, st = k.value_of(idx), low.vtype(idx)
        assert v is not None, f"index '{idx}' of '{nd.id}' not computed yet"
        ok = Bin("&&", k.ix.rvalid, Bin("&&", Bin(">=", v, Const(0, st)), Bin("<", v, Const(bound, st))))
        k.emit(Assign(gi, Select(ok, v if st == I32 else kir.Cast(v, I32), I(-1))))
    else:
        ibuf = low.in_buf[idx]
        k.use_input(ibuf)
        r = Bin("min", k.ix.row, low.m_last())
        at = low.row_base(idx, r) if low.p.mapped(idx) else r
        k.emit(Assign(gi, kir.IndexLoad(ibuf, at, bound, k.ix.rvalid)))
    flag = _flag_buffer(low, nd.id)
    k.use_scratch(flag)
    first = Bin("&&", Bin("==", k.ix.lane, I(0)), Bin("==", k.ix.sidx, I(0)))
    k.emit(kir.AtomicAdd(flag, I(0), Const(1.0, F32),
                              Bin("&&", Bin("&&", k.ix.rvalid, first), Bin("<", gi, I(0)))))
    return gi


def pick_value(k: RowKernelBuilder, nd: Node) -> kir.Expr | None:
    """The value of pick ``nd`` (``gather_elements`` along the view's column axis,
    :func:`stitchtune.plan.pick.check_picks`) for the round's row: its source expression evaluated at
    column ``idx[row]``, the per-row values it reads taken as they are (None while one of them is not
    computed yet: call again after the next stage), each input varying along the columns loaded at
    its own address of element ``(row, idx[row])``: one scalar load, predicated on an in-range index
    (never outside the tensor: the column is ``max(idx, 0) < N``); 0.0 for an out-of-range index, as
    the reference gives, with the node's error flag raised."""
    low = k.low
    const, loaded = pick_leaves(low.g, nd, domain_of(low.g))
    if str(nd.args[1]) in low.nodes and k.value_of(str(nd.args[1])) is None:  # a computed index, not yet known
        return None
    for name in const:
        if k.value_of(name) is None and name not in low.in_buf:
            return None
    for name in const:
        if k.value_of(name) is None:
            k.load_p(name)
    gi = gather_index(k, nd, low.g.spec(str(nd.args[0])).shape[node_axis(nd)])
    ok = Bin(">=", gi, I(0))
    col = Bin("max", gi, I(0))
    r = Bin("min", k.ix.row, I(low.p.M - 1))
    vals: dict[str, kir.Expr] = {}
    for n in const:
        v = k.value_of(n)
        assert v is not None, f"'{n}' loaded above"
        vals[n] = v
    for name in loaded:
        buf = low.in_buf[name]
        k.use_input(buf)
        addr = low.col_offset(name, col)
        if low.cls[name] is TensorClass.FULL:
            addr = add(low.row_base(name, r), addr)
        v = k.var("pk", F32)
        k.emit(Assign(v, Load(buf, addr, Bin("&&", k.ix.rvalid, ok))))
        vals[name] = v

    def at(name: str) -> kir.Expr:
        if name in vals:
            return vals[name]
        m = low.nodes[name]
        args: list[kir.Expr] = [at(a) if isinstance(a, str) else Const(float(a), F32) for a in m.args]
        v = k.var("pk", F32)
        k.emit(Assign(v, low.expr_of_node(m, args)))
        vals[name] = v
        return v

    out = k.var("pk", F32)
    k.emit(Assign(out, Select(ok, at(str(nd.args[0])), Const(0.0, F32))))
    return out


def _flag_buffer(low: Lowerer, node_id: str) -> str:
    """The error-flag scratch of gather ``node_id`` (one float32, zeroed before the launch)."""
    for b in low.buffers:
        if b.role == BufferRole.SCRATCH and b.name.startswith("gerr") and b.tensor == node_id:
            return b.name
    name = f"gerr{sum(1 for b in low.buffers if b.name.startswith('gerr'))}"
    low.buffers.append(kir.BufferSpec(name, "float32", 1, BufferRole.SCRATCH, node_id, zero_init=True))
    return name
