"""`scene-eplb preflight` on DeepSeek-V4-Flash W8A8 (issue 45, item 4): the geometries the 910C
V4-Flash recipes will run (P: EP16 over 16 dies, 256 + 16 slots, chunk 8192; D: DP16 x TP1 with
MTP 1), each rank's bytes counted by hand from the config's shapes: the weights by compress ratio,
hyper-connections, the hash tables, the MTP layer, and the cache's windows and compressor states."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from vllm_scene_eplb.formats import write_layout
from vllm_scene_eplb.layouts.layout import Geometry, Layout, linear_map

from .test_bad_input import run

V4 = "data/models/deepseek-v4-flash"
# ModelSlim's W8A8 description of the 910C copy, in the names vLLM-Ascend renames V4's to (an assumption:
# its attention under ``attn.``, experts under ``mlp.``)
W8A8 = {
    "model.layers.3.attn.wq_a.weight": "W8A8_DYNAMIC",
    "model.layers.3.mlp.experts.0.gate_proj.weight": "W8A8_DYNAMIC",
    "model.layers.3.mlp.shared_experts.gate_proj.weight": "W8A8_DYNAMIC",
    "model.layers.3.mlp.gate.weight": "FLOAT",
}
H, INTER, VOCAB = 4096, 2048, 129280
EXPERT = 3 * H * INTER + 2 * (2 * INTER + H) * 2  # int8 plus a bf16 scale and offset per output channel
RATIO = {0: 2, 4: 21, 128: 20}  # layers per compress ratio


def _int8(rows: int, cols: int) -> int:
    return rows * cols + 2 * rows * 2


def _attention(ratio: int) -> int:
    """One layer's attention at TP 1, by hand: int8 projections, bf16 compressors and weights_proj."""
    size = _int8(1024 + 512, H) + _int8(64 * 512, 1024) + _int8(8 * 1024, 64 * 512 // 8) + _int8(H, 8 * 1024)
    if ratio > 1:
        size += (2 * (2 if ratio == 4 else 1) * 512) * H * 2
    if ratio == 4:
        size += _int8(64 * 128, 1024) + 64 * H * 2 + 4 * 128 * H * 2
    return size


HC = 2 * 24 * 4 * H * 4  # a layer's two mixing matrices, float32
SHARED_AND_GATE = 2 * _int8(INTER, H) + _int8(H, INTER) + 256 * H * 2


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    folder = tmp_path_factory.mktemp("v4-w8a8")
    config = json.loads(Path(f"{V4}/config.json").read_text())  # a ModelSlim copy: no fp8 quantization_config
    (folder / "config.json").write_text(json.dumps({k: v for k, v in config.items() if k != "quantization_config"}))
    (folder / "quant_model_description.json").write_text(json.dumps(W8A8))
    return str(folder)


def _preflight(model, *args) -> dict:
    code, out, err = run("preflight", "--model", model, *args, "--json")
    assert code == 0, err
    return json.loads(out)


def test_the_p_geometry_ep16_with_17_slots_per_rank(model):
    """On vLLM (its V4 cache layout, counted by hand here)."""
    p = _preflight(
        model, "--dp", "16", "--tp", "1", "--redundant", "16", "--max-model-len", "133120", "--max-num-seqs", "4",
        "--max-num-batched-tokens", "8192", "--enforce-eager", "--engine", "vllm",
    )  # fmt: skip
    attention = sum(n * _attention(r) for r, n in RATIO.items())
    tables, embed_and_head, hc_head = 3 * VOCAB * 6 * 4, 2 * VOCAB * H * 2, 4 * 4 * H * 4
    assert p["non_routed_bytes"] == attention + 43 * (HC + SHARED_AND_GATE) + tables + embed_and_head + hc_head
    assert p["routed_bytes"] == 17 * 43 * EXPERT and p["copies"] == {}  # no MLA copies on V4
    assert p["kv_bytes_per_token"] == 21 * (512 * 2 + 132) // 4 + 20 * 512 * 2 // 128
    window = 43 * 128 * 1024
    state_row = 43 * 1024 + 21 * 2 * 2 * (512 + 128) * 4 + 20 * 2 * 512 * 4  # per token the window and states hold
    per_sequence = window + 21 * 8 * 2 * 2 * (512 + 128) * 4 + 20 * 128 * 2 * 512 * 4
    assert p["kv_bytes_per_sequence"] == per_sequence and p["kv_state_bytes"] == 4 * per_sequence + 8192 * state_row
    assert p["kv_tokens"] == (p["kv_bytes"] - p["kv_state_bytes"]) // p["kv_bytes_per_token"]
    assert p["problems"] == [] and p["max_num_seqs_fit"] >= 4
    assert p["redundant"]["redundant_bytes_per_rank"] == 43 * EXPERT  # one slot per rank in every MoE layer
    assert p["redundant"]["kv_tokens_per_rank"] == 43 * EXPERT // p["kv_bytes_per_token"]


def test_the_d_geometry_dp16_tp1_with_mtp(model):
    """On vLLM: the MTP layer's weights and its window in vLLM's cache."""
    d = _preflight(
        model, "--dp", "16", "--tp", "1", "--max-model-len", "133120", "--max-num-seqs", "8", "--max-num-batched-tokens",
        "1024", "--kv-consumer", "--speculative-tokens", "1", "--engine", "vllm",
    )  # fmt: skip
    mtp = _attention(0) + HC + SHARED_AND_GATE + 2 * _int8(H, H) + 4 * 4 * H * 4 + 16 * EXPERT
    assert d["copies"] == {"MTP layer": mtp} and d["mc2_tokens_per_rank"] == 0 and d["hccl_bytes"] == 0  # no MC2 on vLLM
    plain = _preflight(model, "--dp", "16", "--tp", "1", "--max-model-len", "133120", "--max-num-seqs", "8",
                       "--max-num-batched-tokens", "1024", "--kv-consumer", "--engine", "vllm")  # fmt: skip
    assert d["kv_bytes_per_token"] == plain["kv_bytes_per_token"]  # the MTP layer keeps a window only
    assert d["kv_bytes_per_sequence"] - plain["kv_bytes_per_sequence"] == 128 * 1024
    assert plain["kv_state_bytes"] - d["kv_state_bytes"] == -(8 * 128 * 1024 + 1024 * 1024)
    assert d["problems"] == []


def test_a_recipe_whose_cache_cannot_hold_its_sequences_is_refused_with_the_states_named(model):
    code, _, err = run("preflight", "--model", model, "--dp", "16", "--tp", "1", "--max-num-seqs", "64")
    last = err.strip().splitlines()[-1]  # the numbers, then the refusal in one line
    assert code == 2 and last.startswith("scene-eplb: error: preflight refuses DP16 x TP1"), err
    assert "the KV cache does not hold max_num_seqs 64 x max_model_len 1,048,576" in last
    assert "64 sequences' windows and compressor states" in last


def test_the_fp4_checkpoint_prices_mxfp4_experts():
    code, out, err = run("preflight", "--model", V4, "--dp", "16", "--tp", "1", "--max-model-len", "8192", "--max-num-seqs", "8")
    assert code == 0, err
    assert "MXFP4 (expert_dtype fp4" in out and f"routed weights {16 * 43 * (3 * H * INTER * 17 // 32) / 2**30:.2f} GiB" in out


def test_a_layout_file_prices_its_own_redundant_slots(model, tmp_path):
    """The recipes pass the layout they load: its 16 redundant slots on EP16 are priced as --redundant
    16 is, against the KV cache."""
    geometry = Geometry(256, 16, 16)
    path = write_layout(Layout(linear_map(geometry, 43), geometry), tmp_path / "layout.json")
    recipe = ("--dp", "16", "--tp", "1", "--max-model-len", "133120", "--max-num-seqs", "4", "--enforce-eager")
    by_file, by_count = _preflight(model, *recipe, "--layout", str(path)), _preflight(model, *recipe, "--redundant", "16")
    assert by_file == by_count and by_file["redundant"]["redundant_slots_per_rank_per_layer"] == 1.0


BLOCK = 22 * (128 * (128 + 2) + 128 * 512 * 2)  # vLLM-Ascend: a block id's pages in 22 layer tuples (16,640 + 131,072 B)


def test_vllm_ascend_lays_v4s_cache_out_in_padded_pages_counted_by_hand(model):
    """The field's P on vLLM-Ascend (block size 128): every block of every KV cache group costs one block
    id's pages in all 22 layer tuples (23 with the MTP layer's window); a token of context takes 1/512 of a
    ratio-4 block and 1/16384 of a ratio-128 one; a sequence its windows (2 window groups of 128-token
    pages, 2 blocks each; the ratio-4 states' 8-token pages, 2; the ratio-128 states' 32-token pages, 5)
    and the compressed groups' partial blocks; the step a page per in-flight token block in each."""
    recipe = ("--dp", "16", "--tp", "1", "--redundant", "16", "--max-model-len", "131077", "--max-num-seqs", "1",
              "--max-num-batched-tokens", "8192", "--enforce-eager")  # fmt: skip
    p = _preflight(model, *recipe)
    assert p["kv_bytes_per_token"] == -(-BLOCK * (32 + 1) // 16384)
    assert p["kv_bytes_per_sequence"] == BLOCK * (2 + 2 * 2 + 2 + 5)
    step = BLOCK * (2 * 8192 // 128 + 8192 // 8 + 8192 // 32)
    assert p["kv_state_bytes"] == p["kv_bytes_per_sequence"] + step
    assert "22 layer tuples" in p["kv_format"] and p["problems"] == []
    mtp = _preflight(model, *recipe, "--speculative-tokens", "1")
    assert mtp["kv_bytes_per_sequence"] == p["kv_bytes_per_sequence"] // 22 * 23  # the drafter's window: one tuple more
    vllm = _preflight(model, *recipe, "--engine", "vllm")
    assert vllm["kv_bytes_per_token"] < p["kv_bytes_per_token"] and vllm["kv_state_bytes"] < p["kv_state_bytes"]


def test_the_tutorial_p_replicates_wq_b_under_dsa_cp_and_the_shared_experts_under_flashcomm1(model):
    """DP4 x TP4 (vLLM-Ascend's V4-Flash tutorial P): with DSA-CP wq_b is a ReplicatedLinear, with FlashComm1
    or shared-expert DP the shared experts are TP 1; by hand, the rest as at TP4."""
    tp4 = ("--dp", "4", "--tp", "4", "--redundant", "16", "--max-model-len", "16385", "--max-num-seqs", "16", "--enforce-eager")
    plain, sp = _preflight(model, *tp4), _preflight(model, *tp4, "--flashcomm1", "--dsa-cp", "--shared-expert-dp")
    wq_b, shared = _int8(64 * 512, 1024), 2 * _int8(INTER, H) + _int8(H, INTER)
    at_tp4 = 2 * _int8(INTER // 4, H) + _int8(H, INTER // 4)  # gate/up column-parallel, down row-parallel: every row's scales
    assert sp["non_routed_bytes"] - plain["non_routed_bytes"] == 43 * (wq_b - _int8(64 * 512 // 4, 1024)) + 43 * (shared - at_tp4)
    assert _preflight(model, *tp4, "--shared-expert-dp")["non_routed_bytes"] - plain["non_routed_bytes"] == 43 * (shared - at_tp4)
    assert round(sp["non_routed_bytes"] / 2**30, 2) == 4.74 and round(plain["non_routed_bytes"] / 2**30, 2) == 2.97
    code, _, err = run("preflight", "--model", model, *tp4, "--dsa-cp")
    assert code == 2 and "DSA-CP needs FlashComm1 or shared-expert DP" in err


def test_mc2_capacity_follows_vllm_ascends_largest_graph_capped_at_the_batched_tokens(model):
    """The tutorial D: 60 sequences x (1 + MTP 1) = 120 tokens (vLLM-Ascend's default largest graph, not
    twice it), capped at --max-num-batched-tokens as vLLM caps graph capture: HCCL_BUFFSIZE 524 MB."""
    d = (
        "--dp",
        "16",
        "--tp",
        "1",
        "--max-model-len",
        "17408",
        "--max-num-seqs",
        "60",
        "--kv-consumer",
        "--speculative-tokens",
        "1",
    )
    tutorial = _preflight(model, *d, "--max-num-batched-tokens", "120")
    assert tutorial["mc2_tokens_per_rank"] == 120 and tutorial["hccl_buffsize_mb"] == 524
    assert _preflight(model, *d, "--max-num-batched-tokens", "64")["mc2_tokens_per_rank"] == 64


def test_the_engine_decides_what_is_kept_beside_the_weights(model):
    """vLLM keeps no MC2 buffer; vLLM-Ascend's own settings are refused for it, each in one line."""
    recipe = ("--dp", "16", "--tp", "1", "--max-model-len", "17408", "--max-num-seqs", "8")
    vllm = _preflight(model, *recipe, "--engine", "vllm")
    assert vllm["hccl_bytes"] == 0 and vllm["hccl_buffsize_mb"] == 0 and vllm["engine"] == "vllm"
    assert _preflight(model, *recipe)["hccl_bytes"] > 0
    for flag, said in (("--native-eplb", "native EPLB is vLLM-Ascend's"), ("--flashcomm1", "FlashComm1 is vLLM-Ascend's"),
                       ("--shell", "--shell prints vLLM-Ascend's HCCL_BUFFSIZE"), ("--hccl-buffsize=200", "HCCL_BUFFSIZE is")):  # fmt: skip
        code, _, err = run("preflight", "--model", model, *recipe, "--engine", "vllm", flag)
        assert code == 2 and said in err and err.count("\n") == 1, err


def test_a_quantization_the_checkpoint_is_not_stops_the_recipe(model):
    """--quantization mirrors the server's flag: ascend needs ModelSlim's description (and no fp8
    quantization_config, which vLLM would read instead); the shipped V4-Flash config is fp8 (MXFP4 experts)."""
    recipe = ("--dp", "16", "--tp", "1", "--max-model-len", "17408", "--max-num-seqs", "8")
    assert _preflight(model, *recipe, "--quantization", "ascend")["quantization"] == "ascend"
    assert _preflight(V4, *recipe, "--quantization", "fp8")["quantization"] == "fp8"
    for folder, given, said in ((V4, "ascend", "the checkpoint is fp8"), (model, "fp8", "the checkpoint is ascend")):
        code, _, err = run("preflight", "--model", folder, *recipe, "--quantization", given)
        assert code == 2 and f"the recipe passes --quantization {given}, {said}" in err and err.count("\n") == 1, err
    code, _, err = run("preflight", "--model", model, *recipe, "--quantization", "ascend", "--engine", "vllm")
    assert code == 2 and "--quantization ascend is vLLM-Ascend's" in err


def test_the_fp8_checkpoint_prices_its_linear_layers_in_fp8_with_ue8m0_block_scales():
    """The shipped V4-Flash config: attention and shared experts fp8 with a ue8m0 scale per 128 x 128 block."""
    p = _preflight(V4, "--dp", "16", "--tp", "1", "--max-model-len", "8192", "--max-num-seqs", "8")
    on_vllm = _preflight(V4, "--dp", "16", "--tp", "1", "--max-model-len", "8192", "--max-num-seqs", "8", "--engine", "vllm")
    assert p["non_routed_bytes"] == on_vllm["non_routed_bytes"]  # the engine does not change the weights at TP1

    def fp8(rows, cols):
        return rows * cols + -(-rows // 128) * -(-cols // 128)

    shared, at_tp4 = 2 * fp8(INTER, H) + fp8(H, INTER), 2 * fp8(INTER // 4, H) + fp8(H, INTER // 4)
    flat = _preflight(V4, "--dp", "4", "--tp", "4", "--max-model-len", "8192", "--max-num-seqs", "8", "--enforce-eager")
    sp = _preflight(
        V4, "--dp", "4", "--tp", "4", "--max-model-len", "8192", "--max-num-seqs", "8", "--enforce-eager", "--flashcomm1"
    )
    assert sp["non_routed_bytes"] - flat["non_routed_bytes"] == 43 * (shared - at_tp4)


def test_a_shared_prefix_is_held_once(model):
    """Prefix caching: sequences that start with the same prefix hold its blocks once, so D holds 60
    sequences of the 128K warm scene (118,781 of 132,100 tokens shared) and refuses them cold."""
    d = ("--dp", "16", "--tp", "1", "--max-model-len", "132100", "--max-num-seqs", "60", "--max-num-batched-tokens", "120",
         "--kv-consumer", "--speculative-tokens", "1")  # fmt: skip
    warm = _preflight(model, *d, "--shared-prefix", "118781")
    assert warm["problems"] == [] and warm["max_num_seqs_fit"] >= 60
    code, _, err = run("preflight", "--model", model, *d)
    assert code == 2 and "the KV cache does not hold max_num_seqs 60 x max_model_len 132,100 = 7,926,000 tokens" in err
    code, _, err = run("preflight", "--model", model, *d, "--shared-prefix", "132100")
    assert code == 2 and "leaves nothing of max_model_len 132,100" in err
