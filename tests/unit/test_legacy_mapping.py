"""The legacy expert mapping under a layout (adapters/vllm/expert_loading.py ``ScopedMapping``): each
checkpoint tensor iterates only its layer's entries for its expert, and the loads are exactly the flat list's, through
DeepSeek-V4's and DeepSeek-V3's released loaders on stand-in state (tests/loader_rig.py says what is
real and what stands in)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from vllm_scene_eplb.adapters.vllm import expert_loading
from vllm_scene_eplb.adapters.vllm.expert_loading import ExpertLoading, ScopedMapping
from vllm_scene_eplb.runtime.worker.load_audit import write_problems

from .. import loader_rig
from ..loader_rig import V4, checkpoint, ranks_slots

E, EP = 8, 2
ROWS = {  # model layer -> the expert of each of 10 slots, 5 a rank (2 redundant, no two replicas on a rank); layers 1 and 11 share a prefix
    1: np.array([3, 0, 1, 2, 4, 5, 6, 7, 0, 3]),
    2: np.array([0, 1, 2, 3, 4, 5, 6, 7, 2, 1]),
    11: np.array([7, 6, 5, 4, 3, 2, 1, 0, 5, 6]),
}
SLOTS = 10


def load(monkeypatch, family: str, rank: int, flat: bool = False, order=None) -> tuple[ExpertLoading, set]:
    """One rank's load under the layout: its loading (journal, calls) and the names it loaded. ``flat``:
    the mapping as today's plain list (the same entries); ``order``: the checkpoint's names reordered."""
    loading = ExpertLoading(dict(ROWS), E)
    if flat:
        layered = expert_loading.qualified_mapping
        monkeypatch.setattr(expert_loading, "qualified_mapping", lambda *a: layered(*a)[:])
    names = loader_rig.FAMILIES[family][0].names(ROWS, E)
    names = order(names) if order else names
    local = ranks_slots(SLOTS, EP, rank)
    return loading, loader_rig.load(monkeypatch.setattr, family, list(ROWS), E, loading, local, names)


@pytest.mark.parametrize("family", ["deepseek-v4", "deepseek-v3"])
@pytest.mark.parametrize("rank", range(EP))
@pytest.mark.parametrize(
    "order",
    [None, lambda names: names[::-1], lambda names: [names[i] for i in np.random.default_rng(0).permutation(len(names))]],
    ids=["checkpoint order", "reversed", "shuffled (every tensor a layer of its own)"],
)
def test_the_released_loaders_load_exactly_what_the_flat_list_loads(monkeypatch, family, rank, order):
    loading, loaded = load(monkeypatch, family, rank, order=order)
    assert loading.loaders == {"Model.load_weights via make_expert_params_mapping"}
    assert (
        write_problems(loading.journal, ROWS, list(ranks_slots(SLOTS, EP, rank))) == []
    )  # each local slot once, from its expert
    assert loading.tracer.current is None  # the checkpoint is read through: no layer is current any more
    flat, flat_loaded = load(monkeypatch, family, rank, flat=True, order=order)
    assert loading.journal.writes == flat.journal.writes and loaded == flat_loaded
    assert loading.calls == flat.calls  # the same weight loader calls, the replicas' refusals included


@pytest.mark.parametrize(
    "guess",
    [lambda self: (2, 0), lambda self: (5, 0), lambda self: None],
    ids=["wrong layer and expert", "no MoE layer", "unknown"],
)
def test_a_wrong_or_unknown_scope_still_loads_exactly(monkeypatch, guess):
    monkeypatch.setattr(ScopedMapping, "scope_now", guess)
    loading, loaded = load(monkeypatch, "deepseek-v4", 0)
    flat, flat_loaded = load(monkeypatch, "deepseek-v4", 0, flat=True)
    assert loading.journal.writes == flat.journal.writes and loaded == flat_loaded and loading.calls == flat.calls


def mapping() -> tuple[ScopedMapping, ExpertLoading]:
    """The plugin's mapping for the three MoE layers, from vLLM's own builder."""
    from vllm.distributed.eplb.eplb_state import EplbState

    loading = ExpertLoading(dict(ROWS), E)
    layers = [(f"layers.{layer}.ffn.experts.routed_experts", layer) for layer in ROWS]
    args = ("w1", "w2", "w3", E, 0, "routed_experts")
    built = expert_loading.qualified_mapping(loading, EplbState, loader_rig.released_builder(), torch.nn.Module(), args, layers)
    assert isinstance(built, ScopedMapping)
    return built, loading


def test_a_tensor_iterates_only_its_experts_entries_in_its_layer_and_the_rest_only_when_none_loaded():
    m, loading = mapping()
    flat = m[:]
    assert len(flat) == len(ROWS) * SLOTS * 3 and type(flat) is list
    own = [e for e in flat if e[1].startswith("layers.11.ffn.experts.5.")]
    assert [e[2] for e in own] == [2, 2, 2, 8, 8, 8]  # expert 5's two slots in layer 11, three shards each
    loading.tracer.current = "layers.11.ffn.experts.5.w2.scale"
    it = iter(m)
    assert [next(it) for _ in own] == own
    loading.calls += 1  # one of them reached the weight loader: the tensor is this expert's
    assert list(it) == []
    it = iter(m)
    assert [next(it) for _ in own] == own
    assert list(it) == [e for e in flat if e not in own]  # none did: the rest, in order


@pytest.mark.parametrize(
    "current",
    [
        None,
        "embed.weight",
        "layers.7.ffn.experts.1.w1.weight",
        "layers.1.ffn.experts.gate_up_proj",
        "layers.1.ffn.experts.9.w1.weight",
    ],
)
def test_an_unknown_scope_iterates_the_whole_list(current):
    m, loading = mapping()
    loading.tracer.current = current
    assert list(iter(m)) == m[:]


def test_the_traced_checkpoint_names_the_tensor_being_loaded_and_none_after():
    loading = ExpertLoading(dict(ROWS), E)
    names = V4.names([1, 2], 1)
    assert [loading.tracer.current for _ in checkpoint(lambda: loading, names)] == names
    assert loading.tracer.current is None
    weights = checkpoint(lambda: loading, names)
    next(weights)
    weights.close()  # a loader that stops early
    assert loading.tracer.current is None


def test_the_mapping_is_a_list_of_every_layers_entries_each_in_one_scope():
    m, _ = mapping()
    assert sum(map(len, m.groups.values())) == len(m) and len(m.groups) == len(ROWS) * E
    assert sorted({e[1].split(".experts.")[0] for e in m}) == ["layers.1.ffn", "layers.11.ffn", "layers.2.ffn"]
