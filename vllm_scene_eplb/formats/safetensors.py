"""Named tensors out of a safetensors checkpoint, in numpy alone (no torch, no safetensors package).

A file is an 8-byte little-endian header length, a JSON header (``{name: {dtype, shape,
data_offsets}}`` and an optional ``__metadata__``) and the data. Every entry is checked against the
file before any tensor is read (known dtype sizes, shapes, offsets inside the data, no overlap), and
only the tensors asked for are read. A checkpoint is a folder with one ``model.safetensors`` or
shards named by ``model.safetensors.index.json``'s ``weight_map``.
"""

from __future__ import annotations

import json
import os
import struct
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..errors import SceneEplbError
from ..fileio import load_json
from .base import check_fits_memory

SINGLE_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"
MAX_HEADER_BYTES = 100_000_000  # the safetensors library's own limit
MAX_DIM = 1 << 40

# safetensors dtype -> numpy dtype (little-endian) where numpy holds it, else None: the item size alone
DTYPES: dict[str, tuple[str | None, int]] = {
    "BOOL": ("|b1", 1),
    "U8": ("|u1", 1),
    "I8": ("|i1", 1),
    "U16": ("<u2", 2),
    "I16": ("<i2", 2),
    "U32": ("<u4", 4),
    "I32": ("<i4", 4),
    "U64": ("<u8", 8),
    "I64": ("<i8", 8),
    "F16": ("<f2", 2),
    "F32": ("<f4", 4),
    "F64": ("<f8", 8),
    "BF16": (None, 2),
    "F8_E4M3": (None, 1),
    "F8_E5M2": (None, 1),
    "F8_E8M0": (None, 1),
}


@dataclass(frozen=True)
class TensorEntry:
    """One tensor a safetensors header names: its dtype name, shape and absolute byte range in the file."""

    name: str
    dtype: str
    shape: tuple[int, ...]
    start: int
    end: int


def _entry(name: str, raw: object, data_start: int, data_size: int, path: Path) -> TensorEntry:
    """A header entry checked: a known or unknown dtype name, a shape of sizes, offsets inside the
    data whose length is the shape's bytes (for a dtype of known size)."""
    if not isinstance(raw, dict):
        raise SceneEplbError(f"safetensors header entry {name!r} is not an object", path)
    dtype, shape, offsets = raw.get("dtype"), raw.get("shape"), raw.get("data_offsets")
    if not isinstance(dtype, str):
        raise SceneEplbError(f"safetensors tensor {name!r} has no dtype name", path)
    if not isinstance(shape, list) or not all(type(d) is int and 0 <= d <= MAX_DIM for d in shape):
        raise SceneEplbError(f"safetensors tensor {name!r} has shape {shape!r}, not a list of sizes", path)
    if not (isinstance(offsets, list) and len(offsets) == 2 and all(type(o) is int for o in offsets)):
        raise SceneEplbError(f"safetensors tensor {name!r} has data_offsets {offsets!r}, not [begin, end]", path)
    begin, end = offsets
    if not 0 <= begin <= end <= data_size:
        raise SceneEplbError(
            f"safetensors tensor {name!r} has data_offsets [{begin}, {end}] outside the file's {data_size} data bytes "
            "(truncated or corrupt?)",
            path,
        )
    if dtype in DTYPES:
        want = DTYPES[dtype][1] * int(np.prod(shape, dtype=object))
        if end - begin != want:
            raise SceneEplbError(
                f"safetensors tensor {name!r} ({dtype} {shape}) needs {want} bytes, its data_offsets span {end - begin}", path
            )
    return TensorEntry(name, dtype, tuple(shape), data_start + begin, data_start + end)


def read_header(path: str | os.PathLike) -> dict[str, TensorEntry]:
    """Every tensor a safetensors file names, each checked against the file; refuses a file whose
    header is cut short, too long, not a JSON object, or whose tensors overlap or leave the file."""
    path = Path(path)
    try:
        size = path.stat().st_size
        with path.open("rb") as fh:
            head = fh.read(8)
            if len(head) < 8:
                raise SceneEplbError(f"not a safetensors file: {size} bytes, shorter than the 8-byte header length", path)
            (length,) = struct.unpack("<Q", head)
            if length > MAX_HEADER_BYTES or 8 + length > size:
                raise SceneEplbError(
                    f"safetensors header claims {length} bytes in a file of {size} (limit {MAX_HEADER_BYTES}): truncated or not safetensors",
                    path,
                )
            text = fh.read(length)
    except OSError as exc:
        raise SceneEplbError(f"cannot read file: {exc.strerror or exc}", path) from None
    try:
        header = json.loads(text)
    except (ValueError, UnicodeDecodeError, RecursionError) as exc:
        raise SceneEplbError(f"safetensors header is not valid JSON (truncated or corrupt?): {exc}", path) from None
    if not isinstance(header, dict):
        raise SceneEplbError("safetensors header is not a JSON object", path)
    data_start = 8 + length
    entries = [_entry(name, raw, data_start, size - data_start, path) for name, raw in header.items() if name != "__metadata__"]
    ordered = sorted((e for e in entries if e.end > e.start), key=lambda e: e.start)
    for before, after in zip(ordered, ordered[1:]):
        if after.start < before.end:
            raise SceneEplbError(f"safetensors tensors {before.name!r} and {after.name!r} overlap in the file", path)
    return {e.name: e for e in entries}


def read_tensor(path: Path, entry: TensorEntry) -> np.ndarray:
    """One checked entry's data as a numpy array (dtypes numpy has no type for are refused by name)."""
    numpy_dtype = DTYPES.get(entry.dtype, (None, 0))[0]
    if numpy_dtype is None:
        raise SceneEplbError(f"safetensors tensor {entry.name!r} is {entry.dtype}, which this reader does not decode", path)
    check_fits_memory(entry.end - entry.start, f"tensor {entry.name!r}", path)
    try:
        with path.open("rb") as fh:
            fh.seek(entry.start)
            data = fh.read(entry.end - entry.start)
    except OSError as exc:
        raise SceneEplbError(f"cannot read file: {exc.strerror or exc}", path) from None
    if len(data) != entry.end - entry.start:
        raise SceneEplbError(f"safetensors tensor {entry.name!r} is cut short (the file changed while read?)", path)
    return np.frombuffer(data, dtype=numpy_dtype).reshape(entry.shape)


def _shards(folder: Path, names: set[str]) -> dict[Path, set[str]]:
    """The checkpoint's files and which of ``names`` each holds: the one file, or the shards the
    index's ``weight_map`` names (plain file names inside ``folder``)."""
    index = folder / INDEX_FILE
    if not index.is_file():
        if not (folder / SINGLE_FILE).is_file():
            raise SceneEplbError(f"no {SINGLE_FILE} and no {INDEX_FILE}: not a safetensors checkpoint folder", folder)
        return {folder / SINGLE_FILE: names}
    doc = load_json(index, "safetensors index")
    weight_map = doc.get("weight_map") if isinstance(doc, dict) else None
    if not isinstance(weight_map, dict) or not all(isinstance(v, str) for v in weight_map.values()):
        raise SceneEplbError("weight_map must be an object of tensor name -> shard file name", index)
    out: dict[Path, set[str]] = {}
    for name in names & set(weight_map):
        shard = weight_map[name]
        if Path(shard).name != shard or shard in ("", ".", ".."):
            raise SceneEplbError(f"weight_map names shard {shard!r} for {name!r}, not a file name in the folder", index)
        out.setdefault(folder / shard, set()).add(name)
    return out


def read_checkpoint_tensors(folder: str | os.PathLike, names: Iterable[str]) -> dict[str, np.ndarray]:
    """The tensors of ``names`` that a checkpoint folder holds (a name it lacks is left out, for the
    caller to name), each read from its file after that file's header was checked."""
    folder = Path(folder)
    out: dict[str, np.ndarray] = {}
    for path, wanted in _shards(folder, set(names)).items():
        if not path.is_file():
            raise SceneEplbError("the checkpoint's index names this shard, which is missing", path)
        header = read_header(path)
        out |= {name: read_tensor(path, header[name]) for name in sorted(wanted) if name in header}
    return out
