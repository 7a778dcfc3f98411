"""The count capture as one Triton kernel on CUDA: a pass's ids [M, k] added into a pass buffer row
[W + 2] with the rows left out and the not-counted column as ``PassCounts._count``'s four torch ops
do it (where, clamp, remainder, index_add_), in one launch instead of four.

Why: on a GPU vLLM runs the MoE layer through its opaque ``moe_forward`` op, so the capture runs
eagerly inside the CUDA graph, one graph node per op; on an H200 the four ops and the replica map
cost 13.6 us per MoE layer in ``scripts/gpu_check.sh``'s decode-sized step. Where Triton cannot
compile for the device (no Triton, not CUDA) ``available`` says no and the torch ops stay.
"""

from __future__ import annotations

import functools

import torch

BLOCK = 1024  # ids per program
NO_MASK, PADDING, OWN = 0, 1, 2  # how the row mask reads: none; True = a padding row, left out; False = not own, left out


@functools.cache
def _kernel():
    """The Triton kernel (compiled on first launch per signature)."""
    import triton
    import triton.language as tl

    @triton.jit
    def count(ids_ptr, n, k, mask_ptr, row_ptr, W, MODE: tl.constexpr, BLOCK: tl.constexpr):
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        inside = offs < n
        ids = tl.load(ids_ptr + offs, mask=inside, other=0).to(tl.int64)
        if MODE == 1:
            ids = tl.where(tl.load(mask_ptr + offs // k, mask=inside, other=0) != 0, W, ids)
        if MODE == 2:
            ids = tl.where(tl.load(mask_ptr + offs // k, mask=inside, other=1) != 0, ids, W)
        ids = tl.where((ids < 0) | (ids > W), W, ids)  # -1 and anything outside [0, W]: the not-counted column
        tl.atomic_add(row_ptr + ids, 1, mask=inside)

    return count


def available(device: torch.device | str) -> bool:
    """Whether the fused capture runs on ``device``: CUDA with Triton's CUDA backend."""
    if torch.device(device).type != "cuda":
        return False
    try:
        _kernel()
    except ImportError:
        return False
    return True


def count_into(row: torch.Tensor, ids: torch.Tensor, width: int, mask: torch.Tensor | None, mode: int) -> None:
    """Add ``ids`` [M, k] into ``row`` [W + 2] int32 (``width`` = W), rows left out by ``mask`` [>= M]
    read as ``mode`` says; one kernel launch, no host sync, fixed-shape (graph-capturable)."""
    import triton

    flat = ids.reshape(-1)
    n = flat.shape[0]
    if n == 0:
        return
    k = ids.shape[1] if ids.dim() == 2 else 1
    _kernel()[(triton.cdiv(n, BLOCK),)](
        flat, n, k, row if mask is None else mask, row, width, MODE=mode if mask is not None else NO_MASK, BLOCK=BLOCK
    )
