"""The numpy port of vLLM's default EPLB policy against vLLM 0.32's own (torch in, torch out), map
for map, on random loads and on the shipped DeepSeek-V3 counts, called as vLLM calls it."""

import numpy as np
import pytest
import torch
from hypothesis import assume, given
from hypothesis import strategies as st
from vllm.distributed.eplb.policy.default import DefaultEplbPolicy

from vllm_scene_eplb.errors import SceneEplbError
from vllm_scene_eplb.formats import read_counts
from vllm_scene_eplb.layouts.layout import Geometry
from vllm_scene_eplb.layouts.vllm_policy import vllm_policy_map


def vllm_map(weights: np.ndarray, g: Geometry, groups: int, old: np.ndarray | None = None) -> np.ndarray:
    """vLLM's own policy on ``weights`` [L, E], its arguments as ``EplbState.rearrange`` passes them."""
    out = DefaultEplbPolicy.rebalance_experts(
        torch.from_numpy(weights), g.num_physical, groups, g.num_nodes, g.ep_size, None if old is None else torch.from_numpy(old)
    )
    return out.numpy()


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


def test_groups_that_do_not_divide_the_experts_are_refused():
    with pytest.raises(SceneEplbError, match="divide 32 experts, got 3"):
        vllm_policy_map(np.ones((1, 32)), Geometry(32, 0, 4), 3)
