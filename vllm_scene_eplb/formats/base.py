"""What every file format shares: loading a file once by its container (npz, JSON, torch), the
geometry hint for bare layouts, and the checks of integer maps. No format logic lives here."""

from __future__ import annotations

import io
import json
import os
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ..arrays import integer_array
from ..errors import SceneEplbError
from ..fileio import atomic_write_bytes

OWN_FORMAT = "scene-eplb"  # the name of the project's own counts and layout formats

FORMAT_VERSION = 1
MAX_ID = 2**31 - 1  # expert ids and source counts in a layout: far beyond any model, safe in every int type


@dataclass(frozen=True)
class GeometryHint:
    """Geometry a bare layout file cannot carry itself, given on the command line."""

    ep_size: int | None = None
    num_experts: int | None = None
    num_nodes: int | None = None


@dataclass(frozen=True)
class Loaded:
    """A file read once: its container (``npz``, ``json`` or ``pt``) and content (the parsed
    document, or for ``npz`` the path, which the scene-eplb counts reader opens itself)."""

    path: Path
    container: str
    doc: Any

    def has_key(self, key: str) -> bool:
        return isinstance(self.doc, dict) and key in self.doc


@dataclass(frozen=True)
class FileFormat:
    """One row of the format table: what it holds (``counts`` or ``layout``), its name, how to
    recognise a loaded file, how to read one and how to write one."""

    kind: str
    name: str
    detect: Callable[[Loaded], bool]
    read: Callable[[Loaded, GeometryHint], Any]
    write: Callable[[Any, Path], Path]


def _torch(path: Path):
    try:
        import torch
    except ImportError:
        raise SceneEplbError("reading or writing .pt files needs PyTorch (pip install 'vllm-scene-eplb[torch]')", path) from None
    return torch


def available_memory() -> int:
    """Bytes of memory this process can still take (Linux MemAvailable; else free physical pages)."""
    try:
        with open("/proc/meminfo") as fh:
            for line in fh:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")


def check_fits_memory(need: int, what: str, path: Path) -> None:
    """Refuse before allocating when ``need`` bytes would not fit in the memory left."""
    left = available_memory()
    if need > left:
        raise SceneEplbError(
            f"{what} needs about {need / 2**30:.1f} GiB, more than the {left / 2**30:.1f} GiB of memory "
            "available: refused before reading",
            path,
        )


JSON_BYTES_IN_MEMORY = 12  # a decoded JSON number list takes up to ~12x its text in Python objects and arrays


def _load_json(path: Path) -> Any:
    try:
        check_fits_memory(path.stat().st_size * JSON_BYTES_IN_MEMORY, "decoding this JSON file", path)
        text = path.read_bytes()
    except OSError as exc:
        raise SceneEplbError(f"cannot read file: {exc.strerror or exc}", path) from None
    if not text.strip():
        raise SceneEplbError("file is empty", path)
    try:
        return json.loads(text)
    except (ValueError, UnicodeDecodeError) as exc:  # JSONDecodeError, and integers too long to parse
        raise SceneEplbError(f"not valid JSON (truncated or corrupt?): {exc}", path) from None
    except RecursionError:
        raise SceneEplbError("not valid JSON for this tool: nested deeper than the parser allows", path) from None


def _load_pt(path: Path) -> Any:
    torch = _torch(path)
    check_fits_memory(path.stat().st_size * 3, "loading this torch file", path)
    try:
        obj = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # torch raises many types for truncated or foreign files
        raise SceneEplbError(
            f"not a readable torch file (truncated or corrupt?): {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}",
            path,
        ) from None
    return _tensors_to_numpy(obj, path)


def _tensors_to_numpy(obj: Any, path: Path, key: str = "tensor") -> Any:
    """Every tensor in ``obj`` (a dict, nested or not) as a numpy array; a tensor that cannot hold
    exact integers densely (sparse, bfloat16/float16, complex, quantised) is refused by name."""
    if isinstance(obj, dict):
        return {k: _tensors_to_numpy(v, path, str(k)) for k, v in obj.items()}
    if not (hasattr(obj, "detach") and hasattr(obj, "numpy")):
        return obj
    torch = _torch(path)
    if obj.layout != torch.strided:
        raise SceneEplbError(f"{key} is a {obj.layout} tensor: save a dense one (tensor.to_dense())", path)
    if obj.dtype in (torch.bfloat16, torch.float16) or obj.is_complex() or obj.is_quantized:
        raise SceneEplbError(f"{key} is a {obj.dtype} tensor, which cannot hold counts or ids exactly: save it as int64", path)
    try:
        return obj.detach().cpu().numpy()
    except Exception as exc:  # noqa: BLE001 - meta, nested or foreign tensors
        raise SceneEplbError(f"{key}: cannot read this tensor ({type(exc).__name__}: {exc})", path) from None


def write_pt(path: Path, arrays: dict[str, np.ndarray]) -> Path:
    """Atomically write ``{key: int64 tensor}`` with torch.save (the dict SGLang loads)."""
    torch = _torch(path)
    buf = io.BytesIO()
    torch.save({key: torch.from_numpy(np.array(a, dtype=np.int64)) for key, a in arrays.items()}, buf)
    return atomic_write_bytes(path, buf.getvalue())


def write_json(path: Path, doc: Any, indent: int | None = None) -> Path:
    """Atomically write a JSON document."""
    return atomic_write_bytes(path, json.dumps(doc, indent=indent).encode())


def _is_zip(path: Path) -> bool:
    try:
        with path.open("rb") as fh:
            return fh.read(4) == b"PK\x03\x04"
    except OSError as exc:
        raise SceneEplbError(f"cannot read file: {exc.strerror or exc}", path) from None


def _is_own_npz(path: Path) -> bool:
    try:
        with zipfile.ZipFile(path) as zf:
            return "logical_count.npy" in zf.namelist() and "meta.npy" in zf.namelist()
    except zipfile.BadZipFile:
        return False


def load(path: str | os.PathLike) -> Loaded:
    """Load a file by its content: a scene-eplb counts archive, a torch file or JSON."""
    path = Path(path)
    if not path.exists():
        raise SceneEplbError("no such file", path)
    if path.is_dir():
        raise SceneEplbError("is a directory, expected a file", path)
    if _is_zip(path):
        if _is_own_npz(path):
            return Loaded(path, "npz", path)
        if path.suffix == ".npz":
            raise SceneEplbError("not a scene-eplb counts archive (truncated or corrupt?)", path)
        return Loaded(path, "pt", _load_pt(path))
    if path.suffix == ".pt":
        return Loaded(path, "pt", _load_pt(path))
    return Loaded(path, "json", _load_json(path))


def int_map(raw: Any, what: str, path: Path) -> np.ndarray:
    """A non-empty 2-D [layers, slots] array of integers (integral floats accepted) as int64, or a clear error."""
    return integer_array(raw, what, str(path), -MAX_ID, MAX_ID, {2: "[layer, slot]"})


def check_moe_layers(moe_layers: Any, num_layers: int, path: Path, key: str = "moe_layers") -> None:
    """``moe_layers`` metadata (or another list of layers, named ``key``), when present, must list
    layer indices of the file's layer axis."""
    if moe_layers is None:
        return
    if not isinstance(moe_layers, list) or not all(type(i) is int and 0 <= i < num_layers for i in moe_layers):
        raise SceneEplbError(f"{key} must be a list of layer indices in [0, {num_layers})", path)
