"""scripts/gpu_experiments.py without a GPU: its options, its check mode (every kernel built for sm_90 and emulated
against the reference), and scripts/gpu_experiments_fit.py's fits on synthetic rows whose answer is known."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest

from helpers.common import load_script


def _row(exp: str, case: str, params: dict[str, Any], launches: list[dict[str, Any]],
         measured: dict[str, dict[str, float]], **extra: Any) -> dict[str, Any]:
    return {"experiment": exp, "case": case, "params": params, "sm_count": 132, "l2_bytes": 60 * 2**20,
            "copy_gbs": 4000.0, "launches": launches, "measured_us": measured, **extra}


def test_bad_options_are_one_error_line_and_exit_2(monkeypatch: pytest.MonkeyPatch,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    mod = load_script("gpu_experiments", monkeypatch)
    for argv in (["--only", "l2,nosuch"], ["--skip", "l3"], ["--only", "ab", "--skip", "ab"], ["--iters", "0"],
                 ["--check", "--device", "no-such-gpu"]):
        assert mod.main(argv) == 2, argv
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith("gpu_experiments: error: "), (argv, err)


def test_every_case_has_a_legal_schedule_and_the_sweeps_cover_waves() -> None:
    """Pure: each case's schedule at both shapes is one the space accepts; the latency sweep spans a few blocks to
    many waves per SM count, the fixed-total points hold about the same bytes."""
    import sys

    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))
    import gpu_experiment_cases as C

    from stitchtune.hardware.device import get_device

    dev = get_device("h200")
    all_cases = C.cases(dev.sm_count)
    assert len({c.name for c in all_cases}) == len(all_cases)
    for c in all_cases:
        if c.experiment == "l2" and c.params["rows"] > 4096:
            continue   # the same kernels at other sizes (the check mode lowers them all)
        for small in (True, False):
            _, bad = C.schedule_for(c, c.graph(small), dev, small)
            assert not bad, (c.name, small, bad)
    per_block, total = C.latency_grids(dev.sm_count)
    assert min(per_block) < dev.sm_count // 8 and max(per_block) >= 16 * dev.sm_count
    sizes = [c.params["bytes"] for c in all_cases if c.params.get("sweep") == "total"]
    assert max(sizes) / min(sizes) < 1.1


def test_l2_fit_recovers_keep_stream_factor_and_evict_first(monkeypatch: pytest.MonkeyPatch) -> None:
    """Synthetic times made with an LRU of keep 0.4: input bytes served from the L2 cost nothing up to the stream
    limit; the big GEMM evicts half of what was served. The fit gives keep 0.4 (lru beats random), evict 0.5."""
    fit = load_script("gpu_experiments_fit", monkeypatch)
    cap, rate = 60 * 2**20, 3000.0 * 1e3          # bytes, bytes per us at DRAM
    rows = []
    for rows_n in (1024, 4096, 16384, 32768):
        s = rows_n * 768 * 4
        u = 2 * s
        served = min(s, 0.4 * cap)
        tf = u / rate
        t = {"flushed": tf, "clean_read": tf - served / rate, "after_gemm": tf - served / rate,
             "after_big_gemm": tf - 0.5 * served / rate}
        rows.append(_row("l2", f"l2-ew-{rows_n}", {"kind": "ew", "rows": rows_n, "input_bytes": s},
                         [{"unique_bytes": u, "fitted_us": tf}], {k: {"st_k0": v} for k, v in t.items()}))
    out = fit.l2_fit(rows)
    assert out["keep_fits"]["after_gemm/lru"]["keep"] == pytest.approx(0.4)
    assert out["keep_fits"]["after_gemm/lru"]["sse"] < out["keep_fits"]["after_gemm/random"]["sse"]
    assert out["evict_first"] == pytest.approx(0.5)
    assert out["stream_factor"] == pytest.approx(2 * 1024 * 768 * 4 / (2 * 1024 * 768 * 4 / rate - 1024 * 768 * 4 / rate)
                                                 / 4000e3)
    assert out["suggested"].startswith('L2Params("lru", 0.40,')


def test_latency_fit_recovers_the_latency_little_s_law_implies(monkeypatch: pytest.MonkeyPatch) -> None:
    """Times made by t = 2 + bytes / min(0.9 copy, inflight / 650 ns): the fit gives 650 ns back."""
    pytest.importorskip("scipy")
    fit = load_script("gpu_experiments_fit", monkeypatch)
    copy = 4000e3
    rows = []
    for sweep, grids in (("per_block", (4, 16, 66, 132, 264, 528, 1056, 2112)), ("total", (16, 66, 132, 528, 4224))):
        for g in grids:
            b = g * 65536 if sweep == "per_block" else 32 * 2**20
            inflight = 64 * 256 * min(g, 8 * 132)
            t = 2.0 + b / min(0.9 * copy, inflight / 0.65)
            rows.append(_row("latency", f"lat-{sweep}-{g}", {"sweep": sweep, "grid": g},
                             [{"grid": g, "block": 256, "blocks_per_sm": 8, "bytes_in_flight_per_thread": 64,
                               "unique_bytes": b, "fitted_us": t}], {"flushed": {"st_k0": t}}))
    out = fit.latency_fit(rows)
    assert out["latency"]["latency_ns"] == pytest.approx(650, rel=0.02)
    assert out["latency"]["bw_max_x_copy"] == pytest.approx(0.9, rel=0.02)
    small = [p for p in out["points"] if p["grid"] == 4][0]
    assert small["implied_latency_ns"] == pytest.approx(650 * small["t_us"] / (small["t_us"] - 2.0), rel=0.01)   # the launch ramp counted as latency
    assert small["inflight_from"] == "ir"
    # the cubin's bytes in flight (SASS, where the check or the GPU run could read it) win over the IR walk's
    rows[0]["launches"][0]["sass"] = {"bytes_in_flight": 128.0}
    sass = fit.latency_fit(rows)["points"][0]
    assert sass["inflight_from"] == "sass" and sass["implied_latency_ns"] == pytest.approx(2 * small["implied_latency_ns"])


def test_ab_verdicts_follow_same_as_and_score_the_model_order(monkeypatch: pytest.MonkeyPatch) -> None:
    fit = load_script("gpu_experiments_fit", monkeypatch)
    la = lambda us: [{"fitted_us": us, "unique_bytes": 1}]  # noqa: E731
    p = {"question": "rule 5e", "region": "r"}
    rows = [_row("ab", "r/tpb1", p, la(10.0), {"flushed": {"st_k0": 12.0}}),
            _row("ab", "r/tpb2", p, la(8.0), {"flushed": {"st_k0": 15.0}}),
            {"experiment": "ab", "case": "r/heuristic", "params": p, "same_as": "r/tpb2"}]
    (v,) = fit.ab_verdicts(rows)
    assert v["fastest"] == "tpb1" and v["heuristic_over_fastest"] == pytest.approx(15 / 12)
    assert v["model_order_agrees"] == "0/1"


def test_fit_script_writes_its_tables_and_refuses_a_missing_folder(monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
                                                                  capsys: pytest.CaptureFixture[str]) -> None:
    fit = load_script("gpu_experiments_fit", monkeypatch)
    assert fit.main([str(tmp_path / "none")]) == 2
    assert capsys.readouterr().err.startswith("gpu_experiments_fit: error: ")
    (tmp_path / "experiments.jsonl").write_text(json.dumps({"experiment": "ab", "case": "x/heuristic",
                                                            "check": "ok"}) + "\n")
    assert fit.main([str(tmp_path)]) == 0
    assert "no l2 rows" in (tmp_path / "fits.md").read_text()
    assert math.isfinite(len(json.loads((tmp_path / "fits.json").read_text())["ab"]))


@pytest.mark.slow   # about 40 s on 2 cores: 37 emulations, nvcc on 37 sources, the scatter dry run
def test_check_mode_builds_and_emulates_every_kernel(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    mod = load_script("gpu_experiments", monkeypatch)
    monkeypatch.setenv("GPU_ROUND_CHECK", "1")
    assert mod.main(["--out", str(tmp_path)]) == 0
    rows = [json.loads(x) for x in (tmp_path / "experiments.jsonl").read_text().splitlines()]
    assert {r["experiment"] for r in rows} == {"l2", "latency", "ab", "scatter"}
    assert all(r["check"] == "ok" for r in rows), [r for r in rows if r["check"] != "ok"]
    from stitchtune.gpu.build import nvcc_found

    if nvcc_found():
        assert all(r["nvcc"] == "ok" and r["registers"] for r in rows if r["experiment"] != "scatter")
        from stitchtune.gpu.sass import find_cuobjdump

        if find_cuobjdump():   # the latency sweep's loads in flight as compiled (the IR walk says one 16 B load)
            lat = [la for r in rows if r["experiment"] == "latency" for la in r["launches"]]
            assert all(la["sass"]["bytes_in_flight"] >= 16 for la in lat)
    assert "measures nothing" in (tmp_path / "experiments.md").read_text()


class _FakeTensor:
    def __init__(self, log: list[str], name: str, shape: tuple[int, ...] = (8, 768)) -> None:
        self.log, self.name, self.shape = log, name, shape

    def zero_(self) -> None:
        self.log.append(f"zero {self.name}")

    def sum(self) -> None:
        self.log.append(f"read {self.name}")

    def numel(self) -> int:
        return math.prod(self.shape)

    def view(self, *shape: int) -> _FakeTensor:
        return self

    def __getitem__(self, key: Any) -> _FakeTensor:
        return self

    def __truediv__(self, other: Any) -> _FakeTensor:
        return self


class _FakeTorch:
    uint8 = "uint8"

    def __init__(self) -> None:
        self.log: list[str] = []

    def empty(self, *shape: Any, **kw: Any) -> _FakeTensor:
        return _FakeTensor(self.log, f"empty{len(self.log)}")

    def randn(self, *shape: Any, **kw: Any) -> _FakeTensor:
        return _FakeTensor(self.log, "randn", tuple(shape))

    def matmul(self, a: Any, b: Any, out: Any) -> None:
        self.log.append(f"gemm -> {out.name}")


def test_the_timing_protocols_set_up_the_l2_as_documented(monkeypatch: pytest.MonkeyPatch) -> None:
    """Before every call: the flush; clean_read then reads every input; after_gemm has a GEMM write the kernel's
    input; after_big_gemm adds the GEMM over the big operand (written to its own output, not an input)."""
    from stitchtune.hardware.device import get_device

    mod = load_script("gpu_experiments", monkeypatch)
    torch = _FakeTorch()
    timer = mod.Timer(torch, get_device("h200"))
    flush = timer.flush.name
    args = {"x": _FakeTensor(torch.log, "x"), "g": _FakeTensor(torch.log, "g", (768,))}
    want = {"flushed": [f"zero {flush}"], "clean_read": [f"zero {flush}", "read x", "read g"],
            "after_gemm": [f"zero {flush}", "gemm -> x"],
            "after_big_gemm": [f"zero {flush}", "gemm -> x", f"gemm -> {timer.big[2].name}"]}
    for protocol, steps in want.items():
        torch.log.clear()
        timer.prelude(protocol, args, "x", _FakeTensor(torch.log, "a"))
        assert torch.log == steps, protocol
    assert timer.big[2].name != "x"


def _fake_gpu(mod: Any, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The GPU path with its GPU parts faked: the H200 description, no nvcc, each launch 'measured' at 1 us per
    protocol; returns the list of the cases the fake timer timed."""
    from stitchtune.hardware.device import get_device

    timed: list[str] = []

    class FakeTimer:
        def __init__(self, torch: Any, device: Any) -> None:
            self.torch = torch

        def time(self, cg: Any, args: Any, protocol: str, gemm_input: Any, iters: int) -> dict[str, float]:
            timed.append(cg.graph.name)
            return {la.kernel: 1.0 for la in cg.program.launches}

    monkeypatch.setattr(mod, "_cuda_torch", lambda: object())
    monkeypatch.setattr(mod, "_gpu_device", lambda: get_device("h200"))
    monkeypatch.setattr(mod, "build_all", lambda sources, arch: [])
    monkeypatch.setattr(mod, "_gpu_inputs", lambda torch, g: {})
    monkeypatch.setattr(mod, "Timer", FakeTimer)
    return timed


def test_gpu_path_times_each_distinct_kernel_once_and_writes_fit_rows(monkeypatch: pytest.MonkeyPatch,
                                                                      tmp_path: Path) -> None:
    """The A/B experiment with the GPU faked: a variant equal to the heuristic is a ``same_as`` row (timed once),
    every other case a row with its launches and measured times; the flushed times become cost-fit rows of group
    ``exp-ab`` in ``--fit-rows``; the fit script reads the folder."""
    mod = load_script("gpu_experiments", monkeypatch)
    timed = _fake_gpu(mod, monkeypatch)
    fit_rows = tmp_path / "round_fit_rows.jsonl"
    assert mod.main(["--out", str(tmp_path), "--only", "ab", "--fit-rows", str(fit_rows)]) == 0
    rows = {r["case"]: r for r in map(json.loads, (tmp_path / "experiments.jsonl").read_text().splitlines())}
    assert len(rows) == 22
    same = {k: r["same_as"] for k, r in rows.items() if "same_as" in r}
    assert same == {"gpt2-view_82/tpb2": "gpt2-view_82/heuristic", "bert-view_92/tpb2": "bert-view_92/heuristic",
                    "bert-view_50/kernel": "bert-view_50/heuristic", "bert-view_59/rv1": "bert-view_59/heuristic"}
    assert len(timed) == 18   # llama-view_102/atom: the heuristic's program rendered with atomicAdd, timed too
    ok = [r for r in rows.values() if "measured_us" in r]
    assert all(set(r["measured_us"]["flushed"]) == {la["kernel"] for la in r["launches"]} for r in ok)
    fits = [json.loads(x) for x in fit_rows.read_text().splitlines()]
    fitted = [r for r in ok if r["render"] == "red"]   # the atom arm's features equal the heuristic's: no fit rows
    assert {f["group"] for f in fits} == {"exp-ab"} and len(fits) == sum(len(r["launches"]) for r in fitted)
    assert {f["label"].split("/")[1] for f in fits if f["heuristic"]} == {"heuristic"}
    fit = load_script("gpu_experiments_fit", monkeypatch)
    data, _ = fit.report(list(rows.values()))
    assert {a["region"] for a in data["ab"]} == {"gpt2 view_82", "bert view_92", "bert view_50", "bert view_59",
                                                 "llama view_68", "llama view_102",
                                                 "bert view_47", "gpt2 view_2"}


def test_gpu_path_out_of_budget_leaves_rows_not_a_crash(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    mod = load_script("gpu_experiments", monkeypatch)
    timed = _fake_gpu(mod, monkeypatch)
    assert mod.main(["--out", str(tmp_path), "--only", "latency", "--budget-s", "0.001"]) == 0
    rows = [json.loads(x) for x in (tmp_path / "experiments.jsonl").read_text().splitlines()]
    assert len(rows) == 16 and all(r.get("skipped") == "budget spent" for r in rows) and not timed
    assert "budget spent" in (tmp_path / "experiments.md").read_text()


def test_fit_rows_into_a_folder_not_made_yet_keep_the_measurements(monkeypatch: pytest.MonkeyPatch,
                                                                   tmp_path: Path) -> None:
    """``--fit-rows`` in a folder that does not exist yet: the folder is made before anything is timed (the
    first append failed inside each case's try, so every measured case became an error row)."""
    mod = load_script("gpu_experiments", monkeypatch)
    _fake_gpu(mod, monkeypatch)
    fit_rows = tmp_path / "later" / "fit_rows.jsonl"
    assert mod.main(["--out", str(tmp_path / "out"), "--only", "ab", "--fit-rows", str(fit_rows)]) == 0
    rows = [json.loads(x) for x in (tmp_path / "out" / "experiments.jsonl").read_text().splitlines()]
    assert not [r for r in rows if "error" in r] and fit_rows.read_text()
