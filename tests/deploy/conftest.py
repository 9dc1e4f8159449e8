"""Fixtures of the deploy tests."""

from __future__ import annotations

from collections.abc import Iterator

import pytest


@pytest.fixture
def fresh_backend() -> Iterator[None]:
    """The stitchtune torch backend registered, dynamo's caches and the backend's counters reset."""
    torch = pytest.importorskip("torch")
    from stitchtune.deploy import torch_backend, torch_stats

    torch_backend.register()
    torch._dynamo.reset()
    torch_stats.reset()
    yield
    torch._dynamo.reset()
