"""Where the plugin meets vLLM-Ascend's MoE forward: the layer being run and its logical top-k ids.

``select_experts`` (``ops/fused_moe/experts_selector.py``) is the one Python function through which
every A2/A3 MoE path gets its logical top-k ids, and it is imported by name into the modules of
``SELECT_EXPERTS_BINDERS``: ``install`` rebinds it in every one of them (and in any other loaded
``vllm_ascend`` module that holds it) to a wrapper that hands the ids to the hook of the layer being
run. The layer is not an argument of ``select_experts``; ``AscendFusedMoE.forward_impl``, inside
which every call happens (the quantisation methods' ``apply`` and the multistream gate path alike),
is wrapped to say which layer that is.

The hook (``runtime.LayerIds``) counts the ids of the main model's layers (the recorder, this
rank's own real rows only) and, for ``dynamic`` dispatch (``dynamic.VirtualIds``), hands them on as
virtual ids that pick replica ``row mod c`` of each expert, which vLLM-Ascend's own
``log2phy[topk_ids]`` step (``MoECommMethod.fused_experts``) turns into physical slots. The ops are
fixed-shape and sync-free, so they are recorded into ACL / torchair graphs like the rest of the layer.
Runs against vLLM-Ascend 0.23.0.post1's real Python code on CPU (tests); not yet on Ascend hardware.
"""

from __future__ import annotations

import contextvars
import functools
import importlib
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

# Modules of vllm-ascend 0.23.0.post1 that import select_experts by name (A2/A3; the 310P variants
# have their own selector). A test fails when the sdist binds it anywhere else.
SELECT_EXPERTS_SOURCE = "vllm_ascend.ops.fused_moe.experts_selector"
SELECT_EXPERTS_BINDERS = (
    SELECT_EXPERTS_SOURCE,
    "vllm_ascend.ops.fused_moe.fused_moe",
    "vllm_ascend.ops.fused_moe.fused_moe_0_23_0",
    "vllm_ascend.quantization.methods.w4a16",
    "vllm_ascend.quantization.methods.w4a16_mxfp4",
    "vllm_ascend.quantization.methods.w4a4_mxfp4",
    "vllm_ascend.quantization.methods.w4a8",
    "vllm_ascend.quantization.methods.w4a8_mxfp4",
    "vllm_ascend.quantization.methods.w8a8_dynamic",
    "vllm_ascend.quantization.methods.w8a8_mxfp8",
)
FUSED_MOE_MODULE = "vllm_ascend.ops.fused_moe.fused_moe_0_23_0"  # AscendFusedMoE on vLLM 0.23

# The AscendFusedMoE whose forward_impl is running (None outside any MoE layer).
current_layer: contextvars.ContextVar = contextvars.ContextVar("scene_eplb_ascend_moe_layer", default=None)

# A layer hook: (layer, topk_ids [M, k]) -> the ids to hand on. Found per layer by ``hook_for``.
IdsHook = Callable[[object, "torch.Tensor"], "torch.Tensor"]


def _wrap_select_experts(original: Callable, hook_for: Callable[[object], IdsHook | None]) -> Callable:
    @functools.wraps(original)
    def select_experts(*args, **kwargs):
        topk_weights, topk_ids = original(*args, **kwargs)
        layer = current_layer.get()
        hook = hook_for(layer) if layer is not None else None
        return topk_weights, (topk_ids if hook is None else hook(layer, topk_ids))

    select_experts.__scene_eplb_original__ = original  # type: ignore[attr-defined]
    return select_experts


def _wrap_forward_impl(original: Callable) -> Callable:
    @functools.wraps(original)
    def forward_impl(self, *args, **kwargs):
        token = current_layer.set(self)
        try:
            return original(self, *args, **kwargs)
        finally:
            current_layer.reset(token)

    forward_impl.__scene_eplb_original__ = original  # type: ignore[attr-defined]
    return forward_impl


def install(hook_for: Callable[[object], IdsHook | None]) -> list[str]:
    """Rebind ``select_experts`` in every binder (and any loaded ``vllm_ascend`` module holding the
    original) and wrap ``AscendFusedMoE.forward_impl``; ``hook_for(layer)`` returns the layer's ids
    hook or None. Idempotent. Returns the modules rebound."""
    source = importlib.import_module(SELECT_EXPERTS_SOURCE)
    original = getattr(source.select_experts, "__scene_eplb_original__", source.select_experts)
    wrapped = _wrap_select_experts(original, hook_for)
    for name in SELECT_EXPERTS_BINDERS:
        importlib.import_module(name)
    rebound = []
    for name, module in list(sys.modules.items()):
        if name.startswith("vllm_ascend") and module is not None:
            held = getattr(module, "select_experts", None)
            if held is original or getattr(held, "__scene_eplb_original__", None) is original:
                module.select_experts = wrapped  # type: ignore[attr-defined]
                rebound.append(name)
    cls = importlib.import_module(FUSED_MOE_MODULE).AscendFusedMoE
    cls.forward_impl = _wrap_forward_impl(getattr(cls.forward_impl, "__scene_eplb_original__", cls.forward_impl))
    return sorted(rebound)
