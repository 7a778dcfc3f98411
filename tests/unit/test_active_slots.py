"""Active slots and passes by size, captured in the engine (issue 37, item 1): each rank counts, per MoE
layer and real pass, its local slots with at least one real row, and keeps per pass-size group its
assignments, active slots and MoE seconds (device ops at the step boundary, no host sync); the
live window and the record's own window carry them to ``advise`` (``TimingWindow.rank_active_slots``,
``pass_groups``). Driven on CPU with torch, no engine."""

import asyncio

import numpy as np
import pytest
import torch

from vllm_scene_eplb.protocol import PASS_GROUP_TOKENS, TimingWindow, group_tokens, pass_group
from vllm_scene_eplb.runtime.worker.observer import RoutingObserver

from .test_record_window import LINEAR, _control, _passes, _server
from .test_runtime_torch import _top_level_ops
from .test_worker_answers import recorder

P, EP = 8, 2  # slots 0-3 on rank 0, 4-7 on rank 1 (``LINEAR``: slot p holds expert p)


def _observer(ep_rank: int = 1, **kwargs) -> RoutingObserver:
    lo = ep_rank * P // EP
    return RoutingObserver(2, P, 4, slot_to_expert=LINEAR, time_moe=True, local_slots=(lo, lo + P // EP), **kwargs)


def _pass(obs: RoutingObserver, ids: torch.Tensor, padding=None, dummy: bool = False, ms: float = 1.0) -> None:
    obs.begin_step(len(ids))
    for layer in range(2):
        obs.capture(layer, ids if layer == 0 else ids.flip(0), padding_rows=padding)
        obs.add_moe_seconds(layer, ms / 1000 * (layer + 1))
    obs.end_step(dummy)


def _expected(passes: list[tuple[torch.Tensor, torch.Tensor | None]], lo: int, hi: int) -> tuple[np.ndarray, np.ndarray]:
    """(assignments, active slots) per group [G] of layer 0, from a bincount of each pass's real rows."""
    n, k = np.zeros(len(PASS_GROUP_TOKENS) + 1), np.zeros(len(PASS_GROUP_TOKENS) + 1)
    for ids, padding in passes:
        rows = ids if padding is None else ids[~padding[: len(ids)]]
        local = torch.bincount(rows.reshape(-1).clamp(0, P - 1), minlength=P)[lo:hi]
        n[pass_group(len(ids))] += int(local.sum())
        k[pass_group(len(ids))] += int((local > 0).sum())
    return n, k


def test_a_rank_counts_its_local_slots_with_a_real_row_once_a_pass_by_pass_size():
    g = torch.Generator().manual_seed(5)
    obs = _observer(ep_rank=1)
    passes = []
    for tokens in (1, 3, 5, 20, 40, 100, 700):
        ids = torch.randint(0, P, (tokens, 2), generator=g)
        padding = torch.rand(tokens + 4, generator=g) > 0.7 if tokens > 3 else None
        _pass(obs, ids, padding)
        passes.append((ids, padding))
    _pass(obs, torch.tensor([[4, 5], [6, 7]]), dummy=True)  # a dummy pass counts nothing
    live = obs.live_counts()
    n, k = _expected(passes, 4, 8)
    assert live.groups is not None and list(live.groups.passes) == [3, 2, 1, 1]
    assert [row[0] for row in live.groups.assignments] == n.tolist()
    assert [row[0] for row in live.groups.active] == k.tolist()
    assert live.active_slots[0] == k.sum() and all(kk <= 4 * p for kk, p in zip(k, live.groups.passes))
    # MoE seconds per group: the real passes' only (layer 1 timed twice layer 0's)
    assert [row[1] for row in live.groups.seconds] == pytest.approx([0.006, 0.004, 0.002, 0.002])
    assert live.moe_passes == 8  # the dummy pass's experts still ran: the window's own passes hold it


def test_without_time_moe_or_local_slots_nothing_is_kept_and_the_step_boundary_is_unchanged():
    for obs in (RoutingObserver(2, P, 4, slot_to_expert=LINEAR, local_slots=(0, 4)), RoutingObserver(2, P, 4, time_moe=True)):
        _pass(obs, torch.tensor([[0, 1]]))
        live = obs.live_counts()
        assert obs.activity is None and live.active_slots is None and live.groups is None


def test_the_active_slots_cost_five_device_ops_a_pass_for_all_layers_and_never_sync():
    obs = _observer()
    obs.begin_step(4)
    obs.capture(0, torch.tensor([[4, 5], [0, 7]]))
    ops = [op.removeprefix("aten::") for op in _top_level_ops(lambda: obs.activity.add(obs.passes.counts, 1))]
    assert ops == ["sum", "gt", "sum", "stack", "add_"], ops
    assert not {"item", "_local_scalar_dense", "nonzero"} & set(ops)


def _tp_rank(ep_rank: int):
    """A TP rank of an EP=2 x TP=2 server: both route the whole batch, rank 0's counts count."""
    rt = recorder(ep_rank, LINEAR, time_moe=True)
    rt.contributes = ep_rank == 0
    rt.make_observer("cpu", slot_to_expert=LINEAR, active_slots=True)
    return rt


def test_the_record_window_carries_every_ranks_active_slots_and_its_passes_by_size():
    """Two TP ranks through the worker wire and the poller: the window's active slots are each rank's
    mean per pass, and its groups are the same passes (the window's means their passes-weighted means)."""
    ranks = [_tp_rank(0), _tp_rank(1)]
    fanout, poller = _server(ranks)
    small, large = torch.tensor([[0, 5], [4, 5]]), torch.randint(0, P, (100, 2), generator=torch.Generator().manual_seed(0))

    async def main():
        await _control(fanout, poller, "start")
        _passes(ranks, small, 1.0, 3)
        _passes(ranks, large, 3.0, 2)
        await _control(fanout, poller, "stop")
        return await fanout.status("status", poller.answer)

    window = TimingWindow.of_status(asyncio.run(main()), "the status", layers=2)
    assert window is not None and window.record
    # small: rank 0 computes expert 0 (one slot), rank 1 experts 4, 5, 5 (two slots); large: all four each
    assert window.rank_active_slots == ((2.2, 2.2), (2.8, 2.8)), window.rank_active_slots
    groups = window.pass_groups
    assert [(g.tokens, g.passes) for g in groups] == [((0, 8), 3), ((64, 512), 2)]
    assert groups[0].rank_active_slots == ((1.0, 1.0), (2.0, 2.0)) and groups[1].rank_active_slots == ((4.0, 4.0), (4.0, 4.0))
    assert groups[0].rank_assignments == ((1.0, 1.0), (3.0, 3.0)) and groups[0].rank_ms == ((1.0, 1.0), (1.0, 1.0))
    assert groups[1].rank_ms == ((3.0, 3.0), (3.0, 3.0))
    assert window.wait_share is None or 0 <= window.wait_share <= 1  # CPU ranks read their run-queue wait where Linux says it
    assert TimingWindow.from_wire(window.to_wire()) == window


def test_a_dp_rank_keeps_no_active_slots():
    """With DP > 1 a rank counts its own DP rank's rows while its experts compute every DP rank's: the
    adapter asks for no active slots, and the window carries none."""
    rt = recorder(0, LINEAR, time_moe=True)  # ``recorder`` makes a DP rank's observer: no active_slots
    assert rt.observer.activity is None
    rt.make_observer("cpu", slot_to_expert=None, active_slots=True)  # logical ids: no local slots to count
    assert rt.observer.activity is None


def test_the_groups_bounds_are_the_protocols():
    assert [pass_group(t) for t in (0, 7, 8, 63, 64, 511, 512, 10**6)] == [0, 0, 1, 1, 2, 2, 3, 3]
    assert [group_tokens(g) for g in range(4)] == [(0, 8), (8, 64), (64, 512), (512, None)]
