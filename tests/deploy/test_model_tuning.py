"""Whole-model tuning: regions de-duplicated, the budget split by predicted gain, one database the
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


def _load(path: Path, name: str) -> Any:
    import importlib.util

    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_split_budget_is_proportional_largest_first_and_exact() -> None:
    ws = [Workload(None, ("r",), (), 1, 1.0, share) for share in (0.6, 0.3, 0.1)]
    assert split_budget(ws, 10) == [6, 3, 1]
    assert split_budget(ws, 2) == [1, 1, 0]
    assert sum(split_budget(ws, 7)) == 7
    assert split_budget([], 5) == [] and split_budget(ws, 0) == [0, 0, 0]
    small = [Workload(None, ("r",), (), 1, 1.0, share) for share in (0.9, 0.05, 0.05)]
    assert split_budget(small, 3) == [1, 1, 1]       # enough trials: every workload gets a record
    assert split_budget(small, 5) == [3, 1, 1] and split_budget(small, 2) == [2, 0, 0]


def test_equal_workloads_are_counted_once_with_their_count(tmp_path: Path) -> None:
    path = tmp_path / "twice.py"
    path.write_text(MODULE)
    ws = model_workloads(_load(path, "twice_mod").Twice(), [torch.randn(16, 32)], get_device("h200"),
                         calls=("inference",))
    # fc2's bias is added by the softmax region (importers/torch_bias.py); fc's stays in its addmm (a layer norm reads it)
    assert sorted((w.count, w.ops) for w in ws) == [(1, ("aten.add", "aten.mul", "aten._softmax")),
                                                    (2, ("aten.native_layer_norm",))]
    assert abs(sum(w.share for w in ws) - 1.0) < 1e-9
    assert [w.share for w in ws] == sorted((w.share for w in ws), reverse=True)


DEMO = '''
import torch

class Demo(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.b = torch.nn.Parameter(torch.randn(1024))

    def forward(self, x, y):
        return torch.log_softmax(x, -1), torch.nn.functional.gelu(y + self.b)
'''


def test_the_budget_follows_the_predicted_gain_and_a_region_at_its_floor_gets_one_trial(tmp_path: Path,
                                                                                        monkeypatch) -> None:
    """A log-softmax over 32 x 1000 (its heuristic predicted ~2x the best point tried) and a bias + GELU over
    256 x 1024 (predicted at the best point tried, half the log-softmax's time): by predicted time the GELU would
    get 5 of 16 trials; by predicted gain it keeps its heuristic's one. The log-softmax's better points are rare
    (tests/tune/test_budget.py): the gains are taken over 300 seeded samples, not the default 24."""
    from stitchtune.deploy import model_tuning
    from stitchtune.deploy.selection import heuristic_schedule
    from stitchtune.tune import budget
    from stitchtune.tune.budget import split_by_share

    monkeypatch.setattr(model_tuning, "predicted_gain", lambda graph, device: budget.predicted_gain(
        graph, device, heuristic=heuristic_schedule, samples=300))

    path = tmp_path / "demo.py"
    path.write_text(DEMO)
    ws = model_workloads(_load(path, "demo_mod").Demo(), [torch.randn(32, 1000), torch.randn(256, 1024)],
                         get_device("h200"), calls=("inference",))
    soft, gelu = sorted(ws, key=lambda w: "gelu" in str(w.ops))
    assert "aten._log_softmax" in soft.ops and ws[0] is soft
    assert soft.best_predicted_us is not None and soft.best_predicted_us < 0.7 * soft.predicted_us
    assert gelu.best_predicted_us == gelu.predicted_us and gelu.predicted_us > 0.3 * soft.predicted_us
    assert split_by_share([w.count * w.predicted_us for w in ws], 16) == [11, 5]      # the rule before s13
    assert split_budget(ws, 16) == [15, 1]


def test_tune_then_every_call_pattern_compiles_every_region_from_a_tuned_record(
        tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """The three ways of calling the model (no_grad / inference_mode, eval with grad enabled, a
    training step) compile different graphs; after `tune --train` each of their regions is tuned."""
    from stitchtune.deploy.model_tuning import CALL_PATTERNS, calling_as, differentiate

    path = tmp_path / "twice.py"
    path.write_text(MODULE)
    db = tmp_path / "db"
    rc = cli.main(["tune", f"{path}:Twice", "--shapes", "x=16x32", "--trials", "12", "--train", "--backend",
                   "emulate", "--no-build", "--jobs", "1", "--db", str(db)])
    out = capsys.readouterr().out
    assert rc == 0
    assert "[1/" in out and "share" in out and "predicted (emulate backend" in out
    assert all(f"{c} call: stitched regions" in out for c in CALL_PATTERNS)
    model = _load(path, "twice_mod2").Twice()
    torch_backend.register()
    x = torch.randn(16, 32)
    seen = {}
    for name, call in CALL_PATTERNS.items():
        with calling_as(model, call):
            e = torch_backend.explain(model, x, backward=call.backward, db=str(db), fallback="eager",
                                      cpu="reference")
        seen[name] = sorted({s.graph for s in e.stitched})
        assert e.stitched and all(s.source == "tuned" for s in e.stitched), f"{name}:\n{e}"
    # the explanation is the compiled call: torch.inference_mode compiles the same graph as no_grad
    with calling_as(model, CALL_PATTERNS["inference"]), torch.inference_mode():
        e = torch_backend.explain(model, x, db=str(db), fallback="eager", cpu="reference")
    assert e.stitched and all(s.source == "tuned" and s.graph == "inference" for s in e.stitched), str(e)
    assert seen == {"inference": ["inference"], "eval-grad": ["forward"], "train": ["backward", "forward"]}
    # an untuned database: the same calls say so (the source is what selection used, not a label)
    with calling_as(model, CALL_PATTERNS["eval-grad"]):
        e = torch_backend.explain(model, x, db=str(tmp_path / "empty"), fallback="eager", cpu="reference")
    assert e.stitched and all(s.source == "heuristic" for s in e.stitched)
    differentiate(e.outputs)   # the training forward's outputs can be differentiated
    assert model.fc.weight.grad is not None


def test_inference_only_tuning_leaves_the_training_forward_untuned(tmp_path: Path) -> None:
    """What the issue saw: a record of the inference graph is not one of the training forward (which
    also returns mean/rstd), so `--calls inference` leaves eval-with-grad calls' layer norms on the heuristic."""
    from stitchtune.deploy.model_tuning import CALL_PATTERNS, calling_as

    path = tmp_path / "twice.py"
    path.write_text(MODULE)
    db = tmp_path / "db"
    assert cli.main(["tune", f"{path}:Twice", "--shapes", "x=16x32", "--trials", "4", "--calls", "inference",
                     "--backend", "emulate", "--no-build", "--jobs", "1", "--db", str(db)]) == 0
    model = _load(path, "twice_mod4").Twice()
    sources = {}
    for name in ("inference", "eval-grad"):
        with calling_as(model, CALL_PATTERNS[name]):
            e = torch_backend.explain(model, torch.randn(16, 32), db=str(db), fallback="eager", cpu="reference")
        sources[name] = {s.source for s in e.stitched}
    assert sources["inference"] == {"tuned"} and "heuristic" in sources["eval-grad"]   # the layer norms


def test_tune_command_refuses_bad_input_in_one_line(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    path = tmp_path / "twice.py"
    path.write_text(MODULE)
    rc = cli.main(["tune", f"{path}:Twice", "--shapes", "y=2x8", "--db", str(tmp_path / "db")])
    err = capsys.readouterr().err
    assert rc == 2 and "not a parameter" in err and "Traceback" not in err
    rc = cli.main(["tune", f"{path}:Twice", "--shapes", "x=2x8", "--calls", "inference,serve", "--db",
                   str(tmp_path / "db")])
    err = capsys.readouterr().err
    assert rc == 2 and "--calls" in err and "eval-grad" in err and "Traceback" not in err


def test_each_call_pattern_captures_its_own_graphs(tmp_path: Path) -> None:
    from stitchtune.deploy.model_tuning import capture_regions

    path = tmp_path / "twice.py"
    path.write_text(MODULE)
    m = _load(path, "twice_mod3").Twice()
    m.eval()
    x = torch.randn(16, 32)
    inference = capture_regions(m, [x], "inference")
    forward = capture_regions(m, [x], "eval-grad")
    train = capture_regions(m, [x], "train")
    keys = [{r.graph.workload_key() for r in rs} for rs in (inference, forward, train)]
    assert len(inference) == len(forward) >= 3
    assert keys[0] != keys[1]         # the training forward's layer norms also return mean/rstd
    assert keys[1] < keys[2]          # a training step: that forward (no dropout here) and a backward
    assert m.fc.weight.grad is not None and not m.training   # the module's mode is restored
