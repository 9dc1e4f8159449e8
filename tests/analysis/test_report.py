"""Tests of stitchtune.analysis.report and `stitchtune report` on synthetic tuning databases.

The databases are made by ``scripts/make_demo_db.py --synthetic`` (made-up rows, labelled synthetic):
no search runs here, so these tests take seconds; one test reports on the committed H200 database
(``results/h200-2026-11-29``).
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from matplotlib.image import imread
from scipy.stats import spearmanr

from stitchtune.analysis import report
from stitchtune.cli import main
from stitchtune.tune.database import TuningDB, read_db
from stitchtune.errors import DatabaseError
from helpers.common import COMMITTED_DB

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def demo_db(tmp_path_factory, demo_db_script) -> Path:
    db = tmp_path_factory.mktemp("db")
    demo_db_script.write_synthetic(db, seed=1, trials=12, fake_measured=True)
    return db


@pytest.fixture(scope="module")
def cli_report(demo_db, tmp_path_factory, demo_db_script):
    """`stitchtune report` on the demo DB plus a bench CSV: (exit code, output dir)."""
    out = tmp_path_factory.mktemp("report")
    bench = demo_db_script.write_synthetic_bench(demo_db)
    try:
        rc = main(["report", "--db", str(demo_db), "-o", str(out), "--graphs"])
    finally:
        bench.unlink()
    return rc, out


def _rows(times, predicted=None, estimated=False, heuristic_index=0, **extra):
    n = len(times)
    return pd.DataFrame({
        "workload_key": "k" * 8, "graph_name": "g", "shapes": json.dumps({"x": [4, 8]}),
        "device_name": "NVIDIA H200", "backend": "emulate" if estimated else "cuda", "estimated": estimated,
        "status": "ok", "measured_us": times, "predicted_us": predicted if predicted is not None else times,
        "occupancy": np.linspace(0.25, 1.0, n), "study": "s", "sampler": "tpe", "trial_number": range(n),
        "heuristic": [i == heuristic_index for i in range(n)], "schedule_key": [f"s{i}" for i in range(n)],
        **extra,
    })


def assert_nonblank(pngs) -> None:
    """Each PNG is a real picture: not tiny, and its pixels vary (a blank canvas has std ~0)."""
    assert pngs
    for p in pngs:
        img = imread(p)
        assert img.shape[0] > 200 and img.shape[1] > 300, p.name
        assert float(img[..., :3].std()) > 0.05, f"{p.name} looks blank"


# ---------------------------------------------------------------------------------------------- CLI
@pytest.mark.slow
def test_report_on_the_committed_database(tmp_path):
    """The committed H200 database renders (slow: ~9 CPU-s of matplotlib; the quick suite renders every
    figure from the synthetic database in ``cli_report``)."""
    assert (COMMITTED_DB / "optuna.journal").is_file() and list(COMMITTED_DB.glob("part-*.parquet"))
    assert main(["report", "--db", str(COMMITTED_DB), "-o", str(tmp_path)]) == 0
    assert_nonblank(sorted(tmp_path.glob("*.png")))
    assert "| workload | device | backend |" in (tmp_path / "report.md").read_text()


def test_cli_report_writes_nonblank_pngs_and_table(cli_report, demo_db):
    rc, out = cli_report
    assert rc == 0
    pngs = sorted(out.glob("*.png"))
    names = {p.name for p in pngs}
    for want in ("best_so_far.png", "predicted_vs_measured.png", "param_importances.png",
                 "time_vs_occupancy.png", "status.png", "floor_fraction.png", "speedup_over_peers.png"):
        assert want in names
    assert any(n.startswith("schedule_dims_") for n in names)
    assert any(n.startswith("heuristic_rank_") for n in names)
    assert_nonblank(pngs)
    md = (out / "report.md").read_text()
    assert "| workload | device | backend | trials | ok | best (µs)" in md
    runs = report.prepare(read_db(demo_db))["run"].nunique()
    lines = md.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("| workload | device | backend"))
    table = lines[start + 2: lines.index("", start)]
    assert len(table) == runs == 6
    assert all(line.startswith(r"| synthetic\_") and line.count("|") == 12 for line in table)
    assert report.ESTIMATED_NOTE in md
    assert "## Benchmark (measured" in md and r"torch\_eager" in md
    for p in pngs:  # every figure is linked from the summary
        assert f"({p.name})" in md


def test_cli_report_user_errors_exit_2(tmp_path, capsys):
    assert main(["report", "--db", str(tmp_path / "missing"), "-o", str(tmp_path / "o")]) == 2
    assert main(["report", "--db", str(tmp_path), "-o", str(tmp_path / "o")]) == 2  # exists, no trials
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 2 and all(line.startswith("stitchtune: error: ") for line in err)
    assert "no such tuning database directory" in err[0] and "no trials" in err[1]


def test_bad_bench_csv_is_a_user_error(demo_db, tmp_path, capsys):
    bad = tmp_path / "bench_x.csv"
    bad.write_text("workload,median_us\nfoo,1.0\n")
    assert main(["report", "--db", str(demo_db), "-o", str(tmp_path / "o"), "--bench", str(bad),
                 "--graphs"]) == 2
    assert "lacks columns: system" in capsys.readouterr().err


# ---------------------------------------------------------------------------------------------- figures
def _texts(fig) -> str:
    parts = [fig.get_suptitle()]
    for ax in fig.axes:
        parts += [ax.get_title(), ax.get_xlabel(), ax.get_ylabel()] + [t.get_text() for t in ax.texts]
        leg = ax.get_legend()
        if leg is not None:
            parts += [t.get_text() for t in leg.get_texts()]
    return "\n".join(parts)


def test_every_figure_has_title_and_labelled_axes_and_marks_estimates():
    df = _rows([5.0, 4.0, 3.0, 6.0, 2.0, 7.0, 8.0, 9.0, 2.5], estimated=True,
               p_tpr=[32, 8, 16, 32, 64, 8, 16, 32, 64], p_scheme_0=["regional", "local"] * 4 + ["global"])
    d = report.prepare(df)
    figs = [report.figure_best_so_far(d), report.figure_predicted_vs_measured(d),
            report.figure_param_importances(d), report.figure_time_vs_occupancy(d),
            report.figure_floor_fraction(d), report.figure_schedule_dimensions(d),
            report.figure_heuristic_rank(d)]
    for fig in figs:
        assert fig.get_suptitle(), fig
        assert report.ESTIMATED_NOTE in fig.get_suptitle()
        for ax in fig.axes:
            if ax.get_visible():
                assert ax.get_xlabel() and ax.get_ylabel(), fig.get_suptitle()
    # with only estimated rows, predicted-vs-measured explains why it is empty
    assert "estimated" in _texts(figs[1]) and "GPU" in _texts(figs[1])
    # measured rows: no estimated note
    fig = report.figure_best_so_far(_rows([3.0, 2.0, 1.0]))
    assert "estimated" not in fig.get_suptitle()
    assert report.figure_status(d).get_suptitle() == "Trials by status"


def test_units_on_axes():
    d = report.prepare(_rows([3.0, 2.0, 1.0, 4.0]))
    assert "(µs)" in report.figure_best_so_far(d).axes[0].get_ylabel()
    assert "(µs)" in report.figure_predicted_vs_measured(d).axes[0].get_xlabel()
    assert "(%)" in report.figure_time_vs_occupancy(d).axes[0].get_xlabel()
    assert "(count)" in report.figure_status(d).axes[0].get_xlabel()


def test_best_so_far_is_the_running_minimum_and_skips_failed_trials():
    df = _rows([5.0, 4.0, 6.0, 3.0, 7.0])
    df.loc[2, "status"] = "compile_error"
    df.loc[2, "measured_us"] = None
    ax = report.figure_best_so_far(df).axes[0]
    (line,) = ax.get_lines()
    assert list(line.get_ydata()) == [5.0, 4.0, 4.0, 3.0, 3.0]


def test_spearman_per_workload():
    meas = [1.0, 2.0, 3.0, 4.0, 5.0]
    assert report.spearman(report.prepare(_rows(meas, predicted=[10.0, 20.0, 30.0, 40.0, 50.0]))) == pytest.approx(1.0)
    assert report.spearman(report.prepare(_rows(meas, predicted=[5.0, 4.0, 3.0, 2.0, 1.0]))) == pytest.approx(-1.0)
    assert math.isnan(report.spearman(report.prepare(_rows([1.0, 2.0]))))
    pred = [1.0, 3.0, 2.0, 5.0, 4.0]
    d = report.prepare(_rows(meas, predicted=pred))
    rho = report.summary_table(d)["spearman"].iloc[0]
    assert rho == pytest.approx(spearmanr(pred, meas).statistic)
    assert "ρ=0.80" in _texts(report.figure_predicted_vs_measured(d))


def test_param_importances_from_rows():
    rng = np.random.default_rng(0)
    n = 40
    vec = rng.choice([1, 2, 4], n)
    scheme = rng.choice(["local", "regional", "global"], n)
    noise = rng.choice([64, 128, 256], n)
    t = 10.0 / vec + np.where(scheme == "global", 20.0, 0.0) + 0.01 * rng.random(n)
    d = report.prepare(_rows(list(t), p_vec=vec, p_scheme_0=scheme, p_block=noise,
                             p_fixed=[7] * n, p_cond=[float(i % 4) if i % 2 else None for i in range(n)]))
    imp = report.param_importances(d)
    assert isinstance(imp, dict)
    assert set(imp) == {"vec", "scheme_0", "block", "cond"}   # p_fixed has one value: not a parameter
    assert sum(imp.values()) == pytest.approx(1.0)
    assert max(imp, key=imp.get) in ("vec", "scheme_0")
    few = report.param_importances(report.prepare(_rows([1.0, 2.0, 3.0], p_vec=[1, 2, 4])))
    assert isinstance(few, str) and few.startswith("not enough trials")
    assert "not enough trials" in _texts(report.figure_param_importances(report.prepare(_rows([1.0, 2.0]))))


def test_heuristic_rank_counts_distinct_schedules():
    df = _rows([5.0, 1.0, 2.0, 9.0, 8.0, 1.5], heuristic_index=2)
    df.loc[5, "schedule_key"] = "s1"          # a second run of schedule s1: counted once
    rank, n, ht, best = report.heuristic_rank(report.prepare(df))
    assert (rank, n, ht, best) == (2, 5, 2.0, 1.0)
    row = report.summary_table(report.prepare(df)).iloc[0]
    assert row["heuristic_rank"] == "2/5" and row["speedup_vs_heuristic"] == 2.0
    # without a heuristic flag column, trial 0 of each study is the heuristic
    d = report.prepare(_rows([3.0, 1.0, 2.0]).drop(columns="heuristic"))
    assert d["is_heuristic"].tolist() == [True, False, False]
    assert "rank 3 of 3" in _texts(report.figure_heuristic_rank(d))


def test_floor_from_min_bytes_and_bandwidth_and_device_preset():
    d = report.prepare(_rows([10.0, 20.0], min_bytes=[4_000_000, 4_000_000]))
    fl = report.floors(d, bandwidth_gbs=2000.0)
    assert fl.iloc[0] == pytest.approx(2.0)                  # 4e6 B / 2000 GB/s = 2 µs
    assert report.summary_table(d, fl)["fraction_of_floor"].iloc[0] == pytest.approx(0.2)
    from stitchtune.hardware.device import get_device

    bw = get_device("NVIDIA H200").effective_copy_bandwidth_gbs()
    assert report.floors(d).iloc[0] == pytest.approx(4e6 / (bw * 1e3))
    assert math.isnan(report.floors(report.prepare(_rows([1.0]))).iloc[0])   # no bytes known
    assert "floor unknown" in _texts(report.figure_floor_fraction(report.prepare(_rows([1.0]))))


def test_min_bytes_from_example_graphs():
    from stitchtune.graph.parse import load_graph

    path = REPO / "examples" / "layernorm_small.json"
    g = load_graph(path)
    got = report.min_bytes_from_graphs([path, REPO / "examples" / "missing.json"])
    assert got == {g.workload_key(): g.min_bytes()}


def test_schedule_dimensions_cover_the_search_space_names():
    df = _rows([1.0, 2.0, 3.0, 4.0], p_tpr=[32, 8, 32, 8], p_block=[128, 128, 256, 256], p_vec=[4, 2, 4, 1],
               p_scheme_0=["regional", "global", "regional", "local"],
               p_reuse_0=["register", "shared", "register", "recompute"], p_split=[1, 1, 1, 1])
    d = report.prepare(df)
    labels = [label for label, _ in report.dimension_columns(d)]
    assert labels[:5] == ["scheme", "threads per row", "rows per block", "vector width", "reuse level"]
    assert "task splitting" not in labels                  # one value only
    assert d["rows_per_block"].tolist() == [4, 16, 8, 32]
    assert len(report.figure_schedule_dimensions(d, "g").axes) >= 5
    with pytest.raises(DatabaseError, match="no workload"):
        report.figure_schedule_dimensions(d, "nope")


def test_hostile_names_are_escaped(tmp_path):
    df = _rows([2.0, 1.0, 3.0], estimated=False)
    df["graph_name"] = "_a$b|c\n`x`"
    TuningDB(tmp_path / "db").append(df.to_dict("records"))
    out = report.write_report(tmp_path / "db", tmp_path / "out", graph_paths=[])
    md = (tmp_path / "out" / "report.md").read_text()
    assert r"a$b\|c?\`x\`" in md
    assert all(p.exists() and p.parent == tmp_path / "out" for p in out)
    assert all("|" not in p.name and "$" not in p.name for p in out)


def test_speedup_over_peers_figure(tmp_path):
    p = tmp_path / "bench_h200.csv"
    pd.DataFrame([
        {"workload": "a", "system": "stitchtune", "median_us": 10.0},
        {"workload": "a", "system": "torch_eager", "median_us": 40.0},
        {"workload": "a", "system": "jax_jit", "median_us": 20.0, "checked": True},
        {"workload": "b", "system": "stitchtune", "median_us": 5.0},
        {"workload": "b", "system": "torch_eager", "median_us": 5.0},
        {"workload": "b", "system": "jax_jit", "median_us": 99.0, "checked": False},
    ]).to_csv(p, index=False)
    bench = report.read_bench([p])
    assert set(bench["device"]) == {"h200"}
    fig = report.figure_speedup_over_peers(bench)
    heights = sorted(round(b.get_height(), 3) for b in fig.axes[0].patches if np.isfinite(b.get_height()))
    assert heights == [1.0, 2.0, 4.0]                     # the unchecked jax row on b is left out
    assert "measured" in fig.get_suptitle()
    assert "no benchmark" in _texts(report.figure_speedup_over_peers(None))


def test_a_second_bench_run_is_the_same_device_and_its_own_baseline(tmp_path, demo_db):
    """``bench_h200_inductor_max.csv`` next to ``bench_h200.csv`` is another run on the h200 (not a device
    named "h200_inductor_max"); each peer is compared with the stitchtune row of its own run; the axis is
    logarithmic and the closest peer comes first, each named in full."""
    main_run, second = tmp_path / "bench_h200.csv", tmp_path / "bench_h200_inductor_max.csv"
    pd.DataFrame([
        {"workload": "a", "system": "stitchtune", "median_us": 10.0},
        {"workload": "a", "system": "torch_eager", "median_us": 130.0},
        {"workload": "a", "system": "jax_jit", "median_us": 11.0},
    ]).to_csv(main_run, index=False)
    pd.DataFrame([
        {"workload": "a", "system": "stitchtune", "median_us": 12.0},
        {"workload": "a", "system": "torch_compile_max_autotune_no_cudagraphs", "median_us": 9.0},
    ]).to_csv(second, index=False)
    bench = report.read_bench([main_run, second])
    assert set(bench["device"]) == {"h200"} and set(bench["run"]) == {"h200", "h200_inductor_max"}
    sp = report.peer_speedups(bench)
    assert list(sp.index) == ["a"]                                 # no "a @ h200_inductor_max"
    assert sp.loc["a", "torch_compile_max_autotune_no_cudagraphs"] == pytest.approx(9.0 / 12.0)
    assert sp.loc["a", "torch_eager"] == pytest.approx(13.0)
    fig = report.figure_speedup_over_peers(bench)
    ax = fig.axes[0]
    assert ax.get_yscale() == "log"
    labels = [t.get_text() for t in fig.legends[0].get_texts()]
    assert labels[0].startswith("vs torch.compile max-autotune (no CUDA graphs) (geomean 0.75×")
    assert labels[-1].startswith("vs PyTorch eager (geomean 13.00×")
    fig.savefig(tmp_path / "speedup.png")
    d = report.prepare(read_db(demo_db))
    md = report._markdown(d, report.floors(d, bench, None, {}), bench, [])   # report.md without the figures
    assert r"| h200 (run h200\_inductor\_max) |" in md and r"| h200\_inductor\_max |" not in md


def test_floor_prefers_the_bench_csv_of_the_same_device(tmp_path):
    p1, p2 = tmp_path / "bench_nvidia_h200.csv", tmp_path / "bench_a100.csv"
    pd.DataFrame([{"workload": "g", "system": "stitchtune", "median_us": 9.0, "floor_us": 6.0}]).to_csv(p1)
    pd.DataFrame([{"workload": "g", "system": "stitchtune", "median_us": 9.0, "floor_us": 12.0}]).to_csv(p2)
    d = report.prepare(_rows([10.0, 20.0], min_bytes=[4_000_000, 4_000_000]))
    assert report.floors(d, report.read_bench([p1, p2]), bandwidth_gbs=2000.0).iloc[0] == 6.0


def test_min_bytes_from_db_shapes_matches_graph_min_bytes(full_examples, small_examples):
    from stitchtune.hardware.device import get_device
    from stitchtune.graph.parse import load_graph
    from stitchtune.tune.pipeline import context_row

    dev = get_device("h200")
    for path in full_examples + small_examples:
        g = load_graph(path)
        row = context_row(g, dev)
        # the cells do not say which inputs are gathered: a gathered table counts whole (an upper bound)
        assert report.min_bytes_from_shapes(row["shapes"], row["dtypes"]) == g.io_bytes() >= g.min_bytes(), path.name
    assert report.min_bytes_from_shapes("not json", "{}") is None


def test_best_so_far_gives_single_trial_runs_no_empty_panel():
    """Issue 42: a 1-trial run drew an empty panel; now it is counted in the title instead."""
    one = _rows([5.0]).assign(workload_key="one", graph_name="single", study="s1")
    many = _rows([3.0, 2.0, 1.0])
    fig = report.figure_best_so_far(pd.concat([one, many], ignore_index=True))
    shown = [ax for ax in fig.axes if ax.get_visible()]
    assert len(shown) == 1 and shown[0].get_lines() and "single" not in shown[0].get_title()
    assert "1 single-trial workload(s) not shown" in fig.get_suptitle()
    only = report.figure_best_so_far(one)
    assert "single trial" in _texts(only) and "1 single-trial" in only.get_suptitle()
