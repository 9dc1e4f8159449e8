"""``graph.files.write_atomic``: bytes written whole, parents created, a failed write leaves the old file."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from stitchtune.graph.files import write_atomic


def test_writes_whole_files_into_new_folders(tmp_path: Path) -> None:
    target = tmp_path / "a" / "b" / "x.bin"
    assert write_atomic(target, b"one") == target and target.read_bytes() == b"one"
    write_atomic(str(target), b"two")
    assert target.read_bytes() == b"two" and sorted(p.name for p in target.parent.iterdir()) == ["x.bin"]


def test_a_failed_write_leaves_the_old_file_and_no_temporary(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    target = tmp_path / "x.json"
    target.write_bytes(b"old")

    def refuse(src: str, dst: object) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "replace", refuse)
    with pytest.raises(OSError, match="No space left"):
        write_atomic(target, b"new")
    assert target.read_bytes() == b"old" and sorted(p.name for p in tmp_path.iterdir()) == ["x.json"]


def test_a_parent_that_is_a_file_is_an_oserror(tmp_path: Path) -> None:
    (tmp_path / "f").write_text("")
    with pytest.raises(OSError):
        write_atomic(tmp_path / "f" / "x.bin", b"")
