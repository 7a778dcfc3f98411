"""A record's own timing window: two real ``RecorderPlugin`` ranks on CPU (EP=2, physical ids, MoE
timed) answer through vLLM's encoding, and the API server's poller takes the window at the record's
stop from every rank's counts as it started and stopped. It must price exactly the recorded passes,
however different the traffic before and after, be dropped when the next record starts, and never
fail a stop where live counts are off."""

import asyncio
import logging
import time

import pytest
import torch

from vllm_scene_eplb.protocol import RECORD_LIVE_ACTION, RecordLive, TimingWindow
from vllm_scene_eplb.runtime.server.fanout import RouteError, WorkerFanout
from vllm_scene_eplb.runtime.server.live_poller import LivePoller
from vllm_scene_eplb.runtime.worker.worker import RecorderPlugin

from .test_worker_answers import _carried, recorder

pytestmark = pytest.mark.timed  # asserts on time or waits on a tight deadline: the first lane (tests/conftest.py)

LINEAR = torch.arange(8).repeat(2, 1)  # [L_moe, P]: slot p holds expert p; slots 0-3 on rank 0, 4-7 on rank 1
COLD = torch.tensor([[0, 1], [2, 3], [0, 1]])  # three tokens on rank 0's experts
HOT = torch.tensor([[4, 5], [6, 7], [4, 0], [5, 6]])  # four tokens, seven of eight assignments on rank 1


def _worker(ep_rank: int, **settings) -> RecorderPlugin:
    return recorder(ep_rank, LINEAR, time_moe=True, **settings)


def _passes(ranks: list[RecorderPlugin], ids: torch.Tensor, ms: float, n: int) -> None:
    """``n`` passes of ``ids`` on every rank, each of its MoE layers timed ``ms`` (the step's wall
    time, which must hold its MoE time, is slept)."""
    for _ in range(n):
        for rt in ranks:
            rt.begin_step(len(ids))
            for layer in range(2):
                rt.observer.capture(layer, ids)
                rt.add_moe_seconds(layer, ms / 1000)
            time.sleep(2 * ms / 1000 + 0.001)
            rt.end_step(False)


def _server(ranks: list[RecorderPlugin]) -> tuple[WorkerFanout, LivePoller]:
    async def call_every_worker(args: tuple) -> list:
        return _carried([rt.control(*args) for rt in ranks])

    fanout = WorkerFanout(call_every_worker)
    return fanout, LivePoller(fanout, ranks[0].config)


async def _control(fanout: WorkerFanout, poller: LivePoller, action: str):
    """What the start and stop routes do: the action on every rank, then the poller's record window."""
    await fanout.status(action, None)
    await poller.record(action)
    return poller.answer


def test_the_record_window_prices_exactly_the_recorded_passes():
    ranks = [_worker(0), _worker(1)]
    fanout, poller = _server(ranks)

    async def main():
        _passes(ranks, COLD, 9.0, 5)  # before the record: other traffic, slower
        await _control(fanout, poller, "start")
        _passes(ranks, HOT, 2.0, 3)
        stopped = await _control(fanout, poller, "stop")
        _passes(ranks, COLD, 9.0, 4)  # after it: the live windows would mix these in
        return stopped, await fanout.status("status", poller.answer)

    stopped, status = asyncio.run(main())
    t = stopped.record_time
    assert t is not None and t.rank_ms == ((2.0, 2.0), (2.0, 2.0)), t
    # per pass both DP ranks route HOT (16 assignments): rank 0 computes the two of expert 0, rank 1
    # the other fourteen, in both layers
    assert t.rank_assignments == ((2.0, 2.0), (14.0, 14.0)), t
    assert stopped.time is None  # no poller window has run: only the record's own
    window = TimingWindow.of_status(status, "the status", layers=2)
    assert window is not None and window.record and window.rank_assignments == ((2.0, 2.0), (14.0, 14.0))
    assert window.provenance["role"] == "prefill" and window.provenance["steps_per_entry"] == 1


def test_the_next_start_drops_the_last_records_window():
    ranks = [_worker(0), _worker(1)]
    fanout, poller = _server(ranks)

    async def main():
        await _control(fanout, poller, "start")
        _passes(ranks, HOT, 2.0, 2)
        assert (await _control(fanout, poller, "stop")).record_time is not None
        return await _control(fanout, poller, "start")

    assert asyncio.run(main()).record_time is None


def test_a_rank_refuses_a_record_window_before_a_record_has_stopped():
    ranks = [_worker(0), _worker(1)]
    fanout, _ = _server(ranks)
    with pytest.raises(RouteError, match="no record has started and stopped yet") as refused:
        asyncio.run(fanout.all_ok(RECORD_LIVE_ACTION, RecordLive.from_wire))
    assert refused.value.status == 409


def test_without_live_counts_a_stop_stands_and_the_log_says_why_there_is_no_window(caplog):
    ranks = [_worker(0, live_counts=False), _worker(1, live_counts=False)]
    fanout, poller = _server(ranks)

    async def main():
        await _control(fanout, poller, "start")
        _passes(ranks, HOT, 2.0, 2)
        return await _control(fanout, poller, "stop")

    with caplog.at_level(logging.WARNING, logger="vllm.scene_eplb"):
        answer = asyncio.run(main())
    assert answer is None and all(not rt.observer.status().state == "recording" for rt in ranks)
    assert "record's own timing window was not taken" in caplog.text and "live_counts is off" in caplog.text


def test_the_record_window_measures_the_critical_path_pass_by_pass():
    """Rank 0 slow on even passes, rank 1 on odd ones: both ranks' means are 2 ms a layer (4 ms over
    the two layers), but every pass waits 3 ms a layer for its slow rank: 6 ms, on the record's passes only."""
    ranks = [_worker(0), _worker(1)]
    fanout, poller = _server(ranks)

    def alternating(n: int) -> None:
        for i in range(n):
            for r, rt in enumerate(ranks):
                rt.begin_step(len(HOT))
                for layer in range(2):
                    rt.observer.capture(layer, HOT)
                    rt.add_moe_seconds(layer, (3.0 if r == i % 2 else 1.0) / 1000)
                time.sleep(0.007)
                rt.end_step(False)

    async def main():
        _passes(ranks, COLD, 9.0, 3)  # before the record: 18 ms a pass, left out
        await _control(fanout, poller, "start")
        alternating(6)
        stopped = await _control(fanout, poller, "stop")
        _passes(ranks, COLD, 9.0, 2)
        return stopped, await fanout.status("status", poller.answer)

    stopped, status = asyncio.run(main())
    t = stopped.record_time
    assert t is not None and t.rank_ms == ((2.0, 2.0), (2.0, 2.0)), t
    assert t.critical_ms == pytest.approx(6.0) and t.critical_passes == 6
    window = TimingWindow.of_status(status, "the status", layers=2)
    assert window is not None and window.critical_ms == pytest.approx(6.0)
    assert TimingWindow.from_wire(window.to_wire(), "saved", record=True).critical_ms == pytest.approx(6.0)


def test_ranks_that_ran_different_numbers_of_passes_give_no_per_pass_critical_path():
    """Lined up by number, a rank that counted one pass more than the other would pair every later
    pass with the wrong one: the record window stands, its per-pass critical path is left out."""
    ranks = [_worker(0), _worker(1)]
    fanout, poller = _server(ranks)

    async def main():
        await _control(fanout, poller, "start")
        _passes(ranks, HOT, 2.0, 3)
        _passes(ranks[:1], HOT, 2.0, 1)  # rank 0 alone: one pass more
        return await _control(fanout, poller, "stop")

    t = asyncio.run(main()).record_time
    assert t is not None and t.rank_ms and t.critical_ms is None and t.critical_passes == 0, t


def test_the_first_live_sample_is_taken_at_start_so_traffic_right_after_it_is_timed():
    """The poller samples once at its start, before the server listens: a request served at once
    (before the first window would end) still falls inside a window that ends, and the node's busy
    share reads it, not the idle windows after it."""
    from vllm_scene_eplb.runtime.server.node_flow import FlowStep, NodeFlow

    ranks = [_worker(0, live_window_s=1), _worker(1, live_window_s=1)]
    fanout, poller = _server(ranks)
    poller.flow = NodeFlow(max_num_seqs=4, started=time.monotonic())

    async def main():
        poller.start()
        await asyncio.sleep(0.05)  # the first sample, taken at once
        _passes(ranks, HOT, 20.0, 5)  # traffic at once: about 0.2 s of steps
        poller.flow.observe(FlowStep(time.monotonic(), running=1, waiting=0, kv_fetching=0, prompt_computed=20))
        await asyncio.sleep(1.5)  # the first window ends
        poller._task.cancel()
        return poller.flow.view()

    view = asyncio.run(main())
    assert view.busy_share is not None and view.busy_share > 0.05, view
