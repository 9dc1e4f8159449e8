"""Issue 40: a region call never stalls the device. BERT, GPT-2 and Llama (transformers configs, random
weights, 1 layer, hidden 32) compiled with ``torch.compile(backend="stitchtune")``, their regions
launched through a stand-in driver (``torch_ops.stand_in_driver``: a FakeDriver whose kernels run the
SIMT emulator on the CPU tensors' own memory), for inference and one training step: outputs equal
eager, and the driver saw no synchronisation and no device-to-host copy, while an out-of-range token id
is still reported (after the compiled graph ran, naming the region and its input). The same model
calls are then made while the launch stream "captures a CUDA graph" (the fake driver refuses what a
capture forbids): every region call is capturable."""

from __future__ import annotations

import ctypes
import itertools

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from test_torch_matrix import MODELS, V, _first  # noqa: E402

from stitchtune.deploy import torch_backend, torch_ops  # noqa: E402
from stitchtune.gpu.fake_driver import FakeDriver, FakeFunction  # noqa: E402

pytestmark = pytest.mark.slow

STALLS = ("synchronize", "event_synchronize", "memcpy_dtoh")


class HostDriver(FakeDriver):
    """A FakeDriver whose kernels are the stitched programs' own, run by the emulator on host memory:
    pointers of CPU tensors are read and written where they are (its own allocations as a FakeDriver's)."""

    def __init__(self) -> None:
        super().__init__()
        self.programs: dict[int, object] = {}
        self.generic = 0   # launches of generic kernels (extents bound as arguments)
        self._ids = itertools.count()

    def image(self, compiled: object) -> bytes:
        """The stand-in module image of ``compiled``: its program, by number."""
        n = next(self._ids)
        self.programs[n] = compiled.program
        return b"FAKE %d" % n

    def get_function(self, module: object, name: str) -> FakeFunction:
        self._enter("get_function", name)
        return FakeFunction(f"{int(module['image'].split()[1])}/{name}")

    def _bytes(self, ptr: int, nbytes: int) -> np.ndarray:
        if any(base <= ptr < base + max(m.size, 1) for base, m in self.memory.items()):
            return self.buffer(ptr)[:nbytes]
        return np.ctypeslib.as_array((ctypes.c_uint8 * nbytes).from_address(ptr))

    def launch(self, function, grid, block, smem, stream, params, nparams, cooperative=False) -> None:
        from stitchtune.emulate.emulator import elem_dtype, emulate_kernel
        from stitchtune.graph.values import ITEMSIZE

        super().launch(function, grid, block, smem, stream, params, nparams, cooperative)
        ln = self.launches[-1]
        n, name = function.name.split("/", 1)
        kernel = self.programs[int(n)].kernel(name)
        bufs = {}
        for p, a in zip(kernel.params, ln.args):
            dt = elem_dtype(p.dtype, p.role)
            bufs[p.name] = self._bytes(a, p.size * np.dtype(dt).itemsize).view(dt)
        ints = ln.args[len(kernel.params):]   # a generic kernel's extents, in the low 4 bytes of their slots
        extents = ({getattr(e, "name", e): int(v & 0xFFFFFFFF) for e, v in zip(kernel.extents, ints)}
                   if kernel.extents else None)
        self.generic += bool(extents)
        emulate_kernel(kernel, ln.grid[0], bufs, extents=extents)


def _stalls(drv: FakeDriver) -> list:
    return [c for c in drv.calls if c[0] in STALLS]


def _failed_at_run() -> list:
    return [d for r in torch_backend.LAST_REPORTS for d in r.declined if "failed at run time" in d.reason]


@pytest.mark.parametrize("name", ["bert", "gpt2", "llama"])
def test_inference_and_training_steps_never_stall_and_bad_ids_are_reported(name: str, fresh_backend) -> None:
    torch.manual_seed(0)
    model, (ids,) = MODELS[name]()
    drv = HostDriver()
    opts = {"db": None, "fallback": "eager"}
    with torch_ops.stand_in_driver(drv, drv.image):
        model.eval()
        compiled = torch.compile(model, backend="stitchtune", options=opts)
        with torch.no_grad():
            want = _first(model(ids))
            got = _first(compiled(ids))
            again = _first(compiled(ids))                          # a second call: the thin path
        assert torch.allclose(got, want, atol=1e-4), (got - want).abs().max()
        assert torch.allclose(again, want, atol=1e-4), (again - want).abs().max()
        model.train()
        torch._dynamo.reset()
        compiled = torch.compile(model, backend="stitchtune", options=opts)
        for _ in range(2):
            _first(compiled(ids)).square().sum().backward()
        stitched = sum(len(r.stitched) for r in torch_backend.LAST_REPORTS)
        launched = len(drv.launches)
        assert stitched and launched
        assert _stalls(drv) == []                                  # no synchronisation, no device-to-host copy
        assert _failed_at_run() == []
        # the launch stream captures a CUDA graph: every call is capturable (no allocation, load, sync)
        drv.capturing.add(0)
        _first(compiled(ids)).square().sum().backward()
        drv.capturing.clear()
        assert len(drv.launches) > launched
        # an out-of-range token id: reported after the graph ran, naming the region and its input
        bad = ids.clone()
        bad[0, 1] = V + 7
        model.eval()
        torch._dynamo.reset()
        compiled = torch.compile(model, backend="stitchtune", options=opts)
        with torch.no_grad():
            compiled(ids)
            with pytest.raises(Exception, match=r"stitched region .*gather '[^']+' reading region input \d .*"
                                                r"index out of range"):
                compiled(bad)
            compiled(ids)                                          # reported once: the flag was zeroed
    assert _stalls(drv) == []


def test_a_dynamic_bert_never_stalls_and_is_capturable_at_every_length(fresh_backend) -> None:
    """dynamic=True: the regions' generic kernels (one per bucket) at several lengths, then the same
    lengths while the stream captures: launches only, outputs equal eager."""
    import transformers

    torch.manual_seed(0)
    cfg = transformers.BertConfig(hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64,
                                  vocab_size=64, max_position_embeddings=64, hidden_dropout_prob=0.0,
                                  attention_probs_dropout_prob=0.0)
    model = transformers.BertModel(cfg).eval()
    drv = HostDriver()
    with torch_ops.stand_in_driver(drv, drv.image), torch.no_grad():
        c = torch.compile(model, backend="stitchtune", dynamic=True, options={"db": None, "fallback": "eager"})
        for capturing in (False, True):
            if capturing:
                drv.capturing.add(0)
            for n in (3, 9, 17):
                ids = torch.randint(0, 64, (1, n))
                got, want = c(ids).last_hidden_state, model(ids).last_hidden_state
                assert (got - want).abs().max().item() < 1e-4, (n, capturing)
        drv.capturing.clear()
    assert drv.generic > 0 and _stalls(drv) == [] and _failed_at_run() == []
    kinds = {type(getattr(g, "kernel", g)).__name__ for g in torch_ops._registry.values()}
    assert "DynamicRegionKernel" in kinds
