"""The heuristic's rule 9 (``cost.heuristic.with_row_vectors``): row vectors (option ``row_vectors``) where they
are legal and the bytes-weighted sector factors of all full-size tensors (``lower.row_vectors.row_vector_sectors``,
the profile's factors) are lower with them: BERT's training ``view_59`` takes them (its transposed input 2.00x ->
1.00x); a second strided input read one row per access at rows 4 apart can lose more than the first gains
(a case of the row-vector tests: x 2.00x -> 1.00x, y 1.00x -> 4.00x), and then the rule leaves them off."""

from __future__ import annotations

import dataclasses

from helpers.graphs import head_merge_colsum
from helpers.lowering import DEV
from stitchtune.cost.heuristic import heuristic_schedule, with_row_vectors
from stitchtune.lower.row_vectors import row_vector_sectors
from stitchtune.plan.planner import make_plan
from stitchtune.space import ROW_VECTORS, SearchSpace


def test_bert_view_59_takes_row_vectors() -> None:
    plan = make_plan(head_merge_colsum(8, 12, 64, 512))
    s = heuristic_schedule(plan, DEV)
    assert s.option(ROW_VECTORS) and '"row_vectors":1' in s.to_json()
    # x 2.00x -> 1.00x, its stored product 1.00x either way (a plain tensor), 4 bytes each
    assert row_vector_sectors(plan, s) == (12.0, 8.0)


def test_a_second_strided_input_that_loses_more_keeps_the_row_by_row_sweep() -> None:
    plan = make_plan(head_merge_colsum(1, 8, 2, 16, second=True))
    space = SearchSpace.for_plan(plan, DEV)
    s = dataclasses.replace(heuristic_schedule(plan, DEV, space), tpr=4, split=1, block=32, vec=2, row_vectors=False)
    on = dataclasses.replace(s, row_vectors=True)
    assert not space.violations(on)   # legal, but x 2 -> 1 and y 1 -> 4 (plus the plain product, 1 either way)
    assert row_vector_sectors(plan, on) == (16.0, 24.0)
    assert with_row_vectors(space, plan, s) == s


def test_a_tie_or_an_illegal_point_keeps_the_row_by_row_sweep() -> None:
    plan = make_plan(head_merge_colsum(2, 4, 16, 60))   # 120 rows: no whole groups of 4 per thread at split 2
    space = SearchSpace.for_plan(plan, DEV)
    s = dataclasses.replace(heuristic_schedule(plan, DEV, space), tpr=8, split=2, block=64, vec=4)
    assert not s.option(ROW_VECTORS) and with_row_vectors(space, plan, s) == s
    plain = make_plan(head_merge_colsum(2, 2, 4, 32, second=True))   # x 2 -> 1, y 1 -> 2: a tie
    sp = SearchSpace.for_plan(plain, DEV)
    t = dataclasses.replace(heuristic_schedule(plain, DEV, sp), tpr=4, split=2, block=32, vec=1, row_vectors=False)
    assert not sp.violations(dataclasses.replace(t, row_vectors=True))
    assert row_vector_sectors(plain, dataclasses.replace(t, row_vectors=True)) == (16.0, 16.0)
    assert with_row_vectors(sp, plain, t) == t


def test_the_sector_factors_are_weighted_by_each_tensors_element_bytes() -> None:
    # the second strided input as int32 (cast after the merge) weighs what it does as float32: 4 bytes, x 2 -> 1,
    # y 1 -> 4 (it was weighed as 2 bytes, any dtype but float32: a tie, 16 / 16); as float16, 2 bytes
    def sectors(dtype: str) -> tuple[float, float]:
        plan = make_plan(head_merge_colsum(1, 8, 2, 16, second=True, second_dtype=dtype))
        s = dataclasses.replace(heuristic_schedule(plan, DEV), tpr=4, split=1, block=32, vec=2, row_vectors=True)
        return row_vector_sectors(plan, s)

    assert sectors("int32") == sectors("float32") == (16.0, 24.0)
    assert sectors("float16") != sectors("int32")
