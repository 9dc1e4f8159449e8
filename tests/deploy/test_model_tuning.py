"""Whole-model tuning: regions de-duplicated, the budget split by predicted share, one database the
torch.compile backend then reads (`stitchtune tune`)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")

from stitchtune import cli  # noqa: E402
from stitchtune.deploy import torch_backend  # noqa: E402
from stitchtune.deploy.model_tuning import Workload, model_workloads, split_budget  # noqa: E402
from stitchtune.hardware.device import get_device  # noqa: E402

MODULE = '''
import torch

class Twice(torch.nn.Module):
    """The same LayerNorm workload twice (de-duplicated), and a softmax."""

    def __init__(self):
        super().__init__()
        self.a = torch.nn.LayerNorm(32)
        self.b = torch.nn.LayerNorm(32)
        self.fc = torch.nn.Linear(32, 32)
        self.fc2 = torch.nn.Linear(32, 32)

    def forward(self, x):
        h = self.fc(self.a(x))
        return (self.fc2(self.b(h)) * 2.0).softmax(-1)
'''


def test_split_budget_is_proportional_largest_first_and_exact() -> None:
    ws = [Workload(None, ("r",), (), 1, 1.0, share) for share in (0.6, 0.3, 0.1)]
    assert split_budget(ws, 10) == [6, 3, 1]
    assert split_budget(ws, 2) == [1, 1, 0]
    assert sum(split_budget(ws, 7)) == 7
    assert split_budget([], 5) == [] and split_budget(ws, 0) == [0, 0, 0]


def test_equal_workloads_are_counted_once_with_their_count(tmp_path: Path) -> None:
    import importlib.util

    path = tmp_path / "twice.py"
    path.write_text(MODULE)
    spec = importlib.util.spec_from_file_location("twice_mod", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    ws = model_workloads(mod.Twice().eval(), [torch.randn(16, 32)], get_device("h200"))
    assert sorted((w.count, w.ops) for w in ws) == [(1, ("aten.mul", "aten._softmax")),
                                                    (2, ("aten.native_layer_norm",))]
    assert abs(sum(w.share for w in ws) - 1.0) < 1e-9
    assert [w.share for w in ws] == sorted((w.share for w in ws), reverse=True)


def test_tune_command_writes_a_database_the_backend_reads(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    path = tmp_path / "twice.py"
    path.write_text(MODULE)
    db = tmp_path / "db"
    rc = cli.main(["tune", f"{path}:Twice", "--shapes", "x=16x32", "--trials", "2", "--backend", "emulate",
                   "--no-build", "--jobs", "1", "--db", str(db)])
    out = capsys.readouterr().out
    assert rc == 0
    assert "[1/" in out and "share" in out and "predicted (emulate backend" in out
    import importlib.util

    spec = importlib.util.spec_from_file_location("twice_mod2", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    torch_backend.register()
    e = torch_backend.explain(mod.Twice().eval(), torch.randn(16, 32), db=str(db), fallback="eager",
                              cpu="reference")
    assert e.stitched and all(s.source == "tuned" for s in e.stitched), str(e)


def test_tune_command_refuses_bad_input_in_one_line(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    path = tmp_path / "twice.py"
    path.write_text(MODULE)
    rc = cli.main(["tune", f"{path}:Twice", "--shapes", "y=2x8", "--db", str(tmp_path / "db")])
    err = capsys.readouterr().err
    assert rc == 2 and "not a parameter" in err and "Traceback" not in err


def test_train_captures_the_backward_graph_too(tmp_path: Path) -> None:
    import importlib.util

    from stitchtune.deploy.model_tuning import capture_regions

    path = tmp_path / "twice.py"
    path.write_text(MODULE)
    spec = importlib.util.spec_from_file_location("twice_mod3", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    m = mod.Twice()
    inference = capture_regions(m.eval(), [torch.randn(16, 32)])
    train = capture_regions(m.train(), [torch.randn(16, 32)], train=True)
    assert len(train) > len(inference) >= 3
    assert m.fc.weight.grad is not None
