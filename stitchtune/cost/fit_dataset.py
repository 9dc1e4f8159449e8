"""The cost fit's dataset: measured times paired with the features of the kernels that were measured.

Contract
--------
* A dataset file is JSON: ``{"format": 2, "device": <device key>, "rows": [...], "notes": [...],
  "provenance": {...}}``. Each row is a fit row (:mod:`stitchtune.cost.fitting`: ``group``, ``label``,
  ``measured_us``, ``kernels``) plus ``source_sha256``: the fingerprint of the program that was
  measured (sha256 of its rendered CUDA source, a newline and its launch list, as
  ``scripts/kernel_hashes.py`` pins generated kernels; :func:`stitchtune.gpu.render.program_fingerprint`)
  and ``features_commit``: the checkout whose IR walk computed ``kernels``.
* :func:`load_dataset(path, device_key) -> Dataset`: raises :class:`DatasetError` (a ``ValueError``) for
  another format (a format-1 file has no fingerprints: rebuild it), another device, or a row without
  ``source_sha256``, ``measured_us`` or ``kernels``. A key (:func:`row_key`) may repeat: the same
  schedule measured in two trials is two rows; the n-th rebuilt row of a key pairs with the n-th stored.
* :func:`pair_rebuilt(stored, rebuilt) -> (rows, notes)`: the rows of a rebuild (features computed
  again from programs lowered today) paired with what was measured. A rebuilt row whose fingerprint
  equals the stored row's replaces it (same kernel: today's features); one whose fingerprint differs
  is **never** paired with the stored time: the stored row is kept as stored (the features of the
  kernel that was measured) and a note names it; a rebuilt row with no stored row is left out (no
  record of which kernel was measured). Stored rows not rebuilt are kept. Output in stored order.
* :func:`with_timing(rows)`: the rows (copies) with ``timing`` where a row has none: ``cupti`` (summed
  kernel times) for BERT training's rows (group ``bert-train``), ``events`` (CUDA events) for the rest
  (the database's, BERT inference's tuning log).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, Sequence

__all__ = ["FORMAT", "Dataset", "DatasetError", "load_dataset", "pair_rebuilt", "row_key", "save_dataset", "with_timing"]

#: the dataset file format this module reads and writes (1: no fingerprints)
FORMAT = 2


class DatasetError(ValueError):
    """A dataset file that cannot be used for a fit (the message says why)."""


@dataclass(frozen=True)
class Dataset:
    """A loaded dataset file (see the module docstring)."""

    device: str
    rows: tuple[Mapping[str, Any], ...]
    notes: tuple[str, ...] = ()
    provenance: Mapping[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {"format": FORMAT, "device": self.device, "provenance": dict(self.provenance),
                "notes": list(self.notes), "rows": [dict(r) for r in self.rows]}


def row_key(row: Mapping[str, Any]) -> tuple[str, str]:
    """A row's identity in a dataset: (group, label)."""
    return str(row["group"]), str(row["label"])


def _check_rows(rows: Sequence[Mapping[str, Any]], where: str) -> None:
    for i, r in enumerate(rows):
        missing = [k for k in ("group", "label", "measured_us", "kernels", "source_sha256") if not r.get(k)]
        if missing:
            raise DatasetError(f"{where}: row {i} has no {', '.join(missing)}")


def _numbered(rows: Sequence[Mapping[str, Any]]) -> list[tuple[tuple[str, str, int], Mapping[str, Any]]]:
    seen: dict[tuple[str, str], int] = {}
    out = []
    for r in rows:
        k = row_key(r)
        seen[k] = seen.get(k, -1) + 1
        out.append(((*k, seen[k]), r))
    return out


def load_dataset(path: str | Path, device_key: str) -> Dataset:
    """The dataset file at ``path``, checked (module docstring)."""
    try:
        d = json.loads(Path(path).read_text())
    except (OSError, ValueError) as exc:
        raise DatasetError(f"{path}: cannot read the dataset ({exc})") from exc
    fmt = d.get("format", 1) if isinstance(d, dict) else None
    if fmt != FORMAT:
        raise DatasetError(f"{path}: dataset format {fmt}, this version reads {FORMAT} (rows keyed by the "
                           "measured kernel's fingerprint): rebuild it")
    if d.get("device") != device_key:
        raise DatasetError(f"{path}: dataset of device {d.get('device')!r}, not {device_key!r}")
    rows = tuple(d.get("rows") or ())
    _check_rows(rows, str(path))
    return Dataset(device_key, rows, tuple(d.get("notes") or ()), dict(d.get("provenance") or {}))


def save_dataset(path: str | Path, dataset: Dataset) -> None:
    """Write ``dataset`` (checked as :func:`load_dataset` checks) to ``path``."""
    _check_rows(dataset.rows, str(path))
    Path(path).write_text(json.dumps(dataset.to_dict(), indent=0) + "\n")


def pair_rebuilt(stored: Sequence[Mapping[str, Any]],
                 rebuilt: Sequence[Mapping[str, Any]]) -> tuple[list[Mapping[str, Any]], list[str]]:
    """Rebuilt rows paired with the stored measurements by kernel fingerprint (module docstring)."""
    new = dict(_numbered(rebuilt))
    out: list[Mapping[str, Any]] = []
    notes: list[str] = []
    changed = 0
    for key, s in _numbered(stored):
        r = new.pop(key, None)
        if r is None:
            out.append(s)
        elif r.get("source_sha256") == s["source_sha256"]:
            out.append({**r, "measured_us": s["measured_us"]})
        else:
            changed += 1
            notes.append(f"{s['group']} {s['label']}: the kernel built today differs from the one measured "
                         f"(fingerprint {str(r.get('source_sha256'))[:12]} vs {str(s['source_sha256'])[:12]}); "
                         f"the stored features (of {s.get('features_commit', '?')}) are kept")
            out.append(s)
    for k in new:
        notes.append(f"{k[0]} {k[1]}: rebuilt, but no stored row says which kernel was measured; left out")
    if changed:
        notes.insert(0, f"{changed} of {len(stored)} rows: kernel changed since the measurement, stored features kept")
    return out, notes


def with_timing(rows: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """``rows`` copied, each with its ``timing`` (as it is, else by its group: module docstring)."""
    return [{**r, "timing": r.get("timing", "cupti" if r["group"] == "bert-train" else "events")} for r in rows]
