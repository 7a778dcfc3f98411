"""A speculative drafter's MoE layers as rows after the target's: in counts and layouts, in every
format (the bare ones leave them out and say so), and in a worker's record, counted apart from the
target's and merged into one dump by the same ring entries."""

import numpy as np
import pytest
import torch

from vllm_scene_eplb.commands.scenes import drafter_scores
from vllm_scene_eplb.commands.watch import render
from vllm_scene_eplb.errors import SceneEplbError
from vllm_scene_eplb.fit import FitOptions, fit
from vllm_scene_eplb.fit.drafter_rows import hot_linear_row
from vllm_scene_eplb.formats import GeometryHint, dropped_parts, read_counts, read_layout, write_counts, write_layout
from vllm_scene_eplb.layouts.counts import Counts
from vllm_scene_eplb.layouts.drafter import DRAFTER_KEY, drafter_counts, drafter_layers_of, target_counts
from vllm_scene_eplb.layouts.evaluation import evaluate_drafter
from vllm_scene_eplb.layouts.expected import layer_scores
from vllm_scene_eplb.layouts.layout import Geometry, Layout, linear_map
from vllm_scene_eplb.layouts.report import write_report
from vllm_scene_eplb.live.fitness import LiveFitness, LiveSample
from vllm_scene_eplb.protocol import LIVE_ACTION, LiveAnswer, RankLiveAnswer

from ..conftest import skewed_counts
from .test_worker_answers import recorder

G = Geometry(8, 2, 2)  # 10 slots, 5 a rank


@pytest.fixture
def counts() -> Counts:
    """3 model layers (a dense first one), then the drafter's MoE layer 3."""
    data = skewed_counts(4, 4, 8, seed=2)
    data[:, 0] = 0
    return Counts(data, {"model": "tiny", "moe_layers": [1, 2], DRAFTER_KEY: [3]})


@pytest.fixture
def layout() -> Layout:
    return Layout(linear_map(Geometry(8, 0, 2), 4), Geometry(8, 0, 2), moe_layers=(1, 2), drafter_layers=(3,))


def test_the_drafter_rows_are_the_last_rows_apart_from_the_targets(counts):
    assert drafter_layers_of(counts) == (3,)
    target = target_counts(counts)
    assert target.data.shape == (4, 3, 8) and DRAFTER_KEY not in target.meta and (target.data == counts.data[:, :3]).all()
    view = drafter_counts(counts)
    assert view.meta["moe_layers"] == [3] and drafter_layers_of(view) == ()


@pytest.mark.parametrize(
    "layers, moe", [([2], [1, 2]), ([1], [2]), ([2, 3, 3], [1])], ids=["a-target-moe-row", "not-the-last-row", "twice"]
)
def test_drafter_rows_that_are_not_the_last_rows_after_the_targets_are_refused(layers, moe):
    with pytest.raises(SceneEplbError, match="must be the last rows"):
        Layout(linear_map(G, 4), G, moe_layers=moe, drafter_layers=layers)


def test_a_layouts_moe_rows_default_to_the_target_rows(layout):
    plain = Layout(linear_map(G, 4), G, drafter_layers=(3,))
    assert plain.moe_layers == (0, 1, 2) and plain.num_target_layers == 3
    view = layout.drafter_view()
    assert view.moe_layers == (3,) and view.drafter_layers == () and view.digest() == layout.digest()
    layout.check_model(2, 8, 2, (1, 2), 3)  # a model of 3 layers: the drafter's row comes after them


def test_the_own_formats_keep_the_drafter_rows(tmp_path, counts, layout):
    back = read_counts(write_counts(counts, tmp_path / "c.npz"))
    assert drafter_layers_of(back) == (3,) and back.data.shape == counts.data.shape
    again = read_layout(write_layout(layout, tmp_path / "l.json"))
    assert again.drafter_layers == (3,) and again.digest() == layout.digest()
    assert dropped_parts(layout, "scene-eplb", "l.json") == ([], "")


@pytest.mark.parametrize("fmt, name", [("sglang", "c.json"), ("pt", "c.pt")])
def test_a_bare_counts_format_holds_the_target_rows_and_says_so(tmp_path, counts, fmt, name):
    out = write_counts(counts, tmp_path / name, fmt)
    back = read_counts(out)
    assert back.data.shape == (4, 3, 8) and (back.data == counts.data[:, :3]).all()
    dropped, note = dropped_parts(counts, fmt, out)
    assert dropped == ["drafter_layers"] and "drafter's layers [3] are left out" in note


@pytest.mark.parametrize("fmt, name", [("sglang", "l.json"), ("pt", "l.pt"), ("vllm-ascend", "l.json")])
def test_a_bare_layout_format_holds_the_target_rows_and_says_so(tmp_path, layout, fmt, name):
    out = write_layout(layout, tmp_path / name, fmt)
    back = read_layout(out, GeometryHint(ep_size=2, num_experts=8))
    assert back.drafter_layers == () and back.num_layers == (2 if fmt == "vllm-ascend" else 3)
    dropped, note = dropped_parts(layout, fmt, out)
    assert dropped == ["drafter_layers"] and "cannot name a drafter's MoE rows" in note


def test_a_counts_file_whose_drafter_rows_are_not_its_last_rows_is_refused(tmp_path, counts):
    bad = Counts(counts.data, {**counts.meta, DRAFTER_KEY: [2]})
    path = write_counts(bad, tmp_path / "bad.npz")
    with pytest.raises(SceneEplbError, match="counts metadata drafter_layers"):
        read_counts(path)


def test_a_record_counts_the_drafters_real_rows_apart_and_merges_them_after_the_targets():
    rt = recorder(0)
    with pytest.raises(SceneEplbError, match="rows after the target's 3 layers"):
        rt.bind_drafter([4], "cpu")
    drafter = rt.bind_drafter([3], "cpu")
    padding = torch.tensor([False, False, True])  # the drafter's pass: 2 real rows of 3
    rt.control("start")
    for _ in range(2):
        rt.begin_step(2)
        for layer in range(2):
            rt.observer.capture(layer, torch.tensor([[0, 1], [2, 3]]))
        drafter.capture(0, torch.tensor([[4, 5], [6, 7], [0, 0]]), padding_rows=padding)
        rt.end_step(False)
    rt.begin_step(0)
    drafter.capture(0, torch.tensor([[1, 1]]), padding_rows=torch.tensor([True]))  # a dummy run's pass
    rt.end_step(True)
    rt.control("stop")
    assert rt.status().drafter_layers == (3,) and rt.status().dump_meta()["drafter_layers"] == [3]
    part = rt.rank_record(rt.observer.snapshot(), drafter.snapshot())
    per_layer = part.counts.sum(dim=(0, 2)).tolist()
    assert per_layer == [0, 8, 8, 8]  # the targets' 2 steps x 2 rows x top-2, the drafter's real rows alike
    assert part.counts[:, 3].sum(dim=0).tolist() == [0, 0, 0, 0, 2, 2, 2, 2]
    assert part.tokens == 4  # the target's scheduled tokens, as without a drafter


def _skewed_drafter(seed: int = 3) -> Counts:
    """3 model layers (a dense first one) and the drafter's layer 3, each with its own hot experts."""
    data = skewed_counts(6, 4, 16, seed=seed)
    data[:, 0] = 0
    return Counts(data, {"model": "tiny", "role": "decode", "moe_layers": [1, 2], DRAFTER_KEY: [3]})


def test_fit_fits_the_drafter_rows_on_their_own_counts():
    counts = _skewed_drafter()
    layout = fit(counts, FitOptions(Geometry(16, 4, 4)))
    assert layout.drafter_layers == (3,) and layout.moe_layers == (1, 2)
    assert layout.meta["drafter"] == {"layers": [3], "fitted": [3], "guessed": [], "guess": None}
    hottest = int(counts.total()[3].argmax())
    assert layout.replica_counts()[3, hottest] > 1  # the drafter's own hottest expert is replicated
    (ev,) = evaluate_drafter(layout, [counts]) or []
    assert ev.layers.tolist() == [3] and ev.scores["new_train"][0] < ev.scores["old_train"][0]


def test_a_drafter_row_without_counts_is_the_linear_row_with_the_redundant_slots_on_the_targets_hottest():
    target = target_counts(_skewed_drafter())
    g = Geometry(16, 4, 4)  # 20 slots, 5 a rank: slots 16-19 are rank 3's
    layout = fit(target, FitOptions(g), drafter_layers=1)
    assert layout.drafter_layers == (3,) and layout.meta["drafter"]["guessed"] == [3]
    row = layout.physical_to_logical_map[3]
    assert row[:16].tolist() == list(range(16))
    load = (target.total()[[1, 2]] / target.total()[[1, 2]].sum(axis=1, keepdims=True)).sum(axis=0)
    held = {15}  # rank 3 holds expert 15 (slot 15) already: its copies go to the next hottest
    want = [int(e) for e in np.argsort(-load, kind="stable") if e not in held][:4]
    assert sorted(row[16:].tolist()) == sorted(want)
    assert layout.static_sources is not None and layout.static_sources[3].sum() == 16 * g.ep_size
    assert fit(target, FitOptions(g)).meta["fingerprint"] != layout.meta["fingerprint"]


def test_drafter_rows_asked_for_beside_recorded_ones_or_scenes_that_disagree_are_refused():
    counts = _skewed_drafter()
    with pytest.raises(SceneEplbError, match="already have the drafter's rows"):
        fit(counts, FitOptions(Geometry(16, 4, 4)), drafter_layers=1)
    with pytest.raises(SceneEplbError, match="different drafter layers"):
        fit(
            [counts, Counts(counts.data, {**counts.meta, DRAFTER_KEY: [2, 3], "moe_layers": [1]})], FitOptions(Geometry(16, 4, 4))
        )


def test_hot_linear_row_never_puts_two_copies_on_one_rank():
    g = Geometry(4, 12, 4)  # 16 slots, 4 a rank: every rank holds every expert once
    row = hot_linear_row(g, np.array([5.0, 1.0, 9.0, 0.0]))
    assert sorted(row.reshape(4, 4)[3].tolist()) == [0, 1, 2, 3] and Layout(row[None], g).replica_counts().tolist() == [[4] * 4]


def test_score_and_report_show_the_drafter_apart_and_say_when_one_side_has_no_drafter_rows(tmp_path):
    counts = _skewed_drafter()
    layout = fit(counts, FitOptions(Geometry(16, 4, 4)))
    paths = [str(write_counts(counts, tmp_path / "d.npz"))]
    payload, text = drafter_scores(layout, [counts], paths)
    assert payload is not None and payload["drafter_layers"] == [3] and payload["summary"]["layers"] == 1
    assert "scored apart" in text and "of the assignments" in text
    evals, md, _ = write_report(layout, [("d", counts)], tmp_path / "report")
    assert "## The drafter's MoE layers" in md.read_text() and evals[0].layers.tolist() == [1, 2]
    payload, text = drafter_scores(layout, [target_counts(counts)], paths)
    assert payload == {"note": "the counts have no drafter rows: the layout's drafter layers [3] are not scored"}
    target_only = fit(target_counts(counts), FitOptions(Geometry(16, 4, 4)))
    assert "have no rows of the layout's" in drafter_scores(target_only, [counts], paths)[1]


def test_the_memory_of_redundant_slots_counts_the_drafters_layer():
    from vllm_scene_eplb.planning.memory import memory_cost, read_model_memory
    from vllm_scene_eplb.planning.model_files import read_model

    memory = read_model_memory(read_model("data/models/deepseek-v3"))
    target, with_drafter = (memory_cost(memory, Geometry(256, 16, 16), d) for d in (0, 1))
    assert with_drafter["redundant_bytes_per_rank"] * 58 == target["redundant_bytes_per_rank"] * 59
    assert "in each of 58 MoE layers and the drafter's 1:" in with_drafter["summary"]


def test_a_ranks_live_answer_carries_the_drafters_counts_apart_and_reads_back():
    rt = recorder(0)
    drafter = rt.bind_drafter([3], "cpu")
    rt.begin_step(2)
    rt.observer.capture(0, torch.tensor([[0, 1], [2, 3]]))
    drafter.capture(0, torch.tensor([[4, 5], [6, 7]]))
    rt.end_step(False)
    answer = rt.answer(LIVE_ACTION).payload
    assert answer.moe_layers == (1, 2) and answer.drafter_layers == (3,)
    assert answer.drafter_counts == ((0, 0, 0, 0, 1, 1, 1, 1),) and sum(map(sum, answer.counts)) == 4
    assert RankLiveAnswer.from_wire(answer.to_wire()) == answer
    plain = recorder(0).answer(LIVE_ACTION).payload
    assert plain.drafter_counts is None and RankLiveAnswer.from_wire(plain.to_wire()) == plain


def test_live_fitness_scores_the_drafters_layers_apart_and_leaves_the_targets_as_they_are():
    counts = _skewed_drafter()
    layout = fit(counts, FitOptions(Geometry(16, 4, 4), dispatch="dynamic"))
    total = counts.total()

    def view(drafter_layers):
        return LiveFitness.for_server(layout, 16, 4, "dynamic", (1, 2), 0.05, 3, drafter_layers=drafter_layers)

    plain, apart = view(()), view((3,))
    plain.observe(LiveSample(total[[1, 2]], passes=6), now=0.0)
    apart.observe(LiveSample(total[[1, 2]], passes=6, drafter=total[[3]]), now=0.0)
    wire = apart.to_wire()
    assert {**wire, "drafter": None} == plain.to_wire()  # the target's view is untouched
    d = wire["drafter"]
    assert d["layers"] == [3] and d["share"] == round(total[3].sum() / total[1:].sum(), 5)
    assert d["per_layer"] == [
        round(float(x), 5) for x in layer_scores(layout.drafter_view(), total[[3]], layout.geometry, "dynamic")
    ]
    live = LiveAnswer.from_wire(wire)
    assert live.to_wire() == wire and "drafter   layers [3]" in render(live, "http://x")
    assert plain.to_wire()["drafter"] is None


def test_counts_of_a_model_with_the_drafters_rows_after_its_layers_are_its_counts(tmp_path):
    """``--model`` reads the target's layers: the drafter's rows come after them; without the
    metadata that names them, the same rows are one layer too many."""
    import json

    from vllm_scene_eplb.commands.scenes import check_model_counts
    from vllm_scene_eplb.planning.model_files import read_model
    from vllm_scene_eplb.rig.tiny_deepseek import TinyDeepseekSpec, hf_config

    spec = TinyDeepseekSpec()
    (tmp_path / "config.json").write_text(json.dumps(hf_config(spec)))
    model = read_model(tmp_path)
    data = skewed_counts(2, spec.num_layers + 1, spec.num_experts)
    data[:, 0] = 0
    counts = Counts(data, {"moe_layers": spec.moe_layers, DRAFTER_KEY: [spec.num_layers]})
    check_model_counts(model, counts, "d.npz")
    with pytest.raises(SceneEplbError, match="the counts are \\[L=4"):
        check_model_counts(model, Counts(data, {"moe_layers": spec.moe_layers}), "d.npz")
