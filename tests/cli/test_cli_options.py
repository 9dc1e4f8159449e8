"""The command line is spelled one way: a description per subcommand, help per option, ``-o/--out``
everywhere (old spellings accepted, not shown), ``--db`` checked alike in every command, output paths
checked before any work, ``run --inputs`` repeatable and combinable with ``--random-inputs``."""

from __future__ import annotations

import argparse
import contextlib
import io
import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from stitchtune import cli
from stitchtune.cli import checks
from stitchtune.tune.summary import format_best_table
from helpers.cli import call_cli as call
from helpers.common import COMMITTED_DB, EXAMPLES_DIR

G = str(EXAMPLES_DIR / "layernorm_small.json")


def _commands(parser: argparse.ArgumentParser, prefix: tuple[str, ...] = ()):
    subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    if not subs:
        yield prefix, parser
    else:
        for name, sp in subs[0].choices.items():
            yield from _commands(sp, (*prefix, name))


COMMANDS = dict(_commands(cli.build_parser()))


def _help(command: tuple[str, ...]) -> str:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert cli.main([*command, "--help"]) == 0
    return out.getvalue()


@pytest.mark.parametrize("command", sorted(COMMANDS), ids=lambda c: "-".join(c))
def test_every_command_has_a_description_and_every_argument_help(command: tuple[str, ...]) -> None:
    parser = COMMANDS[command]
    assert parser.description and parser.description.endswith("."), command
    for a in parser._actions:
        assert a.help, (command, a.option_strings or a.dest)
    text = _help(command)
    assert parser.description.split()[0] in text
    for old in ("--output", "--csv"):   # hidden aliases: accepted, not shown
        assert old not in text


def test_graph_argument_and_out_option_are_spelled_alike() -> None:
    for command, parser in COMMANDS.items():
        for a in parser._actions:
            if a.dest in ("graph", "graphs") and not a.option_strings:
                assert a.metavar == "GRAPH", command
            if a.dest == "out":
                assert a.option_strings[:2] == ["-o", "--out"], command


def test_old_spellings_still_work(tmp_path: Path) -> None:
    rc, _out, err = call(["export", "--db", str(COMMITTED_DB), "--csv", str(tmp_path / "a.csv")])
    assert rc == 0, err
    rc, _out, err = call(["export", "--db", str(COMMITTED_DB), "-o", str(tmp_path / "b.csv")])
    assert rc == 0, err
    assert (tmp_path / "a.csv").read_bytes() == (tmp_path / "b.csv").read_bytes()
    args = cli.build_parser().parse_args(["import", "onnx", "m.onnx", "--output", "d"])
    assert args.out == "d"


DB_KINDS = {("show",): checks.db_read, ("export",): checks.db_read, ("report",): checks.db_read,
            ("model-check",): checks.db_read, ("calibrate",): checks.db_update, ("compile",): checks.db_maybe,
            ("run",): checks.db_maybe, ("search",): checks.db_write, ("tune",): checks.db_write,
            ("bench",): checks.db_write}


def test_every_db_option_is_checked_as_declared() -> None:
    declared = {}
    for command, parser in COMMANDS.items():
        for dest, flag, kind in parser.get_default("_path_checks") or ():
            if dest == "db":
                declared[command] = kind
                assert flag == "--db"
    assert declared == DB_KINDS


ARGV = {"show": [], "export": ["-o", "{t}/x.csv"], "report": ["-o", "{t}/r"], "model-check": [], "calibrate": [],
        "compile": [G, "--no-cubin", "-o", "{t}/c"], "run": [G, "--random-inputs", "0", "--out", "{t}/o.npz"],
        "search": [G, "--trials", "1"], "tune": ["m:f", "--shapes", "x=2"], "bench": [G]}


@pytest.mark.parametrize("command", sorted(ARGV))
def test_a_file_as_db_is_one_error_line_in_every_command(command: str, tmp_path: Path) -> None:
    (tmp_path / "f").write_text("x")
    argv = [command, *(a.replace("{t}", str(tmp_path)) for a in ARGV[command]), "--db", str(tmp_path / "f")]
    rc, out, err = call(argv)
    assert rc == 2 and out == ""
    assert err.splitlines() == [f"stitchtune: error: --db {str(tmp_path / 'f')!a}: is a file, not a tuning database "
                                "directory"]
    missing = [command, *(a.replace("{t}", str(tmp_path)) for a in ARGV[command]), "--db", str(tmp_path / "none")]
    if DB_KINDS[(command,)] in (checks.db_read, checks.db_update):
        rc, _out, err = call(missing)
        assert rc == 2 and "no such tuning database directory" in err and len(err.splitlines()) == 1


def test_outputs_are_checked_before_the_work(tmp_path: Path) -> None:
    (tmp_path / "README.md").write_text("mine")
    rc, out, err = call(["report", "--db", str(COMMITTED_DB), "-o", str(tmp_path / "README.md")])
    assert rc == 2 and out == "" and "is a file, not a directory" in err
    assert (tmp_path / "README.md").read_text() == "mine"
    rc, _out, err = call(["compile", G, "--no-cubin", "-o", str(tmp_path / "README.md" / "sub")])
    assert rc == 2 and "is not a directory" in err
    rc, _out, err = call(["run", G, "--random-inputs", "0", "--out", str(tmp_path)])
    assert rc == 2 and "is a directory, not a file" in err


def test_an_output_that_is_an_input_is_refused_before_any_work(tmp_path: Path) -> None:
    """Was: `run G --out G` replaced the graph with its outputs (exit 0). The same file by another spelling,
    a symlink or a hard link is refused too; so is `import torch m.py:f -o m.py` (the user's model)."""
    g = tmp_path / "g.json"
    g.write_bytes(Path(G).read_bytes())
    (tmp_path / "link.json").symlink_to(g)
    (tmp_path / "hard.json").hardlink_to(g)
    for out in (g, tmp_path / "." / "g.json", tmp_path / "link.json", tmp_path / "hard.json"):
        rc, stdout, err = call(["run", str(g), "--random-inputs", "0", "--out", str(out)])
        assert rc == 2 and stdout == "" and len(err.splitlines()) == 1, (out, err)
        assert "is also the input GRAPH" in err
    assert g.read_bytes() == Path(G).read_bytes()
    np.savez(tmp_path / "in.npz", x=np.zeros((256, 1024), np.float32))
    rc, _out, err = call(["run", G, "--inputs", str(tmp_path / "in.npz"), "--random-inputs", "0",
                          "--out", str(tmp_path / "in.npz")])
    assert rc == 2 and "is also the input --inputs" in err
    model = tmp_path / "m.py"
    model.write_text("def f(x):\n    return x * 2.0\n")
    rc, _out, err = call(["import", "torch", f"{model}:f", "--shapes", "x=2x3", "-o", str(model)])
    assert rc == 2 and "is also the input MODULE:CALLABLE" in err and len(err.splitlines()) == 1
    assert model.read_text() == "def f(x):\n    return x * 2.0\n"
    rc, _out, err = call(["import", "torch", f"{model}:f", "--shapes", "x=2x3", "-o", str(tmp_path / "a"),
                          "--params-out", str(tmp_path / "a")])
    assert rc == 2 and "--params-out" in err and "is also the output -o/--out" in err and not (tmp_path / "a").exists()


def test_outputs_go_into_new_folders_whole(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Missing parent folders are created (was: 'cannot write ...: No such file or directory', exit 2); a
    write that fails leaves the old file and no temporary file."""
    from stitchtune.cli.outputs import write_whole
    from stitchtune.errors import StitchtuneError

    rc, _out, err = call(["run", G, "--random-inputs", "0", "--out", str(tmp_path / "new" / "deep" / "o.npz")])
    assert rc == 0, err
    with np.load(tmp_path / "new" / "deep" / "o.npz") as z:
        assert z["y"].shape == (256, 1024)
    rc, _out, err = call(["export", "--db", str(COMMITTED_DB), "-o", str(tmp_path / "csv" / "x.csv")])
    assert rc == 0 and len(pd.read_csv(tmp_path / "csv" / "x.csv")) > 0, err
    old = tmp_path / "old.txt"
    old.write_text("old")

    def half(tmp: str) -> None:
        Path(tmp).write_text("half")
        raise OSError(28, "No space left on device")

    with pytest.raises(StitchtuneError, match="cannot write .*No space left on device"):
        write_whole(str(old), half)
    assert old.read_text() == "old" and sorted(p.name for p in tmp_path.iterdir()) == ["csv", "new", "old.txt"]
    write_whole(str(old), lambda tmp: Path(tmp).write_text("new"))
    assert old.read_text() == "new" and (old.stat().st_mode & 0o777) == 0o666 & ~_umask()


def _umask() -> int:
    import os

    mask = os.umask(0)
    os.umask(mask)
    return mask


def test_run_inputs_repeatable_and_filled_by_random_inputs(tmp_path: Path) -> None:
    from stitchtune.graph.parse import load_graph
    from stitchtune.graph.reference import random_inputs, run_reference

    g = load_graph(G)
    ins = random_inputs(g, 3)
    np.savez(tmp_path / "x.npz", x=ins["x"])
    np.savez(tmp_path / "params.npz", gamma=ins["gamma"], beta=ins["beta"])
    rc, _out, err = call(["run", G, "--inputs", str(tmp_path / "x.npz"), "--inputs", str(tmp_path / "params.npz"),
                          "--out", str(tmp_path / "a.npz")])
    assert rc == 0, err
    with np.load(tmp_path / "a.npz") as z:
        np.testing.assert_array_equal(z["y"], run_reference(g, ins)["y"])
    rc, _out, err = call(["run", G, "--inputs", str(tmp_path / "params.npz"), "--out", str(tmp_path / "b.npz")])
    assert rc == 2 and err.splitlines() == [
        "stitchtune: error: input 'x': missing (expected shape [256, 1024], dtype float32)",
        "stitchtune: error: --random-inputs SEED draws the inputs that no --inputs file has"]
    rc, _out, err = call(["run", G, "--inputs", str(tmp_path / "params.npz"), "--random-inputs", "3",
                          "--out", str(tmp_path / "c.npz")])
    assert rc == 0, err
    with np.load(tmp_path / "c.npz") as z:   # x drawn with seed 3, gamma and beta from the file (the same)
        np.testing.assert_array_equal(z["y"], run_reference(g, ins)["y"])
    rc, _out, err = call(["run", G, "--out", str(tmp_path / "d.npz")])
    assert rc == 2 and "--random-inputs" in err


def test_a_given_schedule_the_device_cannot_run_is_an_error_line(tmp_path: Path) -> None:
    """A grid barrier over 1024 blocks where a T4 holds 640: refused by the resource check, one line."""
    sched = {"block": 64, "combine": "warp", "min_blocks": 2, "reuse": ["shared", "register"],
             "schemes": ["independent", "global"], "split": 8, "tasks_per_block": 2, "tpr": 64, "vec": 1}
    rc, _out, err = call(["run", G, "--random-inputs", "0", "--out", str(tmp_path / "o.npz"), "--backend", "emulate",
                          "--device", "t4", "--schedule", json.dumps(sched)])
    assert rc == 2 and "Traceback" not in err
    # refused before any kernel runs: the space's resource check names the device, the kernel and the limit
    assert err.startswith("stitchtune: error: does not fit Tesla T4: kernel ") and "co-resident" in err
    assert err.count("\n") == 1


@pytest.mark.parametrize("graph", ["layernorm_small.json", "colsum_sigmoid_scale_small.json"])
def test_row_vectors_where_the_plan_cannot_take_them_is_an_error_line(graph: str, tmp_path: Path) -> None:
    """Option row_vectors 1 on a row plan (layer norm) and on a column plan without an input read along its rows:
    one line naming the option as the user wrote it, exit 2, nothing compiled (``compile`` and ``audit``)."""
    (sched,) = [json.loads(line) for line in call(["space", str(EXAMPLES_DIR / graph), "--sample", "1"])[1].splitlines()]
    text = json.dumps({**sched, "row_vectors": 1})
    for argv in (["compile", str(EXAMPLES_DIR / graph), "--no-cubin", "-o", str(tmp_path / "c")],
                 ["audit", str(EXAMPLES_DIR / graph)]):
        rc, _out, err = call([*argv, "--schedule", text])
        assert rc == 2 and err.count("\n") == 1 and "Traceback" not in err, (argv, err)
        assert err.startswith("stitchtune: error: ") and "option row_vectors=1 where it does not apply" in err, err
    assert not (tmp_path / "c").exists()


@pytest.mark.parametrize("text,message", [('{"block": 7}', "missing key 'tpr'"),
                                          ('{"tpr": "x", "block": 7}', "invalid literal")])
def test_malformed_schedule_messages_name_no_exception(text: str, message: str, tmp_path: Path) -> None:
    rc, _out, err = call(["compile", G, "--no-cubin", "-o", str(tmp_path / "c"), "--schedule", text])
    assert rc == 2 and message in err and "Error" not in err


def test_a_misspelt_schedule_key_is_an_error_line_naming_it(tmp_path: Path) -> None:
    """A typo in ``--schedule`` (``"vec4"`` for ``"vec"``) is one error line naming the key, exit 2, in every
    command that takes a schedule (it was ignored: the schedule ran with ``vec`` at its default)."""
    (sched,) = [json.loads(line) for line in call(["space", G, "--sample", "1"])[1].splitlines()]
    text = json.dumps({**sched, "vec4": 4})
    for argv in (["compile", G, "--no-cubin", "-o", str(tmp_path / "c")], ["audit", G],
                 ["run", G, "--random-inputs", "0", "--out", str(tmp_path / "o.npz"), "--backend", "emulate"]):
        rc, _out, err = call([*argv, "--schedule", text])
        assert rc == 2 and err == "stitchtune: error: malformed schedule: unknown key 'vec4' (did you mean 'vec'?)\n", \
            (argv, err)
    assert not (tmp_path / "c").exists() and not (tmp_path / "o.npz").exists()


def test_numbers_out_of_range_are_usage_errors() -> None:
    for argv in (["space", G, "--sample", "9" * 40], ["run", G, "--random-inputs", "-1", "--out", "o.npz"],
                 ["search", G, "--seed", str(2**32)], ["search", G, "--jobs", "100000"]):
        rc, out, err = call(argv)
        assert rc == 2 and out == "" and "Traceback" not in err and ": error: argument " in err, argv


@pytest.mark.parametrize("flag,base,bad", [
    ("--factor", ["model-check", "--db", str(COMMITTED_DB)], ["1", "0.5", "0", "-2", "nan", "inf", "x"]),
    ("--bandwidth-gbs", ["report", "--db", str(COMMITTED_DB), "-o", "{t}/r", "--graphs"], ["0", "-1", "nan", "inf"]),
    ("--timeout", ["search", G, "--trials", "1"], ["0", "-5", "nan"]),
    ("--prune-factor", ["search", G, "--trials", "1"], ["1", "0.5", "inf"])])
def test_bounded_numbers_are_usage_errors_before_any_work(flag: str, base: list[str], bad: list[str],
                                                          tmp_path: Path) -> None:
    """A factor <= 1, a bandwidth or timeout <= 0, NaN or infinity: one argparse error line naming the flag,
    exit 2, nothing written (was: model-check --factor 0.5 or nan printed a verdict on a meaningless rule)."""
    argv = [a.replace("{t}", str(tmp_path)) for a in base]
    for value in bad:
        rc, out, err = call([*argv, flag, value])
        assert rc == 2 and out == "" and "Traceback" not in err, (flag, value, err)
        assert f"error: argument {flag}: " in err.splitlines()[-1], (flag, value, err)
    assert not (tmp_path / "r").exists()


def test_show_names_its_time_column_for_what_it_holds() -> None:
    rows = pd.DataFrame([
        {"graph_name": "a", "workload_key": "k" * 20, "device_key": "d", "backend": "emulate", "measured_us": 1.5,
         "estimated": True, "schedule_key": "s", "study": "x", "trial_number": 0},
        {"graph_name": "b", "workload_key": "j" * 20, "device_key": "d", "backend": "cuda", "measured_us": 2.25,
         "estimated": False, "schedule_key": "t", "study": "y", "trial_number": 1}])
    est_only = format_best_table(rows.iloc[:1]).splitlines()
    assert "estimated_us" in est_only[0] and "measured_us" not in est_only[0] and "1.500" in est_only[1]
    both = format_best_table(rows).splitlines()
    assert both[0].split()[4:6] == ["measured_us", "estimated_us"]
    assert both[1].split()[4:6] == ["-", "1.500"] and both[2].split()[4:6] == ["2.250", "-"]
