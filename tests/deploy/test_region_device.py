"""A stitched region runs on the device of its graph: one that reads no tensor (T5's relative
position buckets: ``iota`` and int arithmetic only) must not fall back to the CPU's emulator inside a
CUDA graph (found on the H200: ``Expected all tensors to be on the same device, cuda:0 and cpu``),
and a CPU 0-d tensor beside CUDA inputs is moved to the graph's device before the launch. The
``meta`` device stands in for a GPU here: the kernel is a recording stub."""

from __future__ import annotations

from typing import Any

import pytest

torch = pytest.importorskip("torch")

from stitchtune.deploy import torch_ops  # noqa: E402
from stitchtune.deploy.torch_guard import GuardedRegion  # noqa: E402


class _Recording:
    """A kernel stub (all of :class:`~stitchtune.deploy.torch_region_protocols.GuardedKernel`): records
    the devices it is called with, returns one empty output there; no thin path, no flags, no counter."""

    compiled = None
    counter = None

    def __init__(self) -> None:
        self.calls: list[tuple[list[str], str]] = []
        self.flag_sets: list[Any] = []

    def copies(self, inputs: list[Any]) -> int:
        return 0

    def fast_path(self, device: Any, held: Any, first: Any) -> Any:
        return None

    def __call__(self, inputs: list[Any], device: Any = None) -> list[Any]:
        dev = torch_ops._device_of(inputs, device)
        self.calls.append(([t.device.type for t in inputs], dev.type))
        return [torch.empty(4, device=dev)]

    def fake(self, inputs: list[Any], device: Any = None) -> list[Any]:
        return [torch.empty(4, device=torch_ops._device_of(inputs, device))]

    def describe(self) -> str:
        return "stub region"


def test_a_region_that_reads_no_tensor_runs_on_its_graphs_device() -> None:
    kernel = _Recording()
    region = GuardedRegion(kernel, module=None, perms=(None,), device=torch.device("meta"))
    [out] = region([])
    assert out.device.type == "meta" and kernel.calls == [([], "meta")]
    assert region.fake([])[0].device.type == "meta"


def test_without_a_graph_device_it_stays_where_its_inputs_are() -> None:
    kernel = _Recording()
    region = GuardedRegion(kernel, module=None, perms=(None,))
    assert region([])[0].device.type == "cpu"
    assert region([torch.ones(2)])[0].device.type == "cpu"


def test_a_cpu_scalar_beside_device_inputs_is_moved_to_the_graphs_device() -> None:
    kernel = _Recording()
    region = GuardedRegion(kernel, module=None, perms=(None,), device=torch.device("meta"))
    region([torch.empty(3, device="meta"), torch.tensor(2.0)])
    assert kernel.calls == [(["meta", "meta"], "meta")]


def test_held_constants_follow_the_graphs_device_when_no_input_is_passed() -> None:
    kernel = _Recording()
    region = GuardedRegion(kernel, module=None, perms=(None,), held=((0, torch.arange(3)),),
                                     device=torch.device("meta"))
    region([torch.tensor(1.0)])
    assert kernel.calls == [(["meta", "meta"], "meta")]


class _Echo(_Recording):
    """Returns a copy of its first input and keeps the tensor it was given (the bound input)."""

    def __init__(self) -> None:
        super().__init__()
        self.given: list[Any] = []

    def __call__(self, inputs: list[Any], device: Any = None) -> list[Any]:
        super().__call__(inputs, device)
        self.given.append(inputs[0])
        return [inputs[0].clone()]

    def fake(self, inputs: list[Any], device: Any = None) -> list[Any]:
        return [torch.empty(1, dtype=torch.int64)]


def test_bound_symint_inputs_are_one_buffer_per_thread_filled_in_place() -> None:
    """A region's bound SymInt input (:mod:`stitchtune.importers.torch_symvalues`) is one int64 buffer per
    thread (and device, stream) that each call fills with its value: the same tensor on a thread's later
    calls, another on another thread, so a call elsewhere never overwrites a value a launch still reads."""
    import threading

    kernel = _Echo()
    region = GuardedRegion(kernel, module=None, perms=(None,), bound=((0, (1,), torch.int64),))
    assert [int(region([], [v])[0]) for v in (5, 6)] == [5, 6]
    other: list[int] = []
    t = threading.Thread(target=lambda: other.append(int(region([], [7])[0])))
    t.start()
    t.join()
    assert other == [7] and int(region([], [8])[0]) == 8
    mine, theirs = kernel.given[0], kernel.given[2]
    assert kernel.given[1] is mine and kernel.given[3] is mine and theirs is not mine
    assert int(mine) == 8 and int(theirs) == 7 and mine.dtype == torch.int64


def test_bound_buffers_made_under_inference_mode_are_refilled_outside_it() -> None:
    """A region first called under ``torch.inference_mode`` and then outside it (a server's warm-up, then
    ``no_grad``): its bound buffer is a normal tensor, so the later call fills it in place (an inference
    tensor would raise 'Inplace update to inference tensor outside InferenceMode')."""
    kernel = _Echo()
    region = GuardedRegion(kernel, module=None, perms=(None,), bound=((0, (1,), torch.int64),))
    with torch.inference_mode():
        assert int(region([], [5])[0]) == 5
    with torch.no_grad():
        assert int(region([], [6])[0]) == 6
    assert kernel.given[0] is kernel.given[1] and not kernel.given[0].is_inference()


def test_kept_tensors_are_made_outside_the_cuda_graph_pool() -> None:
    """:func:`~stitchtune.deploy.torch_guard.kept_tensors` with a fake ``torch.cuda``: on a CUDA device
    the tensors a region keeps are made on a side stream that first waits for the current one, the
    current stream then waits for the side one, and each tensor is recorded on the current stream;
    on the CPU ``make`` runs as it is."""
    import contextlib
    from types import SimpleNamespace

    from stitchtune.deploy.torch_guard import kept_tensors

    log: list[str] = []

    class Stream:
        def __init__(self, name: str) -> None:
            self.name = name

        def wait_stream(self, other: Any) -> None:
            log.append(f"{self.name} waits {other.name}")

    current, side = Stream("current"), Stream("side")
    on = ["current"]

    @contextlib.contextmanager
    def stream(s: Any) -> Any:
        on.append(s.name)
        yield
        on.pop()

    cuda = SimpleNamespace(current_stream=lambda device: current, Stream=lambda device: side, stream=stream)

    class Kept:
        def record_stream(self, s: Any) -> None:
            log.append(f"recorded on {s.name}")

    def make() -> list[Any]:
        log.append(f"made on {on[-1]}")
        return [Kept(), Kept()]

    got = kept_tensors(SimpleNamespace(type="cuda"), make, cuda)
    assert len(got) == 2
    assert log == ["side waits current", "made on side", "current waits side", "recorded on current",
                   "recorded on current"]
    log.clear()
    assert len(kept_tensors(torch.device("cpu"), make, cuda)) == 2 and log == ["made on current"]
