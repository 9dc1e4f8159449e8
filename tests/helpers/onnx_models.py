"""ONNX models from a test: ``onnx_vi``, ``onnx_model``, ``onnx_values`` (onnx's reference evaluator) and
``check_onnx_numerics`` (an import's subgraphs against it)."""

from __future__ import annotations

from typing import Any

import numpy as np


# ---------------------------------------------------------------------------- ONNX importer

def onnx_vi(name: str, shape: Any, elem: int | None = None) -> Any:
    """An ONNX value info (``elem``: a TensorProto element type, default FLOAT)."""
    from onnx import TensorProto, helper

    return helper.make_tensor_value_info(name, TensorProto.FLOAT if elem is None else elem, shape)


def onnx_model(nodes: list[Any], inputs: list[Any], outputs: list[Any], inits: Any = (), opset: int = 17) -> Any:
    """A checked ONNX model of one graph ``g`` from hand-built nodes (opset ``opset``)."""
    import onnx
    from onnx import helper

    m = helper.make_model(helper.make_graph(nodes, "g", inputs, outputs, list(inits)),
                          opset_imports=[helper.make_opsetid("", opset)])
    onnx.checker.check_model(m)
    return m


def onnx_values(model: Any, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Every tensor of ONNX ``model`` evaluated by onnxruntime (onnx's reference evaluator where
    onnxruntime is not installed or has no kernel for a node)."""
    from onnx import ModelProto
    from onnx import helper as onnx_helper

    m = ModelProto()
    m.CopyFrom(model)
    names = [t for n in m.graph.node for t in n.output if t]
    del m.graph.output[:]
    m.graph.output.extend(onnx_helper.make_empty_tensor_value_info(t) for t in names)
    try:
        import onnxruntime as ort

        opts = ort.SessionOptions()
        opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL   # every tensor kept
        opts.log_severity_level = 3
        session = ort.InferenceSession(m.SerializeToString(), opts, providers=["CPUExecutionProvider"])
        return dict(zip(names, session.run(names, feeds)))
    except ImportError:
        pass
    except Exception as exc:  # noqa: BLE001 - e.g. NOT_IMPLEMENTED for a bfloat16 kernel: the reference evaluator
        import logging

        logging.getLogger(__name__).info("onnxruntime cannot run the model (%s); onnx's reference evaluator", exc)
    from onnx.reference import ReferenceEvaluator

    return dict(zip(names, ReferenceEvaluator(m).run(None, feeds)))


def check_onnx_numerics(result: Any, model: Any, feeds: dict[str, np.ndarray], tol: float = 1e-5) -> int:
    """Each subgraph of an ``OnnxImport``, fed the ONNX-evaluated values of its inputs (its constants
    from the import), reproduces its ONNX outputs within ``tol`` (relative to the largest value),
    each input and output in exactly the shape of the ONNX tensor the subgraph names (so a user
    substitutes subgraphs mechanically). Returns the number of outputs compared."""
    from stitchtune.graph.reference import run_reference

    values = {**onnx_values(model, feeds), **feeds}
    compared = 0
    for sg in result.subgraphs:
        onnx_name = dict(sg.tensor_names)
        consts = dict(sg.constants)
        inputs = {n: (consts[n] if n in consts else values[onnx_name[n]]) for n, _ in sg.graph.inputs}
        for n, spec in sg.graph.inputs:
            assert tuple(inputs[n].shape) == spec.shape, (sg.graph.name, n, inputs[n].shape, spec.shape)
        got = run_reference(sg.graph, inputs)
        for o in sg.graph.outputs:
            if values[onnx_name[o]].dtype == np.bool_:   # a mask: bools, bit for bit
                assert got[o].dtype == np.bool_ and np.array_equal(got[o], values[onnx_name[o]]), (sg.graph.name, o)
            want = values[onnx_name[o]].astype(np.float64)
            mine = got[o].astype(np.float64)
            assert mine.shape == want.shape, (sg.graph.name, o, onnx_name[o], mine.shape, want.shape)
            err = np.max(np.abs(mine - want)) / max(np.max(np.abs(want)), 1e-30)
            assert err < tol, (sg.graph.name, o, err)
            compared += 1
    return compared
