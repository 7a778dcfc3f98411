"""The recorder on vLLM-Ascend, run through its real released code on CPU (``tests/ascend_env``).

For every MoE comm method (MC2, ALLTOALL, ALLGATHER), every DP x TP geometry up to 2 x 2 and both
the unquantized and the W8A8-dynamic quant method, each simulated rank runs, in order, vLLM-Ascend's
real ``set_ascend_forward_context`` (its ``mc2_mask``, padding sizes and DP block size), the comm
method's real ``prepare`` (padding, TP split, DP gather) and the quant method's real ``apply`` up to
``fused_experts``, whose ``select_experts`` is the real one, hooked by the plugin. The batches carry
graph-padding rows with their own (random) router logits, so counting one of them, or a token
twice, changes the sum. The recorded counts of all ranks must equal a bincount of the ids the real
``select_experts`` gives the real tokens of each DP rank. W8A8 runs with ``mix_placement``, whose
shared-expert pseudo ids must not be counted.

Stand-ins, beside ``torch_npu``: the DP group's all-gather (the test holds every DP rank's batch and
hands back their concatenation), the TP/DP group sizes the forward context reads, the comm method
chosen (forced per case) and its ``fused_experts`` (the NPU kernels from there on: it keeps the ids
it got and returns zeros).
"""

from __future__ import annotations

import pytest

from .ascend_env import run

pytestmark = pytest.mark.engine

RECORD = r"""
import itertools, json, zlib
from functools import partial
from types import SimpleNamespace
import torch
import vllm_scene_eplb.adapters.entry as entry
entry.register()                                   # the Ascend adapter, as in a worker
import vllm_ascend.ascend_forward_context as afc
from vllm_ascend.ops.fused_moe import prepare_finalize as pf
from vllm_ascend.ops.fused_moe import moe_comm_method as mcm
from vllm_ascend.ops.fused_moe.fused_moe import AscendUnquantizedFusedMoEMethod
from vllm_ascend.quantization.methods.w8a8_dynamic import AscendW8A8DynamicFusedMoEMethod
from vllm_ascend.ops.fused_moe import experts_selector
from vllm.config import ModelConfig, VllmConfig, set_current_vllm_config
from vllm_scene_eplb.adapters.vllm_ascend import moe_hooks
from vllm_scene_eplb.adapters.vllm_ascend.runtime import CAPTURE_ATTR, AscendRuntime, _capture
from vllm_scene_eplb.adapters.vllm_ascend.rows import OwnRows
from vllm_scene_eplb.runtime.observer import RoutingObserver

E, K, H = {E}, 2, 16
REAL = {{0: [5, 3], 1: [2, 6]}}                    # real tokens per DP rank, for tp = 1 and 2
PADDED = {{0: [8, 4], 1: [4, 8]}}                  # the batch each DP rank runs (graph padding)
vc = VllmConfig(model_config=ModelConfig(model={model!r}))
afc.set_mc2_mask(vc, "cpu")
select = experts_selector.select_experts.__scene_eplb_original__
ROUTE = dict(top_k=K, use_grouped_topk=False, renormalize=False, scoring_func="sigmoid")   # the plain-torch path

class FusedExpertsStandIn:                         # NPU kernels from here on: keep the ids, return zeros
    def fused_experts(self, fused_experts_input):
        self.ids = fused_experts_input.topk_ids
        return torch.zeros_like(fused_experts_input.hidden_states)

def method(kind):
    if kind == "unquantized":
        m = object.__new__(AscendUnquantizedFusedMoEMethod)
        m.tid2eid, m.dynamic_eplb, m.moe = None, False, SimpleNamespace(has_bias=False)
        return m, {{}}, E
    m = object.__new__(AscendW8A8DynamicFusedMoEMethod)
    m.multistream_overlap_gate, m.dynamic_eplb, m.in_dtype = False, False, torch.float32
    return m, {{"mix_placement": True, "n_shared_experts": 1}}, E + 1   # the shared expert placed as expert E

results = []
for comm, (dp, tp), kind in itertools.product(["MC2", "ALLTOALL", "ALLGATHER"], [(1, 1), (1, 2), (2, 1), (2, 2)], ["unquantized", "w8a8_dynamic"]):
    g = torch.Generator().manual_seed(zlib.crc32(repr((comm, dp, tp, kind)).encode()))  # the same every process (hash() is salted)
    real, padded = [REAL[d][tp - 1] for d in range(dp)], [PADDED[d][tp - 1] for d in range(dp)]
    batches = [(torch.randn(n, H, generator=g), torch.randn(n, E, generator=g)) for n in padded]
    want = torch.zeros(E, dtype=torch.int64)       # the real tokens' ids, from the real select_experts
    for d in range(dp):
        ids = select(hidden_states=batches[d][0][:real[d]], router_logits=batches[d][1][:real[d]], **ROUTE)[1]
        want += torch.bincount(ids.flatten().to(torch.int64), minlength=E)
    mx = max(padded)
    gathered = [torch.cat([torch.nn.functional.pad(b[i], (0, 0, 0, mx - b[i].shape[0])) for b in batches]) for i in (0, 1)]
    got = torch.zeros(E, dtype=torch.int64)
    for d, t in itertools.product(range(dp), range(tp)):
        observer = RoutingObserver(1, E, 4)
        observer.start()
        own = OwnRows(tp_rank=t, tp_size=tp, dp_rank=d, dp_size=dp)
        m, extra, num_experts = method(kind)
        layer = SimpleNamespace(w13_weight=torch.zeros(1), w2_weight=torch.zeros(1), w13_weight_scale_fp32=torch.ones(1),
                                w2_weight_scale=torch.ones(1), swiglu_limit=0.0, layer_id=0,
                                vllm_config=vc, **extra)
        rt = SimpleNamespace(own_rows=own, _pass_comm=None)      # the runtime's parts _capture reads
        rt.note_comm = partial(AscendRuntime.note_comm, rt)
        layer.__dict__[CAPTURE_ATTR] = partial(_capture, rt, observer, 0)   # what AscendRuntime.bind installs
        standin = FusedExpertsStandIn()
        afc.get_dp_group = lambda: SimpleNamespace(world_size=dp)
        afc.get_tensor_model_parallel_world_size = lambda: tp
        afc.select_moe_comm_method = lambda *a, **k: afc.MoECommType[comm]
        mcm._MoECommMethods[afc.MoECommType[comm]] = standin   # their registry of comm methods
        pf.get_tensor_model_parallel_world_size, pf.get_tensor_model_parallel_rank = (lambda: tp), (lambda: t)
        gather = SimpleNamespace(all_gather=lambda x, dim, _g=gathered: _g[0] if x.shape[-1] == H else _g[1])
        moe_config = SimpleNamespace(dp_size=dp, dp_group=gather, pcp_size=1, tp_group=None)
        cls = {{"MC2": pf.PrepareAndFinalizeWithMC2, "ALLTOALL": pf.PrepareAndFinalizeWithAll2All, "ALLGATHER": pf.PrepareAndFinalizeWithAllGather}}[comm]
        prepare = cls.__new__(cls)
        prepare.moe_config, prepare.multistream_overlap_gate = moe_config, False
        if comm != "ALLGATHER":
            prepare._restore_tp_across_dp()
        with set_current_vllm_config(vc):
            vc.parallel_config.data_parallel_size, vc.parallel_config.data_parallel_rank = dp, d
            across = torch.tensor(padded, dtype=torch.int32) if dp > 1 else None
            with afc.set_ascend_forward_context(None, vc, num_tokens=padded[d], num_tokens_across_dp=across, num_actual_tokens=real[d]):
                out = prepare.prepare(batches[d][0], batches[d][1])
                token = moe_hooks.current_layer.set(layer)   # what the wrapped AscendFusedMoE.forward_impl does
                try:
                    m.apply(layer, out.hidden_states, router_logits=out.router_logits, num_experts=num_experts, **ROUTE)
                finally:
                    moe_hooks.current_layer.reset(token)
        observer.end_step()                          # the step boundary: commit this pass
        observer.stop()
        got += observer.snapshot().logical.sum(dim=(0, 1)).to(torch.int64)
        pseudo = int((standin.ids >= E).sum())
        seen = rt._pass_comm                       # the comm method the runtime read from the forward context
    results.append({{"comm": comm, "seen": seen, "dp": dp, "tp": tp, "kind": kind, "want": want.tolist(), "got": got.tolist(),
                     "pseudo_ids_seen": pseudo, "padding_rows": sum(padded) - sum(real)}})
print(json.dumps(results))
"""


@pytest.fixture(scope="module")
def recorded(tmp_path_factory):
    from vllm_scene_eplb.harness.tiny_model import TinyMoeSpec, make_tiny_moe

    spec = TinyMoeSpec()
    model = make_tiny_moe(tmp_path_factory.mktemp("ascend-recorder") / "model", spec)
    return spec, run(RECORD.format(model=str(model), E=spec.num_experts), timeout=600)


def test_recorded_counts_equal_the_real_select_experts_ids_of_real_tokens(recorded):
    """Every comm method x DP x TP x quant method: each real token counted once, no padding row, no pseudo id."""
    spec, rows = recorded
    assert len(rows) == 3 * 4 * 2
    for row in rows:
        assert row["got"] == row["want"], row
        assert row["seen"] == row["comm"]  # what the mc2 check's log line names
        assert sum(row["want"]) > 0 and row["padding_rows"] > 0
    # W8A8 with mix_placement handed pseudo ids on to fused_experts; none reached the counts
    assert all(row["pseudo_ids_seen"] > 0 for row in rows if row["kind"] == "w8a8_dynamic")


SKIPPED = r"""
import json, logging
import torch
import vllm_scene_eplb.adapters.entry as entry
entry.register()
import vllm_ascend.ascend_forward_context as afc
from vllm.config import ModelConfig, VllmConfig, set_current_vllm_config
from vllm_scene_eplb.adapters.vllm_ascend.runtime import AscendRuntime, _capture
from vllm_scene_eplb.adapters.vllm_ascend.rows import OwnRows
from vllm_scene_eplb.runtime.observer import RoutingObserver

vc = VllmConfig(model_config=ModelConfig(model={model!r}))
afc.set_mc2_mask(vc, "cpu")
from types import SimpleNamespace
afc.select_moe_comm_method = lambda *a, **k: afc.MoECommType.MC2   # stand-ins for the groups, as in RECORD
afc.get_dp_group = lambda: SimpleNamespace(world_size=1)
afc.get_tensor_model_parallel_world_size = lambda: 1
observer = RoutingObserver(2, {E}, 4)
observer.start()
rt = SimpleNamespace(own_rows=OwnRows(0, 1, 0, 1), _pass_comm=None)
rt.note_comm = lambda: AscendRuntime.note_comm(rt)
with set_current_vllm_config(vc), afc.set_ascend_forward_context(None, vc, num_tokens=8, num_actual_tokens=6):
    _capture(rt, observer, 0, torch.zeros(8, 2, dtype=torch.int32))   # the MC2 rows: counted
    _capture(rt, observer, 1, torch.zeros(5, 2, dtype=torch.int32))   # 5 rows where MC2 has 8: skipped
observer.end_step()
observer.stop()
st = observer.status()
print(json.dumps({{"skipped": [st.skipped_passes, st.skipped_recorded],
                  "per_layer": observer.snapshot().logical.sum(dim=(0, 2)).tolist()}}))
"""


def test_rows_off_the_comm_methods_rule_are_skipped_and_said(tmp_path):
    """A layer whose routed rows do not follow its comm method's rule counts nothing for that pass
    and the observer's skipped counter says so (status, dump refusal, audit read it), through
    vLLM-Ascend's real forward context."""
    from vllm_scene_eplb.harness.tiny_model import TinyMoeSpec, make_tiny_moe

    spec = TinyMoeSpec()
    out = run(SKIPPED.format(model=str(make_tiny_moe(tmp_path / "model", spec)), E=spec.num_experts))
    assert out["skipped"] == [1, 1]
    assert out["per_layer"] == [12, 0]  # layer 0: 6 real rows x top-2; layer 1: nothing


STEPS = r"""
import json, sys, threading, types
from types import SimpleNamespace
import numpy as np, torch, torch.distributed as dist
import vllm_ascend.patch
# stand-in for the worker patches' package __init__ only (its Qwen-VL model patches import torchvision,
# which this machine lacks); the patch modules the model runner imports from it are the real ones
worker_patches = types.ModuleType("vllm_ascend.patch.worker")
worker_patches.__path__ = [vllm_ascend.patch.__path__[0] + "/worker"]
sys.modules["vllm_ascend.patch.worker"] = worker_patches
import vllm_scene_eplb.adapters.entry as entry
entry.register()                                   # installs the runner wrappers at its first import
import vllm_ascend.worker.model_runner_v1 as mr
from vllm_ascend.worker.worker import NPUWorker
from vllm_scene_eplb.adapters.vllm_ascend import patches, runtime
from vllm_scene_eplb.errors import SceneEplbError
from vllm_scene_eplb.runtime.export import RankRecord, export_counts
from vllm_scene_eplb.runtime.observer import RoutingObserver
from vllm_scene_eplb.runtime.worker import RecorderRuntime

Runner = mr.NPUModelRunner
assert Runner.execute_model.__wrapped__ and Runner._determine_batch_execution_and_padding.__wrapped__
ITERATIONS = [[0, 3], [0, 2], [4, 1]]              # tokens per DP rank: engine 0 waits for KV twice
mr.get_pp_group = lambda: SimpleNamespace(world_size=1, is_last_rank=True)   # stand-ins: no PP group,
mr.has_kv_transfer_group = lambda: True                                       # the Mooncake connector's group
mr.get_kv_transfer_group = lambda: SimpleNamespace(handle_preemptions=lambda meta: None)
shared = {{}}                                       # what the DP all-reduce agreed for this iteration

class Engine:                                      # a runner: vLLM-Ascend's real execute_model where nothing is
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
    def kv_connector_no_forward(self, scheduler_output, vllm_config):   # KV still on its way: no forward
        self.no_forward += 1
        return "no forward"
    def _determine_batch_execution_and_padding(self, **kwargs):          # stand-in for the DP metadata sync
        return None, None, False, torch.tensor(shared["tokens"], dtype=torch.int32), None
    def _forward(self, n):
        self._determine_batch_execution_and_padding()
        self.observer.capture(0, torch.tensor([[self.dp_rank, 3]] * max(n, 1)))
    def _dummy_run(self, num_tokens, **kwargs):
        self._forward(0)
    def execute_model(self, scheduler_output, intermediate_tensors=None):   # scheduled (its early-return path),
        if scheduler_output.total_num_scheduled_tokens == 0:               # else a stand-in forward
            return Runner.execute_model.__wrapped__(self, scheduler_output, intermediate_tensors)
        self._forward(scheduler_output.total_num_scheduled_tokens)
        return "output"
    def load_model(self):
        pass

patches.wrap_model_runner(Engine, "vllm-ascend test")
engines = [Engine(0), Engine(1)]
for e in engines:
    e.observer.start()
for tokens in ITERATIONS:                          # one lockstep iteration of vLLM's DP engine loop each
    shared["tokens"] = tokens
    for e in engines:
        runtime._current = SimpleNamespace(begin_step=e.observer.begin_step, end_step=e.observer.end_step,
                                           note_dp_tokens=e.observer.note_dp_tokens)
        so = SimpleNamespace(total_num_scheduled_tokens=tokens[e.dp_rank], kv_connector_metadata=object(),
                             num_scheduled_tokens={{}}, scheduled_cached_reqs=SimpleNamespace(req_ids=[], new_token_ids=[]))
        out = e.execute_model(so)
        if tokens[e.dp_rank] == 0:                 # vLLM's DP loop: nothing ran here, a peer has work
            NPUWorker.execute_dummy_batch(SimpleNamespace(model_runner=e, log_memory_stats=lambda: None))
for e in engines:
    e.observer.stop()
records = [e.observer.snapshot() for e in engines]

def export(stamp_shift):
    store, results = dist.HashStore(), [None, None]
    def one(rank):
        rec = records[rank]
        group = dist.ProcessGroupGloo(store, rank, 2, __import__("datetime").timedelta(seconds=20))
        part = RankRecord(rec.logical.to(torch.int64), rec.stamps + (stamp_shift if rank == 0 else 0), rec.signature, rec.passes)
        try:
            export_counts(part, group, {path!r} + f"/shift{{stamp_shift}}.npz", {{"role": "decode"}}, 8, (1, 4))
            results[rank] = "written"
        except SceneEplbError as exc:
            results[rank] = str(exc)
    threads = [threading.Thread(target=one, args=(r,)) for r in range(2)]
    [t.start() for t in threads]
    [t.join() for t in threads]
    return results

from vllm_scene_eplb.formats import read_counts
aligned = export(0)
print(json.dumps({{"stamps": [r.stamps.tolist() for r in records], "passes": [r.passes for r in records],
                  "signature": [r.signature.tolist() for r in records], "no_forward": engines[0].no_forward,
                  "aligned": aligned, "aligned_by": read_counts({path!r} + "/shift0.npz").meta["aligned_by"],
                  "shifted": export(1)}}))
"""


def test_an_engine_waiting_for_kv_advances_one_step_per_iteration_like_its_peer(tmp_path):
    """Through vLLM-Ascend's real ``execute_model``: with nothing scheduled it returns through
    ``kv_connector_no_forward`` without a forward, and vLLM's DP loop runs ``execute_dummy_batch``
    (real): that dummy pass is the engine's one step, as its busy peer's one real pass is; both carry
    the iteration's DP tokens (the DP signature), so the dump says ``aligned_by: stamps and DP
    signatures``; the same records with one engine's stamps shifted (what the old double advance
    made) fail the export on the signature."""
    out = run(STEPS.format(path=str(tmp_path)))
    assert out["no_forward"] == 2
    assert out["stamps"] == [[0, 1, 2], [0, 1, 2]] and out["passes"] == [1, 3]
    assert out["signature"] == [[[0, 3], [0, 2], [4, 1]]] * 2
    assert out["aligned"] == ["written", "written"] and out["aligned_by"] == "stamps and DP signatures"
    assert all("do not line up across DP engines" in r for r in out["shifted"]), out["shifted"]


def test_when_imported_patches_a_module_at_its_first_import(tmp_path, monkeypatch):
    import sys

    from vllm_scene_eplb.adapters.vllm_ascend.patches import when_imported

    (tmp_path / "late_mod_for_scene_eplb.py").write_text("VALUE = 1\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    seen = []
    when_imported("late_mod_for_scene_eplb", lambda mod: seen.append(mod.VALUE))
    assert seen == []
    import late_mod_for_scene_eplb  # noqa: F401

    assert seen == [1] and sys.modules["late_mod_for_scene_eplb"].__file__.endswith("late_mod_for_scene_eplb.py")
    when_imported("late_mod_for_scene_eplb", lambda mod: seen.append(2))  # already loaded: at once
    assert seen == [1, 2]
    del sys.modules["late_mod_for_scene_eplb"]


ROUTES = r"""
import asyncio, json
from types import SimpleNamespace
import httpx
import torch
import vllm.entrypoints.openai.api_server as api
import vllm_scene_eplb.adapters.entry as entry
entry.register()                                   # the Ascend adapter, as in vLLM 0.23's API server process
from vllm.entrypoints.openai.cli_args import make_arg_parser
from vllm.utils.argparse_utils import FlexibleArgumentParser
from vllm_scene_eplb.adapters.vllm_ascend.routes import AscendEndpoints
from vllm_scene_eplb.adapters.vllm_ascend.runtime import AscendRuntime
from vllm_scene_eplb.adapters.vllm_ascend.rows import OwnRows
from vllm_scene_eplb.config import parse_config
from vllm_scene_eplb.model_geometry import from_hf_config
from vllm_scene_eplb.runtime.export import Exporter
from vllm_scene_eplb.runtime.observer import NullObserver
from transformers import AutoConfig

extra = {{"scene_eplb": {{"role": "prefill", "ring_entries": 4}}}}
args = make_arg_parser(FlexibleArgumentParser()).parse_args(["--model", {model!r}, "--additional-config", json.dumps(extra)])
app = api.build_app(args, ("generate",))          # the wrapped build_app: our routes join vLLM's app
paths = sorted(r.path for r in app.routes if "expert_distribution" in r.path or "scene_eplb" in r.path)
cfg, model = parse_config(extra), from_hf_config(AutoConfig.from_pretrained({model!r}).to_dict())
workers = []                                       # two DP engines of one worker each, bound to their observers
for d in range(2):
    rt = AscendRuntime(config=cfg, role="prefill", engine="vllm-ascend test", model=model, model_name="m", ep_size=2, ep_rank=d,
                       dp_rank=d, tp_rank=0, contributes=True, observer=NullObserver("prefill", 4), exporter=Exporter(None),
                       own_rows=OwnRows(0, 1, d, 2))
    rt.check_moe_layers(list(model.moe_layers))
    rt.make_observer("cpu")
    workers.append(rt)

class EngineCoreStandIn:                           # vLLM's engine-core client: one utility call per engine
    core_engines = [b"\x00\x00", b"\x01\x00"]
    async def _call_utility_async(self, method, rpc, timeout, rpc_args, kwargs, engine):
        assert (method, rpc, timeout) == ("collective_rpc", "scene_eplb_control", None)
        return [workers[self.core_engines.index(engine)].control(*rpc_args)]

async def main():
    client = SimpleNamespace(engine_core=EngineCoreStandIn())
    ours = AscendEndpoints(("0.23.0.post1", "0.23.0"))
    await ours.init_state(client, SimpleNamespace(), args)
    ours.attach_router(app2 := __import__("fastapi").FastAPI())
    out = {{"paths": paths}}
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app2), base_url="http://t") as http:
        out["status"] = (await http.get("/scene_eplb/status")).json()
        out["start"] = (await http.post("/start_expert_distribution_record")).status_code
        for rt in workers:
            rt.observer.capture(0, torch.tensor([[0, 1]]))
            rt.end_step(False)
        out["again"] = (await http.post("/start_expert_distribution_record")).json()
        out["stop"] = (await http.post("/stop_expert_distribution_record")).json()
        out["native"] = (await http.get("/scene_eplb/native_load")).json()
        out["recorded"] = [int(rt.observer.snapshot().logical.sum()) for rt in workers]
        # a record in which DP rank 1 skipped a layer's pass: the dump is refused, unless asked to keep it
        await http.post("/start_expert_distribution_record")
        workers[1].observer.skip(0)
        workers[1].end_step(False)
        await http.post("/stop_expert_distribution_record")
        out["skipped_status"] = (await http.get("/scene_eplb/status")).json()
        refused = await http.post("/dump_expert_distribution_record")
        out["refused"] = [refused.status_code, refused.json()["error"]]
        bad = await http.post("/dump_expert_distribution_record?keep_skipped=maybe")
        out["bad_flag"] = bad.status_code
        out["flag_elsewhere"] = (await http.post("/start_expert_distribution_record?keep_skipped=true")).status_code
        kept = await http.post("/dump_expert_distribution_record?keep_skipped=true")
        out["kept"] = [kept.status_code, kept.json().get("error", "")]
    print(json.dumps(out))

asyncio.run(main())
"""


def test_routes_on_vllm_0_23_api_server_reach_every_dp_engine(tmp_path):
    """vLLM 0.23 has no endpoint plugins: the wrapped build_app serves the routes, and each route
    reaches every DP engine's workers (one collective_rpc utility call per engine core)."""
    from vllm_scene_eplb.harness.tiny_model import TinyMoeSpec, make_tiny_moe

    model = make_tiny_moe(tmp_path / "model", TinyMoeSpec())
    out = run(ROUTES.format(model=str(model)))
    assert out["paths"] == [
        "/dump_expert_distribution_record",
        "/scene_eplb/native_load",
        "/scene_eplb/status",
        "/start_expert_distribution_record",
        "/stop_expert_distribution_record",
    ]
    st = out["status"]
    assert st["observer"] == "idle" and st["ranks_agree"] and [r["dp_rank"] for r in st["ranks"]] == [0, 1]
    assert out["start"] == 200 and "already on" in out["again"]["error"]
    assert out["stop"]["observer"] == "idle" and out["stop"]["passes_recorded"] == 1
    assert st["skipped_passes"] == 0 and st["skipped_recorded"] == 0
    ranks = out["skipped_status"]["ranks"]
    assert [(r["skipped_passes"], r["skipped_recorded"]) for r in ranks] == [(0, 0), (1, 1)]
    assert out["refused"][0] == 409 and "this record skipped 1 (MoE layer, pass) pairs" in out["refused"][1]
    assert "keep_skipped=true" in out["refused"][1] and out["bad_flag"] == 400 and out["flag_elsewhere"] == 400
    assert "skipped" not in out["kept"][1]  # past the gate (the stand-in engine has no export group)
    assert out["recorded"] == [2, 2]
    # not bound to a model with vLLM-Ascend's counters: the route says why, for all ranks
    assert out["native"]["available"] is False and out["native"]["ranks"] == 2 and "dynamic EPLB" in out["native"]["reason"]


def test_native_window_maps_vllm_ascend_slot_counters_to_logical_experts():
    """vLLM-Ascend's moe_load (tokens per local slot) over a record, through its _expert_map
    (logical -> local slot, -1 elsewhere; a shared-expert slot beyond E dropped); void when its
    EPLB moved experts or cleared the counters in between; unavailable without the counters."""
    from types import SimpleNamespace

    import torch

    from vllm_scene_eplb.adapters.vllm_ascend.native_load import UNAVAILABLE, NativeWindow

    def layer(load, emap):
        return SimpleNamespace(moe_load=torch.tensor(load), _expert_map=torch.tensor(emap))

    a = layer([5, 7, 1], [-1, 0, -1, 1, 2])  # E = 4: experts 1 and 3 here, slot 2 is shared expert 4
    b = layer([[1, 0, 0], [2, 3, 0]], [2, -1, 0, 1, -1])  # the multi-stage policy: [stages, E_local]
    window = NativeWindow(4)
    window.mark("start", [a, b])
    a.moe_load += torch.tensor([3, 4, 9])
    b.moe_load[1] += torch.tensor([1, 2, 3])
    window.mark("stop", [a, b])
    assert window.result == {"available": True, "counts": [[0, 3, 0, 4], [3, 0, 1, 2]]}
    window.mark("start", [a, b])
    a._expert_map = torch.tensor([0, -1, -1, 1, 2])
    window.mark("stop", [a, b])
    assert "moved experts" in window.result["reason"]
    window.mark("start", [a, b])
    b.moe_load.zero_()
    window.mark("stop", [a, b])
    assert "cleared its moe_load" in window.result["reason"]
    plain = SimpleNamespace(moe_load=None, _expert_map=torch.tensor([0, 1]))
    window.mark("start", [plain])
    window.mark("stop", [plain])
    assert window.result == {"available": False, "reason": UNAVAILABLE}


SETTINGS = """
import json
import vllm_scene_eplb.adapters.entry as entry
entry.register()
from vllm.config import ModelConfig, ParallelConfig, VllmConfig
from vllm_scene_eplb.adapters.vllm_ascend.rows import unsupported_settings
out = {{}}
CASES = [("plain", {{}}, {{}}), ("gate", {{"multistream_overlap_gate": True}}, {{}}), ("flashcomm1", {{"enable_flashcomm1": True}}, {{}}),
         ("flashcomm2", {{"enable_flashcomm2_parallel_size": 1}}, {{}}), ("xlite", {{"xlite_graph_config": {{"enabled": True}}}}, {{}}),
         ("sp_by_pass", {{}}, {{"compilation_config": {{"pass_config": {{"enable_sp": True}}}}}})]
for name, extra, kwargs in CASES:
    vc = VllmConfig(model_config=ModelConfig(model={model!r}), additional_config={{**extra, "refresh": True}},
                    parallel_config=ParallelConfig(tensor_parallel_size=2, enable_expert_parallel=True), **kwargs)
    out[name] = unsupported_settings(vc)          # what AscendRuntime.bind reads once vLLM-Ascend set up its config
print(json.dumps(out))
"""


def test_settings_that_reshape_the_routed_rows_are_found_in_vllm_ascends_own_config(tmp_path):
    """Read back from vLLM-Ascend's real ascend config and enable_sp(): the settings under which the
    own-row rules do not hold (a collection run refuses them when the recorder binds)."""
    from vllm_scene_eplb.harness.tiny_model import TinyMoeSpec, make_tiny_moe

    out = run(SETTINGS.format(model=str(make_tiny_moe(tmp_path / "model", TinyMoeSpec()))))
    assert out["plain"] == []
    assert out["gate"] == ["multistream_overlap_gate (routing runs before prepare)"]
    assert out["flashcomm1"] == ["sequence parallelism / flashcomm1 (its EP all-gather drops padding rows)"]
    assert any(f.startswith("flashcomm2") for f in out["flashcomm2"]), out
    assert any(f.startswith("xlite_graph_config.enabled") for f in out["xlite"]), out
    assert any(f.startswith("enable_sp_by_pass") for f in out["sp_by_pass"]), out
