"""Two DP engines through vLLM-Ascend's real execute_model, one waiting for KV, and their export (tests/ascend/test_vllm_ascend_recorder.py).

Argument: the folder the dumps are written to. Prints one JSON object."""

from __future__ import annotations

import datetime
import json
import sys
import threading
import types
from types import SimpleNamespace

import torch
import torch.distributed as dist
import vllm_ascend.patch


def main() -> None:
    path = sys.argv[1]
    # stand-in for the worker patches' package __init__ only (its Qwen-VL model patches import torchvision,
    # which this machine lacks); the patch modules the model runner imports from it are the real ones
    worker_patches = types.ModuleType("vllm_ascend.patch.worker")
    worker_patches.__path__ = [vllm_ascend.patch.__path__[0] + "/worker"]
    sys.modules["vllm_ascend.patch.worker"] = worker_patches
    import vllm_scene_eplb.adapters.entry as entry

    entry.register()  # installs the runner wrappers at its first import
    import vllm_ascend.worker.model_runner_v1 as mr
    from vllm_ascend.worker.worker import NPUWorker

    from vllm_scene_eplb.adapters.vllm_ascend import patches, worker_plugin
    from vllm_scene_eplb.errors import SceneEplbError
    from vllm_scene_eplb.formats import read_counts
    from vllm_scene_eplb.runtime.export import RankRecord, export_counts
    from vllm_scene_eplb.runtime.observer import RoutingObserver

    Runner = mr.NPUModelRunner
    assert Runner.execute_model.__wrapped__ and Runner._determine_batch_execution_and_padding.__wrapped__
    ITERATIONS = [[0, 3], [0, 2], [4, 1]]  # tokens per DP rank: engine 0 waits for KV twice
    mr.get_pp_group = lambda: SimpleNamespace(world_size=1, is_last_rank=True)  # stand-ins: no PP group,
    mr.has_kv_transfer_group = lambda: True  # the Mooncake connector's group
    mr.get_kv_transfer_group = lambda: SimpleNamespace(handle_preemptions=lambda meta: None)
    shared: dict[str, list[int]] = {}  # what the DP all-reduce agreed for this iteration

    class Engine:  # a runner: vLLM-Ascend's real execute_model where nothing is
        _start_dump_data = Runner._start_dump_data
        synchronize_input_prep = Runner.synchronize_input_prep

        def __init__(self, dp_rank):
            self.dp_rank, self.no_forward = dp_rank, 0
            self.vllm_config = SimpleNamespace(model_config=SimpleNamespace(enable_return_routed_experts=False))
            self.ascend_config = SimpleNamespace(profiling_chunk_config=SimpleNamespace(need_timing=False))
            self.execute_model_state = self.speculative_config = self.debugger = self.prepare_inputs_event = None
            self.use_async_scheduling, self.pcp_size, self.decode_token_per_req = False, 1, 1
            self.parallel_config = SimpleNamespace(distributed_executor_backend="mp", data_parallel_size=2)
            self.observer = RoutingObserver(1, 4, 8, dp_size=2)

        def _update_states(self, scheduler_output):
            return None

        def kv_connector_no_forward(self, scheduler_output, vllm_config):  # KV still on its way: no forward
            self.no_forward += 1
            return "no forward"

        def _determine_batch_execution_and_padding(self, **kwargs):  # stand-in for the DP metadata sync
            return None, None, False, torch.tensor(shared["tokens"], dtype=torch.int32), None

        def _forward(self, n):
            self._determine_batch_execution_and_padding()
            self.observer.capture(0, torch.tensor([[self.dp_rank, 3]] * max(n, 1)))

        def _dummy_run(self, num_tokens, **kwargs):
            self._forward(0)

        def execute_model(self, scheduler_output, intermediate_tensors=None):  # scheduled (its early-return path),
            if scheduler_output.total_num_scheduled_tokens == 0:  # else a stand-in forward
                return Runner.execute_model.__wrapped__(self, scheduler_output, intermediate_tensors)
            self._forward(scheduler_output.total_num_scheduled_tokens)
            return "output"

        def load_model(self):
            pass

    patches.wrap_model_runner(Engine, "vllm-ascend test")
    engines = [Engine(0), Engine(1)]
    for e in engines:
        e.observer.start()
    for tokens in ITERATIONS:  # one lockstep iteration of vLLM's DP engine loop each
        shared["tokens"] = tokens
        for e in engines:
            worker_plugin._current = SimpleNamespace(  # a stand-in plugin: the step calls
                begin_step=e.observer.begin_step, end_step=e.observer.end_step, note_dp_tokens=e.observer.note_dp_tokens
            )
            so = SimpleNamespace(
                total_num_scheduled_tokens=tokens[e.dp_rank],
                kv_connector_metadata=object(),
                num_scheduled_tokens={},
                scheduled_cached_reqs=SimpleNamespace(req_ids=[], new_token_ids=[]),
            )
            e.execute_model(so)
            if tokens[e.dp_rank] == 0:  # vLLM's DP loop: nothing ran here, a peer has work
                NPUWorker.execute_dummy_batch(SimpleNamespace(model_runner=e, log_memory_stats=lambda: None))
    for e in engines:
        e.observer.stop()
    records = [e.observer.snapshot() for e in engines]

    def signature(rec) -> list:
        assert rec.signature is not None  # two DP engines: every pass carries its DP vector
        return rec.signature.tolist()

    def export(stamp_shift):
        store = dist.HashStore()
        results: list[str | None] = [None, None]

        def one(rank):
            rec = records[rank]
            group = dist.ProcessGroupGloo(store, rank, 2, datetime.timedelta(seconds=20))
            part = RankRecord(
                rec.logical.to(torch.int64), rec.stamps + (stamp_shift if rank == 0 else 0), rec.signature, rec.passes
            )
            try:
                export_counts(part, group, path + f"/shift{stamp_shift}.npz", {"role": "decode"}, 8, (1, 4))
                results[rank] = "written"
            except SceneEplbError as exc:
                results[rank] = str(exc)

        threads = [threading.Thread(target=one, args=(r,)) for r in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        return results

    aligned = export(0)
    print(
        json.dumps(
            {
                "stamps": [r.stamps.tolist() for r in records],
                "passes": [r.passes for r in records],
                "signature": [signature(r) for r in records],
                "no_forward": engines[0].no_forward,
                "aligned": aligned,
                "aligned_by": read_counts(path + "/shift0.npz").meta["aligned_by"],
                "shifted": export(1),
            }
        )
    )


if __name__ == "__main__":
    main()
