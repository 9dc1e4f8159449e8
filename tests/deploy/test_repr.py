"""``import stitchtune.torch`` works beside the attribute, and compiled objects print as one short line."""

from __future__ import annotations

import importlib
import subprocess
import sys

import stitchtune
from helpers.common import EXAMPLES_DIR, REPO


def test_import_stitchtune_torch_is_the_attribute() -> None:
    mod = importlib.import_module("stitchtune.torch")
    assert stitchtune.torch is mod
    from stitchtune.deploy import torch_entry

    for name in mod.__all__:
        assert getattr(mod, name) is getattr(torch_entry, name), name


def test_import_stitchtune_torch_in_a_fresh_interpreter_does_not_import_pytorch() -> None:
    code = ("import sys, stitchtune.torch, stitchtune; "
            "assert stitchtune.torch.compile is not None and 'torch' not in sys.modules; "
            "from stitchtune.torch import compile, explain; print('ok')")
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120,
                          env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"})
    assert proc.returncode == 0 and proc.stdout.strip() == "ok", proc.stderr[-2000:]


def test_compiled_objects_have_one_line_reprs() -> None:
    from stitchtune.deploy.torch_entry import StitchedFunction

    cg = stitchtune.compile(EXAMPLES_DIR / "layernorm_small.json", db=None, device="h200", build=False)
    text = repr(cg)
    assert "\n" not in text and len(text) < 300, text
    assert text.startswith("<CompiledGraph layernorm_small on NVIDIA H200/sm_90: schedule ")
    assert "(heuristic), 1 kernel, cubin not built>" in text
    fn = StitchedFunction(compiled=cg, arg_names=("x", "gamma", "beta"), params=(), emulate=True)
    assert repr(fn) == ("<StitchedFunction (x, gamma, beta) on CPU emulator, captured with export, "
                        f"0 captured parameter(s): {text}>")
