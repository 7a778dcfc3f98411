"""Observer ring buffer and in-forward replica maps (torch only, no engine)."""

import numpy as np
import pytest
import torch

from vllm_scene_eplb.dispatch import dynamic_tables, static_table
from vllm_scene_eplb.errors import SceneEplbError
from vllm_scene_eplb.layout import Geometry, Layout
from vllm_scene_eplb.runtime.observer import RoutingObserver
from vllm_scene_eplb.runtime.replica_map import SourceRanks, layer_maps


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
    ring = obs.snapshot()[0]
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
    assert obs.snapshot()[0].sum(dim=(1, 2)).tolist() == [2, 2]
    st = obs.status()
    assert (st.passes_recorded, st.entries_written, st.state) == (5, 2, "idle")


def test_observer_misuse_is_refused():
    obs = RoutingObserver(1, 2, entries=2)
    with pytest.raises(SceneEplbError, match="nothing recorded"):
        obs.snapshot()[0]
    with pytest.raises(SceneEplbError, match="not on"):
        obs.stop()
    obs.start()
    with pytest.raises(SceneEplbError, match="already on"):
        obs.start()
    with pytest.raises(SceneEplbError, match="stop it before dumping"):
        obs.snapshot()[0]


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


def test_replica_map_is_traceable_with_dynamic_batch_size():
    m = layer_maps(_layout(), "static")[0]
    compiled = torch.compile(m, fullgraph=True, dynamic=True, backend="eager")
    g = torch.Generator().manual_seed(8)
    for n in (3, 7, 16):
        ids = torch.randint(0, 6, (n, 2), generator=g)
        assert torch.equal(compiled(ids), m(ids))


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
