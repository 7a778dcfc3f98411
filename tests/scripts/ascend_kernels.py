"""STAND-INS for the NPU kernels vLLM-Ascend's MoE forward reaches after its Python, in plain torch, each
following the op's documented semantics (not a script: the scripts that run a MoE forward import it).

- ``moe_gating_top_k_hash``: ``torch.ops._C_ascend.moe_gating_top_k_hash`` (vLLM-Ascend's own op,
  ``csrc/moe/moe_gating_top_k_hash``: its schema from ``csrc/torch_binding.cpp``, its semantics from the
  kernel without expert groups): scores by ``norm_type`` (0 softmax, 1 sigmoid, 2 sqrt(softplus));
  the ids of a row are ``tid2eid[input_ids[row]]`` when the hash table is given, else the top k of the
  scores plus ``bias``; the weights are the unbiased scores of those ids, divided by their sum (+ eps)
  for sigmoid and sqrt(softplus), times ``routed_scaling_factor``. Every call is logged (``HASH_CALLS``).
- ``grouped_matmul``: ``torch_npu.npu_grouped_matmul`` with one input and one weight (``split_item``
  2): the rows, sorted by group, times their group's weight (``group_list`` counts per group, or their
  cumulative sums), one row at a time (a row's result does not depend on which rows share its group);
- ``swiglu``: ``torch_npu.npu_swiglu``: silu of the first half of the last dim times the second half;
- ``EpDispatcher``: a token dispatcher's NPU dispatch and combine kernels (MC2's
  ``npu_moe_distribute_dispatch_v2`` / ``_combine_v2``, all-to-all's permute, all-to-all-v and unpermute):
  each (row, k) pair goes to the EP rank whose slots hold its physical id, ordered by local slot, and
  its expert's output comes back to the row's rank, weighted by its routing weight, summed over k in
  order; the exchange is an all-gather and a SUM over the EP group (Gloo), each pair's output non-zero
  on exactly one rank, so what comes back is exactly what that rank computed.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

HASH_SCHEMA = (
    "moe_gating_top_k_hash(Tensor x, int k, Tensor? bias=None, Tensor? input_ids=None, Tensor? tid2eid=None, "
    "int k_group=1, int group_count=1, float routed_scaling_factor=1.0, float eps=1e-20, int group_select_mode=0, "
    "int renorm=0, int norm_type=0, bool out_flag=False) -> (Tensor y, Tensor expert_idx, Tensor out)"
)
HASH_CALLS: list[dict] = []  # per call: whether a hash table and token ids came with it, and the rows
_LIBRARIES: list = []  # the torch.library fragments these ops live in (kept alive)


def moe_gating_top_k_hash(
    x, k, bias=None, input_ids=None, tid2eid=None, k_group=1, group_count=1, routed_scaling_factor=1.0, eps=1e-20,
    group_select_mode=0, renorm=0, norm_type=0, out_flag=False,
):  # fmt: skip
    if group_count != 1 or k_group != 1 or renorm != 0:
        raise NotImplementedError("stand-in: the kernel without expert groups, renorm 0 (what V4 calls)")
    xf = x.float()
    scores = (xf.softmax(-1), xf.sigmoid(), torch.nn.functional.softplus(xf).sqrt())[norm_type]
    hashed = tid2eid is not None and input_ids is not None
    HASH_CALLS.append({"hash": hashed, "rows": int(x.shape[0])})
    if hashed:
        ids = tid2eid[input_ids.long()].to(torch.int32)
    else:
        biased = scores if bias is None else scores + bias.float()
        ids = biased.topk(k, dim=-1).indices.to(torch.int32)
    weights = scores.gather(1, ids.long())
    if norm_type in (1, 2):
        weights = weights / (weights.sum(-1, keepdim=True) + eps)
    out = scores if out_flag else torch.zeros_like(scores)
    return (weights * routed_scaling_factor).to(x.dtype), ids, out


def register_hash_op() -> None:
    """Define ``torch.ops._C_ascend.moe_gating_top_k_hash`` with the op's schema and this CPU kernel."""
    lib = torch.library.Library("_C_ascend", "FRAGMENT")
    lib.define(HASH_SCHEMA)
    lib.impl("moe_gating_top_k_hash", moe_gating_top_k_hash, "CPU")
    _LIBRARIES.append(lib)


def grouped_matmul(x, weight, bias=None, split_item=2, group_list_type=0, group_type=0, group_list=None, **_):
    (rows,), (w,) = x, weight
    counts = group_list.long() if group_list_type == 1 else torch.diff(group_list.long(), prepend=group_list.new_zeros(1))
    group = torch.repeat_interleave(torch.arange(w.shape[0]), counts, output_size=rows.shape[0])
    return [torch.cat([rows[i : i + 1] @ w[g] for i, g in enumerate(group.tolist())]) if rows.shape[0] else rows @ w[0]]


def swiglu(x, dim=-1):
    gate, up = x.chunk(2, dim=dim)
    return torch.nn.functional.silu(gate) * up


class EpDispatcher:
    """A token dispatcher's dispatch and combine kernels over the EP group (see the module docstring)."""

    def __init__(self, group, local_slots: int):
        self.group, self.local = group, local_slots
        self.rank, self.size = dist.get_rank(group), dist.get_world_size(group)

    def _gather(self, t: torch.Tensor) -> torch.Tensor:
        parts = [torch.empty_like(t) for _ in range(self.size)]
        dist.all_gather(parts, t.contiguous(), group=self.group)
        return torch.cat(parts)

    def token_dispatch(self, token_dispatch_input):
        from vllm_ascend.ops.fused_moe.moe_stage_contracts import MoETokenDispatchOutput

        x, ids = token_dispatch_input.hidden_states, token_dispatch_input.topk_ids.long()
        rows, k = ids.shape
        every_x, every_ids = self._gather(x), self._gather(ids)
        pair = torch.arange(every_ids.numel()).view(-1, k)
        mine = (every_ids // self.local) == self.rank
        slot, pair = (every_ids % self.local)[mine], pair[mine]
        order = torch.argsort(slot, stable=True)
        slot, pair = slot[order], pair[order]
        meta = (pair, every_ids.shape, rows, token_dispatch_input.topk_weights)
        return MoETokenDispatchOutput(
            hidden_states=every_x[pair // k],
            group_list=torch.bincount(slot, minlength=self.local),
            group_list_type=1,
            combine_metadata=meta,
        )

    def token_combine(self, hidden_states, combine_metadata):
        pair, shape, rows, weights = combine_metadata
        out = hidden_states.new_zeros(shape.numel(), hidden_states.shape[-1])
        out[pair] = hidden_states
        dist.all_reduce(out, group=self.group)  # each pair's output is non-zero on one rank only
        own = out.view(*shape, -1)[self.rank * rows : (self.rank + 1) * rows]
        combined = torch.zeros_like(own[:, 0])
        for j in range(shape[1]):
            combined = combined + weights[:, j : j + 1].to(own.dtype) * own[:, j]
        return combined
