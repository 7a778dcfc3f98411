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

Sequence parallelism (FlashComm1, ``VLLM_ASCEND_ENABLE_FLASHCOMM1=1`` or ``enable_flashcomm1``), DSA-CP
(``enable_dsa_cp``, which needs FlashComm1) and shared-expert DP (``enable_shared_expert_dp``, which
turns FlashComm1 on) keep these rules: the runner pads the batch to a multiple of the TP size (and,
with DP, every DP rank to the largest), each TP rank holds its contiguous chunk of it (the row-parallel
reduce-scatter, or DSA-CP's even token split), and ``prepare`` skips its own padding and split
(``replace_allreduce``), so a rank routes exactly the rows MC2's rule names: its TP slice of the
padded batch, real below ``num_actual_tokens`` (its TP slice of ``mc2_mask``); a hash layer's token
ids are split the same way. Each rank counts its chunk's real rows; the export's sum is each token once.

``mc2_mask`` is a persistent device buffer that vLLM-Ascend rewrites in place every step, so the mask
taken here is a slice of it (a view: no device op; the rows counted are a slice of the ids too),
fixed-shape and sync-free: recorded into an ACL graph it still follows the real token count at
every replay. Graph padding is thereby never counted, and each token is counted once over all
ranks. Settings under which these rules do not hold (``unsupported_settings``: prefill context
parallel, the multistream gate, sequence parallelism by graph pass, FlashComm2, xlite) are refused
for a collection run when its config is built (``startup``), before any worker loads weights.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import torch

from ...errors import SceneEplbError

logger = logging.getLogger("vllm.scene_eplb")


@dataclass(frozen=True)
class OwnRows:
    """This rank's place in the MoE layer's groups: enough to find its own real rows."""

    tp_rank: int
    tp_size: int
    dp_rank: int
    dp_size: int

    def own(
        self, comm: str, rows: int, real: torch.Tensor | None, num_tokens: int, max_tokens_across_dp: int
    ) -> tuple[slice, torch.Tensor | None]:
        """(the rows of the routed ids this rank counts, their real-row mask or None: all real). Only
        slices, views of ``real``: no device op, so the capture stays within its op bound. ``comm`` is
        the MoE comm method's name, ``real`` the forward context's ``mc2_mask`` (True for this DP rank's
        real tokens, from row 0; None: every token of the batch is real), ``num_tokens`` this DP rank's
        (padded) batch, ``max_tokens_across_dp`` the DP block size. Rows past ``real``'s end are padding."""
        known = num_tokens if real is None else real.shape[0]
        if comm in ("MC2", "FUSED_MC2", "ALLTOALL"):
            padded = known if comm != "ALLTOALL" else max(num_tokens, self.tp_size)
            lo, hi = self._tp_bounds(padded)
            expected, start, stop = hi - lo, lo, min(hi, known)  # this rank's rows [lo, hi) of the padded batch
            counted = slice(0, max(stop - start, 0))
        elif comm == "ALLGATHER":
            block = max_tokens_across_dp if self.dp_size > 1 else num_tokens
            expected, start, stop = block * self.dp_size, 0, min(block, known) if self.tp_rank == 0 else 0
            # every TP rank routes the same gathered rows: TP rank 0 counts its own DP block's real rows
            counted = slice(self.dp_rank * block, self.dp_rank * block + max(stop, 0))
        else:
            raise ValueError(f"unknown MoE comm method {comm}")
        if expected != rows:
            raise ValueError(
                f"{comm}: {rows} routed rows, expected {expected} (tp {self.tp_rank}/{self.tp_size}, "
                f"dp {self.dp_rank}/{self.dp_size}, num_tokens {num_tokens}, max_tokens_across_dp "
                f"{max_tokens_across_dp})"
            )
        return counted, None if real is None else real[start : max(stop, start)]

    def _tp_bounds(self, n: int) -> tuple[int, int]:
        """This TP rank's rows [lo, hi) of ``n``, split as ``prepare`` splits the batch (``tensor_split``)."""
        q, r = divmod(n, self.tp_size)
        lo = self.tp_rank * q + min(self.tp_rank, r)
        return lo, lo + q + (1 if self.tp_rank < r else 0)


def own_rows_from_context(own: OwnRows, ids: torch.Tensor) -> tuple[slice, torch.Tensor | None] | None:
    """``own.own`` for the ids [M, k] of the forward pass being run, read from vLLM-Ascend's forward
    context; None, with a logged error, when the rows do not follow the comm method's rule (the
    observer then marks the layer's pass skipped: status, dump metadata and audit show it)."""
    from vllm_ascend.ascend_forward_context import _EXTRA_CTX

    rows = ids.shape[0]
    num_tokens = int(_EXTRA_CTX.num_tokens or rows)
    try:  # no reserved mc2_mask (not a MoE model's runner): every row of the batch is real
        return own.own(
            _EXTRA_CTX.moe_comm_type.name,
            rows,
            _EXTRA_CTX.mc2_mask,
            num_tokens,
            int(_EXTRA_CTX.max_tokens_across_dp or num_tokens),
        )
    except ValueError as exc:
        logger.error("scene-eplb: this pass of a MoE layer is not counted (skipped): %s", exc)
        return None


def unsupported_settings(vllm_config) -> list[str]:
    """The settings of this server under which the routed rows follow none of the rules above (a
    collection run refuses them), each named by the flag to drop; read once vLLM-Ascend has set up
    its config."""
    from vllm_ascend.ascend_config import get_ascend_config

    ascend = get_ascend_config()
    found = []
    if (getattr(vllm_config.parallel_config, "prefill_context_parallel_size", 1) or 1) > 1:
        found.append("--prefill-context-parallel-size > 1 (prefill context parallelism all-gathers rows over PCP before routing)")
    if getattr(ascend, "multistream_overlap_gate", False):
        found.append("multistream_overlap_gate (routing runs before prepare)")
    if getattr(ascend, "enable_sp_by_pass", False):
        found.append("enable_sp_by_pass (sequence parallelism by graph pass: the rows are split before the MoE layer)")
    if (getattr(ascend, "enable_flashcomm2_parallel_size", 0) or 0) > 0:
        found.append("flashcomm2 (enable_flashcomm2_parallel_size > 0 reshapes the rows around attention output)")
    if getattr(getattr(ascend, "xlite_graph_config", None), "enabled", False):
        found.append("xlite_graph_config.enabled (xlite routes MoE in C++ and bypasses select_experts: nothing would be counted)")
    return found


def unrecordable(refused: list[str]) -> SceneEplbError:
    """The refusal of a collection run under ``refused`` (``unsupported_settings``)."""
    return SceneEplbError(
        f"the scene_eplb recorder on vLLM-Ascend cannot count its own tokens exactly under {'; '.join(refused)}: "
        "drop these settings for the collection run"
    )
