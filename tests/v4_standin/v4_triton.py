"""Plain-torch stand-ins for the Triton kernels vLLM 0.32's DeepSeek-V4 launches on its CPU path, for a
host without Triton's CPU backend (``triton-cpu``, which no package registry here offers): the attention
metadata builders' kernels, run once per step before the forward. Each takes the kernel's own
parameters by name (the launch vLLM prepares) and the launch grid, and writes what every program of
the grid would; ``tests/engine/test_v4_stand_ins.py`` runs each against the released Triton kernel in
Triton's interpreter on the same inputs.

Installed by ``v4_stand_ins.install`` only where vLLM has no Triton (``HAS_TRITON`` false) and the
kernel is still vLLM's placeholder (the bare function ``triton.jit`` hands back without Triton).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

import torch


def rows(t: torch.Tensor, count: int, width: int, stride: int) -> torch.Tensor:
    """``count`` rows of ``width`` elements ``stride`` apart from ``t``'s first element: the 2-D view a
    kernel's pointer arithmetic (``ptr + row * stride + col``) addresses."""
    return torch.as_strided(t, (count, width), (stride, 1), t.storage_offset())


def flat(t: torch.Tensor, count: int) -> torch.Tensor:
    """The first ``count`` elements from ``t``'s first element, as a kernel's ``ptr + i`` reads them."""
    return torch.as_strided(t, (count,), (1,), t.storage_offset())


def token_request_mapping(grid, query_start_loc, output, num_reqs, num_mapped, num_tokens) -> None:
    """``vllm.v1.attention.ops.metadata._token_request_mapping_kernel`` (``compute_token_to_req_indices``):
    token t < ``num_mapped`` belongs to the request r with qsl[r] <= t < qsl[r+1] (the last request
    past the end), tokens at or past ``num_mapped`` to request 0; ``num_tokens`` entries written."""
    tokens = torch.arange(num_tokens, dtype=torch.int64)
    ends = query_start_loc[1 : num_reqs + 1].to(torch.int64)
    req = torch.searchsorted(ends, tokens, right=True).clamp(max=num_reqs - 1)
    flat(output, num_tokens).copy_(torch.where(tokens < num_mapped, req, 0))


def compute_swa_indices_and_lens(
    grid,
    swa_indices_ptr,
    swa_indices_stride,
    swa_lens_ptr,
    window_size,
    index_width,
    left_visible_ptr,
    right_visible_ptr,
    query_start_loc_ptr,
    seq_lens_ptr,
    token_to_req_indices_ptr,
    is_valid_token_ptr,
    block_table_ptr,
    block_table_stride,
    block_size,
    replay_start_ptr,
    token_offset,
    HAS_IMAGE,
    TRITON_BLOCK_SIZE,
) -> None:
    """``sparse_swa._compute_swa_indices_and_lens_kernel``: per token (one program each, from
    ``token_offset``) its sliding window's length and paged slot ids, -1 past the window; a padding
    token's row all -1 and its length 0."""
    n = grid[0]
    token = torch.arange(n) + token_offset
    valid = flat(is_valid_token_ptr, token_offset + n)[token].bool()
    req = flat(token_to_req_indices_ptr, token_offset + n)[token].long().clamp(min=0)
    req = torch.where(valid, req, 0)
    qsl = query_start_loc_ptr.long()
    start_q, end_q = qsl[req], qsl[req + 1]
    pos = seq_lens_ptr.long()[req] - (end_q - start_q) + token - start_q
    if HAS_IMAGE:
        left = flat(left_visible_ptr, token_offset + n)[token].long()
        right = flat(right_visible_ptr, token_offset + n)[token].long()
    else:
        left = right = torch.zeros_like(pos)
    left_add = (left - (window_size - 1)).clamp(min=0)
    start = (pos - (window_size - 1) - left_add).clamp(min=0)
    start = torch.maximum(start, replay_start_ptr.long()[req])
    end = pos + right + 1
    length = end - start
    offset = torch.arange(index_width)
    position = start[:, None] + offset
    inside = offset < length[:, None]
    columns = block_table_ptr.shape[-1]
    table = rows(block_table_ptr, int(req.max()) + 1 if n else 0, columns, block_table_stride)
    block = table[req[:, None], (position // block_size).clamp(max=columns - 1)].long()
    slots = torch.where(inside & valid[:, None], block * block_size + position % block_size, -1)
    flat(swa_lens_ptr, n).copy_(torch.where(valid, length, 0))
    rows(swa_indices_ptr, n, index_width, swa_indices_stride).copy_(slots)


def compute_prefill_metadata(
    grid,
    prefill_gather_lens_ptr,
    seq_lens_ptr,
    query_start_loc_ptr,
    replay_start_ptr,
    num_prefills,
    num_decodes,
    window_size,
    BLOCK_SIZE,
) -> None:
    """``sparse_swa.ComputePrefillMetadataKernel``: per prefill request its query length plus the
    window's visible prefix (what lies above its replay start, at most ``window_size - 1``)."""
    j = torch.arange(num_prefills) + num_decodes
    qsl = query_start_loc_ptr.long()
    query_len = qsl[j + 1] - qsl[j]
    prefix = seq_lens_ptr.long()[j] - query_len
    visible = (prefix - replay_start_ptr.long()[j]).clamp(min=0)
    flat(prefill_gather_lens_ptr, num_prefills).copy_(query_len + visible.clamp(max=window_size - 1))


def compressed_slot_mapping(
    grid,
    compressed_slot_mapping_ptr,
    slot_mapping_ptr,
    query_start_loc_ptr,
    seq_lens_ptr,
    block_table_ptr,
    block_table_stride,
    block_size,
    dcp_world_size,
    cp_interleave,
    COMPRESS_RATIO,
    PAD_ID,
    TRITON_BLOCK_SIZE,
) -> None:
    """``compressor_utils.CompressedSlotMappingKernel``: the last token of every ``COMPRESS_RATIO``
    positions maps to its compressed state's paged slot, every other token (and a token whose own
    slot is PAD) to PAD; one program per request row of the block table."""
    qsl, seq_lens = query_start_loc_ptr.long(), seq_lens_ptr.long()
    columns = block_table_ptr.shape[-1]
    table = rows(block_table_ptr, grid[0], columns, block_table_stride)
    for b in range(grid[0]):
        start_q, end_q = int(qsl[b]), int(qsl[b + 1])
        if end_q <= start_q:
            continue
        pos = seq_lens[b] - (end_q - start_q) + torch.arange(end_q - start_q)
        slot = flat(slot_mapping_ptr, end_q)[start_q:end_q].long()
        valid = ((pos + 1) % COMPRESS_RATIO == 0) & (slot != PAD_ID)
        local = pos // (cp_interleave * dcp_world_size) * cp_interleave + pos % cp_interleave
        compressed = local // COMPRESS_RATIO
        block = table[b, (compressed // block_size).clamp(max=columns - 1)].long()
        out = torch.where(valid, block * block_size + compressed % block_size, PAD_ID)
        flat(compressed_slot_mapping_ptr, end_q)[start_q:end_q] = out


def build_prefill_chunk_metadata(
    grid,
    query_start_loc_ptr,
    uncompressed_seq_lens_ptr,
    cu_compressed_seq_lens_ptr,
    row_start_cu_compressed_seq_lens_ptr,
    token_to_seq_ptr,
    cu_compressed_seq_len_ks_ptr,
    cu_compressed_seq_len_ke_ptr,
    query_slice_start,
    query_slice_stop,
    DCP_RANK,
    DCP_WORLD,
    DCP_INTERLEAVE,
    BLOCK_SIZE,
    COMPRESS_RATIO,
) -> None:
    """``indexer.BuildPrefillChunkMetadataKernel``: per query token of the slice its row's start in the
    gathered compressed K and that start plus its causal compressed length (localised under DCP), and
    per compressed entry the request it belongs to; one program per request."""
    qsl = query_start_loc_ptr.long()
    cu = cu_compressed_seq_lens_ptr.long()
    row_start_cu = row_start_cu_compressed_seq_lens_ptr.long()
    seq_lens = uncompressed_seq_lens_ptr.long()
    for b in range(grid[0]):
        start_q, end_q = int(qsl[b]), int(qsl[b + 1])
        offset = torch.arange(end_q - start_q)
        absolute = start_q + offset
        mask = (absolute >= query_slice_start) & (absolute < query_slice_stop)
        out_pos = (absolute - query_slice_start)[mask]
        length = (seq_lens[b] - (end_q - start_q) + 1 + offset) // COMPRESS_RATIO
        if DCP_WORLD > 1:
            base = length // DCP_INTERLEAVE // DCP_WORLD * DCP_INTERLEAVE
            rest = (length - base * DCP_WORLD - DCP_RANK * DCP_INTERLEAVE).clamp(min=0).clamp(max=DCP_INTERLEAVE)
            length = base + rest
        row_start = row_start_cu[b]
        if out_pos.numel():
            top = int(out_pos.max()) + 1
            flat(cu_compressed_seq_len_ks_ptr, top)[out_pos] = row_start.to(cu_compressed_seq_len_ks_ptr.dtype)
            flat(cu_compressed_seq_len_ke_ptr, top)[out_pos] = (row_start + length[mask]).to(cu_compressed_seq_len_ke_ptr.dtype)
        seq_start, seq_end = int(cu[b]), int(cu[b + 1])
        if seq_end > seq_start:
            flat(token_to_seq_ptr, seq_end)[seq_start:seq_end] = b


class GridKernel:
    """A Triton kernel's stand-in as vLLM launches it: ``kernel[grid](*args, **kwargs)`` calls
    ``impl(grid, **named)``, the arguments bound to the kernel's parameter names (``arg_names``, which
    vLLM's JIT launcher reads to bind its inputs); launch options (``num_warps``) are dropped."""

    LAUNCH_OPTIONS = ("num_warps", "num_stages", "num_ctas", "launch_pdl")

    def __init__(self, kernel: Callable[..., Any], impl: Callable[..., None]) -> None:
        self.arg_names = tuple(inspect.signature(kernel).parameters)
        self.impl = impl
        self.__name__ = impl.__name__

    def __getitem__(self, grid) -> Callable[..., None]:
        def launch(*args, **kwargs) -> None:
            named = dict(zip(self.arg_names, args)) | {k: v for k, v in kwargs.items() if k not in self.LAUNCH_OPTIONS}
            self.impl(tuple(grid), **named)

        return launch


# The kernels V4's CPU path launches: (module, holder: the module's attribute or the JIT owner class,
# whose ``kernel`` attribute is the kernel), the stand-in.
KERNELS: tuple[tuple[str, str, Callable[..., None]], ...] = (
    ("vllm.v1.attention.ops.metadata", "_token_request_mapping_kernel", token_request_mapping),
    ("vllm.v1.attention.backends.mla.sparse_swa", "ComputeSWAIndicesAndLensKernel", compute_swa_indices_and_lens),
    ("vllm.v1.attention.backends.mla.sparse_swa", "ComputePrefillMetadataKernel", compute_prefill_metadata),
    ("vllm.v1.attention.backends.mla.compressor_utils", "CompressedSlotMappingKernel", compressed_slot_mapping),
    ("vllm.v1.attention.backends.mla.indexer", "BuildPrefillChunkMetadataKernel", build_prefill_chunk_metadata),
)
