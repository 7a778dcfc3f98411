"""Several recorded scenes in one fit: scene weights, per-layer normalisation and the mix.

A scene is one counts file (a recorded traffic mix: prefill of long prompts, decode, ...). Scenes
are normalised per layer before they are mixed, so each scene's layer totals equal its weight and a
long recording does not drown a short one.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from ..errors import SceneEplbError
from .counts import Counts


def normalise_weights(weights: Sequence[float] | None, n: int) -> np.ndarray:
    """Scene weights [n] summing to 1 (equal when None); refuses a wrong count, zero or negative weights."""
    if weights is None:
        return np.full(n, 1.0 / n)
    w = np.asarray(list(weights), dtype=np.float64)
    if w.shape != (n,):
        raise SceneEplbError(f"{w.size} scene weight(s) given for {n} counts file(s): give one weight per file")
    if not np.isfinite(w).all() or (w <= 0).any():
        raise SceneEplbError(f"scene weights must be positive finite numbers, got {list(weights)}")
    with np.errstate(over="ignore"):
        overflows = not np.isfinite(w.sum())
    if overflows:  # weights near the float maximum: scale them down before summing
        w = w / w.max()
    return w / w.sum()


def check_scenes(scenes: Sequence[Counts], num_experts: int) -> None:
    """Refuse scenes that cannot share one layout: no scenes, another expert count or layer axis,
    or counts recorded on different models."""
    if not scenes:
        raise SceneEplbError("no counts given")
    for c in scenes:
        if c.num_experts != num_experts:
            raise SceneEplbError(f"counts have {c.num_experts} experts, geometry says {num_experts}")
        if c.num_layers != scenes[0].num_layers:
            raise SceneEplbError(f"counts have {c.num_layers} layers and {scenes[0].num_layers}: scenes must come from one model")
    models = {c.meta.get("model") for c in scenes} - {None}
    if len(models) > 1:
        raise SceneEplbError(f"counts were recorded on different models ({', '.join(sorted(map(str, models)))})")


def layer_scale(totals: np.ndarray) -> np.ndarray:
    """1 / per-layer total of counts [..., L, E] as [..., L, 1] (0 where a layer routed nothing)."""
    per_layer = totals.sum(axis=-1, keepdims=True).astype(np.float64)
    return np.divide(1.0, per_layer, out=np.zeros_like(per_layer), where=per_layer > 0)


def normalised_totals(passes: Sequence[np.ndarray]) -> np.ndarray:
    """Each scene's passes [T_s, L, E] summed and normalised per layer: float [K, L, E]."""
    totals = np.stack([np.asarray(p, dtype=np.float64).sum(axis=0) for p in passes])
    return totals * layer_scale(totals)


def mix_passes(passes: Sequence[np.ndarray], weights: np.ndarray) -> np.ndarray:
    """All scenes' passes [T_s, L, E], each scaled so its scene's layer totals equal its weight:
    float [sum T_s, L, E] (one scene: its passes unscaled)."""
    if len(passes) == 1:
        return np.asarray(passes[0], dtype=np.float64)
    return np.concatenate(
        [np.asarray(p, dtype=np.float64) * (w * layer_scale(np.asarray(p).sum(axis=0))) for p, w in zip(passes, weights)]
    )
