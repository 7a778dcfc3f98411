"""Reading and writing counts and layouts in every supported format, validated, atomically.

Counts:  ``native`` (.npz: int64 ``logical_count`` plus JSON metadata with a checksum; what the
         runtime writes), ``sglang`` (.json ``{"logical_count": [T][L][E]}``), ``pt`` (a torch file
         holding a dict with ``logical_count``, as SGLang's recorder dumps).
Layouts: ``native`` (.json with ``physical_to_logical_map``, geometry, MoE layers, provenance and a
         checksum), ``sglang`` (bare ``{"physical_to_logical_map": ...}``: SGLang rejects extra keys),
         ``vllm-ascend`` (``expert_map_path`` JSON, MoE layers only), ``pt``.
"""

from __future__ import annotations

import io
import json
import os
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from .counts import Counts, counts_digest, validate_count_array
from .errors import SceneEplbError
from .fileio import atomic_write, atomic_write_bytes, canonical_json, doc_checksum, sha256_hex
from .layout import Geometry, Layout

COUNTS_FORMAT = "scene-eplb-counts"
LAYOUT_FORMAT = "scene-eplb-layout"
FORMAT_VERSION = 1
COUNTS_FORMATS = ("native", "sglang", "pt")
LAYOUT_FORMATS = ("native", "sglang", "vllm-ascend", "pt")


@dataclass(frozen=True)
class GeometryHint:
    """Geometry a bare layout file cannot carry itself, given on the command line."""

    ep_size: int | None = None
    num_experts: int | None = None
    num_nodes: int | None = None


def _torch(path: Path):
    try:
        import torch
    except ImportError:
        raise SceneEplbError("reading or writing .pt files needs PyTorch (pip install 'vllm-scene-eplb[torch]')", path) from None
    return torch


def _load_json(path: Path) -> Any:
    try:
        text = path.read_bytes()
    except OSError as exc:
        raise SceneEplbError(f"cannot read file: {exc.strerror or exc}", path) from None
    if not text.strip():
        raise SceneEplbError("file is empty", path)
    try:
        return json.loads(text)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise SceneEplbError(f"not valid JSON (truncated or corrupt?): {exc}", path) from None


def _load_pt(path: Path) -> Any:
    torch = _torch(path)
    try:
        obj = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # torch raises many types for truncated or foreign files
        raise SceneEplbError(f"not a readable torch file (truncated or corrupt?): {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}", path) from None
    return _tensors_to_numpy(obj)


def _write_pt(path: Path, key: str, array: np.ndarray) -> Path:
    """Atomically write ``{key: int64 tensor}`` with torch.save (the dict SGLang loads)."""
    torch = _torch(path)
    buf = io.BytesIO()
    torch.save({key: torch.from_numpy(np.array(array, dtype=np.int64))}, buf)
    return atomic_write_bytes(path, buf.getvalue())


def _tensors_to_numpy(obj: Any) -> Any:
    if hasattr(obj, "detach") and hasattr(obj, "numpy"):
        return obj.detach().cpu().numpy()
    if isinstance(obj, dict):
        return {k: _tensors_to_numpy(v) for k, v in obj.items()}
    return obj


def _is_zip(path: Path) -> bool:
    try:
        with path.open("rb") as fh:
            return fh.read(4) == b"PK\x03\x04"
    except OSError as exc:
        raise SceneEplbError(f"cannot read file: {exc.strerror or exc}", path) from None


def _is_native_npz(path: Path) -> bool:
    try:
        with zipfile.ZipFile(path) as zf:
            return "logical_count.npy" in zf.namelist() and "meta.npy" in zf.namelist()
    except zipfile.BadZipFile:
        return False


def load_any(path: str | os.PathLike) -> tuple[str, Any]:
    """Load a file by content: returns (kind, object) with kind ``npz``, ``json`` or ``pt``."""
    path = Path(path)
    if not path.exists():
        raise SceneEplbError("no such file", path)
    if path.is_dir():
        raise SceneEplbError("is a directory, expected a file", path)
    if _is_zip(path):
        if _is_native_npz(path):
            return "npz", path
        if path.suffix == ".npz":
            raise SceneEplbError("not a scene-eplb counts archive (truncated or corrupt?)", path)
        return "pt", _load_pt(path)
    if path.suffix == ".pt":
        return "pt", _load_pt(path)
    return "json", _load_json(path)


# ---------------------------------------------------------------- counts


def _native_counts_checksum(meta: dict, data: np.ndarray) -> str:
    body = {k: v for k, v in meta.items() if k != "checksum"}
    return sha256_hex(canonical_json(body) + counts_digest(data).encode())


def _read_native_counts(path: Path) -> Counts:
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
    if meta.get("checksum") != _native_counts_checksum(meta, data):
        raise SceneEplbError("checksum mismatch: the counts or their metadata were altered or damaged", path)
    return Counts(data, meta)


def _counts_from_obj(obj: Any, path: Path) -> Counts:
    if not isinstance(obj, dict) or "logical_count" not in obj:
        raise SceneEplbError("no 'logical_count' key: not a counts file", path)
    meta = {k: v for k, v in obj.items() if k != "logical_count" and isinstance(v, (str, int, float, bool, type(None), list))}
    data = validate_count_array(obj["logical_count"], str(path))
    return Counts(data, {"imported_from": path.name, **{k: v for k, v in meta.items() if k in ("rank", "model", "role")}})


def read_counts(path: str | os.PathLike) -> Counts:
    """Read and validate a counts file of any supported format."""
    path = Path(path)
    kind, obj = load_any(path)
    counts = _read_native_counts(path) if kind == "npz" else _counts_from_obj(obj, path)
    _check_moe_layers(counts.meta.get("moe_layers"), counts.num_layers, path)
    return counts


def _check_moe_layers(moe_layers: Any, num_layers: int, path: Path) -> None:
    if moe_layers is None:
        return
    if not isinstance(moe_layers, list) or not all(isinstance(i, int) and 0 <= i < num_layers for i in moe_layers):
        raise SceneEplbError(f"moe_layers must be a list of layer indices in [0, {num_layers})", path)


def counts_meta(counts: Counts) -> dict:
    """Metadata for a native counts file: the caller's metadata plus format, shape and checksum."""
    meta = {k: v for k, v in counts.meta.items() if k not in ("checksum", "format", "version")}
    meta.update(
        format=COUNTS_FORMAT,
        version=FORMAT_VERSION,
        shape=list(counts.data.shape),
        slots_written=int(counts.written_slots().size),
        counts_sha256=counts.digest(),
    )
    meta["checksum"] = _native_counts_checksum(meta, counts.data)
    return meta


def write_counts(counts: Counts, path: str | os.PathLike, fmt: str = "native") -> Path:
    """Write counts atomically in ``fmt`` (native .npz with checksum, sglang JSON, or pt)."""
    path = Path(path)
    if fmt == "native":
        meta = np.frombuffer(json.dumps(counts_meta(counts)).encode(), dtype=np.uint8)
        return atomic_write(path, lambda fh: np.savez_compressed(fh, logical_count=counts.data, meta=meta))
    if fmt == "sglang":
        return atomic_write_bytes(path, json.dumps({"logical_count": counts.data.tolist()}).encode())
    if fmt == "pt":
        return _write_pt(path, "logical_count", counts.data)
    raise SceneEplbError(f"unknown counts format {fmt!r}; choose one of {', '.join(COUNTS_FORMATS)}")


# ---------------------------------------------------------------- layouts


def _int_map(raw: Any, what: str, path: Path) -> np.ndarray:
    try:
        arr = np.asarray(raw)
    except ValueError:
        raise SceneEplbError(f"{what} is not a rectangular array (rows of different lengths?)", path) from None
    if arr.dtype == object or arr.ndim != 2 or 0 in arr.shape:
        raise SceneEplbError(f"{what} must be a non-empty [layers, slots] array of integers, got shape {list(arr.shape)}", path)
    if arr.dtype == bool or not (np.issubdtype(arr.dtype, np.integer) or np.issubdtype(arr.dtype, np.floating)):
        raise SceneEplbError(f"{what} must hold integers, got {arr.dtype}", path)
    if np.issubdtype(arr.dtype, np.floating):
        if not np.isfinite(arr).all() or (arr != np.floor(arr)).any():
            raise SceneEplbError(f"{what} must hold integers (found a fractional or non-finite value)", path)
    return arr.astype(np.int64)


def _geometry_for_bare_map(p2l: np.ndarray, hint: GeometryHint, path: Path) -> Geometry:
    if hint.ep_size is None:
        raise SceneEplbError("this layout format does not record ep_size: pass --ep-size", path)
    E = hint.num_experts if hint.num_experts is not None else int(p2l.max()) + 1
    R = p2l.shape[1] - E
    if R < 0:
        how = "given" if hint.num_experts is not None else f"inferred from the largest id {int(p2l.max())}; pass --num-experts"
        raise SceneEplbError(f"{p2l.shape[1]} slots per layer cannot hold {E} experts ({how})", path)
    return _geometry(E, R, hint.ep_size, hint.num_nodes or 1, path)


def _geometry(E: int, R: int, ep: int, nodes: int, path: Path) -> Geometry:
    try:
        return Geometry(E, R, ep, nodes)
    except SceneEplbError as exc:
        raise SceneEplbError(exc.problem, path) from None


def _layout(p2l: np.ndarray, geometry: Geometry, moe_layers, meta: dict, path: Path) -> Layout:
    try:
        return Layout(p2l, geometry, moe_layers=moe_layers, meta=meta)
    except SceneEplbError as exc:
        raise SceneEplbError(exc.problem, path) from None


def _read_native_layout(doc: dict, hint: GeometryHint, path: Path) -> Layout:
    if doc.get("version") != FORMAT_VERSION:
        raise SceneEplbError(f"layout format version {doc.get('version')!r} is not supported (expected {FORMAT_VERSION})", path)
    if doc.get("checksum") != doc_checksum(doc):
        raise SceneEplbError("checksum mismatch: the layout was altered or damaged", path)
    g = doc.get("geometry")
    if not isinstance(g, dict) or not all(isinstance(g.get(k), int) for k in ("num_experts", "num_redundant", "ep_size", "num_nodes")):
        raise SceneEplbError("geometry must give integer num_experts, num_redundant, ep_size and num_nodes", path)
    geometry = _geometry(g["num_experts"], g["num_redundant"], g["ep_size"], g["num_nodes"], path)
    for name, given, have in (("ep_size", hint.ep_size, geometry.ep_size), ("experts", hint.num_experts, geometry.num_experts), ("nodes", hint.num_nodes, geometry.num_nodes)):
        if given is not None and given != have:
            raise SceneEplbError(f"layout was made for {name} {have}, but {given} was asked for", path)
    p2l = _int_map(doc.get("physical_to_logical_map"), "physical_to_logical_map", path)
    moe_layers = doc.get("moe_layers")
    _check_moe_layers(moe_layers, p2l.shape[0], path)
    return _layout(p2l, geometry, moe_layers, dict(doc.get("meta") or {}), path)


def _read_ascend_layout(doc: dict, hint: GeometryHint, path: Path) -> Layout:
    layers = doc.get("layer_list")
    if not isinstance(layers, list) or not layers:
        raise SceneEplbError("layer_list must be a non-empty list", path)
    count = doc.get("moe_layer_count")
    if count != len(layers):
        raise SceneEplbError(f"moe_layer_count {count!r} does not match the {len(layers)} entries of layer_list", path)
    rows, ep = [], None
    for k, layer in enumerate(layers):
        devices = layer.get("device_list") if isinstance(layer, dict) else None
        if not isinstance(devices, list) or not devices:
            raise SceneEplbError(f"layer_list[{k}].device_list must be a non-empty list", path)
        if ep is None:
            ep = len(devices)
        elif len(devices) != ep:
            raise SceneEplbError(f"layer_list[{k}] has {len(devices)} devices, layer 0 has {ep}", path)
        row = []
        for j, dev in enumerate(devices):
            experts = dev.get("device_expert") if isinstance(dev, dict) else None
            if not isinstance(experts, list):
                raise SceneEplbError(f"layer_list[{k}].device_list[{j}].device_expert must be a list", path)
            if len(experts) != len(devices[0].get("device_expert", [])):
                raise SceneEplbError(f"layer_list[{k}].device_list[{j}] has {len(experts)} slots, device 0 has {len(devices[0]['device_expert'])}", path)
            row.extend(experts)
        rows.append(row)
    p2l = _int_map(rows, "device_expert lists", path)
    if hint.ep_size is not None and hint.ep_size != ep:
        raise SceneEplbError(f"file lists {ep} devices per layer, but ep_size {hint.ep_size} was asked for", path)
    geometry = _geometry_for_bare_map(p2l, GeometryHint(ep, hint.num_experts, hint.num_nodes), path)
    return _layout(p2l, geometry, None, {"imported_from": path.name}, path)


def read_layout(path: str | os.PathLike, hint: GeometryHint = GeometryHint()) -> Layout:
    """Read and validate a layout of any supported format (bare formats need ``hint.ep_size``)."""
    path = Path(path)
    kind, doc = load_any(path)
    if kind == "npz" or not isinstance(doc, dict):
        raise SceneEplbError("not a layout file (expected physical_to_logical_map or an expert_map layer_list)", path)
    if doc.get("format") == LAYOUT_FORMAT:
        return _read_native_layout(doc, hint, path)
    if "layer_list" in doc:
        return _read_ascend_layout(doc, hint, path)
    if "physical_to_logical_map" in doc:
        p2l = _int_map(doc["physical_to_logical_map"], "physical_to_logical_map", path)
        return _layout(p2l, _geometry_for_bare_map(p2l, hint, path), None, {"imported_from": path.name}, path)
    if "logical_count" in doc:
        raise SceneEplbError("this is a counts file, not a layout", path)
    raise SceneEplbError("not a layout file (expected physical_to_logical_map or an expert_map layer_list)", path)


def native_layout_doc(layout: Layout) -> dict:
    """The native JSON document of a layout, checksum included."""
    doc = {
        "format": LAYOUT_FORMAT,
        "version": FORMAT_VERSION,
        "geometry": layout.geometry.to_dict(),
        "moe_layers": list(layout.moe_layers),
        "layout_hash": layout.digest(),
        "meta": layout.meta,
        "physical_to_logical_map": layout.physical_to_logical_map.tolist(),
    }
    doc["checksum"] = doc_checksum(doc)
    return doc


def ascend_expert_map(layout: Layout) -> dict:
    """vLLM-Ascend ``expert_map_path`` JSON: one entry per MoE layer in order, one list per EP rank."""
    g = layout.geometry
    per_rank = layout.physical_to_logical_map[list(layout.moe_layers)].reshape(-1, g.ep_size, g.slots_per_rank)
    return {
        "moe_layer_count": len(layout.moe_layers),
        "layer_list": [
            {
                "layer_id": k,
                "device_count": g.ep_size,
                "device_list": [{"device_id": j, "device_expert": ranks[j].tolist()} for j in range(g.ep_size)],
            }
            for k, ranks in enumerate(per_rank)
        ],
    }


def write_layout(layout: Layout, path: str | os.PathLike, fmt: str = "native") -> Path:
    """Write a layout atomically in ``fmt``."""
    path = Path(path)
    if fmt == "native":
        return atomic_write_bytes(path, json.dumps(native_layout_doc(layout)).encode())
    if fmt == "sglang":
        return atomic_write_bytes(path, json.dumps({"physical_to_logical_map": layout.physical_to_logical_map.tolist()}).encode())
    if fmt == "vllm-ascend":
        return atomic_write_bytes(path, json.dumps(ascend_expert_map(layout), indent=1).encode())
    if fmt == "pt":
        return _write_pt(path, "physical_to_logical_map", layout.physical_to_logical_map)
    raise SceneEplbError(f"unknown layout format {fmt!r}; choose one of {', '.join(LAYOUT_FORMATS)}")


def file_kind(path: str | os.PathLike) -> str:
    """``counts`` or ``layout``, from the file's content."""
    path = Path(path)
    kind, doc = load_any(path)
    if kind == "npz":
        return "counts"
    if isinstance(doc, dict):
        if "logical_count" in doc:
            return "counts"
        if doc.get("format") == LAYOUT_FORMAT or "physical_to_logical_map" in doc or "layer_list" in doc:
            return "layout"
    raise SceneEplbError("neither a counts nor a layout file", path)
