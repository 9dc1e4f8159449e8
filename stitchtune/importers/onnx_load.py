"""Reading an ONNX model file that nobody vouches for.

Contract
--------
* :func:`load_model(path_or_ModelProto)` returns a :class:`LoadedModel` (the ``ModelProto``, the
  folder its external data is relative to, and a :class:`ConstTable` of its initializers and
  ``Constant`` values) or raises :class:`~stitchtune.importers.builder.ImportError_` with one line
  naming the problem. Nothing is written; no tensor data is read before every check below passed.
* The file: a regular file of 1 byte .. :data:`MAX_MODEL_FILE_BYTES` (protobuf's own limit), that
  decodes as a ``ModelProto`` with an ir_version, an opset import, a graph of at least one node,
  and is structurally sound: every node input is a graph input, an initializer or the output of an
  earlier node, no tensor is produced twice, every graph output is produced, every node's domain
  is imported. Zip archives (PyTorch checkpoints), JSON, HDF5 and .npy files are named as such.
* Every declared shape (graph inputs, outputs, value_info, initializers, ``Constant`` values, also
  inside subgraphs): no negative dimension, at most :data:`MAX_TENSOR_ELEMENTS` elements (the limit
  graph.json itself enforces). All tensor data the model declares (inline and external) totals at
  most :data:`MAX_MODEL_DATA_BYTES`; inline data must be as long as its dims say.
* External data (``data_location = EXTERNAL``) is accepted only as a relative path inside the
  model's folder: absolute paths, ``..`` components and symbolic links that resolve outside the
  folder are refused without opening anything; the file must exist and hold ``offset + length``
  bytes, ``length`` matching the dims. A ``ModelProto`` passed in memory may not use external data.
* :class:`ConstTable` reads a tensor's data only when someone asks for its value (most weights feed
  MatMuls and are never read); reads past :data:`MAX_LOADED_BYTES` in total are refused.
"""

from __future__ import annotations

import logging
import math
import os
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from stitchtune.importers.builder import ImportError_

__all__ = [
    "MAX_LOADED_BYTES",
    "MAX_MODEL_DATA_BYTES",
    "MAX_MODEL_FILE_BYTES",
    "MAX_TENSOR_ELEMENTS",
    "ConstTable",
    "LoadedModel",
    "load_model",
]

log = logging.getLogger(__name__)

MAX_MODEL_FILE_BYTES = 2**31 - 1        # protobuf cannot decode a larger message
MAX_TENSOR_ELEMENTS = 2**31 - 1         # as graph.json (stitchtune.graph.parse)
MAX_MODEL_DATA_BYTES = 64 * 2**30       # all initializers + constants the model declares
MAX_LOADED_BYTES = 4 * 2**30            # tensor data the importer actually reads into memory

_SNIFF = ((b"PK\x03\x04", "a zip archive (a PyTorch checkpoint or .npz?)"),
          (b"\x89HDF", "an HDF5 file"), (b"\x93NUMPY", "a .npy array"), (b"{", "a JSON document"),
          (b"[", "a JSON document"))
_PACKED4 = {"INT4", "UINT4", "FLOAT4E2M1"}   # two elements per byte


@dataclass(frozen=True)
class LoadedModel:
    model: Any                  # onnx.ModelProto, checked
    base_dir: Path | None       # folder of the model file (external data is relative to it)
    consts: ConstTable


# ---------------------------------------------------------------------------- entry point
def load_model(model: Any) -> LoadedModel:
    """Read and check ``model`` (a path or an ``onnx.ModelProto``); see the module docstring."""
    try:
        import onnx
    except ModuleNotFoundError as e:
        raise ImportError_("the onnx package is not installed (pip install 'stitchtune[import]')") from e
    if isinstance(model, onnx.ModelProto):
        m, base, where = model, None, "the model"
    else:
        path = Path(str(model))
        where = ascii(str(path))
        m = _parse(_read(path, where), where)
        base = path.resolve().parent
    _check_structure(m, where)
    tensors = list(_all_tensors(m.graph))
    _check_declared_shapes(m.graph, where)
    _check_tensor_data(tensors, base, where)
    return LoadedModel(model=m, base_dir=base, consts=ConstTable.from_model(m, base))


def _read(path: Path, where: str) -> bytes:
    try:
        st = path.stat()
    except FileNotFoundError:
        raise ImportError_(f"ONNX model {where} does not exist") from None
    except (OSError, ValueError) as e:
        raise ImportError_(f"cannot read ONNX model {where}: {getattr(e, 'strerror', None) or e}") from None
    if not path.is_file():
        raise ImportError_(f"ONNX model {where} is not a regular file")
    if st.st_size == 0:
        raise ImportError_(f"{where} is empty, not an ONNX model")
    if st.st_size > MAX_MODEL_FILE_BYTES:
        raise ImportError_(f"{where} is {st.st_size} bytes; an ONNX file holds at most "
                           f"{MAX_MODEL_FILE_BYTES} (larger models keep their weights as external data)")
    try:
        with open(path, "rb") as f:
            return f.read(MAX_MODEL_FILE_BYTES + 1)
    except OSError as e:
        raise ImportError_(f"cannot read ONNX model {where}: {e.strerror or e}") from None


def _parse(raw: bytes, where: str) -> Any:
    import onnx

    head = raw[:8].lstrip()
    for magic, what in _SNIFF:
        if head.startswith(magic):
            raise ImportError_(f"{where} is {what}, not an ONNX model")
    m = onnx.ModelProto()
    try:
        m.ParseFromString(raw)
    except Exception as e:  # noqa: BLE001 -- protobuf's DecodeError and friends: all mean "not ONNX"
        raise ImportError_(f"{where} is not an ONNX model, or is truncated "
                           f"(protobuf: {str(e).splitlines()[0] if str(e) else type(e).__name__})") from None
    if m.ir_version <= 0 or not m.HasField("graph"):
        raise ImportError_(f"{where} is not an ONNX model (no ir_version or no graph)")
    if not m.opset_import:
        raise ImportError_(f"{where} has no opset import: truncated or not an ONNX model")
    return m


# ---------------------------------------------------------------------------- structure
def _check_structure(m: Any, where: str) -> None:
    g = m.graph
    if not g.node:
        raise ImportError_(f"{where}: the graph has no nodes")
    domains = {o.domain or "" for o in m.opset_import}
    if "" in domains:
        domains.add("ai.onnx")
    defined: set[str] = {i.name for i in g.input} | {t.name for t in g.initializer}
    for k, n in enumerate(g.node):
        label = f"node {k} ({ascii(n.op_type)})"
        if (n.domain or "") not in domains:
            raise ImportError_(f"{where}: {label} uses domain {ascii(n.domain)}, which the model does not "
                               "import (truncated or malformed)")
        for t in n.input:
            if t and t not in defined:
                raise ImportError_(f"{where}: {label} reads {ascii(t)}, which no graph input, initializer "
                                   "or earlier node defines (malformed or not topologically sorted)")
        for t in n.output:
            if t and t in defined:
                raise ImportError_(f"{where}: {label} writes {ascii(t)}, which is already defined (malformed)")
            defined.add(t)
    for o in g.output:
        if o.name not in defined:
            raise ImportError_(f"{where}: graph output {ascii(o.name)} is never produced (malformed)")


def _all_tensors(g: Any) -> Iterator[Any]:
    """Every TensorProto of graph ``g``: initializers and tensor attributes, subgraphs included."""
    from onnx import AttributeProto as AP

    yield from g.initializer
    for n in g.node:
        for a in n.attribute:
            if a.type == AP.TENSOR:
                yield a.t
            elif a.type == AP.TENSORS:
                yield from a.tensors
            elif a.type == AP.GRAPH:
                yield from _all_tensors(a.g)
            elif a.type == AP.GRAPHS:
                for sub in a.graphs:
                    yield from _all_tensors(sub)


def _all_value_infos(g: Any) -> Iterator[Any]:
    from onnx import AttributeProto as AP

    yield from (*g.input, *g.output, *g.value_info)
    for n in g.node:
        for a in n.attribute:
            for sub in ([a.g] if a.type == AP.GRAPH else list(a.graphs) if a.type == AP.GRAPHS else []):
                yield from _all_value_infos(sub)


def _elements(dims: Any, what: str, where: str) -> int:
    n = 1
    for k, d in enumerate(dims):
        if d < 0:
            raise ImportError_(f"{where}: {what} has negative dimension {d} (dim {k})")
        n *= d
        if n > MAX_TENSOR_ELEMENTS:
            raise ImportError_(f"{where}: {what} has shape {list(dims)}, over {MAX_TENSOR_ELEMENTS} elements "
                               "(the most one tensor may have)")
    return n


def _check_declared_shapes(g: Any, where: str) -> None:
    for vi in _all_value_infos(g):
        if vi.type.HasField("tensor_type") and vi.type.tensor_type.HasField("shape"):
            dims = [d.dim_value for d in vi.type.tensor_type.shape.dim if d.HasField("dim_value")]
            _elements(dims, f"tensor {ascii(vi.name)}", where)


# ---------------------------------------------------------------------------- tensor data
def _nbytes(t: Any, n: int) -> int:
    from onnx import TensorProto, helper

    name = TensorProto.DataType.Name(t.data_type) if t.data_type in TensorProto.DataType.values() else ""
    if name in _PACKED4:
        return (n + 1) // 2
    if name in ("", "UNDEFINED", "STRING"):
        return 0
    return n * np.dtype(helper.tensor_dtype_to_np_dtype(t.data_type)).itemsize


def _external_info(t: Any) -> dict[str, str]:
    return {e.key: e.value for e in t.external_data}


def _check_tensor_data(tensors: list[Any], base: Path | None, where: str) -> None:
    from onnx import TensorProto

    total = 0
    sized: list[tuple[Any, int]] = []
    for t in tensors:
        what = f"tensor {ascii(t.name)}"
        nbytes = _nbytes(t, _elements(t.dims, what, where))
        total += nbytes
        sized.append((t, nbytes))
    if total > MAX_MODEL_DATA_BYTES:
        raise ImportError_(f"{where}: its weights and constants declare {total} bytes "
                           f"({total / 2**30:.1f} GiB); the importer takes models of at most "
                           f"{MAX_MODEL_DATA_BYTES // 2**30} GiB of tensor data")
    for t, nbytes in sized:
        what = f"tensor {ascii(t.name)}"
        if t.data_location == TensorProto.EXTERNAL:
            _check_external(t, nbytes, base, what, where)
        elif t.HasField("raw_data") and nbytes and len(t.raw_data) != nbytes:
            raise ImportError_(f"{where}: {what} holds {len(t.raw_data)} bytes, its dims "
                               f"{list(t.dims)} need {nbytes} (truncated or malformed)")


def _resolve_external(t: Any, base: Path | None, what: str, where: str) -> tuple[Path, int, int | None]:
    """(file, offset, length or None) of external tensor ``t``, checked to lie inside ``base``."""
    info = _external_info(t)
    loc = info.get("location", "")
    if base is None:
        raise ImportError_(f"{what} keeps its data in an external file; pass the model's file path, "
                           "not a ModelProto")
    if not loc or "\0" in loc:
        raise ImportError_(f"{where}: {what} has external data without a usable location")
    parts = loc.replace("\\", "/").split("/")
    if os.path.isabs(loc) or loc.startswith(("/", "\\")) or (len(loc) > 1 and loc[1] == ":"):
        raise ImportError_(f"{where}: {what} points at external data by absolute path {ascii(loc)}; "
                           "only files inside the model's folder are read")
    if ".." in parts:
        raise ImportError_(f"{where}: {what} points at external data {ascii(loc)} outside the model's "
                           "folder ('..'); only files inside it are read")
    root = os.path.realpath(base)
    real = os.path.realpath(os.path.join(root, loc))
    if os.path.commonpath([root, real]) != root:
        raise ImportError_(f"{where}: {what}: external data {ascii(loc)} resolves outside the model's folder "
                           "(a symbolic link); only files inside it are read")
    try:
        offset = int(info.get("offset", "0"))
        length = int(info["length"]) if "length" in info else None
    except ValueError:
        raise ImportError_(f"{where}: {what} has a non-integer external data offset or length") from None
    if offset < 0 or (length is not None and length < 0):
        raise ImportError_(f"{where}: {what} has a negative external data offset or length")
    return Path(real), offset, length


def _check_external(t: Any, nbytes: int, base: Path | None, what: str, where: str) -> None:
    path, offset, length = _resolve_external(t, base, what, where)
    loc = ascii(_external_info(t).get("location", ""))
    try:
        st = path.stat()
    except OSError as e:
        raise ImportError_(f"{where}: {what}: external data file {loc} cannot be opened: "
                           f"{e.strerror or e}") from None
    if not path.is_file():
        raise ImportError_(f"{where}: {what}: external data {loc} is not a regular file")
    have = st.st_size - offset if length is None else length
    if have != nbytes:
        raise ImportError_(f"{where}: {what}: external data is {have} bytes, its dims {list(t.dims)} need "
                           f"{nbytes}")
    if offset + have > st.st_size:
        raise ImportError_(f"{where}: {what}: external data {loc} is {st.st_size} bytes, shorter than "
                           f"offset {offset} + length {have} (truncated)")


class ConstTable(Mapping[str, np.ndarray]):
    """Name -> value of the model's constants, read on first access; see the module docstring."""

    def __init__(self, protos: dict[str, Any], arrays: dict[str, np.ndarray], base: Path | None) -> None:
        self._protos, self._arrays, self._base = dict(protos), dict(arrays), base
        self.loaded_bytes = 0

    @classmethod
    def from_model(cls, m: Any, base: Path | None) -> ConstTable:
        """Top-level initializers and ``Constant`` node outputs (value / value_float(s) / value_int(s))."""
        from onnx import AttributeProto as AP

        protos = {t.name: t for t in m.graph.initializer}
        arrays: dict[str, np.ndarray] = {}
        for n in m.graph.node:
            if n.op_type != "Constant" or n.domain not in ("", "ai.onnx") or not n.output:
                continue
            for a in n.attribute:
                if a.name == "value" and a.type == AP.TENSOR:
                    protos[n.output[0]] = a.t
                elif a.name in ("value_float", "value_int"):
                    arrays[n.output[0]] = np.asarray(a.f if a.name == "value_float" else a.i,
                                                     np.float32 if a.name == "value_float" else np.int64)
                elif a.name in ("value_floats", "value_ints"):
                    arrays[n.output[0]] = np.asarray(list(a.floats) if a.name == "value_floats" else list(a.ints),
                                                     np.float32 if a.name == "value_floats" else np.int64)
        return cls(protos, arrays, base)

    def shape(self, name: str) -> tuple[int, ...]:
        """Shape of constant ``name`` without reading its data."""
        if name in self._arrays:
            return tuple(self._arrays[name].shape)
        return tuple(int(d) for d in self._protos[name].dims)

    def set(self, name: str, value: np.ndarray) -> None:
        """Record a value computed by the importer (a folded constant)."""
        self._arrays[name] = value
        self._protos.pop(name, None)

    def __contains__(self, name: object) -> bool:
        return name in self._arrays or name in self._protos

    def __iter__(self) -> Iterator[str]:
        yield from self._arrays
        yield from (k for k in self._protos if k not in self._arrays)

    def __len__(self) -> int:
        return len(set(self._arrays) | set(self._protos))

    def __getitem__(self, name: str) -> np.ndarray:
        if name in self._arrays:
            return self._arrays[name]
        t = self._protos[name]   # KeyError for unknown names, as a Mapping should
        arr = self._read(t)
        self._arrays[name] = arr
        return arr

    def _read(self, t: Any) -> np.ndarray:
        from onnx import TensorProto, numpy_helper

        n = math.prod(int(d) for d in t.dims)
        nbytes = _nbytes(t, n)
        if self.loaded_bytes + nbytes > MAX_LOADED_BYTES:
            raise ImportError_(f"reading constant {ascii(t.name)} ({nbytes} bytes) would take the importer past "
                               f"{MAX_LOADED_BYTES // 2**30} GiB of tensor data in memory")
        self.loaded_bytes += nbytes
        if t.data_location == TensorProto.EXTERNAL:
            path, offset, length = _resolve_external(t, self._base, f"tensor {ascii(t.name)}", "the model")
            with open(path, "rb") as f:
                f.seek(offset)
                raw = f.read(nbytes if length is None else length)
            if len(raw) != nbytes:
                raise ImportError_(f"external data of tensor {ascii(t.name)} is {len(raw)} bytes, not {nbytes} "
                                   "(the file changed or is truncated)")
            inline = TensorProto()
            inline.CopyFrom(t)
            del inline.external_data[:]
            inline.data_location = TensorProto.DEFAULT
            inline.raw_data = raw
            t = inline
        try:
            return numpy_helper.to_array(t)
        except Exception as e:  # noqa: BLE001 -- onnx raises assorted errors for malformed tensors
            raise ImportError_(f"constant {ascii(t.name)} is malformed: {type(e).__name__}: "
                               f"{str(e).splitlines()[0] if str(e) else ''}") from None
