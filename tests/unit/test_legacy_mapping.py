"""The legacy expert mapping under a layout (adapters/vllm/expert_loading.py ``LayerMapping``): each
checkpoint tensor iterates only its layer's entries, and the loads are exactly the flat list's.

Real: vLLM's ``RoutedExperts.make_expert_params_mapping`` and ``EplbState`` (the entries), the released
loaders ``DeepseekV4Model.load_weights`` (behind ``DeepseekV4ForCausalLM``'s ``AutoWeightsLoader`` and
``WeightsMapper``) and ``DeepseekV2Model.load_weights`` (DeepSeek-V3, behind its ``AutoWeightsLoader``),
the plugin's patches (the legacy mapping, the journalled weight loader, the traced checkpoint) and the
load audit's judgement. Stand-ins: the checkpoint reader (fresh tensors holding their expert), the
models' state (their MoE layers' parameters and config, no kernels), the TP group (one rank) and the
expert weight loader's answer (success only for this rank's slots, nothing copied).
"""

from __future__ import annotations

import inspect
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from vllm_scene_eplb.adapters.vllm import expert_loading
from vllm_scene_eplb.adapters.vllm.expert_loading import ExpertLoading, LayerMapping
from vllm_scene_eplb.runtime import load_journal
from vllm_scene_eplb.runtime.load_audit import write_problems

E, EP = 8, 2
ROWS = {  # model layer -> the expert of each of 10 slots, 5 a rank (2 redundant, no two replicas on a rank); layers 1 and 11 share a prefix
    1: np.array([3, 0, 1, 2, 4, 5, 6, 7, 0, 3]),
    2: np.array([0, 1, 2, 3, 4, 5, 6, 7, 2, 1]),
    11: np.array([7, 6, 5, 4, 3, 2, 1, 0, 5, 6]),
}
SLOTS = 10
V4 = SimpleNamespace(block="ffn", shards=("w1", "w2", "w3"), suffixes=("weight", "scale"))
V3 = SimpleNamespace(block="mlp", shards=("gate_proj", "down_proj", "up_proj"), suffixes=("weight",))


def slot_loader(loading: ExpertLoading, rank: int):
    """Stand-in for ``RoutedExperts.weight_loader``'s answer (success only for ``rank``'s slots),
    journalled by the plugin's own patch."""

    class SlotLoader:
        def __init__(self, layer_name: str):
            self.layer_name = layer_name

        def weight_loader(self, param, loaded_weight, weight_name, shard_id, expert_id, return_success=False):
            ok = rank * SLOTS // EP <= expert_id < (rank + 1) * SLOTS // EP
            return ok if return_success else None

    expert_loading.patch_weight_loader(SlotLoader, lambda: loading)
    return SlotLoader


def moe_layers(model, loader_cls) -> None:
    """``model.layers.{layer}.{block}.experts.routed_experts``, where vLLM's MoE runner holds it: a
    ``RoutedExperts`` (built without its ``__init__``: no kernel state) holding the expert parameters,
    each with the stand-in weight loader."""
    from vllm.model_executor.layers.fused_moe.routed_experts import RoutedExperts

    model.layers = torch.nn.ModuleDict()
    for layer in ROWS:
        experts = RoutedExperts.__new__(RoutedExperts)
        torch.nn.Module.__init__(experts)
        experts.layer_name = f"model.layers.{layer}.{model.spec.block}.experts"
        loader = loader_cls(experts.layer_name)
        for name in ("w13_weight", "w2_weight", "w13_weight_scale", "w2_weight_scale"):
            param = torch.nn.Parameter(torch.zeros(1), requires_grad=False)
            param.weight_loader = loader.weight_loader
            experts.register_parameter(name, param)
        model.layers[str(layer)] = torch.nn.Module()
        block = torch.nn.Module()
        setattr(model.layers[str(layer)], model.spec.block, block)
        block.experts = torch.nn.Module()
        block.experts.routed_experts = experts


def v4_root(loader_cls):
    """``DeepseekV4ForCausalLM`` over ``DeepseekV4Model``: their released ``load_weights`` (and V4's
    checkpoint ``WeightsMapper``) on the stand-in state."""
    from vllm.models.deepseek_v4.cpu.model import DeepseekV4ForCausalLM, DeepseekV4Model, _make_deepseek_v4_weights_mapper

    class Model(torch.nn.Module):
        load_weights = DeepseekV4Model.load_weights
        get_expert_mapping = DeepseekV4Model.get_expert_mapping

    class Root(torch.nn.Module):
        load_weights = DeepseekV4ForCausalLM.load_weights
        hf_to_vllm_mapper = _make_deepseek_v4_weights_mapper("fp4")

    model = Model()
    model.spec, model.is_fused_shared_expert_enabled = V4, False
    model.config = SimpleNamespace(n_routed_experts=E, n_shared_experts=1, num_attention_heads=4)
    moe_layers(model, loader_cls)
    root = Root()
    root.model = model
    return root, lambda layer, e, shard, suffix: f"layers.{layer}.ffn.experts.{e}.{shard}.{suffix}"


def v3_root(loader_cls):
    """``DeepseekV3ForCausalLM`` over ``DeepseekV2Model``: their released ``load_weights`` on the
    stand-in state."""
    from vllm.model_executor.models.deepseek_v2 import DeepseekV2Model, DeepseekV3ForCausalLM

    class Model(torch.nn.Module):
        load_weights = DeepseekV2Model.load_weights

    class Root(torch.nn.Module):
        load_weights = DeepseekV3ForCausalLM.load_weights

    model = Model()
    model.spec, model.is_fused_shared_expert_enabled = V3, False
    model.use_mha, model.num_redundant_experts = False, 0
    model.config = SimpleNamespace(n_routed_experts=E, n_shared_experts=1, num_hidden_layers=12)
    moe_layers(model, loader_cls)
    root = Root()
    root.model = model
    return root, lambda layer, e, shard, suffix: f"model.layers.{layer}.mlp.experts.{e}.{shard}.{suffix}"


def checkpoint_class(loading: ExpertLoading, names: list[str]):
    """Stand-in for the checkpoint reader behind ``DefaultModelLoader.get_all_weights`` (traced by the
    plugin's patch): ``names`` in order, each a fresh tensor holding its expert."""

    class Checkpoint:
        def get_all_weights(self, model_config, model):
            for name in names:
                yield name, torch.full((2,), float(load_journal.EXPERT_INDEX.search(name).group(1)))

    load_journal.trace_checkpoint(Checkpoint, lambda: loading)
    return Checkpoint


def released_builder():
    """vLLM's own ``RoutedExperts.make_expert_params_mapping`` (under any patch of the plugin's)."""
    from vllm.model_executor.layers.fused_moe.routed_experts import RoutedExperts

    return inspect.unwrap(RoutedExperts.__dict__["make_expert_params_mapping"].__func__)


def load(monkeypatch, build, rank: int, flat: bool = False, order=None):
    """One rank's expert load through the released loader: its journal, its loaded names and the loading.
    ``flat``: the mapping as today's plain list (the same entries); ``order``: the checkpoint's names reordered."""
    from vllm.distributed.eplb.eplb_state import EplbState
    from vllm.model_executor.layers.fused_moe.routed_experts import RoutedExperts

    monkeypatch.setattr(RoutedExperts, "make_expert_params_mapping", staticmethod(released_builder()))  # patched afresh
    loading = ExpertLoading(dict(ROWS), E)
    expert_loading.patch_legacy_mapping(RoutedExperts, EplbState, lambda: loading)
    if flat:
        layered = expert_loading.qualified_mapping
        monkeypatch.setattr(expert_loading, "qualified_mapping", lambda *a: layered(*a)[:])
    root, name_of = build(slot_loader(loading, rank))
    spec = root.model.spec
    names = [name_of(layer, e, s, x) for layer in ROWS for e in range(E) for s in spec.shards for x in spec.suffixes]
    names = order(names) if order else names
    loaded = root.load_weights(checkpoint_class(loading, names)().get_all_weights(None, None))
    return loading, loaded


@pytest.fixture
def one_tp_rank(monkeypatch):
    """Stand-in for vLLM's TP group: one rank (V4's loader asks for the attention heads' split)."""
    import vllm.models.deepseek_v4.cpu.model as v4

    monkeypatch.setattr(v4, "get_tensor_model_parallel_world_size", lambda: 1)
    monkeypatch.setattr(v4, "get_tensor_model_parallel_rank", lambda: 0)


@pytest.mark.parametrize("build", [v4_root, v3_root], ids=["deepseek-v4", "deepseek-v3"])
@pytest.mark.parametrize("rank", range(EP))
@pytest.mark.parametrize(
    "order",
    [None, lambda names: names[::-1], lambda names: [names[i] for i in np.random.default_rng(0).permutation(len(names))]],
    ids=["checkpoint order", "reversed", "shuffled (every tensor a layer of its own)"],
)
def test_the_released_loaders_load_exactly_what_the_flat_list_loads(monkeypatch, one_tp_rank, build, rank, order):
    loading, loaded = load(monkeypatch, build, rank, order=order)
    assert loading.loaders == {"Model.load_weights via make_expert_params_mapping"}
    local = list(range(rank * SLOTS // EP, (rank + 1) * SLOTS // EP))
    assert write_problems(loading.journal, ROWS, local) == []  # every local slot once, from its row's expert
    assert loading.tracer.current is None  # the checkpoint is read through: no layer is current any more
    flat, flat_loaded = load(monkeypatch, build, rank, flat=True, order=order)
    assert loading.journal.writes == flat.journal.writes and loaded == flat_loaded
    assert loading.calls == flat.calls  # the same weight loader calls, the replicas' refusals included


@pytest.mark.parametrize(
    "guess", [lambda self: 2, lambda self: 5, lambda self: None], ids=["wrong layer", "no MoE layer", "unknown"]
)
def test_a_wrong_or_unknown_layer_still_loads_exactly(monkeypatch, one_tp_rank, guess):
    monkeypatch.setattr(LayerMapping, "layer_now", guess)
    loading, loaded = load(monkeypatch, v4_root, 0)
    flat, flat_loaded = load(monkeypatch, v4_root, 0, flat=True)
    assert loading.journal.writes == flat.journal.writes and loaded == flat_loaded and loading.calls == flat.calls


def mapping() -> tuple[LayerMapping, ExpertLoading]:
    """The plugin's mapping for the three MoE layers, from vLLM's own builder."""
    from vllm.distributed.eplb.eplb_state import EplbState

    loading = ExpertLoading(dict(ROWS), E)
    layers = [(f"layers.{layer}.ffn.experts.routed_experts", layer) for layer in ROWS]
    args = ("w1", "w2", "w3", E, 0, "routed_experts")
    built = expert_loading.qualified_mapping(loading, EplbState, released_builder(), torch.nn.Module(), args, layers)
    assert isinstance(built, LayerMapping)
    return built, loading


def test_a_tensor_iterates_only_its_layers_entries_and_the_rest_only_when_none_loaded():
    m, loading = mapping()
    flat = m[:]
    assert len(flat) == len(ROWS) * SLOTS * 3 and type(flat) is list
    own = [e for e in flat if e[1].startswith("layers.11.")]
    assert len(own) == SLOTS * 3
    loading.tracer.current = "layers.11.ffn.experts.4.w2.scale"
    it = iter(m)
    assert [next(it) for _ in own] == own
    loading.calls += 1  # one of them reached the weight loader: the tensor is this layer's
    assert list(it) == []
    it = iter(m)
    assert [next(it) for _ in own] == own
    assert list(it) == [e for e in flat if e not in own]  # none did: the rest, in order


@pytest.mark.parametrize("current", [None, "embed.weight", "layers.7.ffn.experts.1.w1.weight"])
def test_an_unknown_layer_iterates_the_whole_list(current):
    m, loading = mapping()
    loading.tracer.current = current
    assert list(iter(m)) == m[:]


def test_the_traced_checkpoint_names_the_tensor_being_loaded_and_none_after():
    loading = ExpertLoading(dict(ROWS), E)
    names = ["layers.1.ffn.experts.0.w1.weight", "layers.2.ffn.experts.0.w1.weight"]
    seen = [loading.tracer.current for _ in checkpoint_class(loading, names)().get_all_weights(None, None)]
    assert seen == names and loading.tracer.current is None
    weights = checkpoint_class(loading, names)().get_all_weights(None, None)
    next(weights)
    weights.close()  # a loader that stops early
    assert loading.tracer.current is None


def test_the_mapping_is_a_list_of_every_layers_entries():
    m, _ = mapping()
    assert sum(map(len, m.groups.values())) == len(m)
    assert sorted({e[1].split(".experts.")[0] for e in m}) == ["layers.1.ffn", "layers.11.ffn", "layers.2.ffn"]
