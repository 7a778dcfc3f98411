"""MoE geometry of a Hugging Face model config (config.json): which layers are MoE, how many experts,
how they are routed (top-k, routing groups)."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

from .errors import SceneEplbError


@dataclass(frozen=True)
class ModelGeometry:
    """The parts of a model a layout must match (layer count, MoE layers, expert count) and how
    its router picks experts: ``top_k`` per token, from ``expert_groups`` routing groups
    (DeepSeek-V3's ``n_group`` = 8; 1 = no groups), which the fitter's group hedge uses."""

    num_layers: int
    moe_layers: tuple[int, ...]
    num_experts: int
    top_k: int | None = None
    expert_groups: int = 1

    def routing(self) -> dict:
        """What a counts file records of the router: top_k and expert_groups."""
        return {"top_k": self.top_k, "expert_groups": self.expert_groups}


def _moe_layers(cfg: dict, num_layers: int) -> tuple[int, ...]:
    if "first_k_dense_replace" in cfg:  # DeepSeek-V2/V3 family
        freq = int(cfg.get("moe_layer_freq", 1) or 1)
        k = int(cfg["first_k_dense_replace"])
        return tuple(i for i in range(num_layers) if i >= k and i % freq == 0)
    step = int(cfg.get("decoder_sparse_step", 1) or 1)  # Qwen2/3-MoE family
    dense = set(cfg.get("mlp_only_layers") or [])
    return tuple(i for i in range(num_layers) if i not in dense and (i + 1) % step == 0)


def from_hf_config(cfg: dict, path: str | None = None) -> ModelGeometry:
    """Read the MoE geometry from a config dict (a model directory's config.json)."""
    cfg = cfg.get("text_config", cfg)
    experts = next((cfg[k] for k in ("n_routed_experts", "num_experts", "num_local_experts") if cfg.get(k)), None)
    if not isinstance(experts, int) or not isinstance(cfg.get("num_hidden_layers"), int):
        raise SceneEplbError("config has no MoE expert count (n_routed_experts / num_experts) or num_hidden_layers", path)
    L = cfg["num_hidden_layers"]
    top_k = cfg.get("num_experts_per_tok")
    groups = cfg.get("n_group") or 1
    if not isinstance(groups, int) or groups < 1 or experts % groups:
        raise SceneEplbError(f"config n_group {groups!r} does not divide {experts} experts", path)
    return ModelGeometry(L, _moe_layers(cfg, L), experts, top_k if isinstance(top_k, int) else None, groups)


def read_hf_config(path: str | os.PathLike) -> tuple[dict, Path]:
    """A model directory's (or a config.json file's) config as a dict, and the file it came from."""
    path = Path(path)
    if path.is_dir():
        path = path / "config.json"
    try:
        cfg = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise SceneEplbError(f"cannot read model config: {exc}", path) from None
    if not isinstance(cfg, dict):
        raise SceneEplbError("model config is not a JSON object", path)
    return cfg, path


def read_model_geometry(path: str | os.PathLike) -> ModelGeometry:
    """Model geometry from a model directory or its config.json."""
    cfg, path = read_hf_config(path)
    return from_hf_config(cfg, str(path))
