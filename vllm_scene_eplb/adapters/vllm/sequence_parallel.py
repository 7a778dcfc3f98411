"""Which rows of a sequence-parallel MoE layer's routed ids are this TP rank's real tokens.

Under sequence-parallel MoE a rank's MoE layers route a chunk of the step's rows, not all of them:
the step's M rows (graph and DP padding included) are padded with zero rows to a multiple of the TP
size and TP rank r routes rows [r * c, (r + 1) * c), c = ceil(M / TP). vLLM 0.33 does this in two
places: a MoE block's ``sequence_parallel_chunk`` (``use_sequence_parallel_moe``), and models that
shard the whole step before their layers (DeepSeek-V4's ``sp_shard`` of hidden states and input
ids, whenever PP=1, EP, TP>1 and a MegaMoE backend or DP>1), which mark themselves
``use_sequence_parallel`` and, under ``VLLM_MOE_SKIP_PADDING``, replace the forward context's
``is_padding`` with their chunk's (``sp_padding_mask``). Either way the runner's
``moe_config.is_sequence_parallel`` is set.

A chunk's rows at or past M are the shard's padding; rows below M are padding where the runner's
mask says so. Every TP rank counts its own chunk's real rows, so the export's sum over the EP group
counts each token once. Only slices: no device op, and a captured graph replays the same rows.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from ...errors import SceneEplbError

if TYPE_CHECKING:
    import torch


@dataclass(frozen=True)
class ShardRows:
    """This TP rank's chunk of a sequence-parallel step, and which padding mask the forward context holds."""

    tp_rank: int
    tp_size: int
    mask_is_chunk: bool  # the model replaced the forward context's mask with this rank's chunk's

    def own(self, rows: int, mask: torch.Tensor | None) -> tuple[int, torch.Tensor]:
        """(the leading rows of the chunk of ``rows`` routed rows to count, their padding mask: a
        view of ``mask``, the forward context's ``is_padding``). ValueError where the shapes do not
        follow the rule (the layer's pass is then skipped, never miscounted)."""
        if mask is None:
            raise ValueError("the forward context holds no padding mask, so the step's row count is unknown")
        if self.mask_is_chunk:
            if mask.shape[0] != rows:
                raise ValueError(f"a chunk's padding mask of {mask.shape[0]} rows for {rows} routed rows")
            return rows, mask
        step = mask.shape[0]
        if -(-step // self.tp_size) != rows:
            raise ValueError(f"{rows} routed rows are not a chunk of a {step}-row step over {self.tp_size} TP ranks")
        lo = min(self.tp_rank * rows, step)
        hi = min(lo + rows, step)
        return hi - lo, mask[lo:hi]


def shard_rows_of(model, runners: list, tp_rank: int, tp_size: int, skip_padding: bool) -> ShardRows | None:
    """This rank's ``ShardRows`` where the model's MoE layers route TP chunks of the step, None where
    every TP rank routes the whole step; a model whose layers disagree stops startup. ``skip_padding``:
    vLLM's ``VLLM_MOE_SKIP_PADDING``, under which a model that shards the step replaces the mask."""
    sharded = {bool(r.moe_config.is_sequence_parallel) for r in runners}
    if len(sharded) > 1:
        split = [int(r.layer_id) for r in runners if r.moe_config.is_sequence_parallel]
        raise SceneEplbError(
            f"MoE layers {split} route TP chunks of the step (sequence parallel) and the others the whole "
            "step: scene_eplb cannot tell which rows each rank counts; serve without sequence-parallel MoE"
        )
    if not sharded or not sharded.pop():
        return None
    model_shards = any(getattr(m, "use_sequence_parallel", False) is True for m in model.modules())
    return ShardRows(tp_rank, tp_size, mask_is_chunk=model_shards and skip_padding)
