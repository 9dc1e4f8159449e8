"""``stitchtune audit``: Markdown and JSON out, a model's regions, and bad input as one error line (exit 2)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from helpers.cli import call_cli as call
from helpers.common import EXAMPLES_DIR

GRAPH = EXAMPLES_DIR / "layernorm_small.json"


def test_audit_of_a_graph_prints_markdown_and_writes_json(tmp_path: Path) -> None:
    rc, out, err = call(["audit", str(GRAPH), "--no-sass", "--no-peer", "--json", str(tmp_path / "a.json")])
    assert rc == 0, err
    assert out.startswith("# Kernel audit") and "nothing here is a measured time" in out
    assert "| layernorm_small |" in out and "`st_k0`" in out
    d = json.loads((tmp_path / "a.json").read_text())
    (region,) = d["regions"]
    assert region["graph"] == "layernorm_small" and region["kernels"][0]["accesses"]
    assert "measured" in d["note"]


def test_audit_writes_markdown_to_a_file(tmp_path: Path) -> None:
    rc, out, _ = call(["audit", str(GRAPH), "--no-sass", "--no-peer", "--markdown", str(tmp_path / "a.md")])
    assert rc == 0 and out == "" and (tmp_path / "a.md").read_text().startswith("# Kernel audit")


@pytest.mark.parametrize("argv, says", [
    (["audit"], "give a GRAPH or --model"),
    (["audit", "{missing}"], "does not exist"),
    (["audit", "{garbage}"], "not JSON"),
    (["audit", str(GRAPH), "--model", "m.py:f", "--shapes", "x=2"], "give a GRAPH or --model"),
    (["audit", "--model", "m.py:f"], "--model needs --shapes"),
    (["audit", str(GRAPH), "--device", "no-such-gpu"], "unknown device"),
    (["audit", str(GRAPH), "--slice-blocks", "0"], "--slice-blocks"),
    (["audit", str(GRAPH), "--shapes", "x=3"], "--shapes: for --model"),
    (["audit", str(GRAPH), "--calls", "train", "--dtype", "bfloat16"], "--dtype, --calls: for --model"),
    (["audit", str(EXAMPLES_DIR / "dynamic" / "layernorm_seq.json")], "has dynamic dims (seq=1..2048): this command"),
])
def test_bad_input_is_one_error_line_and_exit_2(tmp_path: Path, argv: list[str], says: str) -> None:
    (tmp_path / "garbage.json").write_text("not json")
    argv = [a.format(missing=tmp_path / "missing.json", garbage=tmp_path / "garbage.json") for a in argv]
    rc, out, err = call(argv)
    lines = err.strip().splitlines()
    assert rc == 2 and out == ""
    assert lines[-1].startswith("stitchtune: error: ") or lines[-1].startswith("usage:") or "error:" in lines[-1]
    assert says in err and "Traceback" not in err


def test_audit_of_a_models_regions(tmp_path: Path) -> None:
    """A module's regions, captured as the backend captures them (torch.compile + AOTAutograd)."""
    pytest.importorskip("torch")
    rc, out, err = call(["audit", "--model", f"{EXAMPLES_DIR / 'torch_modules.py'}:layernorm",
                         "--shapes", "x=64x256,gamma=256,beta=256", "--no-sass", "--no-peer",
                         "--json", str(tmp_path / "m.json")])
    assert rc == 0, err
    d = json.loads((tmp_path / "m.json").read_text())
    assert d["regions"] and all(r["uses"].startswith("inference x") for r in d["regions"])
    assert "Kernel audit:" in out


def test_a_given_schedule_is_audited_and_a_refused_one_is_an_error(tmp_path: Path) -> None:
    good = '{"tpr": 32, "block": 128, "vec": 4, "schemes": ["local", "local"], "reuse": ["register", "register"]}'
    rc, out, err = call(["audit", str(GRAPH), "--no-sass", "--no-peer", "--schedule", good])
    assert rc == 0, err
    assert 'schedule (given): `{"block":128,' in out
    rc, out, err = call(["audit", str(GRAPH), "--no-sass", "--no-peer", "--schedule", '{"tpr": 7, "block": 128}'])
    assert rc == 2 and "tpr=7" in err and "Traceback" not in err
    rc, _, err = call(["audit", "--model", "m.py:f", "--shapes", "x=2", "--schedule", good])
    assert rc == 2 and "--schedule is for a GRAPH" in err


def test_audit_outputs_are_written_whole_into_new_folders(tmp_path: Path) -> None:
    """--json and --markdown are output files like every command's: missing parent folders are created."""
    js, md = tmp_path / "new" / "deeper" / "a.json", tmp_path / "other" / "a.md"
    rc, out, err = call(["audit", str(GRAPH), "--no-sass", "--no-peer", "--json", str(js), "--markdown", str(md)])
    assert rc == 0, err
    assert out == "" and json.loads(js.read_text())["regions"] and md.read_text().startswith("# Kernel audit")
    assert sorted(p.name for p in js.parent.iterdir()) == ["a.json"]   # no temporary file left beside it
