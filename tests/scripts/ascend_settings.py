"""The settings that reshape the routed rows, read from vLLM-Ascend's own config, and the plugin's
refusal of a collection run under them (tests/ascend/test_vllm_ascend_recorder.py).

Arguments: the model folder (a DeepSeek-V4: it has the indexer DSA-CP needs) and a dump folder.
Prints one JSON object: per case, the unsupported settings vLLM-Ascend's config gives, whether the
sequence-parallel settings are on, and what building the config of a collection run with the plugin
said (None: it was built)."""

from __future__ import annotations

import json
import sys
from typing import Any

import vllm_scene_eplb.adapters.entry as entry


def main() -> None:
    model, dump_dir = sys.argv[1], sys.argv[2]
    entry.register()
    from vllm.config import ModelConfig, ParallelConfig, VllmConfig, set_current_vllm_config
    from vllm_ascend import utils
    from vllm_ascend.ascend_config import clear_ascend_config, get_ascend_config

    from vllm_scene_eplb.adapters.vllm_ascend.rows import unsupported_settings

    out: dict[str, Any] = {}
    CASES: list[tuple[str, dict[str, Any], dict[str, Any]]] = [
        ("plain", {}, {}),
        ("gate", {"multistream_overlap_gate": True}, {}),
        ("flashcomm1", {"enable_flashcomm1": True}, {}),
        ("dsa_cp", {"enable_flashcomm1": True, "enable_dsa_cp": True}, {}),
        ("shared_expert_dp", {"enable_shared_expert_dp": True}, {}),
        ("flashcomm2", {"enable_flashcomm2_parallel_size": 1}, {}),
        ("xlite", {"xlite_graph_config": {"enabled": True}}, {}),
        ("sp_by_pass", {}, {"compilation_config": {"pass_config": {"enable_sp": True}}}),
    ]
    for name, extra, kwargs in CASES:
        row: dict[str, Any] = {}
        for plugin in (False, True):
            clear_ascend_config()  # vLLM-Ascend's own reset of its config, enable_sp() and enable_dsa_cp()
            scene = {"scene_eplb": {"role": "prefill", "dump_dir": dump_dir}} if plugin else {}
            try:
                vc = VllmConfig(
                    model_config=ModelConfig(model=model),
                    additional_config={**extra, **scene},
                    parallel_config=ParallelConfig(tensor_parallel_size=2, enable_expert_parallel=True),
                    **kwargs,
                )
            except Exception as exc:  # the plugin's config hook: before any worker starts, before load_model
                row["refused"] = str(exc)
                continue
            if plugin:
                row["refused"] = None
                continue
            with set_current_vllm_config(vc):
                row["found"] = unsupported_settings(vc)  # what the config hook reads once vLLM-Ascend set up its config
                row["sp"] = [utils.enable_sp(vc), utils.enable_dsa_cp(), bool(get_ascend_config().enable_shared_expert_dp)]
        out[name] = row
    print(json.dumps(out))


if __name__ == "__main__":
    main()
