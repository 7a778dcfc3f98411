"""One model reader (``planning/model_files.read_model``): DeepSeek-V4's config in vLLM's spelling and in
the one transformers >= 5.16 writes read alike (geometry, attention, memory, and what `screen` and
`preflight` print); a config that states both and disagrees is refused through the CLI; the known
models a counts shape names are the shipped configs; `--model` is one spelling, required where the
command reads nothing else."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from vllm_scene_eplb.fileio import load_json
from vllm_scene_eplb.planning.memory import read_model_memory
from vllm_scene_eplb.planning.model_files import read_model
from vllm_scene_eplb.planning.model_geometry import KNOWN_MODELS, V4_DEFAULT_HASH_LAYERS, from_hf_config

from .test_bad_input import assert_one_line_error, run

MODELS = Path("data/models")
V4 = MODELS / "deepseek-v4-flash"
SCREEN = ("--role", "prefill", "--input-len", "16384", "--output-len", "1024", "--cached-share", "0", "--json")
PREFLIGHT = ("--dp", "16", "--tp", "1", "--redundant", "16", "--max-model-len", "133120", "--max-num-seqs", "4", "--json")


def _write(folder: Path, cfg: dict) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(cfg))
    return folder


@pytest.fixture(scope="module")
def transformers_v4(tmp_path_factory) -> Path:
    """The shipped V4-Flash config as transformers' own DeepseekV4Config writes it: mlp_layer_types and
    layer_types, no num_hash_layers nor compress_ratios."""
    from transformers.models.deepseek_v4 import DeepseekV4Config

    folder = tmp_path_factory.mktemp("v4-transformers")
    DeepseekV4Config(**load_json(V4 / "config.json", "config")).save_pretrained(folder)
    return folder


def test_transformers_writes_the_new_spelling_only(transformers_v4):
    cfg = load_json(transformers_v4 / "config.json", "config")
    assert "num_hash_layers" not in cfg and "compress_ratios" not in cfg
    assert cfg["mlp_layer_types"][:4] == ["hash_moe", "hash_moe", "hash_moe", "moe"] and len(cfg["layer_types"]) == 43


def test_both_spellings_give_the_same_model(transformers_v4):
    legacy, new = read_model(V4), read_model(transformers_v4)
    assert new.geometry == legacy.geometry and new.geometry.hash_layers == (0, 1, 2)
    assert new.attention() == legacy.attention()
    assert read_model_memory(new) == read_model_memory(legacy)


@pytest.mark.parametrize("command, options", [("screen", SCREEN), ("preflight", PREFLIGHT)])
def test_both_spellings_print_the_same_through_the_cli(transformers_v4, command, options):
    answers = []
    for model in (V4, transformers_v4):
        code, out, err = run(command, "--model", model, *options)
        assert code == 0, err
        answers.append({k: v for k, v in json.loads(out).items() if k != "model"})
    assert answers[0] == answers[1]


def test_a_v4_config_with_neither_spelling_has_transformers_default_hash_layers():
    cfg = {k: v for k, v in load_json(V4 / "config.json", "config").items() if k != "num_hash_layers"}
    assert from_hf_config(cfg).hash_layers == tuple(range(V4_DEFAULT_HASH_LAYERS))
    assert from_hf_config({**cfg, "model_type": "deepseek_v3"}).hash_layers == ()  # not V4: no hash layers


def _disagreeing(tmp_path: Path, name: str, change: dict) -> Path:
    return _write(tmp_path / name, {**load_json(V4 / "config.json", "config"), **change})


GEOMETRY_CASES = [  # the MoE geometry's: every command that reads a model reads them
    (
        {"mlp_layer_types": ["hash_moe"] * 2 + ["moe"] * 41},
        "num_hash_layers 3 (layers [0, 1, 2]) and mlp_layer_types (hash_moe at layers [0, 1]) disagree",
    ),
    ({"mlp_layer_types": ["hash_moe"] * 3 + ["dense"] * 40}, "config mlp_layer_types must be a list of one of"),
]
ATTENTION_CASES = [  # the attention's: the commands that price it (screen, preflight, the memory of a slot)
    (
        {"layer_types": ["sliding_attention"] * 43},
        "compress_ratios and layer_types disagree at layer 2 (4 against sliding_attention)",
    ),
    ({"layer_types": ["sliding_attention"] * 42}, "config layer_types must be a list of one of"),
]
CASE_IDS = ["hash layers", "an unknown mlp kind", "compress ratios", "a layer short"]


@pytest.mark.parametrize("change, expected", GEOMETRY_CASES + ATTENTION_CASES, ids=CASE_IDS)
def test_a_config_whose_two_spellings_disagree_is_refused_by_the_screen(tmp_path, change, expected):
    code, _, err = run("screen", "--model", _disagreeing(tmp_path, "m", change), *SCREEN)
    assert_one_line_error(code, err, expected, "screen")


@pytest.mark.parametrize("change, expected", GEOMETRY_CASES, ids=CASE_IDS[:2])
def test_a_config_whose_hash_layers_disagree_is_refused_by_inspect(tmp_path, change, expected):
    code, out, err = run("inspect", "data/deepseek_v3_counts/prefill_in1024.json", "--model", _disagreeing(tmp_path, "m", change))
    assert_one_line_error(code, err, expected, "inspect")
    assert not out


@pytest.mark.parametrize("known", KNOWN_MODELS, ids=[m.name for m in KNOWN_MODELS])
def test_the_known_models_are_the_shipped_configs(known):
    folder = {"DeepSeek-V3/R1": "deepseek-v3", "DeepSeek-V4-Flash": "deepseek-v4-flash"}[known.name]
    assert read_model(MODELS / folder).geometry == known.geometry


def _usage(command: str) -> str:
    code, out, _ = run(command, "--help")
    assert code == 0
    return re.sub(r"\s+", " ", out.split("\n\n")[0])


@pytest.mark.parametrize("command", ["preflight", "screen", "hash-counts"])
def test_the_usage_says_model_is_required_where_it_is(command):
    usage = _usage(command)
    assert " --model DIR" in usage and "[--model DIR]" not in usage, usage


@pytest.mark.parametrize("command", ["fit", "inspect", "validate", "report", "advise"])
def test_the_usage_says_model_is_optional_where_it_is(command):
    assert "[--model DIR]" in _usage(command)


def test_bench_names_the_served_model_as_vllm_bench_serve_does():
    assert " --served-model-name NAME" in _usage("bench") and "--model" not in _usage("bench")
    import argparse

    from vllm.benchmarks.serve import add_cli_args

    from vllm_scene_eplb.ab.bench import serve_args
    from vllm_scene_eplb.ab.results import BenchLoad

    parser = argparse.ArgumentParser()
    add_cli_args(parser)
    scene = BenchLoad("s", 4, 2, float("inf"), 64, 8)
    args = parser.parse_args(serve_args(scene, "http://h:1", "ds", "/models/DeepSeek-V3", Path("/tmp"), "t"))
    assert (args.served_model_name, args.model, args.tokenizer) == ("ds", "/models/DeepSeek-V3", None)


@pytest.mark.parametrize("old", [("screen", "--model-config"), ("hash-counts", "MODEL")])
def test_the_old_spellings_are_gone(old):
    command, spelling = old
    assert spelling not in _usage(command)
