"""Our layouts against vLLM-Ascend 0.23.0.post1's own eplb_utils.py (its released code, run on CPU)."""

from types import SimpleNamespace

import numpy as np
import pytest
import torch

from vllm_scene_eplb.adapters.vllm_ascend import (check_versions, install_static_dispatch, log2phy_dynamic, log2phy_static,
                                                  off_rank_with_local, rank_expert_maps)
from vllm_scene_eplb.errors import SceneEplbError
from vllm_scene_eplb.fit import FitOptions, fit
from vllm_scene_eplb.formats import GeometryHint, read_counts, read_layout, write_layout
from vllm_scene_eplb.layout import Geometry

from .ascend_sdist import load_eplb_utils
from .conftest import DATA, require_vllm

pytestmark = pytest.mark.engine


@pytest.fixture(scope="module")
def eu():
    require_vllm()  # eplb_utils imports vllm.logger and vLLM's determine_expert_map
    return load_eplb_utils()


@pytest.fixture(scope="module")
def field_layout():
    """The field geometry: 256 experts, EP16, 16 redundant slots, fitted on real DeepSeek-V3 prefill counts."""
    counts = read_counts(DATA / "prefill_in4096.json")
    return fit(counts, FitOptions(Geometry(256, 16, 16)))


def _their_maps(eu, path, moe_layers, ep, E, tp_size=None):
    """init_eplb_config for every MoE layer and rank: (global expert maps [L, ep, E], log2phy [L, ep, E])."""
    cfg = SimpleNamespace(expert_map_path=str(path), dynamic_eplb=False, num_redundant_experts=0)
    maps, l2p = [], []
    orig = getattr(torch.Tensor, "npu", None)
    torch.Tensor.npu = lambda self: self  # their code moves log2phy to the NPU; keep it on CPU
    try:
        for k in range(moe_layers):
            per_rank = []
            for r in range(ep):
                g, _local, log2phy, n_red = eu.init_eplb_config(cfg, k, SimpleNamespace(num_experts=E, ep_size=ep, ep_rank=r), tp_size=tp_size)
                per_rank.append(log2phy.numpy())
            maps.append(g.numpy())
            l2p.append(np.stack(per_rank))
    finally:
        if orig is None:
            del torch.Tensor.npu
        else:
            torch.Tensor.npu = orig
    return np.stack(maps), np.stack(l2p), n_red


@pytest.fixture(scope="module")
def exported(field_layout, tmp_path_factory):
    return write_layout(field_layout, tmp_path_factory.mktemp("ascend") / "expert_map.json", fmt="vllm-ascend")


@pytest.fixture(scope="module")
def theirs(eu, exported, field_layout):
    """vLLM-Ascend's maps for every MoE layer (its log2phy without and with TP=2)."""
    n = len(field_layout.moe_layers)
    maps, l2p, n_red = _their_maps(eu, exported, n, 16, 256)
    _, l2p_tp2, _ = _their_maps(eu, exported, n, 16, 256, tp_size=2)
    return {"maps": maps, "n_red": n_red, None: l2p, 2: l2p_tp2}


def test_exported_map_parses_into_exactly_our_rank_maps(theirs, exported, field_layout):
    assert theirs["n_red"] == 16
    np.testing.assert_array_equal(theirs["maps"], rank_expert_maps(field_layout))
    path = exported
    back = read_layout(path, GeometryHint(ep_size=16, num_experts=256))
    np.testing.assert_array_equal(back.physical_to_logical_map, field_layout.physical_to_logical_map[list(field_layout.moe_layers)])


def test_mtp_layer_gets_the_files_slot_count(eu, field_layout, exported):
    placement, physical = eu.expert_file_to_tensor(str(exported), len(field_layout.moe_layers))
    assert placement is None and physical == 272


def test_our_tables_are_valid_physical_ids_for_every_rank_and_expert(field_layout):
    p2l = field_layout.physical_to_logical_map[list(field_layout.moe_layers)]
    static = log2phy_static(field_layout)
    assert static.shape == (len(field_layout.moe_layers), 16, 256)
    assert ((static >= 0) & (static < 272)).all()
    assert (np.take_along_axis(p2l[:, None, :].repeat(16, 1), static, axis=2) == np.arange(256)).all()
    l2p, count = log2phy_dynamic(field_layout)
    valid = np.arange(l2p.shape[2])[None, None, :] < count[..., None]
    assert (l2p[valid] >= 0).all()
    assert (np.take_along_axis(p2l, np.where(valid, l2p, 0).reshape(len(p2l), -1), axis=1).reshape(l2p.shape)[valid]
            == np.broadcast_to(np.arange(256)[None, :, None], l2p.shape)[valid]).all()


@pytest.mark.parametrize("tp_size", [None, 2])
def test_their_fixed_formula_routes_off_rank_where_ours_stays_local(theirs, field_layout, tp_size):
    ours = log2phy_static(field_layout)
    their_off, our_off = off_rank_with_local(theirs[tp_size], field_layout), off_rank_with_local(ours, field_layout)
    replicated = int((field_layout.replica_counts()[list(field_layout.moe_layers)] > 1).sum())
    print(f"\nfield geometry, tp_size={tp_size}: (layer, rank, expert) routed off-rank although a local replica exists: "
          f"vLLM-Ascend formula {their_off}, ours {our_off} ({replicated} replicated (layer, expert) pairs)")
    assert our_off == 0 and their_off > 0


def test_other_engine_versions_are_refused():
    check_versions("0.23.0.post1", "0.23.0")
    with pytest.raises(SceneEplbError, match="written for vllm-ascend 0.23.0.post1"):
        check_versions("0.18.0", "0.18.0")


def test_our_static_dispatch_replaces_their_formula_inside_init_eplb_config(eu, exported, field_layout):
    """vLLM-Ascend's own init_eplb_config, with generate_log2phy_map replaced: every rank's log2phy
    is our static table row, and no rank routes off-rank when it holds a replica."""
    fresh = load_eplb_utils()  # a second instance: the fixture's keeps their formula for the other tests
    install_static_dispatch(fresh)
    n = len(field_layout.moe_layers)
    _, l2p, _ = _their_maps(fresh, exported, n, 16, 256, tp_size=2)
    np.testing.assert_array_equal(l2p, log2phy_static(field_layout))
    assert off_rank_with_local(l2p, field_layout) == 0
