"""Our layouts against vLLM-Ascend 0.23.0.post1's own eplb_utils.py (its released code, run on CPU)."""

from types import SimpleNamespace

import numpy as np
import pytest
import torch

from vllm_scene_eplb.adapters.vllm_ascend import check_versions
from vllm_scene_eplb.adapters.vllm_ascend.tables import (
    AscendDispatch,
    install_dispatch,
    log2phy_dynamic,
    log2phy_static,
    off_rank_with_local,
    rank_expert_maps,
)
from vllm_scene_eplb.errors import SceneEplbError
from vllm_scene_eplb.fit import FitOptions, fit
from vllm_scene_eplb.formats import GeometryHint, read_counts, read_layout, write_layout
from vllm_scene_eplb.layouts.counts import Counts
from vllm_scene_eplb.layouts.layout import Geometry

from ..ascend_env import load_eplb_utils
from ..conftest import DATA, require_vllm, skewed_counts

pytestmark = pytest.mark.engine


@pytest.fixture(scope="module")
def eu():
    require_vllm()  # eplb_utils imports vllm.logger and vLLM's determine_expert_map
    return load_eplb_utils()


@pytest.fixture(scope="module")
def field_layout():
    """The field geometry: 256 experts, EP16, 16 redundant slots, fitted on real DeepSeek-V3 prefill counts."""
    counts = read_counts(DATA / "prefill_in4096.json")
    return fit(counts, FitOptions(Geometry(256, 16, 16)))


def _their_maps(eu, path, moe_layers, ep, E, tp_size=None):
    """init_eplb_config for every MoE layer and rank: (global expert maps [L, ep, E], log2phy [L, ep, E])."""
    cfg = SimpleNamespace(expert_map_path=str(path), dynamic_eplb=False, num_redundant_experts=0)
    maps, l2p = [], []
    orig = getattr(torch.Tensor, "npu", None)
    torch.Tensor.npu = lambda self: self  # their code moves log2phy to the NPU; keep it on CPU
    try:
        for k in range(moe_layers):
            per_rank = []
            for r in range(ep):
                g, _local, log2phy, n_red = eu.init_eplb_config(
                    cfg, k, SimpleNamespace(num_experts=E, ep_size=ep, ep_rank=r), tp_size=tp_size
                )
                per_rank.append(log2phy.numpy())
            maps.append(g.numpy())
            l2p.append(np.stack(per_rank))
    finally:
        if orig is None:
            del torch.Tensor.npu
        else:
            torch.Tensor.npu = orig
    return np.stack(maps), np.stack(l2p), n_red


@pytest.fixture(scope="module")
def exported(field_layout, tmp_path_factory):
    return write_layout(field_layout, tmp_path_factory.mktemp("ascend") / "expert_map.json", fmt="vllm-ascend")


@pytest.fixture(scope="module")
def theirs(eu, exported, field_layout):
    """vLLM-Ascend's maps for every MoE layer (its log2phy without and with TP=2)."""
    n = len(field_layout.moe_layers)
    maps, l2p, n_red = _their_maps(eu, exported, n, 16, 256)
    _, l2p_tp2, _ = _their_maps(eu, exported, n, 16, 256, tp_size=2)
    return {"maps": maps, "n_red": n_red, None: l2p, 2: l2p_tp2}


def test_exported_map_parses_into_exactly_our_rank_maps(theirs, exported, field_layout):
    assert theirs["n_red"] == 16
    np.testing.assert_array_equal(theirs["maps"], rank_expert_maps(field_layout))
    path = exported
    back = read_layout(path, GeometryHint(ep_size=16, num_experts=256))
    np.testing.assert_array_equal(
        back.physical_to_logical_map, field_layout.physical_to_logical_map[list(field_layout.moe_layers)]
    )


def test_mtp_layer_gets_the_files_slot_count(eu, field_layout, exported):
    placement, physical = eu.expert_file_to_tensor(str(exported), len(field_layout.moe_layers))
    assert placement is None and physical == 272


def test_our_tables_are_valid_physical_ids_for_every_rank_and_expert(field_layout):
    p2l = field_layout.physical_to_logical_map[list(field_layout.moe_layers)]
    static = log2phy_static(field_layout)
    assert static.shape == (len(field_layout.moe_layers), 16, 256)
    assert ((static >= 0) & (static < 272)).all()
    assert (np.take_along_axis(p2l[:, None, :].repeat(16, 1), static, axis=2) == np.arange(256)).all()
    l2p, replicas = log2phy_dynamic(field_layout)
    valid = np.arange(l2p.shape[2])[None, None, :] < replicas[..., None]
    assert (l2p[valid] >= 0).all()
    assert (
        np.take_along_axis(p2l, np.where(valid, l2p, 0).reshape(len(p2l), -1), axis=1).reshape(l2p.shape)[valid]
        == np.broadcast_to(np.arange(256)[None, :, None], l2p.shape)[valid]
    ).all()


@pytest.mark.parametrize("tp_size", [None, 2])
def test_their_fixed_formula_routes_off_rank_where_ours_stays_local(theirs, field_layout, tp_size):
    ours = log2phy_static(field_layout)
    their_off, our_off = off_rank_with_local(theirs[tp_size], field_layout), off_rank_with_local(ours, field_layout)
    replicated = int((field_layout.replica_counts()[list(field_layout.moe_layers)] > 1).sum())
    print(
        f"\nfield geometry, tp_size={tp_size}: (layer, rank, expert) routed off-rank although a local replica exists: "
        f"vLLM-Ascend formula {their_off}, ours {our_off} ({replicated} replicated (layer, expert) pairs)"
    )
    assert our_off == 0 and their_off > 0


@pytest.mark.parametrize(
    "ascend, vllm",
    [
        ("0.23.0.post1", "0.23.0"),
        ("0.23.0.post1+gabc123", "0.23.0"),
        ("0.23.0.post1.dev4+g1234abc", "0.23.0"),
        ("0.23.0.post1", "0.23.0+empty"),
    ],
)
def test_builds_of_the_release_are_accepted(ascend, vllm):
    check_versions(ascend, vllm)


@pytest.mark.parametrize(
    "ascend, vllm",
    [
        ("0.18.0", "0.18.0"),
        ("0.24.0", "0.23.0"),
        ("0.23.0", "0.23.0"),
        ("0.23.0.post2", "0.23.0"),
        ("0.23.0.post1", "0.24.0"),
        ("0.23.0.post1", "0.23.1"),  # vLLM-Ascend picks its fused MoE class on exactly 0.23.0
        ("garbage", "0.23.0"),
    ],
)
def test_other_engine_versions_are_refused(ascend, vllm):
    with pytest.raises(SceneEplbError, match="written for vllm-ascend 0.23.0.post1"):
        check_versions(ascend, vllm)


def test_our_static_dispatch_replaces_their_formula_inside_init_eplb_config(eu, exported, field_layout):
    """vLLM-Ascend's own init_eplb_config, with generate_log2phy_map replaced: every rank's log2phy
    is our static table row, and no rank routes off-rank when it holds a replica."""
    fresh = load_eplb_utils()  # a second instance: the fixture's keeps their formula for the other tests
    install_dispatch(fresh, lambda: AscendDispatch(field_layout, "static"))
    n = len(field_layout.moe_layers)
    _, l2p, _ = _their_maps(fresh, exported, n, 16, 256, tp_size=2)
    np.testing.assert_array_equal(l2p, log2phy_static(field_layout))
    assert off_rank_with_local(l2p, field_layout) == 0


def test_a_drafters_moe_layer_is_placed_and_dispatched_by_its_drafter_row(eu, tmp_path):
    """vLLM-Ascend's own init_eplb_config for the MoE layer built after the main model's (the MTP layer,
    index ``moe_layer_count``, which the expert map file cannot name): with the plugin's replacements,
    every rank's expert map is the layout's drafter row and its log2phy our static table of that row
    (its fitted sources), not vLLM-Ascend's default split; a layout without a drafter row is refused,
    naming the layer."""
    g = Geometry(8, 2, 2)
    counts = Counts(skewed_counts(4, 3, 8), {"moe_layers": [0, 1], "drafter_layers": [2]})
    layout = fit(counts, FitOptions(g))
    path = write_layout(layout, tmp_path / "expert_map.json", fmt="vllm-ascend")
    fresh = load_eplb_utils()
    install_dispatch(fresh, lambda: AscendDispatch(layout, "static"))
    maps, l2p, n_red = _their_maps(fresh, path, 3, 2, 8)
    drafter = layout.drafter_view()
    assert n_red == 2 and not np.array_equal(maps[2], maps[1])
    np.testing.assert_array_equal(maps, np.concatenate([rank_expert_maps(layout), rank_expert_maps(drafter)]))
    np.testing.assert_array_equal(l2p[2], log2phy_static(drafter)[0])
    plain = fit(Counts(counts.data[:, :2]), FitOptions(g))
    install_dispatch(fresh, lambda: AscendDispatch(plain, "static"))
    with pytest.raises(SceneEplbError, match=r"drafter's MoE layer \(MoE layer 2, after the main model's 2\)"):
        _their_maps(fresh, path, 3, 2, 8)


# ---------------------------------------------------------------- startup wiring (adapters/vllm_ascend/startup)


@pytest.fixture(scope="module")
def ascend_model(tmp_path_factory):
    """A generated Qwen3-MoE checkpoint (8 experts, 2 MoE layers) and a layout fitted for EP=2, R=2."""
    from ..conftest import tiny_model_and_layout

    root = tmp_path_factory.mktemp("ascend-startup")
    model, layout, path = tiny_model_and_layout(root, entries=2, num_redundant=2, ep_size=2)
    return model, layout, path, root


def _startup(ascend_model, cases: dict, extra_env: dict | None = None) -> dict:
    """``cases`` (name -> {"additional": config, "draft": bool}) through vLLM-Ascend's startup in one
    process (``tests/scripts/ascend_startup.py``): name -> its answer, the config hook's lines in ``log``."""
    import json

    from ..ascend_env import env
    from ..conftest import run_script

    model, layout, _, _ = ascend_model
    args = (model, json.dumps(cases), len(layout.moe_layers), layout.geometry.num_experts)
    res = run_script("ascend_startup", *args, env={**env(), **(extra_env or {})})
    assert res.returncode == 0, res.stderr[-3000:]
    return json.loads(res.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def startups(ascend_model) -> dict:
    """The startup cases of the tests below that share the default environment, in one process."""
    _, layout, native, root = ascend_model
    sglang = write_layout(layout, root / "layout.sglang.json", fmt="sglang")
    run = {"layout": str(native), "dump_dir": str(root / "dump")}
    cases = {
        "scene-eplb": {"additional": {"scene_eplb": run}},
        "sglang": {"additional": {"scene_eplb": {**run, "layout": str(sglang), "dump_dir": str(root / "dump-sglang")}}},
        "collection": {"additional": {"scene_eplb": {"role": "prefill", "dump_dir": str(root / "dump2")}}},
        "draft": {"additional": {"scene_eplb": {**run, "dump_dir": str(root / "d-draft")}}, "draft": True},
        "dynamic": {"additional": {"scene_eplb": {**run, "dump_dir": str(root / "dump-dyn"), "dispatch": "dynamic"}}},
    }
    return _startup(ascend_model, cases)


@pytest.mark.parametrize("fmt", ["scene-eplb", "sglang"])
def test_startup_points_vllm_ascend_at_our_layout_and_dispatches_our_way(ascend_model, startups, fmt):
    """Real VllmConfig of vLLM 0.23 with vLLM-Ascend 0.23.0.post1's platform, eplb_utils and
    EplbConfig: the plugin writes the expert map, vLLM-Ascend parses it into our per-rank maps, and
    its log2phy is our static table while the config carries the layout, its formula otherwise.
    A bare SGLang layout (no geometry, no fitted table in the file) works the same with the
    even-split table; the config hook logs what it prepared."""
    from vllm_scene_eplb.layouts.layout import Layout

    _, layout, _, root = ascend_model
    assert layout.static_sources is not None  # fitted for static: the native file carries its table
    if fmt != "scene-eplb":
        layout = Layout(layout.physical_to_logical_map, layout.geometry, layout.moe_layers)
    out = startups[fmt]
    assert (
        f"scene-eplb: layout {layout.digest()} (2 redundant slots, static dispatch) -> vLLM-Ascend expert_map_path" in out["log"]
    )
    dump = root / ("dump" if fmt == "scene-eplb" else "dump-sglang")
    assert out["path"].startswith(str(dump)) and out["path"].endswith(".json")
    assert (
        read_layout(out["path"], GeometryHint(ep_size=2, num_experts=8)).physical_to_logical_map.tolist()
        == layout.physical_to_logical_map[list(layout.moe_layers)].tolist()
    )
    ours = np.array(out["ours"]).reshape(len(layout.moe_layers), 2, -1)
    np.testing.assert_array_equal(ours, log2phy_static(layout))
    assert out["theirs"] == out["theirs_formula"]  # plugin off: their formula, untouched
    assert off_rank_with_local(ours, layout) == 0


def test_startup_accepts_a_collection_run(ascend_model, startups):
    """No layout: the flag alone is a collection run; vLLM-Ascend's eplb_config is left alone and
    nothing is written at config time (the recorder binds in the workers)."""
    _, _, _, root = ascend_model
    out = startups["collection"]
    assert "refused" not in out and out["path"] is None
    assert "scene-eplb: collection run (role prefill, 512 ring entries" in out["log"]
    assert not (root / "dump2").exists()


def test_startup_refuses_the_v2_model_runner(ascend_model):
    _, _, path, root = ascend_model
    cases = {"v2": {"additional": {"scene_eplb": {"layout": str(path), "dump_dir": str(root / "d-v2")}}}}
    out = _startup(ascend_model, cases, extra_env={"VLLM_USE_V2_MODEL_RUNNER": "1"})["v2"]
    assert "V1 model runner only" in out["refused"] and not (root / "d-v2").exists()


@pytest.mark.parametrize(
    "extra, message",
    [
        ({"eplb_config": {"dynamic_eplb": True}}, "both move experts"),
        ({"eplb_config": {"expert_map_path": "/x/map.json"}}, "set by hand"),
        ({"mix_placement": True}, "turn off mix_placement"),
    ],
    ids=["dynamic-eplb", "expert-map-set-by-hand", "mix-placement"],
)
def test_prepare_refuses_settings_that_fight_the_layout(ascend_model, extra, message):
    from vllm_scene_eplb.adapters.vllm_ascend.startup import prepare_layout_run
    from vllm_scene_eplb.rig.tiny_model import TinyMoeSpec, hf_config

    _, _, path, root = ascend_model
    additional = {"scene_eplb": {"layout": str(path), "dump_dir": str(root / "dump3")}, **extra}
    before = repr(additional)
    with pytest.raises(SceneEplbError, match=message):
        prepare_layout_run(additional, hf_config(TinyMoeSpec()), ep_size=2)
    assert repr(additional) == before and not (root / "dump3").exists()


def test_a_drafters_copy_of_a_layout_runs_config_passes_the_hook_again(ascend_model, startups):
    """vLLM 0.23's real ``_create_draft_vllm_config`` (what loading an MTP drafter runs) builds the
    drafter's config as a ``dataclasses.replace`` of the server's, which re-runs the config hook on
    the expert_map_path the plugin itself wrote: it passes (the same file), where the hook used to
    refuse it as set by hand."""
    _, _, _, root = ascend_model
    out = startups["draft"]
    assert "refused" not in out, out["refused"]
    assert out["draft"] == out["server"] and out["server"]["expert_map_path"].startswith(str(root / "d-draft"))


def test_prepare_passes_its_own_write_and_refuses_any_other_path(ascend_model):
    """A config prepared once passes again unchanged (the same file); pointed anywhere else, even at a
    copy of that file, it is refused as set by hand."""
    import shutil

    from vllm_scene_eplb.adapters.vllm_ascend.startup import prepare_layout_run
    from vllm_scene_eplb.rig.tiny_model import TinyMoeSpec, hf_config

    _, _, path, root = ascend_model
    additional = {"scene_eplb": {"layout": str(path), "dump_dir": str(root / "d-again")}}
    _, written = prepare_layout_run(additional, hf_config(TinyMoeSpec()), ep_size=2)
    once = repr(additional)
    assert prepare_layout_run(additional, hf_config(TinyMoeSpec()), ep_size=2)[1] == written and repr(additional) == once
    copy = shutil.copy(written, root / "copy.json")
    additional["eplb_config"]["expert_map_path"] = str(copy)
    with pytest.raises(SceneEplbError, match="set by hand"):
        prepare_layout_run(additional, hf_config(TinyMoeSpec()), ep_size=2)


def test_a_layout_run_with_an_moe_drafter_needs_the_drafters_rows(ascend_model, caplog):
    """An MTP drafter (MoE layers of its own) with a layout on vLLM-Ascend: refused, naming the method,
    when the layout has no drafter rows (vLLM-Ascend would place its layer by its default split); with
    them, the config hook says the drafter's layers load and route by them. A dense drafter needs none."""
    from vllm_scene_eplb.adapters.vllm_ascend.startup import check_run
    from vllm_scene_eplb.rig.tiny_model import TinyMoeSpec, hf_config

    _, layout, path, root = ascend_model
    counts = Counts(skewed_counts(2, len(layout.moe_layers), layout.geometry.num_experts))
    with_rows = write_layout(fit(counts, FitOptions(layout.geometry), drafter_layers=1), root / "with-drafter.json")

    def config(draft_hf: dict, layout_path):
        draft = SimpleNamespace(hf_config=SimpleNamespace(to_dict=lambda: draft_hf))
        return SimpleNamespace(
            additional_config={"scene_eplb": {"layout": str(layout_path), "dump_dir": str(root / "d-mtp")}},
            parallel_config=SimpleNamespace(
                pipeline_parallel_size=1, enable_expert_parallel=True, tensor_parallel_size=2, data_parallel_size=1
            ),
            model_config=SimpleNamespace(hf_config=SimpleNamespace(to_dict=lambda: hf_config(TinyMoeSpec()))),
            speculative_config=SimpleNamespace(method="mtp", draft_model_config=draft),
            kv_transfer_config=None,
        )

    with caplog.at_level("INFO", logger="vllm.scene_eplb"):
        check_run(config({"num_experts": 0}, path))
        assert "drafter" not in caplog.text
        with pytest.raises(SceneEplbError, match=r"drafter that has MoE layers \(mtp\): the layout has no rows for them"):
            check_run(config(hf_config(TinyMoeSpec()), path))
        check_run(config(hf_config(TinyMoeSpec()), with_rows))
    assert "the mtp drafter's MoE layers load and route by the layout's drafter rows [2]" in caplog.text


def test_prepare_refuses_a_layout_for_another_ep_size(ascend_model):
    from vllm_scene_eplb.adapters.vllm_ascend.startup import prepare_layout_run
    from vllm_scene_eplb.rig.tiny_model import TinyMoeSpec, hf_config

    _, _, path, root = ascend_model
    with pytest.raises(SceneEplbError, match="does not fit this server"):
        prepare_layout_run(
            {"scene_eplb": {"layout": str(path), "dump_dir": str(root / "d4")}}, hf_config(TinyMoeSpec()), ep_size=4
        )


def test_prepare_needs_an_explicit_role_with_kv_both(ascend_model):
    from vllm_scene_eplb.adapters.vllm_ascend.startup import prepare_layout_run
    from vllm_scene_eplb.rig.tiny_model import TinyMoeSpec, hf_config

    _, _, path, root = ascend_model
    additional = {"scene_eplb": {"layout": str(path), "dump_dir": str(root / "d5")}}
    with pytest.raises(SceneEplbError, match="kv_both"):
        prepare_layout_run(additional, hf_config(TinyMoeSpec()), ep_size=2, kv_role="kv_both")
    additional["scene_eplb"]["role"] = "prefill"
    _, written = prepare_layout_run(additional, hf_config(TinyMoeSpec()), ep_size=2, kv_role="kv_both")
    assert written.is_file() and additional["eplb_config"]["expert_map_path"] == str(written)


def test_startup_with_dynamic_dispatch_builds_virtual_id_maps(ascend_model, startups):
    """dispatch "dynamic" on vLLM-Ascend: the config hook's line says so and, inside their own
    init_eplb_config, every rank's log2phy is the virtual-id map (replica j of expert e at e + E*j)
    that the select_experts hook pairs with (tests/ascend/test_vllm_ascend_moe.py runs the two together)."""
    from vllm_scene_eplb.adapters.vllm_ascend.tables import dynamic_virtual_log2phy

    _, layout, _, _ = ascend_model
    out = startups["dynamic"]
    assert f"scene-eplb: layout {layout.digest()} (2 redundant slots, dynamic dispatch)" in out["log"]
    maps = rank_expert_maps(layout)
    want = [dynamic_virtual_log2phy(maps[k]).tolist() for k in range(len(layout.moe_layers)) for _ in range(2)]
    assert out["ours"] == want
    assert all(len(row) > layout.geometry.num_experts for row in out["ours"])
    assert out["theirs"] == out["theirs_formula"]


def test_dynamic_dispatch_refuses_returning_routed_experts(ascend_model):
    from vllm_scene_eplb.adapters.vllm_ascend.startup import prepare_layout_run
    from vllm_scene_eplb.rig.tiny_model import TinyMoeSpec, hf_config

    _, _, path, root = ascend_model
    additional = {"scene_eplb": {"layout": str(path), "dump_dir": str(root / "d-routed"), "dispatch": "dynamic"}}
    with pytest.raises(SceneEplbError, match="enable_return_routed_experts"):
        prepare_layout_run(additional, hf_config(TinyMoeSpec()), ep_size=2, returns_routed_experts=True)
    assert not (root / "d-routed").exists()
