"""What redundant slots cost: DeepSeek-V3's expert and KV token, priced from its config."""

import json

import pytest

from vllm_scene_eplb.errors import SceneEplbError
from vllm_scene_eplb.layouts.layout import Geometry
from vllm_scene_eplb.planning.memory import cost_sentence, geometry_cost, read_model_memory
from vllm_scene_eplb.planning.model_files import read_model

from ..conftest import DATA

DEEPSEEK = DATA.parent / "models" / "deepseek-v3"
PARAMS = 3 * 7168 * 2048  # gate, up and down of one routed expert


def _copy(tmp_path, **changes) -> str:
    cfg = json.loads((DEEPSEEK / "config.json").read_text())
    for k, v in changes.items():
        if v is None:
            cfg.pop(k, None)
        else:
            cfg[k] = v
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    return str(tmp_path)


def test_deepseek_v3_fp8_expert_and_mla_kv_token():
    m = read_model_memory(read_model(DEEPSEEK))
    # fp8 weights plus one float32 scale per 128x128 block: 16x56 blocks for gate and up, 56x16 for down
    assert m.bytes_per_expert == PARAMS + 4 * (2 * 16 * 56 + 56 * 16)
    assert m.kv_bytes_per_token == 61 * (512 + 64) * 2  # MLA: one latent + rope key per layer, bf16
    assert m.num_moe_layers == 58
    cost = geometry_cost(m, Geometry(256, 16, 16))
    assert cost["redundant_slots_per_rank_per_layer"] == 1.0
    assert cost["redundant_bytes_per_rank"] == 58 * m.bytes_per_expert  # about 2.4 GiB per die
    assert cost["kv_tokens_per_rank"] == 58 * m.bytes_per_expert // m.kv_bytes_per_token == 36358
    text = cost_sentence(cost, Geometry(256, 16, 16))
    assert "2.38 GiB of expert weights per rank" in text and "36,358 tokens of KV cache per rank" in text
    assert geometry_cost(m, Geometry(256, 32, 16))["redundant_bytes_per_rank"] == 2 * cost["redundant_bytes_per_rank"]


def test_bf16_checkpoint_fp8_kv_cache_and_modelslim_w8a8(tmp_path):
    (tmp_path / "a").mkdir()
    bf16 = read_model_memory(read_model(_copy(tmp_path / "a", quantization_config=None)))
    assert bf16.bytes_per_expert == 2 * PARAMS and bf16.expert_format == "bfloat16"
    assert read_model_memory(read_model(DEEPSEEK), kv_cache_dtype="fp8").kv_bytes_per_token == 61 * 576
    slim = tmp_path / "slim"
    slim.mkdir()
    _copy(slim, quantization_config=None)
    (slim / "quant_model_description.json").write_text(
        json.dumps({"model.layers.3.mlp.experts.0.gate_proj.weight": "W8A8_DYNAMIC", "model.layers.3.mlp.gate.weight": "FLOAT"})
    )
    m = read_model_memory(read_model(slim))
    assert m.bytes_per_expert == PARAMS + 2 * (2 * 2048 + 7168) * 2  # int8 + bf16 scale and offset per output channel
    assert "W8A8_DYNAMIC" in m.expert_format


def test_gqa_kv_token_and_what_cannot_be_priced(tmp_path):
    gqa = tmp_path / "gqa"
    gqa.mkdir()
    (gqa / "config.json").write_text(
        json.dumps(
            {
                "num_hidden_layers": 48,
                "num_experts": 128,
                "hidden_size": 2048,
                "moe_intermediate_size": 768,
                "num_attention_heads": 32,
                "num_key_value_heads": 4,
                "head_dim": 128,
                "torch_dtype": "bfloat16",
            }
        )
    )
    m = read_model_memory(read_model(gqa))
    assert m.kv_bytes_per_token == 48 * 2 * 4 * 128 * 2 and m.bytes_per_expert == 3 * 2048 * 768 * 2
    awq = tmp_path / "awq"
    awq.mkdir()
    _copy(awq, quantization_config={"quant_method": "awq", "bits": 4})
    with pytest.raises(SceneEplbError, match="'awq' is not priced here: pass --expert-bytes"):
        read_model_memory(read_model(awq))
    assert read_model_memory(read_model(awq), expert_bytes_override=1000).bytes_per_expert == 1000


def test_deepseek_v4_flash_mxfp4_expert_and_compressed_cache():
    """MXFP4 experts (two weights a byte, a ue8m0 scale per 32); a token's cache is a 512-wide bf16
    entry per 4 tokens plus a 132 B indexer key on the 21 ratio-4 layers and an entry per 128 on
    the 20 ratio-128 layers; a sequence holds every layer's window and the compressors' states."""
    m = read_model_memory(read_model(DATA.parent / "models" / "deepseek-v4-flash"))
    params = 3 * 4096 * 2048
    assert m.bytes_per_expert == params // 2 + params // 32 and "MXFP4" in m.expert_format
    assert m.num_moe_layers == 43
    assert m.kv_bytes_per_token == 21 * (1024 + 132) // 4 + 20 * 1024 // 128 == 6229
    window = 43 * 128 * 1024
    states = 21 * 8 * 4 * (512 + 128) * 4 + 20 * 128 * 2 * 512 * 4  # float32 kv and score, overlap x ratio tokens
    assert m.kv_bytes_per_sequence == window + states
    assert read_model_memory(
        read_model(DATA.parent / "models" / "deepseek-v4-flash"), kv_cache_dtype="fp8"
    ).kv_bytes_per_token == (21 * (512 + 132) // 4 + 20 * 512 // 128)
