"""Benchmarks: peers (PyTorch eager, torch.compile, JAX) built from the same graph, timing, floors and tables."""
