"""`scene-eplb preflight` on DeepSeek-V4-Flash against vLLM-Ascend 0.23.0.post1's own code (tests/scripts/ascend_v4_preflight.py):
its V4 KV cache layout (every block id's pages, the windowed groups) and the tutorial P's non-routed
weights (DP4 x TP4 with FlashComm1, DSA-CP and shared-expert DP), recomputed from the released modules'
shapes on a rank. V4-Flash's config as the repository ships it (data/models), with the YaRN fields V4-Flash
ships (vLLM-Ascend's attention reads them), a ModelSlim W8A8 description of every linear and a tokenizer."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from vllm_scene_eplb.planning.memory import GIB
from vllm_scene_eplb.planning.model_files import read_model
from vllm_scene_eplb.planning.model_geometry import attention_shape
from vllm_scene_eplb.planning.sizing import Recipe, V4Model, model_of

from ..ascend_env import run as ascend_run

V4 = Path(__file__).resolve().parents[2] / "data" / "models" / "deepseek-v4-flash"
LAYOUTS = {
    "block 128": {"block_size": 128, "mtp_layers": 0, "memory": 30 * GIB},
    "block 128, MTP": {"block_size": 128, "mtp_layers": 1, "memory": 30 * GIB},
    "block 64": {"block_size": 64, "mtp_layers": 0, "memory": 30 * GIB},
}
SP = {"flashcomm1": True, "enable_dsa_cp": True, "enable_shared_expert_dp": True}
WEIGHTS = {"tutorial P": {"tp": 4, "settings": SP}, "TP4 without them": {"tp": 4, "settings": {}}}


def description(config: dict) -> dict:
    """ModelSlim's W8A8_DYNAMIC description of V4-Flash in vLLM's names: attention projections, the indexer's
    wq_b and every expert int8; compressors, weights_proj, gates, embedding and head FLOAT."""
    out = {"model.embed_tokens.weight": "FLOAT", "lm_head.weight": "FLOAT"}
    for i, ratio in enumerate(config["compress_ratios"][: config["num_hidden_layers"]]):
        at, mlp = f"model.layers.{i}.self_attn", f"model.layers.{i}.mlp"
        out.update({f"{at}.{n}.weight": "W8A8_DYNAMIC" for n in ("wq_a", "wq_b", "wkv", "wo_a", "wo_b")})
        if ratio > 1:
            out.update({f"{at}.compressor.{n}.weight": "FLOAT" for n in ("wkv", "wgate")})
        if ratio == 4:
            out.update({f"{at}.indexer.wq_b.weight": "W8A8_DYNAMIC", f"{at}.indexer.weights_proj.weight": "FLOAT"})
            out.update({f"{at}.indexer.compressor.{n}.weight": "FLOAT" for n in ("wkv", "wgate")})
        for n in ("gate_proj", "up_proj", "down_proj"):
            out.update({f"{mlp}.shared_experts.{n}.weight": "W8A8_DYNAMIC", f"{mlp}.experts.0.{n}.weight": "W8A8_DYNAMIC"})
        out[f"{mlp}.gate.weight"] = "FLOAT"
    return out


@pytest.fixture(scope="module")
def released(tmp_path_factory):
    from vllm_scene_eplb.rig.tiny_deepseek_v4 import make_tiny_deepseek_v4

    root = tmp_path_factory.mktemp("v4-flash")
    tiny = make_tiny_deepseek_v4(root / "tiny")
    folder = root / "v4-flash-w8a8"
    folder.mkdir()
    config = {k: v for k, v in json.loads((V4 / "config.json").read_text()).items() if k != "quantization_config"}
    config.update(  # YaRN as V4-Flash ships it: 65,536 positions x 16
        rope_scaling={"type": "yarn", "factor": 16, "original_max_position_embeddings": 65536, "beta_fast": 32, "beta_slow": 1},
        rope_theta=10000.0,
        compress_rope_theta=160000.0,
    )
    (folder / "config.json").write_text(json.dumps(config))
    (folder / "quant_model_description.json").write_text(json.dumps(description(config)))
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(tiny / name, folder / name)
    return folder, ascend_run(
        "ascend_v4_preflight", str(folder), json.dumps({"layout": LAYOUTS, "weights": WEIGHTS}), timeout=600
    )


def _model(folder: Path) -> tuple[V4Model, dict, dict, str]:
    files = read_model(folder)
    cfg, modelslim, path = files.cfg, files.modelslim, files.where
    model = model_of(cfg, modelslim, path)
    assert isinstance(model, V4Model)
    return model, cfg, modelslim, path


def _recipe(tp: int, **settings) -> Recipe:
    return Recipe(4, tp, 17, 16385, 16, 8192, 0.9, 64 * GIB, 4 * GIB, graphs=False, speculative_tokens=1, **settings)


@pytest.mark.parametrize("case", LAYOUTS)
def test_the_v4_cache_layout_is_vllm_ascends(released, case):
    """The same number of blocks from the same memory (every block id's pages in every layer tuple), and the
    same windowed groups: their pages' tokens and windows, as many groups of each."""
    folder, got = released
    model, cfg, _, path = _model(folder)
    want = LAYOUTS[case]
    recipe = Recipe(
        16, 1, 17, 16385, 1, 8192, 0.9, 64 * GIB, 4 * GIB, block_size=want["block_size"], speculative_tokens=want["mtp_layers"]
    )
    cache = model.ascend_cache(recipe, cfg, "auto", path)
    layout = got["layout"][case]
    assert layout["num_blocks"] == want["memory"] // cache.block_bytes and layout["tensor_bytes"] <= want["memory"]
    windows = sorted([w.block, w.window] for w in cache.windows for _ in range(w.groups))
    assert sorted(g[1:] for g in layout["groups"] if g[0] == "window") == windows
    assert [g[1] for g in layout["groups"] if g[0] == "mla"] == [want["block_size"]] * 2  # ratio 4 and 128, 128 entries


def test_the_tutorial_ps_non_routed_weight_follows_vllm_ascends_replication(released):
    """DP4 x TP4 with FlashComm1, DSA-CP and shared-expert DP: wq_b a ReplicatedLinear, the shared expert
    TP 1; every layer's attention by ratio, the shared expert, embedding and head as the released modules
    hold them on a rank, byte for byte; with the gates, hyper-connections and hash tables (replicated,
    from the config) the rank's 4.74 GiB (2.97 GiB without the three settings)."""
    folder, got = released
    model, cfg, modelslim, path = _model(folder)
    shape = attention_shape(cfg, path)
    for case, settings in (
        ("tutorial P", {"flashcomm1": True, "dsa_cp": True, "shared_expert_dp": True}),
        ("TP4 without them", {}),
    ):
        built, recipe = got["weights"][case], _recipe(4, **settings)
        assert {int(r): b for r, b in built["attention"].items()} == {r: model.attention(r, recipe) for r in (0, 4, 128)}
        rest = cfg["n_routed_experts"] * cfg["hidden_size"] * 2  # the gate: a ReplicatedLinear in the model dtype
        tables = 3 * cfg["vocab_size"] * cfg["num_experts_per_tok"] * 4
        hc_head = shape.hc_mult**2 * shape.hidden * 4
        total = sum(built["attention"][str(r)] for r in shape.compress_ratios) + built["embed_and_head"] + tables + hc_head
        total += shape.layers * (built["shared"] + rest + model.hyper_connections())
        assert model.non_routed(cfg, modelslim, recipe, path) == total
        assert round(total / GIB, 2) == (4.74 if settings else 2.97)
    tutorial = got["weights"]["tutorial P"]["shapes"]
    assert tutorial["attention 4"]["wq_b"] == [64 * 512, 1024] and tutorial["shared"]["gate_up_proj"] == [2 * 2048, 4096]
    assert got["weights"]["TP4 without them"]["shapes"]["attention 4"]["wq_b"] == [64 * 512 // 4, 1024]
