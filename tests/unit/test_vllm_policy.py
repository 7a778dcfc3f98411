"""The numpy port of vLLM's default EPLB policy against vLLM 0.32's own (torch in, torch out), map
for map, on random loads and on the shipped DeepSeek-V3 counts, called as vLLM calls it."""

import numpy as np
import pytest
import torch
from hypothesis import assume, given
from hypothesis import strategies as st
from vllm.distributed.eplb.eplb_state import EplbState
from vllm.distributed.eplb.policy.default import DefaultEplbPolicy

from vllm_scene_eplb.errors import SceneEplbError
from vllm_scene_eplb.fit import FitOptions, fit
from vllm_scene_eplb.formats import read_counts
from vllm_scene_eplb.layouts.counts import Counts
from vllm_scene_eplb.layouts.layout import Geometry, linear_map
from vllm_scene_eplb.layouts.peer import fit_peer
from vllm_scene_eplb.layouts.scenes import normalised_totals
from vllm_scene_eplb.layouts.vllm_policy import vllm_policy_map

from ..conftest import skewed_counts


def vllm_map(weights: np.ndarray, g: Geometry, groups: int, old: np.ndarray | None = None) -> np.ndarray:
    """vLLM's own policy on ``weights`` [L, E], its arguments as ``EplbState.rearrange`` passes them."""
    out = DefaultEplbPolicy.rebalance_experts(
        torch.from_numpy(weights), g.num_physical, groups, g.num_nodes, g.ep_size, None if old is None else torch.from_numpy(old)
    )
    return out.numpy()


def per_rank(p2l: np.ndarray, g: Geometry) -> np.ndarray:
    """Each rank's experts, sorted: what a rank holds whatever the order of its slots."""
    return np.sort(p2l.reshape(len(p2l), g.ep_size, g.slots_per_rank), axis=2)


@st.composite
def problems(draw):
    """A geometry vLLM's policy accepts, routing groups (some that do not divide over the nodes: the
    global policy) and a load [L, E] with ties (small integers) or without."""
    nodes = draw(st.sampled_from([1, 2, 4]))
    ep = nodes * draw(st.integers(1, 4))
    groups = draw(st.sampled_from([1, 2, 4, 8]))
    experts = groups * draw(st.integers(1, 4)) * (nodes if groups % nodes == 0 else 1)
    slots = draw(st.integers(-(-experts // ep), -(-experts // ep) + 3))
    assume(ep * slots - experts <= experts * (ep - 1))  # redundant slots a geometry can hold
    g = Geometry(experts, ep * slots - experts, ep, nodes)
    layers = draw(st.integers(1, 3))
    high = draw(st.sampled_from([1, 3, 1000, 2**40]))
    seed = draw(st.integers(0, 2**31))
    return g, groups, np.random.default_rng(seed).integers(0, high, size=(layers, experts))


@given(problems())
def test_the_port_gives_vllms_map_on_random_loads(problem):
    g, groups, weights = problem
    assert np.array_equal(vllm_policy_map(weights, g, groups), vllm_map(weights, g, groups))


GEOMETRIES = [
    (Geometry(256, 16, 16), 8),
    (Geometry(256, 32, 32, 4), 8),
    (Geometry(256, 0, 8), 8),
    (Geometry(256, 16, 16, 2), 1),  # no groups on two nodes: vLLM's global policy
    (Geometry(256, 48, 16, 16), 8),  # 8 groups over 16 nodes: global too
]


@pytest.mark.parametrize("g, groups", GEOMETRIES, ids=lambda x: str(x))
def test_the_port_gives_vllms_map_on_the_shipped_counts(real_counts_paths, g, groups):
    for path in real_counts_paths:
        c = read_counts(path)
        weights = c.total()[c.active_layers()]
        assert np.array_equal(vllm_policy_map(weights, g, groups), vllm_map(weights, g, groups)), path.name
        mix = weights / weights.sum(axis=1, keepdims=True)  # a scene mix: floats, as several scenes give
        assert np.array_equal(vllm_policy_map(mix, g, groups), vllm_map(mix, g, groups)), path.name


def test_the_peer_is_what_vllm_would_load_from_the_layouts_own_counts(real_counts_paths):
    """vLLM rebalances from its initial map (the linear one) with its load window over the MoE layers,
    the model's groups, nodes and ranks; it then keeps experts in their old slots within a rank,
    which moves no load: every rank holds what the port gives it."""
    g = Geometry(256, 16, 16)
    c = read_counts(real_counts_paths[2])
    layout = fit(c, FitOptions(g, expert_groups=8))
    peer = fit_peer(layout, [read_counts(p) for p in real_counts_paths])
    moe = list(layout.moe_layers)
    assert peer.fitted_on == "the counts the layout was fitted on"
    assert (peer.expert_groups, peer.groups_from) == (8, "the layout's fit")
    initial = np.tile(np.asarray(EplbState.build_initial_global_physical_to_logical_map(256, 16)), (len(moe), 1))
    assert np.array_equal(initial, linear_map(g, len(moe)))
    loaded = vllm_map(c.total()[moe], g, 8, old=initial)
    assert not np.array_equal(loaded, peer.map)  # vLLM reordered slots within ranks...
    assert np.array_equal(per_rank(loaded, g), per_rank(peer.map, g))  # ...and no rank holds other experts


def test_the_peer_of_several_scenes_gets_their_normalised_mix_with_the_layouts_weights():
    g = Geometry(32, 8, 4)
    a, b = (Counts(skewed_counts(4, 3, 32, seed=s)) for s in (1, 2))
    layout = fit([a, b], FitOptions(g, dispatch="dynamic"), [0.75, 0.25])
    peer = fit_peer(layout, [b, a])  # found by digest, whatever the order given
    normalised = normalised_totals([c.split()[0] for c in (a, b)])  # each layer of each scene sums to 1
    assert np.array_equal(peer.map, vllm_map(0.75 * normalised[0] + 0.25 * normalised[1], g, 1))
    assert peer.fitted_on == "the counts the layout was fitted on"
    other = fit_peer(layout, [a])  # b is missing: fitted on what was given, and saying so
    assert other.fitted_on.startswith("every scene given") and np.array_equal(other.map, vllm_map(a.split()[0].sum(axis=0), g, 1))


def test_groups_that_do_not_divide_the_experts_are_refused():
    with pytest.raises(SceneEplbError, match="divide 32 experts, got 3"):
        vllm_policy_map(np.ones((1, 32)), Geometry(32, 0, 4), 3)
