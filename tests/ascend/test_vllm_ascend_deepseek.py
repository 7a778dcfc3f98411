"""The generated DeepSeek-V3 loaded with a layout through vLLM-Ascend's real model runner, MoE layers
and ModelSlim W8A8 code on two Gloo ranks (EP=2), with stand-ins for the NPU runtime only (see
tests/scripts/ascend_deepseek_load.py): the load audit every rank runs before serving.

The layout has 2 redundant slots with replicas on both ranks. Each rank loads the float model, then
its W8A8_DYNAMIC copy, whose routed experts carry a per-channel scale and offset that must move with
their weights, then the W8A8 copy again with a scale loader that follows vLLM's linear expert map
instead of the layout's (SGLang #17162's bug class: block scales left where the weights were not).
What each slot holds is read from memory independently of the audit: every weight's values against
every checkpoint expert's.
"""

from __future__ import annotations

import re

import numpy as np
import pytest

from vllm_scene_eplb.counts import Counts
from vllm_scene_eplb.fit import FitOptions, fit
from vllm_scene_eplb.formats import write_layout
from vllm_scene_eplb.harness.modelslim import write_w8a8
from vllm_scene_eplb.harness.tiny_deepseek import TinyDeepseekSpec, make_tiny_deepseek
from vllm_scene_eplb.layout import Geometry

from ..ascend_env import run_ranks
from ..conftest import require_vllm, skewed_counts

pytestmark = pytest.mark.engine

SPEC = TinyDeepseekSpec()
EP, REDUNDANT = 2, 2
SLOTS = (SPEC.num_experts + REDUNDANT) // EP  # per rank
WEIGHTS = ("w13_weight", "w2_weight")
SCALES = ("w13_weight_scale", "w2_weight_scale")
OFFSETS = ("w13_weight_offset", "w2_weight_offset")


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """Both ranks' three loads, and the layout's rows by model layer. The checkpoints and the layout are
    made while the ranks import vLLM-Ascend (``ready`` tells them)."""
    require_vllm()
    root = tmp_path_factory.mktemp("ascend-deepseek")
    model, w8a8, path, ready = root / "tiny-deepseek-v3", root / "tiny-deepseek-v3-w8a8", root / "layout.json", root / "ready"
    made = {}

    def prepare():
        write_w8a8(make_tiny_deepseek(model, SPEC), w8a8, SPEC.routed_expert_weight)
        counts = Counts(skewed_counts(4, len(SPEC.moe_layers), SPEC.num_experts, top_k=SPEC.top_k))
        made["layout"] = fit(counts, FitOptions(Geometry(SPEC.num_experts, REDUNDANT, EP)))
        write_layout(made["layout"], path)
        ready.touch()

    args = (model, w8a8, path, root / "dump", ready)
    ranks = run_ranks("ascend_deepseek_load", EP, root / "ranks", *args, prepare=prepare, timeout=240)
    layout = made["layout"]
    return ranks, dict(zip(SPEC.moe_layers, layout.physical_to_logical_map[list(layout.moe_layers)]))


def test_the_layout_replicates_experts_across_the_two_ranks(run):
    _, rows = run
    for row in rows.values():
        replicated = [e for e in np.unique(row) if len({int(p) // SLOTS for p in np.flatnonzero(row == e)}) > 1]
        assert replicated  # a replica on each rank: the cross-rank check has something to compare


@pytest.mark.parametrize("case, writes_per_slot", [("float", 3), ("w8a8", 9)])
def test_the_load_audit_passes_on_every_rank(run, case, writes_per_slot):
    ranks, rows = run
    slots = SLOTS * len(rows)
    replicas = sum(row.size - np.unique(row).size for row in rows.values())
    for rank in ranks:
        # w1, w3, w2 per slot; under W8A8 each with its scale and offset, journalled as expert weights of their own
        want = f"passed:{slots}-slots,{slots * writes_per_slot}-writes,{replicas}-replicas-identical"
        assert rank[case]["load_audit"] == want


@pytest.mark.parametrize("case", ["float", "w8a8"])
def test_every_slot_holds_the_expert_the_layout_names(run, case):
    ranks, rows = run
    params = WEIGHTS + (SCALES + OFFSETS if case == "w8a8" else ())
    for r, rank in enumerate(ranks):
        assert rank[case]["ep_rank"] == r
        for layer, row in rows.items():
            got = rank[case]["layers"][str(layer)]
            assert got["slots"] == list(range(r * SLOTS, (r + 1) * SLOTS))
            for param in params:
                for slot, matches in zip(got["slots"], got["matches"][param]):
                    if param in OFFSETS:  # symmetric W8A8: every offset is zero, any expert's matches
                        assert int(row[slot]) in matches, (layer, slot, param)
                    else:
                        assert matches == [int(row[slot])], (layer, slot, param)


@pytest.mark.parametrize("case", ["float", "w8a8"])
def test_replicas_on_both_ranks_hold_the_same_bytes(run, case):
    ranks, rows = run
    params = WEIGHTS + (SCALES + OFFSETS if case == "w8a8" else ())
    for layer, row in rows.items():
        digests = {}
        for rank in ranks:
            got = rank[case]["layers"][str(layer)]
            for i, slot in enumerate(got["slots"]):
                digests[slot] = tuple(got["digests"][p][i] for p in params)
        for e in np.unique(row):
            assert len({digests[int(p)] for p in np.flatnonzero(row == e)}) == 1, (layer, int(e))


def test_a_scale_left_in_its_linear_slot_is_refused_naming_the_slot(run):
    ranks, rows = run
    problem = re.compile(r"layer (\d+) slot (\d+) \(w13_weight_scale w1\) holds expert (\d+), should hold expert (\d+)")
    for r, rank in enumerate(ranks):
        broken = rank["w8a8_scales_by_linear_map"]
        refusal = broken["refused"] or ""
        assert broken["load_audit"] is None and refusal.startswith(f"load audit (vLLM-Ascend, ep_rank {r},"), refusal
        assert "AscendFusedMoE.weight_loader" in refusal  # the loader path that ran
        found = problem.findall(refusal)
        assert found, refusal
        for layer, slot, held, want in (tuple(map(int, m)) for m in found):
            local = slot - r * SLOTS
            assert 0 <= local < SLOTS and want == rows[layer][slot]  # this rank's slot, the layout's expert
            assert held == r * (SPEC.num_experts // EP) + local  # the expert vLLM's linear map puts there
            got = broken["layers"][str(layer)]["matches"]
            assert got["w13_weight_scale"][local] == [held] and got["w13_weight"][local] == [want]  # what memory holds
