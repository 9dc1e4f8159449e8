"""scripts/dynamic_shapes.py, the sweep of issue 41's done-when (over sequence lengths 1..2048 and batch
sizes 1-4, no region builds more than 8 kernels or runs eagerly), on a subset: tiny Llama and GPT-2
over a few (batch, length) shapes, emulated. The full sweep's table is in
results/dynamic-sweep-2026-12-07-s11/; this asserts what holds on the subset and the script's options."""

from __future__ import annotations

import sys

import pytest

from helpers import REPO

sys.path.insert(0, str(REPO / "scripts"))
import dynamic_shapes  # noqa: E402


def test_batches_and_shapes() -> None:
    assert dynamic_shapes.batches("1-4") == [1, 2, 3, 4] and dynamic_shapes.batches("1,4") == [1, 4]
    for bad in ("0-2", "", "a"):
        with pytest.raises(ValueError):
            dynamic_shapes.batches(bad)
    calls = dynamic_shapes.shapes([1, 50, 2048], [1, 2, 3, 4], seed=0)
    assert [n for _, n in calls] == [1, 50, 2048] and calls[0][0] == 1 and calls[-1][0] == 4
    assert dynamic_shapes.main(["--batches", "0"]) == 2 and dynamic_shapes.main(["--models", "nope"]) == 2


@pytest.mark.slow
@pytest.mark.usefixtures("fresh_backend")
@pytest.mark.parametrize("model", ["llama", "gpt2"])
def test_a_few_shapes_stay_within_eight_kernels_per_region(model: str) -> None:
    pytest.importorskip("transformers")
    calls = [(1, 1), (2, 7), (4, 33), (3, 64)]
    row = dynamic_shapes.run_model(model, calls, "true", "emulate")
    assert row["max_diff"] < 1e-4, row
    assert row["regions"] > 0 and row["eager"] == 0 and row["over_8"] == 0, row


@pytest.mark.slow
@pytest.mark.usefixtures("fresh_backend")
@pytest.mark.parametrize("model", ["llama", "phi3"])
def test_ten_shapes_of_one_bucket_build_one_kernel_per_region(model: str) -> None:
    """Batch 3-4 and lengths 33..64 are one bucket: every region (the q/k rotary after the head split
    included, issue 41 item 4) builds its one generic kernel, not one per shape."""
    pytest.importorskip("transformers")
    calls = [(3, 33), (4, 40), (3, 47), (4, 64), (3, 50), (4, 60), (3, 35), (4, 45), (3, 55), (4, 63)]
    row = dynamic_shapes.run_model(model, calls, "true", "emulate")
    assert row["max_diff"] < 1e-4, row
    assert row["eager"] == 0 and row["max_builds"] == 1, row
