"""The layout a vLLM-Ascend server loads, read once per process with the server's geometry.

Below both ``startup`` (the config hook, which reads and checks it first) and ``runtime`` (each
worker, which binds to it): the adapter's imports run one way, startup and patches -> runtime ->
this module, never back up.
"""

from __future__ import annotations

from ...errors import SceneEplbError
from ...layouts.layout import Layout
from ...planning.model_geometry import from_hf_config
from ...runtime.config import require_config
from ...runtime.layout_check import ep_ranks, layout_for_server


def ep_size_of(parallel_config) -> int:
    """EP ranks of an Ascend server: DP x TP (x PCP) when expert parallelism is on."""
    if not parallel_config.enable_expert_parallel:
        raise SceneEplbError("scene_eplb.layout needs --enable-expert-parallel (a layout places experts on EP ranks)")
    return ep_ranks(parallel_config)


def layout_of(vllm_config) -> Layout:
    """The config's ``scene_eplb.layout``, read with the server's geometry as at config time (so bare
    formats read too; MoE rows only, as vLLM-Ascend's expert map holds them), once per process."""
    path = require_config(vllm_config.additional_config).layout
    if path is None:
        raise SceneEplbError("scene_eplb.layout is not set: no layout to read")
    if path not in _loaded:
        _loaded[path] = layout_for_server(
            path,
            from_hf_config(vllm_config.model_config.hf_config.to_dict()),
            ep_size_of(vllm_config.parallel_config),
            model_layer_axis=False,
        )
    return _loaded[path]


def remember(path: str, layout: Layout) -> None:
    """Keep ``layout`` as this process's read of ``path`` (the config hook read it already)."""
    _loaded[path] = layout


_loaded: dict[str, Layout] = {}  # per process: layout path -> the layout read once
