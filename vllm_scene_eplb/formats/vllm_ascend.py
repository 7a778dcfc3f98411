"""vLLM-Ascend's ``expert_map_path`` JSON, the one place the project reads and writes it.

    {"moe_layer_count": K, "layer_list": [{"layer_id": k, "device_count": ep,
      "device_list": [{"device_id": j, "device_expert": [logical ids of rank j's S slots]}]}]}

Entry k is the k-th MoE layer in construction order; the file has no dense rows and no geometry
beyond the device count, so experts come from the largest id unless given.
"""

from __future__ import annotations

from pathlib import Path

from ..errors import SceneEplbError
from ..layouts.layout import Layout
from .base import FileFormat, GeometryHint, Loaded, int_map, write_json
from .layouts import bare_layout


def expert_map_doc(layout: Layout) -> dict:
    """The ``expert_map_path`` document: one entry per MoE layer in order, one list per EP rank."""
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


def _rows(doc: dict, path: Path) -> tuple[list[list], int]:
    """The device_expert lists of every layer, concatenated per layer, and the device count."""
    layers = doc.get("layer_list")
    if not isinstance(layers, list) or not layers:
        raise SceneEplbError("layer_list must be a non-empty list", path)
    count = doc.get("moe_layer_count")
    if count != len(layers):
        raise SceneEplbError(f"moe_layer_count {count!r} does not match the {len(layers)} entries of layer_list", path)
    rows: list[list] = []
    ep = 0
    for k, layer in enumerate(layers):
        devices = layer.get("device_list") if isinstance(layer, dict) else None
        if not isinstance(devices, list) or not devices:
            raise SceneEplbError(f"layer_list[{k}].device_list must be a non-empty list", path)
        if not ep:
            ep = len(devices)
        elif len(devices) != ep:
            raise SceneEplbError(f"layer_list[{k}] has {len(devices)} devices, layer 0 has {ep}", path)
        row = []
        for j, dev in enumerate(devices):
            experts = dev.get("device_expert") if isinstance(dev, dict) else None
            if not isinstance(experts, list):
                raise SceneEplbError(f"layer_list[{k}].device_list[{j}].device_expert must be a list", path)
            if len(experts) != len(devices[0].get("device_expert", [])):
                raise SceneEplbError(
                    f"layer_list[{k}].device_list[{j}] has {len(experts)} slots, device 0 has {len(devices[0]['device_expert'])}",
                    path,
                )
            row.extend(experts)
        rows.append(row)
    return rows, ep


def _read(loaded: Loaded, hint: GeometryHint) -> Layout:
    path = loaded.path
    rows, ep = _rows(loaded.doc, path)
    if hint.ep_size is not None and hint.ep_size != ep:
        raise SceneEplbError(f"file lists {ep} devices per layer, but ep_size {hint.ep_size} was asked for", path)
    return bare_layout(int_map(rows, "device_expert lists", path), GeometryHint(ep, hint.num_experts, hint.num_nodes), path)


FORMAT = FileFormat(
    "layout",
    "vllm-ascend",
    lambda f: f.container == "json" and f.has_key("layer_list"),
    _read,
    lambda layout, path: write_json(path, expert_map_doc(layout), indent=1),
)
