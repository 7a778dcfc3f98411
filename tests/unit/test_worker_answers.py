"""Every worker answer crosses to the API server the way vLLM carries it and reads back typed: a real
``RecorderPlugin`` on CPU answers each control action (``WorkerAnswer.to_wire``), vLLM's own
engine-core output encoding (msgpack, ``vllm.v1.serial_utils``) carries it, and the fan-out reads it
through ``from_wire``. The typed object itself would cross as a map of its fields, not the wire's keys."""

import asyncio

import pytest
import torch

from vllm_scene_eplb.planning.model_geometry import from_hf_config
from vllm_scene_eplb.protocol import (
    EXPORT_STATUS_ACTION,
    LIVE_ACTION,
    NATIVE_ACTION,
    RankLiveAnswer,
    RankNativeLoad,
    WorkerAnswer,
    WorkerStatus,
)
from vllm_scene_eplb.runtime.config import parse_config
from vllm_scene_eplb.runtime.server.fanout import RouteError, WorkerFanout
from vllm_scene_eplb.runtime.server.live_poller import live_sample
from vllm_scene_eplb.runtime.worker.export import Exporter
from vllm_scene_eplb.runtime.worker.observer import NullObserver
from vllm_scene_eplb.runtime.worker.worker import RecorderPlugin

MODEL = {"num_hidden_layers": 3, "num_experts": 8, "num_experts_per_tok": 2, "mlp_only_layers": [0]}


def recorder(ep_rank: int, slot_to_expert: torch.Tensor | None = None, **settings) -> RecorderPlugin:
    """A bound ``RecorderPlugin`` of EP rank ``ep_rank`` of 2 (a TP=1 DP rank) on CPU, its plugin
    settings ``settings`` over a 4-entry P ring; ``slot_to_expert``: it captures physical ids."""
    cfg = parse_config({"scene_eplb": {"role": "prefill", "ring_entries": 4, "live_counts": True, **settings}})
    model = from_hf_config(MODEL)
    rt = RecorderPlugin(
        config=cfg,
        role="prefill",
        engine="vllm 0.32.0",
        model=model,
        model_name="m",
        ep_size=2,
        ep_rank=ep_rank,
        dp_rank=ep_rank,
        tp_rank=0,
        contributes=True,
        observer=NullObserver("prefill", 4),
        exporter=Exporter(None),
    )
    rt.check_moe_layers(list(model.moe_layers))
    rt.make_observer("cpu", slot_to_expert=slot_to_expert)
    return rt


def _carried(answers: list) -> list:
    """``answers`` as the API server receives them: through vLLM's engine-core output encoding."""
    from vllm.v1.engine import EngineCoreOutputs, UtilityOutput
    from vllm.v1.serial_utils import MsgpackDecoder, MsgpackEncoder, UtilityResult

    out = EngineCoreOutputs(utility_output=UtilityOutput(call_id=1, result=UtilityResult(answers)))
    decoded = MsgpackDecoder(EngineCoreOutputs).decode(MsgpackEncoder().encode(out))
    return decoded.utility_output.result.result


@pytest.fixture
def workers() -> list[RecorderPlugin]:
    ranks = [recorder(1), recorder(0)]
    for rt in ranks:
        rt.begin_step(2)
        for layer in range(2):
            rt.observer.capture(layer, torch.tensor([[0, 1], [rt.ep_rank + 2, 7]]))
        rt.end_step(False)
    return ranks


@pytest.mark.parametrize(
    "action, read",
    [("status", WorkerStatus.from_wire), (LIVE_ACTION, RankLiveAnswer.from_wire), (NATIVE_ACTION, RankNativeLoad.from_wire)],
    ids=["status", "live", "native_load"],
)
def test_each_answer_crosses_vllms_encoding_and_reads_back_the_same(workers, action, read):
    answer = workers[0].answer(action)
    (wire,) = _carried([workers[0].control(action)])
    assert wire == answer.to_wire() and WorkerAnswer.from_wire(wire, read) == answer


def test_the_object_itself_would_cross_as_a_map_of_its_fields(workers):
    answer = workers[0].answer("status")
    (crossed,) = _carried([answer])
    assert crossed != answer.to_wire() and set(crossed) == {"payload", "error", "http_status"}


def test_the_fanout_reads_every_rank_typed(workers):
    async def call_every_worker(args: tuple) -> list:
        return _carried([rt.control(*args) for rt in workers])

    async def main():
        fanout = WorkerFanout(call_every_worker)
        status = await fanout.status("status", None)
        assert [r.ep_rank for r in status.ranks] == [0, 1] and status.ranks_agree and status.status.ep_rank == 0
        sample = live_sample(await fanout.all_ok(LIVE_ACTION, RankLiveAnswer.from_wire))
        assert sample.passes == 2 and sample.logical.sum() == 16 and sample.logical[:, 7].tolist() == [2, 2]
        native = await fanout.native()
        assert not native.available and native.ranks == 2 and "vLLM-Ascend" in str(native.reason)
        with pytest.raises(RouteError, match="no export nope on this rank") as refused:
            await fanout.all_ok(EXPORT_STATUS_ACTION, WorkerStatus.from_wire, "nope")
        assert refused.value.status == 409
        started = await fanout.status("start", None)
        assert started.status.recording

    asyncio.run(main())


def test_a_broken_worker_answer_is_a_500_naming_its_field():
    async def call_every_worker(args: tuple) -> list:
        return [{"ok": True, "ep_rank": "0", "moe_layers": [1], "available": False, "reason": "x"}]

    with pytest.raises(RouteError, match="ep_rank must be an integer") as bad:
        asyncio.run(WorkerFanout(call_every_worker).native())
    assert bad.value.status == 500


def test_the_scheduled_tokens_cross_into_an_export_once_per_dp_rank():
    """Two TP ranks of one DP rank that both count their own rows (sequence-parallel MoE, vLLM-Ascend):
    both parts carry their counts, only TP rank 0's the step's 2 scheduled tokens (the export sums them)."""
    ranks = [recorder(0), recorder(1)]
    ranks[1].tp_rank = 1
    for rt in ranks:
        rt.observer.start()
        rt.begin_step(2)
        rt.observer.capture(0, torch.tensor([[rt.ep_rank, 7]]))
        rt.end_step(False)
        rt.observer.stop()
    parts = [rt.rank_record(rt.observer.snapshot()) for rt in ranks]
    assert [p.tokens for p in parts] == [2, 0]
    assert [int(p.counts.sum()) for p in parts] == [2, 2]
