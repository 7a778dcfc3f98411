"""The plugin's settings: the ``scene_eplb`` object in vLLM's ``--additional-config``, validated.

    --additional-config '{"scene_eplb": {"role": "prefill", "buffer_slots": 512,
                          "dump_dir": "/data/eplb", "layout": "layout.json", "dispatch": "static"}}'

Absent object = plugin off. Unknown keys and bad values fail at startup with a clear message.
"""

from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass
from typing import Any

from .dispatch import DISPATCH_ALGORITHMS
from .errors import SceneEplbError

CONFIG_KEY = "scene_eplb"
ROLES = ("prefill", "decode", "auto")
DEFAULT_BUFFER_SLOTS = 512
MAX_BUFFER_SLOTS = 1 << 16
# kv_transfer_config.kv_role -> role, for role "auto".
KV_ROLE_TO_ROLE = {"kv_producer": "prefill", "kv_consumer": "decode"}


@dataclass(frozen=True)
class PluginConfig:
    """Validated plugin settings; ``role`` is still ``auto`` until resolved against the kv role."""

    role: str = "auto"
    buffer_slots: int = DEFAULT_BUFFER_SLOTS
    dump_dir: str = os.path.join(tempfile.gettempdir(), "scene-eplb")
    layout: str | None = None
    dispatch: str = "static"

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


def parse_config(additional_config: Any) -> PluginConfig | None:
    """The plugin's settings from vLLM's additional_config (a dict), or None when not enabled."""
    if not isinstance(additional_config, dict) or CONFIG_KEY not in additional_config:
        return None
    raw = additional_config[CONFIG_KEY]
    if raw is True:
        raw = {}
    if not isinstance(raw, dict):
        raise SceneEplbError(f"additional_config.{CONFIG_KEY} must be a JSON object (or true), got {type(raw).__name__}")
    known = {"role", "buffer_slots", "dump_dir", "layout", "dispatch"}
    unknown = sorted(set(raw) - known)
    if unknown:
        raise SceneEplbError(f"additional_config.{CONFIG_KEY}: unknown key(s) {unknown}; allowed: {sorted(known)}")
    role = raw.get("role", "auto")
    if role not in ROLES:
        raise SceneEplbError(f"{CONFIG_KEY}.role must be one of {', '.join(ROLES)}, got {role!r}")
    slots = raw.get("buffer_slots", DEFAULT_BUFFER_SLOTS)
    if not isinstance(slots, int) or isinstance(slots, bool) or not 1 <= slots <= MAX_BUFFER_SLOTS:
        raise SceneEplbError(f"{CONFIG_KEY}.buffer_slots must be an integer in [1, {MAX_BUFFER_SLOTS}], got {slots!r}")
    dispatch = raw.get("dispatch", "static")
    if dispatch not in DISPATCH_ALGORITHMS:
        raise SceneEplbError(f"{CONFIG_KEY}.dispatch must be one of {', '.join(DISPATCH_ALGORITHMS)}, got {dispatch!r}")
    for key in ("dump_dir", "layout"):
        if key in raw and raw[key] is not None and (not isinstance(raw[key], str) or not raw[key]):
            raise SceneEplbError(f"{CONFIG_KEY}.{key} must be a non-empty path string, got {raw[key]!r}")
    layout = raw.get("layout")
    if layout is not None and not os.path.isfile(layout):
        raise SceneEplbError(f"{CONFIG_KEY}.layout: no such file: {layout}")
    return PluginConfig(role=role, buffer_slots=slots, dump_dir=raw.get("dump_dir", PluginConfig.dump_dir), layout=layout, dispatch=dispatch)
