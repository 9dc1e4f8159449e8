"""The op registries (importers/torch_aten_ops.py, importers/onnx_ops.py): every key has a handler,
the supported-op list is the registry's keys and the same ops as before (and what docs/torch.md and
docs/onnx.md list), an ATen op without a handler is refused with the importer's message as before,
and a key cannot get two handlers."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import pytest

from stitchtune.errors import StitchtuneError
from stitchtune.importers import torch_aten, torch_aten_ops, torch_candidates
from stitchtune.importers.torch_aten_ops import SUPPORTED_OPS, OpHandler, aten_op, handlers

REPO = Path(__file__).resolve().parents[2]

#: the supported ops before the registry (the union of torch_aten's tables at 5003ac1): the registry
#: must map exactly these, no more and no fewer (a change of the op set is a change of behaviour)
BEFORE = frozenset("""
aten.__and__ aten.__or__ aten._adaptive_avg_pool2d aten._log_softmax
aten._native_batch_norm_legit_no_training aten._softmax aten._to_copy aten._to_dtype
aten._unsafe_masked_index_put_accumulate aten._unsafe_view aten.abs aten.adaptive_avg_pool2d
aten.add aten.alias aten.amax aten.amin aten.arange aten.batch_norm aten.bitwise_and
aten.bitwise_not aten.bitwise_or aten.cat aten.clamp aten.clamp_max aten.clamp_min aten.clone
aten.concat aten.contiguous aten.cos aten.detach aten.div aten.dropout aten.embedding aten.eq
aten.erf aten.exp aten.expand aten.expand_as aten.feature_dropout aten.flatten aten.full
aten.gather aten.ge aten.gelu aten.gt aten.hardtanh aten.index aten.index_put aten.layer_norm
aten.le aten.lift_fresh_copy aten.log aten.log_softmax aten.logical_and aten.logical_not
aten.logical_or aten.lt aten.masked_fill aten.max aten.maximum aten.mean aten.min aten.minimum
aten.mul aten.native_batch_norm aten.native_dropout aten.native_layer_norm aten.ne aten.neg
aten.permute aten.pow aten.reciprocal aten.relu aten.reshape aten.rms_norm aten.rsqrt aten.rsub
aten.scalar_tensor aten.scatter aten.select aten.sigmoid aten.silu aten.sin aten.slice
aten.slice_scatter aten.softmax aten.sqrt aten.square aten.squeeze aten.sub aten.sum aten.t
aten.take_along_dim aten.tanh aten.to aten.transpose aten.true_divide aten.type_as aten.unsqueeze
aten.var_mean aten.view aten.view_as aten.where prims.convert_element_type prims.fma prims.iota
stitchtune.rand
""".split())


def test_every_registered_key_has_a_callable_handler():
    reg = handlers()
    assert reg, "the registry is empty"
    for key, h in reg.items():
        assert isinstance(h, OpHandler) and callable(h.fn), key
        assert re.fullmatch(r"(aten|prims|stitchtune)\.\w+", key), key


def test_supported_ops_are_the_registry_and_unchanged():
    assert SUPPORTED_OPS == frozenset(handlers())
    assert SUPPORTED_OPS == BEFORE
    # the importer's other users read the same set (re-exported, not a copy)
    assert torch_aten.SUPPORTED_OPS is SUPPORTED_OPS
    assert torch_candidates.SUPPORTED_OPS is SUPPORTED_OPS


def test_the_documented_list_is_the_registry():
    text = (REPO / "docs" / "torch.md").read_text()
    m = re.search(r"<!-- aten-ops:begin -->\s*```\n(.*?)```\s*<!-- aten-ops:end -->", text, re.S)
    assert m, "docs/torch.md has no aten-ops list"
    assert frozenset(m.group(1).split()) == SUPPORTED_OPS


def test_raw_handlers_are_the_ones_that_read_bools_or_make_values():
    """``raw`` handlers skip the bool refusal and int promotion: only masks, fills, iota, rand, scatter."""
    raw = {k for k, h in handlers().items() if h.raw}
    assert raw == {*torch_aten_ops._MASK_OPS, *torch_aten_ops._FILLS, *torch_aten_ops._IOTA,
                   torch_aten_ops.RAND_KEY, *torch_aten_ops.SCATTER_OPS}


def test_a_key_cannot_get_two_handlers():
    with pytest.raises(ValueError, match="aten.add has two handlers"):
        aten_op("aten.add")(lambda w, node, key, a, x: None)
    assert handlers()["aten.add"].fn.__name__ == "_add_sub"   # the first one stays


def test_an_op_without_a_handler_is_refused_as_before():
    from stitchtune.importers.torch_import import import_torch

    path = REPO / "examples" / "torch_modules.py"
    spec = importlib.util.spec_from_file_location("stitchtune_test_registry_modules", path)
    assert spec is not None and spec.loader is not None
    tm = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tm)
    assert "aten.cumsum" not in SUPPORTED_OPS
    with pytest.raises(StitchtuneError) as ei:
        import_torch(tm.unsupported_cumsum, {"x": ((4, 4), "float32")})
    line = next(i for i, t in enumerate(path.read_text().splitlines(), 1) if "torch.cumsum(x, dim=0)" in t)
    assert ei.value.problems == [
        f"unsupported op aten.cumsum.default at {path}:{line} (return torch.cumsum(x, dim=0) * 2.0)"]


# ---------------------------------------------------------------------------- the ONNX registry
#: the ONNX ops a subgraph mapped before the registry (onnx_rules' tables at 5003ac1)
ONNX_BEFORE = frozenset("""
Abs Add And Cast Clip Div Equal Erf Exp FastGelu Gelu Greater GreaterOrEqual Identity LayerNormalization Less
LessOrEqual Log LogSoftmax Max Min Mul Neg Not Or Pow RMSNormalization Reciprocal ReduceMax ReduceMean ReduceMin
ReduceSum Relu Sigmoid SimplifiedLayerNormalization Softmax Sqrt Sub Tanh Where
""".split())


def test_onnx_supported_ops_are_the_registry_and_unchanged():
    from stitchtune.importers import onnx_import, onnx_ops, onnx_rules
    from stitchtune.importers.onnx_ops_layout import layout_op

    reg = onnx_ops.handlers()
    assert all(callable(fn) for fn in reg.values())
    assert onnx_ops.SUPPORTED_OPS == frozenset(reg) == ONNX_BEFORE
    assert onnx_rules.SUPPORTED_OPS is onnx_ops.SUPPORTED_OPS is onnx_import.SUPPORTED_OPS
    # _map_node maps layout and no-op shape ops itself, before no handler: none of them is registered
    assert not [op for op in reg if layout_op(op) is not None or op in onnx_rules._NOOP_SHAPE_OPS
                or op in ("Split", "Pad")]


def test_onnx_documented_ops_are_the_registry():
    """docs/onnx.md's "What maps": the element-wise and reduction bullets name exactly the registry's ops
    (and ``Pad`` of zeros, which _map_node maps to nothing)."""
    from stitchtune.importers.onnx_ops import SUPPORTED_OPS as ONNX_OPS

    text = (REPO / "docs" / "onnx.md").read_text()
    part = text[text.index("- Element-wise ops:"):text.index("- Layout ops onto")]
    named = {w for span in re.findall(r"`([^`]+)`", part) for w in span.split() if re.fullmatch(r"[A-Z]\w+", w)}
    assert named - {"Pad"} == ONNX_OPS


def test_an_onnx_op_cannot_get_two_handlers():
    from stitchtune.importers.onnx_ops import handlers, onnx_op

    with pytest.raises(ValueError, match="Add has two handlers"):
        onnx_op("Add")(lambda *args: [])
    assert handlers()["Add"].__name__ == "_binary"
