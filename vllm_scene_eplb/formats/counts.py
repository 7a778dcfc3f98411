"""Counts file formats.

``scene-eplb`` (.npz, the project's own format): int64 ``logical_count`` [T, L, E] plus JSON metadata with a checksum; what the
runtime writes, with ``physical_count`` [T, L, P] and ``source_count`` [S, L, E] where measured, and a drafter's MoE rows
after the target's (``layouts.drafter``). ``sglang`` (.json): ``{"logical_count": [T][L][E]}`` or ``[L][E]``. ``pt``: a torch
file holding a dict with ``logical_count``, as SGLang's recorder dumps. The bare two have no metadata to name a drafter's
rows, so they are written without them (``dropped_parts`` says so).
"""

from __future__ import annotations

import json
import zipfile
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import SceneEplbError
from ..fileio import atomic_write, canonical_json, sha256_hex
from ..layouts.counts import Counts, counts_digest, validate_count_array, validate_physical, validate_sources
from ..layouts.drafter import DRAFTER_KEY, drafter_layers_of, target_counts
from .base import (
    FORMAT_VERSION,
    MAX_ID,
    OWN_FORMAT,
    FileFormat,
    GeometryHint,
    Loaded,
    check_fits_memory,
    check_moe_layers,
    write_json,
    write_pt,
)

COUNTS_FORMAT = "scene-eplb-counts"


PHYSICAL_KEY = "physical_count"  # measured replica traffic [T, L, P], where the recorder saw it (optional)
SOURCE_KEY = "source_count"  # the window's assignments by routing EP rank [S, L, E], where the recorder saw them (optional)
OPTIONAL_KEYS = (PHYSICAL_KEY, SOURCE_KEY)
PREDICTED_KEY = "predicted_layers"  # metadata: layers whose counts were predicted from tokens (hash_counts), not recorded
PREFIX_CACHE_KEY = "prefix_cache"  # metadata: the prefix-cache hit share measured over a warm record (ab.warm)


def _own_checksum(meta: dict, data: np.ndarray, physical: np.ndarray | None = None, sources: np.ndarray | None = None) -> str:
    body = {k: v for k, v in meta.items() if k != "checksum"}
    extra = b"".join(b"" if a is None else counts_digest(a).encode() for a in (physical, sources))
    return sha256_hex(canonical_json(body) + counts_digest(data).encode() + extra)


MAX_META_BYTES = 1 << 24


def _member_header(zf: zipfile.ZipFile, name: str) -> tuple[tuple[int, ...], np.dtype]:
    """Shape and dtype an archive member's .npy header claims, read without reading its data."""
    with zf.open(name) as fh:
        version = np.lib.format.read_magic(fh)
        read = np.lib.format.read_array_header_1_0 if version == (1, 0) else np.lib.format.read_array_header_2_0
        shape, _, dtype = read(fh)
    return tuple(shape), dtype


def _check_headers(path: Path) -> None:
    """Refuse an archive whose members claim a dtype or a size the counts cannot have, before
    anything is allocated (a header can claim terabytes in a file of a few bytes)."""
    try:
        with zipfile.ZipFile(path) as zf:
            names = ["logical_count"] + [key for key in OPTIONAL_KEYS if f"{key}.npy" in zf.namelist()]
            arrays = {name: _member_header(zf, f"{name}.npy") for name in names}
            meta_shape, meta_dtype = _member_header(zf, "meta.npy")
    except (zipfile.BadZipFile, ValueError, OSError, EOFError, KeyError) as exc:
        raise SceneEplbError(f"not a readable scene-eplb counts archive (truncated or corrupt?): {exc}", path) from None
    for name, (shape, dtype) in arrays.items():
        if dtype.kind not in "iuf" or len(shape) not in (2, 3):
            raise SceneEplbError(f"{name} must be a [T, L, E] array of integers, the archive holds {dtype} {list(shape)}", path)
    if meta_dtype != np.uint8 or len(meta_shape) != 1 or meta_shape[0] > MAX_META_BYTES:
        raise SceneEplbError(
            f"counts metadata must be JSON bytes (at most {MAX_META_BYTES} B), the archive holds {meta_dtype} {list(meta_shape)}",
            path,
        )
    # the arrays as stored, their int64 copies and the checks' masks
    sizes = {name: int(np.prod(shape, dtype=object)) for name, (shape, _) in arrays.items()}
    largest = max(sizes, key=lambda name: sizes[name])  # the array that asks for the memory, named
    check_fits_memory(3 * 8 * sum(sizes.values()), f"{largest} {list(arrays[largest][0])}", path)


def _read_own(loaded: Loaded, hint: GeometryHint) -> Counts:
    path = loaded.path
    _check_headers(path)
    try:
        with np.load(path, allow_pickle=False) as npz:
            raw, meta_raw = npz["logical_count"], npz["meta"]
            physical_raw = npz[PHYSICAL_KEY] if PHYSICAL_KEY in npz.files else None
            sources_raw = npz[SOURCE_KEY] if SOURCE_KEY in npz.files else None
    except (zipfile.BadZipFile, ValueError, OSError, EOFError, KeyError) as exc:
        raise SceneEplbError(f"not a readable scene-eplb counts archive (truncated or corrupt?): {exc}", path) from None
    try:
        meta = json.loads(bytes(meta_raw).decode())
    except (ValueError, UnicodeDecodeError, RecursionError) as exc:
        raise SceneEplbError(f"counts metadata is not valid JSON: {exc!r}", path) from None
    if not isinstance(meta, dict) or meta.get("format") != COUNTS_FORMAT:
        raise SceneEplbError(f"metadata does not name format {COUNTS_FORMAT!r}", path)
    if meta.get("version") != FORMAT_VERSION:
        raise SceneEplbError(f"counts format version {meta.get('version')!r} is not supported (expected {FORMAT_VERSION})", path)
    data = validate_count_array(raw, str(path))
    physical = None if physical_raw is None else validate_physical(physical_raw, data, str(path))
    sources = None if sources_raw is None else validate_sources(sources_raw, data, str(path))
    if meta.get("checksum") != _own_checksum(meta, data, physical, sources):
        raise SceneEplbError("checksum mismatch: the counts or their metadata were altered or damaged", path)
    _check_meta(meta, data.shape[1], path)
    counts = Counts(data, meta, physical, sources)
    try:
        drafter_layers_of(counts)
    except SceneEplbError as exc:
        raise SceneEplbError(f"counts metadata {exc.problem}", path) from None
    return counts


def _check_meta(meta: dict, num_layers: int, path: Path) -> None:
    """The metadata fields the tools read (model, role, MoE layers, the layers predicted from tokens
    rather than recorded, the router's top_k and groups) have their types."""
    for key in ("moe_layers", PREDICTED_KEY, DRAFTER_KEY):
        check_moe_layers(meta.get(key), num_layers, path, key)
    for key in ("model", "role"):
        if meta.get(key) is not None and not isinstance(meta[key], str):
            raise SceneEplbError(f"counts metadata {key} must be a string, got {meta[key]!r}", path)
    for key in ("top_k", "expert_groups"):
        value = meta.get(key)
        if value is not None and (type(value) is not int or not 1 <= value <= MAX_ID):
            raise SceneEplbError(f"counts metadata {key} must be a positive integer, got {value!r}", path)


def _read_dict(loaded: Loaded, hint: GeometryHint) -> Counts:
    """A JSON or torch dict with ``logical_count`` (SGLang's shapes); keeps its rank/model/role."""
    doc = loaded.doc
    data = validate_count_array(doc["logical_count"], str(loaded.path))
    physical = None if doc.get(PHYSICAL_KEY) is None else validate_physical(doc[PHYSICAL_KEY], data, str(loaded.path))
    sources = None if doc.get(SOURCE_KEY) is None else validate_sources(doc[SOURCE_KEY], data, str(loaded.path))
    kept = {k: v for k, v in doc.items() if k in ("model", "role") and isinstance(v, str)}
    if type(doc.get("rank")) is int:
        kept["rank"] = doc["rank"]
    return Counts(data, {"imported_from": loaded.path.name, **kept}, physical, sources)


def _arrays(counts: Counts) -> dict[str, np.ndarray]:
    """The arrays a counts file holds: ``logical_count``, and ``physical_count`` / ``source_count`` where measured."""
    optional = {PHYSICAL_KEY: counts.physical, SOURCE_KEY: counts.sources}
    return {"logical_count": counts.data, **{k: v for k, v in optional.items() if v is not None}}


def own_meta(counts: Counts) -> dict:
    """Metadata for a scene-eplb counts file: the caller's metadata plus format, shape and checksum."""
    meta = {k: v for k, v in counts.meta.items() if k not in ("checksum", "format", "version")}
    meta.update(
        format=COUNTS_FORMAT,
        version=FORMAT_VERSION,
        shape=list(counts.data.shape),
        physical_shape=None if counts.physical is None else list(counts.physical.shape),
        source_shape=None if counts.sources is None else list(counts.sources.shape),
        entries_written=int(counts.written_entries().size),
        counts_sha256=counts.digest(),
    )
    meta["checksum"] = _own_checksum(meta, counts.data, counts.physical, counts.sources)
    return meta


def _write_own(counts: Counts, path: Path) -> Path:
    meta = np.frombuffer(json.dumps(own_meta(counts)).encode(), dtype=np.uint8)
    arrays: dict[str, Any] = {**_arrays(counts), "meta": meta}
    return atomic_write(path, lambda fh: np.savez_compressed(fh, **arrays))


FORMATS = (
    FileFormat("counts", OWN_FORMAT, lambda f: f.container == "npz", _read_own, _write_own),
    FileFormat(
        "counts",
        "sglang",
        lambda f: f.container == "json" and f.has_key("logical_count"),
        _read_dict,
        lambda c, path: write_json(path, {k: v.tolist() for k, v in _arrays(target_counts(c)).items()}),
    ),
    FileFormat(
        "counts",
        "pt",
        lambda f: f.container == "pt" and f.has_key("logical_count"),
        _read_dict,
        lambda c, path: write_pt(path, _arrays(target_counts(c))),
    ),
)
