"""The files of a compiled graph's directory, shared by :mod:`stitchtune.deploy.compiled` (one
schedule) and :mod:`stitchtune.deploy.compiled_dynamic` (one folder per bucket): ``kernels.cu`` /
``kernels.cubin`` written together, ``manifest.json`` read with a size limit, and the code generator
version a manifest must carry. Every failure is a :class:`~stitchtune.errors.StitchtuneError` naming
the directory (``where``: its ``ascii`` path)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from stitchtune.errors import StitchtuneError

__all__ = ["MAX_MANIFEST_BYTES", "check_codegen_version", "read_manifest", "write_kernels"]

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
