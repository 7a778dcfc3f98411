"""`scene-eplb screen` (issue 38, item 3): the step's parts priced by hand on a tiny config, the
routed experts' share against context, the ceiling's edges, the field report's two scenes on
DeepSeek-V3, and a hostile user's options and configs (one line, exit 2)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from vllm_scene_eplb.formats import read_counts
from vllm_scene_eplb.layouts.layout import Geometry, linear_map
from vllm_scene_eplb.layouts.score import ideal_score
from vllm_scene_eplb.planning.model_files import read_model
from vllm_scene_eplb.planning.step_cost import DEFAULT_SCORE, MACHINES, Machine, PricedScene, read_step_model, screen

from .test_bad_input import assert_one_line_error, run

V3 = "data/models/deepseek-v3"
TINY = {
    "hidden_size": 64,
    "vocab_size": 100,
    "num_hidden_layers": 3,
    "first_k_dense_replace": 1,
    "num_attention_heads": 2,
    "q_lora_rank": 16,
    "kv_lora_rank": 8,
    "qk_nope_head_dim": 4,
    "qk_rope_head_dim": 2,
    "v_head_dim": 4,
    "n_routed_experts": 8,
    "n_shared_experts": 1,
    "num_experts_per_tok": 2,
    "intermediate_size": 32,
    "moe_intermediate_size": 16,
    "torch_dtype": "bfloat16",
}
# The field report's two P scenes: 16K without cache hits, 128K (131,076 tokens) with 90.62% hits.
FIELD_16K = (PricedScene("prefill", 16384, 1024, 0.0), 1.6132, 1.0068)
FIELD_128K = (PricedScene("prefill", 131076, 1024, 0.9062), 1.3868, 1.0134)


@pytest.fixture(scope="module")
def v3():
    return read_step_model(read_model(V3))


@pytest.fixture
def tiny(tmp_path):
    path = tmp_path / "config.json"
    path.write_text(json.dumps(TINY))
    return read_step_model(read_model(path))


def _config(tmp_path, **change) -> str:
    cfg = {k: v for k, v in {**TINY, **change}.items() if v is not None}
    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg))
    return str(path)


def _parts(answer) -> dict:
    return {p.name: p for p in answer.parts}


def test_prefill_work_matches_a_hand_count(tiny):
    """10 new tokens in one chunk: each attends to p + 1 tokens, 5.5 on average."""
    parts = _parts(screen(tiny, PricedScene("prefill", 10, 1, 0.0, chunk=100, ep_size=2), MACHINES["910c"]))
    assert parts["routed_experts"].flops == 2 * 2 * 2 * 3 * 64 * 16  # MoE layers x 2 x top-k x expert weights
    assert parts["shared_experts"].flops == 2 * 2 * 1 * 3 * 64 * 16
    assert parts["dense_mlp"].flops == 1 * 2 * 3 * 64 * 32
    assert parts["attention_projections"].flops == 3 * 2 * (64 * 16 + 16 * 2 * 6 + 64 * 10 + 8 * 2 * 8 + 2 * 4 * 64)
    assert parts["attention_context"].flops == pytest.approx(3 * 2 * 2 * (4 + 2 + 4) * 5.5)


def test_a_second_chunk_up_projects_its_prefix(tiny):
    one = _parts(screen(tiny, PricedScene("prefill", 10, 1, 0.0, chunk=10, ep_size=2), MACHINES["910c"]))
    two = _parts(screen(tiny, PricedScene("prefill", 10, 1, 0.0, chunk=5, ep_size=2), MACHINES["910c"]))
    upproject = 3 * 2 * 8 * 2 * (4 + 4) * 5  # layers x kv_b over the second chunk's 5-token prefix
    assert two["attention_context"].flops - one["attention_context"].flops == pytest.approx(upproject / 10)
    assert two["routed_experts"].flops == one["routed_experts"].flops


def test_decode_attends_over_the_latents_at_the_mean_context(tiny):
    scene = PricedScene("decode", 10, 4, 0.0, batch=4, ep_size=2)
    assert scene.mean_context == 12.5
    parts = _parts(screen(tiny, scene, MACHINES["910c"]))
    assert parts["attention_context"].flops == pytest.approx(3 * 2 * 2 * (2 * 8 + 2) * 12.5)
    assert parts["attention_context"].bytes == pytest.approx(3 * 12.5 * (8 + 2) * 2)  # latents read, bf16


@pytest.mark.parametrize("role", ["prefill", "decode"])
def test_the_routed_share_falls_as_the_context_grows(v3, role):
    shares = [
        screen(v3, PricedScene(role, n, 1024, 0.0), MACHINES["910c"]).routed_share for n in (1024, 4096, 16384, 65536, 131072)
    ]
    assert all(a > b for a, b in zip(shares, shares[1:])), shares


def test_cache_hits_leave_fewer_new_tokens_to_share_the_attention(v3):
    """At one prompt length, a token computed after a cached prefix attends to more context."""
    shares = [screen(v3, PricedScene("prefill", 32768, 1, f), MACHINES["910c"]).routed_share for f in (0.0, 0.5, 0.9)]
    assert shares[0] > shares[1] > shares[2], shares


@pytest.mark.parametrize("role", ["prefill", "decode"])
@pytest.mark.parametrize("score", [1.0, 1.4, 3.0])
def test_equal_scores_give_a_ceiling_of_one(v3, role, score):
    answer = screen(v3, PricedScene(role, 16384, 1024, 0.0), MACHINES["910c"], score, score)
    assert answer.ceiling_ratio == 1.0


def test_the_ceiling_grows_with_the_running_layouts_imbalance(v3):
    scene = PricedScene("prefill", 16384, 1, 0.0)
    ceilings = [screen(v3, scene, MACHINES["910c"], b).ceiling_ratio for b in (1.0, 1.2, 1.6, 2.5)]
    assert ceilings[0] == 1.0 and all(a < b for a, b in zip(ceilings, ceilings[1:])), ceilings


def test_a_worse_candidate_is_a_ratio_below_one(v3):
    assert screen(v3, PricedScene("prefill", 4096, 1, 0.0), MACHINES["910c"], 1.1, 1.5).ceiling_ratio < 1


def test_memory_bound_experts_gain_nothing_from_a_better_score_until_the_flops_bind(v3):
    """A small decode batch reads its experts' weights whatever their tokens; with unlimited
    bandwidth the same step is FLOPs-bound and a better score pays."""
    scene = PricedScene("decode", 4096, 1024, 0.0, batch=8)
    slow = screen(v3, scene, MACHINES["910c"], 2.0)
    fast = screen(v3, scene, Machine("no memory wall", 390e12, 1e18, "a test"), 2.0)
    assert _parts(slow)["routed_experts"].bound == "bytes" and slow.ceiling_ratio == 1.0
    assert _parts(fast)["routed_experts"].bound == "flops" and fast.ceiling_ratio > 1.1


def test_the_field_reports_two_scenes_get_clearly_different_ceilings(v3):
    """The worked example: 16K without cache hits against 128K with 90.62% hits, at the field's
    measured median scores (1.6132 -> 1.0068 and 1.3868 -> 1.0134); measured +14.18% and +0.81%."""
    for machine in MACHINES.values():  # the order does not hang on the machine
        short, long = (screen(v3, scene, machine, b0, b1) for scene, b0, b1 in (FIELD_16K, FIELD_128K))
        assert short.ceiling_ratio > 1.1418 and 1.0081 < long.ceiling_ratio < 1.05, machine.name
        assert short.ceiling_ratio - 1 > 5 * (long.ceiling_ratio - 1), machine.name
        assert _parts(long)["attention_context"].share > 0.8 > _parts(short)["attention_context"].share


def test_the_default_score_is_what_a_scene_blind_layout_scores_on_real_routing(real_counts_paths):
    medians = []
    for path in real_counts_paths:
        weights = read_counts(path).data.sum(0)[3:]  # DeepSeek-V3's 58 MoE layers
        geometry = Geometry(256, 0, 16)
        medians.append(float(np.median(ideal_score(linear_map(geometry, len(weights)), weights, geometry))))
    assert min(medians) <= DEFAULT_SCORE <= max(medians) and max(medians) - min(medians) < 0.5, medians


def test_the_json_names_every_assumption_and_the_machine_override():
    args = ("screen", "--model", V3, "--role", "prefill", "--input-len", 131076, "--output-len", 1024)
    code, out, err = run(*args, "--cached-share", 0.9062, "--score", 1.3868, "--candidate-score", 1.0134, "--json")
    doc = json.loads(out)
    assert code == 0, err
    assert doc["scene"]["cached_tokens"] == 118781 and doc["scene"]["chunk"] == 8192
    assert set(doc["parts"]) == {
        "attention_projections",
        "attention_context",
        "dense_mlp",
        "shared_experts",
        "routed_experts",
        "rest",
    }
    assert sum(p["share"] for p in doc["parts"].values()) == pytest.approx(1.0)
    assert doc["routed_share"] == doc["parts"]["routed_experts"]["share"] and doc["routed_share_perfect"] < doc["routed_share"]
    said = " ".join(doc["assumptions"])
    for named in ("390 TFLOP/s", "1.6 TB/s", "chunks of 8,192", "118,781 prefix-cached", "fp8", "kv_lora 512", "left out"):
        assert named in said, named
    code, out, _ = run(*args, "--cached-share", 0.9062, "--peak-tflops", 1000, "--hbm-tbps", 0.001, "--json")
    slow = json.loads(out)
    assert code == 0 and slow["machine"]["peak_flops"] == 1000e12 and "overridden" in slow["machine"]["name"]
    assert slow["parts"]["attention_projections"]["bound"] == "bytes" and "score 2 by default" in " ".join(slow["assumptions"])


SCENE = ("--role", "prefill", "--input-len", "1024", "--output-len", "16", "--cached-share", "0")
OPTION_CASES = {
    "negative_input_len": (("--input-len", "-5"), "--input-len"),
    "zero_output_len": (("--output-len", "0"), "--output-len"),
    "fractional_input_len": (("--input-len", "1.5"), "expected an integer"),
    "cached_share_one": (("--cached-share", "1"), "--cached-share"),
    "cached_share_negative": (("--cached-share", "-0.1"), "--cached-share"),
    "cached_share_nan": (("--cached-share", "nan"), "finite"),
    "cached_share_word": (("--cached-share", "half"), "expected a number"),
    "chunk_zero": (("--chunk", "0"), "--chunk"),
    "batch_zero": (("--batch", "0"), "--batch"),
    "ep_size_zero": (("--ep-size", "0"), "--ep-size"),
    "score_below_one": (("--score", "0.5"), "--score"),
    "score_nan": (("--score", "nan"), "finite"),
    "score_infinite": (("--score", "inf"), "finite"),
    "score_above_ep_size": (("--score", "17"), "[1, ep_size 16]"),
    "candidate_below_one": (("--candidate-score", "0.9"), "--candidate-score"),
    "candidate_above_ep_size": (("--ep-size", "4", "--candidate-score", "4.5"), "candidate_score"),
    "peak_zero": (("--peak-tflops", "0"), "--peak-tflops"),
    "bandwidth_nan": (("--hbm-tbps", "nan"), "finite"),
    "unknown_machine": (("--machine", "tpu"), "--machine"),
    "unknown_role": (("--role", "both"), "--role"),
    "expert_bytes_zero": (("--expert-bytes", "0"), "--expert-bytes"),
}


@pytest.mark.parametrize("name", sorted(OPTION_CASES))
def test_a_bad_option_is_one_line_and_exit_2(name):
    change, expected = OPTION_CASES[name]
    code, out, err = run("screen", "--model", V3, *SCENE, *change)
    assert_one_line_error(code, err, expected, name)
    assert out == ""


CONFIG_CASES = {
    "no_mla": ({"kv_lora_rank": None}, "the screen prices MLA attention"),
    "no_moe_intermediate": ({"moe_intermediate_size": None}, "config has no moe_intermediate_size"),
    "no_expert_count": ({"n_routed_experts": None}, "no MoE expert count"),
    "no_top_k": ({"num_experts_per_tok": None}, "num_experts_per_tok"),
    "top_k_above_experts": ({"num_experts_per_tok": 9}, "num_experts_per_tok"),
    "negative_hidden": ({"hidden_size": -64}, "hidden_size"),
    "nan_hidden": ({"hidden_size": float("nan")}, "hidden_size"),
    "string_heads": ({"num_attention_heads": "2"}, "num_attention_heads"),
    "fractional_kv_lora": ({"kv_lora_rank": 7.5}, "kv_lora_rank"),
    "unpriced_quantisation": ({"quantization_config": {"quant_method": "awq"}}, "not priced here"),
    "unknown_dtype": ({"torch_dtype": "float4"}, "torch_dtype"),
    "all_layers_dense": ({"first_k_dense_replace": 3}, "no MoE layer"),
}


@pytest.mark.parametrize("name", sorted(CONFIG_CASES))
def test_a_bad_config_is_one_line_naming_the_field(name, tmp_path):
    change, expected = CONFIG_CASES[name]
    code, out, err = run("screen", "--model", _config(tmp_path, **change), *SCENE)
    assert_one_line_error(code, err, expected, name)


@pytest.mark.parametrize(
    "name, content, expected",
    [
        ("not_json", "{hidden", "cannot read model config"),
        ("a_list", "[1, 2]", "not a JSON object"),
        ("empty", "", "cannot read"),
    ],
)
def test_a_config_that_is_not_one_is_one_line(name, content, expected, tmp_path):
    path = tmp_path / "config.json"
    path.write_text(content)
    code, _, err = run("screen", "--model", path, *SCENE)
    assert_one_line_error(code, err, expected, name)


def test_a_missing_config_is_one_line(tmp_path):
    for path in (tmp_path / "nothing.json", tmp_path):  # no file; a folder without config.json
        code, _, err = run("screen", "--model", path, *SCENE)
        assert_one_line_error(code, err, "cannot read model config", str(path))


def test_the_library_refuses_a_scene_that_is_not_one():
    for bad, expected in (
        ({"cached_share": float("nan")}, "cached_share"),
        ({"input_len": 0}, "input_len"),
        ({"role": "both"}, "role"),
        ({"chunk": True}, "chunk"),
    ):
        with pytest.raises(Exception, match=expected):
            PricedScene(**{"role": "prefill", "input_len": 8, "output_len": 1, "cached_share": 0.0, **bad})
    with pytest.raises(Exception, match="bytes_per_s"):
        Machine("broken", 1e12, float("nan"), "a test")


# DeepSeek-V4-Flash (issue 44, item 8): compressed sparse attention, hyper-connections, MXFP4 experts.
V4 = "data/models/deepseek-v4-flash"


@pytest.fixture(scope="module")
def v4():
    return read_step_model(read_model(V4))


def test_v4_attention_per_compress_ratio_matches_a_hand_count(v4):
    """Decode at context 1,001: every layer attends to the window (128); the 21 ratio-4 layers to the
    top 512 of 250 compressed entries (all 250) and their indexer scores the 250; the 20 ratio-128
    layers to 7 compressed entries; the 2 window-only layers to the window alone."""
    parts = _parts(screen(v4, PricedScene("decode", 1000, 1, 0.0, batch=4), MACHINES["910c"]))
    keys = 2 * 128 + 21 * (128 + 250) + 20 * (128 + 7)
    assert parts["attention_context"].flops == pytest.approx(2 * 64 * 2 * 512 * keys + 21 * 2 * 64 * 128 * 250)
    entry, index_key = 512 * 2, 128 + 4  # bf16 entry; fp8 indexer key with one float32 scale
    assert parts["attention_context"].bytes == pytest.approx(keys * entry + 21 * 250 * index_key)
    top = _parts(screen(v4, PricedScene("decode", 100_000, 1, 0.0, batch=4), MACHINES["910c"]))
    keys = 2 * 128 + 21 * (128 + 512) + 20 * (128 + 781)  # the indexer keeps 512 of 25,000
    assert top["attention_context"].flops == pytest.approx(2 * 64 * 2 * 512 * keys + 21 * 2 * 64 * 128 * 25000)


def test_v4_projections_hyper_connections_and_mxfp4_experts(v4):
    parts = _parts(screen(v4, PricedScene("prefill", 10, 1, 0.0, chunk=100), MACHINES["910c"]))
    h, common = 4096, 4096 * (1024 + 512) + 1024 * 64 * 512 + 64 * 512 * 1024 + 8 * 1024 * 4096
    compressor = {0: 0, 4: h * 2 * 2 * 512 + 1024 * 64 * 128 + h * 64 + h * 4 * 128, 128: h * 2 * 512}
    weights = 43 * common + 21 * compressor[4] + 20 * compressor[128]
    assert parts["attention_projections"].flops == 2 * weights
    mixing = 43 * (2 * 2 * 24 * 4 * h + 2 * 2 * (4 + 16 + 4) * h) + 2 * 4 * 4 * h  # two blocks a layer, the head
    assert parts["hyper_connections"].flops == pytest.approx(mixing)
    assert "dense_mlp" not in parts  # every V4-Flash layer is MoE
    assert parts["routed_experts"].flops == 43 * 2 * 6 * 3 * h * 2048
    assert v4.expert_weight_bytes == pytest.approx(0.5 + 1 / 32) and v4.linear_bytes == pytest.approx(1 + 1 / 128**2)


def test_v4_flash_on_the_field_scenes_keeps_its_experts_at_128k(v3, v4):
    """At 128K with 90.62% hits V3's dense MLA is 88% of the step and a layout can give 2%; V4's
    attention reads a bounded set of keys per query (the indexer's scan aside), so its routed
    experts keep a third of the step and the ceiling stays above 1.1."""
    for machine in MACHINES.values():
        short, long = (screen(v4, scene, machine, b0, b1) for scene, b0, b1 in (FIELD_16K, FIELD_128K))
        old = screen(v3, *FIELD_128K[:1], machine, *FIELD_128K[1:])
        assert _parts(long)["attention_context"].share < 0.5 < _parts(old)["attention_context"].share, machine.name
        assert long.routed_share > 0.3 and long.ceiling_ratio > 1.1 > old.ceiling_ratio, machine.name
        assert short.ceiling_ratio > long.ceiling_ratio, machine.name


def test_v4_names_its_assumptions():
    args = ("screen", "--model", V4, "--role", "decode", "--input-len", 16384, "--output-len", 1024)
    code, out, err = run(*args, "--cached-share", 0, "--json")
    assert code == 0, err
    doc = json.loads(out)
    assert set(doc["parts"]) == {
        "attention_projections",
        "attention_context",
        "hyper_connections",
        "shared_experts",
        "routed_experts",
        "rest",
    }
    said = " ".join(doc["assumptions"])
    for named in ("MXFP4", "ue8m0", "sliding window (128)", "top 512", "ratio 128", "first 3 MoE layers route", "4 x hidden"):
        assert named in said, named


V4_CASES = {
    "ratio_unknown": ({"compress_ratios": [0, 0, 8] + [4] * 41}, "compress_ratios"),
    "ratios_short": ({"compress_ratios": [0, 4]}, "compress_ratios"),
    "no_index_topk": ({"index_topk": None}, "config has no index_topk"),
    "o_groups_uneven": ({"o_groups": 7}, "o_groups 7 does not divide"),
    "expert_dtype_unknown": ({"expert_dtype": "int3"}, "expert_dtype 'int3'"),
}


@pytest.mark.parametrize("name", sorted(V4_CASES))
def test_a_bad_v4_config_is_one_line_naming_the_field(name, tmp_path):
    cfg = json.loads(open(f"{V4}/config.json").read())
    change, expected = V4_CASES[name]
    cfg = {k: v for k, v in {**cfg, **change}.items() if v is not None}
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    code, out, err = run("screen", "--model", tmp_path, *SCENE)
    assert_one_line_error(code, err, expected, name)
