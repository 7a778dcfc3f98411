"""Every vLLM-Ascend module that binds select_experts, rebound by the plugin's MoE hooks (tests/ascend/test_vllm_ascend_moe.py).

Prints one JSON object."""

from __future__ import annotations

import json
import sys

from vllm_scene_eplb.adapters.vllm_ascend import moe_hooks
from vllm_scene_eplb.adapters.vllm_ascend.worker_plugin import ids_hook_for


def main() -> None:
    rebound = moe_hooks.install(ids_hook_for)
    import vllm_ascend.ops.fused_moe.experts_selector as source

    original = source.select_experts.__scene_eplb_original__
    holding = sorted(
        n for n, m in list(sys.modules.items()) if n.startswith("vllm_ascend") and getattr(m, "select_experts", None) is original
    )
    cls = sys.modules[moe_hooks.FUSED_MOE_MODULE].AscendFusedMoE
    again = moe_hooks.install(ids_hook_for)  # idempotent
    print(
        json.dumps(
            {
                "rebound": rebound,
                "holding": holding,
                "forward_impl_wrapped": hasattr(cls.forward_impl, "__scene_eplb_original__"),
                "again": again,
                "not_double_wrapped": not hasattr(cls.forward_impl.__scene_eplb_original__, "__scene_eplb_original__"),
            }
        )
    )


if __name__ == "__main__":
    main()
