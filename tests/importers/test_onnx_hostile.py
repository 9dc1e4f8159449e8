"""Hostile ONNX files: each is refused with exactly one ``stitchtune: error:`` line, exit code 2,
no traceback, and nothing written; external data outside the model's folder is never opened."""

from __future__ import annotations

import builtins
import os
from pathlib import Path

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
from onnx import TensorProto as TP
from onnx import helper as h
from onnx import numpy_helper as nh

from stitchtune.cli import main
from stitchtune.importers.onnx_load import MAX_MODEL_DATA_BYTES, MAX_TENSOR_ELEMENTS


def _small_model(x_shape=(4, 8)) -> onnx.ModelProto:
    g = h.make_graph([h.make_node("Mul", ["x", "w"], ["m"]), h.make_node("Relu", ["m"], ["y"])], "small",
                     [h.make_tensor_value_info("x", TP.FLOAT, list(x_shape))],
                     [h.make_tensor_value_info("y", TP.FLOAT, list(x_shape))],
                     [nh.from_array(np.linspace(-1, 1, 8, dtype=np.float32), "w")])
    return h.make_model(g, opset_imports=[h.make_opsetid("", 17)])


def _external(model: onnx.ModelProto, location: str, nbytes: int = 32, offset: int = 0) -> onnx.ModelProto:
    """``model`` with initializer ``w`` moved to external data at ``location``."""
    w = model.graph.initializer[0]
    w.ClearField("raw_data")
    w.ClearField("float_data")
    w.data_location = TP.EXTERNAL
    del w.external_data[:]
    for k, v in (("location", location), ("offset", str(offset)), ("length", str(nbytes))):
        w.external_data.add(key=k, value=v)
    return model


def _refused(tmp_path: Path, path: Path, capsys, *words: str) -> str:
    out = tmp_path / "out"
    rc = main(["import", "onnx", str(path), "-o", str(out)])
    cap = capsys.readouterr()
    lines = cap.err.strip().splitlines()
    assert rc == 2, cap
    assert len(lines) == 1 and lines[0].startswith("stitchtune: error: "), lines
    assert "Traceback" not in cap.err and not cap.out
    assert not out.exists(), "nothing may be written on failure"
    for w in words:
        assert w in lines[0], (w, lines[0])
    return lines[0]


def test_a_valid_model_and_valid_external_data_import(tmp_path, capsys):
    """The control: the same model inline and with its weight in a file beside it imports."""
    for name, m in (("inline", _small_model()), ("ext", _external(_small_model(), "weights.bin"))):
        (tmp_path / "weights.bin").write_bytes(np.linspace(-1, 1, 8, dtype=np.float32).tobytes())
        onnx.save(m, str(tmp_path / f"{name}.onnx"))
        assert main(["import", "onnx", str(tmp_path / f"{name}.onnx"), "-o", str(tmp_path / name)]) == 0
        consts = np.load(next((tmp_path / name).glob("*.constants.npz")))
        np.testing.assert_array_equal(consts["w"], np.linspace(-1, 1, 8, dtype=np.float32))
    capsys.readouterr()


@pytest.mark.parametrize("frac", [0.05, 0.2, 0.4, 0.6, 0.8, 0.95, 0.99])
def test_truncated_model(tmp_path, capsys, frac):
    raw = _small_model().SerializeToString()
    path = tmp_path / "cut.onnx"
    path.write_bytes(raw[: int(len(raw) * frac)])
    _refused(tmp_path, path, capsys, "cut.onnx")


@pytest.mark.parametrize("content, words", [
    (b"", ("empty",)),
    (b"PK\x03\x04" + bytes(60), ("zip archive",)),
    (b'{"name": "g", "inputs": {}}', ("JSON",)),
    (b"\x93NUMPY\x01\x00", (".npy",)),
    (b"hello, this is plain text\n" * 20, ("not an ONNX model",)),
    (bytes(range(256)) * 8, ("not an ONNX model",)),
])
def test_not_onnx_at_all(tmp_path, capsys, content, words):
    path = tmp_path / "model.onnx"
    path.write_bytes(content)
    _refused(tmp_path, path, capsys, *words)


def test_a_directory_and_a_missing_file(tmp_path, capsys):
    (tmp_path / "dir.onnx").mkdir()
    _refused(tmp_path, tmp_path / "dir.onnx", capsys, "not a regular file")
    _refused(tmp_path, tmp_path / "missing.onnx", capsys, "does not exist")


def test_malformed_graphs(tmp_path, capsys):
    m = _small_model()
    m.graph.node[1].input[0] = "nowhere"
    onnx.save(m, str(tmp_path / "undef.onnx"))
    _refused(tmp_path, tmp_path / "undef.onnx", capsys, "'nowhere'", "no graph input")
    m = _small_model()
    m.graph.node[1].output[0] = "m"
    onnx.save(m, str(tmp_path / "twice.onnx"))
    _refused(tmp_path, tmp_path / "twice.onnx", capsys, "already defined")
    m = _small_model()
    m.graph.initializer[0].raw_data = b"\0" * 5
    del m.graph.initializer[0].float_data[:]
    onnx.save(m, str(tmp_path / "short.onnx"))
    _refused(tmp_path, tmp_path / "short.onnx", capsys, "holds 5 bytes", "need 32")
    m = _small_model()
    m.graph.node[0].domain = "com.example"
    onnx.save(m, str(tmp_path / "domain.onnx"))
    _refused(tmp_path, tmp_path / "domain.onnx", capsys, "'com.example'")


@pytest.mark.parametrize("shape, words", [
    ((2**20, 2**20), (str(MAX_TENSOR_ELEMENTS), "'x'")),      # 2**40 elements
    ((4, -8), ("negative dimension -8", "'x'")),
])
def test_absurd_input_dims(tmp_path, capsys, shape, words):
    onnx.save(_small_model(shape), str(tmp_path / "dims.onnx"))
    _refused(tmp_path, tmp_path / "dims.onnx", capsys, *words)


def test_absurd_initializer_dims(tmp_path, capsys):
    m = _small_model()
    w = m.graph.initializer[0]
    del w.dims[:]
    w.dims.extend([2**21, 2**21])   # 2**42 elements, 32 bytes of data
    onnx.save(m, str(tmp_path / "init.onnx"))
    _refused(tmp_path, tmp_path / "init.onnx", capsys, "'w'", str(MAX_TENSOR_ELEMENTS))


def test_tensors_that_would_not_fit_in_memory(tmp_path, capsys):
    """40 external weights of 2**30 float32 each (160 GiB): refused by the stated limit, before
    any data file is looked for."""
    m = _small_model()
    for k in range(40):
        t = m.graph.initializer.add(name=f"big{k}", data_type=TP.FLOAT, dims=[2**30])
        t.data_location = TP.EXTERNAL
        for key, v in (("location", f"big{k}.bin"), ("offset", "0"), ("length", str(4 * 2**30))):
            t.external_data.add(key=key, value=v)
    onnx.save(m, str(tmp_path / "huge.onnx"))
    line = _refused(tmp_path, tmp_path / "huge.onnx", capsys, f"{MAX_MODEL_DATA_BYTES // 2**30} GiB")
    assert str(40 * 4 * 2**30 + 32) in line   # + w itself


@pytest.fixture
def opened(monkeypatch):
    """Every path the code under test opens with ``open``."""
    seen: list[str] = []
    real = builtins.open

    def spy(file, *a, **kw):
        seen.append(os.path.realpath(file) if isinstance(file, (str, os.PathLike)) else str(file))
        return real(file, *a, **kw)

    monkeypatch.setattr(builtins, "open", spy)
    return seen


def _outside_file(tmp_path: Path) -> Path:
    secret = tmp_path / "outside" / "secret.bin"
    secret.parent.mkdir()
    secret.write_bytes(b"\x01" * 32)
    return secret


def test_external_data_by_absolute_path_is_never_read(tmp_path, capsys, opened):
    secret = _outside_file(tmp_path)
    (tmp_path / "model").mkdir()
    path = tmp_path / "model" / "abs.onnx"
    onnx.save(_external(_small_model(), str(secret)), str(path))
    _refused(tmp_path, path, capsys, "absolute path")
    assert str(secret.resolve()) not in opened


def test_external_data_escaping_with_dotdot_is_never_read(tmp_path, capsys, opened):
    secret = _outside_file(tmp_path)
    (tmp_path / "model" / "sub").mkdir(parents=True)
    path = tmp_path / "model" / "dots.onnx"
    onnx.save(_external(_small_model(), "sub/../../outside/secret.bin"), str(path))
    _refused(tmp_path, path, capsys, "'..'")
    assert str(secret.resolve()) not in opened


def test_external_data_through_a_symlink_out_is_never_read(tmp_path, capsys, opened):
    secret = _outside_file(tmp_path)
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "weights.bin").symlink_to(secret)
    (tmp_path / "model" / "linkdir").symlink_to(secret.parent, target_is_directory=True)
    for loc in ("weights.bin", "linkdir/secret.bin"):
        path = tmp_path / "model" / "link.onnx"
        onnx.save(_external(_small_model(), loc), str(path))
        _refused(tmp_path, path, capsys, "symbolic link")
    assert str(secret.resolve()) not in opened


def test_external_data_missing_or_short(tmp_path, capsys):
    onnx.save(_external(_small_model(), "nothere.bin"), str(tmp_path / "missing.onnx"))
    _refused(tmp_path, tmp_path / "missing.onnx", capsys, "'nothere.bin'", "cannot be opened")
    (tmp_path / "short.bin").write_bytes(b"\0" * 16)
    onnx.save(_external(_small_model(), "short.bin"), str(tmp_path / "short.onnx"))
    _refused(tmp_path, tmp_path / "short.onnx", capsys, "truncated")
    onnx.save(_external(_small_model(), "short.bin", nbytes=16), str(tmp_path / "len.onnx"))
    _refused(tmp_path, tmp_path / "len.onnx", capsys, "16 bytes", "need 32")


def test_shape_computation_bomb_stays_small(tmp_path):
    """A 1-element constant of 2**46 feeding ConstantOfShape -> Mul -> Shape: onnx's own data
    propagation would materialise 2**46 dims (gigabytes, then bad_alloc). The import runs in a
    process capped at 3 GiB of address space and finishes; the ConstantOfShape is left unfolded."""
    import json
    import resource
    import subprocess
    import sys

    from helpers.common import REPO

    nodes = [h.make_node("Constant", [], ["n"], value=nh.from_array(np.array([2**46], np.int64))),
             h.make_node("ConstantOfShape", ["n"], ["ones"], value=nh.from_array(np.array([1], np.int64))),
             h.make_node("Mul", ["ones", "minus1"], ["m1"]),
             h.make_node("Shape", ["m1"], ["s"]),
             h.make_node("Relu", ["x"], ["y"])]
    g = h.make_graph(nodes, "bomb", [h.make_tensor_value_info("x", TP.FLOAT, [4, 8])],
                     [h.make_tensor_value_info("y", TP.FLOAT, [4, 8]), h.make_tensor_value_info("s", TP.INT64, [1])],
                     [nh.from_array(np.array(-1, np.int64), "minus1")])
    onnx.save(h.make_model(g, opset_imports=[h.make_opsetid("", 17)]), str(tmp_path / "bomb.onnx"))

    def cap() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (3 * 2**30, 3 * 2**30))

    env = {**os.environ, "PYTHONPATH": str(REPO)}
    p = subprocess.run([sys.executable, "-m", "stitchtune.cli", "import", "onnx", str(tmp_path / "bomb.onnx"),
                        "-o", str(tmp_path / "out")], preexec_fn=cap, env=env, capture_output=True, text=True,
                       timeout=120)
    assert p.returncode == 0, p.stderr
    manifest = json.loads((tmp_path / "out" / "manifest.json").read_text())
    assert [u.split(":")[1] for u in manifest["not_folded"]] == ["ConstantOfShape"]
    assert len(manifest["subgraphs"]) == 1
