"""The ONNX constant folder: each folding rule called the way the folding pass calls it."""

import numpy as np
import pytest

from stitchtune.importers.onnx_fold import evaluate


@pytest.mark.parametrize(("a", "b", "want"), [
    (np.array([7, -7, 6], dtype=np.int64), np.array([2, 2, -4], dtype=np.int64), [3, -3, -1]),  # truncates to 0
    (np.array([1.0, 3.0], dtype=np.float32), np.array([4.0, 2.0], dtype=np.float32), [0.25, 1.5]),
])
def test_div_folds_with_onnx_semantics(a, b, want):
    out = evaluate("Div", {}, [a, b])
    np.testing.assert_array_equal(out, np.array(want, dtype=a.dtype))
    assert out.dtype == a.dtype


def test_mul_and_unsqueeze_fold():
    np.testing.assert_array_equal(evaluate("Mul", {}, [np.array([2, 3]), np.array([4, 5])]), [8, 15])
    assert evaluate("Unsqueeze", {}, [np.zeros((2, 3)), np.array([0])]).shape == (1, 2, 3)
