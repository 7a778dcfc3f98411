"""A layer whose rows break its comm method's rule is skipped and counted as skipped (tests/ascend/test_vllm_ascend_recorder.py).

Arguments: the model folder and its number of experts. Prints one JSON object."""

from __future__ import annotations

import json
import sys
from types import SimpleNamespace
from typing import Any

import torch

import vllm_scene_eplb.adapters.entry as entry


def main() -> None:
    model, E = sys.argv[1], int(sys.argv[2])
    entry.register()
    import vllm_ascend.ascend_forward_context as afc
    from vllm.config import ModelConfig, VllmConfig, set_current_vllm_config

    from vllm_scene_eplb.adapters.vllm_ascend.rows import OwnRows
    from vllm_scene_eplb.adapters.vllm_ascend.worker_plugin import AscendWorkerPlugin, _capture
    from vllm_scene_eplb.runtime.worker.observer import RoutingObserver

    vc = VllmConfig(model_config=ModelConfig(model=model))
    afc.set_mc2_mask(vc, "cpu")
    afc.select_moe_comm_method = lambda *a, **k: afc.MoECommType.MC2  # stand-ins for the groups, as in ascend_record.py
    afc.get_dp_group = lambda: SimpleNamespace(world_size=1)
    afc.get_tensor_model_parallel_world_size = lambda: 1
    observer = RoutingObserver(2, E, 4)
    observer.start()
    rt: Any = SimpleNamespace(own_rows=OwnRows(0, 1, 0, 1), _pass_comm=None)  # the runtime's parts _capture reads
    rt.note_comm = lambda: AscendWorkerPlugin.note_comm(rt)
    with set_current_vllm_config(vc), afc.set_ascend_forward_context(None, vc, num_tokens=8, num_actual_tokens=6):
        _capture(rt, observer, 0, torch.zeros(8, 2, dtype=torch.int32))  # the MC2 rows: counted
        _capture(rt, observer, 1, torch.zeros(5, 2, dtype=torch.int32))  # 5 rows where MC2 has 8: skipped
    observer.end_step()
    observer.stop()
    st = observer.status()
    print(
        json.dumps(
            {
                "skipped": [st.skipped_passes, st.skipped_recorded],
                "per_layer": observer.snapshot().logical.sum(dim=(0, 2)).tolist(),
            }
        )
    )


if __name__ == "__main__":
    main()
