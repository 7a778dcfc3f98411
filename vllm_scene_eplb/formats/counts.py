"""Counts file formats.

``native`` (.npz): int64 ``logical_count`` [T, L, E] plus JSON metadata with a checksum; what the
runtime writes. ``sglang`` (.json): ``{"logical_count": [T][L][E]}`` or ``[L][E]``. ``pt``: a torch
file holding a dict with ``logical_count``, as SGLang's recorder dumps.
"""

from __future__ import annotations

import json
import zipfile
from pathlib import Path

import numpy as np

from ..counts import Counts, counts_digest, validate_count_array
from ..errors import SceneEplbError
from ..fileio import atomic_write, canonical_json, sha256_hex
from .base import FORMAT_VERSION, FileFormat, GeometryHint, Loaded, write_json, write_pt

COUNTS_FORMAT = "scene-eplb-counts"


def _native_checksum(meta: dict, data: np.ndarray) -> str:
    body = {k: v for k, v in meta.items() if k != "checksum"}
    return sha256_hex(canonical_json(body) + counts_digest(data).encode())


def _read_native(loaded: Loaded, hint: GeometryHint) -> Counts:
    path = loaded.path
    try:
        with np.load(path, allow_pickle=False) as npz:
            raw, meta_raw = npz["logical_count"], npz["meta"]
    except (zipfile.BadZipFile, ValueError, OSError, EOFError, KeyError) as exc:
        raise SceneEplbError(f"not a readable scene-eplb counts archive (truncated or corrupt?): {exc}", path) from None
    try:
        meta = json.loads(bytes(meta_raw).decode())
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise SceneEplbError(f"counts metadata is not valid JSON: {exc}", path) from None
    if not isinstance(meta, dict) or meta.get("format") != COUNTS_FORMAT:
        raise SceneEplbError(f"metadata does not name format {COUNTS_FORMAT!r}", path)
    if meta.get("version") != FORMAT_VERSION:
        raise SceneEplbError(f"counts format version {meta.get('version')!r} is not supported (expected {FORMAT_VERSION})", path)
    data = validate_count_array(raw, str(path))
    if meta.get("checksum") != _native_checksum(meta, data):
        raise SceneEplbError("checksum mismatch: the counts or their metadata were altered or damaged", path)
    return Counts(data, meta)


def _read_dict(loaded: Loaded, hint: GeometryHint) -> Counts:
    """A JSON or torch dict with ``logical_count`` (SGLang's shapes); keeps its rank/model/role."""
    doc = loaded.doc
    data = validate_count_array(doc["logical_count"], str(loaded.path))
    kept = {k: v for k, v in doc.items() if k in ("rank", "model", "role") and isinstance(v, (str, int, float, bool, type(None)))}
    return Counts(data, {"imported_from": loaded.path.name, **kept})


def native_meta(counts: Counts) -> dict:
    """Metadata for a native counts file: the caller's metadata plus format, shape and checksum."""
    meta = {k: v for k, v in counts.meta.items() if k not in ("checksum", "format", "version")}
    meta.update(
        format=COUNTS_FORMAT,
        version=FORMAT_VERSION,
        shape=list(counts.data.shape),
        entries_written=int(counts.written_entries().size),
        counts_sha256=counts.digest(),
    )
    meta["checksum"] = _native_checksum(meta, counts.data)
    return meta


def _write_native(counts: Counts, path: Path) -> Path:
    meta = np.frombuffer(json.dumps(native_meta(counts)).encode(), dtype=np.uint8)
    return atomic_write(path, lambda fh: np.savez_compressed(fh, logical_count=counts.data, meta=meta))


FORMATS = (
    FileFormat("counts", "native", lambda f: f.container == "npz", _read_native, _write_native),
    FileFormat("counts", "sglang", lambda f: f.container == "json" and f.has_key("logical_count"), _read_dict,
               lambda c, path: write_json(path, {"logical_count": c.data.tolist()})),
    FileFormat("counts", "pt", lambda f: f.container == "pt" and f.has_key("logical_count"), _read_dict,
               lambda c, path: write_pt(path, "logical_count", c.data)),
)
