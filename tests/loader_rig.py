"""DeepSeek's released expert loaders run on stand-in model state under the plugin's patches: the
legacy mapping's test (tests/unit/test_legacy_mapping.py) and its benchmark at DeepSeek-V4-Flash's
size (benchmarks/bench_v4_loader.py).

Real: vLLM's ``RoutedExperts.make_expert_params_mapping`` and ``EplbState`` (the mapping's entries),
the released ``DeepseekV4Model.load_weights`` (behind ``DeepseekV4ForCausalLM``'s ``AutoWeightsLoader``
and V4's checkpoint ``WeightsMapper``) and ``DeepseekV2Model.load_weights`` (behind
``DeepseekV3ForCausalLM``'s ``AutoWeightsLoader``), the plugin's patches (the legacy mapping, the
journalled weight loader, the traced checkpoint). Stand-ins: the checkpoint reader (a fresh tensor a
name, holding its expert), the models' state (their MoE layers' parameters and config, no kernels),
the TP group (one rank) and the expert weight loader's answer (success only for this rank's slots,
as vLLM's ``RoutedExperts.weight_loader`` answers through its expert map; nothing copied).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass
from types import SimpleNamespace

import torch

from vllm_scene_eplb.adapters.vllm import expert_loading
from vllm_scene_eplb.adapters.vllm.expert_loading import ExpertLoading
from vllm_scene_eplb.runtime.worker import load_journal

Current = Callable[[], "ExpertLoading | None"]  # the worker's load as the plugin's patches ask it (None: the plugin is off)
Setattr = Callable[[object, str, object], None]  # ``setattr``, or pytest's ``monkeypatch.setattr`` (undone after a test)


@dataclass(frozen=True)
class Spec:
    """A model family's checkpoint expert names: the MoE block, the shard names and each weight's
    tensors, and what comes before ``layers.``."""

    block: str
    shards: tuple[str, ...]
    suffixes: tuple[str, ...]
    prefix: str

    def names(self, layers, num_experts: int) -> list[str]:
        """Every expert tensor's checkpoint name, in checkpoint order (layer, expert, shard, tensor)."""
        return [
            f"{self.prefix}layers.{layer}.{self.block}.experts.{e}.{shard}.{suffix}"
            for layer in layers
            for e in range(num_experts)
            for shard in self.shards
            for suffix in self.suffixes
        ]


V4 = Spec("ffn", ("w1", "w2", "w3"), ("weight", "scale"), "")  # MXFP4 experts: each weight and its ue8m0 scale
V3 = Spec("mlp", ("gate_proj", "down_proj", "up_proj"), ("weight",), "model.")


def slot_loader(current: Current, local: range):
    """Stand-in for ``RoutedExperts.weight_loader``'s answer (success only for the slots in ``local``),
    journalled by the plugin's own patch."""

    class SlotLoader:
        def __init__(self, layer_name: str):
            self.layer_name = layer_name

        def weight_loader(self, param, loaded_weight, weight_name, shard_id, expert_id, return_success=False):
            ok = expert_id in local
            return ok if return_success else None

    expert_loading.patch_weight_loader(SlotLoader, current)
    return SlotLoader


def _moe_layers(model, spec: Spec, layers, loader_cls) -> None:
    """``model.layers.{layer}.{block}.experts.routed_experts``, where vLLM's MoE runner holds it: a
    ``RoutedExperts`` (built without its ``__init__``: no kernel state) holding the expert parameters,
    each with the stand-in weight loader."""
    from vllm.model_executor.layers.fused_moe.routed_experts import RoutedExperts

    model.layers = torch.nn.ModuleDict()
    for layer in layers:
        experts = RoutedExperts.__new__(RoutedExperts)
        torch.nn.Module.__init__(experts)
        experts.layer_name = f"model.layers.{layer}.{spec.block}.experts"
        loader = loader_cls(experts.layer_name)
        for name in ("w13_weight", "w2_weight", "w13_weight_scale", "w2_weight_scale"):
            param = torch.nn.Parameter(torch.zeros(1), requires_grad=False)
            param.weight_loader = loader.weight_loader
            experts.register_parameter(name, param)
        model.layers[str(layer)] = torch.nn.Module()
        block = torch.nn.Module()
        setattr(model.layers[str(layer)], spec.block, block)
        block.experts = torch.nn.Module()
        block.experts.routed_experts = experts


def v4_root(layers, num_experts: int, loader_cls):
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
    model.is_fused_shared_expert_enabled = False
    model.config = SimpleNamespace(n_routed_experts=num_experts, n_shared_experts=1, num_attention_heads=4)
    _moe_layers(model, V4, layers, loader_cls)
    root = Root()
    root.model = model
    return root


def v3_root(layers, num_experts: int, loader_cls):
    """``DeepseekV3ForCausalLM`` over ``DeepseekV2Model``: their released ``load_weights`` on the
    stand-in state."""
    from vllm.model_executor.models.deepseek_v2 import DeepseekV2Model, DeepseekV3ForCausalLM

    class Model(torch.nn.Module):
        load_weights = DeepseekV2Model.load_weights

    class Root(torch.nn.Module):
        load_weights = DeepseekV3ForCausalLM.load_weights

    model = Model()
    model.is_fused_shared_expert_enabled, model.use_mha, model.num_redundant_experts = False, False, 0
    model.config = SimpleNamespace(n_routed_experts=num_experts, n_shared_experts=1, num_hidden_layers=max(layers) + 1)
    _moe_layers(model, V3, layers, loader_cls)
    root = Root()
    root.model = model
    return root


FAMILIES = {"deepseek-v4": (V4, v4_root), "deepseek-v3": (V3, v3_root)}


def checkpoint(current: Current, names: list[str]):
    """Stand-in for the checkpoint reader behind ``DefaultModelLoader.get_all_weights``, traced by the
    plugin's patch: ``names`` in order, each a fresh tensor holding its expert."""

    class Checkpoint:
        def get_all_weights(self, model_config, model):
            for name in names:
                yield name, torch.full((2,), float(load_journal.EXPERT_INDEX.search(name).group(1)))

    load_journal.trace_checkpoint(Checkpoint, current)
    return Checkpoint().get_all_weights(None, None)


def released_builder():
    """vLLM's own ``RoutedExperts.make_expert_params_mapping`` (under any patch of the plugin's)."""
    from vllm.model_executor.layers.fused_moe.routed_experts import RoutedExperts

    return inspect.unwrap(RoutedExperts.__dict__["make_expert_params_mapping"].__func__)


def install(set_attr: Setattr, current: Current) -> None:
    """The plugin's legacy-mapping patch on vLLM's own builder (any earlier patch dropped), and the
    stand-in TP group of one rank (V4's loader asks for the attention heads' split)."""
    import vllm.models.deepseek_v4.cpu.model as v4
    from vllm.distributed.eplb.eplb_state import EplbState
    from vllm.model_executor.layers.fused_moe.routed_experts import RoutedExperts

    set_attr(RoutedExperts, "make_expert_params_mapping", staticmethod(released_builder()))
    expert_loading.patch_legacy_mapping(RoutedExperts, EplbState, current)
    set_attr(v4, "get_tensor_model_parallel_world_size", lambda: 1)
    set_attr(v4, "get_tensor_model_parallel_rank", lambda: 0)


def load(
    set_attr: Setattr, family: str, layers: list[int], num_experts: int, loading: ExpertLoading | None, local: range, names=None
):
    """One EP rank's expert load through the family's released loader (``loading`` None: the plugin
    off) of the checkpoint's expert tensors of ``layers`` (or ``names``): the names it loaded."""
    spec, build = FAMILIES[family]
    install(set_attr, lambda: loading)
    root = build(layers, num_experts, slot_loader(lambda: loading, local))
    return root.load_weights(checkpoint(lambda: loading, spec.names(layers, num_experts) if names is None else names))


def ranks_slots(num_slots: int, ep: int, rank: int) -> range:
    """The global slots EP rank ``rank`` holds of ``num_slots`` (vLLM's linear split)."""
    per = num_slots // ep
    return range(rank * per, (rank + 1) * per)
