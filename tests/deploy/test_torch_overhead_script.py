"""``scripts/torch_overhead.py --cpu`` (issue 40): the host-path benchmark runs on a CPU, over a driver
whose launch does nothing, and prints every row it promises. A few iterations only: the figures are
not checked here (no timed unit tests), the script's output is what a speed claim quotes."""

from __future__ import annotations

import importlib.util
import re

import pytest

from helpers.common import REPO

pytest.importorskip("torch")


def _script():
    spec = importlib.util.spec_from_file_location("torch_overhead", REPO / "scripts" / "torch_overhead.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_cpu_mode_runs_and_prints_every_row(fresh_backend, capsys) -> None:
    assert _script().main(["--cpu", "--iters", "3", "--shape", "8x64"]) == 0
    out = capsys.readouterr().out
    assert "CPU HOST TIME per call" in out
    made = int(re.search(r"(\d+) launches made", out).group(1))
    assert made > 0
    assert re.search(r"region call / do-nothing op: [\d.]+x .*through the dispatcher: [\d.]+x", out)
    assert "CPU allocator" in out   # which allocator the outputs come from is said
    rows = [ln for ln in out.splitlines() if re.match(r"\s+[\d.]+ us  ", ln)]
    for what in ("region call as a compiled graph makes it", "a do-nothing torch.library custom op",
                 "torch.ops.stitchtune.region.default", "step: the guard", "launch_pointers",
                 "compiled model per call"):
        assert any(what in r for r in rows), (what, out)
