"""The README's two set-up commands (issue 42): one line installs and runs the main job, one installs
the test extra and runs the tests; their extras exist and their stitchtune commands parse."""

from __future__ import annotations

import shlex
import tomllib

from helpers.common import REPO

from stitchtune import cli


def _command_lines() -> list[list[str]]:
    text = (REPO / "README.md").read_text()
    install = text.split("## Install\n", 1)[1].split("\n## ", 1)[0]
    return [shlex.split(line) for line in install.splitlines() if line.startswith("    pip install torch==")]


def _steps(words: list[str]) -> list[list[str]]:
    steps, cur = [], []
    for w in words:
        if w == "&&":
            steps.append(cur)
            cur = []
        else:
            cur.append(w)
    return [*steps, cur]


def test_two_copyable_commands_install_then_run_and_install_then_test() -> None:
    lines = [_steps(w) for w in _command_lines()]
    assert len(lines) == 2
    extras = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    for steps in lines:
        assert steps[0][:3] == ["pip", "install", "torch==2.13.0"] and "download.pytorch.org/whl/cpu" in steps[0][-1]
        assert steps[1][:3] == ["pip", "install", "-e"]
        wanted = steps[1][3].removeprefix(".[").removesuffix("]").split(",")
        assert set(wanted) <= set(extras), wanted
    run, test = lines
    assert "import" in run[1][3] and all(s[0] == "stitchtune" for s in run[2:])
    parser = cli.build_parser()
    for step in run[2:]:
        parser.parse_args(step[1:])          # a usage error would exit 2 here
    assert "test" in test[1][3] and test[2][:3] == ["python", "-m", "pytest"]
