"""save_npz: every tensor becomes one member, whatever its name, and np.load reads it back."""

import numpy as np
import pytest

from stitchtune.graph.npz import save_npz
from stitchtune.graph.reference import numpy_dtype


@pytest.mark.parametrize("name", ["x", "file", "allow_pickle", "args"])
def test_round_trip_names_numpy_savez_would_take_as_its_own_arguments(tmp_path, name):
    arrays = {name: np.arange(6, dtype=np.float32).reshape(2, 3), "y": np.array([1, 2], dtype=np.int64)}
    path = tmp_path / "out.npz"
    save_npz(path, arrays)
    with np.load(path, allow_pickle=False) as z:
        assert sorted(z.files) == sorted(arrays)
        for k, a in arrays.items():
            np.testing.assert_array_equal(z[k], a)
            assert z[k].dtype == a.dtype


def test_written_exactly_at_the_path_given(tmp_path):
    path = tmp_path / "params"  # no .npz suffix: np.savez would have written params.npz
    save_npz(path, {"w": np.ones(3, dtype=np.float16)})
    assert path.exists() and not (tmp_path / "params.npz").exists()


def test_bfloat16_comes_back_as_two_byte_void(tmp_path):
    a = np.array([1.5, -2.0], dtype=numpy_dtype("bfloat16"))
    save_npz(tmp_path / "b.npz", {"b": a})
    with np.load(tmp_path / "b.npz", allow_pickle=False) as z:
        back = z["b"]
    assert back.dtype.kind == "V" and back.dtype.itemsize == 2
    np.testing.assert_array_equal(back.view(numpy_dtype("bfloat16")), a)
