"""The plugin's settings: the ``scene_eplb`` object in vLLM's ``--additional-config``, validated.

    --additional-config '{"scene_eplb": {"role": "prefill", "ring_entries": 512, "steps_per_entry": 1, "dump_dir": "/data/eplb",
                          "export_timeout_s": 30, "layout": "layout.json", "dispatch": "static",
                          "live_window_s": 10, "drift_margin": 0.05, "drift_windows": 3,
                          "live_per_layer_metrics": false, "time_moe": false, "live_counts": true,
                          "flow_window_s": 30}}'

Absent object = plugin off. Unknown keys and bad values fail at startup with a clear message.
"""

from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass
from typing import Any

from ..errors import SceneEplbError
from ..layouts.dispatch import DISPATCH_ALGORITHMS

CONFIG_KEY = "scene_eplb"
ROLES = ("prefill", "decode", "auto")
DEFAULT_RING_ENTRIES = 512
MAX_RING_ENTRIES = 1 << 16
DEFAULT_EXPORT_TIMEOUT_S = 30.0
MAX_EXPORT_TIMEOUT_S = 3600.0
# Numeric settings: key -> (default, low, high, integer?)
NUMBERS = {
    "export_timeout_s": (DEFAULT_EXPORT_TIMEOUT_S, 1.0, MAX_EXPORT_TIMEOUT_S, False),
    "live_window_s": (10.0, 1.0, 3600.0, False),  # seconds per live-fitness window
    "drift_margin": (0.05, 0.001, 10.0, False),  # the alarm line: expected median x (1 + margin)
    "drift_windows": (3, 1, 1000, True),  # consecutive windows over the line before the alarm
    "flow_window_s": (30.0, 1.0, 3600.0, False),  # seconds of engine steps the node's flow covers
}
# On/off settings: key -> default.
FLAGS = {
    "live_per_layer_metrics": False,  # per-layer live gauges (L x more series)
    "time_moe": False,  # time each rank's local expert computation per MoE layer
    "live_counts": True,  # the cumulative live count behind live fitness (off: nothing added per step)
}
# Global steps one ring entry sums, by role, unless steps_per_entry is set: a prefill step is one
# chunk of prompts, a decode step one token per sequence (many, small: 16 of them make a 512-entry
# ring hold minutes of a D node).
STEPS_PER_ENTRY = {"prefill": 1, "decode": 16}
MAX_STEPS_PER_ENTRY = 1 << 16
# Keys renamed since an earlier release: named in the error instead of "unknown key".
RENAMED = {"buffer_slots": "ring_entries"}
# kv_transfer_config.kv_role -> role, for role "auto".
KV_ROLE_TO_ROLE = {"kv_producer": "prefill", "kv_consumer": "decode"}


@dataclass(frozen=True)
class PluginConfig:
    """Validated plugin settings; ``role`` is still ``auto`` until resolved against the kv role."""

    role: str = "auto"
    ring_entries: int = DEFAULT_RING_ENTRIES  # forward passes the recorder's ring keeps
    dump_dir: str = os.path.join(tempfile.gettempdir(), "scene-eplb")
    export_timeout_s: float = DEFAULT_EXPORT_TIMEOUT_S  # every wait of one export, rendezvous included
    live_window_s: float = NUMBERS["live_window_s"][0]
    drift_margin: float = NUMBERS["drift_margin"][0]
    drift_windows: int = int(NUMBERS["drift_windows"][0])
    flow_window_s: float = NUMBERS["flow_window_s"][0]
    live_per_layer_metrics: bool = False
    time_moe: bool = False  # time each rank's local expert computation per MoE layer (live fitness's time view)
    live_counts: bool = True  # off (decode servers): no live count, no live fitness
    layout: str | None = None
    dispatch: str = "static"
    steps_per_entry: int | None = None  # None: STEPS_PER_ENTRY of the role

    def entry_steps(self, role: str) -> int:
        """Global steps per ring entry on a server of ``role`` (resolved)."""
        return self.steps_per_entry or STEPS_PER_ENTRY[role]

    def resolve_role(self, kv_role: str | None) -> str:
        """``prefill`` or ``decode``. ``auto`` follows kv_role; a server without P/D disaggregation
        runs prefill, so it counts as ``prefill``; ``kv_both`` is ambiguous and needs an explicit role."""
        if self.role != "auto":
            return self.role
        if kv_role is None:
            return "prefill"
        if kv_role in KV_ROLE_TO_ROLE:
            return KV_ROLE_TO_ROLE[kv_role]
        raise SceneEplbError(f'scene_eplb.role is "auto" but kv_role is {kv_role!r}: set "role" to "prefill" or "decode"')


def kv_role_of(vllm_config: Any) -> str | None:
    """The server's ``kv_transfer_config.kv_role``, or None without a KV connector (no P/D split)."""
    kv = getattr(vllm_config, "kv_transfer_config", None)
    return kv.kv_role if kv is not None and kv.kv_connector else None


def plugin_enabled(additional_config: Any) -> bool:
    """True when vLLM's additional_config carries the plugin's flag (its settings are validated on the way)."""
    return parse_config(additional_config) is not None


def require_config(additional_config: Any) -> PluginConfig:
    """The plugin's settings where the caller runs only with the flag on (an error otherwise)."""
    cfg = parse_config(additional_config)
    if cfg is None:
        raise SceneEplbError(f"the scene_eplb plugin is not enabled (no {CONFIG_KEY} in --additional-config)")
    return cfg


def parse_config(additional_config: Any) -> PluginConfig | None:
    """The plugin's settings from vLLM's additional_config (a dict), or None when not enabled."""
    if not isinstance(additional_config, dict) or CONFIG_KEY not in additional_config:
        return None
    raw = additional_config[CONFIG_KEY]
    if raw is True:
        raw = {}
    if not isinstance(raw, dict):
        raise SceneEplbError(f"additional_config.{CONFIG_KEY} must be a JSON object (or true), got {type(raw).__name__}")
    known = {"role", "ring_entries", "steps_per_entry", "dump_dir", "layout", "dispatch", *FLAGS, *NUMBERS}
    unknown = sorted(set(raw) - known)
    renamed = [k for k in unknown if k in RENAMED]
    if renamed:
        raise SceneEplbError(f"additional_config.{CONFIG_KEY}: {renamed[0]!r} is now called {RENAMED[renamed[0]]!r}")
    if unknown:
        raise SceneEplbError(f"additional_config.{CONFIG_KEY}: unknown key(s) {unknown}; allowed: {sorted(known)}")
    role = raw.get("role", "auto")
    if role not in ROLES:
        raise SceneEplbError(f"{CONFIG_KEY}.role must be one of {', '.join(ROLES)}, got {role!r}")
    entries = raw.get("ring_entries", DEFAULT_RING_ENTRIES)
    if not isinstance(entries, int) or isinstance(entries, bool) or not 1 <= entries <= MAX_RING_ENTRIES:
        raise SceneEplbError(f"{CONFIG_KEY}.ring_entries must be an integer in [1, {MAX_RING_ENTRIES}], got {entries!r}")
    steps = raw.get("steps_per_entry")
    if steps is not None and (not isinstance(steps, int) or isinstance(steps, bool) or not 1 <= steps <= MAX_STEPS_PER_ENTRY):
        raise SceneEplbError(f"{CONFIG_KEY}.steps_per_entry must be an integer in [1, {MAX_STEPS_PER_ENTRY}], got {steps!r}")
    numbers = {}
    for key, (default, low, high, integer) in NUMBERS.items():
        value = raw.get(key, default)
        kinds = (int,) if integer else (int, float)
        if not isinstance(value, kinds) or isinstance(value, bool) or not low <= value <= high:
            raise SceneEplbError(
                f"{CONFIG_KEY}.{key} must be {'an integer' if integer else 'a number'} in [{low:g}, {high:g}], got {value!r}"
            )
        numbers[key] = value if integer else float(value)
    flags = {}
    for key, default in FLAGS.items():
        flags[key] = raw.get(key, default)
        if not isinstance(flags[key], bool):
            raise SceneEplbError(f"{CONFIG_KEY}.{key} must be true or false, got {flags[key]!r}")
    dispatch = raw.get("dispatch", "static")
    if dispatch not in DISPATCH_ALGORITHMS:
        raise SceneEplbError(f"{CONFIG_KEY}.dispatch must be one of {', '.join(DISPATCH_ALGORITHMS)}, got {dispatch!r}")
    for key in ("dump_dir", "layout"):
        if key in raw and raw[key] is not None and (not isinstance(raw[key], str) or not raw[key]):
            raise SceneEplbError(f"{CONFIG_KEY}.{key} must be a non-empty path string, got {raw[key]!r}")
    layout = raw.get("layout")
    if layout is not None and not os.path.isfile(layout):
        raise SceneEplbError(f"{CONFIG_KEY}.layout: no such file: {layout}")
    dump_dir = raw.get("dump_dir", PluginConfig.dump_dir)
    check_dump_dir(dump_dir)
    settings: dict[str, Any] = {**flags, **numbers}
    return PluginConfig(
        role=role, ring_entries=entries, steps_per_entry=steps, dump_dir=dump_dir, layout=layout, dispatch=dispatch, **settings
    )


def check_dump_dir(path: str) -> None:
    """Refuse at startup a ``dump_dir`` no dump could be written to: a file, a folder under a file,
    or a place this process may not write (read-only file system, permissions). It is made at the
    first dump when missing; a disk that fills up later fails that dump (HTTP 500), not startup."""
    where = os.path.abspath(path)
    while not os.path.exists(where):
        where = os.path.dirname(where)
    problem = None
    if not os.path.isdir(where):
        problem = f"{where} is not a directory"
    elif not os.access(where, os.W_OK | os.X_OK):
        problem = f"{where} is not writable (read-only file system or permissions)"
    if problem:
        raise SceneEplbError(f"{CONFIG_KEY}.dump_dir {path}: {problem}: no dump could be written there")
