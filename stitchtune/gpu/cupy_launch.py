"""Launching a program from torch tensors with cupy (interim: the one launch path replaces it).

* :class:`CupyLauncher` runs a :class:`~stitchtune.ir.kir.Program` from raw device pointers on the current
  torch stream (cubin loaded with ``cupy.RawModule``; scratch and barrier buffers allocated once, only
  ``zero_init`` scratch and barriers zeroed, the rest poisoned with 0xFF, like the CUDA runner).
* :func:`_to_torch` / :func:`_torch_out` move numpy arrays (bfloat16 included) to and from torch.

torch and cupy are imported inside the functions that use them.
"""

from __future__ import annotations

from typing import Any

import numpy as np


class CupyLauncher:
    """Runs a :class:`~stitchtune.ir.kir.Program` from raw device pointers on the current torch stream.

    The cubin is loaded with ``cupy.RawModule``; scratch and barrier buffers are allocated (zeroed) once
    here, as the program contract asks. ``__call__(pointers)`` takes the input/output buffer name ->
    device pointer map and enqueues every launch in order.
    """

    def __init__(self, program: Any, cubin_path: str, torch_device: str = "cuda") -> None:
        import cupy
        import torch

        from stitchtune.gpu.launch_plan import DEFAULT_SMEM_LIMIT, launch_plan

        self._cupy = cupy
        self.plan = launch_plan(program)
        self.module = cupy.RawModule(path=cubin_path)
        self.scratch: dict[str, Any] = {}
        for b in self.plan.buffers:
            if b.role in ("scratch", "barrier"):
                t = torch.zeros(max(b.nbytes, 1), dtype=torch.uint8, device=torch_device)
                if not b.zero_init and b.role == "scratch":
                    t.fill_(0xFF)  # like the runner: only zero_init buffers start at zero
                self.scratch[b.name] = t
        self.io_names = tuple(b.name for b in self.plan.buffers if b.role in ("input", "output"))
        funcs: dict[str, Any] = {}
        self.calls: list[tuple[Any, tuple[int, int, int], tuple[int, int, int], int, tuple[str, ...]]] = []
        for ln in self.plan.launches:
            f = funcs.get(ln.kernel) or self.module.get_function(ln.kernel)
            funcs[ln.kernel] = f
            if ln.smem_bytes > DEFAULT_SMEM_LIMIT:
                f.max_dynamic_shared_size_bytes = max(ln.smem_bytes, f.max_dynamic_shared_size_bytes)
            self.calls.append((f, ln.grid, ln.block, ln.smem_bytes, ln.args))

        sp = int(torch.cuda.current_stream().cuda_stream) if torch_device != "cpu" else 0
        self.stream = cupy.cuda.Stream.null if sp == 0 else cupy.cuda.ExternalStream(sp)

    def bind(self, pointers: dict[str, int]) -> list[tuple[Any, ...]]:
        """The launches with their arguments for one set of input/output pointers (prepared once, so
        that a timed call costs only the launches themselves)."""
        ptrs = {n: int(t.data_ptr()) for n, t in self.scratch.items()}
        ptrs.update(pointers)
        return [(f, grid, block, tuple(np.uint64(ptrs[a]) for a in args), smem)
                for f, grid, block, smem, args in self.calls]

    def run(self, bound: list[tuple[Any, ...]]) -> None:
        """Enqueue every launch of ``bound`` (from :meth:`bind`) on the torch stream of construction time."""
        for f, grid, block, args, smem in bound:
            f(grid, block, args, shared_mem=smem, stream=self.stream)

    def __call__(self, pointers: dict[str, int]) -> None:
        self.run(self.bind(pointers))


def _torch_dtype(name: str) -> Any:
    import torch

    return {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}[name]


def _to_torch(arr: np.ndarray, device: str = "cuda") -> Any:
    import torch

    a = np.ascontiguousarray(arr)
    if a.dtype.name == "bfloat16":
        return torch.from_numpy(a.view(np.int16)).view(torch.bfloat16).to(device)
    return torch.from_numpy(a).to(device)


def _torch_out(t: Any) -> np.ndarray:
    return t.float().cpu().numpy()
