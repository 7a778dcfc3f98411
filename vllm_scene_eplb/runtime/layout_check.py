"""The startup check both engine adapters run on ``scene_eplb.layout`` (pure: no engine imports)."""

from __future__ import annotations

from ..errors import SceneEplbError
from ..formats import GeometryHint, read_layout
from ..layouts.layout import Layout
from ..planning.model_geometry import ModelGeometry


def ep_ranks(parallel_config) -> int:
    """The EP group's size a server's vLLM ``ParallelConfig`` makes, DP x PCP x TP (both engines build
    their EP group over those ranks), read at configuration, before any group exists."""
    pcp = getattr(parallel_config, "prefill_context_parallel_size", 1) or 1
    return parallel_config.data_parallel_size * pcp * parallel_config.tensor_parallel_size


def layout_for_server(path: str, model: ModelGeometry, ep_size: int, model_layer_axis: bool) -> Layout:
    """Read ``path`` and refuse it, naming the file, unless it fits the model and the EP size. With
    ``model_layer_axis`` its rows must be the model's layers (an engine that looks slots up by
    model layer index, a drafter's rows after them); otherwise only its MoE rows are used."""
    try:
        layout = read_layout(path, GeometryHint(ep_size=ep_size, num_experts=model.num_experts))
        layout.check_model(len(model.moe_layers), model.num_experts, ep_size, model.moe_layers, model.num_layers)
        if model_layer_axis and layout.num_target_layers != model.num_layers:
            raise SceneEplbError(f"layout has {layout.num_target_layers} layer rows, the model has {model.num_layers} layers")
    except SceneEplbError as exc:
        raise SceneEplbError(
            f"scene_eplb.layout does not fit this server (model {model.num_experts} experts, "
            f"MoE layers {list(model.moe_layers)}, ep_size {ep_size}): {exc.problem}",
            path,
        ) from None
    return layout
