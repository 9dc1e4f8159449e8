"""kir.walk (every statement) and kir.exprs (every expression of a statement or expression)."""

from stitchtune.ir import kir
from stitchtune.ir.kir import F32, I32, Assign, Bin, Const, For, If, Load, Var


def _i(v: int) -> Const:
    return Const(v, I32)


def test_exprs_yields_each_expression_before_its_operands() -> None:
    i = Var("i", I32)
    ld = Load("x", Bin("+", i, _i(1)))
    e = Bin("*", ld, Const(2.0, F32))
    assert list(kir.exprs(e)) == [e, ld, ld.index, i, _i(1), Const(2.0, F32)]


def test_exprs_of_a_statement_reads_its_own_fields_but_not_nested_statements() -> None:
    i, acc = Var("i", I32), Var("acc", F32)
    inner = Assign(acc, Load("x", i))
    loop = For(i, _i(0), Load("n", _i(0)), 1, (inner,))
    branch = If(Bin("<", i, _i(4)), (inner,), (inner,))
    assert list(kir.exprs(loop)) == [i, _i(0), loop.stop, _i(0)]
    assert list(kir.exprs(branch)) == [branch.cond, i, _i(4)]
    assert list(kir.exprs(inner)) == [acc, inner.expr, i]
    assert [s for s in kir.walk((loop,))] == [loop, inner]
    loads = [e for s in kir.walk((loop, branch)) for e in kir.exprs(s) if isinstance(e, Load)]
    assert [ld.buf for ld in loads] == ["n", "x", "x", "x"]
