"""Layout file formats.

``scene-eplb`` (.json, the project's own format): ``physical_to_logical_map`` with geometry, MoE layers, a drafter's MoE
rows (``drafter_layers``), provenance, the fitted static table (``static_sources``) and a checksum. ``sglang``: the bare
``{"physical_to_logical_map": ...}`` SGLang's ``--init-expert-location`` takes (it rejects extra keys). ``pt``: a torch
dict with the same key. The bare two hold the target's rows only (``target_map``): nothing in them could name a drafter's.
vLLM-Ascend's ``expert_map_path`` file is in ``vllm_ascend``. Bare formats carry no geometry:
reading one needs ``GeometryHint.ep_size``.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np

from ..errors import SceneEplbError
from ..fileio import doc_checksum
from ..layouts.drafter import DRAFTER_KEY  # the scene-eplb format's key too: the drafter's MoE rows, the map's last rows
from ..layouts.expected import EXPECTED_KEY
from ..layouts.layout import Geometry, Layout
from .base import FORMAT_VERSION, OWN_FORMAT, FileFormat, GeometryHint, Loaded, check_moe_layers, int_map, write_json, write_pt

LAYOUT_FORMAT = "scene-eplb-layout"
MAP_KEY = "physical_to_logical_map"
SOURCES_KEY = "static_sources"  # scene-eplb format only: source ranks per slot under static dispatch (fitted table)


def target_map(layout: Layout) -> np.ndarray:
    """The map's target rows [L, P]: what a bare format holds (the drafter's rows would read as the target's)."""
    return layout.physical_to_logical_map[: layout.num_target_layers]


def _geometry(E: int, R: int, ep: int, nodes: int, path: Path) -> Geometry:
    try:
        return Geometry(E, R, ep, nodes)
    except SceneEplbError as exc:
        raise SceneEplbError(exc.problem, path) from None


def _layout(
    p2l: np.ndarray, geometry: Geometry, moe_layers, meta: dict, path: Path, static_sources=None, drafter_layers=()
) -> Layout:
    try:
        return Layout(p2l, geometry, moe_layers, meta, static_sources, tuple(drafter_layers))
    except SceneEplbError as exc:
        raise SceneEplbError(exc.problem, path) from None


def bare_layout(p2l: np.ndarray, hint: GeometryHint, path: Path) -> Layout:
    """A layout from a map alone: ep_size from the hint, experts from the hint or the largest id."""
    if hint.ep_size is None:
        raise SceneEplbError("this layout format does not record ep_size: pass --ep-size", path)
    E = hint.num_experts if hint.num_experts is not None else int(p2l.max()) + 1
    R = p2l.shape[1] - E
    if R < 0:
        how = "given" if hint.num_experts is not None else f"inferred from the largest id {int(p2l.max())}; pass --num-experts"
        raise SceneEplbError(f"{p2l.shape[1]} slots per layer cannot hold {E} experts ({how})", path)
    return _layout(p2l, _geometry(E, R, hint.ep_size, hint.num_nodes or 1, path), None, {"imported_from": path.name}, path)


def _read_bare(loaded: Loaded, hint: GeometryHint) -> Layout:
    return bare_layout(int_map(loaded.doc[MAP_KEY], MAP_KEY, loaded.path), hint, loaded.path)


def _meta(meta, path: Path) -> dict:
    """A scene-eplb layout's ``meta``: an object; the fields the tools read from it have their types."""
    if meta is None:
        return {}
    if not isinstance(meta, dict):
        raise SceneEplbError(f"meta must be a JSON object, got {type(meta).__name__}", path)
    for key in ("fingerprint", "dispatch", "model", "role"):
        if meta.get(key) is not None and not isinstance(meta[key], str):
            raise SceneEplbError(f"meta.{key} must be a string, got {meta[key]!r}", path)
    expected = meta.get(EXPECTED_KEY)
    if expected is not None:
        numbers_ok = isinstance(expected, dict) and all(
            expected.get(k) is None or (type(expected[k]) in (int, float) and math.isfinite(expected[k]) and expected[k] >= 1)
            for k in ("median", "worst")
        )
        if not numbers_ok or not isinstance(expected.get("dispatch"), str):
            raise SceneEplbError(
                f"meta.{EXPECTED_KEY} must be an object with a dispatch and median/worst numbers >= 1 "
                f"(or null), got {expected!r}",
                path,
            )
    return dict(meta)


def _read_own(loaded: Loaded, hint: GeometryHint) -> Layout:
    doc, path = loaded.doc, loaded.path
    if doc.get("version") != FORMAT_VERSION:
        raise SceneEplbError(f"layout format version {doc.get('version')!r} is not supported (expected {FORMAT_VERSION})", path)
    if doc.get("checksum") != doc_checksum(doc):
        raise SceneEplbError("checksum mismatch: the layout was altered or damaged", path)
    g = doc.get("geometry")
    if not isinstance(g, dict) or not all(
        isinstance(g.get(k), int) for k in ("num_experts", "num_redundant", "ep_size", "num_nodes")
    ):
        raise SceneEplbError("geometry must give integer num_experts, num_redundant, ep_size and num_nodes", path)
    geometry = _geometry(g["num_experts"], g["num_redundant"], g["ep_size"], g["num_nodes"], path)
    for name, given, have in (
        ("ep_size", hint.ep_size, geometry.ep_size),
        ("experts", hint.num_experts, geometry.num_experts),
        ("nodes", hint.num_nodes, geometry.num_nodes),
    ):
        if given is not None and given != have:
            raise SceneEplbError(f"layout was made for {name} {have}, but {given} was asked for", path)
    p2l = int_map(doc.get(MAP_KEY), MAP_KEY, path)
    moe_layers = doc.get("moe_layers")
    check_moe_layers(moe_layers, p2l.shape[0], path)
    drafter = doc.get(DRAFTER_KEY)
    check_moe_layers(drafter, p2l.shape[0], path, DRAFTER_KEY)
    sources = doc.get(SOURCES_KEY)
    sources = None if sources is None else int_map(sources, SOURCES_KEY, path)
    layout = _layout(p2l, geometry, moe_layers, _meta(doc.get("meta"), path), path, sources, drafter or ())
    if doc.get("layout_hash") not in (None, layout.digest()):
        raise SceneEplbError(f"layout_hash {doc.get('layout_hash')} does not match the content ({layout.digest()})", path)
    return layout


def own_doc(layout: Layout) -> dict:
    """The scene-eplb JSON document of a layout, checksum included."""
    doc = {
        "format": LAYOUT_FORMAT,
        "version": FORMAT_VERSION,
        "geometry": layout.geometry.to_dict(),
        "moe_layers": list(layout.moe_layers),
        **({DRAFTER_KEY: list(layout.drafter_layers)} if layout.drafter_layers else {}),
        "layout_hash": layout.digest(),
        "meta": layout.meta,
        MAP_KEY: layout.physical_to_logical_map.tolist(),
    }
    if layout.static_sources is not None:
        doc[SOURCES_KEY] = layout.static_sources.tolist()
    doc["checksum"] = doc_checksum(doc)
    return doc


def _is_own(f: Loaded) -> bool:
    return f.container == "json" and isinstance(f.doc, dict) and f.doc.get("format") == LAYOUT_FORMAT


FORMATS = (
    FileFormat("layout", OWN_FORMAT, _is_own, _read_own, lambda layout, path: write_json(path, own_doc(layout))),
    FileFormat(
        "layout",
        "sglang",
        lambda f: f.container == "json" and f.has_key(MAP_KEY) and not _is_own(f),
        _read_bare,
        lambda layout, path: write_json(path, {MAP_KEY: target_map(layout).tolist()}),
    ),
    FileFormat(
        "layout",
        "pt",
        lambda f: f.container == "pt" and f.has_key(MAP_KEY),
        _read_bare,
        lambda layout, path: write_pt(path, {MAP_KEY: target_map(layout)}),
    ),
)
