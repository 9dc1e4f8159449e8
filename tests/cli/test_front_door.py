"""Issue 42's CLI items: a misspelt option gets its subcommand's usage and a "did you mean";
counts below 1 are refused before anything is printed; ``CompiledGraph.write`` onto a file says
what the CLI says; ``stitchtune tune``'s progress lines name their call patterns."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest

from stitchtune.errors import StitchtuneError
from helpers.cli import call_cli as call
from helpers.common import EXAMPLES_DIR

G = str(EXAMPLES_DIR / "layernorm_small.json")


@pytest.mark.parametrize(("argv", "suggestion"), [
    (["search", G, "--trails", "5"], "--trials"),
    (["search", G, "--trails=5"], "--trials"),
    (["search", G, "--early-stp", "3"], "--early-stop"),
    (["compile", G, "--no-cubn", "-o", "x"], "--no-cubin"),
])
def test_a_misspelt_option_gets_its_commands_usage_and_a_suggestion(argv: list[str], suggestion: str) -> None:
    rc, out, err = call(argv)
    lines = err.splitlines()
    assert rc == 2 and out == "" and "Traceback" not in err
    assert lines[0].startswith(f"usage: stitchtune {argv[0]} ")
    assert lines[-1].startswith(f"stitchtune {argv[0]}: error: unrecognized arguments: ")
    assert lines[-1].endswith(f"(did you mean {suggestion}?)")


def test_an_unknown_word_far_from_every_option_gets_no_suggestion() -> None:
    rc, _out, err = call(["search", G, "--zzzzzz"])
    assert rc == 2 and err.startswith("usage: stitchtune search ")
    assert err.splitlines()[-1] == "stitchtune search: error: unrecognized arguments: --zzzzzz"


@pytest.mark.parametrize("argv", [
    ["search", G, "--trials", "0"], ["search", G, "--trials", "-3"], ["search", G, "--jobs", "0"],
    ["search", G, "--early-stop", "0"], ["tune", "m.py:M", "--shapes", "x=2", "--trials", "0"],
    ["tune", "m.py:M", "--shapes", "x=2", "--jobs", "0"]])
def test_counts_below_one_are_refused_before_anything_is_printed(argv: list[str]) -> None:
    rc, out, err = call(argv)
    flag = argv[-2]
    assert rc == 2 and out == ""
    assert "backend" not in err.replace("[--backend", "")      # no "backend auto -> emulate" line first
    assert err.splitlines()[-1].startswith(f"stitchtune {argv[0]}: error: argument {flag}: from 1 to ")


def test_compiled_write_onto_a_file_says_what_the_cli_says(tmp_path: Path) -> None:
    import stitchtune

    target = tmp_path / "out"
    target.write_text("")
    cg = stitchtune.compile(G, db=None, build=False)
    with pytest.raises(StitchtuneError) as err:
        cg.write(target)
    assert str(err.value).endswith("is a file, not a directory")
    rc, _out, cli_err = call(["compile", G, "--no-cubin", "-o", str(target)])
    assert rc == 2 and cli_err.strip().endswith("is a file, not a directory")


def _workload(name: str, key: str, calls: tuple[tuple[str, int], ...], share: float) -> object:
    from stitchtune.deploy.model_tuning import Workload

    graph = SimpleNamespace(name=name, workload_key=lambda: key)
    return Workload(graph, (name,), ("aten.add", "aten.native_layer_norm"), 1, 2.0, share, calls)


def test_tune_lines_name_the_call_pattern_and_never_read_alike() -> None:
    from stitchtune.deploy.model_tuning import region_heads

    heads = region_heads([_workload("region_add", "aaaaaaaa1", (("inference", 1),), 0.5),
                          _workload("region_add", "bbbbbbbb2", (("eval-grad", 1), ("train", 1)), 0.3),
                          _workload("region_add", "cccccccc3", (("inference", 1),), 0.2)])
    assert heads[0].startswith("[1/3] region_add x1 (add, native_layer_norm) in inference [workload aaaaaaaa]: ")
    assert heads[1].startswith("[2/3] region_add x1 (add, native_layer_norm) in eval-grad, train: predicted 2.00 us")
    assert heads[2].startswith("[3/3] region_add x1 (add, native_layer_norm) in inference [workload cccccccc]: ")
    assert len({h.split(":")[0].split("] ", 1)[1] for h in heads}) == 3


def test_a_misspelt_command_gets_a_suggestion() -> None:
    rc, out, err = call(["serch", G])
    assert rc == 2 and out == ""
    assert err.splitlines()[-1] == "stitchtune: error: argument COMMAND: invalid choice: 'serch' (did you mean 'search'?)"
    rc, _out, err = call(["zzzz", G])
    assert rc == 2 and "did you mean" not in err and "choose from" in err


@pytest.mark.parametrize(("device", "words"), [(42, "device=42: None (the local GPU), a Device or a preset name (h200"),
                                              ("h300", "unknown device 'h300'; presets: h200")])
def test_the_torch_entry_point_names_the_presets_for_a_bad_device(device: object, words: str) -> None:
    torch = pytest.importorskip("torch")
    from stitchtune.deploy import torch_entry

    with pytest.raises(StitchtuneError, match=words.replace("(", r"\(").replace(")", r"\)")):
        torch_entry.compile(lambda x: x * 2.0, db=None, example_inputs=(torch.randn(4, 8),), device=device,
                            emulate=True)
