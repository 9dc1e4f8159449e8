"""The files of a compiled graph's directory, shared by :mod:`stitchtune.deploy.compiled` (one
schedule) and :mod:`stitchtune.deploy.compiled_dynamic` (one folder per bucket): ``kernels.cu`` /
``kernels.cubin`` written together, the directory written with its ``manifest.json`` last
(:func:`write_compiled`), ``manifest.json`` read with a size limit, and the code generator
version a manifest must carry. Every failure is a :class:`~stitchtune.errors.StitchtuneError` naming
the directory (``where``: its ``ascii`` path)."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from stitchtune.errors import StitchtuneError

__all__ = ["MAX_MANIFEST_BYTES", "check_codegen_version", "read_manifest", "write_compiled", "write_kernels"]

#: the largest manifest.json read (a larger one is refused, not parsed)
MAX_MANIFEST_BYTES = 16 * 1024 * 1024


def write_kernels(d: Path, sources: str, cubin: bytes | None) -> list[Path]:
    """Write ``d/kernels.cu`` and, when built, ``d/kernels.cubin``; the paths (OSError propagates)."""
    paths = [d / "kernels.cu"]
    paths[0].write_text(sources)
    if cubin is not None:
        paths.append(d / "kernels.cubin")
        paths[-1].write_bytes(cubin)
    return paths


def write_compiled(out_dir: str | os.PathLike[str], manifest: dict[str, Any],
                   write_files: Callable[[Path], list[Path]]) -> list[Path]:
    """Make ``out_dir`` (and its parents), ``write_files(out_dir)`` (the kernel files, their paths), then
    ``manifest.json`` (indented JSON); every path written, the manifest last. An ``OSError`` is a
    :class:`~stitchtune.errors.StitchtuneError` ``cannot write to <dir>: <why>``, an existing file at
    ``out_dir`` in the CLI's words (``is a file, not a directory``: :func:`stitchtune.cli.checks.out_dir`)."""
    out = Path(out_dir)
    try:
        out.mkdir(parents=True, exist_ok=True)
        paths = write_files(out)
        paths.append(out / "manifest.json")
        paths[-1].write_text(json.dumps(manifest, indent=1) + "\n")
    except OSError as exc:
        why = "is a file, not a directory" if out.is_file() else exc.strerror or exc
        raise StitchtuneError(f"cannot write to {str(out)!a}: {why}") from None
    return paths


def read_manifest(d: Path, where: str) -> bytes:
    """The bytes of ``d/manifest.json`` (at most :data:`MAX_MANIFEST_BYTES`)."""
    try:
        raw = (d / "manifest.json").read_bytes()[: MAX_MANIFEST_BYTES + 1]
    except OSError as exc:
        raise StitchtuneError(f"cannot read compiled graph {where}: {exc.strerror or exc}") from None
    if len(raw) > MAX_MANIFEST_BYTES:
        raise StitchtuneError(f"{where}: manifest.json is too large")
    return raw


def check_codegen_version(m: dict[str, Any], where: str) -> None:
    """Refuse a manifest written by another code generator version (its kernels are not ours)."""
    from stitchtune.lower.entry import CODEGEN_VERSION

    if str(m.get("codegen_version")) != str(CODEGEN_VERSION):
        raise StitchtuneError(f"{where} was compiled by code generator version {m.get('codegen_version')!a}; "
                              f"this stitchtune has {CODEGEN_VERSION}: recompile it")
