"""The in-place cache write kernel (``stitchtune.lower.put``, issue 41 item 2): ``values`` rows stored
into a table from a runtime start, nothing else of the table touched; emulated (every access checked
against its buffer), a start outside the table writes nothing, and the source builds for sm_90."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from helpers.lowering import DEV
from helpers.nvcc import compile_programs_sm90
from stitchtune.emulate.emulator import emulate_kernel
from stitchtune.emulate.memory import elem_dtype
from stitchtune.lower.put import PutShape, put_program, put_width

SHAPES = [PutShape(2, 20, 7, 16, "float32"),     # a prompt: 7 positions of a [1, 2, 20, 16] cache
          PutShape(2, 20, 1, 16, "float32"),     # a decode step: one position
          PutShape(3, 5, 2, 6, "float16"),       # a row of 6 (3 halves wide accesses do not fit: 2)
          PutShape(4, 9, 9, 8, "bfloat16"),      # the whole table
          PutShape(1, 33, 3, 1, "float32")]      # rows of one element


def _write(sh: PutShape, start: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(table before, table after the kernel, values)."""
    prog = put_program(sh, DEV)
    dt = elem_dtype(sh.dtype)
    table = (np.arange(sh.table_size) % 251).astype(np.float32).astype(dt)
    before = table.copy()
    vals = (-1.0 - np.arange(sh.values_size) % 97).astype(np.float32).astype(dt)
    emulate_kernel(prog.kernels[0], prog.launches[0].grid,
                   {"table": table, "vals": vals, "start": np.array([start], np.int64)})
    return before, table, vals


@pytest.mark.parametrize("sh", SHAPES, ids=lambda s: f"{s.outer}x{s.rows}x{s.row_size}-{s.count}-{s.dtype}")
def test_the_rows_from_start_are_written_and_nothing_else(sh: PutShape) -> None:
    for start in sorted({0, 1, sh.rows - sh.count}):
        if start < 0 or start > sh.rows - sh.count:
            continue
        before, after, vals = _write(sh, start)
        want = before.reshape(sh.outer, sh.rows, sh.row_size).copy()
        want[:, start:start + sh.count] = vals.reshape(sh.outer, sh.count, sh.row_size)
        assert np.array_equal(after, want.ravel()), (sh, start)


@pytest.mark.parametrize("start", [-1, 15, 14 + 7, 2**31 + 3, -(2**40)])
def test_a_start_outside_the_table_writes_nothing(start: int) -> None:
    sh = PutShape(2, 20, 7, 16, "float32")   # the last start that fits is 13
    before, after, _ = _write(sh, start)
    assert np.array_equal(before, after)


@pytest.mark.parametrize("index_dtype", ["int64", "int32"])
def test_rows_from_a_position_tensor_are_written_and_positions_outside_write_nothing(index_dtype: str) -> None:
    sh = PutShape(2, 20, 6, 16, "float32", positions=True, index_dtype=index_dtype)
    prog = put_program(sh, DEV)
    pos = np.array([7, 0, 19, -1, 20, 3], index_dtype)   # -1 and 20: outside the table, written nowhere
    table = np.arange(sh.table_size).astype(np.float32)
    before = table.copy()
    vals = -1.0 - np.arange(sh.values_size).astype(np.float32)
    emulate_kernel(prog.kernels[0], prog.launches[0].grid, {"table": table, "vals": vals, "start": pos})
    want = before.reshape(2, 20, 16).copy()
    v = vals.reshape(2, 6, 16)
    for j, p in enumerate(pos):
        if 0 <= p < 20:
            want[:, p] = v[:, j]
    assert np.array_equal(table, want.ravel())


def test_accesses_are_as_wide_as_the_row_allows() -> None:
    assert put_width(PutShape(2, 20, 7, 16, "float32")) == 4
    assert put_width(PutShape(2, 20, 7, 16, "bfloat16")) == 8
    assert put_width(PutShape(2, 20, 7, 6, "float16")) == 2
    assert put_width(PutShape(2, 20, 7, 3, "float32")) == 1


def test_the_grid_covers_the_values_once_and_stays_within_the_device() -> None:
    small = put_program(PutShape(2, 20, 1, 16, "float32"), DEV)
    big = put_program(PutShape(64, 4096, 4096, 128, "bfloat16"), DEV)
    assert small.launches[0].grid == 1
    assert big.launches[0].grid <= DEV.sm_count * 8
    assert big.profile.kernels[0].dram_write_bytes == 64 * 4096 * 128 * 2


def test_bad_shapes_are_refused() -> None:
    with pytest.raises(ValueError, match="int8"):
        PutShape(1, 4, 1, 4, "int8")
    with pytest.raises(ValueError, match="bad cache write"):
        PutShape(1, 4, 5, 4, "float32")
    with pytest.raises(ValueError, match="int32 indexing"):
        PutShape(1 << 16, 1 << 12, 1, 1 << 4, "float32")


def test_the_kernels_compile_with_nvcc(tmp_path: Path) -> None:
    shapes = SHAPES + [PutShape(2, 20, 6, 16, "bfloat16", positions=True, index_dtype="int32")]
    compile_programs_sm90([put_program(sh, DEV) for sh in shapes], tmp_path)
