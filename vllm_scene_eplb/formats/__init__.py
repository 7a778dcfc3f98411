"""Every file format the project reads and writes, in one table; a file's format is detected here, once.

    kind     name          detect (on the loaded file)                  module
    counts   scene-eplb    a scene-eplb .npz archive                    counts
    counts   sglang        JSON dict with logical_count                 counts
    counts   pt            torch dict with logical_count                counts
    layout   scene-eplb    JSON dict with format scene-eplb-layout      layouts
    layout   sglang        JSON dict with physical_to_logical_map       layouts
    layout   pt            torch dict with physical_to_logical_map      layouts
    layout   vllm-ascend   JSON dict with layer_list (expert_map_path)  vllm_ascend

Every read is validated before use and names the file in its error; every write is atomic.
``native``, the
own format's name before the glossary gave "native" to the engines' own counters only, still
names it wherever a format is chosen (``format_name``).
"""

from __future__ import annotations

import os
from pathlib import Path

from ..errors import SceneEplbError
from ..layouts.counts import Counts
from ..layouts.drafter import drafter_layers_of
from ..layouts.layout import Layout
from . import counts as _counts
from . import layouts as _layouts
from . import vllm_ascend as _vllm_ascend
from .base import OWN_FORMAT, FileFormat, GeometryHint, Loaded, load

FORMATS: tuple[FileFormat, ...] = _counts.FORMATS + _layouts.FORMATS + (_vllm_ascend.FORMAT,)
COUNTS_FORMATS = tuple(f.name for f in FORMATS if f.kind == "counts")
LAYOUT_FORMATS = tuple(f.name for f in FORMATS if f.kind == "layout")
FORMAT_ALIASES = {"native": OWN_FORMAT}  # old spelling -> name
NOT_A_LAYOUT = "not a layout file (expected physical_to_logical_map or an expert_map layer_list)"

__all__ = [
    "COUNTS_FORMATS",
    "FORMAT_ALIASES",
    "OWN_FORMAT",
    "FORMATS",
    "LAYOUT_FORMATS",
    "GeometryHint",
    "detect",
    "dropped_parts",
    "file_kind",
    "format_name",
    "read_counts",
    "read_layout",
    "write_counts",
    "write_layout",
]


def detect(path: str | os.PathLike) -> tuple[FileFormat | None, Loaded]:
    """The format of the file at ``path`` (None when no row matches) and the loaded file."""
    loaded = load(path)
    return next((f for f in FORMATS if f.detect(loaded)), None), loaded


def format_name(name: str) -> str:
    """A format's name, an old spelling (``FORMAT_ALIASES``) read as the name it stands for."""
    return FORMAT_ALIASES.get(name, name)


def _lookup(kind: str, name: str) -> FileFormat:
    name = format_name(name)
    for f in FORMATS:
        if f.kind == kind and f.name == name:
            return f
    names = COUNTS_FORMATS if kind == "counts" else LAYOUT_FORMATS
    raise SceneEplbError(f"unknown {kind} format {name!r}; choose one of {', '.join(names)}")


def read_counts(path: str | os.PathLike) -> Counts:
    """Read and validate a counts file of any supported format."""
    fmt, loaded = detect(path)
    if fmt is None or fmt.kind != "counts":
        raise SceneEplbError("no 'logical_count' key: not a counts file", loaded.path)
    return fmt.read(loaded, GeometryHint())


def read_layout(path: str | os.PathLike, hint: GeometryHint | None = None) -> Layout:
    """Read and validate a layout of any supported format (bare formats need ``hint.ep_size``)."""
    hint = hint or GeometryHint()
    fmt, loaded = detect(path)
    if fmt is not None and fmt.kind == "counts" and loaded.container != "npz":
        raise SceneEplbError("this is a counts file, not a layout", loaded.path)
    if fmt is None or fmt.kind != "layout":
        raise SceneEplbError(NOT_A_LAYOUT, loaded.path)
    return fmt.read(loaded, hint)


def write_counts(counts: Counts, path: str | os.PathLike, fmt: str = OWN_FORMAT) -> Path:
    """Write counts atomically in ``fmt``."""
    return _lookup("counts", fmt).write(counts, Path(path))


def write_layout(layout: Layout, path: str | os.PathLike, fmt: str = OWN_FORMAT) -> Path:
    """Write a layout atomically in ``fmt``."""
    return _lookup("layout", fmt).write(layout, Path(path))


def file_kind(path: str | os.PathLike) -> str:
    """``counts`` or ``layout``, from the file's content."""
    fmt, loaded = detect(path)
    if fmt is None:
        raise SceneEplbError("neither a counts nor a layout file", loaded.path)
    return fmt.kind


def dropped_parts(obj: Counts | Layout, fmt: str, out: str | os.PathLike) -> tuple[list[str], str]:
    """What a file of format ``fmt`` cannot hold of ``obj`` (``--json``'s ``dropped``), and the note
    that says so (empty when nothing is lost): a bare format holds neither a layout's fitted static
    table nor a drafter's MoE rows (of a layout or of counts: nothing there could name them)."""
    if format_name(fmt) == OWN_FORMAT:
        return [], ""
    dropped, notes = [], []
    if isinstance(obj, Layout) and obj.static_sources is not None:
        dropped.append("static_sources")
        notes.append(
            f"note: {fmt} files cannot hold the fitted static table (static_sources): an engine "
            f"reading {out} alone uses its own replica choice; the scene_eplb plugin, given the "
            "scene-eplb layout, uses the fitted table"
        )
    drafter = obj.drafter_layers if isinstance(obj, Layout) else drafter_layers_of(obj)
    if drafter:
        dropped.append("drafter_layers")
        notes.append(
            f"note: {fmt} files cannot name a drafter's MoE rows: {out} holds the target model's rows only "
            f"(the drafter's layers {list(drafter)} are left out; the scene-eplb format keeps them)"
        )
    return dropped, "".join("\n" + n for n in notes)
