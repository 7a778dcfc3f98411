"""The load audit on vLLM-Ascend 0.23.0.post1: every expert write journalled, judged after the load.

vLLM-Ascend places experts itself: each ``AscendFusedMoE`` builds its rank's expert map (logical
expert -> local slot) from the ``expert_map_path`` file the config hook wrote from the layout, and
vLLM 0.23's ``FusedMoE.weight_loader`` (which ``AscendFusedMoE`` inherits) writes checkpoint expert
e into the slot that map gives, or skips it where e is not local. The model's own ``load_weights``
(DeepSeek's legacy expert mapping, with logical ids) calls it once per expert, weight and shard, and
W8A8's scales and offsets (``w13_weight_scale``, ``w13_weight_offset``, ``w2_weight_scale``, ...)
go through it as expert weights of their own.

A layer is named by its model layer index, worked out from vLLM-Ascend's own MoE index
(``moe_instance_id``, construction order: the one its expert map row was picked by): the main
model's MoE layers, then a drafter's as the layers after the model's (``AscendExpertLoad``; V4's MTP
layer is named ``mtp.0`` in its module names, so a name cannot tell it from layer 0).

``install`` wraps that loader on the class (every layer built afterwards binds the wrapper into its
parameters): each write is journalled with its layer, global slot (``ep_rank x local slots + the
map's local slot``), parameter, shard and the checkpoint expert its tensor came from (the tracer on
vLLM's default model loader). ``audit_layers`` runs after the load (``worker_plugin.bind``): every
slot of this rank written once per weight and shard from the expert the layout names, then every
replica against its expert's first slot on every EP rank (``runtime.worker.load_journal``). A layout that
puts two replicas of one expert on one rank fails it: vLLM-Ascend's expert map keeps one local slot
per expert, and the other is never written. Layout runs only: a collection run loads by vLLM-Ascend's
own split, which the plugin does not touch.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from ...runtime.worker import load_journal
from ...runtime.worker.load_audit import LoadAudit
from ...runtime.worker.load_journal import ExpertLoad
from .moe_hooks import FUSED_MOE_MODULE

LOADER = "AscendFusedMoE.weight_loader (the expert map of expert_map_path)"


@dataclass
class AscendExpertLoad(ExpertLoad):
    """``ExpertLoad`` with the model layer of each vLLM-Ascend MoE index (main model's, then drafter's)."""

    layer_ids: list[int] = field(default_factory=list)

    def layer_of(self, layer) -> int:
        """The model layer index of ``AscendFusedMoE`` ``layer`` (by its ``moe_instance_id``)."""
        return self.layer_ids[layer.moe_instance_id]


def install(current_load: Callable[[], AscendExpertLoad | None]) -> None:
    """Journal every expert write of ``AscendFusedMoE`` (idempotent) and trace the checkpoint tensors
    vLLM's default model loader yields; ``current_load()`` is this worker's load, None with the flag off."""
    from vllm.model_executor.model_loader.default_loader import DefaultModelLoader

    def written_slot(layer, expert_id, out, return_success):
        """The (model layer, global slot) an ``AscendFusedMoE.weight_loader`` call wrote: the local slot
        its expert map gives checkpoint expert ``expert_id``, after this rank's earlier slots; None where
        the expert is not local (nothing written)."""
        local = layer._map_global_expert_id_to_local_expert_id(expert_id)
        load = current_load()
        if local == -1 or (return_success and not out) or load is None:
            return None
        return load.layer_of(layer), layer.ep_rank * layer.local_num_experts + int(local)

    cls = importlib.import_module(FUSED_MOE_MODULE).AscendFusedMoE
    orig = getattr(cls.weight_loader, "__scene_eplb_original__", cls.weight_loader)
    cls.weight_loader = load_journal.journal_writes(orig, current_load, written_slot, LOADER)
    cls.weight_loader.__scene_eplb_original__ = orig
    load_journal.trace_checkpoint(DefaultModelLoader, current_load)


def audit_layers(load: AscendExpertLoad, layers: list, where: str) -> LoadAudit:
    """The load audit of a layout run over the bound ``layers`` (``AscendFusedMoE``: the main model's
    and the drafter's): this rank's slots of each layer must hold the layout's row, its replicas the same weights
    on every EP rank (vLLM-Ascend gives every rank (E + R) / EP slots, rank r the r-th run of them).
    The fingerprints sum in float32 where the weights are (an NPU's vector units have no float64; the
    same bytes give the same sums). Raises the refusal; returns what it checked."""
    import torch

    expected: dict[int, np.ndarray] = {}
    modules: dict[int, object] = {}
    local: list[int] = []
    for layer in layers:
        model_layer = load.layer_of(layer)
        expected[model_layer] = load.rows[model_layer]
        modules[model_layer] = layer
        base = layer.ep_rank * layer.local_num_experts
        local = list(range(base, base + layer.local_num_experts))

    def weights(model_layer: int) -> list:
        return load_journal.written_tensors(modules[model_layer], load.journal, model_layer, len(local))

    return load_journal.audit(load, expected, local, weights, where, torch.float32)
