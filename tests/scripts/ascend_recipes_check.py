"""Each recipe's configuration through the released engine code's own checks (tests/ascend/test_ascend_recipes.py).

Arguments: the recipes (JSON: name -> kv, extra, dp, tp, env) and the model folder. Prints one JSON object, a verdict per recipe."""

from __future__ import annotations

import json
import logging
import os
import sys
import traceback
from types import SimpleNamespace


def main() -> None:
    logging.basicConfig(level=logging.INFO)  # a server configures this; a bare script must, to see the config hook's line
    import vllm_scene_eplb.adapters.entry as entry

    entry.register()
    from vllm.config import KVTransferConfig, ModelConfig, ParallelConfig, VllmConfig
    from vllm.distributed.kv_transfer.kv_connector.factory import KVConnectorFactory
    from vllm_ascend.ascend_config import get_ascend_config
    from vllm_ascend.distributed.kv_transfer import register_connector
    from vllm_ascend.distributed.kv_transfer.kv_p2p.mooncake_connector import MooncakeConnectorWorker

    register_connector()
    recipes, model = json.loads(sys.argv[1]), sys.argv[2]
    out = {}
    for name, r in recipes.items():
        os.environ.update(r.get("env", {}))
        try:
            kv = KVTransferConfig(**r["kv"])
            connector = KVConnectorFactory.get_connector_class(kv)
            worker = object.__new__(MooncakeConnectorWorker)
            worker._get_prefill_decode_size(SimpleNamespace(kv_transfer_config=kv))
            if worker._prefill_tp_size < worker._decode_tp_size:  # the worker's __init__ check, after the call above
                raise ValueError("prefill_tp_size must be >= decode_tp_size")
            pc = ParallelConfig(data_parallel_size=r["dp"], tensor_parallel_size=r["tp"], enable_expert_parallel=True)
            vc = VllmConfig(
                model_config=ModelConfig(model=model), parallel_config=pc, kv_transfer_config=kv, additional_config=r["extra"]
            )
            ascend = get_ascend_config()
            out[name] = {
                "ok": True,
                "connector": connector.__name__,
                "kv_role": vc.kv_transfer_config.kv_role,
                "kv_port": int(vc.kv_transfer_config.kv_port),
                "dynamic_eplb": ascend.eplb_config.dynamic_eplb,
                "prefill_mc2": ascend.enable_prefill_mc2,
                "expert_map_path": (vc.additional_config.get("eplb_config") or {}).get("expert_map_path"),
            }
        except BaseException as exc:
            traceback.print_exc()
            out[name] = {"ok": False, "error": f"{type(exc).__name__}: {exc}"[:600]}
    print(json.dumps(out))


if __name__ == "__main__":
    main()
