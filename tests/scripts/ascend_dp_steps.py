"""DP engines through vLLM-Ascend's real model runner code and their export (tests/ascend/test_vllm_ascend_recorder.py).

Arguments: the folder the dumps are written to and the case: ``kv`` (two engines through the real
execute_model, one waiting for KV), ``graph-modes`` (four engines through the real
``_determine_batch_execution_and_padding`` and ``_sync_metadata_across_dp``, one of them eager) or
``drafter`` (one engine whose drafter runs in ``sample_tokens``). Prints one JSON object."""

from __future__ import annotations

import datetime
import json
import sys
import threading
import types
from types import SimpleNamespace

import numpy as np
import torch
import torch.distributed as dist
import vllm_ascend.patch

from vllm_scene_eplb.errors import SceneEplbError
from vllm_scene_eplb.formats import read_counts
from vllm_scene_eplb.runtime.worker.export import RankRecord, export_counts


def runner_module():
    """vLLM-Ascend's model runner module, imported with the plugin's wrappers installed."""
    # stand-in for the worker patches' package __init__ only (its Qwen-VL model patches import torchvision,
    # which this machine lacks); the patch modules the model runner imports from it are the real ones
    worker_patches = types.ModuleType("vllm_ascend.patch.worker")
    worker_patches.__path__ = [vllm_ascend.patch.__path__[0] + "/worker"]
    sys.modules["vllm_ascend.patch.worker"] = worker_patches
    import vllm_scene_eplb.adapters.entry as entry

    entry.register()  # installs the runner wrappers at its first import
    import vllm_ascend.worker.model_runner_v1 as mr

    return mr


def on_ranks(work, size: int) -> list:
    """``work(rank, group)`` on ``size`` threads, each a rank of one Gloo group; their results."""
    store = dist.HashStore()
    results: list = [None] * size

    def one(rank):
        results[rank] = work(rank, dist.ProcessGroupGloo(store, rank, size, datetime.timedelta(seconds=20)))

    threads = [threading.Thread(target=one, args=(r,)) for r in range(size)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return results


def export(records, file: str, shift_rank0: int = 0) -> list[str]:
    """Every rank's record exported over Gloo to ``file`` (rank 0's stamps shifted by ``shift_rank0``):
    "written" or the refusal, per rank."""

    def one(rank, group):
        rec = records[rank]
        shift = shift_rank0 if rank == 0 else 0
        part = RankRecord(rec.logical.to(torch.int64), rec.stamps + shift, rec.signature, rec.passes)
        try:
            export_counts(part, group, file, {"role": "decode"}, 8, tuple(rec.logical.shape[1:]))
            return "written"
        except SceneEplbError as exc:
            return str(exc)

    return on_ranks(one, len(records))


def signature(rec) -> list:
    assert rec.signature is not None  # DP engines: every pass carries its DP vector
    return rec.signature.tolist()


def plugin_of(observer_of) -> SimpleNamespace:
    """A stand-in plugin: the step calls, straight to the observer ``observer_of()`` names."""
    return SimpleNamespace(
        begin_step=lambda tokens: observer_of().begin_step(tokens),
        end_step=lambda is_dummy: observer_of().end_step(is_dummy),
        note_dp_tokens=lambda tokens: observer_of().note_dp_tokens(tokens),
    )


def kv_wait(path: str) -> dict:
    """Two engines, engine 0 waiting for KV twice: each lockstep iteration is one step on both."""
    mr = runner_module()
    from vllm_ascend.worker.worker import NPUWorker

    from vllm_scene_eplb.adapters.vllm_ascend import patches, worker_plugin
    from vllm_scene_eplb.runtime.worker.observer import RoutingObserver

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
            worker_plugin._current = plugin_of(lambda e=e: e.observer)
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

    aligned = export(records, path + "/aligned.npz")
    return {
        "stamps": [r.stamps.tolist() for r in records],
        "passes": [r.passes for r in records],
        "signature": [signature(r) for r in records],
        "no_forward": engines[0].no_forward,
        "aligned": aligned,
        "aligned_by": read_counts(path + "/aligned.npz").meta["aligned_by"],
        "shifted": export(records, path + "/shifted.npz", 1),
    }


def graph_modes(path: str) -> dict:
    """Four decode engines in lockstep through vLLM-Ascend's real ``_determine_batch_execution_and_padding``
    and ``_sync_metadata_across_dp`` (its DP all-reduce over Gloo), FULL graphs captured up to 16
    tokens: in the second iteration engine 3 has 40 tokens and runs eager, so it gets the raw vector
    and the others ``[max] * dp``. Stand-ins: vLLM's graph dispatcher (the capture sizes), the DP group
    (a Gloo group per thread) and the config switches the padding reads (sequence parallel, o_proj
    and embedding TP, the DP all-reduce skip: all off, as in the recipes)."""
    mr = runner_module()
    from vllm.config import CUDAGraphMode
    from vllm.forward_context import BatchDescriptor

    from vllm_scene_eplb.adapters.vllm_ascend import patches, worker_plugin
    from vllm_scene_eplb.runtime.worker.observer import RoutingObserver

    Runner, dp, sizes = mr.NPUModelRunner, 4, (1, 2, 4, 8, 16)
    ITERATIONS = [[3, 1, 2, 2], [3, 1, 2, 40], [1, 1, 1, 1]]  # decode tokens per DP rank
    local = threading.local()  # this thread's engine and DP group
    mr.get_dp_group = lambda: SimpleNamespace(cpu_group=local.group)
    mr.should_skip_allreduce_across_dp_group = lambda *args, **kwargs: False
    mr.enable_sp = mr.enable_sp_by_pass = mr.oproj_tp_enable = mr.embedding_tp_enable = lambda *args, **kwargs: False
    worker_plugin._current = plugin_of(lambda: local.engine.observer)

    class Dispatcher:  # vLLM's CudagraphDispatcher: FULL graphs for the capture sizes, eager above them
        def dispatch(self, num_tokens, valid_modes=None, **kwargs):
            size = next((s for s in sizes if s >= num_tokens), None)
            if size is None or (valid_modes is not None and CUDAGraphMode.FULL not in valid_modes):
                return CUDAGraphMode.NONE, BatchDescriptor(num_tokens)
            return CUDAGraphMode.FULL, BatchDescriptor(size)

    class Engine:  # a decode runner: vLLM-Ascend's real padding and DP sync, a stand-in forward
        _determine_batch_execution_and_padding = Runner._determine_batch_execution_and_padding
        _sync_metadata_across_dp = Runner._sync_metadata_across_dp
        _pad_for_sequence_parallelism = Runner._pad_for_sequence_parallelism

        def __init__(self, dp_rank):
            self.dp_rank, self.dp_size, self.seen = dp_rank, dp, []
            self.parallel_config = SimpleNamespace(data_parallel_size=dp, data_parallel_rank=dp_rank, tensor_parallel_size=1)
            self.vllm_config = SimpleNamespace(
                parallel_config=self.parallel_config, observability_config=SimpleNamespace(cudagraph_metrics=False)
            )
            self.model_config = SimpleNamespace(is_encoder_decoder=False)
            self.ascend_config = SimpleNamespace(dp_allreduce_on_npu=False)
            self.input_batch = SimpleNamespace(num_computed_tokens_cpu=np.ones(64, dtype=np.int64), lora_id_to_lora_request={})
            self.speculative_config, self.uniform_decode_query_len = None, 1
            self.cudagraph_dispatcher = Dispatcher()
            self.observer = RoutingObserver(1, 4, 8, dp_size=dp)

        def execute_model(self, scheduler_output):
            n = scheduler_output.total_num_scheduled_tokens
            mode, _, _, across_dp, _ = self._determine_batch_execution_and_padding(n, n, np.ones(n, dtype=np.int32), 1, False)
            self.seen.append([str(mode), across_dp.tolist()])
            self.observer.capture(0, torch.tensor([[self.dp_rank, 3]] * n))

        def _dummy_run(self, num_tokens, **kwargs):
            pass

        def load_model(self):
            pass

    patches.wrap_model_runner(Engine, "vllm-ascend test")

    def run_engine(rank, group):
        local.engine, local.group = Engine(rank), group
        local.engine.observer.start()
        for tokens in ITERATIONS:
            local.engine.execute_model(SimpleNamespace(total_num_scheduled_tokens=tokens[rank]))
        local.engine.observer.stop()
        return local.engine

    engines = on_ranks(run_engine, dp)
    records = [e.observer.snapshot() for e in engines]
    aligned = export(records, path + "/aligned.npz")
    dump = read_counts(path + "/aligned.npz") if aligned == ["written"] * dp else None
    return {
        "seen": [e.seen for e in engines],
        "signature": [signature(r) for r in records],
        "aligned": aligned,
        "aligned_by": dump and dump.meta["aligned_by"],
        "entry_totals": dump and dump.data.sum(axis=(1, 2)).tolist(),
        "shifted": export(records, path + "/shifted.npz", 1),
    }


def drafter_steps(path: str) -> dict:
    """One engine with a counted drafter: vLLM-Ascend's ``execute_model`` returns None after the target's
    forward and its ``sample_tokens`` runs the drafter (``propose_draft_token_ids``), so the plugin's
    wrappers end each step after ``sample_tokens``. Steps of 3, 1 and 2 tokens each draft once per token;
    a fourth step's sampling never comes (its step ends when the fifth begins), the fifth drafts again.
    Stand-ins: the forward and the drafter's pass (a capture of 2 ids per token each)."""
    mr = runner_module()
    from vllm_scene_eplb.adapters.vllm_ascend import patches, worker_plugin
    from vllm_scene_eplb.runtime.worker.observer import RoutingObserver

    target, drafter = RoutingObserver(1, 4, 8), RoutingObserver(1, 4, 8)
    both = (target, drafter)

    def begin_step(tokens: int) -> None:
        for o in both:
            o.begin_step(tokens)

    def end_step(is_dummy: bool) -> None:
        for o in both:
            o.end_step(is_dummy)

    worker_plugin._current = SimpleNamespace(
        begin_step=begin_step, end_step=end_step, note_dp_tokens=lambda tokens: None, drafter_observer=drafter
    )

    class Engine:  # the runner's step: a forward in execute_model, the drafter's passes in sample_tokens
        def __init__(self):
            self.tokens = 0

        def _determine_batch_execution_and_padding(self, *args, **kwargs):
            return None, None, False, None, None

        def execute_model(self, scheduler_output):
            self.tokens = scheduler_output.total_num_scheduled_tokens
            self._determine_batch_execution_and_padding()
            target.capture(0, torch.tensor([[0, 1]] * self.tokens))
            return None  # sampling follows (vLLM's engine calls sample_tokens)

        def sample_tokens(self, grammar_output):
            drafter.capture(0, torch.tensor([[2, 3]] * self.tokens))
            return "output"

        def _dummy_run(self, num_tokens, **kwargs):
            pass

        def load_model(self):
            pass

    patches.wrap_model_runner(Engine, "vllm-ascend test")
    engine = Engine()
    for o in both:
        o.start()
    for tokens, sampled in ((3, True), (1, True), (2, True), (4, False), (5, True)):
        engine.execute_model(SimpleNamespace(total_num_scheduled_tokens=tokens))
        if sampled:
            engine.sample_tokens(None)
    for o in both:
        o.stop()
    records = [o.snapshot() for o in both]
    return {
        "real_sample_tokens_wrapped": hasattr(mr.NPUModelRunner.sample_tokens, "__wrapped__"),
        "stamps": [r.stamps.tolist() for r in records],
        "entry_totals": [r.logical.sum(dim=(1, 2)).tolist() for r in records],
    }


def main() -> None:
    path, case = sys.argv[1], sys.argv[2]
    print(json.dumps({"kv": kv_wait, "graph-modes": graph_modes, "drafter": drafter_steps}[case](path)))


if __name__ == "__main__":
    main()
