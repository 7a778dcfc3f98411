"""The settings that reshape the routed rows, read from vLLM-Ascend's own config (tests/ascend/test_vllm_ascend_recorder.py).

Argument: the model folder. Prints one JSON object, the unsupported settings per case."""

from __future__ import annotations

import json
import sys
from typing import Any

import vllm_scene_eplb.adapters.entry as entry


def main() -> None:
    model = sys.argv[1]
    entry.register()
    from vllm.config import ModelConfig, ParallelConfig, VllmConfig

    from vllm_scene_eplb.adapters.vllm_ascend.rows import unsupported_settings

    out = {}
    CASES: list[tuple[str, dict[str, Any], dict[str, Any]]] = [
        ("plain", {}, {}),
        ("gate", {"multistream_overlap_gate": True}, {}),
        ("flashcomm1", {"enable_flashcomm1": True}, {}),
        ("flashcomm2", {"enable_flashcomm2_parallel_size": 1}, {}),
        ("xlite", {"xlite_graph_config": {"enabled": True}}, {}),
        ("sp_by_pass", {}, {"compilation_config": {"pass_config": {"enable_sp": True}}}),
    ]
    for name, extra, kwargs in CASES:
        vc = VllmConfig(
            model_config=ModelConfig(model=model),
            additional_config={**extra, "refresh": True},
            parallel_config=ParallelConfig(tensor_parallel_size=2, enable_expert_parallel=True),
            **kwargs,
        )
        out[name] = unsupported_settings(vc)  # what AscendWorkerPlugin.bind reads once vLLM-Ascend set up its config
    print(json.dumps(out))


if __name__ == "__main__":
    main()
