"""The recorder on vLLM-Ascend, run through its real released code on CPU (``tests/ascend_env``).

For every MoE comm method (MC2, ALLTOALL, ALLGATHER), every DP x TP geometry up to 2 x 2 and both
the unquantized and the W8A8-dynamic quant method, each simulated rank runs, in order, vLLM-Ascend's
real ``set_ascend_forward_context`` (its ``mc2_mask``, padding sizes and DP block size), the comm
method's real ``prepare`` (padding, TP split, DP gather) and the quant method's real ``apply`` up to
``fused_experts``, whose ``select_experts`` is the real one, hooked by the plugin. The batches carry
graph-padding rows with their own (random) router logits, so counting one of them, or a token
twice, changes the sum. The recorded counts of all ranks must equal a bincount of the ids the real
``select_experts`` gives the real tokens of each DP rank. W8A8 runs with ``mix_placement``, whose
shared-expert pseudo ids must not be counted.

Stand-ins, beside ``torch_npu``: the DP group's all-gather (the test holds every DP rank's batch and
hands back their concatenation), the TP/DP group sizes the forward context reads, the comm method
chosen (forced per case) and its ``fused_experts`` (the NPU kernels from there on: it keeps the ids
it got and returns zeros).
"""

from __future__ import annotations

import itertools

import pytest

from ..ascend_env import run

pytestmark = pytest.mark.engine


@pytest.fixture(scope="module")
def recorded(tmp_path_factory):
    from vllm_scene_eplb.rig.tiny_model import TinyMoeSpec, make_tiny_moe

    spec = TinyMoeSpec()
    model = make_tiny_moe(tmp_path_factory.mktemp("ascend-recorder") / "model", spec)
    return spec, run("ascend_record", model, spec.num_experts, timeout=600)


CASES = list(
    itertools.product(["MC2", "ALLTOALL", "ALLGATHER"], [(1, 1), (1, 2), (2, 1), (2, 2)], ["unquantized", "w8a8_dynamic"])
)


def test_every_comm_method_geometry_and_quant_method_ran(recorded):
    _, rows = recorded
    assert [(r["comm"], (r["dp"], r["tp"]), r["kind"]) for r in rows] == CASES


@pytest.mark.parametrize("comm, geometry, kind", CASES, ids=[f"{comm}-DP{dp}xTP{tp}-{kind}" for comm, (dp, tp), kind in CASES])
def test_recorded_counts_equal_the_real_select_experts_ids_of_real_tokens(recorded, comm, geometry, kind):
    """Each real token counted once, no padding row, no pseudo id."""
    _, rows = recorded
    (row,) = [r for r in rows if (r["comm"], (r["dp"], r["tp"]), r["kind"]) == (comm, geometry, kind)]
    assert row["got"] == row["want"], row
    assert row["seen"] == row["comm"]  # what the mc2 check's log line names
    assert sum(row["want"]) > 0 and row["padding_rows"] > 0
    if kind == "w8a8_dynamic":  # with mix_placement it handed pseudo ids on to fused_experts; none reached the counts
        assert row["pseudo_ids_seen"] > 0


def test_rows_off_the_comm_methods_rule_are_skipped_and_said(tmp_path):
    """A layer whose routed rows do not follow its comm method's rule counts nothing for that pass
    and the observer's skipped counter says so (status, dump refusal, audit read it), through
    vLLM-Ascend's real forward context."""
    from vllm_scene_eplb.rig.tiny_model import TinyMoeSpec, make_tiny_moe

    spec = TinyMoeSpec()
    out = run("ascend_skipped_rows", make_tiny_moe(tmp_path / "model", spec), spec.num_experts)
    assert out["skipped"] == [1, 1]
    assert out["per_layer"] == [12, 0]  # layer 0: 6 real rows x top-2; layer 1: nothing


def test_an_engine_waiting_for_kv_advances_one_step_per_iteration_like_its_peer(tmp_path):
    """Through vLLM-Ascend's real ``execute_model``: with nothing scheduled it returns through
    ``kv_connector_no_forward`` without a forward, and vLLM's DP loop runs ``execute_dummy_batch``
    (real): that dummy pass is the engine's one step, as its busy peer's one real pass is; both carry
    the iteration's DP signature (its largest DP rank's tokens), so the dump says ``aligned_by: stamps
    and DP signatures``; the same records with one engine's stamps shifted (what the old double advance
    made) fail the export on the signature."""
    out = run("ascend_dp_steps", tmp_path, "kv")
    assert out["no_forward"] == 2
    assert out["stamps"] == [[0, 1, 2], [0, 1, 2]] and out["passes"] == [1, 3]
    assert out["signature"] == [[[3, 3], [2, 2], [4, 4]]] * 2
    assert out["aligned"] == ["written", "written"] and out["aligned_by"] == "stamps and DP signatures"
    assert all("do not line up across DP engines" in r for r in out["shifted"]), out["shifted"]


def test_a_dump_lines_up_when_one_dp_rank_runs_eager_and_three_in_graphs(tmp_path):
    """Through vLLM-Ascend's real ``_determine_batch_execution_and_padding`` and ``_sync_metadata_across_dp``
    (DP4, FULL graphs up to 16 tokens): in a step where one rank has 40 tokens it runs eager and gets
    the raw vector, its peers ``[max] * dp``; every rank still records the same DP signature (the
    maximum), so the dump is written, aligned by signatures, with every entry's tokens x 2 ids; a
    shifted rank still fails it. The raw vector as the signature (the old rule) refused this dump."""
    out = run("ascend_dp_steps", tmp_path, "graph-modes")
    step1 = [seen[1] for seen in out["seen"]]
    assert step1 == [["NONE", [40] * 4]] * 3 + [["NONE", [4, 1, 2, 40]]], step1  # what vLLM-Ascend handed each rank
    assert out["aligned"] == ["written"] * 4, out["aligned"]
    assert out["signature"] == [[[4] * 4, [40] * 4, [1] * 4]] * 4
    assert out["aligned_by"] == "stamps and DP signatures"
    assert out["entry_totals"][:3] == [2 * 8, 2 * 46, 2 * 4] and not any(out["entry_totals"][3:])
    assert all("do not line up across DP engines" in r for r in out["shifted"]), out["shifted"]


def test_a_drafters_passes_in_sample_tokens_count_in_their_own_step(tmp_path):
    """With a counted drafter, vLLM-Ascend's ``sample_tokens`` (wrapped on the real model runner) runs
    its passes after ``execute_model``: each step ends after it, so every ring entry holds its step's
    target and drafter passes alike (one step late, they would sit in the next entry). A step whose
    sampling never came ends as the next one begins, its drafter entry empty."""
    out = run("ascend_dp_steps", tmp_path, "drafter")
    assert out["real_sample_tokens_wrapped"]
    assert out["stamps"][0] == out["stamps"][1] == [0, 1, 2, 3, 4]
    target, drafter = out["entry_totals"]
    assert target == [6, 2, 4, 8, 10] and drafter == [6, 2, 4, 0, 10]


def test_when_imported_patches_a_module_at_its_first_import(tmp_path, monkeypatch):
    import sys

    from vllm_scene_eplb.adapters.vllm_ascend.patches import when_imported

    (tmp_path / "late_mod_for_scene_eplb.py").write_text("VALUE = 1\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    seen = []
    when_imported("late_mod_for_scene_eplb", lambda mod: seen.append(mod.VALUE))
    assert seen == []
    import late_mod_for_scene_eplb  # noqa: F401

    assert seen == [1] and sys.modules["late_mod_for_scene_eplb"].__file__.endswith("late_mod_for_scene_eplb.py")
    when_imported("late_mod_for_scene_eplb", lambda mod: seen.append(2))  # already loaded: at once
    assert seen == [1, 2]
    del sys.modules["late_mod_for_scene_eplb"]


@pytest.fixture(scope="module")
def routes(tmp_path_factory):
    """The routes on vLLM 0.23's API server over two DP engines, driven once (tests/scripts/ascend_routes.py)."""
    from vllm_scene_eplb.rig.tiny_model import TinyMoeSpec, make_tiny_moe

    return run("ascend_routes", make_tiny_moe(tmp_path_factory.mktemp("ascend-routes") / "model", TinyMoeSpec()))


def test_routes_on_vllm_0_23_are_served_by_the_wrapped_build_app(routes):
    """vLLM 0.23 has no endpoint plugins: the wrapped build_app serves the routes."""
    assert routes["paths"] == [
        "/dump_expert_distribution_record",
        "/scene_eplb/native_load",
        "/scene_eplb/status",
        "/start_expert_distribution_record",
        "/stop_expert_distribution_record",
    ]


def test_routes_on_vllm_0_23_api_server_reach_every_dp_engine(routes):
    """Each route reaches every DP engine's workers (one collective_rpc utility call per engine core)."""
    st = routes["status"]
    assert st["observer"] == "idle" and st["ranks_agree"] and [r["dp_rank"] for r in st["ranks"]] == [0, 1]
    assert routes["start"] == 200 and "already on" in routes["again"]["error"]
    assert routes["stop"]["observer"] == "idle" and routes["stop"]["passes_recorded"] == 1
    assert st["skipped_passes"] == 0 and st["skipped_recorded"] == 0
    assert routes["recorded"] == [2, 2]


def test_a_record_in_which_a_rank_skipped_a_pass_is_refused_unless_kept(routes):
    ranks = routes["skipped_status"]["ranks"]
    assert [(r["skipped_passes"], r["skipped_recorded"]) for r in ranks] == [(0, 0), (1, 1)]
    assert routes["refused"][0] == 409 and "this record skipped 1 (MoE layer, pass) pairs" in routes["refused"][1]
    assert "keep_skipped=true" in routes["refused"][1]
    assert "skipped" not in routes["kept"][1]  # past the gate (the stand-in engine has no export group)


def test_a_keep_skipped_flag_that_is_not_a_bool_is_a_400(routes):
    assert routes["bad_flag"] == 400


def test_keep_skipped_on_another_route_is_a_400(routes):
    assert routes["flag_elsewhere"] == 400


def test_native_load_on_vllm_0_23_says_why_not_for_all_ranks(routes):
    """Not bound to a model with vLLM-Ascend's counters: the route says why, for all ranks."""
    native = routes["native"]
    assert native["available"] is False and native["ranks"] == 2 and "dynamic EPLB" in native["reason"]


def test_native_window_maps_vllm_ascend_slot_counters_to_logical_experts():
    """vLLM-Ascend's moe_load (tokens per local slot) over a record, through its _expert_map
    (logical -> local slot, -1 elsewhere; a shared-expert slot beyond E dropped); void when its
    EPLB moved experts or cleared the counters in between; unavailable without the counters."""
    from types import SimpleNamespace

    import torch

    from vllm_scene_eplb.adapters.vllm_ascend.native_load import UNAVAILABLE, NativeWindow

    def layer(load, emap):
        return SimpleNamespace(moe_load=torch.tensor(load), _expert_map=torch.tensor(emap))

    a = layer([5, 7, 1], [-1, 0, -1, 1, 2])  # E = 4: experts 1 and 3 here, slot 2 is shared expert 4
    b = layer([[1, 0, 0], [2, 3, 0]], [2, -1, 0, 1, -1])  # the multi-stage policy: [stages, E_local]
    window = NativeWindow(4)
    window.mark("start", [a, b])
    a.moe_load += torch.tensor([3, 4, 9])
    b.moe_load[1] += torch.tensor([1, 2, 3])
    window.mark("stop", [a, b])
    assert window.result.to_wire() == {"available": True, "counts": [[0, 3, 0, 4], [3, 0, 1, 2]]}
    window.mark("start", [a, b])
    a._expert_map = torch.tensor([0, -1, -1, 1, 2])
    window.mark("stop", [a, b])
    assert "moved experts" in str(window.result.reason)
    window.mark("start", [a, b])
    b.moe_load.zero_()
    window.mark("stop", [a, b])
    assert "cleared its moe_load" in str(window.result.reason)
    plain = SimpleNamespace(moe_load=None, _expert_map=torch.tensor([0, 1]))
    window.mark("start", [plain])
    window.mark("stop", [plain])
    assert window.result.to_wire() == {"available": False, "reason": UNAVAILABLE}


@pytest.fixture(scope="module")
def settings(tmp_path_factory):
    """What vLLM-Ascend's real ascend config and enable_sp() say per setting, and the plugin's config
    hook on a collection run under it (tests/scripts/ascend_settings.py), on a tiny DeepSeek-V4."""
    from vllm_scene_eplb.rig.tiny_deepseek_v4 import make_tiny_deepseek_v4

    tmp = tmp_path_factory.mktemp("ascend-settings")
    return run("ascend_settings", make_tiny_deepseek_v4(tmp / "model"), tmp / "dumps")


def test_plain_settings_keep_the_own_row_rules(settings):
    assert settings["plain"]["found"] == [] and settings["plain"]["refused"] is None


@pytest.mark.parametrize(
    "case, on", [("flashcomm1", [True, False, False]), ("dsa_cp", [True, True, False]), ("shared_expert_dp", [True, False, True])]
)
def test_the_tutorials_sequence_parallel_settings_are_recorded(settings, case, on):
    """FlashComm1, DSA-CP and shared-expert DP (vLLM-Ascend's V4-Flash P recipe) are on in its real
    config (shared-expert DP turns FlashComm1 on) and a collection run under them starts: each rank
    counts its own sequence-parallel chunk (tests/ascend/test_vllm_ascend_sp_record.py)."""
    assert settings[case]["sp"] == on
    assert settings[case]["found"] == [] and settings[case]["refused"] is None


@pytest.mark.parametrize(
    "case, found",
    [
        ("gate", "multistream_overlap_gate (routing runs before prepare)"),
        ("flashcomm2", "flashcomm2"),
        ("xlite", "xlite_graph_config.enabled"),
        ("sp_by_pass", "enable_sp_by_pass"),
    ],
    ids=["gate", "flashcomm2", "xlite", "sp_by_pass"],
)
def test_settings_that_reshape_the_routed_rows_are_refused_when_the_config_is_built(settings, case, found):
    """Read back from vLLM-Ascend's real ascend config: the settings under which the own-row rules do
    not hold. A collection run under one is refused by the plugin's ``VllmConfig.__post_init__`` hook,
    naming the flag: the config is never built, so no worker starts and ``load_model`` never runs."""
    if case == "gate":
        assert settings[case]["found"] == [found]
    else:
        assert any(f.startswith(found) for f in settings[case]["found"]), settings
    refused = settings[case]["refused"]
    assert refused and "cannot count its own tokens exactly" in refused and found in refused, refused
