"""Importers that turn PyTorch functions and ONNX models into graph.json."""
