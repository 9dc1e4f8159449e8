"""The GPU round of issue 44 without a GPU: scripts/gpu_step.py's, gpu_peers.py's and gpu_fit_rows.py's
pure parts, the refit from per-kernel rows, and scripts/gpu_round.sh's CPU dry run (phases, SKIP and
TIMEOUT rows, the summary and the packed results folder)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import tarfile
from pathlib import Path
from typing import Any

import pytest

from helpers.common import load_script

ROOT = Path(__file__).resolve().parents[2]


def load(name: str, monkeypatch: pytest.MonkeyPatch) -> Any:
    return load_script(name, monkeypatch)


def test_step_split_and_tables(monkeypatch: pytest.MonkeyPatch) -> None:
    gs = load("gpu_step", monkeypatch)
    k = {"kernel_us": 100.0, "by_maker": {"matmul": [4, 60.0], "copy": [1, 5.0], "stitchtune": [3, 35.0]}}
    assert gs.split_kernels(k, 130.0) == {"matmul_us": 60.0, "membound_us": 35.0, "gap_us": 30.0}
    assert "gap_us" not in gs.split_kernels({}, None)
    rows = [{"phase": "steps", "model": "bert", "dtype": "bf16", "mode": "train", "variant": "stitchtune+cg",
             "median_us": 130.0, "kernels": 8, "kernel_us": 100.0, "matmul_us": 60.0, "membound_us": 35.0,
             "gap_us": 30.0, "stitched": 5, "compile_s": 9.0, "timing": "cuda events (measured)"},
            {"phase": "regions", "model": "gpt2", "mode": "inference", "dtype": "bf16", "region": "r", "count": 2,
             "ours_us": 4.0, "inductor_us": 2.0, "floor_us": 1.0, "predicted_us": 3.0},
            {"phase": "decode", "model": "llama", "variant": "eager", "median_us": 900.0, "tokens_equal": True,
             "compile_s": 0.1, "timing": "wall"},
            {"phase": "steps", "model": "gpt2", "dtype": "fp32", "mode": "inference", "variant": "inductor-ro",
             "error": "RuntimeError: boom"}]
    text = "\n".join(gs.tables(rows))
    assert "| bert | bf16 | train | stitchtune+cg | 130.0 | 8 | 100.0 | 60.0 | 35.0 | 30.0 | 5 | 9.0 |" in text
    assert "| gpt2 | inference bf16 | r | 2 | 4.0 | 2.0 | 2.00 | 1.0 | 3.0 |" in text
    assert "| llama | eager | 900.0 | True |" in text and "RuntimeError: boom" in text
    assert text.index("## Per region") < text.index("## Per step") < text.index("## Decode")


def test_step_rows_gpu_branch_with_fakes(monkeypatch: pytest.MonkeyPatch) -> None:
    """The GPU branch of the steps phase, its timers and profiler faked: every variant a row, the
    kernel split, the backend's and Inductor's traces kept (fit data, the L2 check) and the others' dropped, a
    failure a row."""
    torch = pytest.importorskip("torch")
    gs = load("gpu_step", monkeypatch)
    gm = load("gpu_models", monkeypatch)
    lin = torch.nn.Linear(4, 4)
    monkeypatch.setattr(gs, "_model", lambda *a: (lin, (torch.ones(2, 4),)))

    def fake_compile(torch: Any, model: Any, variant: str, cpu: bool, dynamic: Any = None) -> Any:
        if variant == "inductor-ro":
            raise RuntimeError("no graphs here")
        return model
    monkeypatch.setattr(gs, "_compile", fake_compile)
    monkeypatch.setattr(gm, "_median_us", lambda torch, run, iters: 500.0)
    monkeypatch.setattr(gm, "_kernels", lambda torch, run: {
        "trace": [["st_k0", 1.0]], "kernels": 3, "memcpy_memset": 0, "kernel_us": 400.0,
        "by_maker": {"matmul": [2, 250.0], "stitchtune": [1, 150.0]}})
    monkeypatch.setattr(gm, "_reports", lambda: {"stitched": 1})
    rows = list(gs.step_rows(gm, None, torch, "bert", "bf16", "inference", 3, cpu=False))
    assert [r["variant"] for r in rows] == list(gs.STEP_VARIANTS)
    ok = {r["variant"]: r for r in rows}
    assert ok["inductor-ro"]["error"] == "RuntimeError: no graphs here"
    assert ok["eager"]["median_us"] == 500.0 and ok["eager"]["gap_us"] == 100.0
    assert ok["eager"]["matmul_us"] == 250.0 and ok["eager"]["membound_us"] == 150.0
    assert "trace" not in ok["inductor-ro"] and "trace" not in ok["eager"]
    assert ok["inductor"]["trace"] == ok["stitchtune"]["trace"] == [["st_k0", 1.0]]
    assert ok["stitchtune+cg"]["stitched"] == 1 and "stitched" not in ok["eager"]
    assert all(r["timing"] == "cuda events (measured)" for r in rows)


def test_step_options_are_checked(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("torch")
    gs = load("gpu_step", monkeypatch)
    assert gs.main(["--cpu", "--models", "resnet", "--out", "/nonexistent"]) == 2
    assert gs.main(["--cpu", "--dtypes", "fp8", "--out", "/nonexistent"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 2 and all(e.startswith("gpu_step: error: ") for e in err)


def test_peer_bytes_and_table(monkeypatch: pytest.MonkeyPatch) -> None:
    gp = load("gpu_peers", monkeypatch)
    assert gp.unique_bytes("softmax", 4, 8, 4) == 2 * 4 * 8 * 4
    assert gp.unique_bytes("layer_norm", 4, 8, 2) == 2 * 4 * 8 * 2 + 2 * 8 * 2
    assert gp.unique_bytes("cross_entropy", 4, 8, 4) == 4 * 8 * 4 + 4 * 8 + 4
    lines = gp.table([{"phase": "peers", "op": "softmax", "shape": [98304, 512], "dtype": "fp32", "variant": "native",
                       "median_us": 90.0, "min_us": 88.0, "floor_us": 48.0, "max_err": 0.0, "timing": "cuda events"},
                      {"phase": "peers", "op": "softmax", "shape": [98304, 512], "dtype": "fp32", "variant": "quack",
                       "skipped": "not importable"}])
    assert "floor us (predicted)" in lines[0]
    assert lines[2].startswith("| softmax | 98304x512 | fp32 | native | 90.0 | 88.0 | 48.0 | 0.0e+00 | - |")
    assert "not importable" in lines[3]


def test_peer_cases_on_the_cpu(monkeypatch: pytest.MonkeyPatch) -> None:
    torch = pytest.importorskip("torch")
    gp = load("gpu_peers", monkeypatch)
    for op in gp.OPS:
        m, args = gp.make_case(torch, op, 8, 16, torch.float32, "cpu")
        out = m(*args)
        assert out.shape == (() if op == "cross_entropy" else (8, 16))
        assert torch.isfinite(out).all()


def test_peers_out_of_budget_are_rows_not_a_crash(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    pytest.importorskip("torch")
    gp = load("gpu_peers", monkeypatch)
    assert gp.main(["--cpu", "--budget-s", "0", "--ops", "softmax,rms_norm", "--out", str(tmp_path)]) == 0
    rows = [json.loads(x) for x in (tmp_path / "gpu_peers.jsonl").read_text().splitlines()]
    assert [(r["dtype"], r["size"], r["op"]) for r in rows] == [
        ("fp32", "full", "softmax"), ("fp32", "full", "rms_norm"), ("fp32", "small", "softmax"),
        ("fp32", "small", "rms_norm"), ("bf16", "full", "softmax"), ("bf16", "full", "rms_norm"),
        ("bf16", "small", "softmax"), ("bf16", "small", "rms_norm")]
    assert all(r["skipped"] == "budget spent" for r in rows)
    assert len((tmp_path / "gpu_peers.md").read_text().strip().splitlines()) == 2   # the header alone
    assert gp.main(["--cpu", "--sizes", "huge", "--out", str(tmp_path)]) == 2


def test_headline_ratios(monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
                         capsys: pytest.CaptureFixture[str]) -> None:
    rep = load("gpu_round_report", monkeypatch)
    step = [{"phase": "steps", "model": "bert", "dtype": "bf16", "mode": "train", "variant": v, "median_us": us,
             "membound_us": mb, "gap_us": 10.0}
            for v, us, mb in (("inductor", 1000.0, 300.0), ("stitchtune", 1100.0, 380.0),
                              ("inductor-ro", 900.0, 300.0), ("stitchtune+cg", 810.0, 380.0))]
    step += [{"phase": "regions", "model": "bert", "dtype": "bf16", "mode": "train", "count": c, "ours_us": o,
              "inductor_us": i} for c, o, i in ((2, 10.0, 5.0), (1, 4.0, 4.0), (1, 1.0, None))]
    step += [{"phase": "decode", "model": "gpt2", "variant": "eager", "median_us": 800.0},
             {"phase": "decode", "model": "gpt2", "variant": "stitchtune", "median_us": 400.0, "tokens_equal": True},
             {"phase": "steps", "model": "llama", "dtype": "fp32", "mode": "train", "skipped": "budget spent"}]
    peers = [{"phase": "peers", "op": "softmax", "size": "full", "dtype": "fp32", "variant": "native",
              "median_us": 100.0, "floor_us": 50.0},
             {"phase": "peers", "op": "softmax", "size": "full", "dtype": "fp32", "variant": "stitchtune",
              "median_us": 80.0}]
    (tmp_path / "gpu_step.jsonl").write_text("".join(json.dumps(r) + "\n" for r in step))
    (tmp_path / "gpu_peers.jsonl").write_text("".join(json.dumps(r) + "\n" for r in peers))
    text = "\n".join(rep.report(tmp_path))
    assert "| bert | bf16 | train | 1.10 | 0.90 | 380.0, 300.0 | 10.0, 10.0 |" in text
    assert "| bert | bf16 | train | 2 | 1.71 | 1.41 | 1/2 |" in text    # (2*10+4)/(2*5+4); sqrt(2*1)
    assert "| gpt2 | 800.0, -, 400.0 | 0.50 | - | True |" in text
    assert "| softmax | full | fp32 | 0.80 | - | 2.00 |" in text and "llama" not in text and "DRY RUN" not in text
    (tmp_path / "gpu_peers.jsonl").write_text(json.dumps(dict(peers[0], timing="cpu wall (dry run)")) + "\n")
    assert rep.report(tmp_path)[0].startswith("**DRY RUN")
    assert rep.main([str(tmp_path / "nothing")]) == 2
    assert capsys.readouterr().err.startswith("gpu_round_report: error: ")


def _program() -> tuple[Any, Any]:
    from stitchtune.deploy.selection import heuristic_schedule
    from stitchtune.graph.parse import load_graph
    from stitchtune.hardware.device import get_device
    from stitchtune.lower.entry import lower
    from stitchtune.lower.resources import legal_space
    from stitchtune.plan.planner import make_plan

    dev = get_device("h200")
    g = load_graph(ROOT / "examples" / "layernorm_small.json")
    plan = make_plan(g)
    space = legal_space(g, plan, dev)
    return lower(g, plan, heuristic_schedule(plan, dev, space), dev, space), dev


def test_per_launch_times_match_the_programs_launches(monkeypatch: pytest.MonkeyPatch) -> None:
    fr = load("gpu_fit_rows", monkeypatch)
    ev = [("st_k0", 10.0), ("triton_x", 3.0), ("st_k1", 4.0), ("st_k0", 12.0), ("zfill", 1.0), ("st_k1", 6.0)]
    assert fr.per_launch_us(ev, ["st_k0", "st_k1"], 2) == [11.0, 5.0]
    assert fr.per_launch_us(ev, ["st_k0", "st_k1"], 3) is None        # another count of calls
    assert fr.per_launch_us(ev, ["st_k1", "st_k0"], 2) is None        # another order: another program
    assert fr.per_launch_us(ev, [], 2) is None


@pytest.mark.slow   # a GPU script's CPU path (about 10 s beside other work): only scripts/ changes touch it
def test_fit_rows_feed_the_refit(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    pytest.importorskip("scipy")
    fr = load("gpu_fit_rows", monkeypatch)
    prog, dev = _program()
    rows = fr.fit_rows("round-test-inference-fp32", "region_ln", "abcdef0123456789", prog, dev,
                       [7.5] * len(prog.launches), commit="c0ffee")
    assert len(rows) == len(prog.launches) >= 1
    r = rows[0]
    assert r["measured_us"] == 7.5 and r["timing"] == "cupti" and r["workload"] == "abcdef012345"
    assert r["label"] == f"region_ln/{prog.launches[0].kernel}" and len(r["source_sha256"]) == 64
    assert r["before_us"] > 0 and "per_access" not in r["kernels"][0] and "unique_bytes" in r["kernels"][0]
    (tmp_path / "fit_rows.jsonl").write_text("".join(json.dumps(dict(x, device=dev.key)) + "\n" for x in rows))
    (tmp_path / "gpu_step.jsonl").write_text(json.dumps(
        {"phase": "regions", "dtype": "fp32", "ours_us": 8.0, "predicted_us": 9.0}) + "\n")
    assert fr.refit(tmp_path, "results/cost-fit-2026-12-07/dataset.json") == 0
    stored = json.loads((ROOT / "results/cost-fit-2026-12-07/dataset.json").read_text())["rows"]
    merged = json.loads((tmp_path / "dataset.json").read_text())
    assert len(merged["rows"]) == len(stored) + len(rows)
    assert "within ±25% 100%" in (tmp_path / "refit.md").read_text()
    assert "round-test-inference-fp32" in (tmp_path / "fit" / "fit.md").read_text()


def test_refit_without_rows_is_one_error_line(monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    fr = load("gpu_fit_rows", monkeypatch)
    assert fr.main(["refit", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("gpu_fit_rows: error: ")


@pytest.mark.slow
def test_round_dry_run_packs_what_finished(tmp_path: Path) -> None:
    """The orchestration on the CPU: regions run, steps are cut by their share (TIMEOUT), peers get
    no time (SKIP); the summary and the packed folder hold every phase that ran."""
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    out = tmp_path / "out"
    # ITERS: the steps phase's timed calls (the CPU regions phase times nothing): so many that the steps
    # phase always outlives its share, however fast the machine
    env = {**os.environ, "DRY_RUN": "1", "OUT": str(out), "WORK": str(tmp_path / "work"), "BUDGET_S": "400",
           "ITERS": "1000000", "PHASES": "setup,launch,regions,steps,peers,refit", "SHARE_STEPS": "20",
           "SHARE_PEERS": "5"}
    res = subprocess.run(["bash", str(ROOT / "scripts" / "gpu_round.sh")], env=env, capture_output=True,
                         text=True, timeout=600)
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]
    assert sorted(p.name for p in out.iterdir()) == ["round.log", "round.tar.gz", "summary.md"]
    summary = (out / "summary.md").read_text()
    assert "DRY RUN on the CPU" in summary
    assert "| regions | ok | 0 |" in summary and "| steps | TIMEOUT | 124 |" in summary
    assert "| peers | SKIP | - | 0 | 5 |" in summary and "| refit | ok | 0 |" in summary
    assert "| bert | inference fp32 | region_" in summary and "nothing to refit" in summary
    assert "| ours us (measured) | Inductor us (measured) | ours / Inductor |" in summary   # the per-region table
    with tarfile.open(out / "round.tar.gz") as tar:
        names = set(tar.getnames())
    (folder,) = {n.split("/")[0] for n in names}
    assert folder.startswith("cpu-dryrun-")
    for f in ("summary.md", "headline.md", "gpu_step.jsonl", "gpu_step.md", "refit.md", "logs/regions.log",
              "logs/steps.log"):
        assert f"{folder}/{f}" in names
    # a second call resumes the first's folder: its rows stay, the new phase's are added
    first = tmp_path / "first.tar.gz"
    (out / "round.tar.gz").rename(first)
    env2 = {**env, "RESUME": str(first), "PHASES": "peers", "SHARE_PEERS": "60", "WORK": str(tmp_path / "work2")}
    res = subprocess.run(["bash", str(ROOT / "scripts" / "gpu_round.sh")], env=env2, capture_output=True,
                         text=True, timeout=600)
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]
    with tarfile.open(out / "round.tar.gz") as tar:
        names2 = set(tar.getnames())
        step_rows = tar.extractfile(f"{folder}/gpu_step.jsonl").read().decode()  # type: ignore[union-attr]
    assert names <= names2 and f"{folder}/gpu_peers.md" in names2
    assert any(n.startswith(f"{folder}/summary-") and n.endswith("-before.md") for n in names2)
    assert '"phase": "regions"' in step_rows
    assert "| peers | ok | 0 |" in (out / "summary.md").read_text()
    env3 = {**env, "RESUME": str(tmp_path / "missing.tar.gz")}
    res = subprocess.run(["bash", str(ROOT / "scripts" / "gpu_round.sh")], env=env3, capture_output=True, text=True)
    assert res.returncode == 2 and "gpu_round: error: RESUME=" in res.stdout + res.stderr


@pytest.mark.slow   # a GPU script's CPU path (about 10 s beside other work): only scripts/ changes touch it
def test_regions_gpu_branch_emits_fit_rows(monkeypatch: pytest.MonkeyPatch) -> None:
    """The regions phase's GPU branch with its inputs and profiler faked (no device: the H200 preset):
    each region's profiled st_* kernels become cost-fit rows when they are its program's launches."""
    torch = pytest.importorskip("torch")
    pytest.importorskip("transformers")
    gr = load("gpu_regions", monkeypatch)
    load("gpu_fit_rows", monkeypatch)
    mx = load("gpu_models", monkeypatch)._matrix()
    monkeypatch.setattr(gr, "region_inputs", lambda torch, module, device: [])
    monkeypatch.setattr(gr, "_profiled", lambda torch, fn, iters: [("st_k0", 6.0)] * iters + [("triton_x", 2.0)])
    model, args = mx.MODELS["gpt2"]()
    rows = gr.regions_case(torch, model.eval(), args, "gpt2", "inference", 3, cpu=False)
    assert rows and all("error" not in r for r in rows)
    assert all(r["ours_us"] == pytest.approx((3 * 6.0 + 2.0) / 3, abs=0.01) for r in rows)
    fits = [f for r in rows for f in r["fit_rows"]]
    assert fits, "no single-launch region matched"
    assert all(f["group"] == "round-gpt2-inference-fp32" and f["measured_us"] == 6.0 and f["timing"] == "cupti"
               and f["device"] == "NVIDIA H200/sm_90" and f["label"].endswith("/st_k0") for f in fits)


class _FakeCuda:
    """``torch.cuda`` as the timing helper uses it: events read a fake device clock (ms) that each
    call advances; an event's time is readable only after a synchronize that followed its record
    (as a real event is complete only then)."""

    def __init__(self) -> None:
        self.clock = 0.0
        self.syncs = 0
        self.log: list[str] = []
        cuda = self

        class Event:
            def __init__(self, enable_timing: bool = False) -> None:
                assert enable_timing
                self.at: float | None = None
                self.synced = False

            def record(self) -> None:
                self.at, self.synced = cuda.clock, False
                cuda.recorded.append(self)

            def elapsed_time(self, end: Any) -> float:
                assert self.synced and end.synced, "read before a synchronize"
                assert self.at is not None and end.at is not None
                return end.at - self.at

        self.Event = Event
        self.recorded: list[Any] = []

    def synchronize(self) -> None:
        self.syncs += 1
        self.log.append("sync")
        for e in self.recorded:
            e.synced = True


def test_one_timing_helper_for_the_gpu_scripts(monkeypatch: pytest.MonkeyPatch) -> None:
    """scripts/gpu_timing.py with a fake ``torch.cuda``: warm-up calls untimed, one synchronize before and
    one after the timed calls (none between them), each call's own device time in microseconds; and the
    scripts' timers go through it."""
    gt = load("gpu_timing", monkeypatch)
    cuda = _FakeCuda()
    n = [0]

    def call() -> None:
        n[0] += 1
        cuda.log.append("call")
        cuda.clock += 0.001 * n[0]   # call k takes k microseconds of (fake) device time
    got = gt.event_times_us(call, 4, warmup=2, cuda=cuda)
    assert got == pytest.approx([3.0, 4.0, 5.0, 6.0])
    assert cuda.log == ["call"] * 2 + ["sync"] + ["call"] * 4 + ["sync"]
    assert gt.median(got) == pytest.approx(4.5)
    host = gt.host_times_us(call, 3, warmup=1)
    assert len(host) == 3 and n[0] == 10 and cuda.syncs == 2   # the wall clock: no event, no synchronize
    # the scripts' timers are the helper's: one fake, three scripts
    torch_like = type("T", (), {"cuda": cuda})()
    gm, gp = load("gpu_models", monkeypatch), load("gpu_peers", monkeypatch)
    n[0] = 0
    assert gm._median_us(torch_like, call, 3) == pytest.approx(5.0)   # calls 4..6 after 3 warm-ups
    n[0] = 0
    assert gp._times(torch_like, call, 2, cpu=False) == pytest.approx([4.0, 5.0])
    assert len(gp._times(torch_like, call, 2, cpu=True)) == 2


# ------------------------------------------------------------------ CHECK=1: every command line, not run
_ROUND_SCRIPTS = ("gpu_launch_check", "gpu_models", "gpu_step", "gpu_peers", "gpu_fit_rows", "gpu_round_report",
                  "gpu_experiments", "gpu_experiments_fit")


def test_every_script_of_the_round_imports_and_answers_help(monkeypatch: pytest.MonkeyPatch,
                                                            capsys: pytest.CaptureFixture[str]) -> None:
    """Each Python script gpu_round.sh runs (the names read from the script) imports on a CPU machine and
    prints its usage for ``--help``, exit 0; a stray option is exit 2."""
    import re

    named = set(re.findall(r"scripts/(gpu_\w+)\.py", (ROOT / "scripts" / "gpu_round.sh").read_text()))
    assert named == set(_ROUND_SCRIPTS), named
    for name in _ROUND_SCRIPTS:
        mod = load(name, monkeypatch)
        for argv, want in ((["--help"], 0), (["--no-such-option"], 2)):
            try:
                rc = mod.main(argv)
            except SystemExit as exc:   # gpu_models lets argparse exit
                rc = exc.code
            assert rc == want, (name, argv, rc)
        assert "usage:" in capsys.readouterr().out, name


def test_options_only_validates_the_gpu_command_lines_without_a_gpu(monkeypatch: pytest.MonkeyPatch,
                                                                     capsys: pytest.CaptureFixture[str]) -> None:
    """Under ``GPU_ROUND_CHECK=1`` a GPU command line (no ``--cpu``) is validated as on a GPU and not run:
    'options ok' and 0; a bad model, phase or dtype is still exit 2."""
    pytest.importorskip("torch")
    monkeypatch.setenv("GPU_ROUND_CHECK", "1")
    step, peers, models = (load(n, monkeypatch) for n in ("gpu_step", "gpu_peers", "gpu_models"))
    assert step.main(["--out", "/nonexistent/x", "--phases", "regions", "--models", "bert", "--dtypes", "bf16"]) == 0
    assert peers.main(["--out", "/nonexistent/x", "--dtypes", "fp32,bf16"]) == 0
    assert models.main(["--out", "/nonexistent/x", "--phases", "tuned", "--tune-models", "bert"]) == 0
    assert capsys.readouterr().out.count("options ok") == 3
    assert step.main(["--models", "nosuch"]) == 2 and step.main(["--phases", "region"]) == 2
    assert peers.main(["--dtypes", "fp8"]) == 2 and models.main(["--phases", "tune"]) == 2
    assert not Path("/nonexistent/x").exists()


@pytest.mark.slow   # about 80 s: every phase imports torch once; the experiments are built and emulated
def test_round_check_mode_checks_every_phase(tmp_path: Path) -> None:
    """``CHECK=1``: every phase ok, the Python ones each saying 'options ok', setup and info syntax-checked
    only; a bad option (MODELS=nosuch) fails its phases with rc 2 and the scripts' own error line."""
    pytest.importorskip("torch")
    env = {**os.environ, "CHECK": "1", "OUT": str(tmp_path / "out"), "WORK": str(tmp_path / "work")}
    res = subprocess.run(["bash", str(ROOT / "scripts" / "gpu_round.sh")], env=env, capture_output=True, text=True,
                         timeout=600)
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]
    summary = (tmp_path / "out" / "summary.md").read_text()
    assert "CHECK: command lines checked" in summary
    for phase in ("setup", "info", "launch", "check", "regions", "steps", "tuned", "decode", "peers", "refit"):
        assert f"| {phase} | ok | 0 |" in summary, phase
        log = next((tmp_path / "work").glob(f"cpu-check-*/logs/{phase}.log")).read_text()
        assert ("options ok" in log) != (phase in ("setup", "info")), (phase, log)
    # the experiments are built and emulated, not only their options checked (scripts/gpu_experiments.py --check)
    assert "| experiments | ok | 0 |" in summary
    log = next((tmp_path / "work").glob("cpu-check-*/logs/experiments.log")).read_text()
    assert re.search(r"gpu_experiments --check: (\d+) of \1 ok", log) and "## Schedule rules A/B" in log, log[-2000:]
    env2 = {**env, "MODELS": "nosuch", "PHASES": "regions,peers", "WORK": str(tmp_path / "work2")}
    res = subprocess.run(["bash", str(ROOT / "scripts" / "gpu_round.sh")], env=env2, capture_output=True, text=True,
                         timeout=600)
    summary = (tmp_path / "out" / "summary.md").read_text()
    assert "| regions | FAIL | 2 |" in summary and "| peers | ok | 0 |" in summary, summary
    assert "bad options ['nosuch']" in next((tmp_path / "work2").glob("cpu-check-*/logs/regions.log")).read_text()
