"""The MoE geometry read from the shipped model configs: DeepSeek-V3 and DeepSeek-V4-Flash."""

import pytest

from vllm_scene_eplb.errors import SceneEplbError
from vllm_scene_eplb.fileio import load_json
from vllm_scene_eplb.planning.model_files import read_model
from vllm_scene_eplb.planning.model_geometry import from_hf_config

from ..conftest import REPO

MODELS = REPO / "data" / "models"


def test_deepseek_v4_flash_is_43_moe_layers_without_groups_its_first_three_hash_routed():
    g = read_model(MODELS / "deepseek-v4-flash").geometry
    assert (g.num_layers, g.moe_layers, g.num_experts, g.top_k, g.expert_groups) == (43, tuple(range(43)), 256, 6, 1)
    assert g.hash_layers == (0, 1, 2)


def test_deepseek_v3_has_no_hash_layers_and_its_dense_layers_left_out():
    g = read_model(MODELS / "deepseek-v3").geometry
    assert (g.moe_layers[0], len(g.moe_layers), g.expert_groups, g.hash_layers) == (3, 58, 8, ())


@pytest.mark.parametrize("bad", [-1, 44, "3", 2.5])
def test_a_hash_layer_count_outside_the_moe_layers_is_refused_naming_the_field(bad):
    cfg = load_json(MODELS / "deepseek-v4-flash" / "config.json", "config")
    with pytest.raises(SceneEplbError, match="num_hash_layers"):
        from_hf_config({**cfg, "num_hash_layers": bad})


def test_hash_layers_must_be_moe_layers():
    cfg = load_json(MODELS / "deepseek-v3" / "config.json", "config")  # layers 0-2 dense
    with pytest.raises(SceneEplbError, match="not MoE layers"):
        from_hf_config({**cfg, "num_hash_layers": 3})
