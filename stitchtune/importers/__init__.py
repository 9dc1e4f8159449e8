"""Importers that turn PyTorch functions and ONNX models into graph.json.

``torch_import`` (PyTorch -> one graph.json), ``onnx_import`` (ONNX -> one graph.json per
memory-intensive subgraph), ``builder`` (the graph builder both use). The ``stitchtune import``
subcommand that drives them is :mod:`stitchtune.cli.importing`.
"""
