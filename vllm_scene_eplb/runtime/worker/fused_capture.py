"""The count capture as one Triton kernel on CUDA: a pass's ids [M, k] added into a pass buffer row
[W + 2] with the rows left out and the not-counted column as ``PassCounts._count``'s four torch ops
do it (where, clamp, remainder, index_add_), in one launch instead of four.

Why: on a GPU vLLM runs the MoE layer through its opaque ``moe_forward`` op, so the capture runs
eagerly inside the CUDA graph, one graph node per op; on an H200 the four ops and the replica map
cost 13.6 us per MoE layer in ``scripts/gpu_check.sh``'s decode-sized step. Where Triton cannot
compile for the device (no Triton, not CUDA) ``available`` says no and the torch ops stay.

Compiled before any graph: the kernel specializes on no count and no pointer's alignment (a layer's
row sits anywhere in the pass buffer), and ``warm`` launches
every variant a forward can ask for (each mask mode, int32 and int64 ids) on a scratch row when the
pass buffers are made, so no Triton compile or module load happens inside a CUDA graph capture.
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

    @triton.jit(do_not_specialize=["n", "k", "W"], do_not_specialize_on_alignment=["ids_ptr", "mask_ptr", "row_ptr"])
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
    except (ImportError, TypeError):  # no Triton, or one without these specialization switches
        return False
    return True


def warm(device: torch.device | str, width: int) -> None:
    """Compile and load every variant a forward can launch (mask modes x ids dtypes) on a scratch row
    (host, at bind, before any graph is captured)."""
    row = torch.zeros(width + 2, dtype=torch.int32, device=device)
    mask = torch.zeros(1, dtype=torch.bool, device=device)
    for dtype in (torch.int32, torch.int64):
        ids = torch.zeros((1, 1), dtype=dtype, device=device)
        for m, mode in ((None, NO_MASK), (mask, PADDING), (mask, OWN)):
            count_into(row, ids, width, m, mode)


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
