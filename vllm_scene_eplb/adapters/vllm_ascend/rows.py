"""Which rows of a MoE layer's ``select_experts`` ids are this rank's own real tokens, per comm method.

vLLM-Ascend's ``prepare`` (``ops/fused_moe/prepare_finalize.py``) reshapes the batch before routing,
differently per MoE comm method, so the rows a rank routes are not simply its tokens:

- MC2 / FUSED_MC2: the local batch padded to ``padded_num_tokens`` and split over the TP ranks; the
  forward context's ``mc2_mask`` (True for the first ``num_actual_tokens`` rows) split the same way
  marks the real rows. Every rank counts its own slice.
- ALLTOALL: the local batch padded to at least the TP size and split over the TP ranks; real rows
  are those below ``num_actual_tokens`` (read from the same ``mc2_mask``). Every rank counts its slice.
- ALLGATHER: every rank routes the DP-gathered batch (each DP rank's block padded to
  ``max_tokens_across_dp``), the same on all TP ranks: TP rank 0 counts its own DP block's real rows.

``mc2_mask`` is a persistent device buffer that vLLM-Ascend rewrites in place every step, so the mask
built here from slices of it is fixed-shape and sync-free: recorded into an ACL graph it still
follows the real token count at every replay. Graph padding is thereby never counted, and each
token is counted once over all ranks. Geometries these rules do not describe (sequence parallel /
flashcomm, prefill context parallel, the multistream gate, shared-expert DP) are refused when the
worker binds the recorder (``unsupported_settings``).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import torch

logger = logging.getLogger("vllm.scene_eplb")


@dataclass(frozen=True)
class OwnRows:
    """This rank's place in the MoE layer's groups: enough to find its own real rows."""

    tp_rank: int
    tp_size: int
    dp_rank: int
    dp_size: int

    def own(self, comm: str, rows: int, real: torch.Tensor, num_tokens: int, max_tokens_across_dp: int) -> torch.Tensor:
        """Bool [rows], True for the rows to count. ``comm`` is the MoE comm method's name,
        ``real`` the forward context's ``mc2_mask`` (True for this DP rank's real tokens, from row 0),
        ``num_tokens`` this DP rank's (padded) batch, ``max_tokens_across_dp`` the DP block size."""
        if comm in ("MC2", "FUSED_MC2"):
            mine = self._tp_slice(real)
        elif comm == "ALLTOALL":
            mine = self._tp_slice(_extend(real, max(num_tokens, self.tp_size)))
        elif comm == "ALLGATHER":
            block = max_tokens_across_dp if self.dp_size > 1 else num_tokens
            mine = torch.zeros(block * self.dp_size, dtype=torch.bool, device=real.device)
            if self.tp_rank == 0:  # every TP rank routes the same gathered rows
                mine[self.dp_rank * block : (self.dp_rank + 1) * block] = _extend(real, block)
        else:
            raise ValueError(f"unknown MoE comm method {comm}")
        if mine.shape[0] != rows:
            raise ValueError(
                f"{comm}: {rows} routed rows, expected {mine.shape[0]} (tp {self.tp_rank}/{self.tp_size}, "
                f"dp {self.dp_rank}/{self.dp_size}, num_tokens {num_tokens}, max_tokens_across_dp "
                f"{max_tokens_across_dp})"
            )
        return mine

    def _tp_slice(self, rows: torch.Tensor) -> torch.Tensor:
        """This TP rank's part of ``rows``, split as ``prepare`` splits the batch."""
        return torch.tensor_split(rows, self.tp_size)[self.tp_rank] if self.tp_size > 1 else rows


def _extend(mask: torch.Tensor, n: int) -> torch.Tensor:
    """The first ``n`` entries of ``mask``, False beyond its end."""
    if mask.shape[0] >= n:
        return mask[:n]
    return torch.cat([mask, torch.zeros(n - mask.shape[0], dtype=torch.bool, device=mask.device)])


def own_rows_from_context(own: OwnRows, ids: torch.Tensor) -> torch.Tensor | None:
    """``own.own`` for the ids [M, k] of the forward pass being run, read from vLLM-Ascend's forward
    context; None, with a logged error, when the rows do not follow the comm method's rule (the
    observer then marks the layer's pass skipped: status, dump metadata and audit show it)."""
    from vllm_ascend.ascend_forward_context import _EXTRA_CTX

    rows = ids.shape[0]
    real = _EXTRA_CTX.mc2_mask
    num_tokens = int(_EXTRA_CTX.num_tokens or rows)
    if real is None:  # no reserved mask (not a MoE model's runner): every row of the batch is real
        real = torch.ones(num_tokens, dtype=torch.bool, device=ids.device)
    try:
        return own.own(_EXTRA_CTX.moe_comm_type.name, rows, real, num_tokens, int(_EXTRA_CTX.max_tokens_across_dp or num_tokens))
    except ValueError as exc:
        logger.error("scene-eplb: this pass of a MoE layer is not counted (skipped): %s", exc)
        return None


def unsupported_settings(vllm_config) -> list[str]:
    """The settings of this server under which ``prepare`` shapes the rows otherwise (a collection
    run refuses them); read once vLLM-Ascend has set up its config."""
    from vllm_ascend.ascend_config import get_ascend_config
    from vllm_ascend.utils import enable_sp

    ascend = get_ascend_config()
    found = []
    if enable_sp(vllm_config):
        found.append("sequence parallelism / flashcomm1 (its EP all-gather drops padding rows)")
    if (getattr(vllm_config.parallel_config, "prefill_context_parallel_size", 1) or 1) > 1:
        found.append("prefill context parallelism")
    if getattr(ascend, "multistream_overlap_gate", False):
        found.append("multistream_overlap_gate (routing runs before prepare)")
    if getattr(ascend, "enable_shared_expert_dp", False):
        found.append("enable_shared_expert_dp")
    if getattr(ascend, "enable_sp_by_pass", False):
        found.append("enable_sp_by_pass (sequence parallelism by graph pass: the rows are split before the MoE layer)")
    if (getattr(ascend, "enable_flashcomm2_parallel_size", 0) or 0) > 0:
        found.append("flashcomm2 (enable_flashcomm2_parallel_size > 0 reshapes the rows around attention output)")
    if getattr(getattr(ascend, "xlite_graph_config", None), "enabled", False):
        found.append("xlite_graph_config.enabled (xlite routes MoE in C++ and bypasses select_experts: nothing would be counted)")
    return found
