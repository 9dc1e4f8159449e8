"""Deployment: the one schedule selection, compiled graphs, and the PyTorch entry point."""
