"""`scene-eplb preflight` on DeepSeek-V4-Flash W8A8 (issue 45, item 4): the geometries the 910C
V4-Flash recipes will run (P: EP16 over 16 dies, 256 + 16 slots, chunk 8192; D: DP16 x TP1 with
MTP 1), each rank's bytes counted by hand from the config's shapes: the weights by compress ratio,
hyper-connections, the hash tables, the MTP layer, and the cache's windows and compressor states."""

from __future__ import annotations

import json
import shutil

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
    shutil.copy(f"{V4}/config.json", folder / "config.json")
    (folder / "quant_model_description.json").write_text(json.dumps(W8A8))
    return str(folder)


def _preflight(model, *args) -> dict:
    code, out, err = run("preflight", "--model", model, *args, "--json")
    assert code == 0, err
    return json.loads(out)


def test_the_p_geometry_ep16_with_17_slots_per_rank(model):
    p = _preflight(
        model, "--dp", "16", "--tp", "1", "--redundant", "16", "--max-model-len", "133120", "--max-num-seqs", "4",
        "--max-num-batched-tokens", "8192", "--enforce-eager",
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
    d = _preflight(
        model, "--dp", "16", "--tp", "1", "--max-model-len", "133120", "--max-num-seqs", "8", "--max-num-batched-tokens",
        "1024", "--kv-consumer", "--speculative-tokens", "1",
    )  # fmt: skip
    mtp = _attention(0) + HC + SHARED_AND_GATE + 2 * _int8(H, H) + 4 * 4 * H * 4 + 16 * EXPERT
    assert d["copies"] == {"MTP layer": mtp} and d["mc2_tokens_per_rank"] == 2 * 8 * 2
    plain = _preflight(model, "--dp", "16", "--tp", "1", "--max-model-len", "133120", "--max-num-seqs", "8",
                       "--max-num-batched-tokens", "1024", "--kv-consumer")  # fmt: skip
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
