"""Observer ring buffer and in-forward replica maps (torch only, no engine)."""

import os

import numpy as np
import pytest
import torch

from vllm_scene_eplb.errors import SceneEplbError
from vllm_scene_eplb.layouts.dispatch import dynamic_tables, static_table
from vllm_scene_eplb.layouts.layout import Geometry, Layout
from vllm_scene_eplb.live.measured import SourceTraffic, fidelity, modelled_slot_counts
from vllm_scene_eplb.runtime.worker.observer import RoutingObserver
from vllm_scene_eplb.runtime.worker.replica_map import SourceRanks, layer_maps, own_source_span, row_sources

from ..conftest import run_script


def test_observer_counts_passes_once_and_skips_padding_and_dummies():
    obs = RoutingObserver(num_moe_layers=2, num_experts=4, entries=3)
    padding = torch.tensor([False, False, True, True])
    obs.start()
    obs.capture(0, torch.tensor([[0, 1], [1, 2], [3, 3], [3, 3]]), padding_rows=padding)
    obs.capture(1, torch.tensor([[2, 3], [2, 0]]))
    obs.end_step()
    obs.capture(0, torch.tensor([[0, 1]]))
    obs.end_step(is_dummy=True)  # a dummy pass is dropped
    obs.stop()
    ring = obs.snapshot().logical
    assert ring[0].tolist() == [[1, 2, 1, 0], [1, 0, 2, 1]]
    assert ring[1:].sum() == 0 and obs.status().passes_recorded == 1


def test_observer_idle_counts_nothing_and_ring_wraps():
    obs = RoutingObserver(1, 2, entries=2)
    obs.capture(0, torch.tensor([[0, 1]]))
    obs.end_step()  # not recording: cleared, not committed
    obs.start()
    for _ in range(5):
        obs.capture(0, torch.tensor([[1, 1]]))
        obs.end_step()
    obs.stop()
    assert obs.snapshot().logical.sum(dim=(1, 2)).tolist() == [2, 2]
    st = obs.status()
    assert (st.passes_recorded, st.entries_written, st.state) == (5, 2, "idle")


def test_observer_misuse_is_refused():
    obs = RoutingObserver(1, 2, entries=2)
    with pytest.raises(SceneEplbError, match="nothing recorded"):
        obs.snapshot()
    with pytest.raises(SceneEplbError, match="not on"):
        obs.stop()
    obs.start()
    with pytest.raises(SceneEplbError, match="already on"):
        obs.start()
    with pytest.raises(SceneEplbError, match="stop it before dumping"):
        obs.snapshot()


# Ops that launch no kernel (views, metadata): not counted against the capture's bound.
VIEW_OPS = {
    "aten::view",
    "aten::reshape",
    "aten::_reshape_alias",
    "aten::select",
    "aten::slice",
    "aten::unsqueeze",
    "aten::expand",
    "aten::as_strided",
    "aten::alias",
    "aten::detach",
    "aten::lift_fresh",
    "aten::_unsafe_view",
}
MAX_CAPTURE_OPS = 4  # device ops per MoE layer and pass for counting


def _top_level_ops(call) -> list[str]:
    """The aten ops ``call`` issues at top level (nested ops are an op's own implementation), views excluded."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        call()
    return [e.name for e in prof.events() if e.name.startswith("aten::") and e.cpu_parent is None and e.name not in VIEW_OPS]


@pytest.mark.parametrize("case", ["logical", "logical+padding", "physical+own_rows", "int64 ids", "skip", "sources"])
def test_capture_issues_at_most_four_device_ops_per_layer_and_never_syncs(case):
    """The bound of the capture's cost (the torch profiler on CPU sees the same aten ops a device runs):
    where/clamp/remainder/index_add_ at most, whichever mask the adapter passes; a skip is one op."""
    p2l = torch.tensor([[0, 1, 2, 3, 0, 1]] * 2)
    obs = RoutingObserver(2, 4, 4, slot_to_expert=p2l if "physical" in case else None, source_rows=case == "sources")
    ids = torch.randint(
        -1, 6, (64, 8), dtype=torch.int64 if case == "int64 ids" else torch.int32, generator=torch.Generator().manual_seed(3)
    )
    mask = torch.rand(80, generator=torch.Generator().manual_seed(4)) > 0.5
    kwargs = {"logical+padding": {"padding_rows": mask}, "physical+own_rows": {"own_rows": mask}}.get(case, {})
    call = {"skip": lambda: obs.skip(1), "sources": lambda: obs.capture_sources(1, ids[5:40], mask[5:40])}.get(
        case, lambda: obs.capture(1, ids, **kwargs)
    )
    call()  # warm: first calls may allocate
    ops = _top_level_ops(call)
    assert len(ops) <= (1 if case == "skip" else MAX_CAPTURE_OPS), ops
    assert not {"aten::item", "aten::_local_scalar_dense", "aten::nonzero"} & set(ops)


# (own rows counted apart, recording, dummy pass) -> the device ops of the step boundary that opens a ring entry
STEP_OPS = {
    (False, False, False): ["add_", "add_", "zero_"],  # skipped since bind, live, clear
    (False, False, True): ["zero_"],
    (False, True, False): [
        "zero_",
        "add_",
        "add_",
        "add_",
        "add_",
        "zero_",
    ],  # + the entry opened, the pass, skipped in the record
    (False, True, True): ["zero_", "zero_"],  # a dummy pass opens its entry, adds nothing
    (True, False, False): ["add_", "add_", "add_", "zero_", "zero_"],  # + the own rows' live and their buffer cleared
    (True, True, False): ["zero_", "zero_", "add_", "add_", "add_", "add_", "add_", "add_", "zero_", "zero_"],
    (True, True, True): ["zero_", "zero_", "zero_", "zero_"],
}


@pytest.mark.parametrize("sources, recording, dummy", list(STEP_OPS), ids=lambda v: str(v))
def test_the_step_boundary_issues_a_fixed_list_of_device_ops_and_never_syncs(sources, recording, dummy):
    """``end_step`` between passes (host): only in-place adds and zeroings of whole buffers, the
    same list every pass of its kind, no read back to the host (the parts it is composed of add none)."""
    obs = RoutingObserver(2, 4, 4, source_rows=sources)
    if recording:
        obs.start()
    obs.capture(0, torch.tensor([[0, 1]]))
    if sources:
        obs.capture_sources(0, torch.tensor([[0, 1]]))
    ops = _top_level_ops(lambda: obs.end_step(dummy))
    assert [op.removeprefix("aten::") for op in ops] == STEP_OPS[sources, recording, dummy]


def test_capture_counts_exactly_what_a_bincount_of_the_counted_rows_gives():
    """Out-of-range ids (-1, E, beyond), padding rows and other ranks' rows land in the not-counted
    column; the logical view of physical counts is the slot map's sum; the ring keeps both."""
    g = torch.Generator().manual_seed(11)
    p2l = torch.tensor([[0, 1, 2, 3, 0, 1], [3, 2, 1, 0, 3, 2]])
    obs = RoutingObserver(2, 4, 3, slot_to_expert=p2l)
    obs.start()
    want_phys = torch.zeros(2, 6, dtype=torch.int64)
    for layer in range(2):
        ids = torch.randint(-2, 9, (50, 3), generator=g)
        own = torch.rand(60, generator=g) > 0.3
        obs.capture(layer, ids, own_rows=own)
        kept = ids[own[:50]].flatten()
        kept = kept[(kept >= 0) & (kept < 6)]
        want_phys[layer] = torch.bincount(kept, minlength=6)
    obs.end_step()
    obs.stop()
    rec = obs.snapshot()
    logical, physical = rec.logical, rec.physical
    assert physical[0].tolist() == want_phys.tolist() and physical[1:].sum() == 0
    want_logical = torch.zeros(2, 4, dtype=torch.int64).scatter_add_(1, p2l, want_phys)
    assert logical[0].tolist() == want_logical.tolist()
    live = obs.live_counts()
    assert live.logical.tolist() == want_logical.tolist() and live.physical.tolist() == want_phys.tolist()


def test_skipped_passes_show_in_status_per_record_and_never_count():
    obs = RoutingObserver(2, 4, 4)
    obs.skip(0)
    obs.capture(1, torch.tensor([[0, 1]]))
    obs.end_step()  # before any record: counted since bind only
    obs.start()
    obs.skip(1)
    obs.capture(0, torch.tensor([[2, 3]]))
    obs.end_step()
    obs.skip(1)
    obs.end_step(is_dummy=True)  # a dummy pass: nothing at all
    obs.stop()
    st = obs.status()
    assert (st.skipped_passes, st.skipped_recorded) == (2, 1)
    assert obs.snapshot().logical.sum(dim=(0, 2)).tolist() == [2, 0]  # the skipped layer counted nothing
    obs.start()
    assert obs.status().skipped_recorded == 0 and obs.status().skipped_passes == 2


def test_live_counts_off_keeps_the_recorder_and_adds_nothing_live():
    obs = RoutingObserver(1, 4, 2, live_counts=False)
    assert obs.totals.counts.numel() == 0
    obs.start()
    obs.capture(0, torch.tensor([[0, 3]]))
    obs.end_step()
    obs.stop()
    assert obs.live_counts() is None and obs.snapshot().logical[0, 0].tolist() == [1, 0, 0, 1]


def test_ring_entries_sum_steps_per_entry_and_dummies_advance_the_ring():
    """Entry k holds global steps [k * spe, (k + 1) * spe): real passes add, dummy passes add nothing
    but keep the clock, so entry k means the same steps on every DP engine; the DP signature sums
    the steps' tokens per DP rank."""
    obs = RoutingObserver(1, 2, entries=8, steps_per_entry=3, dp_size=2)
    obs.end_step(is_dummy=True)  # step 0, before the record (a warm-up pass)
    obs.start()
    for step in range(1, 9):  # steps 1-8: entries 0 (steps 1-2), 1 (3-5), 2 (6-8)
        obs.note_dp_tokens([step, 10 * step])
        if step % 4 == 0:
            obs.end_step(is_dummy=True)  # an idle engine's dummy pass: the ring advances, nothing counted
            continue
        obs.capture(0, torch.tensor([[0, 1]] * step))
        obs.end_step()
    obs.stop()
    rec = obs.snapshot()
    assert rec.stamps.tolist() == [0, 1, 2] and rec.steps_per_entry == 3 and rec.passes == 6
    assert rec.logical[:, 0, 0].tolist() == [1 + 2, 3 + 5, 6 + 7]  # steps 4 and 8 were dummies
    assert rec.signature.tolist() == [[3, 30], [12, 120], [21, 210]]
    assert obs.status().entries_written == 3


def test_the_ring_keeps_the_last_entries_in_time_order_after_wrapping():
    obs = RoutingObserver(1, 2, entries=3)
    obs.start()
    for step in range(7):
        obs.capture(0, torch.tensor([[0]] * (step + 1)))
        obs.end_step()
    obs.stop()
    rec = obs.snapshot()
    assert rec.stamps.tolist() == [4, 5, 6] and rec.logical[:, 0, 0].tolist() == [5, 6, 7]
    assert obs.status().entries_written == 3 and obs.ring.entries_written == 7


def _layout() -> Layout:
    g = Geometry(num_experts=6, num_redundant=2, ep_size=2)
    p2l = np.array([[0, 1, 2, 3, 4, 5, 0, 1], [5, 1, 2, 3, 0, 4, 1, 5]])
    return Layout(p2l, g)


@pytest.mark.parametrize("algorithm", ["static", "dynamic"])
def test_replica_map_picks_a_replica_of_the_routed_expert(algorithm):
    layout = _layout()
    maps = layer_maps(layout, algorithm)
    ids = torch.randint(0, 6, (37, 3), dtype=torch.int32, generator=torch.Generator().manual_seed(7))
    for layer, m in maps.items():
        phys = m(ids)
        assert phys.dtype == ids.dtype and phys.shape == ids.shape
        assert torch.equal(torch.from_numpy(layout.physical_to_logical_map[layer])[phys.long()], ids.long())


def test_static_map_follows_the_core_table_by_row_split():
    layout = _layout()
    table = static_table(layout.physical_to_logical_map, layout.geometry)
    ids = torch.tensor([[0], [0], [0], [1], [1], [1]])
    phys = layer_maps(layout, "static")[1](ids).flatten().tolist()
    # rows 0-2 come from rank 0, rows 3-5 from rank 1
    assert phys == [table[1, 0, 0]] * 3 + [table[1, 1, 1]] * 3
    assert phys[3:] == [6, 6, 6]  # expert 1 has a replica on rank 1 (slot 6): rank 1's rows use it


def test_static_map_under_dp_uses_the_ranks_own_row_of_the_table():
    """DP attention (DP2 x TP1): each rank routes only its own tokens, so all its rows take its own
    row of the static table; with DP2 x TP2 the rows split over the DP rank's two TP ranks."""
    layout = _layout()
    table = static_table(layout.physical_to_logical_map, layout.geometry)
    ids = torch.tensor([[1]] * 4)
    for rank in (0, 1):
        phys = layer_maps(layout, "static", source=SourceRanks(rank, 1))[1](ids).flatten().tolist()
        assert phys == [table[1, rank, 1]] * 4
    assert table[1, 0, 1] != table[1, 1, 1]  # the two ranks really choose different replicas here
    with pytest.raises(ValueError, match="do not fit ep_size"):
        layer_maps(layout, "static", source=SourceRanks(1, 2))


def test_dynamic_map_spreads_rows_evenly():
    layout = _layout()
    l2p, replicas = dynamic_tables(layout.physical_to_logical_map, 6)
    phys = layer_maps(layout, "dynamic")[0](torch.zeros((9, 1), dtype=torch.int64)).flatten()
    assert int(replicas[0, 0]) == 2 and l2p[0, 0, :2].tolist() == [0, 6]
    assert torch.bincount(phys, minlength=8)[[0, 6]].tolist() == [5, 4]


@pytest.mark.parametrize("algorithm", ["static", "dynamic"])
def test_replica_map_is_traceable_with_dynamic_batch_size(algorithm):
    """One graph, no break, padding sentinels included: nothing in the map depends on the ids' values."""
    m = layer_maps(_layout(), algorithm)[0]
    compiled = torch.compile(m, fullgraph=True, dynamic=True, backend="eager")
    g = torch.Generator().manual_seed(8)
    for n in (3, 7, 16):
        ids = torch.randint(-1, 6, (n, 2), generator=g)
        assert torch.equal(compiled(ids), m(ids))
    assert not {"aten::item", "aten::_local_scalar_dense", "aten::nonzero"} & set(_top_level_ops(lambda: m(ids)))


@pytest.mark.parametrize("dtype", [torch.int32, torch.int64])
@pytest.mark.parametrize("algorithm", ["static", "dynamic"])
def test_padding_sentinels_pass_through_the_replica_map(algorithm, dtype):
    """vLLM 0.33's top-k writes -1 for padding rows (``VLLM_MOE_SKIP_PADDING=1``): they stay -1, not
    the replica of expert E-1 that indexing with -1 picks; the real ids beside them map as before."""
    layout = _layout()
    ids = torch.randint(0, 6, (12, 3), dtype=dtype, generator=torch.Generator().manual_seed(13))
    padded = ids.clone()
    padded[8:] = -1  # the batch's padding rows
    padded[2, 1] = -1  # and one sentinel inside a real row
    for m in layer_maps(layout, algorithm).values():
        phys = m(padded)
        assert phys.dtype == dtype and torch.equal(phys == -1, padded == -1)
        assert torch.equal(phys[padded >= 0], m(ids)[padded >= 0])


@pytest.mark.parametrize("algorithm", ["static", "dynamic"])
def test_padding_sentinels_reach_no_slot_and_no_count(algorithm):
    """The map then the vLLM adapter's capture with no padding mask (the sentinels are the only
    marking): padding rows land in no slot's count and no expert's, on the counted rows or the own rows."""
    from vllm_scene_eplb.adapters.vllm.worker_plugin import _capture

    layout = _layout()
    p2l = torch.from_numpy(layout.physical_to_logical_map)
    m = layer_maps(layout, algorithm, source=SourceRanks(0, 2))[1]
    obs = RoutingObserver(2, 6, 4, slot_to_expert=p2l, source_rows=True)
    real = torch.tensor([[0, 2], [1, 3], [2, 4]])
    ids = torch.cat([real, torch.full((5, 2), -1)])  # 3 real rows, 5 padding rows
    obs.start()
    _capture(obs, 1, None, m.source, 0, m(ids))
    obs.end_step()
    obs.stop()
    rec, live = obs.snapshot(), obs.live_counts()
    assert int(rec.physical.sum()) == 6 and int(live.physical.sum()) == 6 and int(live.logical.sum()) == 6
    assert live.logical[1].tolist() == torch.bincount(real.flatten(), minlength=6).tolist()
    assert int(live.own.sum()) == 6  # rows 0-3 are rank 0's of 8: the three real rows and one padding row


def test_static_map_loads_the_layouts_fitted_table():
    """A layout with fitted static_sources: each source rank's rows go where the fitted table says,
    and the number of source ranks per replica is the fitted one, not the even split."""

    g = Geometry(4, 4, 8)  # 8 ranks, 1 slot each; expert 0 on ranks 0-4 (5 replicas)
    p2l = np.array([[0, 0, 0, 0, 0, 1, 2, 3]])
    sources = np.array([[4, 1, 1, 1, 1, 8, 8, 8]])  # rank 0's replica serves itself and the 3 ranks without one
    layout = Layout(p2l, g, static_sources=sources)
    maps = layer_maps(layout, "static")[0]
    chosen = [maps(torch.zeros((8, 1), dtype=torch.int64)).flatten().tolist()[r] for r in range(8)]  # row r from rank r
    assert chosen == [0, 1, 2, 3, 4, 0, 0, 0]
    even = layer_maps(Layout(p2l, g), "static")[0](torch.zeros((8, 1), dtype=torch.int64)).flatten().tolist()
    assert np.bincount(even, minlength=8).max() == 2  # the even split: ceil(8 / 5)
    with pytest.raises(SceneEplbError, match="serve 7 source ranks"):
        Layout(p2l, g, static_sources=np.array([[3, 1, 1, 1, 1, 8, 8, 8]]))


# (comm, tp_rank, tp_size, dp_rank, dp_size, routed rows, mc2_mask real rows of its length or None,
#  num_tokens, max_tokens_across_dp, the rows of the routed ids that are this rank's real tokens)
OWN_ROWS_CASES = {
    "MC2 tp 1/2": ("MC2", 1, 2, 0, 1, 4, (5, 8), 8, 8, range(0, 1)),  # rows 4-7 of 8, row 4 real
    "FUSED_MC2 tp 0/2": ("FUSED_MC2", 0, 2, 0, 1, 4, (3, 8), 8, 8, range(0, 3)),
    "ALLTOALL tp 1/4, padded to the TP size": ("ALLTOALL", 1, 4, 0, 1, 1, (2, 2), 3, 3, range(0, 1)),  # global row 1: real
    "ALLTOALL tp 3/4, past the mask's end": ("ALLTOALL", 3, 4, 0, 1, 1, (2, 2), 3, 3, range(0, 0)),
    "ALLTOALL tp 0/2": ("ALLTOALL", 0, 2, 0, 1, 3, (2, 6), 6, 6, range(0, 2)),
    "ALLGATHER dp 1/2 tp 0": ("ALLGATHER", 0, 2, 1, 2, 12, (4, 6), 6, 6, range(6, 10)),
    "ALLGATHER dp 1/2 tp 1 (counts nothing)": ("ALLGATHER", 1, 2, 1, 2, 12, (4, 6), 6, 6, range(0, 0)),
    "ALLGATHER, no mc2_mask": ("ALLGATHER", 0, 1, 0, 2, 10, None, 5, 5, range(0, 5)),
}


@pytest.mark.parametrize("case", list(OWN_ROWS_CASES))
def test_vllm_ascend_own_rows_and_capture_stay_within_four_ops_on_every_path(case):
    """The own-rows path of vLLM-Ascend (``rows.OwnRows``, every comm method) plus the capture, with
    int32 ids as vLLM-Ascend gives them: at most four device ops in all (the rows and the mask are
    slices), no sync, and exactly the rows the comm method's rule names are counted."""
    from vllm_scene_eplb.adapters.vllm_ascend.rows import OwnRows

    comm, tp_rank, tp, dp_rank, dp, rows, mask, num_tokens, block, want_rows = OWN_ROWS_CASES[case]
    real = None if mask is None else torch.arange(mask[1]) < mask[0]
    ids = torch.randint(0, 4, (rows, 2), dtype=torch.int32, generator=torch.Generator().manual_seed(5))
    own = OwnRows(tp_rank, tp, dp_rank, dp)
    obs = RoutingObserver(1, 4, 2)

    def call():
        counted, mine = own.own(comm, rows, real, num_tokens, block)
        obs.capture(0, ids[counted], own_rows=mine)

    call()  # warm
    obs.passes.counts.zero_()
    ops = _top_level_ops(call)
    assert len(ops) <= MAX_CAPTURE_OPS, ops
    assert not {"aten::item", "aten::_local_scalar_dense", "aten::nonzero", "aten::zeros", "aten::cat"} & set(ops)
    want = torch.bincount(ids[list(want_rows)].flatten().to(torch.int64), minlength=4)
    assert obs.passes.counts[0, :4].tolist() == want.tolist()


def test_the_capture_reserves_its_ones_and_grows_them_only_past_the_reserve():
    obs = RoutingObserver(1, 4, 2)
    obs.reserve(10_000)
    buffer = obs.passes._ones
    obs.capture(0, torch.zeros(4000, 2, dtype=torch.int32))
    assert obs.passes._ones is buffer and int(obs.passes.counts[0, 0]) == 8000
    obs.capture(0, torch.zeros(6000, 2, dtype=torch.int32))  # 12,000 ids: an eager pass past the reserve
    assert obs.passes._ones.shape[0] >= 12_000 and int(obs.passes.counts[0, 0]) == 20_000


def _tp_pass(observers, maps, layer: int, ids: torch.Tensor, padding: torch.Tensor) -> None:
    """One pass of a batch every TP rank routes: each maps it by the static table, then the vLLM
    adapter's capture counts it (padding out) and the rows the rank routes itself."""
    from vllm_scene_eplb.adapters.vllm.worker_plugin import _capture

    for rank, obs in enumerate(observers):
        _capture(obs, layer, padding, maps[layer].source, rank, maps[layer](ids))


@pytest.mark.parametrize("base, span", [(0, 2), (0, 4), (2, 2), (3, 1)])
def test_a_ranks_own_rows_are_the_rows_whose_source_is_the_rank(base, span):
    """The slice ``own_source_span`` gives is exactly the rows ``row_sources`` (the static map's
    split) assigns to the rank, for every batch size, odd and one-row ones too; other ranks get none."""
    for rows in [0, 1, 2, 3, 7, 60, 61, 159, 160]:
        src = row_sources(SourceRanks(base, span), rows, "cpu")
        for rank in range(6):
            lo, hi = own_source_span(SourceRanks(base, span), rank, rows)
            assert torch.equal(torch.arange(rows)[src == rank], torch.arange(lo, hi)), (rows, rank, lo, hi)


def test_tp_ranks_own_rows_make_the_static_model_exact_where_the_even_split_is_not():
    """TP=2 x EP=2, single batches of varied length (odd ones too, a one-row decode step, padding):
    each rank's own rows are the rows its static table row routes, so the slot traffic modelled from
    them is the measured one exactly; the even split of the batch's counts is not."""
    layout = _layout()
    maps = layer_maps(layout, "static", source=SourceRanks(0, 2))
    p2l = torch.from_numpy(layout.physical_to_logical_map)
    observers = [RoutingObserver(2, 6, 8, slot_to_expert=p2l, source_rows=True) for _ in range(2)]
    for obs in observers:
        obs.start()
    g = torch.Generator().manual_seed(5)
    for rows in (61, 1, 160, 97, 2):
        padding = torch.zeros(rows + 3, dtype=torch.bool)
        padding[rows - 1] = rows > 2  # a padded last row (it must count nowhere)
        hot = torch.randint(0, 6, (rows, 1), generator=g)  # the first row half and the second route differently
        ids = torch.cat([hot, torch.where(torch.arange(rows).unsqueeze(1) < rows // 2, 0, 5)], dim=1)
        for layer in (0, 1):
            _tp_pass(observers, maps, layer, ids, padding)
        for obs in observers:
            obs.end_step()
    for obs in observers:
        obs.stop()
    records = [obs.snapshot() for obs in observers]
    logical, physical = records[0].logical.sum(0).numpy(), records[0].physical.sum(0).numpy()
    own = [r.sources.sum(0).numpy() for r in records]
    assert np.array_equal(own[0] + own[1], logical) and not np.array_equal(own[0], own[1])
    live = [obs.live_counts().own.numpy() for obs in observers]
    assert np.array_equal(live[0], own[0]) and np.array_equal(live[1], own[1])
    rows_p2l, g_ = layout.physical_to_logical_map, layout.geometry
    exact = modelled_slot_counts(rows_p2l, g_, "static", [SourceTraffic(r, 1, own[r]) for r in (0, 1)])
    assert np.array_equal(exact, physical)
    assert fidelity(physical, exact, rows_p2l, 6) == 0.0
    even = modelled_slot_counts(rows_p2l, g_, "static", [SourceTraffic(0, 2, logical)])
    assert fidelity(physical, even, rows_p2l, 6) > 0.05  # what the even-split model read


def test_own_rows_follow_the_ring_window_after_wrapping():
    obs = RoutingObserver(1, 2, entries=2, source_rows=True)
    obs.start()
    for step in range(5):
        ids = torch.tensor([[0], [1]] * (step + 1))
        obs.capture(0, ids)
        obs.capture_sources(0, ids[: step + 1])  # the first half of the rows
        obs.end_step(is_dummy=step == 4)
    obs.stop()
    rec = obs.snapshot()
    assert rec.stamps.tolist() == [3, 4] and rec.sources[:, 0].tolist() == [[2, 2], [0, 0]]
    assert rec.logical[:, 0].tolist() == [[4, 4], [0, 0]]
    assert obs.live_counts().own[0].tolist() == [6, 4]  # the first half of each real pass, the dummy pass not


def test_a_discarded_pass_reaches_neither_the_counts_nor_the_own_rows():
    """A warm-up pass (``skip_eplb``, a graph capture's warm-up) is dropped whole: before the fix its
    own rows stayed in their buffer and were added to the next step's."""
    obs = RoutingObserver(1, 2, entries=2, source_rows=True)
    ids = torch.tensor([[0], [1]])
    obs.capture(0, ids)
    obs.capture_sources(0, ids[:1])  # the warm-up
    obs.discard_pass()
    obs.capture(0, ids)
    obs.capture_sources(0, ids[:1])  # the real step: row 0 is this rank's own
    obs.end_step()
    live = obs.live_counts()
    assert live.logical.tolist() == [[1, 1]] and live.own.tolist() == [[1, 0]]


def test_without_source_rows_the_counted_rows_are_the_own_rows():
    obs = RoutingObserver(1, 3, entries=2)
    obs.start()
    obs.capture(0, torch.tensor([[0, 2], [2, 1]]))
    obs.end_step()
    obs.stop()
    rec = obs.snapshot()
    assert rec.sources is rec.logical and obs.live_counts().own.tolist() == [[1, 1, 2]]


def test_the_tp_capture_with_own_rows_is_traceable_with_dynamic_batch_size():
    """The vLLM adapter's capture (counts and the rank's own slice of the rows) under torch.compile
    with a dynamic batch size, one graph, no break: the same counts as run eagerly."""
    from vllm_scene_eplb.adapters.vllm.worker_plugin import _capture

    layout = _layout()
    m = layer_maps(layout, "static", source=SourceRanks(0, 2))[0]
    p2l = torch.from_numpy(layout.physical_to_logical_map)
    eager, traced = (RoutingObserver(2, 6, 4, slot_to_expert=p2l, source_rows=True) for _ in range(2))
    padding = torch.zeros(200, dtype=torch.bool)
    padding[5] = True
    compiled = torch.compile(
        lambda ids: _capture(traced, 0, padding, m.source, 1, m(ids)), fullgraph=True, dynamic=True, backend="eager"
    )
    g = torch.Generator().manual_seed(9)
    for n in (3, 7, 16, 61):
        ids = torch.randint(0, 6, (n, 2), generator=g)
        compiled(ids)
        _capture(eager, 0, padding, m.source, 1, m(ids))
    assert torch.equal(traced.passes.sources, eager.passes.sources) and torch.equal(traced.passes.counts, eager.passes.counts)
    # rank 1 routes rows [ceil(n/2), n) of each batch, two ids a row, less the padded row 5 (in its rows when n is 7)
    assert int(eager.passes.sources[0, : eager.passes.width].sum()) == 2 * sum(n // 2 for n in (3, 7, 16, 61)) - 2


def test_the_fused_capture_kernel_counts_what_the_four_torch_ops_count():
    """The CUDA capture's one Triton kernel (``fused_capture``), run by Triton's interpreter on CPU,
    against the torch ops on the same ids: every mask mode, int32 and int64 ids, ids out of range
    (the GPU itself runs it in ``scripts/gpu_check.sh``'s capture_fused)."""
    res = run_script("fused_capture_check", env={**os.environ, "TRITON_INTERPRET": "1"})
    assert res.returncode == 0, res.stderr[-2000:]
    same, counted, left_out = res.stdout.split()
    assert same == "True" and int(counted) > 0 and int(left_out) > 0, res.stdout
