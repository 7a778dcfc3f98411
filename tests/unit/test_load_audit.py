"""The load audit's judgement (runtime/worker/load_audit.py), the source tracer that tells it which
checkpoint expert a written tensor came from and the audit the adapters run after a load
(runtime/worker/load_journal.py, plain torch), and the vLLM adapter's test-only mis-load."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from vllm_scene_eplb.adapters.vllm.expert_loading import ExpertLoading, misload
from vllm_scene_eplb.errors import SceneEplbError
from vllm_scene_eplb.runtime.worker.load_audit import (
    UNTRACED,
    LoadAudit,
    LoadJournal,
    refuse,
    replica_problems,
    replicated_slots,
    write_problems,
)
from vllm_scene_eplb.runtime.worker.load_journal import ExpertLoad, SourceTracer, audit, slot_fingerprints, written_tensors

pytestmark = pytest.mark.timed  # asserts on time or waits on a tight deadline: the first lane (tests/conftest.py)

ROW = np.array([0, 1, 2, 3, 1, 3])  # 4 experts, 2 redundant slots (4 -> expert 1, 5 -> expert 3)
SHARDS = (("w13_weight", "w1"), ("w13_weight", "w3"), ("w2_weight", "w2"))


def journal_of(row=ROW, slots=range(6), skip=(), source=None) -> LoadJournal:
    """Every shard of every slot written once from the row's expert (``source`` overrides per slot)."""
    j = LoadJournal()
    for slot in slots:
        for param, shard in SHARDS:
            if (slot, shard) not in skip:
                j.write(1, slot, param, shard, (source or {}).get(slot, int(row[slot])))
    return j


def test_a_load_that_follows_the_row_passes():
    assert write_problems(journal_of(), {1: ROW}, list(range(6))) == []


def test_a_slot_loaded_linearly_under_a_layout_names_what_it_holds_and_what_it_should():
    # today's legacy-mapping bug: slot j loads expert j, and the redundant slots are never written
    j = journal_of(row=np.arange(4), slots=range(4))
    problems = write_problems(j, {1: ROW}, list(range(6)))
    assert "layer 1 slot 4 was never written (should hold expert 1)" in problems
    assert "layer 1 slot 5 was never written (should hold expert 3)" in problems
    assert all("slot 0" not in p for p in problems)  # slots 0-3 are right by chance of the row


def test_a_swapped_slot_is_named_with_both_experts():
    problems = write_problems(journal_of(source={2: 3}), {1: ROW}, list(range(6)))
    assert problems and all("slot 2" in p and "holds expert 3, should hold expert 2" in p for p in problems)


def test_a_missing_shard_and_a_double_write_are_problems():
    j = journal_of(skip={(3, "w3")})
    j.write(1, 0, "w2_weight", "w2", 0)
    problems = write_problems(j, {1: ROW}, list(range(6)))
    assert "layer 1 slot 3 (w13_weight w3) written 0 times, should be once" in problems
    assert "layer 1 slot 0 (w2_weight w2) written 2 times, should be once" in problems


def test_an_untraced_write_is_refused_not_trusted():
    problems = write_problems(journal_of(source={5: UNTRACED}), {1: ROW}, list(range(6)))
    assert len(problems) == 3 and all("cannot trace" in p for p in problems)


def test_only_this_workers_slots_must_be_written():
    assert write_problems(journal_of(slots=range(3)), {1: ROW}, [0, 1, 2]) == []


def test_replicas_must_hold_the_same_weights():
    fp = np.arange(6 * 4, dtype=float).reshape(1, 6, 4)
    fp[0, 4], fp[0, 5] = fp[0, 1], fp[0, 3]
    assert replica_problems(fp, {1: ROW}, [1]) == [] and replicated_slots({1: ROW}) == 2
    fp[0, 5, 2] += 1e-3
    assert replica_problems(fp, {1: ROW}, [1]) == ["layer 1: slots 3 and 5 both hold expert 3 but their weights differ"]


def test_the_refusal_names_the_first_problems_and_counts_the_rest():
    with pytest.raises(SceneEplbError, match=r"load audit \(rank 0\).*p0; p1; p2; p3; p4; p5; and 2 more"):
        refuse([f"p{i}" for i in range(8)], "rank 0")
    refuse([], "rank 0")  # nothing wrong: no refusal


def test_the_summary_is_one_token():
    assert LoadAudit(12, 36, 2).summary() == "passed:12-slots,36-writes,2-replicas-identical"
    assert " " not in LoadAudit(12, 36, None).summary()


def test_the_tracer_finds_the_expert_of_views_chunks_and_unbinds():
    t = SourceTracer()
    per_expert = torch.randn(8, 4)
    t.register("model.layers.1.mlp.experts.5.gate_proj.weight", per_expert)
    assert t.expert_of(per_expert) == 5 and t.expert_of(per_expert.unsqueeze(0).unbind()[0]) == 5
    fused = torch.randn(4, 6, 3)
    t.register("model.layers.2.mlp.experts.gate_up_proj", fused)
    assert [t.expert_of(x) for x in fused.chunk(2, dim=1)[1].unbind()] == [0, 1, 2, 3]
    reordered = fused.index_select(0, torch.tensor([2, 0, 3]))
    t.register("experts.gate_up_proj", reordered, (2, 0, 3))
    assert [t.expert_of(x) for x in reordered.unbind()] == [2, 0, 3]
    assert t.expert_of(torch.randn(8, 4)) == UNTRACED  # a copy is not a checkpoint tensor
    t.register("model.layers.1.self_attn.o_proj.weight", torch.randn(3, 3))  # not an expert: not kept
    assert len(t.sources) == 3


def test_the_tracer_forgets_freed_tensors():
    t = SourceTracer()
    t.register("experts.1.down_proj.weight", torch.randn(16, 16))  # freed at once
    fresh = torch.randn(16, 16)
    assert t.expert_of(fresh) == UNTRACED  # even if it reuses the freed memory


def test_the_test_only_misload_swaps_two_slots(monkeypatch):
    loading = ExpertLoading({1: ROW}, 4)
    assert loading.loading_row(1) is ROW and loading.loading_row(2) is None
    monkeypatch.setenv("SCENE_EPLB_TEST_MISLOAD", "1:0:5")
    assert loading.loading_row(1).tolist() == [3, 1, 2, 3, 1, 0] and ROW[0] == 0  # the layout's row is untouched
    monkeypatch.setenv("SCENE_EPLB_TEST_MISLOAD", "2:0:1,1:0:5")  # one swap per layer: another layer's and this one's
    assert loading.loading_row(1).tolist() == [3, 1, 2, 3, 1, 0]


def test_the_misload_that_serves_swaps_the_same_slots_and_says_so(monkeypatch):
    monkeypatch.setenv("SCENE_EPLB_TEST_MISLOAD", "1:0:5:serve")
    assert misload() == (((1, 0, 5),), True)
    assert ExpertLoading({1: ROW}, 4).loading_row(1).tolist() == [3, 1, 2, 3, 1, 0]
    monkeypatch.setenv("SCENE_EPLB_TEST_MISLOAD", "1:0:5")
    assert misload() == (((1, 0, 5),), False)
    monkeypatch.setenv("SCENE_EPLB_TEST_MISLOAD", "1:0:5,2:1:2:serve")  # several swaps, one served bug
    assert misload() == (((1, 0, 5), (2, 1, 2)), True)


def test_a_served_refusal_reads_as_refused():
    assert LoadAudit(18, 54, 2).summary() == "passed:18-slots,54-writes,2-replicas-identical"
    assert LoadAudit(0, 0, None, refused=True).summary() == "refused"


@pytest.mark.parametrize("spec", ["1:0", "1:a:2", "1:0:6", "-1:0:1", "1:0:1:now", "1:0:1:serve:x"])
def test_a_malformed_misload_is_one_clear_error(monkeypatch, spec):
    monkeypatch.setenv("SCENE_EPLB_TEST_MISLOAD", spec)
    with pytest.raises(SceneEplbError, match="LAYER:SLOT_A:SLOT_B"):
        ExpertLoading({1: ROW}, 4).loading_row(1)


def _one_rank_group(export_id: str, timeout_s: float):
    """A Gloo group of one rank (its SUM is the identity): the cross-rank check with every slot local."""
    import datetime

    import torch.distributed as dist

    return dist.ProcessGroupGloo(dist.HashStore(), 0, 1, datetime.timedelta(seconds=timeout_s))


def _loaded(row=ROW, scale_from=None):
    """A layer loaded by the row (every slot local): weights and per-channel scales [6, ...] from the
    checkpoint expert its slot names (``scale_from``: slot -> the expert whose scale it got instead),
    with the journal of those writes."""
    experts = torch.randn(4, 3, 2), torch.rand(4, 3, 1)  # per checkpoint expert: its weight and its scale
    load = ExpertLoad({1: row}, 4, group=_one_rank_group)
    module = type("Layer", (), {})()
    module.w13_weight = experts[0][torch.as_tensor(row)]
    scale_src = [(scale_from or {}).get(slot, int(row[slot])) for slot in range(len(row))]
    module.w13_weight_scale = experts[1][torch.as_tensor(scale_src)]
    for slot in range(len(row)):
        load.write(1, slot, "model.layers.1.mlp.experts.w13_weight", "w1", int(row[slot]))
        load.write(1, slot, "model.layers.1.mlp.experts.w13_weight_scale", "w1", int(row[slot]))  # journal: as asked
    return load, module


def test_the_audit_passes_a_load_whose_replicas_hold_their_experts_scales_included():
    load, module = _loaded()
    weights = written_tensors(module, load.journal, 1, 6)
    assert [w.shape[1:] for w in weights] == [(3, 2), (3, 1)]  # the weight and its scale, in name order
    checked = audit(load, {1: ROW}, list(range(6)), lambda layer: weights, "rank 0")
    assert checked == LoadAudit(6, 12, 2)


def test_a_replica_whose_scale_did_not_move_with_its_weights_is_refused_naming_the_slots():
    # slot 4 holds expert 1's weights but kept the scale of the expert its linear place would hold
    load, module = _loaded(scale_from={4: 0})
    weights = written_tensors(module, load.journal, 1, 6)
    with pytest.raises(
        SceneEplbError, match=r"across EP ranks.*layer 1: slots 1 and 4 both hold expert 1 but their weights differ"
    ):
        audit(load, {1: ROW}, list(range(6)), lambda layer: weights, "rank 0")


def test_a_write_from_the_wrong_expert_is_refused_naming_the_loader():
    load, module = _loaded()
    load.write(1, 2, "w2_weight_scale", "w2", 0)  # slot 2 should hold expert 2
    load.loaders.add("AscendFusedMoE.weight_loader")
    weights = written_tensors(module, load.journal, 1, 6)
    with pytest.raises(
        SceneEplbError, match=r"loaders: AscendFusedMoE.weight_loader.*slot 2 \(w2_weight_scale w2\) holds expert 0"
    ):
        audit(load, {1: ROW}, list(range(6)), lambda layer: weights, "rank 0")


def test_a_refusal_on_one_rank_reaches_its_peer_in_the_one_exchange_not_after_the_deadline():
    """Rank 0's journal holds a wrong write, rank 1's is right: rank 1 must refuse too, at once (it would
    otherwise wait out the exchange's deadline for a rank that already gave up)."""
    import datetime
    import threading
    import time

    import torch.distributed as dist

    store = dist.HashStore()
    deadline = 20.0
    answers: dict[int, str] = {}

    def rank(r: int) -> None:
        load, module = _loaded()
        load.group = lambda export_id, timeout_s: dist.ProcessGroupGloo(
            dist.PrefixStore("audit", store), r, 2, datetime.timedelta(seconds=deadline)
        )
        if r == 0:
            load.write(1, 2, "model.layers.1.mlp.experts.w13_weight", "w1", 0)
        weights = written_tensors(module, load.journal, 1, 6)
        try:
            audit(load, {1: ROW}, list(range(6)), lambda layer: weights, f"rank {r}")
            answers[r] = "passed"
        except SceneEplbError as exc:
            answers[r] = str(exc)

    started = time.monotonic()
    threads = [threading.Thread(target=rank, args=(r,)) for r in (0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(2 * deadline)
    assert time.monotonic() - started < deadline / 2
    assert "slot 2 (w13_weight w1) holds expert 0, should hold expert 2" in answers[0]
    assert "1 other EP rank(s) found experts in the wrong slots" in answers[1]


def test_fingerprints_sit_at_the_global_slots_and_skip_what_the_layer_no_longer_holds():
    w, s = torch.ones(2, 3), torch.full((2, 1), 2.0)
    fp = slot_fingerprints([w, s], 6, 3, torch.float32)
    assert fp.dtype == torch.float64 and fp.shape == (6, 4)
    assert fp[3].tolist() == fp[4].tolist() == [3.0, 3.0, 2.0, 4.0] and not fp[[0, 1, 2, 5]].any()
    load = ExpertLoad({}, 4)
    load.write(1, 0, "w13_weight", "w1", 0)
    load.write(1, 0, "w13_weight_offset", "w1", 0)  # dropped by the kernel format after loading
    module = type("Layer", (), {"w13_weight": torch.nn.Parameter(torch.zeros(2, 3))})()
    assert [t.shape for t in written_tensors(module, load.journal, 1, 2)] == [(2, 3)]
