"""What the scripts that drive vLLM-Ascend's routes and MoE forward share: a prefill worker's real
``AscendWorkerPlugin``, built as the worker plugin builds it (not a script: the scripts import it)."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from vllm_scene_eplb.adapters.vllm_ascend.worker_plugin import AscendWorkerPlugin


def prefill_plugin(extra: dict, model_dir: str, dp_rank: int = 0, dp_size: int = 1) -> AscendWorkerPlugin:
    """The runtime of DP rank ``dp_rank`` of ``dp_size`` (one worker per engine: TP 1, EP rank = DP rank)
    for the additional config ``extra`` and the model in ``model_dir``, bound to its MoE layers with a
    CPU observer. Imported after ``entry.register()``, as in a worker."""
    from transformers import AutoConfig

    from vllm_scene_eplb.adapters.vllm_ascend.rows import OwnRows
    from vllm_scene_eplb.adapters.vllm_ascend.worker_plugin import AscendWorkerPlugin
    from vllm_scene_eplb.planning.model_geometry import from_hf_config
    from vllm_scene_eplb.runtime.config import parse_config
    from vllm_scene_eplb.runtime.worker.export import Exporter
    from vllm_scene_eplb.runtime.worker.observer import NullObserver

    config = parse_config(extra)
    assert config is not None  # the flag is set
    model = from_hf_config(AutoConfig.from_pretrained(model_dir).to_dict())
    rt = AscendWorkerPlugin(
        config=config,
        role="prefill",
        engine="vllm-ascend test",
        model=model,
        model_name="m",
        ep_size=dp_size,
        ep_rank=dp_rank,
        dp_rank=dp_rank,
        tp_rank=0,
        contributes=True,
        observer=NullObserver("prefill", 4),
        exporter=Exporter(None),
        own_rows=OwnRows(0, 1, dp_rank, dp_size),
    )
    rt.check_moe_layers(list(model.moe_layers))
    rt.make_observer("cpu")
    return rt
