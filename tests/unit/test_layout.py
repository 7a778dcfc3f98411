import numpy as np
import pytest

from vllm_scene_eplb.errors import SceneEplbError
from vllm_scene_eplb.layouts.layout import Geometry, Layout, linear_map, map_problems, same_rank_duplicates


def test_geometry_counts_its_slots():
    g = Geometry(256, 16, 16, 1)
    assert (g.num_physical, g.slots_per_rank) == (272, 17)


@pytest.mark.parametrize(
    "args, message",
    [((256, 15, 16), "not divisible by ep_size"), ((256, 16, 16, 3), "not divisible by nodes"), ((2, 10, 4), "cannot be filled")],
    ids=["slots-not-divisible-by-ep", "ranks-not-divisible-by-nodes", "more-slots-than-experts-fill"],
)
def test_a_geometry_that_breaks_a_rule_is_refused(args, message):
    with pytest.raises(SceneEplbError, match=message):
        Geometry(*args)


def test_map_problems_name_each_defect():
    g = Geometry(4, 2, 2)  # 6 slots, 3 per rank
    good = np.array([[0, 1, 2, 3, 0, 1]])
    assert map_problems(good, g) == []
    assert "outside [0, 4)" in map_problems(np.array([[0, 1, 2, 3, 0, 9]]), g)[0]
    assert "have no slot" in map_problems(np.array([[0, 1, 2, 0, 1, 2]]), g)[0]
    dup = np.array([[0, 0, 1, 2, 3, 1]])
    assert any("holds logical expert 0 twice" in p for p in map_problems(dup, g))
    assert same_rank_duplicates(dup, g) == 1
    assert "5 slots per layer" in map_problems(np.array([[0, 1, 2, 3, 0]]), g)[0]


def test_layout_refuses_an_invalid_map():
    with pytest.raises(SceneEplbError, match="twice"):
        Layout(np.array([[0, 0, 1, 2, 3, 1]]), Geometry(4, 2, 2))


def _two_moe_rows() -> Layout:
    return Layout(np.array([[0, 1, 2, 3, 0, 1]] * 3), Geometry(4, 2, 2), moe_layers=(1, 2))


@pytest.mark.parametrize(
    "model, message",
    [
        ((3, 4, 2), "the model has 3"),
        ((2, 4, 4), "ep_size 4"),
        ((2, 4, 2, (0, 1), 3), r"MoE rows \[1, 2\] differ from the model's MoE layers \[0, 1\]"),
    ],
    ids=["moe-layer-count", "ep-size", "moe-layer-ids"],
)
def test_layout_refuses_a_model_it_was_not_fitted_for(model, message):
    with pytest.raises(SceneEplbError, match=message):
        _two_moe_rows().check_model(*model)


def test_layout_accepts_its_own_model():
    lay = _two_moe_rows()
    lay.check_model(2, 4, 2)
    lay.check_model(2, 4, 2, (1, 2), 3)
    lay.check_model(2, 4, 2, (0, 1), 5)  # another layer axis (e.g. MoE rows only): ids cannot be compared


def test_linear_map_is_p_mod_e():
    g = Geometry(8, 4, 4)
    assert linear_map(g, 2)[1].tolist() == [0, 1, 2, 3, 4, 5, 6, 7, 0, 1, 2, 3]
