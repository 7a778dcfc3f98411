"""The generated DeepSeek-V3 and DeepSeek-V4 loaded with a layout through vLLM-Ascend's real model
runner, MoE layers and ModelSlim W8A8 code on two Gloo ranks (EP=2), with their MTP drafter, with
stand-ins for the NPU runtime only (see tests/scripts/ascend_deepseek_load.py): the load audit every
rank runs before serving; and V4's MoE forward through vLLM-Ascend's real ``AscendFusedMoE``
(tests/scripts/ascend_deepseek.py, whose two processes run both models).

The layout has 2 redundant slots with replicas on both ranks, and a row of its own for the MTP layer
(its drafter row, fitted on its own counts), which places the drafter's MoE layer. Each rank loads the float model, then
its W8A8_DYNAMIC copy, whose routed experts carry a per-channel scale and offset that must move with
their weights, then the W8A8 copy again with a scale loader that follows vLLM's linear expert map
instead of the layout's (SGLang #17162's bug class: block scales left where the weights were not).
What each slot holds is read from memory independently of the audit: every weight's values against
every checkpoint expert's. V4 is vLLM-Ascend's own model (``vllm_ascend/models/deepseek_v4.py``,
registered over vLLM's), its checkpoint in DeepSeek's names (``layers.N.ffn.experts.E.w1``), which its
loader renames.

V4's forward: every MoE layer's ``forward_impl`` on one batch with padding rows, without a layout (a
collection run), with the static layout and with one fitted for dynamic dispatch. Both kinds of V4 layer
route through ``torch.ops._C_ascend.moe_gating_top_k_hash`` (a plain-torch stand-in following the op's
kernel: the hash layers' ids ``tid2eid[token]``, the others sqrt(softplus) + bias top-k), and the recorder
counts them: exact against the token table (hash layers) and an independent router (score layers). The
outputs with either layout equal the run without one.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
import torch

from vllm_scene_eplb.fit import FitOptions, fit
from vllm_scene_eplb.formats import write_layout
from vllm_scene_eplb.layouts.counts import Counts
from vllm_scene_eplb.layouts.drafter import DRAFTER_KEY
from vllm_scene_eplb.layouts.layout import Geometry
from vllm_scene_eplb.rig.modelslim import write_w8a8
from vllm_scene_eplb.rig.tiny_deepseek import TinyDeepseekSpec, make_tiny_deepseek
from vllm_scene_eplb.rig.tiny_deepseek_v4 import TinyDeepseekV4Spec, make_tiny_deepseek_v4

from ..ascend_env import load_eplb_utils, run_ranks
from ..conftest import require_vllm, skewed_counts

pytestmark = pytest.mark.engine

EP, REDUNDANT = 2, 2
WEIGHTS = ("w13_weight", "w2_weight")
SCALES = ("w13_weight_scale", "w2_weight_scale")
OFFSETS = ("w13_weight_offset", "w2_weight_offset")
# family -> (spec, checkpoint maker); both run in the same two processes (tests/scripts/ascend_deepseek.py)
FAMILIES = {
    "deepseek_v3": (TinyDeepseekSpec(), make_tiny_deepseek),
    "deepseek_v4": (TinyDeepseekV4Spec(), make_tiny_deepseek_v4),
}
FORWARD = "deepseek_v4"  # the family whose MoE forward runs too
TOKENS, REAL = 16, 13  # V4's forward batch: the last 3 rows padding (token id -1)


@dataclass
class Ran:
    """A family's two ranks: what each printed, the layout's rows by model layer, the V4 forward's inputs."""

    spec: TinyDeepseekSpec | TinyDeepseekV4Spec
    ranks: list[dict]
    rows: dict
    model: Path
    inputs: dict

    @property
    def slots(self) -> int:  # per rank
        return (self.spec.num_experts + REDUNDANT) // EP

    @property
    def drafter(self) -> int:  # the MTP layer's model layer index: after the model's layers
        return self.spec.num_layers

    @property
    def layers(self) -> list[int]:  # every MoE layer counted: the model's, then the drafter's
        return [*self.spec.moe_layers, self.drafter]


def family_files(root: Path, family: str) -> list[Path]:
    """The files the ranks read for a family: float and W8A8 checkpoints and the layout; for the forward
    family also the layout fitted for dynamic dispatch and the inputs."""
    d = root / family
    files = [d / "model", d / "model-w8a8", d / "layout.json"]
    return files + ([d / "layout-dynamic.json", d / "inputs.safetensors"] if family == FORWARD else [])


def make_family(family: str, files: list[Path]) -> tuple:
    """Write a family's files; returns (its layout, the forward's inputs or None)."""
    from safetensors.torch import save_file

    spec, make = FAMILIES[family]
    write_w8a8(make(files[0], spec), files[1], spec.routed_expert_weight)
    moe = len(spec.moe_layers)  # the MoE rows, then the drafter's
    data = skewed_counts(4, moe + 1, spec.num_experts, top_k=spec.top_k)
    counts = Counts(data, {"moe_layers": list(range(moe)), DRAFTER_KEY: [moe]})
    geometry = Geometry(spec.num_experts, REDUNDANT, EP)
    layout = fit(counts, FitOptions(geometry))
    write_layout(layout, files[2])
    if family != FORWARD:
        return layout, None
    write_layout(fit(counts, FitOptions(geometry, dispatch="dynamic")), files[3])
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(0, spec.vocab_size, (TOKENS,), generator=g)
    ids[REAL:] = -1
    inputs = {"ids": ids, "x": torch.randn(TOKENS, spec.hidden_size, generator=g), "real": torch.tensor(REAL)}
    save_file(inputs, str(files[4]))
    return layout, inputs


@pytest.fixture(scope="module")
def ran(tmp_path_factory) -> dict[str, Ran]:
    """Both families' ranks, run once for the module (one vLLM-Ascend import for all). The checkpoints,
    layouts and inputs are made while the ranks import vLLM-Ascend (``ready`` tells them)."""
    require_vllm()
    root = tmp_path_factory.mktemp("ascend-deepseek")
    ready, files = root / "ready", {family: family_files(root, family) for family in FAMILIES}
    made = {}

    def prepare():
        for family in FAMILIES:
            made[family] = make_family(family, files[family])
        ready.touch()

    args = [ready, root / "dump", *(f for family in FAMILIES for f in files[family])]
    ranks = run_ranks("ascend_deepseek", EP, root / "ranks", *args, prepare=prepare, timeout=600)
    out = {}
    for family, (spec, _) in FAMILIES.items():
        layout, inputs = made[family]
        rows = dict(zip(spec.moe_layers, layout.physical_to_logical_map[list(layout.moe_layers)]))
        rows[spec.num_layers] = layout.physical_to_logical_map[layout.drafter_layers[0]]
        out[family] = Ran(spec, [rank[family] for rank in ranks], rows, files[family][0], inputs)
    return out


@pytest.fixture(params=list(FAMILIES))
def run(request, ran) -> Ran:
    return ran[request.param]


@pytest.fixture
def v4(ran) -> Ran:
    return ran[FORWARD]


def test_the_layout_replicates_experts_across_the_two_ranks(run):
    for row in run.rows.values():
        replicated = [e for e in np.unique(row) if len({int(p) // run.slots for p in np.flatnonzero(row == e)}) > 1]
        assert replicated  # a replica on each rank: the cross-rank check has something to compare


def params_of(run: Ran, case: str, layer: int) -> tuple[str, ...]:
    """The expert weights a layer holds: under W8A8 the model's MoE layers' scales and offsets too (the
    MTP layer stays float)."""
    return WEIGHTS + (SCALES + OFFSETS if case == "w8a8" and layer != run.drafter else ())


def test_the_drafter_layer_is_placed_by_its_own_row(run):
    """The MTP layer's row is neither a model layer's nor vLLM-Ascend's default split, so a layer placed by
    either would fail the slot checks below; both ranks count it as the drafter's layer."""
    default = load_eplb_utils().generate_global_placement(run.spec.num_experts, EP, REDUNDANT, 0).flatten().numpy()
    drafter = run.rows[run.drafter]
    assert all(not np.array_equal(drafter, run.rows[layer]) for layer in run.spec.moe_layers)
    assert not np.array_equal(drafter, default)
    for rank in run.ranks:
        assert rank["float"]["drafter_layers"] == [run.drafter]


@pytest.mark.parametrize("case", ["float", "w8a8"])
def test_the_load_audit_passes_on_every_rank(run, case):
    ranks, rows, slots_per_rank = run.ranks, run.rows, run.slots
    slots = slots_per_rank * len(rows)
    # w1, w3, w2 per slot; under W8A8 each with its scale and offset, journalled as expert weights of their own
    writes = sum(slots_per_rank * 3 * len(params_of(run, case, layer)) // len(WEIGHTS) for layer in rows)
    replicas = sum(row.size - np.unique(row).size for row in rows.values())
    for rank in ranks:
        want = f"passed:{slots}-slots,{writes}-writes,{replicas}-replicas-identical"
        assert rank[case]["load_audit"] == want


@pytest.mark.parametrize("case", ["float", "w8a8"])
def test_every_slot_holds_the_expert_the_layout_names(run, case):
    ranks, rows, slots_per_rank = run.ranks, run.rows, run.slots
    for r, rank in enumerate(ranks):
        assert rank[case]["ep_rank"] == r and sorted(rank[case]["layers"], key=int) == [str(layer) for layer in rows]
        for layer, row in rows.items():
            got = rank[case]["layers"][str(layer)]
            assert got["slots"] == list(range(r * slots_per_rank, (r + 1) * slots_per_rank))
            for param in params_of(run, case, layer):
                for slot, matches in zip(got["slots"], got["matches"][param]):
                    if param in OFFSETS:  # symmetric W8A8: every offset is zero, any expert's matches
                        assert int(row[slot]) in matches, (layer, slot, param)
                    else:
                        assert matches == [int(row[slot])], (layer, slot, param)


@pytest.mark.parametrize("case", ["float", "w8a8"])
def test_replicas_on_both_ranks_hold_the_same_bytes(run, case):
    ranks, rows = run.ranks, run.rows
    for layer, row in rows.items():
        digests = {}
        for rank in ranks:
            got = rank[case]["layers"][str(layer)]
            for i, slot in enumerate(got["slots"]):
                digests[slot] = tuple(got["digests"][p][i] for p in params_of(run, case, layer))
        for e in np.unique(row):
            assert len({digests[int(p)] for p in np.flatnonzero(row == e)}) == 1, (layer, int(e))


def test_a_scale_left_in_its_linear_slot_is_refused_naming_the_slot(run):
    ranks, rows, slots_per_rank = run.ranks, run.rows, run.slots
    problem = re.compile(r"layer (\d+) slot (\d+) \(w13_weight_scale w1\) holds expert (\d+), should hold expert (\d+)")
    for r, rank in enumerate(ranks):
        broken = rank["w8a8_scales_by_linear_map"]
        refusal = broken["refused"] or ""
        assert broken["load_audit"] is None and refusal.startswith(f"load audit (vLLM-Ascend, ep_rank {r},"), refusal
        assert "AscendFusedMoE.weight_loader" in refusal  # the loader path that ran
        found = problem.findall(refusal)
        assert found, refusal
        for layer, slot, held, want in (tuple(map(int, m)) for m in found):
            local = slot - r * slots_per_rank
            assert 0 <= local < slots_per_rank and want == rows[layer][slot]  # this rank's slot, the layout's expert
            assert held == r * (run.spec.num_experts // EP) + local  # the expert vLLM's linear map puts there
            got = broken["layers"][str(layer)]["matches"]
            assert got["w13_weight_scale"][local] == [held] and got["w13_weight"][local] == [want]  # what memory holds


def test_a_misloaded_drafter_slot_is_refused_naming_its_layer(run):
    """The planted bug: the drafter's expert weights loaded by vLLM's linear expert map instead of its
    row. Every rank refuses, naming the MTP layer's slots and the experts they hold, as read from memory;
    the model's layers loaded right and are not named."""
    problem = re.compile(
        r"layer (\d+) slot (\d+) \((w13_weight|w2_weight) (w1|w3|w2|0|1)\) holds expert (\d+), should hold expert (\d+)"
    )
    for r, rank in enumerate(run.ranks):
        broken = rank["float_drafter_by_linear_map"]
        refusal = broken["refused"] or ""
        assert broken["load_audit"] is None and refusal.startswith(f"load audit (vLLM-Ascend, ep_rank {r},"), refusal
        found = problem.findall(refusal)
        assert found and {int(m[0]) for m in found} == {run.drafter}, refusal
        for _, slot, param, _, held, want in found:
            local = int(slot) - r * run.slots
            assert int(want) == run.rows[run.drafter][int(slot)] != int(held)
            assert broken["layers"][str(run.drafter)]["matches"][param][local] == [int(held)]  # what memory holds


FORWARDS = ("none", "static", "dynamic")  # without a layout (a collection run), with each layout


def reference_counts(v4: Ran) -> dict[int, np.ndarray]:
    """Per MoE layer (the MTP layer's too), the expert counts of the batch's real rows by an independent
    router on the checkpoint: hash layers ``tid2eid[token]``; score layers the top k of
    sqrt(softplus(gate logits)) + bias, the gate and the hidden states in the model's dtype (bfloat16) as
    the server holds them."""
    from safetensors.torch import load_file

    sd = load_file(str(v4.model / "model.safetensors"))
    ids, x = v4.inputs["ids"][:REAL], v4.inputs["x"][:REAL].to(torch.bfloat16).float()
    out = {}
    for layer in v4.layers:
        ffn = f"layers.{layer}.ffn" if layer != v4.drafter else "mtp.0.ffn"
        if layer in v4.spec.hash_layers:
            chosen = sd[f"{ffn}.gate.tid2eid"][ids.long()]
        else:
            gate = sd[f"{ffn}.gate.weight"].to(torch.bfloat16).float()
            scores = torch.nn.functional.softplus(x @ gate.T).sqrt()
            chosen = (scores + sd[f"{ffn}.gate.bias"]).topk(v4.spec.top_k, dim=-1).indices
        out[layer] = np.bincount(chosen.flatten().numpy(), minlength=v4.spec.num_experts)
    return out


def counted(v4: Ran, forward: str) -> dict[int, np.ndarray]:
    """Per MoE layer (the MTP layer's: the drafter's row), the recorder's counts of one forward summed over
    the two ranks (each its own rows)."""
    total = sum(np.array(rank["forward"][forward]["counts"]) for rank in v4.ranks)
    return dict(zip(v4.layers, total))


@pytest.mark.parametrize("forward", FORWARDS)
def test_v4_layers_route_through_the_hash_op_the_hash_layers_with_their_table(v4, forward):
    """On every rank, each MoE layer (the MTP layer last) called ``moe_gating_top_k_hash`` once, with
    ``tid2eid`` and the token ids exactly on the hash layers, under the comm method vLLM-Ascend chose for
    the batch (MC2 on A3, the drafter's too); the drafter's layer is counted as layer ``num_layers``."""
    want = [layer in v4.spec.hash_layers for layer in v4.layers]
    for rank in v4.ranks:
        assert rank["forward"][forward]["hash_calls"] == want
        assert rank["forward"][forward]["comm"] == rank["forward"][forward]["drafter_comm"] == "MC2"
        assert rank["forward"][forward]["drafter_layers"] == [v4.drafter]


@pytest.mark.parametrize("forward", FORWARDS)
def test_v4_counts_are_exact_on_hash_and_score_layers(v4, forward):
    """The recorded counts of every MoE layer equal the independent router's over the real rows (the
    padding rows, routed as token 0, not counted), every real row counted once over the two ranks. The
    drafter's layer alike, apart from the model's: its pass with no real rows (the context of its dummy
    run) in the same step counted nothing."""
    want, got = reference_counts(v4), counted(v4, forward)
    for layer in v4.layers:
        assert got[layer].sum() == REAL * v4.spec.top_k and np.count_nonzero(got[layer]) > v4.spec.top_k
        assert (got[layer] == want[layer]).all(), (layer, got[layer], want[layer])
    for rank in v4.ranks:  # each rank counted rows of its own (MC2: its TP slice of the real rows)
        assert all(sum(c) > 0 for c in rank["forward"][forward]["counts"])


def test_v4_hash_layers_routed_by_score_fail_the_count_check(v4):
    """The planted bug: with vLLM-Ascend's fused-gating check answering False, its ``_native_select_experts``
    drops ``tid2eid`` and routes the hash layers by score, silently (no call of the hash op): their counts
    no longer match the token table, so the check above fails on that path."""
    want, got = reference_counts(v4), counted(v4, "fallback")
    for rank in v4.ranks:
        assert rank["forward"]["fallback"]["hash_calls"] == []
    for layer in v4.layers:  # the score layers route alike on both paths; the hash layers do not
        assert got[layer].sum() == REAL * v4.spec.top_k
        assert (got[layer] == want[layer]).all() == (layer not in v4.spec.hash_layers), layer


@pytest.mark.parametrize("forward", ["static", "dynamic"])
def test_v4_outputs_with_a_layout_equal_the_run_without_one(v4, forward):
    """Every MoE layer's routed output, the drafter's included, with the static layout (the plugin's
    log2phy) or the dynamic one (virtual ids split over replicas), is bit for bit the output without a
    layout (the drafter's layer placed by vLLM-Ascend's default split), on both ranks."""
    for rank in v4.ranks:
        got = rank["forward"][forward]
        assert got["equal_to_none"] == [True] * len(v4.layers), got["max_diff"]
        assert min(got["norm"]) > 0


def test_v4_outputs_with_weights_moved_but_log2phy_linear_differ(v4):
    """The planted bug: the layout's weights with vLLM's linear log2phy (expert e sent to slot e) change
    every layer's output, the drafter's included, so the equality above can fail."""
    for rank in v4.ranks:
        got = rank["forward"]["static_linear_log2phy"]
        assert not any(got["equal_to_none"]) and min(got["max_diff"]) > 0
